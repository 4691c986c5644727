/* Channel moments, gradient sums, affine maps and input gradients for batch,
 * group and instance norm (see norm_impl.h). Loops take blocks of voxels
 * dynamically; each (sample, group of SUPER blocks) item sums into its own
 * slot and the slots are added in order. */
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
#define SUPER 16

static int nthreads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int tid(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* mode 0: moments of x around K; mode 1: gradient sums */
static int sums(int mode, const float *x, const float *dy, const float *mask, const float *ctr, int N, size_t S, int C,
                double *s1, double *s2)
{
    const size_t nblk = (S + BLOCK - 1) / BLOCK, nsup = (nblk + SUPER - 1) / SUPER, items = (size_t)N * nsup;
    double *part = TS_CALLOC(items * 2 * C, sizeof(double));
    float *facc = TS_ALIGNED_ALLOC((size_t)nthreads() * 2 * C * sizeof(float));
    if (!part || !facc) {
        free(part);
        free(facc);
        return TS_ERR_NOMEM;
    }
#pragma omp parallel
    {
        float *a1 = facc + (size_t)tid() * 2 * C, *a2 = a1 + C;
#pragma omp for schedule(dynamic, 1)
        for (size_t it = 0; it < items; it++) {
            const int n = (int)(it / nsup);
            double *p1 = part + it * 2 * C, *p2 = p1 + C;
            const float *ce = ctr + (size_t)n * C;
            for (size_t blk = it % nsup * SUPER; blk < nblk && blk < (it % nsup + 1) * SUPER; blk++) {
                const size_t v0 = blk * BLOCK, nv = (v0 + BLOCK < S ? v0 + BLOCK : S) - v0, o = ((size_t)n * S + v0) * C;
                const float *xb = x + o;
                memset(a1, 0, (size_t)C * sizeof(float));
                memset(a2, 0, (size_t)C * sizeof(float));
                if (mode == 0) {
                    for (size_t v = 0; v < nv; v++)
                        for (int c = 0; c < C; c++) {
                            const float d = xb[v * C + c] - ce[c];
                            a1[c] += d;
                            a2[c] += d * d;
                        }
                } else if (!mask) {
                    const float *gb = dy + o;
                    for (size_t v = 0; v < nv; v++)
                        for (int c = 0; c < C; c++) {
                            const float g = gb[v * C + c];
                            a1[c] += g;
                            a2[c] += g * (xb[v * C + c] - ce[c]);
                        }
                } else {
                    const float *gb = dy + o, *mb = mask + o;
                    for (size_t v = 0; v < nv; v++)
                        for (int c = 0; c < C; c++) {
                            const float g = mb[v * C + c] > 0.0f ? gb[v * C + c] : 0.0f;
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
            s1[(size_t)n * C + c] = t1;
            s2[(size_t)n * C + c] = t2;
        }
    free(part);
    free(facc);
    return 0;
}

int ts_nn_channel_moments(const float *x, const float *K, int N, size_t S, int C, double *s1, double *s2)
{
    return sums(0, x, NULL, NULL, K, N, S, C, s1, s2);
}

int ts_nn_channel_grad_sums(const float *x, const float *dy, const float *mask, const float *center, int N, size_t S,
                            int C, double *s1, double *s2)
{
    return sums(1, x, dy, mask, center, N, S, C, s1, s2);
}

void ts_nn_channel_affine(const float *x, const float *scale, const float *shift, int N, size_t S, int C, int relu,
                          float *y)
{
    const size_t nblk = (S + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(dynamic, 8)
    for (size_t it = 0; it < (size_t)N * nblk; it++) {
        const int n = (int)(it / nblk);
        const size_t v0 = it % nblk * BLOCK, nv = (v0 + BLOCK < S ? v0 + BLOCK : S) - v0;
        const float *sc = scale + (size_t)n * C, *sh = shift + (size_t)n * C;
        const float *xb = x + ((size_t)n * S + v0) * C;
        float *yb = y + ((size_t)n * S + v0) * C;
        if (relu) {
            for (size_t v = 0; v < nv; v++)
                for (int c = 0; c < C; c++) {
                    const float t = xb[v * C + c] * sc[c] + sh[c];
                    yb[v * C + c] = t > 0.0f ? t : 0.0f;
                }
        } else {
            for (size_t v = 0; v < nv; v++)
                for (int c = 0; c < C; c++) yb[v * C + c] = xb[v * C + c] * sc[c] + sh[c];
        }
    }
}

void ts_nn_norm_dx(const float *x, const float *dy, const float *mask, const float *center, const float *a,
                   const float *b, const float *k, int N, size_t S, int C, float *dx)
{
    const size_t nblk = (S + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(dynamic, 8)
    for (size_t it = 0; it < (size_t)N * nblk; it++) {
        const int n = (int)(it / nblk);
        const size_t v0 = it % nblk * BLOCK, nv = (v0 + BLOCK < S ? v0 + BLOCK : S) - v0;
        const size_t o = (size_t)n * C, e = ((size_t)n * S + v0) * C;
        const float *xb = x + e, *gb = dy + e;
        float *db = dx + e;
        if (mask) {
            const float *mb = mask + e;
            for (size_t v = 0; v < nv; v++)
                for (int c = 0; c < C; c++) {
                    const float g = mb[v * C + c] > 0.0f ? gb[v * C + c] : 0.0f;
                    db[v * C + c] = g * a[o + c] + (xb[v * C + c] - center[o + c]) * b[o + c] + k[o + c];
                }
        } else {
            for (size_t v = 0; v < nv; v++)
                for (int c = 0; c < C; c++)
                    db[v * C + c] = gb[v * C + c] * a[o + c] + (xb[v * C + c] - center[o + c]) * b[o + c] + k[o + c];
        }
    }
}
