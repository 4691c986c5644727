/* Private to src/nn: per-(sample, channel) passes shared by the norm layers
 * on channels-last data x [N][S][C] (S voxels per sample). Sums are taken in
 * float over blocks of voxels and in double across blocks, per work item in
 * a fixed order (results do not depend on the schedule or thread count).
 * A fused ReLU's mask, where taken, is the forward's pre-activation t =
 * x * msc[n][c] + msh[n][c] (the forward's scale and shift, the arithmetic
 * of ts_nn_affine_run: the same bits, so t > 0 exactly where the forward's
 * output y > 0), recomputed from x instead of read from y: dy counts where
 * t > 0, elsewhere 0 (slope 0: ReLU) or slope dy (slope > 0: leaky ReLU,
 * the arithmetic of relu.c's backward, so the bits equal the two passes'). */
#ifndef TS_NN_NORM_IMPL_H
#define TS_NN_NORM_IMPL_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

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
 * statistic j over the group. amax_in: NULL, or max |x| of each (n, c)
 * ([N][C], +inf where a value is not finite: ts_conv_ep.amax), which
 * saves the pass that finds it. Collective over o->sync's group when
 * o->sync is set; errors: out of memory, the reduction's. */
int ts_nn_exact_stats(const float *x, const float *amax_in, int N, size_t S, int C, int G, const ts_norm_opts *o,
                      double *mean, double *var, double *count);

/* s1[n][c] = sum dy', s2[n][c] = sum dy' (x - center[n][c]); dy' = dy where
 * there is no mask (msc NULL) or t > 0, else 0 (slope 0) or slope dy. */
int ts_nn_channel_grad_sums(const float *x, const float *dy, const float *msc, const float *msh, float slope,
                            const float *center, int N, size_t S, int C, double *s1, double *s2);
/* y[n][s][c] = x * scale[n][c] + shift[n][c], then if relu max(0, .)
 * (slope 0) or t > 0 ? t : slope t (leaky; relu.c's arithmetic) (y may be x). */
void ts_nn_channel_affine(const float *x, const float *scale, const float *shift, int N, size_t S, int C, int relu,
                          float slope, float *y);

/* The affine map of ts_nn_channel_affine, inline, so that a convolution's
 * epilogue (conv_kernels.c) computes the same bits on each output row as
 * the separate pass. Where C divides 16 the channels' pattern repeats in
 * 16 lanes: ts_nn_affine_pattern builds it once (a[j] = scale[j % C],
 * b[j] = shift[j % C]), ts_nn_affine_run16 maps ne values (a whole number
 * of voxels, the first at channel 0). */
static inline void ts_nn_affine_pattern(const float *sc, const float *sh, int C, float *a, float *b)
{
    for (int j = 0; j < 16; j++) a[j] = sc[j % C], b[j] = sh[j % C];
}

/* GCC warns that a 64-byte vector's ABI differs without AVX-512: no call is
 * left to differ (always inlined) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float ts_nn_v16 __attribute__((vector_size(64)));
typedef int ts_nn_v16i __attribute__((vector_size(64)));

/* The (leaky) ReLU's select, lane by lane: v where m > 0, else +0 (slope 0:
 * NaN and -0 -> 0, as the scalar `m > 0 ? v : 0`) or slope v (relu.c's
 * leaky arithmetic). Forward: m = v = the norm's output; backward: m the
 * forward output, v the gradient (norm_common.c). */
static inline __attribute__((always_inline)) ts_nn_v16 ts_nn_relu_sel(ts_nn_v16 m, ts_nn_v16 v, float slope)
{
    const ts_nn_v16i pos = m > 0.0f;
    if (slope == 0.0f) return (ts_nn_v16)((ts_nn_v16i)v & pos);
    return (ts_nn_v16)(((ts_nn_v16i)v & pos) | ((ts_nn_v16i)(slope * v) & ~pos));
}
static inline float ts_nn_relu_sel1(float m, float v, float slope) { return m > 0.0f ? v : slope == 0.0f ? 0.0f : slope * v; }

/* the affine map's pre-activation x * a + b: one expression for the forward
 * (ts_nn_affine_run*) and the backward's recomputed mask (the same bits) */
static inline __attribute__((always_inline)) ts_nn_v16 ts_nn_pre16(ts_nn_v16 x, ts_nn_v16 a, ts_nn_v16 b) { return x * a + b; }
static inline float ts_nn_pre1(float x, float a, float b) { return x * a + b; }

/* the activation of 16 values (relu 0: none) and of one */
static inline __attribute__((always_inline)) ts_nn_v16 ts_nn_act16(ts_nn_v16 t, int relu, float slope)
{
    return relu ? ts_nn_relu_sel(t, t, slope) : t;
}
static inline float ts_nn_act1(float t, int relu, float slope) { return relu ? ts_nn_relu_sel1(t, t, slope) : t; }

static inline void ts_nn_affine_run16(const float *xb, const float *a, const float *b, size_t ne, int relu, float slope,
                                      float *yb)
{
    typedef float v16u __attribute__((vector_size(64), aligned(4)));
    ts_nn_v16 va, vb;
    memcpy(&va, a, sizeof va);
    memcpy(&vb, b, sizeof vb);
    size_t i = 0;
    for (; i + 16 <= ne; i += 16) *(v16u *)(yb + i) = ts_nn_act16(ts_nn_pre16(*(const v16u *)(xb + i), va, vb), relu, slope);
    for (; i < ne; i++) yb[i] = ts_nn_act1(ts_nn_pre1(xb[i], a[i % 16], b[i % 16]), relu, slope);
}

/* ... on nv voxels of C channels from x to y (y may be x) with one
 * sample's scale and shift */
static inline void ts_nn_affine_run(const float *xb, const float *sc, const float *sh, size_t nv, int C, int relu,
                                    float slope, float *yb)
{
    typedef float v16u __attribute__((vector_size(64), aligned(4)));
    if (C <= 16 && 16 % C == 0) {
        float a[16], b[16];
        ts_nn_affine_pattern(sc, sh, C, a, b);
        ts_nn_affine_run16(xb, a, b, nv * C, relu, slope, yb);
    } else if (C % 16 == 0) { /* each voxel in vectors of 16 channels */
        for (size_t v = 0; v < nv; v++)
            for (int c = 0; c < C; c += 16)
                *(v16u *)(yb + v * C + c) = ts_nn_act16(
                    ts_nn_pre16(*(const v16u *)(xb + v * C + c), *(const v16u *)(sc + c), *(const v16u *)(sh + c)), relu, slope);
    } else if (relu) {
        for (size_t v = 0; v < nv; v++)
            for (int c = 0; c < C; c++) yb[v * C + c] = ts_nn_act1(ts_nn_pre1(xb[v * C + c], sc[c], sh[c]), 1, slope);
    } else {
        for (size_t v = 0; v < nv; v++)
            for (int c = 0; c < C; c++) yb[v * C + c] = ts_nn_pre1(xb[v * C + c], sc[c], sh[c]);
    }
}

/* |v| lane by lane, +inf where v is not finite (NaN included): the values
 * whose maximum the exact statistics take (ts_nn_exact_stats) */
static inline __attribute__((always_inline)) ts_nn_v16 ts_nn_absinf16(ts_nn_v16 v)
{
    const ts_nn_v16i a = (ts_nn_v16i)v & 0x7fffffff, fin = (ts_nn_v16)a <= FLT_MAX;
    return (ts_nn_v16)((a & fin) | ((ts_nn_v16i)((ts_nn_v16){0} + INFINITY) & ~fin));
}
static inline float ts_nn_absinf1(float v)
{
    const float a = fabsf(v);
    return a <= FLT_MAX ? a : INFINITY;
}
/* lane by lane max(m, a) of values that are never NaN */
static inline __attribute__((always_inline)) ts_nn_v16 ts_nn_max16(ts_nn_v16 m, ts_nn_v16 a)
{
    const ts_nn_v16i gt = a > m;
    return (ts_nn_v16)(((ts_nn_v16i)a & gt) | ((ts_nn_v16i)m & ~gt));
}

/* acc[c] = max(acc[c], |y| of channel c) over nv voxels of C channels at y
 * (ts_conv_ep.amax: a convolution's epilogue, on rows still in cache) */
static inline void ts_nn_amax_run(const float *y, size_t nv, int C, float *acc)
{
    typedef float v16u __attribute__((vector_size(64), aligned(4)));
    if (C % 16 == 0) {
        for (int c = 0; c < C; c += 16) {
            ts_nn_v16 m = *(const v16u *)(acc + c);
            for (size_t v = 0; v < nv; v++) m = ts_nn_max16(m, ts_nn_absinf16(*(const v16u *)(y + v * C + c)));
            *(v16u *)(acc + c) = m;
        }
    } else if (16 % C == 0) { /* lane j holds channel j % C */
        const size_t ne = nv * (size_t)C;
        ts_nn_v16 m = {0};
        size_t i = 0;
        for (; i + 16 <= ne; i += 16) m = ts_nn_max16(m, ts_nn_absinf16(*(const v16u *)(y + i)));
        for (; i < ne; i++) acc[i % C] = fmaxf(acc[i % C], ts_nn_absinf1(y[i]));
        for (int j = 0; j < 16; j++) acc[j % C] = fmaxf(acc[j % C], m[j]);
    } else {
        for (size_t v = 0; v < nv; v++)
            for (int c = 0; c < C; c++) acc[c] = fmaxf(acc[c], ts_nn_absinf1(y[v * C + c]));
    }
}
#pragma GCC diagnostic pop
/* dx[n][s][c] = dy' * a[n][c] + (x - center[n][c]) * b[n][c] + k[n][c] with dy' as above
 * (the shape of every norm's input gradient; dx may alias dy or x). */
void ts_nn_norm_dx(const float *x, const float *dy, const float *msc, const float *msh, float slope, const float *center,
                   const float *a, const float *b, const float *k, int N, size_t S, int C, float *dx);
#endif
