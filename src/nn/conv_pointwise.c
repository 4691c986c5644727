/* Pointwise convolutions (1x1x1, stride 1, padding 0) with few output
 * channels: the segmentation heads (C feature channels -> a handful of
 * classes). Through the gather and wgrad drivers such a layer stages every
 * input row into a slab and pads its few output channels to a 16-lane
 * vector, and ran at a third of the memory bandwidth (docs/engine.md); here
 * each pass reads its operands once, straight from the tensors:
 *   forward  y[v][o]  = b[o] + sum_c x[v][c] w[o][c]   lanes: 16 voxels (x
 *            transposed in registers, 16 voxels x 16 channels at a time)
 *   dgrad    dx[v][c] = sum_o dy[v][o] w[o][c]          lanes: 16 channels
 *   wgrad    dw[c][o] = sum_v x[v][c] dy[v][o]          lanes: 16 channels
 * fp32, or bf16 (bf = 1): the operands rounded to bf16 (ts_nn_bf16_round),
 * exact products, fp32 sums. Forward and dgrad add in the order of the
 * gather kernels (fp32: bias, then channel 0, 1, ...; bf16: bias, then the
 * upper channel of each pair first, as VDPBF16PS and the emulated variant),
 * so their results are the gather's bit for bit (the gather's native bf16
 * flushes a denormal sum to zero: the one difference). The weight gradient
 * sums in its own fixed order (PW_CHUNKS chunks of PW_BLK-voxel blocks, the
 * chunks added in order), independent of the thread count. */
#include "src/nn/kernel_opt.h" /* first: the optimisation pragma */
#include "tsbuild.h"
#include "src/nn/conv_impl.h"
#include "src/core/error.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX512BF16__)
#include <immintrin.h>
#endif

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef uint32_t v16i __attribute__((vector_size(64)));

/* clang's UndefinedBehaviorSanitizer (the fuzz build, tests/fuzz) makes the
 * unrolled register transposes and the 1..15-channel switch take tens of
 * minutes to compile: its checks are left out of this file's kernels (they
 * take no hostile input; AddressSanitizer still covers them) */
#if defined(__clang__) && defined(__has_feature)
#if __has_feature(undefined_behavior_sanitizer) || defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#pragma clang attribute push(__attribute__((no_sanitize("undefined"))), apply_to = function)
#define TS_PW_NO_UBSAN 1
#endif
#endif
#define AI static inline __attribute__((always_inline))
#pragma GCC diagnostic ignored "-Wpsabi" /* always inlined: no call whose ABI could differ */

enum { PW_MAX_OC = 16, PW_CHUNKS = 16, PW_BLK = 512 };

static atomic_int pw_off;
static atomic_long pw_calls;

long ts_nn_pw_calls(void) { return atomic_load(&pw_calls); }

int ts_nn_set_pointwise(int on)
{
    atomic_store(&pw_off, on == 0);
    return 0;
}

int ts_nn_pointwise_on(void) { return !atomic_load(&pw_off); }

int ts_nn_pw_fits(const ts_conv_geom *g)
{
    return ts_nn_pointwise_on() && g->k == 1 && g->s == 1 && g->p == 0 && g->OC <= PW_MAX_OC && g->C % 8 == 0 && g->C > 0;
}

/* ts_nn_bf16_round on 16 lanes, back as floats (the bf16 in the upper
 * half): one conversion where the build has AVX512-BF16 (the native put
 * of conv_bf16.c rounds the same way: its tests compare it with
 * ts_nn_bf16_round); else rounded to nearest even, and where a lane's
 * exponent is 0 or 255 (zero, denormal: signed zero; inf; NaN: quieted)
 * as ts_nn_bf16_round does (a branch taken for such vectors only) */
AI v16 bf16r(v16 f)
{
#ifdef __AVX512BF16__
    return (v16)_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh((__m512)f)), 16);
#else
    v16i u;
    memcpy(&u, &f, sizeof u);
    const v16i zero = (v16i){0} + 0, one = zero + 1;
    v16i r = (u + 0x7fffu + ((u >> 16) & one)) & 0xffff0000u;
    const v16i special = (v16i)(((u + 0x800000u) & 0x7f800000u) < (zero + 0x1000000u));
    v16i any = special | __builtin_shufflevector(special, special, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    any |= __builtin_shufflevector(any, any, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
    any |= __builtin_shufflevector(any, any, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
    if (__builtin_expect((any[0] | any[1]) != 0, 0)) {
        const v16i tiny = (v16i)((u & 0x7f800000u) == zero);
        const v16i nan = (v16i)((u & 0x7fffffffu) > (zero + 0x7f800000u));
        const v16i inf = special & ~tiny & ~nan; /* exponent 255, zero fraction: as it is */
        r = (tiny & (u & 0x80000000u)) | (nan & ((u & 0xffff0000u) | 0x400000u)) | (inf & u) | (~special & r);
    }
    v16 o;
    memcpy(&o, &r, sizeof o);
    return o;
#endif
}

/* a store past the caches where the build has AVX-512 (p 64-byte aligned) */
AI void st_nt(float *p, v16 v)
{
#ifdef __AVX512F__
    _mm512_stream_ps(p, (__m512)v);
#else
    memcpy(p, &v, sizeof v);
#endif
}

AI float bf16r1(float f) { return ts_nn_bf16_float(ts_nn_bf16_round(f)); }

/* r[i][j] -> r[j][i]: four butterfly stages, stage B exchanging bit B of
 * the row and the lane index (rows i and i + B, i without bit B) */
AI void transpose16(v16 r[16])
{
    for (int i = 0; i < 16; i += 2) {
        const v16 a = r[i], b = r[i + 1];
        r[i] = __builtin_shufflevector(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
        r[i + 1] = __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    }
    for (int i = 0; i < 16; i += 4)
        for (int j = i; j < i + 2; j++) {
            const v16 a = r[j], b = r[j + 2];
            r[j] = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
            r[j + 2] = __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
        }
    for (int i = 0; i < 16; i += 8)
        for (int j = i; j < i + 4; j++) {
            const v16 a = r[j], b = r[j + 4];
            r[j] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
            r[j + 4] = __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
        }
    for (int j = 0; j < 8; j++) {
        const v16 a = r[j], b = r[j + 8];
        r[j] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
        r[j + 8] = __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    }
}

AI v16 bcast(float f) { return (v16){f, f, f, f, f, f, f, f, f, f, f, f, f, f, f, f}; }
AI v16 ld(const float *p) { return *(const v16u *)p; }

/* the 16 x 16 block of x at rows x, x + C, ... (nv of them, zeros after), channels [cb, cb + nc) (nc 16,
 * or 8 for the last block of a channel count that is an odd multiple of 8; zeros after) */
AI v16 ldn(const float *p, int nc) { return nc == 16 ? *(const v16u *)p : ts_nn_vld_part(p, nc); }
AI void load16(const float *x, int C, int cb, int nc, int nv, v16 *r)
{
    if (nv == 16) {
#pragma GCC unroll 16
        for (int v = 0; v < 16; v++) r[v] = ldn(x + (size_t)v * C + cb, nc);
    } else {
        for (int v = 0; v < 16; v++) r[v] = v < nv ? ldn(x + (size_t)v * C + cb, nc) : (v16){0};
    }
}

/* acc[o] += the products of channels [0, nc) of r (transposed) with w [c][OC] */
AI void fwd_prod(int bf, const v16 *r, const int nc, const int OC, const float *w, v16 *acc)
{
    if (!bf) {
#pragma GCC unroll 16
        for (int c = 0; c < nc; c++)
#pragma GCC unroll 16
            for (int o = 0; o < OC; o++) acc[o] += r[c] * w[c * OC + o];
        return;
    }
#pragma GCC unroll 8
    for (int c = 0; c < nc; c += 2) { /* a pair: the upper channel first (VDPBF16PS) */
        const v16 lo = bf16r(r[c]), hi = bf16r(r[c + 1]);
#pragma GCC unroll 16
        for (int o = 0; o < OC; o++) acc[o] += hi * w[(c + 1) * OC + o];
#pragma GCC unroll 16
        for (int o = 0; o < OC; o++) acc[o] += lo * w[c * OC + o];
    }
}

/* y for the nv (<= 16) voxels at x (rows of C floats, C a multiple of 8):
 * wt [C][OC] (bf16: rounded), bias [OC] or NULL; OC a constant where
 * inlined (pw_forward's switch), so that the accumulators stay in
 * registers */
AI void fwd16(int bf, const float *x, int C, const int OC, const float *wt, const float *bias, float *y, int nv)
{
    v16 acc[PW_MAX_OC], r[16];
#pragma GCC unroll 16
    for (int o = 0; o < OC; o++) acc[o] = bias ? bcast(bias[o]) : (v16){0};
    for (int cb = 0; cb < C; cb += 16) {
        if (C - cb >= 16) { /* the constant 16 lets the loads and products unroll */
            load16(x, C, cb, 16, nv, r);
            transpose16(r); /* r[c]: channel cb + c of the 16 voxels */
            fwd_prod(bf, r, 16, OC, wt + (size_t)cb * OC, acc);
        } else {
            load16(x, C, cb, 8, nv, r);
            transpose16(r);
            fwd_prod(bf, r, 8, OC, wt + (size_t)cb * OC, acc);
        }
    }
    if (OC == 4 && nv == 16) { /* four classes: the 4 x 16 accumulators as 16 x 4 in four whole vectors */
        const v16 a01 = __builtin_shufflevector(acc[0], acc[1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
        const v16 b01 = __builtin_shufflevector(acc[0], acc[1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
        const v16 a23 = __builtin_shufflevector(acc[2], acc[3], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
        const v16 b23 = __builtin_shufflevector(acc[2], acc[3], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
        /* a01 lanes (voxel, class): (0,0) (0,1) (1,0) (1,1) | (4,0) (4,1) (5,0) (5,1) | ... */
        const v16 p = __builtin_shufflevector(a01, a23, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23);
        const v16 q = __builtin_shufflevector(a01, a23, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31);
        const v16 t = __builtin_shufflevector(b01, b23, 0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23);
        const v16 u = __builtin_shufflevector(b01, b23, 8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31);
        /* p: voxels 0, 1, 4, 5; t: 2, 3, 6, 7; q: 8, 9, 12, 13; u: 10, 11, 14, 15 (four floats each) */
        *(v16u *)y = __builtin_shufflevector(p, t, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
        *(v16u *)(y + 16) = __builtin_shufflevector(p, t, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
        *(v16u *)(y + 32) = __builtin_shufflevector(q, u, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
        *(v16u *)(y + 48) = __builtin_shufflevector(q, u, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
        return;
    }
#pragma GCC unroll 16
    for (int o = 0; o < 16; o++) r[o] = o < OC ? acc[o] : (v16){0};
    transpose16(r); /* r[v]: the OC outputs of voxel v */
    for (int v = 0; v < nv; v++) ts_nn_vst_part(y + (size_t)v * OC, r[v], OC);
}

/* CALL(n) with the constant n = oc (1 .. 16; conv_impl.h's switch for 1 .. 15);
 * without AVX-512 the one call with oc as it is: 16 copies of each kernel on
 * two registers a vector took minutes to compile (kernel_opt.h) */
#ifdef __AVX512F__
#define PW_OC_SWITCH(oc, CALL)                                                                                       \
    if ((oc) == 16) CALL(16);                                                                                        \
    else TS_NP_SWITCH(oc, CALL)
#else
#define PW_OC_SWITCH(oc, CALL) CALL(oc);
#endif

int ts_nn_pw_forward(int bf, const ts_conv_geom *g, const float *x, const float *w, const float *bias, float *y)
{
    atomic_fetch_add(&pw_calls, 1);
    const int C = g->C, OC = g->OC;
    const size_t V = (size_t)g->N * g->D * g->H * g->W, nb = (V + 15) / 16;
    float *wt = ts_nn_scratch(1, (size_t)C * OC * sizeof(float));
    if (!wt) return TS_ERR(TS_ERR_NOMEM, "pointwise conv weights");
    for (int c = 0; c < C; c++)
        for (int o = 0; o < OC; o++) wt[(size_t)c * OC + o] = bf ? bf16r1(w[(size_t)o * C + c]) : w[(size_t)o * C + c];
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        const size_t v0 = b * 16;
        const int nv = V - v0 < 16 ? (int)(V - v0) : 16;
#define PW_F(n) (bf ? fwd16(1, x + v0 * C, C, n, wt, bias, y + v0 * OC, nv) : fwd16(0, x + v0 * C, C, n, wt, bias, y + v0 * OC, nv))
        PW_OC_SWITCH(OC, PW_F)
#undef PW_F
    }
    return 0;
}

/* n floats of src rounded to bf16 into d (returned) */
static float *round_n(const float *src, size_t n, float *d)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const v16 t = bf16r(ld(src + i));
        memcpy(d + i, &t, sizeof t);
    }
    for (; i < n; i++) d[i] = bf16r1(src[i]);
    return d;
}

enum { PW_DBLK = 64 }; /* voxels per dgrad block */

/* dx of the nv voxels at g (OC output gradients each; bf16: rounded):
 * wr [OC][Cp] (Cp: C rounded up to 16, zeros after C; bf16: rounded);
 * streaming stores where nt (dx is not read again soon, and a whole
 * head's input gradient is larger than the caches) */
AI void dgrad_blk(int bf, const float *g, int nv, int C, int Cp, const int OC, const float *wr, float *dx, int nt)
{
    for (int v = 0; v < nv; v++)
        for (int cb = 0; cb < C; cb += 16) {
            const float *d = g + (size_t)v * OC;
            v16 acc = (v16){0};
            if (!bf) {
#pragma GCC unroll 16
                for (int o = 0; o < OC; o++) acc += d[o] * ld(wr + (size_t)o * Cp + cb);
            } else {
#pragma GCC unroll 8
                for (int o = 0; o < OC; o += 2) { /* acc is never -0 here: a missing partner's +0 changes nothing */
                    if (o + 1 < OC) acc += d[o + 1] * ld(wr + (size_t)(o + 1) * Cp + cb);
                    acc += d[o] * ld(wr + (size_t)o * Cp + cb);
                }
            }
            if (C - cb < 16) ts_nn_vst_part(dx + (size_t)v * C + cb, acc, 8); /* the last 8 of an odd multiple of 8 */
            else if (nt) st_nt(dx + (size_t)v * C + cb, acc);
            else memcpy(dx + (size_t)v * C + cb, &acc, sizeof acc);
        }
}

int ts_nn_pw_dgrad(int bf, const ts_conv_geom *g, const float *dy, const float *w, float *dx)
{
    atomic_fetch_add(&pw_calls, 1);
    const int C = g->C, OC = g->OC, Cp = ts_nn_pad16(C);
    const size_t V = (size_t)g->N * g->D * g->H * g->W, nb = (V + PW_DBLK - 1) / PW_DBLK;
    float *wr = ts_nn_scratch(1, (size_t)OC * Cp * sizeof(float));
    if (!wr) return TS_ERR(TS_ERR_NOMEM, "pointwise conv weights");
    memset(wr, 0, (size_t)OC * Cp * sizeof(float));
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) wr[(size_t)o * Cp + c] = bf ? bf16r1(w[(size_t)o * C + c]) : w[(size_t)o * C + c];
    const int nt = ((uintptr_t)dx & 63) == 0 && C % 16 == 0; /* rows of C floats: every vector aligned */
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        const size_t v0 = b * PW_DBLK;
        const int nv = V - v0 < PW_DBLK ? (int)(V - v0) : PW_DBLK;
        const float *gb = dy + v0 * OC;
        float d[PW_DBLK * PW_MAX_OC];
        if (bf) gb = round_n(gb, (size_t)nv * OC, d);
#define PW_D(n) (bf ? dgrad_blk(1, gb, nv, C, Cp, n, wr, dx + v0 * C, nt) : dgrad_blk(0, gb, nv, C, Cp, n, wr, dx + v0 * C, nt))
        PW_OC_SWITCH(OC, PW_D)
#undef PW_D
    }
#ifdef __AVX512F__
    _mm_sfence(); /* the streaming stores before anything reads dx */
#endif
    return 0;
}

/* the sums of one block of voxels [v0, v1) into part [C][OC]: per 16
 * channels, two accumulator sets (even and odd voxels), then their sum */
AI void wgrad_blk(int bf, const float *x, const float *dy, int C, const int OC, size_t v0, size_t v1, float *part)
{
    const int nv = (int)(v1 - v0);
    const float *gb = dy + v0 * OC;
    x += v0 * C;
    float d[PW_BLK * PW_MAX_OC]; /* bf16: the block's dy rounded */
    if (bf) gb = round_n(gb, (size_t)nv * OC, d);
    for (int cb = 0; cb < C; cb += 16) {
        const int nc = C - cb >= 16 ? 16 : 8;
        v16 a0[PW_MAX_OC], a1[PW_MAX_OC];
#pragma GCC unroll 16
        for (int o = 0; o < OC; o++) a0[o] = a1[o] = (v16){0};
        int v = 0;
        for (; v + 1 < nv; v += 2) {
            v16 x0 = ldn(x + (size_t)v * C + cb, nc), x1 = ldn(x + (size_t)(v + 1) * C + cb, nc);
            if (bf) {
                x0 = bf16r(x0);
                x1 = bf16r(x1);
            }
            const float *g0 = gb + (size_t)v * OC, *g1 = g0 + OC;
#pragma GCC unroll 16
            for (int o = 0; o < OC; o++) {
                a0[o] += x0 * g0[o];
                a1[o] += x1 * g1[o];
            }
        }
        if (v < nv) {
            const v16 x0 = bf ? bf16r(ldn(x + (size_t)v * C + cb, nc)) : ldn(x + (size_t)v * C + cb, nc);
#pragma GCC unroll 16
            for (int o = 0; o < OC; o++) a0[o] += x0 * gb[(size_t)v * OC + o];
        }
        for (int o = 0; o < OC; o++) {
            float t[16];
            const v16 s = a0[o] + a1[o];
            memcpy(t, &s, sizeof t);
            for (int c = 0; c < nc; c++) part[(size_t)(cb + c) * OC + o] += t[c];
        }
    }
}

int ts_nn_pw_wgrad(int bf, const ts_conv_geom *g, const float *x, const float *dy, float *dwp)
{
    atomic_fetch_add(&pw_calls, 1);
    const int C = g->C, OC = g->OC;
    const size_t V = (size_t)g->N * g->D * g->H * g->W, n = (size_t)C * OC;
    float *parts = ts_nn_scratch(0, PW_CHUNKS * n * sizeof(float));
    if (!parts) return TS_ERR(TS_ERR_NOMEM, "pointwise conv weight-gradient sums");
    memset(parts, 0, PW_CHUNKS * n * sizeof(float));
#pragma omp parallel for schedule(dynamic, 1)
    for (int ch = 0; ch < PW_CHUNKS; ch++) {
        const size_t e = V * (size_t)(ch + 1) / PW_CHUNKS;
        for (size_t v0 = V * (size_t)ch / PW_CHUNKS; v0 < e; v0 += PW_BLK) {
            const size_t v1 = v0 + PW_BLK < e ? v0 + PW_BLK : e;
#define PW_W(k) (bf ? wgrad_blk(1, x, dy, C, k, v0, v1, parts + ch * n) : wgrad_blk(0, x, dy, C, k, v0, v1, parts + ch * n))
            PW_OC_SWITCH(OC, PW_W)
#undef PW_W
        }
    }
    for (size_t i = 0; i < n; i++) {
        float s = 0;
        for (int ch = 0; ch < PW_CHUNKS; ch++) s += parts[(size_t)ch * n + i];
        dwp[i] = s;
    }
    return 0;
}
#ifdef TS_PW_NO_UBSAN
#pragma clang attribute pop
#endif
