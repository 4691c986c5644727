/* The bias gradient of the convolutions: db[oc] += the sum of the output
 * gradient's channel oc, in a pass of its own (ts_nn_bias_grad) or from the
 * weight-gradient driver's items as it stages them (ts_nn_item_bias,
 * conv_kernels.c's wgrad_impl); each in a fixed order, so that the results
 * do not depend on the thread count. */
#pragma GCC optimize("O3")
#include "tsbuild.h"
#include "src/nn/conv_impl.h"
#include "src/core/error.h"

#include <stdlib.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));

#define AI static inline __attribute__((always_inline))
#pragma GCC diagnostic ignored "-Wpsabi" /* always inlined: no call whose ABI could differ */
static inline int imin(int a, int b) { return a < b ? a : b; }

/* W channels a vector (16 where OC is a multiple of 16, 8 where it is a
 * multiple of 8 only): bias_runW sets acc[0 .. W NV) to the sums over
 * voxels b0 .. b1 of gy's channels c0 .. c0 + W NV, each channel in voxel
 * order (as the scalar loop, so the same bits); bias_sumsW does every
 * channel, up to 4 W at a time, then ps[c] += acc[c] */
#define BIAS_WIDTH(W, VT, VTU)                                                                                          \
    AI void bias_run##W(const float *gy, size_t b0, size_t b1, int OC, int c0, const int NV, float *acc)               \
    {                                                                                                                   \
        VT a[4];                                                                                                        \
        for (int j = 0; j < NV; j++) a[j] = (VT){0};                                                                    \
        for (size_t v = b0; v < b1; v++)                                                                                \
            for (int j = 0; j < NV; j++) a[j] += *(const VTU *)(gy + v * OC + c0 + W * j);                             \
        for (int j = 0; j < NV; j++) *(VTU *)(acc + W * j) = a[j];                                                     \
    }                                                                                                                   \
    static void bias_sums##W(const float *gy, size_t b0, size_t b1, int OC, float *acc, double *ps)                    \
    {                                                                                                                   \
        for (int c0 = 0; c0 < OC; c0 += 4 * W) {                                                                        \
            const int left = (OC - c0) / W;                                                                             \
            if (left >= 4) bias_run##W(gy, b0, b1, OC, c0, 4, acc);                                                     \
            else if (left == 3) bias_run##W(gy, b0, b1, OC, c0, 3, acc);                                                \
            else if (left == 2) bias_run##W(gy, b0, b1, OC, c0, 2, acc);                                                \
            else bias_run##W(gy, b0, b1, OC, c0, 1, acc);                                                               \
            for (int c = 0; c < W * imin(left, 4); c++) ps[c0 + c] += acc[c];                                           \
        }                                                                                                               \
    }
BIAS_WIDTH(16, v16, v16u)
BIAS_WIDTH(8, v8, v8u)
#undef BIAS_WIDTH

/* ps[0 .. OC) += the sums over the nv voxels at gr, per block of 256 channels (16 a vector where OC is a
 * multiple of 16) each channel in voxel order in float, then added to ps in double (wgrad_impl's
 * bias gradient: one item) */
void ts_nn_item_bias(const float *gr, size_t nv, int OC, float *acc, double *ps)
{
    if (OC % 8 == 0) {
        if (OC % 16 == 0) bias_sums16(gr, 0, nv, OC, acc, ps);
        else bias_sums8(gr, 0, nv, OC, acc, ps);
        return;
    }
    for (int c0 = 0; c0 < OC; c0 += 256) {
        const int nc = imin(256, OC - c0);
        for (int c = 0; c < nc; c++) acc[c] = 0;
        for (size_t v = 0; v < nv; v++)
            for (int c = 0; c < nc; c++) acc[c] += gr[v * OC + c0 + c];
        for (int c = 0; c < nc; c++) ps[c0 + c] += acc[c];
    }
}

int ts_nn_bias_grad(const float *gy, size_t voxels, int OC, float *db)
{
    enum { CHUNKS = 64, BLK = 256 };
    double *part = TS_CALLOC((size_t)CHUNKS * OC, sizeof(double));
    if (!part) return TS_ERR_NOMEM;
#pragma omp parallel
    {
        float acc[256];
        const int cb = OC < 256 ? OC : 256;
#pragma omp for schedule(dynamic, 1)
        for (int ch = 0; ch < CHUNKS; ch++) {
            double *ps = part + (size_t)ch * OC;
            const size_t e = voxels * (size_t)(ch + 1) / CHUNKS;
            for (size_t b0 = voxels * (size_t)ch / CHUNKS; b0 < e; b0 += BLK) {
                const size_t b1 = b0 + BLK < e ? b0 + BLK : e;
                if (OC % 8 == 0) { /* 16 or 8 channels a vector, up to 4 vectors in registers: the same sums */
                    if (OC % 16 == 0) bias_sums16(gy, b0, b1, OC, acc, ps);
                    else bias_sums8(gy, b0, b1, OC, acc, ps);
                    continue;
                }
                for (int c0 = 0; c0 < OC; c0 += cb) {
                    const int nc = imin(cb, OC - c0);
                    for (int c = 0; c < nc; c++) acc[c] = 0;
                    for (size_t v = b0; v < b1; v++)
                        for (int c = 0; c < nc; c++) acc[c] += gy[v * OC + c0 + c];
                    for (int c = 0; c < nc; c++) ps[c0 + c] += acc[c];
                }
            }
        }
    }
    for (int c = 0; c < OC; c++) {
        double s = 0;
        for (int t = 0; t < CHUNKS; t++) s += part[(size_t)t * OC + c];
        db[c] += (float)s;
    }
    free(part);
    return 0;
}
