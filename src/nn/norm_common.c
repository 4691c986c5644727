/* Channel sums and per-channel affine maps for batch, group and instance
 * norm (see norm_impl.h). */
#pragma GCC optimize("O3")
#include "tsbuild.h"
#include "src/nn/norm_impl.h"
#include "src/core/error.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define BLOCK 256

int ts_nn_channel_sums(const float *x, const float *dy, const float *center, int N, size_t S, int C, double *s1,
                       double *s2)
{
#ifdef _OPENMP
    const int nt = omp_get_max_threads();
#else
    const int nt = 1;
#endif
    const size_t nc = (size_t)N * C;
    double *part = TS_CALLOC((size_t)nt * 2 * nc, sizeof(double));
    float *facc = TS_ALIGNED_ALLOC((size_t)nt * 2 * C * sizeof(float));
    if (!part || !facc) {
        free(part);
        free(facc);
        return TS_ERR_NOMEM;
    }
    const size_t nblk = (S + BLOCK - 1) / BLOCK;
#pragma omp parallel
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        double *p1 = part + (size_t)tid * 2 * nc, *p2 = p1 + nc;
        float *a1 = facc + (size_t)tid * 2 * C, *a2 = a1 + C;
#pragma omp for schedule(static)
        for (size_t it = 0; it < (size_t)N * nblk; it++) {
            const int n = (int)(it / nblk);
            const size_t v0 = it % nblk * BLOCK, v1 = v0 + BLOCK < S ? v0 + BLOCK : S;
            const float *xb = x + ((size_t)n * S + v0) * C;
            const float *gb = dy ? dy + ((size_t)n * S + v0) * C : NULL;
            const float *ce = center ? center + (size_t)n * C : NULL;
            memset(a1, 0, (size_t)C * sizeof(float));
            memset(a2, 0, (size_t)C * sizeof(float));
            if (!gb && !ce) {
                for (size_t v = 0; v < v1 - v0; v++)
                    for (int c = 0; c < C; c++) a1[c] += xb[v * C + c];
            } else if (!gb) {
                for (size_t v = 0; v < v1 - v0; v++)
                    for (int c = 0; c < C; c++) {
                        const float d = xb[v * C + c] - ce[c];
                        a2[c] += d * d;
                    }
            } else {
                for (size_t v = 0; v < v1 - v0; v++)
                    for (int c = 0; c < C; c++) {
                        const float g = gb[v * C + c];
                        a1[c] += g;
                        a2[c] += g * (xb[v * C + c] - ce[c]);
                    }
            }
            for (int c = 0; c < C; c++) {
                p1[(size_t)n * C + c] += a1[c];
                p2[(size_t)n * C + c] += a2[c];
            }
        }
    }
    for (size_t i = 0; i < nc; i++) {
        double t1 = 0, t2 = 0;
        for (int t = 0; t < nt; t++) {
            t1 += part[(size_t)t * 2 * nc + i];
            t2 += part[(size_t)t * 2 * nc + nc + i];
        }
        if (s1) s1[i] = t1;
        if (s2) s2[i] = t2;
    }
    free(part);
    free(facc);
    return 0;
}

void ts_nn_channel_affine(const float *x, const float *scale, const float *shift, int N, size_t S, int C, float *y)
{
    const size_t nblk = (S + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static)
    for (size_t it = 0; it < (size_t)N * nblk; it++) {
        const int n = (int)(it / nblk);
        const size_t v0 = it % nblk * BLOCK, v1 = v0 + BLOCK < S ? v0 + BLOCK : S;
        const float *sc = scale + (size_t)n * C, *sh = shift + (size_t)n * C;
        const float *xb = x + ((size_t)n * S + v0) * C;
        float *yb = y + ((size_t)n * S + v0) * C;
        for (size_t v = 0; v < v1 - v0; v++)
            for (int c = 0; c < C; c++) yb[v * C + c] = xb[v * C + c] * sc[c] + sh[c];
    }
}

void ts_nn_norm_dx(const float *x, const float *dy, const float *center, const float *a, const float *b,
                   const float *k, int N, size_t S, int C, float *dx)
{
    const size_t nblk = (S + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static)
    for (size_t it = 0; it < (size_t)N * nblk; it++) {
        const int n = (int)(it / nblk);
        const size_t v0 = it % nblk * BLOCK, v1 = v0 + BLOCK < S ? v0 + BLOCK : S;
        const size_t o = (size_t)n * C;
        const float *xb = x + ((size_t)n * S + v0) * C, *gb = dy + ((size_t)n * S + v0) * C;
        float *db = dx + ((size_t)n * S + v0) * C;
        for (size_t v = 0; v < v1 - v0; v++)
            for (int c = 0; c < C; c++)
                db[v * C + c] = gb[v * C + c] * a[o + c] + (xb[v * C + c] - center[o + c]) * b[o + c] + k[o + c];
    }
}
