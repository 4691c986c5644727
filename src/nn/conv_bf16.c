/* bf16 convolutions (ts_nn_set_conv_precision): the process-wide precision
 * switch, the run-time choice between the AVX512-BF16 kernels and their
 * portable emulation (bitwise the same results), the fp32 -> bf16 staging
 * of slabs and weights, and the two variants of the micro-kernels
 * (conv_tiles_bf16.h through conv_bf16_variant.h). The drivers are those of
 * conv_kernels.c. Cost: as fp32 with half the instructions per multiply-add
 * (VDPBF16PS does 32 per 512-bit instruction, FMA 16) and half the bytes
 * per staged input value; the emulation does two FMAs per pair. */
#include "src/nn/kernel_opt.h" /* first: the optimisation pragma */
#include "tsbuild.h"
#include "src/nn/conv_impl.h"
#include "src/nn/layers.h"
#include "src/core/error.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if TS_BF16_X86
#include <cpuid.h>
#endif

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "bf16 pairs assume little-endian words");

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef uint32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16iu __attribute__((vector_size(64), aligned(4)));

#define vld(p) (*(const v16u *)(p))
#define vst(p, v) (*(v16u *)(p) = (v))

/* the 64 bits at p (two words) in every 64-bit lane pair: a broadcast that
 * gives lanes 2i and 2i + 1 different pairs (the voxel-pair tiles) */
#pragma GCC diagnostic ignored "-Wpsabi" /* always inlined: no call whose ABI could differ */
static inline __attribute__((always_inline)) v16i bx2(const uint32_t *p) /* inlined: see TS_NN_VINLINE */
{
    typedef uint64_t v8q __attribute__((vector_size(64)));
    uint64_t d;
    memcpy(&d, p, sizeof d);
    return (v16i)((v8q){0} + d);
}

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int nv_for(int lanes) { return lanes >= 64 ? 4 : lanes >= 32 ? 2 : 1; }

/* ------------------------------------------------ precision and ISA switch */

static atomic_int conv_prec = TS_PREC_FP32;
static atomic_int bf16_isa = -1; /* -1: not chosen yet, 0: emulated, 1: native */

/* AVX512 F, BW, VL and BF16 in the CPU, and the ZMM state enabled by the OS */
static int cpu_has_bf16(void)
{
#if TS_BF16_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xe6u) != 0xe6u) return 0; /* XMM, YMM, opmask, ZMM state */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const unsigned need = (1u << 16) | (1u << 30) | (1u << 31); /* avx512f, bw, vl */
    if ((b & need) != need) return 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1u; /* avx512_bf16 */
#else
    return 0;
#endif
}

int ts_nn_cpu_bf16(void) { return cpu_has_bf16(); }

/* the best the CPU has: 2 AMX (with AVX512-BF16 for the other kernels), 1, 0 */
static int isa_auto(void) { return cpu_has_bf16() ? (ts_nn_cpu_amx() ? 2 : 1) : 0; }

int ts_nn_bf16_native(void)
{
    int v = atomic_load(&bf16_isa);
    if (v < 0) {
        const char *e = getenv("TESSERA_BF16_ISA");
        if (e && !strcmp(e, "emulated")) v = 0;
        else if (e && !strcmp(e, "avx512bf16")) v = cpu_has_bf16();
        else v = isa_auto(); /* auto, amx, or unset */
        atomic_store(&bf16_isa, v); /* a race writes the same value */
    }
    return v;
}

int ts_nn_bf16_select_isa(const char *name)
{
    if (!name) return TS_ERR(TS_ERR_ARG, "bf16 ISA: NULL name");
    if (!strcmp(name, "emulated")) {
        atomic_store(&bf16_isa, 0);
    } else if (!strcmp(name, "auto")) {
        atomic_store(&bf16_isa, isa_auto());
    } else if (!strcmp(name, "avx512bf16")) {
        if (!cpu_has_bf16()) return TS_ERR(TS_ERR_UNSUPPORTED, "bf16 ISA: this CPU (or build) has no AVX512-BF16");
        atomic_store(&bf16_isa, 1);
    } else if (!strcmp(name, "amx")) {
        if (!cpu_has_bf16() || !ts_nn_cpu_amx())
            return TS_ERR(TS_ERR_UNSUPPORTED, "bf16 ISA: this CPU (or build, or kernel) has no AMX-BF16 with AVX512-BF16");
        atomic_store(&bf16_isa, 2);
    } else {
        return TS_ERR(TS_ERR_ARG, "bf16 ISA '%s' (emulated, avx512bf16, amx or auto)", name);
    }
    return 0;
}

const char *ts_nn_bf16_isa(void)
{
    const int v = ts_nn_bf16_native();
    return v == 2 ? "amx" : v ? "avx512bf16" : "emulated";
}

int ts_nn_set_conv_precision(ts_precision p)
{
    if (p != TS_PREC_FP32 && p != TS_PREC_BF16 && p != TS_PREC_FP16)
        return TS_ERR(TS_ERR_ARG, "conv precision %d (fp32, bf16 or fp16)", (int)p);
    atomic_store(&conv_prec, (int)p);
    return 0;
}

ts_precision ts_nn_conv_precision(void) { return (ts_precision)atomic_load(&conv_prec); }

static atomic_int tf32 = 1;
void ts_nn_set_tf32(int on) { atomic_store(&tf32, on ? 1 : 0); }
int ts_nn_tf32(void) { return atomic_load(&tf32); }

/* ------------------------------------------------------------ staging */

static void put_emu(int vpair, int s, int C, int ld, void *dst, int col0, int n, const float *a, int ca,
                    const float *b)
{
    uint16_t *d16 = dst;
    const int cb = C - ca, Cp = C + (C & 1);
    for (int v = 0; v < n; v++) {
        const int j = col0 + v;
        uint16_t *dv;
        int step = 1;
        if (!vpair) {
            dv = d16 + (size_t)j * Cp;
        } else {
            const int blk = j / (2 * s), e = (j / s) & 1, r = j % s;
            dv = d16 + (size_t)(blk * s + r) * ld * 2 + e;
            step = 2;
        }
        const float *sa = a + (size_t)v * ca;
        for (int c = 0; c < ca; c++) dv[c * step] = ts_nn_bf16_round(sa[c]);
        if (b) {
            const float *sb = b + (size_t)v * cb;
            for (int c = 0; c < cb; c++) dv[(ca + c) * step] = ts_nn_bf16_round(sb[c]);
        }
        if (!vpair && Cp != C) dv[C] = 0;
    }
}

#if TS_BF16_X86
/* n floats to bf16 at dst (step2 0) or at every other half-word of dst (step2 1) */
TS_BF16_TARGET static inline void seg_nat(const float *src, int n, uint16_t *dst, int step2)
{
    for (int c = 0; c < n; c += 16) {
        const int m = imin(16, n - c);
        const __mmask16 k = (__mmask16)((1u << m) - 1);
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, src + c));
        if (!step2) {
            _mm256_mask_storeu_epi16(dst + c, k, h);
        } else {
            const __mmask32 k2 = (__mmask32)((m == 16 ? 0xffffffffu : (1u << (2 * m)) - 1) & 0x55555555u);
            _mm512_mask_storeu_epi16(dst + 2 * c, k2, _mm512_cvtepu16_epi32(h));
        }
    }
}

/* n floats (a multiple of 8) to bf16 at dst: 16 at a time, then 8 */
TS_BF16_TARGET static inline void seg8_nat(const float *src, int n, uint16_t *dst)
{
    int c = 0;
    for (; c + 16 <= n; c += 16)
        _mm256_storeu_si256((__m256i *)(dst + c), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + c)));
    if (c < n) _mm_storeu_si128((__m128i *)(dst + c), (__m128i)_mm256_cvtneps_pbh(_mm256_loadu_ps(src + c)));
}

/* pairs (lo[c], hi[c]) of n channels into n words at dst (lo or hi NULL: zeros) */
TS_BF16_TARGET static inline void zip_nat(const float *lo, const float *hi, int n, uint32_t *dst)
{
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                         5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    int c = 0;
    for (; c + 16 <= n; c += 16)
        _mm512_storeu_si512(dst + c, _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(hi + c),
                                                                                                 _mm512_loadu_ps(lo + c))));
    if (c < n) {
        const __mmask16 k = (__mmask16)((1u << (n - c)) - 1);
        const __m512 l = _mm512_maskz_loadu_ps(k, lo + c), h = _mm512_maskz_loadu_ps(k, hi + c);
        const __m512i r = _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(h, l));
        _mm512_mask_storeu_epi32(dst + c, k, r);
    }
}

/* long-function: a hot packing kernel with one fast path per slab layout; helpers would add calls per column */
TS_BF16_TARGET static void put_nat(int vpair, int s, int C, int ld, void *dst, int col0, int n, const float *a, int ca,
                                   const float *b)
{
    uint16_t *d16 = dst;
    const int cb = C - ca, Cp = C + (C & 1);
    if (!vpair && !b && Cp == C) { /* one contiguous run */
        const size_t len = (size_t)n * C;
        uint16_t *d = d16 + (size_t)col0 * C;
        size_t i = 0;
        for (; i + 32 <= len; i += 32)
            _mm512_storeu_si512(d + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(a + i)));
        if (i < len) seg_nat(a + i, (int)(len - i), d + i, 0);
        return;
    }
    if (C == 1) { /* one channel: column j is half-word 2j (its partner zero) or, in pairs of columns one word
                   * apart (ld 1: the input slab; not the one-channel output gradient's rows, ld 16), j */
        uint16_t *d = d16 + (vpair && s == 1 ? (size_t)col0 : 0);
        int v = 0;
        if (vpair && s == 1 && ld == 1) {
            for (; v + 16 <= n; v += 16) _mm256_storeu_si256((__m256i *)(d + v), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(a + v)));
            if (v < n) seg_nat(a + v, n - v, d + v, 0);
            return;
        }
        if (!vpair) {
            uint32_t *d32 = (uint32_t *)dst + col0;
            for (; v + 16 <= n; v += 16)
                _mm512_storeu_si512(d32 + v, _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(a + v))));
            if (v < n) {
                const __mmask16 k = (__mmask16)((1u << (n - v)) - 1);
                _mm512_mask_storeu_epi32(d32 + v, k, _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, a + v))));
            }
            return;
        }
    }
    if (!vpair && ca % 8 == 0 && cb % 8 == 0) { /* two sources in whole eights (the [8, 8], [16, 16] concats): no masks */
        for (int v = 0; v < n; v++) {
            uint16_t *dv = d16 + (size_t)(col0 + v) * C;
            seg8_nat(a + (size_t)v * ca, ca, dv);
            seg8_nat(b + (size_t)v * cb, cb, dv + ca);
        }
        return;
    }
    if (!vpair) {
        for (int v = 0; v < n; v++) {
            uint16_t *dv = d16 + (size_t)(col0 + v) * Cp;
            seg_nat(a + (size_t)v * ca, ca, dv, 0);
            if (b) seg_nat(b + (size_t)v * cb, cb, dv + ca, 0);
            if (Cp != C) dv[C] = 0;
        }
        return;
    }
    if (s == 1 && ca % 16 == 0 && cb % 16 == 0) { /* stride 1, whole vectors: a column pair per step */
        const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                             21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        int v = 0;
        if (col0 & 1) { /* the run starts with the upper half of a pair */
            uint16_t *dv = (uint16_t *)((uint32_t *)dst + (size_t)(col0 / 2) * ld) + 1;
            seg_nat(a, ca, dv, 1);
            if (b) seg_nat(b, cb, dv + 2 * ca, 1);
            v = 1;
        }
        uint32_t *dw = (uint32_t *)dst + (size_t)((col0 + v) / 2) * ld;
        const float *a0 = a + (size_t)v * ca, *b0 = b ? b + (size_t)v * cb : NULL;
#define ZIP16(d, lo) _mm512_storeu_si512((d), _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps((lo) + 16), _mm512_loadu_ps(lo))))
        if (!b && ca == 16) { /* the common case, one vector per pair */
            for (; v + 1 < n; v += 2, dw += ld, a0 += 32) ZIP16(dw, a0);
        } else if (ca == 16 && cb == 16) { /* [16, 16]: the U-Net's first decoder conv */
            for (; v + 1 < n; v += 2, dw += ld, a0 += 32, b0 += 32) {
                ZIP16(dw, a0);
                ZIP16(dw + 16, b0);
            }
        } else {
            for (; v + 1 < n; v += 2, dw += ld, a0 += 2 * ca) {
                for (int c = 0; c < ca; c += 16)
                    _mm512_storeu_si512(dw + c, _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(
                                                                                  _mm512_loadu_ps(a0 + ca + c), _mm512_loadu_ps(a0 + c))));
                if (b) {
                    for (int c = 0; c < cb; c += 16)
                        _mm512_storeu_si512(dw + ca + c, _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(
                                                                                           _mm512_loadu_ps(b0 + cb + c), _mm512_loadu_ps(b0 + c))));
                    b0 += 2 * cb;
                }
            }
        }
#undef ZIP16
        if (v < n) { /* ends with the lower half of a pair */
            uint16_t *dv = (uint16_t *)((uint32_t *)dst + (size_t)((col0 + v) / 2) * ld);
            seg_nat(a + (size_t)v * ca, ca, dv, 1);
            if (b) seg_nat(b + (size_t)v * cb, cb, dv + 2 * ca, 1);
        }
        return;
    }
    if (ca % 16 == 0 && cb % 16 == 0) { /* stride s, whole vectors: block by block */
        const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                             21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        const int j0 = col0, j1 = col0 + n;
        for (int blk = j0 / (2 * s); blk <= (j1 - 1) / (2 * s); blk++)
            for (int r = 0; r < s; r++) {
                const int jl = 2 * s * blk + r, jh = jl + s, inl = jl >= j0 && jl < j1, inh = jh >= j0 && jh < j1;
                uint32_t *dw = (uint32_t *)dst + (size_t)(blk * s + r) * ld;
                if (inl && inh) {
                    const float *al = a + (size_t)(jl - j0) * ca, *ah = a + (size_t)(jh - j0) * ca;
                    for (int c = 0; c < ca; c += 16)
                        _mm512_storeu_si512(dw + c, _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(
                                                                                     _mm512_loadu_ps(ah + c), _mm512_loadu_ps(al + c))));
                    if (b) {
                        const float *bl = b + (size_t)(jl - j0) * cb, *bh = b + (size_t)(jh - j0) * cb;
                        for (int c = 0; c < cb; c += 16)
                            _mm512_storeu_si512(dw + ca + c, _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(
                                                                                              _mm512_loadu_ps(bh + c), _mm512_loadu_ps(bl + c))));
                    }
                } else if (inl || inh) { /* the partner lies outside the run: this half only */
                    const int j = inl ? jl : jh;
                    uint16_t *dv = (uint16_t *)dw + (inl ? 0 : 1);
                    seg_nat(a + (size_t)(j - j0) * ca, ca, dv, 1);
                    if (b) seg_nat(b + (size_t)(j - j0) * cb, cb, dv + 2 * ca, 1);
                }
            }
        return;
    }
    /* column pairs (j, j + s) both in the run: whole words; a column whose
     * partner lies outside the run: its half only */
    int blk = col0 / (2 * s), e = (col0 / s) & 1, r = col0 % s;
    for (int v = 0; v < n; v++) {
        uint32_t *dw = (uint32_t *)dst + (size_t)(blk * s + r) * ld;
        if (e == 0 && v + s < n) {
            const float *a0 = a + (size_t)v * ca, *a1 = a + (size_t)(v + s) * ca;
            zip_nat(a0, a1, ca, dw);
            if (b) zip_nat(b + (size_t)v * cb, b + (size_t)(v + s) * cb, cb, dw + ca);
        } else if (e == 0 || v < s) {
            uint16_t *dv = (uint16_t *)dw + e;
            seg_nat(a + (size_t)v * ca, ca, dv, 1);
            if (b) seg_nat(b + (size_t)v * cb, cb, dv + 2 * ca, 1);
        } /* else: written with its partner */
        if (++r == s) {
            r = 0;
            if (++e == 2) {
                e = 0;
                blk++;
            }
        }
    }
}
#endif

void ts_nn_bf16_put(int nat, int vpair, int s, int C, int ld, void *dst, int col0, int n, const float *a, int ca,
                    const float *b)
{
#if TS_BF16_X86
    if (nat) {
        put_nat(vpair, s, C, ld, dst, col0, n, a, ca, b);
        return;
    }
#endif
    put_emu(vpair, s, C, ld, dst, col0, n, a, ca, b);
}

uint32_t *ts_nn_bf16_pack(const float *w, int rows, int cols, int taps, int flip, int by_row)
{
    const int rp = (rows + 1) / 2, colp = ts_nn_pad16(cols);
    uint32_t *wp = ts_nn_scratch(1, (size_t)taps * rp * colp * sizeof(uint32_t));
    if (!wp) return NULL;
#pragma omp parallel for schedule(dynamic, 1)
    for (int tp = 0; tp < taps; tp++) {
        const int t = flip ? taps - 1 - tp : tp;
        uint32_t *dst = wp + (size_t)tp * rp * colp;
        memset(dst, 0, (size_t)rp * colp * sizeof(uint32_t));
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                const float v = by_row ? w[((size_t)r * cols + c) * taps + t] : w[((size_t)c * rows + r) * taps + t];
                dst[(size_t)(r / 2) * colp + c] |= (uint32_t)ts_nn_bf16_round(v) << (16 * (r & 1));
            }
    }
    return wp;
}

/* ------------------------------------------------------ kernel variants */

/* voxel pairs per tile of the at-most-8-channel kernels (gqb_tile): 16
 * independent accumulator chains cover VDPBF16PS's latency on two pipes
 * (8 left the demo's first level at about half the bf16 peak) */
#define GQB_NP 16

/* emulated: a pair's halves as floats (bf16 bits in the high half of an
 * fp32), the upper product first, as VDPBF16PS */
static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#define BT(n) n##_emu
#define BWIDE TS_NN_WIDE_REGS
#define BATTR static inline
#define BATTR_RUN static inline
#define BW(n, p)                                                                                                        \
    const v16i n##_i = *(const v16iu *)(p);                                                                            \
    const v16 n##_l __attribute__((unused)) = (v16)(n##_i << 16), n##_h __attribute__((unused)) = (v16)(n##_i & 0xffff0000u)
#define BWSHIFT(n, c, p) const v16 n##_l = p##_h, n##_h = c##_l
#define BWZERO(n) v16 n##_l = (v16){0}, n##_h = (v16){0}
#define BWSET(n, m) (n##_l = m##_l, n##_h = m##_h)
#define BX(n, p)                                                                                                        \
    const uint32_t n##_i = *(const uint32_t *)(p);                                                                     \
    const float n##_l = u2f(n##_i << 16), n##_h = u2f(n##_i & 0xffff0000u)
#define BX2(n, p)                                                                                                       \
    const v16i n##_i = bx2(p);                                                                                         \
    const v16 n##_l = (v16)(n##_i << 16), n##_h = (v16)(n##_i & 0xffff0000u)
#define BDP(c, x, w) (c += x##_h * w##_h, c += x##_l * w##_l)
#include "src/nn/conv_bf16_variant.h"
#undef BT
#undef BWIDE
#undef BATTR
#undef BATTR_RUN
#undef BW
#undef BWSHIFT
#undef BWZERO
#undef BWSET
#undef BX
#undef BX2
#undef BDP

#if TS_BF16_X86
/* native: VDPBF16PS with a broadcast pair */
#define BT(n) n##_nat
#define BWIDE 1 /* AVX-512 by its target attribute, whatever the build's flags */
#define BATTR static inline TS_BF16_TARGET
#define BATTR_RUN static inline TS_BF16_TARGET
#define BW(n, p) const v16i n = *(const v16iu *)(p)
#define BWSHIFT(n, c, p) const v16i n = (c << 16) | (p >> 16)
#define BWZERO(n) v16i n = (v16i){0}
#define BWSET(n, m) (n = m)
#define BX(n, p) const v16i n = (v16i){0} + *(const uint32_t *)(p)
#define BX2(n, p) const v16i n = bx2(p)
#define BDP(c, x, w) (c = (v16)_mm512_dpbf16_ps((__m512)(c), (__m512bh)(w), (__m512bh)(x)))
#include "src/nn/conv_bf16_variant.h"
#endif

void ts_nn_bf16_gather_row(int nat, const ts_bf16_gc_args *a, int k3s1, int r, int OW, int oc0, int oc1, int OC, float *yr,
                           int yo0, int ldy)
{
#if TS_AMX_X86
    if (nat == 2) { /* the drivers give AMX no voxel-pair planes (ppl) */
        if (a->wq && k3s1 && oc0 == 0 && oc1 == OC) ts_nn_amx_gather_pairs(a, r, OW, OC, yr, yo0, ldy);
        else ts_nn_amx_gather_row(a, r, OW, oc0, oc1, OC, yr, yo0, ldy);
        return;
    }
#endif
#if TS_BF16_X86
    if (nat) {
        gather_row_nat(a, k3s1, r, OW, oc0, oc1, OC, yr, yo0, ldy);
        return;
    }
#endif
    gather_row_emu(a, k3s1, r, OW, oc0, oc1, OC, yr, yo0, ldy);
}

void ts_nn_bf16_tgather_k2_row(int nat, const uint32_t *xr, const uint32_t *wr, const float *b, int C, int ocp, int W,
                               int OC, float *yr)
{
#if TS_AMX_X86
    if (nat == 2) { /* each kw tap a 1x1x1 gather into every other output voxel */
        const uint32_t *plane[1] = {xr};
        for (int kw = 0; kw < 2; kw++) {
            const ts_bf16_gc_args a = {plane, 0, 1, 1, C, ocp, wr + (size_t)kw * C * ocp, b, NULL, NULL, NULL, 0};
            ts_nn_amx_gather_row(&a, 0, W, 0, OC, OC, yr + (size_t)kw * OC, 0, 2 * OC);
        }
        return;
    }
#endif
#if TS_BF16_X86
    if (nat) {
        tgather_k2_row_nat(xr, wr, b, C, ocp, W, OC, yr);
        return;
    }
#endif
    tgather_k2_row_emu(xr, wr, b, C, ocp, W, OC, yr);
}

void ts_nn_bf16_tgather_tap(int nat, const uint32_t *xr, const uint32_t *wr, int C, int ocp, int s, int off, int lo, int hi,
                            int OC, float *yr)
{
#if TS_BF16_X86
    if (nat) {
        tgather_tap_nat(xr, wr, C, ocp, s, off, lo, hi, OC, yr);
        return;
    }
#endif
    tgather_tap_emu(xr, wr, C, ocp, s, off, lo, hi, OC, yr);
}

void ts_nn_bf16_tk2_wgrad(int nat, const uint32_t *xq, int C, const uint32_t *const *gq, size_t gri, size_t gm, int nr,
                          int nm, int ocp, float *dw)
{
#if TS_BF16_X86
    if (nat) {
        tk2_wgrad_nat(xq, C, gq, gri, gm, nr, nm, ocp, dw);
        return;
    }
#endif
    tk2_wgrad_emu(xq, C, gq, gri, gm, nr, nm, ocp, dw);
}

void ts_nn_bf16_wgrad_c1(int nat, const ts_bf16_wg_args *a)
{
#if TS_BF16_X86
    if (nat) {
        wgrad_c1_nat(a);
        return;
    }
#endif
    wgrad_c1_emu(a);
}

void ts_nn_bf16_wgrad_pair(int nat, const ts_bf16_wg_args *a, int kd, int kh, int k3s1)
{
#if TS_BF16_X86
    if (nat) {
        wgrad_pair_nat(a, kd, kh, k3s1);
        return;
    }
#endif
    wgrad_pair_emu(a, kd, kh, k3s1);
}
