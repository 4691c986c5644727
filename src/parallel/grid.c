/* Process grid from communicator splits; see grid.h. Owns the rank order
 * (node by node), the dp, pp, sp and stage communicators, and grid.json
 * (rows gathered to rank 0, which writes it). Created only by the layout
 * (src/parallel/layout.c) from the sizes it is given: reads no config key. */
#include "tsbuild.h"
#include "src/parallel/grid.h"
#include "collectives/coll.h"
#include "src/core/error.h"

#include <stdio.h>
#include <stdlib.h>

int ts_grid_create(MPI_Comm world, int dp, int pp, int sp, ts_grid **out)
{
    int err = 0, size, rank, node, nnodes, lrank, lsize;
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
    TS_TRY(ts_coll_node_info(world, &node, &nnodes, &lrank, &lsize));
    g = calloc(1, sizeof *g);
    if (!g) return TS_ERR(TS_ERR_NOMEM, "grid");
    g->world = g->dp_comm = g->pp_comm = g->sp_comm = g->stage_comm = MPI_COMM_NULL;
    g->dp = dp;
    g->pp = pp;
    g->sp = sp;
    g->node = node;
    g->nnodes = nnodes;
    g->local_rank = lrank;
    g->local_size = lsize;
    g->given_rank = rank;
    /* node by node (nodes are numbered by their lowest rank, so rank 0 stays first) */
    TS_MPI(MPI_Comm_split(world, 0, node * size + lrank, &g->world));
    TS_MPI(MPI_Comm_rank(g->world, &g->rank));
    g->size = size;
    g->s = g->rank % sp;
    g->p = (g->rank / sp) % pp;
    g->d = g->rank / (sp * pp);
    TS_MPI(MPI_Comm_split(g->world, g->p * sp + g->s, g->d, &g->dp_comm));
    TS_MPI(MPI_Comm_split(g->world, g->d * sp + g->s, g->p, &g->pp_comm));
    TS_MPI(MPI_Comm_split(g->world, g->d * pp + g->p, g->s, &g->sp_comm));
    TS_MPI(MPI_Comm_split(g->world, g->p, g->d * sp + g->s, &g->stage_comm));
    {
        int mm[2] = {node, -node};
        TS_MPI(MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_INT, MPI_MAX, g->sp_comm));
        int one = mm[0] == -mm[1];
        TS_MPI(MPI_Allreduce(&one, &g->sp_one_node, 1, MPI_INT, MPI_MIN, g->world));
    }
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
    MPI_Comm *cs[5] = {&g->world, &g->dp_comm, &g->pp_comm, &g->sp_comm, &g->stage_comm};
    for (int i = 0; i < 5; i++)
        if (*cs[i] != MPI_COMM_NULL) MPI_Comm_free(cs[i]);
    free(g);
    *gp = NULL;
}

void ts_grid_describe(const ts_grid *g, char *buf, size_t n)
{
    snprintf(buf, n,
             "%d rank%s = dp %d x pp %d x sp %d on %d node%s (spatial groups are consecutive ranks%s, replicas "
             "outermost)",
             g->size, g->size == 1 ? "" : "s", g->dp, g->pp, g->sp, g->nnodes, g->nnodes == 1 ? "" : "s",
             g->sp == 1 ? "" : g->sp_one_node ? ", each within one node" : ", some spanning nodes (more ranks per node than sp helps)");
}

int ts_grid_write_layout(const ts_grid *g, const char *path, const int sp_dims[3], const int sp_coords[3],
                         const int64_t box_lo[3], const int64_t box_size[3])
{
    enum { NV = 14 };
    int err = 0;
    long long mine[NV], *all = NULL;
    mine[0] = g->given_rank;
    mine[1] = g->node;
    mine[2] = g->d;
    mine[3] = g->p;
    mine[4] = g->s;
    for (int k = 0; k < 3; k++) {
        mine[5 + k] = sp_coords ? sp_coords[k] : 0;
        mine[8 + k] = box_lo ? box_lo[k] : 0;
        mine[11 + k] = box_size ? box_size[k] : 0;
    }
    if (g->rank == 0) {
        all = malloc(sizeof *all * (size_t)g->size * NV);
        if (!all) err = TS_ERR(TS_ERR_NOMEM, "layout");
    }
    TS_CHECK(ts_err_agree(g->world, err));
    TS_MPI(MPI_Gather(mine, NV, MPI_LONG_LONG, all, NV, MPI_LONG_LONG, 0, g->world));
    if (g->rank == 0) {
        FILE *f = fopen(path, "w");
        if (!f) {
            err = TS_ERR(TS_ERR_IO, "%s: cannot write the grid layout", path);
        } else {
            fprintf(f, "{\n  \"ranks\": %d, \"nodes\": %d,\n  \"grid\": {\"dp\": %d, \"pp\": %d, \"sp\": %d},\n", g->size,
                    g->nnodes, g->dp, g->pp, g->sp);
            fprintf(f, "  \"sp_dims\": [%d, %d, %d],\n  \"sp_within_node\": %s,\n  \"rank\": [\n",
                    sp_dims ? sp_dims[0] : 1, sp_dims ? sp_dims[1] : 1, sp_dims ? sp_dims[2] : 1,
                    g->sp_one_node ? "true" : "false");
            for (int r = 0; r < g->size; r++) {
                const long long *v = all + (size_t)r * NV;
                fprintf(f, "    {\"world_rank\": %lld, \"node\": %lld, \"d\": %lld, \"p\": %lld, \"s\": %lld", v[0], v[1],
                        v[2], v[3], v[4]);
                if (sp_coords) fprintf(f, ", \"sp_coords\": [%lld, %lld, %lld]", v[5], v[6], v[7]);
                if (box_lo && box_size)
                    fprintf(f, ", \"box_lo\": [%lld, %lld, %lld], \"box_size\": [%lld, %lld, %lld]", v[8], v[9], v[10],
                            v[11], v[12], v[13]);
                fprintf(f, "}%s\n", r + 1 < g->size ? "," : "");
            }
            fprintf(f, "  ]\n}\n");
            if (fclose(f)) err = TS_ERR(TS_ERR_IO, "%s: write failed", path);
        }
    }
    TS_CHECK(ts_err_agree(g->world, err));
cleanup:
    free(all);
    return err;
}
