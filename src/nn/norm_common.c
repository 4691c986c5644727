/* Channel sums and per-channel affine maps for batch, group and instance
 * norm (see norm_impl.h). Loops take blocks of voxels dynamically. */
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

/* Items are (sample, group of SUPER blocks); each item's sums go to its own
 * slot and the slots are added in order, so results do not depend on the
 * schedule or the thread count. */
#define SUPER 16
int ts_nn_channel_sums(const float *x, const float *dy, const float *center, int N, size_t S, int C, double *s1,
                       double *s2)
{
#ifdef _OPENMP
    const int nt = omp_get_max_threads();
#else
    const int nt = 1;
#endif
    const size_t nblk = (S + BLOCK - 1) / BLOCK, nsup = (nblk + SUPER - 1) / SUPER, items = (size_t)N * nsup;
    double *part = TS_CALLOC(items * 2 * C, sizeof(double));
    float *facc = TS_ALIGNED_ALLOC((size_t)nt * 2 * C * sizeof(float));
    if (!part || !facc) {
        free(part);
        free(facc);
        return TS_ERR_NOMEM;
    }
#pragma omp parallel
    {
#ifdef _OPENMP
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        float *a1 = facc + (size_t)tid * 2 * C, *a2 = a1 + C;
#pragma omp for schedule(dynamic, 1)
        for (size_t it = 0; it < items; it++) {
            const int n = (int)(it / nsup);
            double *p1 = part + it * 2 * C, *p2 = p1 + C;
            const float *ce = center ? center + (size_t)n * C : NULL;
            for (size_t blk = it % nsup * SUPER; blk < nblk && blk < (it % nsup + 1) * SUPER; blk++) {
                const size_t v0 = blk * BLOCK, v1 = v0 + BLOCK < S ? v0 + BLOCK : S;
                const float *xb = x + ((size_t)n * S + v0) * C;
                const float *gb = dy ? dy + ((size_t)n * S + v0) * C : NULL;
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
                    p1[c] += a1[c];
                    p2[c] += a2[c];
                }
            }
        }
    }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double t1 = 0, t2 = 0;
            for (size_t i = 0; i < nsup; i++) {
                t1 += part[((size_t)n * nsup + i) * 2 * C + c];
                t2 += part[((size_t)n * nsup + i) * 2 * C + C + c];
            }
            if (s1) s1[(size_t)n * C + c] = t1;
            if (s2) s2[(size_t)n * C + c] = t2;
        }
    free(part);
    free(facc);
    return 0;
}

void ts_nn_channel_affine(const float *x, const float *scale, const float *shift, int N, size_t S, int C, float *y)
{
    const size_t nblk = (S + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(dynamic, 8)
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
#pragma omp parallel for schedule(dynamic, 8)
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
