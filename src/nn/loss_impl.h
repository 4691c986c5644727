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
    int32_t b[TS_LANES];
    for (int j = 0; j < TS_LANES; j++) b[j] = j < nv ? (int32_t)y[j] : -1;
    ts_li16 t;
    memcpy(&t, b, sizeof t);
    return t;
}

/* d[j K + k] += g[k * 16 + j] for j < nv, k < K: lane-major sums back to
 * channels-last voxels */
static inline void ts_nn_add_lanes(float *d, int K, int nv, const float *g)
{
    for (int j = 0; j < nv; j++)
        for (int k = 0; k < K; k++) d[(int64_t)j * K + k] += g[k * TS_LANES + j];
}

/* The softmax over K classes of nv (1..16) voxels whose logits are l (voxel
 * j's classes at l + j K): p[k * 16 + j] = softmax(l_j)[k] and lse[j] =
 * log-sum-exp(l_j), for j < nv (lse may be NULL: not wanted). p holds
 * K * 16 floats. */
static inline void ts_nn_softmax16(const float *l, int K, int nv, float *p, float *lse)
{
    ts_lv16 m = {0}, s = {0};
    for (int k = 0; k < K; k++) {
        float b[TS_LANES] = {0};
        for (int j = 0; j < nv; j++) b[j] = l[(int64_t)j * K + k];
        ts_lv16 x;
        memcpy(&x, b, sizeof x);
        memcpy(p + k * TS_LANES, &x, sizeof x);
        m = k == 0 ? x : ts_nn_vsel(x > m, x, m);
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
    if (lse)
        for (int j = 0; j < nv; j++) lse[j] = m[j] + logf(s[j]);
}

static inline int ts_nn_ignored(int label, int ignore_index) { return label == ignore_index; }

#pragma GCC diagnostic pop

#endif
