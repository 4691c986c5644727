/* Channel moments, gradient sums, affine maps and input gradients for batch,
 * group and instance norm (see norm_impl.h). Loops take blocks of voxels
 * dynamically; each (sample, group of SUPER blocks) item sums into its own
 * slot and the slots are added in order. */
#pragma GCC optimize("O3")
#include "tsbuild.h"
#include "src/nn/norm_impl.h"
#include "src/core/error.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __FMA__
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#define BLOCK 256
#define SUPER 16

#pragma GCC diagnostic ignored "-Wpsabi" /* the vector helpers are always inlined: no call whose ABI could differ */
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int v16i __attribute__((vector_size(64)));
/* 8 channels a vector where C is a multiple of 8 but not of 16 (the demo's 8-channel level) */
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
typedef int v8i __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) v16 ld16(const float *p) { return *(const v16u *)p; }
static inline __attribute__((always_inline)) void st16(float *p, v16 v) { *(v16u *)p = v; }
/* g where m > 0, else +0 (slope 0) or slope g (leaky): norm_impl.h's select */
static inline __attribute__((always_inline)) v16 masked(v16 g, v16 m, float slope) { return ts_nn_relu_sel(m, g, slope); }
static inline float masked1(float g, float m, float slope) { return ts_nn_relu_sel1(m, g, slope); }
static inline __attribute__((always_inline)) v8 ld8(const float *p) { return *(const v8u *)p; }
/* c + a b rounded once where the build has FMA, as the scalar loops' contracted `s += a * b`: GCC's
 * tuning for AMD cores leaves some 8-lane accumulation chains unfused, which changed the bits.
 * Macros, as MASKED8 and ST8 */
#ifdef __FMA__
#define FMA8(a, b, c) ((v8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#else
#define FMA8(a, b, c) ((a) * (b) + (c))
#endif
#define ST8(p, v) (*(v8u *)(p) = (v))
/* ts_nn_relu_sel on 8 lanes: g where m > 0, else +0 (slope 0) or slope g (a macro: a function taking
 * 32-byte vectors draws GCC's ABI note in builds without AVX) */
#define MASKED8(g, m, slope)                                                                                            \
    ((slope) == 0.0f ? (v8)((v8i)(g) & (v8i)((m) > 0.0f))                                                              \
                     : (v8)(((v8i)(g) & (v8i)((m) > 0.0f)) | ((v8i)((slope) * (g)) & ~(v8i)((m) > 0.0f))))

/* One block of sums() where C is a multiple of W (16, or 8 where C is not a
 * multiple of 16): channels c0 .. c0 + W NV held in registers over the
 * block's voxels, each channel summed in voxel order with the scalar loop's
 * expressions (the same bits; FMA: the multiply-add, see FMA8); sums_blockW
 * runs every channel, up to 4 W at a time. */
#define FMA16(a, b, c) ((c) + (a) * (b))
#define LD16(p) ld16(p)
#define ST16(p, v) st16(p, v)
#define MASKED16(g, m, slope) masked(g, m, slope)
#define LD8(p) ld8(p)
#define SUMS_WIDTH(W, VT)                                                                                               \
    static inline __attribute__((always_inline)) void sums_run##W(int mode, const float *xb, const float *gb,          \
                                                                  const float *msc, const float *msh, float slope,    \
                                                                  const float *ce, size_t nv, int C, int c0,          \
                                                                  const int NV, float *a1, float *a2)                 \
    {                                                                                                                   \
        VT s1[4], s2[4], k[4], ma[4], mb[4];                                                                            \
        for (int j = 0; j < NV; j++) {                                                                                  \
            s1[j] = s2[j] = ma[j] = mb[j] = (VT){0}, k[j] = LD##W(ce + c0 + W * j);                                     \
            if (msc) ma[j] = LD##W(msc + c0 + W * j), mb[j] = LD##W(msh + c0 + W * j);                                  \
        }                                                                                                               \
        for (size_t v = 0; v < nv; v++) {                                                                               \
            const size_t e = v * C + c0;                                                                                \
            for (int j = 0; j < NV; j++) {                                                                              \
                const VT xv = LD##W(xb + e + W * j), d = xv - k[j];                                                     \
                if (mode == 0) {                                                                                        \
                    s1[j] += d;                                                                                         \
                    s2[j] = FMA##W(d, d, s2[j]);                                                                        \
                } else {                                                                                                \
                    const VT g = msc ? MASKED##W(LD##W(gb + e + W * j), xv * ma[j] + mb[j], slope) : LD##W(gb + e + W * j); \
                    s1[j] += g;                                                                                         \
                    s2[j] = FMA##W(g, d, s2[j]);                                                                        \
                }                                                                                                       \
            }                                                                                                           \
        }                                                                                                               \
        for (int j = 0; j < NV; j++) ST##W(a1 + c0 + W * j, s1[j]), ST##W(a2 + c0 + W * j, s2[j]);                     \
    }                                                                                                                   \
    static void sums_block##W(int mode, const float *xb, const float *gb, const float *msc, const float *msh,          \
                              float slope, const float *ce, size_t nv, int C, float *a1, float *a2)                    \
    {                                                                                                                   \
        for (int c0 = 0; c0 < C; c0 += 4 * W) {                                                                         \
            const int left = (C - c0) / W;                                                                              \
            if (left >= 4) sums_run##W(mode, xb, gb, msc, msh, slope, ce, nv, C, c0, 4, a1, a2);                       \
            else if (left == 3) sums_run##W(mode, xb, gb, msc, msh, slope, ce, nv, C, c0, 3, a1, a2);                  \
            else if (left == 2) sums_run##W(mode, xb, gb, msc, msh, slope, ce, nv, C, c0, 2, a1, a2);                  \
            else sums_run##W(mode, xb, gb, msc, msh, slope, ce, nv, C, c0, 1, a1, a2);                                 \
        }                                                                                                               \
    }
SUMS_WIDTH(16, v16)
SUMS_WIDTH(8, v8)
#undef SUMS_WIDTH

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
static int sums(int mode, const float *x, const float *dy, const float *msc, const float *msh, float slope,
                const float *ctr, int N, size_t S, int C, double *s1, double *s2)
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
            const float *sc = msc ? msc + (size_t)n * C : NULL, *sh = msc ? msh + (size_t)n * C : NULL;
            for (size_t blk = it % nsup * SUPER; blk < nblk && blk < (it % nsup + 1) * SUPER; blk++) {
                const size_t v0 = blk * BLOCK, nv = (v0 + BLOCK < S ? v0 + BLOCK : S) - v0, o = ((size_t)n * S + v0) * C;
                const float *xb = x + o;
                if (C % 8 == 0) {
                    if (C % 16 == 0) sums_block16(mode, xb, dy ? dy + o : NULL, sc, sh, slope, ce, nv, C, a1, a2);
                    else sums_block8(mode, xb, dy ? dy + o : NULL, sc, sh, slope, ce, nv, C, a1, a2);
                    for (int c = 0; c < C; c++) {
                        p1[c] += a1[c];
                        p2[c] += a2[c];
                    }
                    continue;
                }
                memset(a1, 0, (size_t)C * sizeof(float));
                memset(a2, 0, (size_t)C * sizeof(float));
                if (mode == 0) {
                    for (size_t v = 0; v < nv; v++)
                        for (int c = 0; c < C; c++) {
                            const float d = xb[v * C + c] - ce[c];
                            a1[c] += d;
                            a2[c] += d * d;
                        }
                } else if (!sc) {
                    const float *gb = dy + o;
                    for (size_t v = 0; v < nv; v++)
                        for (int c = 0; c < C; c++) {
                            const float g = gb[v * C + c];
                            a1[c] += g;
                            a2[c] += g * (xb[v * C + c] - ce[c]);
                        }
                } else {
                    const float *gb = dy + o;
                    for (size_t v = 0; v < nv; v++)
                        for (int c = 0; c < C; c++) {
                            const float g = masked1(gb[v * C + c], ts_nn_pre1(xb[v * C + c], sc[c], sh[c]), slope);
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
    return sums(0, x, NULL, NULL, NULL, 0.0f, K, N, S, C, s1, s2);
}

int ts_nn_channel_grad_sums(const float *x, const float *dy, const float *msc, const float *msh, float slope,
                            const float *center, int N, size_t S, int C, double *s1, double *s2)
{
    return sums(1, x, dy, msc, msh, slope, center, N, S, C, s1, s2);
}

void ts_nn_channel_affine(const float *x, const float *scale, const float *shift, int N, size_t S, int C, int relu,
                          float slope, float *y)
{
    const size_t nblk = (S + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(dynamic, 8)
    for (size_t it = 0; it < (size_t)N * nblk; it++) {
        const int n = (int)(it / nblk);
        const size_t v0 = it % nblk * BLOCK, nv = (v0 + BLOCK < S ? v0 + BLOCK : S) - v0;
        ts_nn_affine_run(x + ((size_t)n * S + v0) * C, scale + (size_t)n * C, shift + (size_t)n * C, nv, C, relu,
                         slope, y + ((size_t)n * S + v0) * C);
    }
}

void ts_nn_norm_dx(const float *x, const float *dy, const float *msc, const float *msh, float slope, const float *center,
                   const float *a, const float *b, const float *k, int N, size_t S, int C, float *dx)
{
    const size_t nblk = (S + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(dynamic, 8)
    for (size_t it = 0; it < (size_t)N * nblk; it++) {
        const int n = (int)(it / nblk);
        const size_t v0 = it % nblk * BLOCK, nv = (v0 + BLOCK < S ? v0 + BLOCK : S) - v0;
        const size_t o = (size_t)n * C, e = ((size_t)n * S + v0) * C;
        const float *xb = x + e, *gb = dy + e;
        const float *sc = msc ? msc + o : NULL, *sh = msc ? msh + o : NULL;
        float *db = dx + e;
        if (C % 16 == 0) { /* 16 channels a vector, the scalar expression (the same bits) */
            for (size_t v = 0; v < nv; v++)
                for (int c = 0; c < C; c += 16) {
                    const size_t i = v * C + c;
                    const v16 xv = ld16(xb + i);
                    const v16 g = sc ? masked(ld16(gb + i), ts_nn_pre16(xv, ld16(sc + c), ld16(sh + c)), slope) : ld16(gb + i);
                    st16(db + i, g * ld16(a + o + c) + (xv - ld16(center + o + c)) * ld16(b + o + c) + ld16(k + o + c));
                }
            continue;
        }
        if (C % 8 == 0) { /* 8 channels a vector, the same expression */
            for (size_t v = 0; v < nv; v++)
                for (int c = 0; c < C; c += 8) {
                    const size_t i = v * C + c;
                    const v8 xv = ld8(xb + i);
                    const v8 g = sc ? MASKED8(ld8(gb + i), xv * ld8(sc + c) + ld8(sh + c), slope) : ld8(gb + i);
                    ST8(db + i, g * ld8(a + o + c) + (xv - ld8(center + o + c)) * ld8(b + o + c) + ld8(k + o + c));
                }
            continue;
        }
        if (sc) {
            for (size_t v = 0; v < nv; v++)
                for (int c = 0; c < C; c++) {
                    const float xv = xb[v * C + c];
                    const float g = masked1(gb[v * C + c], ts_nn_pre1(xv, sc[c], sh[c]), slope);
                    db[v * C + c] = g * a[o + c] + (xv - center[o + c]) * b[o + c] + k[o + c];
                }
        } else {
            for (size_t v = 0; v < nv; v++)
                for (int c = 0; c < C; c++)
                    db[v * C + c] = gb[v * C + c] * a[o + c] + (xb[v * C + c] - center[o + c]) * b[o + c] + k[o + c];
        }
    }
}

/* ---- statistics independent of the layout (norm_impl.h) ---- */

#define EXACT_BITS 26 /* |q| <= 2^26: q^2 <= 2^52, BLOCK of them fit an int64 */

typedef __int128 i128;

/* p[c0 .. c0 + 16 NV) = max over the block's voxels of |x| (+inf where not finite), channels in registers
 * (norm_impl.h's ts_nn_absinf16 / ts_nn_max16, as the conv epilogue's maxima) */
static inline __attribute__((always_inline)) void absmax_run16(const float *xb, size_t nv, int C, int c0, const int NV,
                                                               float *p)
{
    v16 m[4];
    for (int j = 0; j < NV; j++) m[j] = (v16){0};
    for (size_t v = 0; v < nv; v++)
        for (int j = 0; j < NV; j++) m[j] = ts_nn_max16(m[j], ts_nn_absinf16(ld16(xb + v * C + c0 + 16 * j)));
    for (int j = 0; j < NV; j++) st16(p + c0 + 16 * j, m[j]);
}

typedef double v8d __attribute__((vector_size(64)));
typedef double v8du __attribute__((vector_size(64), aligned(8)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v8fu __attribute__((vector_size(32), aligned(4)));
typedef int64_t v8q __attribute__((vector_size(64)));

/* p1/p2[c0 .. c0 + 8 NV) = sums of q and q^2 over the block's voxels, q =
 * rint(x * scale) as channel_qsums' scalar loop (the same integers: x *
 * scale is exact, a power of two, and |x * scale| < 2^26, so adding and
 * taking away 1.5 * 2^52 rounds it to the nearest integer, ties to even) */
static inline __attribute__((always_inline)) void qsums_run8(const float *xb, const double *sc, size_t nv, int C, int c0,
                                                             const int NV, int64_t *p1, int64_t *p2)
{
    const v8d magic = (v8d){0} + 6755399441055744.0;
    v8q s1[4], s2[4];
    v8d k[4];
    for (int j = 0; j < NV; j++) s1[j] = s2[j] = (v8q){0}, k[j] = *(const v8du *)(sc + c0 + 8 * j);
    for (size_t v = 0; v < nv; v++)
        for (int j = 0; j < NV; j++) {
            const v8d t = __builtin_convertvector(*(const v8fu *)(xb + v * C + c0 + 8 * j), v8d) * k[j];
            const v8q q = __builtin_convertvector((t + magic) - magic, v8q);
            s1[j] += q;
            s2[j] += q * q;
        }
    for (int j = 0; j < NV; j++)
        for (int l = 0; l < 8; l++) p1[c0 + 8 * j + l] = s1[j][l], p2[c0 + 8 * j + l] = s2[j][l];
}

/* amax[n][c] = max |x| over the S voxels; +inf where a value is not finite */
static int channel_absmax(const float *x, int N, size_t S, int C, float *amax)
{
    const size_t nblk = (S + BLOCK - 1) / BLOCK, items = (size_t)N * nblk;
    float *part = TS_ALIGNED_ALLOC(items * (size_t)C * sizeof(float));
    if (!part) return TS_ERR_NOMEM;
#pragma omp parallel for schedule(dynamic, 8)
    for (size_t it = 0; it < items; it++) {
        const size_t v0 = it % nblk * BLOCK, nv = (v0 + BLOCK < S ? v0 + BLOCK : S) - v0;
        const float *xb = x + ((it / nblk) * S + v0) * C;
        float *p = part + it * C;
        if (C % 16 == 0) {
            for (int c0 = 0; c0 < C; c0 += 64) {
                const int left = (C - c0) / 16;
                if (left >= 4) absmax_run16(xb, nv, C, c0, 4, p);
                else if (left == 3) absmax_run16(xb, nv, C, c0, 3, p);
                else if (left == 2) absmax_run16(xb, nv, C, c0, 2, p);
                else absmax_run16(xb, nv, C, c0, 1, p);
            }
            continue;
        }
        for (int c = 0; c < C; c++) p[c] = 0.0f;
        ts_nn_amax_run(xb, nv, C, p); /* the conv epilogue's maxima, the same values */
    }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            float m = 0.0f;
            for (size_t b = 0; b < nblk; b++) m = fmaxf(m, part[((size_t)n * nblk + b) * C + c]);
            amax[(size_t)n * C + c] = m;
        }
    free(part);
    return 0;
}

/* s1[n][c] = sum q, s2[n][c] = sum q^2 with q = rint(x * scale[n][c]) (|q| <= 2^26): exact */
static int channel_qsums(const float *x, const double *scale, int N, size_t S, int C, i128 *s1, i128 *s2)
{
    const size_t nblk = (S + BLOCK - 1) / BLOCK, items = (size_t)N * nblk;
    int64_t *part = TS_ALIGNED_ALLOC(items * 2 * (size_t)C * sizeof(int64_t));
    if (!part) return TS_ERR_NOMEM;
#pragma omp parallel for schedule(dynamic, 8)
    for (size_t it = 0; it < items; it++) {
        const size_t n = it / nblk, v0 = it % nblk * BLOCK, nv = (v0 + BLOCK < S ? v0 + BLOCK : S) - v0;
        const float *xb = x + (n * S + v0) * C;
        const double *sc = scale + n * C;
        int64_t *p1 = part + it * 2 * C, *p2 = p1 + C;
        if (C % 8 == 0) {
            for (int c0 = 0; c0 < C; c0 += 32) {
                const int left = (C - c0) / 8;
                if (left >= 4) qsums_run8(xb, sc, nv, C, c0, 4, p1, p2);
                else if (left == 3) qsums_run8(xb, sc, nv, C, c0, 3, p1, p2);
                else if (left == 2) qsums_run8(xb, sc, nv, C, c0, 2, p1, p2);
                else qsums_run8(xb, sc, nv, C, c0, 1, p1, p2);
            }
            continue;
        }
        for (int c = 0; c < C; c++) p1[c] = p2[c] = 0;
        for (size_t v = 0; v < nv; v++)
            for (int c = 0; c < C; c++) {
                const int64_t q = (int64_t)rint((double)xb[v * C + c] * sc[c]);
                p1[c] += q;
                p2[c] += q * q;
            }
    }
    memset(s1, 0, sizeof(i128) * (size_t)N * C);
    memset(s2, 0, sizeof(i128) * (size_t)N * C);
    for (size_t it = 0; it < items; it++) {
        const size_t n = it / nblk;
        for (int c = 0; c < C; c++) {
            s1[n * C + c] += part[it * 2 * C + c];
            s2[n * C + c] += part[it * 2 * C + C + c];
        }
    }
    free(part);
    return 0;
}

/* v as 4 limbs of 32 bits (the top one signed) in doubles: sums of limbs over
 * fewer than 2^21 ranks stay exact integers */
static void to_limbs(i128 v, double *l)
{
    const i128 b = (i128)1 << 32;
    for (int k = 0; k < 3; k++) {
        i128 r = v % b;
        if (r < 0) r += b;
        l[k] = (double)(int64_t)r;
        v = (v - r) / b;
    }
    l[3] = (double)(int64_t)v;
}

static i128 from_limbs(const double *l)
{
    i128 v = 0;
    for (int k = 3; k >= 0; k--) v = v * ((i128)1 << 32) + (i128)(int64_t)l[k];
    return v;
}

int ts_nn_exact_stats(const float *x, const float *amax_in, int N, size_t S, int C, int G, const ts_norm_opts *o,
                      double *mean, double *var, double *count)
{
    int err = 0;
    const int cg = C / G, NG = N * G;
    const size_t nc = (size_t)N * C;
    float *amax = TS_ALIGNED_ALLOC(nc * sizeof(float));
    double *buf = TS_CALLOC((size_t)NG * 8 + 1, sizeof(double)), *scale = TS_ALIGNED_ALLOC(nc * sizeof(double));
    i128 *s1 = TS_ALIGNED_ALLOC(nc * sizeof(i128)), *s2 = TS_ALIGNED_ALLOC(nc * sizeof(i128));
    int *ex = TS_CALLOC((size_t)NG * 2, sizeof(int)), *bad = ex + NG;
    if (!amax || !buf || !scale || !s1 || !s2 || !ex) TS_FAIL(TS_ERR_NOMEM, "norm statistics");
    /* the scale of each statistic: from its largest |value| over the group */
    if (amax_in) memcpy(amax, amax_in, nc * sizeof(float));
    else TS_CHECK(channel_absmax(x, N, S, C, amax));
    for (int j = 0; j < NG; j++) {
        float m = 0.0f;
        for (int c = 0; c < cg; c++) m = fmaxf(m, amax[(size_t)j * cg + c]);
        buf[j] = m;
    }
    if (o->sync && (err = o->sync(o->sync_ctx, buf, NG, TS_SYNC_MAX))) goto cleanup;
    for (int j = 0; j < NG; j++) {
        int k = 0;
        bad[j] = !(buf[j] <= DBL_MAX);
        if (buf[j] > 0 && !bad[j]) frexp(buf[j], &k); /* max < 2^k */
        ex[j] = EXACT_BITS - k;
        for (int c = 0; c < cg; c++) scale[(size_t)j * cg + c] = bad[j] ? 0.0 : ldexp(1.0, ex[j]);
    }
    /* the exact integer sums, then their exact sum over the group */
    TS_CHECK(channel_qsums(x, scale, N, S, C, s1, s2));
    {
        for (int j = 0; j < NG; j++) {
            i128 a = 0, b = 0;
            for (int c = 0; c < cg; c++) {
                a += s1[(size_t)j * cg + c];
                b += s2[(size_t)j * cg + c];
            }
            to_limbs(a, buf + (size_t)j * 8);
            to_limbs(b, buf + (size_t)j * 8 + 4);
        }
        buf[(size_t)NG * 8] = (double)S;
        if (o->sync && (err = o->sync(o->sync_ctx, buf, NG * 8 + 1, TS_SYNC_SUM))) goto cleanup;
    }
    {
        const double St = buf[(size_t)NG * 8], m = St * cg;
        for (int j = 0; j < NG; j++) {
            count[j] = m;
            if (bad[j]) {
                mean[j] = var[j] = NAN;
                continue;
            }
            const i128 a = from_limbs(buf + (size_t)j * 8), b = from_limbs(buf + (size_t)j * 8 + 4);
            const i128 mi = (i128)m;
            i128 ma, aa;
            mean[j] = ldexp((double)a / m, -ex[j]);
            if (!__builtin_mul_overflow(mi, b, &ma) && !__builtin_mul_overflow(a, a, &aa))
                var[j] = ldexp((double)(ma - aa) / (m * m), -2 * ex[j]); /* exact m S2 - S1^2, then one rounding */
            else
                var[j] = ldexp((double)((long double)b / m - ((long double)a / m) * ((long double)a / m)), -2 * ex[j]);
            if (var[j] < 0) var[j] = 0;
        }
    }
cleanup:
    free(amax);
    free(buf);
    free(scale);
    free(s1);
    free(s2);
    free(ex);
    return err;
}
