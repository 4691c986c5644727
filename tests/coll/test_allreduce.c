/* MPI test: every allreduce algorithm x dtypes x ops x counts {0, 1, 7,
 * 1M+3} x in place / out of place, against MPI_Allreduce. Point-to-point
 * pieces are cut at 64 KiB + 5 bytes so the splitting used for counts above
 * INT_MAX runs on every large message. Usage: test_allreduce [algo,...|all
 * [MAXCOUNT]] (default: every host algorithm that serves this communicator;
 * MAXCOUNT replaces the largest count). */
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
    ts_p2p_max_piece = (64 << 10) + 5;

    ts_coll *c = NULL;
    if (ts_coll_create(MPI_COMM_WORLD, NULL, &c)) {
        fprintf(stderr, "create: %s\n", ts_err_message());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const char *algos[16];
    int na = 0;
    char buf[512];
    if (argc > 1 && strcmp(argv[1], "all")) {
        snprintf(buf, sizeof buf, "%s", argv[1]);
        for (char *s = NULL, *t = strtok_r(buf, ",", &s); t && na < 16; t = strtok_r(NULL, ",", &s)) algos[na++] = t;
    } else {
        for (const char *const *n = ts_coll_algorithms(TS_COLL_ALLREDUCE); *n; n++) {
            if (!strcmp(*n, "nccl")) continue;
            if (!strcmp(*n, "shm") && ts_coll_nodes(c) > 1) continue;
            if (!strcmp(*n, "hierarchical") && !ts_coll_equal_nodes(c)) continue;
            algos[na++] = *n;
        }
        algos[na++] = "auto";
    }
    /* argv[2]: the largest count instead of 2^20 + 3 (jobs/cluster/selftest.sh's short matrix over TCP) */
    size_t counts[] = {0, 1, 7, (1u << 20) + 3};
    if (argc > 2 && atol(argv[2]) > 7 && (size_t)atol(argv[2]) < counts[3]) counts[3] = (size_t)atol(argv[2]);
    const ts_dtype dts[] = {TS_FLOAT32, TS_FLOAT64, TS_BFLOAT16, TS_FLOAT16, TS_INT32, TS_INT64};
    const size_t maxn = (1u << 20) + 3;
    char *send = malloc(maxn * 8), *recv = malloc(maxn * 8), *orig = malloc(maxn * 8);
    double *ref = malloc(maxn * sizeof(double));
    if (!send || !recv || !orig || !ref) MPI_Abort(MPI_COMM_WORLD, 1);
    ts_diag("%d ranks, %d node(s), algorithms:%s%s%s%s%s%s%s%s", p, ts_coll_nodes(c), na > 0 ? " " : "",
            na > 0 ? algos[0] : "", na > 1 ? " " : "", na > 1 ? algos[1] : "", na > 2 ? " " : "",
            na > 2 ? algos[2] : "", na > 3 ? " ..." : "", "");
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
            size_t n = counts[ci];
            ts_dtype dt = dts[di];
            size_t es = ts_dtype_size(dt);
            unsigned long long wrong[16] = {0}, errs[16] = {0}, clobbered[16] = {0};
            char first[16][256];
            for (int a = 0; a < na; a++) first[a][0] = '\0';
            for (int op = 0; op < TS_OP_COUNT; op++) {
                int seed = (int)(ci * 7 + di * 3 + (size_t)op);
                if (tc_reference(ref, n, dt, (ts_op)op, rank, p, seed, MPI_COMM_WORLD)) MPI_Abort(MPI_COMM_WORLD, 1);
                for (int inplace = 0; inplace < 2; inplace++)
                    for (int a = 0; a < na; a++) {
                        tc_fill(send, n, dt, rank, seed);
                        memcpy(orig, send, n * es);
                        memset(recv, 0x7f, n * es);
                        if (inplace) memcpy(recv, send, n * es);
                        int e = ts_coll_run(c, TS_COLL_ALLREDUCE, algos[a], inplace ? TS_IN_PLACE : send, recv, n, dt,
                                            (ts_op)op, 0);
                        if (e) {
                            errs[a]++;
                            if (!first[a][0]) snprintf(first[a], sizeof first[a], "%s", ts_err_message());
                            continue;
                        }
                        size_t w = tc_wrong(recv, ref, 0, n, dt);
                        if (w && !first[a][0])
                            snprintf(first[a], sizeof first[a], "op %s %s: %zu wrong", ts_coll_op_name((ts_op)op),
                                     inplace ? "in place" : "out of place", w);
                        wrong[a] += w;
                        if (!inplace && memcmp(orig, send, n * es)) clobbered[a]++;
                    }
            }
            MPI_Allreduce(MPI_IN_PLACE, wrong, na, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, errs, na, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            MPI_Allreduce(MPI_IN_PLACE, clobbered, na, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            for (int a = 0; a < na; a++) {
                ts_ok(wrong[a] == 0 && errs[a] == 0 && clobbered[a] == 0,
                      "%d ranks %s %s count %zu (4 ops, in/out of place): %llu wrong, %llu errors, %llu inputs "
                      "changed%s%s",
                      p, algos[a], ts_dtype_name(dt), n, wrong[a], errs[a], clobbered[a], first[a][0] ? " -- " : "",
                      first[a]);
            }
        }
    free(send);
    free(recv);
    free(orig);
    free(ref);
    ts_coll_destroy(&c);
    int rc = ts_done();
    return ts_mpi_finalize(rc); /* guarded: jobs/cluster runs these over TCP */
}
