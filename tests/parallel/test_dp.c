/* MPI test: process grid splits and sizes, and data-parallel gradient
 * buckets queued while a simulated backward produces gradients from the end
 * of the arena (results against the exact average). */
#include "tsbuild.h"
#include "collectives/coll.h"
#include "src/core/error.h"
#include "src/parallel/buckets.h"
#include "src/parallel/grid.h"
#include "tests/tap.h"

#include <stdlib.h>
#include <string.h>

static int all(int c, MPI_Comm comm)
{
    int r;
    MPI_Allreduce(&c, &r, 1, MPI_INT, MPI_LAND, comm);
    return r;
}

int main(int argc, char **argv)
{
    int provided, rank, p;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    ts_err_set_rank(rank);
    ts_tap_quiet = rank != 0;

    /* grid */
    ts_grid *g = NULL;
    int sp = p % 2 == 0 ? 2 : 1;
    int e = ts_grid_create(MPI_COMM_WORLD, 0, 1, sp, &g);
    int ok = !e && g->dp * g->sp == p && g->s == rank % sp && g->d == rank / sp;
    if (ok) {
        int n1, n2, n3;
        MPI_Comm_size(g->dp_comm, &n1);
        MPI_Comm_size(g->pp_comm, &n2);
        MPI_Comm_size(g->sp_comm, &n3);
        ok = n1 == g->dp && n2 == 1 && n3 == sp;
    }
    ts_ok(all(ok, MPI_COMM_WORLD), "grid: %d ranks = dp %d x sp %d, coordinates and group sizes", p, p / sp, sp);
    ts_grid_destroy(&g);
    e = ts_grid_create(MPI_COMM_WORLD, p + 1, 1, 1, &g);
    ts_ok(all(e == TS_ERR_CONFIG && strstr(ts_err_message(), "but the job has") != NULL, MPI_COMM_WORLD),
          "grid: dp not matching the ranks is an error on every rank (%s)", ts_err_message());

    /* buckets */
    ts_coll *c = NULL;
    if (ts_coll_create(MPI_COMM_WORLD, NULL, &c)) MPI_Abort(MPI_COMM_WORLD, 1);
    const size_t n = 1000003;
    float *grads = malloc(n * sizeof *grads);
    ts_dp *dp = NULL;
    e = ts_dp_create(c, grads, n, 100000, &dp);
    ts_ok(!e && ts_dp_buckets(dp) == 10 + 1, "dp: 1000003 floats in buckets of 100000 -> %d buckets", dp ? ts_dp_buckets(dp) : -1);
    ts_dp_stats st = {0, 0, 0, 0};
    size_t wrong = 0;
    for (int step = 0; step < 3 && !e; step++) {
        ts_dp_begin(dp);
        /* "backward": layers of uneven sizes finish from the end */
        size_t hi = n, layer = 0;
        while (hi > 0 && !e) {
            size_t len = 1000 + (layer * 7919) % 150000, lo = hi > len ? hi - len : 0;
            for (size_t i = lo; i < hi; i++) grads[i] = (float)((int)((i * 3 + (size_t)rank * 5 + (size_t)step) % 11) - 5);
            volatile double x = 0;
            for (int k = 0; k < 20000; k++) x += k; /* some "compute" */
            e = ts_dp_ready(dp, lo);
            hi = lo;
            layer++;
        }
        if (!e) e = ts_dp_finish(dp, &st);
        for (size_t i = 0; i < n && !e; i++) {
            long s = 0;
            for (int r = 0; r < p; r++) s += (long)((i * 3 + (size_t)r * 5 + (size_t)step) % 11) - 5;
            if (grads[i] != (float)s / (float)p) wrong++;
        }
    }
    ts_ok(all(!e && wrong == 0, MPI_COMM_WORLD), "dp: 3 steps of bucketed averages exact on every rank (%zu wrong)",
          wrong);
    ts_ok(p == 1 || (st.buckets == 3 * 11 && st.early == 3 * 11 && st.comm_s > 0),
          "dp: %d buckets reduced, %d of them queued before ts_dp_finish, %.4f s on the progress thread, "
          "%.4f s exposed", st.buckets, st.early, st.comm_s, st.exposed_s);
    ts_dp_destroy(&dp);
    free(grads);
    ts_coll_destroy(&c);
    int rc = ts_done();
    MPI_Finalize();
    return rc;
}
