/* MPI test of the GPU algorithms (a CUDA build and a GPU on every rank;
 * otherwise a TAP skip plan): nccl, hierarchical and auto on device
 * buffers against the exactly known check pattern (filled and counted on
 * the GPU), every dtype and op, counts that the ranks of a node do not
 * divide, in place and not; the automatic choice for GPU buffers; and the
 * refusal, on every rank, when ranks would share a GPU inside one NCCL
 * communicator. */
#include "tsbuild.h"
#include "collectives/coll.h"
#include "collectives/device.h"
#include "src/core/error.h"
#include "src/core/launch.h"
#include "tests/tap.h"

#include <stdio.h>
#include <string.h>

#define MAXN ((size_t)1000003)

static int all_true(int v)
{
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return v;
}

static int any_true(int v)
{
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    return v;
}

/* Every dtype, op, count, in place or not: wrong elements summed over
 * ranks, or -1 when a call failed (the message on rank 0 in diag). */
static long long sweep(ts_coll *c, const char *algo, ts_dtype dt, void *sbuf, void *rbuf, int rank, int p)
{
    static const size_t counts[] = {0, 1, 7, 64, 4099, MAXN};
    long long wrong = 0;
    for (int op = 0; op < TS_OP_COUNT; op++)
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
            for (int inplace = 0; inplace <= 1; inplace++) {
                size_t n = counts[ci], w = 0;
                int seed = (int)(ci * 8 + op * 2 + inplace);
                const void *send = inplace ? TS_IN_PLACE : sbuf;
                int e = ts_coll_device_fill(inplace ? rbuf : sbuf, n, dt, rank, seed);
                if (!e) e = ts_coll_run(c, TS_COLL_ALLREDUCE, algo, send, rbuf, n, dt, (ts_op)op, 0);
                if (!e) e = ts_coll_device_wrong(rbuf, n, dt, p, op, seed, &w);
                if (any_true(e != 0)) {
                    ts_diag("%s %s %s count %zu%s: %s", algo, ts_dtype_name(dt), ts_coll_op_name((ts_op)op), n,
                            inplace ? " in place" : "", e ? ts_err_message() : "(another rank failed)");
                    return -1;
                }
                long long lw = (long long)w;
                MPI_Allreduce(MPI_IN_PLACE, &lw, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
                wrong += lw;
            }
    return wrong;
}

/* ranks would share a GPU in this algorithm's NCCL communicator: every rank fails, naming it */
static void refusal(ts_coll *c, const char *algo, void *rbuf)
{
    int e = ts_coll_run(c, TS_COLL_ALLREDUCE, algo, TS_IN_PLACE, rbuf, 1000, TS_FLOAT32, TS_OP_SUM, 0);
    const char *m = ts_err_message();
    int named = e != 0 && strstr(m, "share GPU") && strstr(m, "NCCL needs one GPU per rank");
    ts_ok(all_true(named), "%s with ranks sharing a GPU: refused on every rank, naming the GPU (rank 0: %s)", algo,
          e ? m : "no error");
    /* and the channel still works for what it can serve: host buffers */
    float x = 1;
    e = ts_coll_run(c, TS_COLL_ALLREDUCE, "auto", TS_IN_PLACE, &x, 1, TS_FLOAT32, TS_OP_SUM, 0);
    int p;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    ts_ok(all_true(!e && x == (float)p), "... then a host allreduce on the same object works");
}

int main(int argc, char **argv)
{
    int provided, rank, p;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    ts_err_set_rank(rank);
    ts_tap_quiet = rank != 0;
    int ng = ts_coll_device_count(), least = ng;
    MPI_Allreduce(MPI_IN_PLACE, &least, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (least == 0) {
        if (rank == 0) printf("1..0 # SKIP no GPU on some rank (or a build without CUDA)\n");
        return ts_mpi_finalize(0); /* a TAP skip plan: the harness counts it as skipped */
    }

    ts_coll *c = NULL;
    int e = ts_coll_create(MPI_COMM_WORLD, NULL, &c);
    ts_ok(all_true(e == 0), "create on %d ranks", p);
    if (e) MPI_Abort(MPI_COMM_WORLD, 1);
    /* who would share a GPU: ranks of one machine beyond its GPUs (the flat
     * communicator), ranks of one (possibly faked) node beyond them (hierarchical) */
    MPI_Comm mach;
    int m;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &mach);
    MPI_Comm_size(mach, &m);
    MPI_Comm_free(&mach);
    const int flat_shared = any_true(m > ng), node_shared = any_true(ts_coll_local_size(c) > ng);
    const int nodes = ts_coll_nodes(c), equal = ts_coll_equal_nodes(c);
    ts_diag("%d rank(s), %d node(s) of %d, %d GPU(s) per machine, GPU %d here%s%s", p, nodes, ts_coll_local_size(c), ng,
            ts_coll_gpu(c), flat_shared ? "; the machine's ranks share GPUs" : "",
            node_shared ? "; a node's ranks share GPUs" : "");

    const char *why = "";
    const char *chosen = ts_coll_device_choice(c, TS_COLL_ALLREDUCE, 1 << 20, TS_FLOAT32, TS_OP_SUM, &why);
    const char *want = nodes > 1 && equal ? "hierarchical" : "nccl";
    ts_ok(!strcmp(chosen, want), "auto for GPU buffers: %s on %d node(s) (chose %s by %s)", want, nodes, chosen, why);

    void *sbuf = NULL, *rbuf = NULL;
    e = ts_coll_device_alloc(MAXN * 8, ts_coll_gpu(c), &sbuf);
    if (!e) e = ts_coll_device_alloc(MAXN * 8, ts_coll_gpu(c), &rbuf);
    ts_ok(all_true(e == 0), "device buffers of %zu bytes", MAXN * 8);
    if (!all_true(e == 0)) MPI_Abort(MPI_COMM_WORLD, 1);

    const char *const algos[] = {"nccl", "hierarchical", "auto"};
    static const ts_dtype dts[] = {TS_FLOAT32, TS_FLOAT64, TS_BFLOAT16, TS_FLOAT16, TS_INT32, TS_INT64};
    for (int ai = 0; ai < 3; ai++) {
        const char *eff = strcmp(algos[ai], "auto") ? algos[ai] : want;
        if (!strcmp(eff, "hierarchical") && !equal) continue; /* refused before any GPU work (test_coll_misc) */
        if (!strcmp(eff, "nccl") ? flat_shared : node_shared) {
            refusal(c, algos[ai], rbuf);
            continue;
        }
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
            long long w = sweep(c, algos[ai], dts[di], sbuf, rbuf, rank, p);
            ts_ok(w == 0, "%s on GPU buffers, %s: sum/avg/max/min, counts 0..%zu, in place and not: %lld wrong%s",
                  algos[ai], ts_dtype_name(dts[di]), MAXN, w < 0 ? 0 : w, w < 0 ? " (a call failed)" : "");
        }
    }
    ts_coll_device_free(sbuf);
    ts_coll_device_free(rbuf);
    e = ts_coll_destroy(&c);
    ts_ok(all_true(e == 0), "destroy (NCCL communicators finalised)");
    int rc = ts_done();
    return ts_mpi_finalize(rc);
}
