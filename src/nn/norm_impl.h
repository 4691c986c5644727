/* Private to src/nn: per-(sample, channel) sums shared by the norm layers on
 * channels-last data x [N][S][C] (S voxels per sample). Sums are taken in
 * float over blocks of voxels and in double across blocks and threads, in a
 * fixed order (results do not depend on timing). */
#ifndef TS_NN_NORM_IMPL_H
#define TS_NN_NORM_IMPL_H

#include <stddef.h>

/* center NULL: s1[n][c] = sum x. center [N][C]: s2[n][c] = sum (x - center)^2.
 * With dy: s1 = sum dy, s2 = sum dy (x - center). Either output may be NULL. */
int ts_nn_channel_sums(const float *x, const float *dy, const float *center, int N, size_t S, int C, double *s1,
                       double *s2);
/* y[n][s][c] = x * scale[n][c] + shift[n][c] (y may be x). */
void ts_nn_channel_affine(const float *x, const float *scale, const float *shift, int N, size_t S, int C, float *y);
/* dx[n][s][c] = dy * a[n][c] + (x - center[n][c]) * b[n][c] + k[n][c]
 * (the shape of every norm's input gradient; dx may alias dy). */
void ts_nn_norm_dx(const float *x, const float *dy, const float *center, const float *a, const float *b,
                   const float *k, int N, size_t S, int C, float *dx);

#endif
