/* Private to src/nn: the three CPU kernels that all convolutions are built
 * from, on channels-last float32 data, with weights packed as
 * wp[tap][c][ocp] (tap = (kd*k + kh)*k + kw, ocp = output channels rounded
 * up to 16, padding lanes zero):
 *   gather  y[o]  = b + sum_t sum_c x[o*s - p + t][c] wp[t][c][:]
 *           (conv forward; conv backward-data at stride 1 with flipped taps;
 *            transposed-conv backward-data)
 *   tgather y[o]  = b + sum_t sum_c x[(o + p - t)/s][c] wp[t][c][:]  (where
 *           divisible and inside; transposed-conv forward; conv backward-data
 *           at stride > 1)
 *   wgrad   dw[t][c][:] = sum_o x[o*s - p + t][c] g[o][:]
 * Each runs OpenMP threads over output rows with static schedules (the
 * results do not depend on timing). Register-blocked micro-kernels: a tile
 * of output voxels x 16-lane channel vectors stays in registers over all
 * taps and input channels; inputs are staged per row block in a zero-padded
 * slab, so that the inner loops have no bounds checks. */
#ifndef TS_NN_CONV_IMPL_H
#define TS_NN_CONV_IMPL_H

#include <stddef.h>

#include "src/nn/layers.h"

typedef struct ts_conv_geom {
    int N;
    int D, H, W, C;     /* input dims and channels (gather, wgrad: the large side) */
    int OD, OH, OW, OC; /* output dims and channels */
    int k, s, p;        /* cubic kernel, stride, padding */
} ts_conv_geom;

static inline int ts_nn_pad16(int c) { return (c + 15) & ~15; }

/* Scratch memory cached per calling thread, one buffer per slot (0: the
 * kernels' slabs and partial sums, 1: packed weights, 2: unpacked weight
 * gradients, 3: spare): reused across calls, so that large scratch is not
 * mapped and faulted in again on every call. Not zeroed; NULL on failure.
 * The buffers live until ts_nn_scratch_release() on that thread. */
void *ts_nn_scratch(int slot, size_t bytes);
void ts_nn_scratch_release(void);

/* An input that is the channel concatenation [a, b] of two channels-last
 * tensors (ca channels, then C - ca), or one tensor (b NULL), read without
 * forming the concatenation; and an output split the same way.
 * halo (NULL: zero padding): the one-voxel halo of a box of a split volume
 * (layouts in layers.h; a face voxel holds all C channels), read by the
 * slab fill where a position lies outside the box. Only for k = 3, s = 1,
 * p = 1 geometries (the callers check). */
typedef struct ts_conv_src {
    const float *a, *b;
    int ca;
    const ts_halo *halo;
} ts_conv_src;
typedef struct ts_conv_dst {
    float *a, *b;
    int ca;
} ts_conv_dst;

/* How a gather or wgrad call runs (NULL: everything, no hooks). part (gather
 * only): the work items (sample, output plane, block of rows) computed:
 * TS_CONV_BORDER those that read a non-NULL face of x.halo, INTERIOR the
 * others, ALL both. progress[i] (NULL: none) is called with ctx[i] by one
 * thread (OpenMP thread 0 of the kernel's team, i.e. the calling thread;
 * never two at once) on entering the parallel loop and after each work
 * item it completes. */
typedef struct ts_conv_sched {
    ts_conv_part part;
    void (*progress[2])(void *ctx);
    void *ctx[2];
} ts_conv_sched;

/* bias: NULL or [OC]. Return 0 or TS_ERR_NOMEM. */
int ts_nn_gather(const ts_conv_geom *g, const float *x, const float *wp, const float *bias, float *y);
int ts_nn_gather2(const ts_conv_geom *g, ts_conv_src x, const float *wp, const float *bias, ts_conv_dst y,
                  const ts_conv_sched *sch);
int ts_nn_tgather(const ts_conv_geom *g, const float *x, const float *wp, const float *bias, float *y);
/* gy [N, OD, OH, OW, OC]; dwp [k^3][C][OC] is overwritten (not padded).
 * sch->part is ignored (all items). */
int ts_nn_wgrad(const ts_conv_geom *g, const float *x, const float *gy, float *dwp);
int ts_nn_wgrad2(const ts_conv_geom *g, ts_conv_src x, const float *gy, float *dwp, const ts_conv_sched *sch);
/* db[oc] += sum over all voxels of gy[.., oc] (deterministic per thread count). */
int ts_nn_bias_grad(const float *gy, size_t voxels, int OC, float *db);

#endif
