/* Private to src/nn: shape checks and per-voxel softmax shared by the losses. */
#ifndef TS_NN_LOSS_IMPL_H
#define TS_NN_LOSS_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "src/core/error.h"
#include "src/core/tensor.h"

/* logits [N, ..., K] float32, labels [N, ...] uint8 with the same leading dims. */
static inline int ts_nn_loss_shapes(const ts_tensor *logits, const ts_tensor *labels, const char *who, int64_t *voxels,
                                    int *K, int64_t *N)
{
    char a[96], b[96];
    int ok = ts_tensor_f32(logits) && labels->dtype == TS_UINT8 && logits->ndim >= 2 && labels->ndim == logits->ndim - 1;
    for (int i = 0; ok && i < labels->ndim; i++) ok = labels->shape[i] == logits->shape[i];
    if (!ok)
        return TS_ERR(TS_ERR_ARG, "%s: logits %s (float32, classes last) and labels %s (uint8) do not match", who,
                      ts_tensor_shape_str(logits, a, sizeof a), ts_tensor_shape_str(labels, b, sizeof b));
    *K = (int)logits->shape[logits->ndim - 1];
    *voxels = ts_tensor_numel(labels);
    *N = logits->shape[0];
    if (*K < 1 || *K > 256) return TS_ERR(TS_ERR_ARG, "%s: %d classes (1..256)", who, *K);
    return 0;
}

/* ---- the softmax of 16 voxels at once (the losses' per-voxel work) ----
 * Every voxel goes through the same vector code whatever its place (a
 * block's unused lanes are computed on zeros and dropped), so a voxel's
 * probabilities do not depend on how the volume is cut into blocks,
 * chunks, threads or spatial pieces. */
/* GCC warns that a 64-byte vector's ABI differs without AVX-512 (a build
 * with --disable-native): these helpers are static to the loss files that
 * include them, no call leaves a file */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float ts_lv16 __attribute__((vector_size(64)));
typedef int32_t ts_li16 __attribute__((vector_size(64)));
#define TS_LANES 16

static inline ts_lv16 ts_nn_vsel(ts_li16 c, ts_lv16 a, ts_lv16 b) /* c ? a : b, lane by lane */
{
    return (ts_lv16)(((ts_li16)a & c) | ((ts_li16)b & ~c));
}

/* exp(x) for x <= 0 (softmax's shifted logits): Cephes' expf (range
 * reduction by ln 2 in two parts, degree-5 polynomial, 2^n in the exponent
 * bits), about 1 ulp from glibc's expf; 0 below -87.3 (where expf gives
 * denormals or 0); NaN stays NaN. */
static inline ts_lv16 ts_nn_vexp_neg(ts_lv16 x)
{
    const ts_li16 under = x < -87.3365448f;
    x = ts_nn_vsel(under, (ts_lv16){0}, x);
    const ts_lv16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    const ts_lv16 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    ts_lv16 q = r * 1.9875691500e-4f + 1.3981999507e-3f;
    q = q * r + 8.3334519073e-3f;
    q = q * r + 4.1665795894e-2f;
    q = q * r + 1.6666665459e-1f;
    q = q * r + 5.0000001201e-1f;
    const ts_lv16 e = q * (r * r) + r + 1.0f;
    const ts_li16 ni = __builtin_convertvector(n, ts_li16);
    const ts_lv16 scale = (ts_lv16)((ni + 127) << 23);
    return ts_nn_vsel(under, (ts_lv16){0}, e * scale);
}

/* the labels of nv (1..16) voxels as a vector (lanes past nv: -1, no class) */
static inline ts_li16 ts_nn_labels16(const uint8_t *y, int nv)
{
    if (nv == TS_LANES) { /* 16 bytes widened in registers (16 scalar stores read back as one vector stall) */
        uint8_t b __attribute__((vector_size(16)));
        memcpy(&b, y, sizeof b);
        return __builtin_convertvector(b, ts_li16);
    }
    int32_t b[TS_LANES];
    for (int j = 0; j < TS_LANES; j++) b[j] = j < nv ? (int32_t)y[j] : -1;
    ts_li16 t;
    memcpy(&t, b, sizeof t);
    return t;
}

static inline ts_lv16 ts_nn_ld16(const float *p)
{
    ts_lv16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void ts_nn_st16(float *p, ts_lv16 v) { memcpy(p, &v, sizeof v); }

/* A block of 16 voxels of 2 or 4 classes between channels-last (voxel j's
 * classes at j K) and lane-major (class k's 16 voxels in one vector) by
 * shuffles in registers: the scalar way, 16 stores read back as one
 * vector, stalls on store forwarding. The values move unchanged. */
#define TS_NN_SH(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
static inline void ts_nn_aos_to_lanes(const float *l, int K, ts_lv16 *x)
{
    if (K == 2) {
        const ts_lv16 v0 = ts_nn_ld16(l), v1 = ts_nn_ld16(l + 16);
        x[0] = TS_NN_SH(v0, v1, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        x[1] = TS_NN_SH(v0, v1, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        return;
    }
    const ts_lv16 v0 = ts_nn_ld16(l), v1 = ts_nn_ld16(l + 16), v2 = ts_nn_ld16(l + 32), v3 = ts_nn_ld16(l + 48);
#define TS_NN_K4(k)                                                                                                     \
    do {                                                                                                                \
        const ts_lv16 a = TS_NN_SH(v0, v1, k, k + 4, k + 8, k + 12, k + 16, k + 20, k + 24, k + 28, 0, 0, 0, 0, 0, 0, 0, 0); \
        const ts_lv16 b = TS_NN_SH(v2, v3, k, k + 4, k + 8, k + 12, k + 16, k + 20, k + 24, k + 28, 0, 0, 0, 0, 0, 0, 0, 0); \
        x[k] = TS_NN_SH(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);                                  \
    } while (0)
    TS_NN_K4(0);
    TS_NN_K4(1);
    TS_NN_K4(2);
    TS_NN_K4(3);
#undef TS_NN_K4
}

/* d[j K + k] += g[k][j] for a whole block of 2 or 4 classes */
static inline void ts_nn_lanes_add_aos(float *d, int K, const ts_lv16 *g)
{
    if (K == 2) {
        ts_nn_st16(d, ts_nn_ld16(d) + TS_NN_SH(g[0], g[1], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23));
        ts_nn_st16(d + 16, ts_nn_ld16(d + 16) + TS_NN_SH(g[0], g[1], 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31));
        return;
    }
    const ts_lv16 p0 = TS_NN_SH(g[0], g[1], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
                  q0 = TS_NN_SH(g[2], g[3], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
                  p1 = TS_NN_SH(g[0], g[1], 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
                  q1 = TS_NN_SH(g[2], g[3], 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    ts_nn_st16(d, ts_nn_ld16(d) + TS_NN_SH(p0, q0, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23));
    ts_nn_st16(d + 16, ts_nn_ld16(d + 16) + TS_NN_SH(p0, q0, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31));
    ts_nn_st16(d + 32, ts_nn_ld16(d + 32) + TS_NN_SH(p1, q1, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23));
    ts_nn_st16(d + 48, ts_nn_ld16(d + 48) + TS_NN_SH(p1, q1, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31));
}
#undef TS_NN_SH

/* d[j K + k] += g[k * 16 + j] for j < nv, k < K: lane-major sums back to
 * channels-last voxels */
static inline void ts_nn_add_lanes(float *d, int K, int nv, const float *g)
{
    if (nv == TS_LANES && (K == 2 || K == 4)) {
        ts_lv16 v[4];
        for (int k = 0; k < K; k++) v[k] = ts_nn_ld16(g + k * TS_LANES);
        ts_nn_lanes_add_aos(d, K, v);
        return;
    }
    for (int j = 0; j < nv; j++)
        for (int k = 0; k < K; k++) d[(int64_t)j * K + k] += g[k * TS_LANES + j];
}

/* log(x) for x >= 1 (a softmax's sum of exponentials): Cephes' logf (the
 * mantissa in [sqrt(1/2), sqrt(2)), degree-8 polynomial, the exponent's
 * ln 2 in two parts), about 1 ulp from glibc's logf; NaN and +inf stay. */
static inline ts_lv16 ts_nn_vlog_ge1(ts_lv16 x)
{
    const ts_li16 bits = (ts_li16)x;
    ts_lv16 e = __builtin_convertvector(((bits >> 23) & 0xff) - 126, ts_lv16);
    ts_lv16 m = (ts_lv16)((bits & 0x007fffff) | 0x3f000000); /* [0.5, 1) */
    const ts_li16 lo = m < 0.707106781186547524f;
    e = ts_nn_vsel(lo, e - 1.0f, e);
    m = ts_nn_vsel(lo, m + m - 1.0f, m - 1.0f);
    const ts_lv16 z = m * m;
    ts_lv16 y = m * 7.0376836292e-2f - 1.1514610310e-1f;
    y = y * m + 1.1676998740e-1f;
    y = y * m - 1.2420140846e-1f;
    y = y * m + 1.4249322787e-1f;
    y = y * m - 1.6668057665e-1f;
    y = y * m + 2.0000714765e-1f;
    y = y * m - 2.4999993993e-1f;
    y = y * m + 3.3333331174e-1f;
    y = y * m * z;
    y += e * -2.12194440e-4f;
    y += z * -0.5f;
    ts_lv16 r = m + y;
    r += e * 0.693359375f;
    const ts_li16 special = ~(x < __builtin_inff()); /* NaN or +inf: itself */
    return ts_nn_vsel(special, x, r);
}

/* The softmax over K classes of nv (1..16) voxels whose logits are l (voxel
 * j's classes at l + j K): p[k * 16 + j] = softmax(l_j)[k] and lse[j] =
 * log-sum-exp(l_j), for j < nv (lse may be NULL: not wanted). p holds
 * K * 16 floats. */
static inline void ts_nn_softmax16(const float *l, int K, int nv, float *p, float *lse)
{
    ts_lv16 m = {0}, s = {0};
    if (nv == TS_LANES && (K == 2 || K == 4)) {
        ts_lv16 x[4];
        ts_nn_aos_to_lanes(l, K, x);
        for (int k = 0; k < K; k++) {
            ts_nn_st16(p + k * TS_LANES, x[k]);
            m = k == 0 ? x[k] : ts_nn_vsel(x[k] > m, x[k], m);
        }
    } else {
        for (int k = 0; k < K; k++) {
            float b[TS_LANES] = {0};
            for (int j = 0; j < nv; j++) b[j] = l[(int64_t)j * K + k];
            ts_lv16 x;
            memcpy(&x, b, sizeof x);
            memcpy(p + k * TS_LANES, &x, sizeof x);
            m = k == 0 ? x : ts_nn_vsel(x > m, x, m);
        }
    }
    for (int k = 0; k < K; k++) {
        ts_lv16 x;
        memcpy(&x, p + k * TS_LANES, sizeof x);
        x = ts_nn_vexp_neg(x - m);
        s += x;
        memcpy(p + k * TS_LANES, &x, sizeof x);
    }
    const ts_lv16 r = 1.0f / s;
    for (int k = 0; k < K; k++) {
        ts_lv16 x;
        memcpy(&x, p + k * TS_LANES, sizeof x);
        x *= r;
        memcpy(p + k * TS_LANES, &x, sizeof x);
    }
    if (lse) {
        const ts_lv16 v = m + ts_nn_vlog_ge1(s);
        for (int j = 0; j < nv; j++) lse[j] = v[j];
    }
}

static inline int ts_nn_ignored(int label, int ignore_index) { return label == ignore_index; }

#pragma GCC diagnostic pop

#endif
