/* MPI test: topology (real and faked nodes), registered zero-copy buffers,
 * nonblocking collectives overlapping work, and bad input: unknown names,
 * forced algorithms that cannot serve a call, uint8 reductions, counts that
 * differ between ranks (an error on every rank, not a hang). */
#include "tsbuild.h"
#include "src/core/launch.h"
#include "collectives/coll_impl.h"
#include "tests/coll/common.h"
#include "tests/tap.h"

#include <stdio.h>
#include <stdlib.h>

static int all_failed(int e, MPI_Comm comm)
{
    int f = e != 0, n = 0;
    MPI_Allreduce(&f, &n, 1, MPI_INT, MPI_SUM, comm);
    int p;
    MPI_Comm_size(comm, &p);
    return n == p;
}

static int all_msg(const char *needle, MPI_Comm comm)
{
    int f = strstr(ts_err_message(), needle) != NULL, n = 0, p;
    MPI_Allreduce(&f, &n, 1, MPI_INT, MPI_SUM, comm);
    MPI_Comm_size(comm, &p);
    return n == p;
}

int main(int argc, char **argv)
{
    int provided, rank, p;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    ts_err_set_rank(rank);
    ts_tap_quiet = rank != 0;
    const char *fake = getenv("TESSERA_RANKS_PER_NODE");
    int k = fake ? atoi(fake) : 0;

    ts_coll *c = NULL;
    int e = ts_coll_create(MPI_COMM_WORLD, NULL, &c);
    ts_ok(!all_failed(e, MPI_COMM_WORLD) && e == 0, "create on %d ranks", p);
    if (e) MPI_Abort(MPI_COMM_WORLD, 1);

    /* topology */
    if (k > 0) {
        int want_nodes = (p + k - 1) / k, local = rank % k, lsize = rank / k == want_nodes - 1 ? p - k * (want_nodes - 1) : k;
        int ok = ts_coll_nodes(c) == want_nodes && ts_coll_local_rank(c) == local && ts_coll_local_size(c) == lsize &&
                 ts_coll_node_index(c) == rank / k;
        int all;
        MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
        ts_ok(all, "TESSERA_RANKS_PER_NODE=%d: %d nodes, local rank/size and node index right", k, want_nodes);
    } else { /* the nodes MPI sees (one machine, or jobs/cluster's namespaces): counted here independently */
        MPI_Comm node;
        int lsize, lrank, leader, nodes;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
        MPI_Comm_size(node, &lsize);
        MPI_Comm_rank(node, &lrank);
        leader = lrank == 0;
        MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Comm_free(&node);
        int ok = ts_coll_nodes(c) == nodes && ts_coll_local_size(c) == lsize && ts_coll_local_rank(c) == lrank, all;
        MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
        ts_ok(all, "the nodes MPI sees: %d node(s), this rank %d of %d on its node", nodes, lrank, lsize);
    }

    /* registered buffers: in-place allreduce without staging */
    if (ts_coll_nodes(c) == 1) {
        const size_t counts[] = {0, 1, 7, 1000003};
        for (int ci = 0; ci < 4; ci++) {
            size_t n = counts[ci];
            float *b = NULL;
            double *ref = malloc((n ? n : 1) * sizeof *ref);
            e = ts_coll_buffer_alloc(c, n * sizeof(float), (void **)&b);
            size_t w = 0;
            for (int op = 0; op < TS_OP_COUNT && !e; op++) {
                tc_reference(ref, n, TS_FLOAT32, (ts_op)op, rank, p, op, MPI_COMM_WORLD);
                tc_fill(b, n, TS_FLOAT32, rank, op);
                e = ts_coll_allreduce(c, TS_IN_PLACE, b, n, TS_FLOAT32, (ts_op)op);
                if (!e) w += tc_wrong(b, ref, 0, n, TS_FLOAT32);
            }
            unsigned long long ww = w;
            MPI_Allreduce(MPI_IN_PLACE, &ww, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            ts_ok(!e && ww == 0, "registered buffer, in-place allreduce of %zu floats, 4 ops: %llu wrong", n, ww);
            if (b) ts_coll_buffer_free(c, (void **)&b);
            free(ref);
        }
        /* a registered buffer on some ranks only: an error everywhere */
        float *b = NULL, plain[4] = {1, 2, 3, 4};
        e = ts_coll_buffer_alloc(c, 4 * sizeof(float), (void **)&b);
        if (!e) {
            for (int i = 0; i < 4; i++) b[i] = 1;
            e = ts_coll_allreduce(c, TS_IN_PLACE, rank == 0 ? b : plain, 4, TS_FLOAT32, TS_OP_SUM);
            ts_ok(p == 1 ? e == 0 : all_failed(e, MPI_COMM_WORLD) && all_msg("registered", MPI_COMM_WORLD),
                  "registered buffer on rank 0 only: %s", p == 1 ? "fine alone" : "error on every rank");
            ts_coll_buffer_free(c, (void **)&b);
        }
    }

    /* nonblocking: three queued allreduces overlap local work */
    {
        const size_t n = 300001;
        float *x[3];
        double *ref = malloc(n * sizeof *ref);
        ts_coll_req *rq[3] = {NULL, NULL, NULL};
        tc_reference(ref, n, TS_FLOAT32, TS_OP_SUM, rank, p, 5, MPI_COMM_WORLD);
        e = 0;
        for (int i = 0; i < 3; i++) {
            x[i] = malloc(n * sizeof(float));
            tc_fill(x[i], n, TS_FLOAT32, rank, 5);
            if (!e) e = ts_coll_iallreduce(c, TS_IN_PLACE, x[i], n, TS_FLOAT32, TS_OP_SUM, &rq[i]);
        }
        volatile double acc = 0; /* the "computation" */
        int polls = 0, done = 0;
        while (!e && !done) {
            for (int j = 0; j < 10000; j++) acc += j * 1e-9;
            e = ts_coll_test(rq[2], &done);
            polls++;
        }
        size_t w = 0;
        for (int i = 0; i < 3; i++) {
            int we = ts_coll_wait(&rq[i]);
            if (!e) e = we;
            w += tc_wrong(x[i], ref, 0, n, TS_FLOAT32);
            free(x[i]);
        }
        unsigned long long ww = w;
        MPI_Allreduce(MPI_IN_PLACE, &ww, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        ts_ok(!all_failed(e, MPI_COMM_WORLD) && e == 0 && ww == 0 && rq[0] == NULL,
              "3 queued iallreduce while computing (%d polls): %llu wrong", polls, ww);
        free(ref);
    }
    /* a blocking call while nonblocking ones are queued: separate channels */
    {
        float a[5] = {1, 1, 1, 1, 1}, b[5] = {2, 2, 2, 2, 2};
        ts_coll_req *r = NULL;
        e = ts_coll_iallreduce(c, TS_IN_PLACE, a, 5, TS_FLOAT32, TS_OP_SUM, &r);
        int e2 = ts_coll_allreduce(c, TS_IN_PLACE, b, 5, TS_FLOAT32, TS_OP_MAX);
        int e3 = ts_coll_wait(&r);
        ts_ok(!e && !e2 && !e3 && a[4] == (float)p && b[0] == 2, "blocking allreduce while one is queued");
    }

    /* bad input 1: unknown algorithm name -> error on every rank */
    {
        ts_coll_opts o;
        ts_coll_opts_default(&o);
        o.force[TS_COLL_ALLREDUCE] = "ringg";
        ts_coll *bad = NULL;
        e = ts_coll_create(MPI_COMM_WORLD, &o, &bad);
        ts_ok(all_failed(e, MPI_COMM_WORLD) && all_msg("unknown allreduce algorithm 'ringg'", MPI_COMM_WORLD) && !bad,
              "unknown algorithm name: error on every rank naming it");
    }
    /* bad input 2: a forced algorithm that cannot serve the call */
    {
        int x[3] = {1, 2, 3};
        unsigned char u[3] = {1, 2, 3};
        e = ts_coll_run(c, TS_COLL_ALLREDUCE, "ring", TS_IN_PLACE, u, 3, TS_UINT8, TS_OP_SUM, 0);
        ts_ok(all_failed(e, MPI_COMM_WORLD) && all_msg("uint8", MPI_COMM_WORLD),
              "uint8 reduction with a forced algorithm: error on every rank");
        if (ts_coll_nodes(c) > 1) {
            e = ts_coll_run(c, TS_COLL_ALLREDUCE, "shm", TS_IN_PLACE, x, 3, TS_INT32, TS_OP_SUM, 0);
            ts_ok(all_failed(e, MPI_COMM_WORLD) && all_msg("within one node", MPI_COMM_WORLD),
                  "shm forced across nodes: error on every rank");
        }
        if (!ts_coll_equal_nodes(c)) {
            e = ts_coll_run(c, TS_COLL_ALLREDUCE, "hierarchical", TS_IN_PLACE, x, 3, TS_INT32, TS_OP_SUM, 0);
            ts_ok(all_failed(e, MPI_COMM_WORLD) && all_msg("same number of ranks on every node", MPI_COMM_WORLD),
                  "hierarchical forced on unequal nodes: error on every rank");
        }
        e = ts_coll_run(c, TS_COLL_ALLREDUCE, "mpi", TS_IN_PLACE, x, 3, TS_INT32, (ts_op)9, 0);
        ts_ok(all_failed(e, MPI_COMM_WORLD), "invalid op: error on every rank");
    }
    /* bad input 3: counts differ between ranks, for each algorithm family */
    if (p > 1) {
        const char *algos[] = {"auto", "shm", "ring", "recursive_doubling", "rabenseifner", "tree", "hierarchical"};
        for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++) {
            if (!strcmp(algos[a], "shm") && ts_coll_nodes(c) > 1) continue;
            if (!strcmp(algos[a], "hierarchical") && !ts_coll_equal_nodes(c)) continue;
            for (int big = 0; big < 2; big++) {
                size_t n = (big ? 200000 : 10) + (rank == p - 1 ? 3 : 0);
                float *b = calloc(n, sizeof *b);
                e = ts_coll_run(c, TS_COLL_ALLREDUCE, algos[a], TS_IN_PLACE, b, n, TS_FLOAT32, TS_OP_SUM, 0);
                ts_ok(all_failed(e, MPI_COMM_WORLD) && all_msg("differ", MPI_COMM_WORLD),
                      "counts differ (%s, %s): error on every rank", algos[a], big ? "large" : "small");
                free(b);
            }
            /* and the communicator still works afterwards */
            float one = 1;
            e = ts_coll_run(c, TS_COLL_ALLREDUCE, algos[a], TS_IN_PLACE, &one, 1, TS_FLOAT32, TS_OP_SUM, 0);
            ts_ok(!all_failed(e, MPI_COMM_WORLD) && e == 0 && one == (float)p, "%s works after the mismatch", algos[a]);
        }
        /* dtype differs */
        double d[4] = {0};
        e = ts_coll_run(c, TS_COLL_ALLREDUCE, "auto", TS_IN_PLACE, d, 4, rank ? TS_FLOAT64 : TS_INT64, TS_OP_SUM, 0);
        ts_ok(all_failed(e, MPI_COMM_WORLD) && all_msg("differ", MPI_COMM_WORLD), "dtypes differ: error on every rank");
    }
    ts_coll_destroy(&c);
    /* waits that yield: when a node runs more threads than CPUs, and the
     * yielding wait completes a ring exchange like MPI_Waitall */
    {
        unsetenv("TESSERA_YIELD");
        int over = ts_coll_oversubscribed(1, 1), over2 = ts_coll_oversubscribed(100000, 1);
        setenv("TESSERA_YIELD", "1", 1);
        int forced = ts_coll_oversubscribed(1, 1);
        setenv("TESSERA_YIELD", "0", 1);
        int off = ts_coll_oversubscribed(100000, 4);
        unsetenv("TESSERA_YIELD");
        ts_ok(!over && over2 && forced && !off,
              "oversubscribed: 1 thread no, 100000 ranks yes, TESSERA_YIELD=1/0 overrides (%d %d %d %d)", over, over2,
              forced, off);
        int ok = 1;
        for (int yield = 0; yield <= 1; yield++) {
            int sv = rank * 10 + yield, rv = -1;
            MPI_Request rq[2];
            MPI_Status st[2];
            MPI_Irecv(&rv, 1, MPI_INT, (rank + p - 1) % p, 7, MPI_COMM_WORLD, &rq[0]);
            MPI_Isend(&sv, 1, MPI_INT, (rank + 1) % p, 7, MPI_COMM_WORLD, &rq[1]);
            int w = ts_coll_waitall_mpi(rq, 2, st, yield);
            ok &= w == MPI_SUCCESS && rv == ((rank + p - 1) % p) * 10 + yield && rq[0] == MPI_REQUEST_NULL;
        }
        MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        ts_ok(ok, "ts_coll_waitall_mpi completes a ring exchange, spinning and yielding");
    }
    int rc = ts_done();
    return ts_mpi_finalize(rc); /* guarded: jobs/cluster runs these over TCP */
}
