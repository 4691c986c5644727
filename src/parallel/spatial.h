/* Spatial decomposition: every sample's volume split over the ranks of a
 * spatial group, laid out as a Cartesian grid (MPI_Cart_create) of
 * dims[0] x dims[1] x dims[2] boxes along depth, height and width. This
 * module plans the split (checks that the patch splits evenly at every
 * level of the network, chooses dims for `auto`), gives each rank its box,
 * exchanges one-voxel halos with the up to 26 neighbours (faces, edges and
 * corners, nonblocking point-to-point, one exchange in flight) into the
 * face buffers of src/nn's ts_halo, and sums small vectors over the group
 * (norm statistics, loss terms). docs/parallelism.md has the picture. */
#ifndef TS_PARALLEL_SPATIAL_H
#define TS_PARALLEL_SPATIAL_H

#include <mpi.h>
#include <stdint.h>

#include "src/nn/layers.h"

/* Local. The split of a patch over sp ranks: spec is "auto" or "a,b,c"
 * (parallel.sp_dims); levels: the network's resolution levels (each halves
 * the box by max-pooling). Every rank's box must have an even edge at every
 * level before a pool (edge / dims divisible by 2^(levels-1)), and at least
 * one voxel (the one-voxel halo) at the deepest level. auto splits depth
 * first, then height, then width (prime factors of sp, largest first).
 * Errors (TS_ERR_CONFIG) name the keys and the sizes; every rank computes
 * the same answer, so every rank fails together. */
int ts_spatial_plan(int sp, const char *spec, const int64_t patch[3], int levels, int dims[3]);

typedef struct ts_spatial ts_spatial;

/* Halo exchange figures, accumulated. */
typedef struct ts_spatial_stats {
    double exposed_s;  /* waiting for halos (and packing/unpacking) while no compute was left to hide them */
    double hidden_s;   /* halo time covered by compute: from the start of an exchange to its completion
                        * or to the wait, whichever is first */
    double sum_s;      /* group sums (norm statistics, loss) */
    uint64_t bytes;    /* halo bytes sent by this rank */
    int64_t exchanges; /* halo exchanges started */
} ts_spatial_stats;

/* Collective on comm (its size = dims[0] dims[1] dims[2]). Duplicates comm
 * as a Cartesian communicator (no reordering: the spatial group's rank
 * order is the caller's). */
int ts_spatial_create(MPI_Comm comm, const int dims[3], ts_spatial **out);
/* Collective. NULL-safe; waits for an exchange in flight. */
void ts_spatial_destroy(ts_spatial **s);

/* Local queries. */
int ts_spatial_size(const ts_spatial *s);
int ts_spatial_rank(const ts_spatial *s);
void ts_spatial_dims(const ts_spatial *s, int dims[3]);
void ts_spatial_coords(const ts_spatial *s, int coords[3]);
MPI_Comm ts_spatial_comm(const ts_spatial *s);
/* 1 when a neighbour holds the next box along dim d on side 0 (lower) or 1 (upper). */
int ts_spatial_neighbor(const ts_spatial *s, int d, int side);
/* on[d] = 1 where the volume is split along d (dims[d] > 1). */
void ts_spatial_split_dims(const ts_spatial *s, int on[3]);
/* Local. This rank's box [lo, lo + size) of a D x H x W volume whose edges
 * dims divide (checked: TS_ERR_ARG otherwise). */
int ts_spatial_box(const ts_spatial *s, const int64_t dhw[3], int64_t lo[3], int64_t size[3]);

/* Collective among neighbours (every rank of the group calls it for the
 * same layer in the same order). Starts sending this rank's boundary voxels
 * of the box [N][dhw][ca] (a) or of the channel concatenation [a, b] (b may
 * be NULL, cb 0), channels-last, and receiving the neighbours' into h's
 * faces: h->lo[d] / h->hi[d] must be allocated (layouts in src/nn/layers.h)
 * exactly where ts_spatial_neighbor says a neighbour exists, NULL
 * elsewhere, with h->on from ts_spatial_split_dims. a, b and h must stay
 * untouched until ts_spatial_halo_wait returns. One exchange at a time. */
int ts_spatial_halo_start(ts_spatial *s, const float *a, int ca, const float *b, int cb, int N, const int64_t dhw[3],
                          const ts_halo *h);
/* Collective among neighbours, as ts_spatial_halo_start, for a box whose
 * boundary voxels are packed already (the GPU engine packs them on the
 * device and copies them down): packed holds what this rank sends, C
 * channels, in ts_halo_send_floats's layout for ts_spatial_send_mask's
 * offsets (src/nn/layers.h); it must stay untouched until
 * ts_spatial_halo_wait returns. */
int ts_spatial_halo_start_packed(ts_spatial *s, const float *packed, int C, int N, const int64_t dhw[3],
                                 const ts_halo *h);
/* Local. Bit i set where this rank has a neighbour at offset i (i = 9 (o0 +
 * 1) + 3 (o1 + 1) + (o2 + 1)): the offsets a packed box holds. */
unsigned ts_spatial_send_mask(const ts_spatial *s);
/* Local. Progresses the exchange in flight (MPI_Testall); cheap; for the
 * progress hook of the convolutions. */
void ts_spatial_halo_progress(ts_spatial *s);
/* Local. Waits for the exchange in flight and fills the faces. */
int ts_spatial_halo_wait(ts_spatial *s);

/* Collective on the group. buf[0..n) summed (max = 0) or maximised
 * (max = 1) over the group's ranks (the same result on every rank). */
int ts_spatial_reduce(ts_spatial *s, double *buf, int n, int max);

/* Local. Accumulated figures; set replaces them (e.g. to leave out an
 * evaluation's exchanges, or to zero them). */
const ts_spatial_stats *ts_spatial_get_stats(const ts_spatial *s);
void ts_spatial_set_stats(ts_spatial *s, const ts_spatial_stats *st);

#endif
