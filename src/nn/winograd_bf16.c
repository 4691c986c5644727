/* The bf16 products of the Winograd convolution (winograd.c; forward and
 * input gradient where the convolution precision is bf16): for each of the
 * 64 transform points, M[xi] = V[xi] U[xi] with V (the transformed input
 * blocks) and U (the transformed weights) rounded to bf16 and stored as
 * channel pairs in 32-bit words, the sums in fp32. VDPBF16PS where the CPU
 * has AVX512-BF16, else its emulation (two products per pair, the upper
 * first, as the instruction does: the same bits). The transforms stay fp32
 * (winograd.c); docs/engine.md, "Winograd convolution". The weight
 * gradient's products likewise, over pairs of tiles (ts_nn_wino_bf16_wgrad). */
#pragma GCC optimize("O3")
#include "tsbuild.h"
#include "src/nn/conv_impl.h"

#include <stdint.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "bf16 pairs assume little-endian words");

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef uint32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16iu __attribute__((vector_size(64), aligned(4)));
#pragma GCC diagnostic ignored "-Wpsabi" /* always inlined: no call whose ABI could differ */

static inline int imin(int a, int b) { return a < b ? a : b; }

/* emulated: a pair's halves as floats, the upper product first */
#define BT(n) n##_emu
#define BATTR static inline
#define WDECL(NV) v16 wl_[NV], wh_[NV]
#define WLOAD(j, p)                                                                                                    \
    do {                                                                                                               \
        const v16i t_ = *(const v16iu *)(p);                                                                           \
        wl_[j] = (v16)(t_ << 16);                                                                                      \
        wh_[j] = (v16)(t_ & 0xffff0000u);                                                                              \
    } while (0)
#define XLOAD(x, p)                                                                                                    \
    const uint32_t x##_i = *(p);                                                                                       \
    const float x##_l = ts_nn_bf16_float((uint16_t)x##_i), x##_h = ts_nn_bf16_float((uint16_t)(x##_i >> 16))
#define DP(a, x, j) (a += x##_h * wh_[j], a += x##_l * wl_[j])
#include "src/nn/winograd_bf16_variant.h"
#undef BT
#undef BATTR
#undef WDECL
#undef WLOAD
#undef XLOAD
#undef DP

#if TS_BF16_X86
/* native: VDPBF16PS with a broadcast pair */
#define BT(n) n##_nat
#define BATTR static inline TS_BF16_TARGET
#define WDECL(NV) v16i w_[NV]
#define WLOAD(j, p) (w_[j] = *(const v16iu *)(p))
#define XLOAD(x, p) const v16i x = (v16i){0} + *(p)
#define DP(a, x, j) (a = (v16)_mm512_dpbf16_ps((__m512)(a), (__m512bh)w_[j], (__m512bh)(x)))
#include "src/nn/winograd_bf16_variant.h"
#endif

void ts_nn_wino_bf16_gemm(const uint16_t *V, int T, int cp, size_t vs, const uint32_t *U, int K, int op, float *M,
                          size_t ms)
{
#if TS_BF16_X86
    if (ts_nn_bf16_native()) {
        bgemm_nat(V, T, cp, vs, U, K, op, M, ms);
        return;
    }
#endif
    bgemm_emu(V, T, cp, vs, U, K, op, M, ms);
}

void ts_nn_wino_bf16_wgrad(const uint32_t *V, size_t vs, const uint32_t *Y, size_t ys, int C, int cp, int op, int KP,
                           float *du)
{
#if TS_BF16_X86
    if (ts_nn_bf16_native()) {
        bwgrad_nat(V, vs, Y, ys, C, cp, op, KP, du);
        return;
    }
#endif
    bwgrad_emu(V, vs, Y, ys, C, cp, op, KP, du);
}
