/* Private to src/nn: per-(sample, channel) passes shared by the norm layers
 * on channels-last data x [N][S][C] (S voxels per sample). Sums are taken in
 * float over blocks of voxels and in double across blocks, per work item in
 * a fixed order (results do not depend on the schedule or thread count).
 * mask, where taken, is the output of a fused ReLU: dy counts where mask > 0. */
#ifndef TS_NN_NORM_IMPL_H
#define TS_NN_NORM_IMPL_H

#include <stddef.h>

#include "src/nn/layers.h"

/* Forward statistics that do not depend on how the voxels are spread over
 * ranks or threads (docs/parallelism.md, "Equal to one rank"). Statistic j
 * of N * G covers sample j / G (n) and its channels [g * C/G, (g+1) * C/G)
 * (g = j % G) over all S voxels of x [N][S][C] (batch norm: N = 1, the
 * batch folded into S, G = C; instance norm: G = C). Each value is rounded
 * to an integer multiple of 2^-e, e chosen from the largest |value| of the
 * statistic over the group (a MAX reduction), so that every value has at
 * most 26 bits; the sums of these integers and of their squares are exact
 * (and so is their reduction over the group, carried in 32-bit limbs of
 * doubles), and mean and variance follow from them by the same arithmetic
 * on every rank and every layout: bit-identical to one rank's. A non-finite
 * value makes its statistic NaN. count[j] receives the number of values of
 * statistic j over the group. Collective over o->sync's group when
 * o->sync is set; errors: out of memory, the reduction's. */
int ts_nn_exact_stats(const float *x, int N, size_t S, int C, int G, const ts_norm_opts *o, double *mean, double *var,
                      double *count);

/* s1[n][c] = sum dy', s2[n][c] = sum dy' (x - center[n][c]); dy' = dy, or 0 where mask <= 0. */
int ts_nn_channel_grad_sums(const float *x, const float *dy, const float *mask, const float *center, int N, size_t S,
                            int C, double *s1, double *s2);
/* y[n][s][c] = x * scale[n][c] + shift[n][c], then max(0, .) if relu (y may be x). */
void ts_nn_channel_affine(const float *x, const float *scale, const float *shift, int N, size_t S, int C, int relu,
                          float *y);
/* dx[n][s][c] = dy' * a[n][c] + (x - center[n][c]) * b[n][c] + k[n][c] with dy' as above
 * (the shape of every norm's input gradient; dx may alias dy or x). */
void ts_nn_norm_dx(const float *x, const float *dy, const float *mask, const float *center, const float *a,
                   const float *b, const float *k, int N, size_t S, int C, float *dx);
#endif
