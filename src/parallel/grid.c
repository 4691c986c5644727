/* Process grid from communicator splits; see grid.h. */
#include "tsbuild.h"
#include "src/parallel/grid.h"
#include "src/core/error.h"

#include <stdio.h>
#include <stdlib.h>

int ts_grid_create(MPI_Comm world, int dp, int pp, int sp, ts_grid **out)
{
    int err = 0, size, rank;
    ts_grid *g = NULL;
    *out = NULL;
    TS_MPI(MPI_Comm_size(world, &size));
    TS_MPI(MPI_Comm_rank(world, &rank));
    if (pp < 1 || sp < 1) return TS_ERR(TS_ERR_CONFIG, "parallel.pp = %d and parallel.sp = %d must be >= 1", pp, sp);
    if (dp <= 0) {
        if (size % (pp * sp))
            return TS_ERR(TS_ERR_CONFIG, "parallel.pp x parallel.sp = %d x %d does not divide the %d ranks", pp, sp, size);
        dp = size / (pp * sp);
    }
    if ((long)dp * pp * sp != size)
        return TS_ERR(TS_ERR_CONFIG,
                      "parallel.dp x parallel.pp x parallel.sp = %d x %d x %d = %ld, but the job has %d ranks", dp, pp, sp,
                      (long)dp * pp * sp, size);
    g = calloc(1, sizeof *g);
    if (!g) return TS_ERR(TS_ERR_NOMEM, "grid");
    g->world = g->dp_comm = g->pp_comm = g->sp_comm = MPI_COMM_NULL;
    g->dp = dp;
    g->pp = pp;
    g->sp = sp;
    g->rank = rank;
    g->size = size;
    g->s = rank % sp;
    g->p = (rank / sp) % pp;
    g->d = rank / (sp * pp);
    TS_MPI(MPI_Comm_dup(world, &g->world));
    TS_MPI(MPI_Comm_split(world, g->p * sp + g->s, g->d, &g->dp_comm));
    TS_MPI(MPI_Comm_split(world, g->d * sp + g->s, g->p, &g->pp_comm));
    TS_MPI(MPI_Comm_split(world, g->d * pp + g->p, g->s, &g->sp_comm));
    *out = g;
    return 0;
cleanup:
    ts_grid_destroy(&g);
    return err;
}

void ts_grid_destroy(ts_grid **gp)
{
    if (!gp || !*gp) return;
    ts_grid *g = *gp;
    MPI_Comm *cs[4] = {&g->world, &g->dp_comm, &g->pp_comm, &g->sp_comm};
    for (int i = 0; i < 4; i++)
        if (*cs[i] != MPI_COMM_NULL) MPI_Comm_free(cs[i]);
    free(g);
    *gp = NULL;
}

void ts_grid_describe(const ts_grid *g, char *buf, size_t n)
{
    snprintf(buf, n, "%d rank%s = dp %d x pp %d x sp %d (spatial groups are consecutive ranks, replicas outermost)",
             g->size, g->size == 1 ? "" : "s", g->dp, g->pp, g->sp);
}
