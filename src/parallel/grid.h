/* The process grid: the world split into dp x pp x sp with MPI_Comm_split.
 * Spatial groups are consecutive ranks, then pipeline stages, then
 * data-parallel replicas, so the groups that talk most (spatial halos,
 * pipeline activations) share a node and replicas span nodes:
 *   rank = (d * pp + p) * sp + s. */
#ifndef TS_PARALLEL_GRID_H
#define TS_PARALLEL_GRID_H

#include <mpi.h>
#include <stddef.h>

typedef struct ts_grid {
    int dp, pp, sp;          /* sizes */
    int d, p, s;             /* this rank's coordinates */
    int rank, size;          /* in the world communicator given */
    MPI_Comm world;          /* dup of the communicator given */
    MPI_Comm dp_comm;        /* same (p, s): data-parallel replicas */
    MPI_Comm pp_comm;        /* same (d, s): pipeline stages */
    MPI_Comm sp_comm;        /* same (d, p): spatial pieces */
} ts_grid;

/* Collective on world. dp <= 0 means "world size / (pp * sp)". Fails on
 * every rank, naming the sizes, if dp * pp * sp != ranks. */
int ts_grid_create(MPI_Comm world, int dp, int pp, int sp, ts_grid **out);
/* Collective. NULL-safe. */
void ts_grid_destroy(ts_grid **g);
/* Local. "4 ranks = dp 2 x pp 1 x sp 2; rank 3 is (d 1, p 0, s 1)". */
void ts_grid_describe(const ts_grid *g, char *buf, size_t n);

#endif
