/* Private to src/nn: per-(sample, channel) passes shared by the norm layers
 * on channels-last data x [N][S][C] (S voxels per sample). Sums are taken in
 * float over blocks of voxels and in double across blocks, per work item in
 * a fixed order (results do not depend on the schedule or thread count).
 * mask, where taken, is the output of a fused ReLU: dy counts where mask > 0. */
#ifndef TS_NN_NORM_IMPL_H
#define TS_NN_NORM_IMPL_H

#include <stddef.h>

/* One pass: s1[n][c] = sum (x - K[n][c]), s2[n][c] = sum (x - K[n][c])^2
 * (K: a shift near the mean, from ts_nn_shift, against cancellation). */
int ts_nn_channel_moments(const float *x, const float *K, int N, size_t S, int C, double *s1, double *s2);
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
/* K[c] = mean of x[0..min(S,256))[c] (x [S][C]): a shift for the moments,
 * close to the mean even where the first voxels are atypical (borders). */
static inline void ts_nn_shift(const float *x, size_t S, int C, float *K)
{
    const size_t m = S < 256 ? S : 256;
    for (int c = 0; c < C; c++) {
        double s = 0;
        for (size_t v = 0; v < m; v++) s += x[v * C + c];
        K[c] = (float)(s / (double)m);
    }
}

/* Mean and variance per channel from moments with shift K over m values. */
static inline void ts_nn_mean_var(double s1, double s2, double K, double m, double *mean, double *var)
{
    const double d = s1 / m;
    *mean = K + d;
    *var = s2 / m - d * d;
    if (*var < 0) *var = 0;
}

#endif
