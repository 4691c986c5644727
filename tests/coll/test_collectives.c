/* MPI test: reduce-scatter, allgather and broadcast, every algorithm, odd
 * and zero counts, several dtypes and ops, roots; results against
 * MPI_Allreduce / the known pattern. */
#include "tsbuild.h"
#include "src/core/launch.h"
#include "collectives/coll_impl.h"
#include "tests/coll/common.h"
#include "tests/tap.h"

#include <stdio.h>

int main(int argc, char **argv)
{
    int provided, rank, p;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    ts_err_set_rank(rank);
    ts_tap_quiet = rank != 0;
    ts_p2p_max_piece = (32 << 10) + 3;
    ts_coll *c = NULL;
    if (ts_coll_create(MPI_COMM_WORLD, NULL, &c)) MPI_Abort(MPI_COMM_WORLD, 1);
    const size_t counts[] = {0, 1, 7, 100003};
    const ts_dtype dts[] = {TS_FLOAT32, TS_BFLOAT16, TS_INT64, TS_FLOAT64};
    const ts_op ops[] = {TS_OP_SUM, TS_OP_AVG, TS_OP_MAX};
    const size_t maxn = 100003;
    char *send = malloc(maxn * 8), *recv = malloc(maxn * 8);
    double *ref = malloc(maxn * sizeof(double));
    for (int kind = TS_COLL_REDUCE_SCATTER; kind <= TS_COLL_BCAST; kind++) {
        const char *const *names = ts_coll_algorithms((ts_coll_kind)kind);
        const char *algos[16];
        int na = 0;
        for (; *names; names++) {
            if (!strcmp(*names, "nccl") || (!strcmp(*names, "shm") && ts_coll_nodes(c) > 1)) continue;
            algos[na++] = *names;
        }
        algos[na++] = "auto";
        for (int a = 0; a < na; a++) {
            unsigned long long bad = 0, errs = 0;
            char first[256] = "";
            for (size_t ci = 0; ci < 4; ci++)
                for (size_t di = 0; di < 4; di++)
                    for (size_t oi = 0; oi < (kind == TS_COLL_REDUCE_SCATTER ? 3u : 1u); oi++) {
                        size_t n = counts[ci];
                        ts_dtype dt = dts[di];
                        size_t es = ts_dtype_size(dt);
                        int seed = (int)(ci + di * 5 + oi * 11), e = 0;
                        size_t w = 0;
                        if (kind == TS_COLL_REDUCE_SCATTER) {
                            tc_reference(ref, n, dt, ops[oi], rank, p, seed, MPI_COMM_WORLD);
                            for (int inplace = 0; inplace < 2 && !e; inplace++) {
                                tc_fill(send, n, dt, rank, seed);
                                if (inplace) memcpy(recv, send, n * es);
                                e = ts_coll_run(c, TS_COLL_REDUCE_SCATTER, algos[a], inplace ? TS_IN_PLACE : send, recv,
                                                n, dt, ops[oi], 0);
                                size_t o, l;
                                ts_coll_block(n, dt, p, rank, &o, &l);
                                if (!e) w += tc_wrong(recv, ref, o, o + l, dt);
                            }
                        } else if (kind == TS_COLL_ALLGATHER) {
                            size_t o, l;
                            ts_coll_block(n, dt, p, rank, &o, &l);
                            for (size_t i = 0; i < n; i++)
                                tc_set(recv, i, dt, i >= o && i < o + l ? TS_CHECK_VALUE(i, rank, seed, tc_half(dt)) : 99);
                            e = ts_coll_run(c, TS_COLL_ALLGATHER, algos[a], NULL, recv, n, dt, TS_OP_SUM, 0);
                            for (int q = 0; q < p && !e; q++) {
                                ts_coll_block(n, dt, p, q, &o, &l);
                                for (size_t i = o; i < o + l; i++)
                                    if (tc_get(recv, i, dt) != TS_CHECK_VALUE(i, q, seed, tc_half(dt))) w++;
                            }
                        } else {
                            int root = (int)(ci + di) % p;
                            for (size_t i = 0; i < n; i++)
                                tc_set(recv, i, dt, rank == root ? TS_CHECK_VALUE(i, root, seed, tc_half(dt)) : 99);
                            e = ts_coll_run(c, TS_COLL_BCAST, algos[a], NULL, recv, n, dt, TS_OP_SUM, root);
                            for (size_t i = 0; i < n && !e; i++)
                                if (tc_get(recv, i, dt) != TS_CHECK_VALUE(i, root, seed, tc_half(dt))) w++;
                        }
                        if (e) errs++;
                        bad += w;
                        if ((e || w) && !first[0])
                            snprintf(first, sizeof first, "%s count %zu: %s", ts_dtype_name(dt), n,
                                     e ? ts_err_message() : "wrong values");
                    }
            MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, &errs, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            ts_ok(bad == 0 && errs == 0, "%d ranks %s %s: %llu wrong, %llu errors%s%s", p,
                  ts_coll_kind_name((ts_coll_kind)kind), algos[a], bad, errs, first[0] ? " -- " : "", first);
        }
    }
    free(send);
    free(recv);
    free(ref);
    ts_coll_destroy(&c);
    int rc = ts_done();
    return ts_mpi_finalize(rc); /* guarded: jobs/cluster runs these over TCP */
}
