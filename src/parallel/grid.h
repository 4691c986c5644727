/* The process grid: the world split into dp x pp x sp with MPI_Comm_split.
 * Ranks are first ordered node by node (MPI_COMM_TYPE_SHARED; fake nodes
 * with TESSERA_RANKS_PER_NODE), then spatial groups are consecutive ranks,
 * then pipeline stages, then data-parallel replicas, so the groups that
 * talk most (spatial halos, pipeline activations) share a node and
 * replicas span nodes:
 *   rank = (d * pp + p) * sp + s   (rank in the node-ordered world). */
#ifndef TS_PARALLEL_GRID_H
#define TS_PARALLEL_GRID_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ts_grid {
    int dp, pp, sp;          /* sizes */
    int d, p, s;             /* this rank's coordinates */
    int rank, size;          /* in world (node-ordered) */
    int given_rank;          /* rank in the communicator given to ts_grid_create */
    int node, nnodes;        /* this rank's node, number of nodes */
    int local_rank, local_size; /* this rank's place among its node's ranks (the GPU it takes) */
    int sp_one_node;         /* 1 when every spatial group lies within one node */
    MPI_Comm world;          /* the communicator given, ranks ordered node by node */
    MPI_Comm dp_comm;        /* same (p, s): data-parallel replicas */
    MPI_Comm pp_comm;        /* same (d, s): pipeline stages */
    MPI_Comm sp_comm;        /* same (d, p): spatial pieces */
    MPI_Comm stage_comm;     /* same p: the dp x sp ranks holding stage p's parameters
                              * (gradients are averaged over it) */
} ts_grid;

/* Collective on world. dp <= 0 means "world size / (pp * sp)". Fails on
 * every rank, naming the sizes, if dp * pp * sp != ranks. */
int ts_grid_create(MPI_Comm world, int dp, int pp, int sp, ts_grid **out);
/* Collective. NULL-safe. */
void ts_grid_destroy(ts_grid **g);
/* Local. "4 ranks = dp 2 x pp 1 x sp 2 on 2 nodes (...)". */
void ts_grid_describe(const ts_grid *g, char *buf, size_t n);
/* Collective on world: rank 0 writes path (JSON) with the grid's sizes and,
 * per rank, its rank in the communicator given to ts_grid_create
 * ("world_rank"), node, (d, p, s), spatial coordinates sp_coords and box
 * [box_lo, box_lo + box_size) of the patch (may be NULL: omitted). Errors
 * are agreed. */
int ts_grid_write_layout(const ts_grid *g, const char *path, const int sp_dims[3], const int sp_coords[3],
                         const int64_t box_lo[3], const int64_t box_size[3]);

#endif
