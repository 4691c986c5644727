/* AMX (Intel Advanced Matrix Extensions) tiles for the bf16 convolutions:
 * where the CPU has AMX-TILE and AMX-BF16 and the kernel grants the tile
 * data state (Linux's arch_prctl ARCH_REQ_XCOMP_PERM), TDPBF16PS
 * multiplies a 16 x 16-pair tile by a 16-pair x 16 tile, 512 bf16
 * products summed into 256 fp32 accumulators an instruction (VDPBF16PS:
 * 32). Used by the gathers (ts_nn_gather2_bf16: forward and input
 * gradient; the transposed convolution's forward and input gradient) and
 * the weight gradient (ts_nn_wgrad2 in bf16, 8+ input channels); the rest
 * of the bf16 kernels stay on VDPBF16PS.
 *
 * Gathers: the layouts are those of the VDPBF16PS kernels (conv_impl.h,
 * ts_bf16_gc_args), which are what the tiles want: a slab row holds each
 * voxel's C channel pairs contiguous (an A tile: 16 voxels, rows s*C words
 * apart), the packed weights [tap][C][ocp] a tap's pairs as rows of the
 * output channels (a B tile: 16 rows of 16 words, ocp words apart). At
 * stride 1 the k kw taps of a (kd, kh) read k*C consecutive words of a
 * slab row and k*C consecutive weight rows, so they are one reduction of
 * k*C pairs in chunks of 16. A chunk of fewer than 16 pairs uses tiles
 * configured for its width, so nothing past a reduction is read into a
 * product. At most 8 output channels (3x3x3, stride 1) put two output
 * voxels in a tile row (ts_nn_amx_gather_pairs).
 *
 * Weight gradient: the sum runs over output voxels, so an item's output
 * gradient pairs (voxel pairs, the VDPBF16PS layout) are transposed to
 * rows of output channels (A) and the voxel-pair slab is read as B
 * (ts_nn_amx_wgrad_item).
 *
 * Numerics: the products of bf16 operands are exact in fp32 and summed in
 * fp32 as VDPBF16PS does, in the hardware's order, which is not the
 * VDPBF16PS tiles' order: results are not bitwise those of the avx512bf16
 * and emulated variants (they differ by fp32 rounding, ~1e-7 relative;
 * tests/nn/test_layers.c and test_split.c check them against double
 * references and unsplit convolutions). The instruction treats bf16
 * subnormal inputs as zero. A gather's output voxel has its sum in the
 * same order wherever the voxel lies in a tile, so the gathers do not
 * depend on the thread count or on a spatial split; the weight gradient's
 * items and chunks are the driver's, fixed by the shapes, so it does not
 * depend on the thread count.
 *
 * A tile row past the output row (the row's last, partial tile) reads up
 * to 32 s C words past the slab row's end: the callers' slabs keep that
 * margin (TS_NN_AMX_MARGIN), and those rows' results are not stored. */
#include "tsbuild.h"
#include "src/nn/conv_impl.h"

#include <stdint.h>
#include <string.h>

/* The voxel-pair tiles' weights (ts_nn_amx_gather_pairs, below): plain C,
 * built wherever the driver is */
void ts_nn_amx_pair_weights(const uint32_t *wp, int C, int ocp, int OC, uint32_t *wq)
{
    for (int t = 0; t < 9; t++)
        for (int j = 0; j < 4; j++)
            for (int c = 0; c < C; c++) {
                uint32_t *d = wq + ((size_t)t * 4 * C + (size_t)j * C + c) * 16;
                for (int e = 0; e < 2; e++)
                    for (int o = 0; o < 8; o++) {
                        const int kw = j - e;
                        d[e * 8 + o] = kw >= 0 && kw < 3 && o < OC ? wp[((size_t)(t * 3 + kw) * C + c) * ocp + o] : 0;
                    }
            }
}

#if TS_AMX_X86
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

/* the 64-byte operand of LDTILECFG, palette 1 */
typedef struct amx_cfg {
    uint8_t palette, start;
    uint8_t res[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* Tiles: 0, 1 accumulators (16 voxels x 16 channels, fp32). Two output
 * channel tiles side by side (mode N2): 2 the voxels' pairs (A), 3 and 4
 * the two channel tiles' weights (B); one channel tile, two voxel tiles
 * (mode M2): 2 and 3 the two voxel tiles (A), 4 the weights (B). 5, 6, 7:
 * the same for a chunk of rem < 16 pairs (N2: 5 A, 6 and 7 B; M2: 5 and 6
 * A, 7 B). The configuration is per thread; LDTILECFG zeroes the tiles. */
static _Thread_local int cfg_key = -1;

static void amx_config(int m2, int rem)
{
    const int key = m2 * 16 + rem;
    if (cfg_key == key) return;
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 5; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    if (rem) {
        const int arow = 4 * rem; /* bytes of an A row: rem pairs */
        c.rows[5] = 16, c.colsb[5] = (uint16_t)arow;
        if (m2) c.rows[6] = 16, c.colsb[6] = (uint16_t)arow;
        else c.rows[6] = (uint8_t)rem, c.colsb[6] = 64;
        c.rows[7] = (uint8_t)rem, c.colsb[7] = 64;
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(c) : "memory");
    cfg_key = key;
}

/* the tile instructions as asm with memory operands the compiler sees
 * (GCC 12's intrinsics declare none: a store read back could be moved) */
#define TLOAD(t, p, st) __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(p), "r"((long)(st)) : "memory")
#define TSTORE(t, p, st) __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(p), "r"((long)(st)) : "memory")
#define TZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define TDP(c, x, w) __asm__ volatile("tdpbf16ps %%tmm" #w ", %%tmm" #x ", %%tmm" #c ::)

static inline int imin(int a, int b) { return a < b ? a : b; }

/* one reduction segment into the accumulators: K pairs from the A rows at
 * x (astep bytes apart; the second voxel tile 16 rows on, x2) and the B
 * rows at w (bstep bytes apart; the second channel tile 16 words on) */
static inline void segment(int m2, int two, const uint32_t *x, const uint32_t *x2, const uint32_t *w, int K, long astep,
                           long bstep)
{
    /* one chunk at kk on tiles A, B, C: N2 A the voxels, B and C the two channel tiles' weights; M2 A and B the
     * two voxel tiles, C the weights (the instructions name their tiles, so the numbers are macro arguments) */
#define SEG_STEP(A, B, C)                                                                                               \
    do {                                                                                                                \
        const uint32_t *wk = w + (size_t)kk * (size_t)(bstep / 4);                                                      \
        TLOAD(A, x + kk, astep);                                                                                        \
        if (!m2) {                                                                                                      \
            TLOAD(B, wk, bstep);                                                                                        \
            TDP(0, A, B);                                                                                               \
            if (two) {                                                                                                  \
                TLOAD(C, wk + 16, bstep);                                                                               \
                TDP(1, A, C);                                                                                           \
            }                                                                                                           \
        } else {                                                                                                        \
            TLOAD(C, wk, bstep);                                                                                        \
            TDP(0, A, C);                                                                                               \
            if (two) {                                                                                                  \
                TLOAD(B, x2 + kk, astep);                                                                               \
                TDP(1, B, C);                                                                                           \
            }                                                                                                           \
        }                                                                                                               \
    } while (0)
    int kk = 0;
    for (; kk + 16 <= K; kk += 16) SEG_STEP(2, 3, 4);
    if (kk < K) SEG_STEP(5, 6, 7); /* the remainder: tiles 5, 6, 7 configured for it */
#undef SEG_STEP
}

/* the accumulator tile `buf` (16 x 16 floats) into rows ow0 .. ow0+nv-1 of
 * y at channel yo, nco channels, plus the bias (b: its 16 channels) */
TS_BF16_TARGET static inline void put_tile(const float *buf, int nv, int nco, const float *b, float *y, int ldy)
{
    const __mmask16 k = (__mmask16)((1u << nco) - 1);
    const __m512 bv = b ? _mm512_maskz_loadu_ps(k, b) : _mm512_setzero_ps();
    for (int i = 0; i < nv; i++) _mm512_mask_storeu_ps(y + (size_t)i * ldy, k, _mm512_add_ps(_mm512_load_ps(buf + 16 * i), bv));
}

/* one block: voxels ow0 .. (16 or 32 of them, M2) x channels oc .. (16 or
 * 32, N2), `two`: whether the second tile of the block exists */
TS_BF16_TARGET static void block(const ts_bf16_gc_args *a, int m2, int two, int r, int ow0, int nv0, int nv1, int oc, int nco0, int nco1,
                  float *y0, float *y1, int ldy)
{
    const int k = a->k, s = a->s, C = a->C, ocp = a->ocp;
    const long astep = 4L * s * C, bstep = 4L * ocp;
    const size_t tapw = (size_t)C * ocp;
    TZERO(0);
    TZERO(1);
    for (int kd = 0; kd < k; kd++)
        for (int kh = 0; kh < k; kh++) {
            const uint32_t *row = a->plane[kd] + (size_t)(r * s + kh) * a->rstride;
            const uint32_t *wt = a->wp + (size_t)((kd * k + kh) * k) * tapw + oc;
            if (s == 1) { /* the k kw taps: k C consecutive pairs of the row and weight rows */
                const uint32_t *x = row + (size_t)ow0 * C;
                segment(m2, two, x, x + (size_t)16 * C, wt, k * C, astep, bstep);
            } else {
                for (int kw = 0; kw < k; kw++) {
                    const uint32_t *x = row + ((size_t)ow0 * s + kw) * C;
                    segment(m2, two, x, x + (size_t)16 * s * C, wt + (size_t)kw * tapw, C, astep, bstep);
                }
            }
        }
    float buf[2][256] __attribute__((aligned(64)));
    TSTORE(0, buf[0], 64);
    TSTORE(1, buf[1], 64);
    const float *b = a->bias ? a->bias + oc : NULL;
    put_tile(buf[0], nv0, nco0, b, y0, ldy);
    if (two) put_tile(buf[1], m2 ? nv1 : nv0, nco1, b ? (m2 ? b : b + 16) : NULL, y1, ldy);
}

void ts_nn_amx_gather_row(const ts_bf16_gc_args *a, int r, int OW, int oc0, int oc1, int OC, float *yr, int yo0, int ldy)
{
    const int ntile = (ts_nn_pad16(oc1) - oc0) / 16, last = imin(oc1, OC);
    const int K = a->s == 1 ? a->k * a->C : a->C, m2 = ntile < 2;
    amx_config(m2, K % 16);
    if (m2) { /* one channel tile: two voxel tiles a block */
        const int nco = last - oc0;
        for (int ow = 0; ow < OW; ow += 32) {
            const int nv0 = imin(16, OW - ow), nv1 = imin(16, OW - ow - 16);
            block(a, 1, nv1 > 0, r, ow, nv0, nv1, oc0, nco, nco, yr + (size_t)ow * ldy + yo0,
                  yr + (size_t)(ow + 16) * ldy + yo0, ldy);
        }
        return;
    }
    for (int ow = 0; ow < OW; ow += 16) {
        const int nv = imin(16, OW - ow);
        for (int oc = oc0; oc < oc0 + 16 * ntile; oc += 32) {
            const int two = oc + 16 < oc0 + 16 * ntile, nco0 = imin(16, last - oc), nco1 = two ? imin(16, last - oc - 16) : 0;
            float *y0 = yr + (size_t)ow * ldy + yo0 + (oc - oc0);
            block(a, 0, two, r, ow, nv, nv, oc, nco0, nco1, y0, y0 + 16, ldy);
        }
    }
}

/* At most 8 output channels, 3x3x3 stride 1: two output voxels a tile row.
 * Row u of an A tile is slab columns 2u .. 2u+3 (4 C consecutive pairs),
 * column e * 8 + o of the B tile channel o of voxel 2u + e, whose weights
 * for column j are tap kw = j - e (zero where that is not 0 .. 2):
 * wq[kd kh][j C + c][e 8 + o]. So a tile is 32 voxels x 8 channels with
 * 4 C pairs a row (8 channels: 16, one whole tile; the direct tiles had 12
 * of 16 pairs and 8 of 16 channels), a quarter of the products zeros. */
TS_BF16_TARGET void ts_nn_amx_gather_pairs(const ts_bf16_gc_args *a, int r, int OW, int OC, float *y, int yo, int ldy)
{
    const int C = a->C, K = 4 * C, nu = (OW + 1) / 2;
    const long astep = 8L * C, bstep = 64;
    amx_config(1, K % 16);
    const __mmask16 k8 = (__mmask16)((1u << OC) - 1);
    __m512 bv = _mm512_setzero_ps();
    if (a->bias) {
        const __m256 b8 = _mm256_maskz_loadu_ps((__mmask8)k8, a->bias);
        bv = _mm512_insertf32x8(_mm512_castps256_ps512(b8), b8, 1);
    }
    float buf[2][256] __attribute__((aligned(64)));
    for (int u0 = 0; u0 < nu; u0 += 32) {
        const int two = u0 + 16 < nu;
        TZERO(0);
        TZERO(1);
        for (int kd = 0; kd < 3; kd++)
            for (int kh = 0; kh < 3; kh++) {
                const uint32_t *x = a->plane[kd] + (size_t)(r + kh) * a->rstride + (size_t)2 * u0 * C;
                segment(1, two, x, x + (size_t)32 * C, a->wq + (size_t)(kd * 3 + kh) * K * 16, K, astep, bstep);
            }
        TSTORE(0, buf[0], 64);
        TSTORE(1, buf[1], 64);
        for (int i = 0; i < 32 && u0 + i < nu; i++) {
            const __m512 v = _mm512_add_ps(_mm512_load_ps(buf[i >> 4] + 16 * (i & 15)), bv);
            const int v0 = 2 * (u0 + i);
            _mm512_mask_storeu_ps(y + (size_t)v0 * ldy + yo, k8, v);
            if (v0 + 1 < OW) _mm512_mask_storeu_ps(y + (size_t)(v0 + 1) * ldy + yo, k8, _mm512_shuffle_f32x4(v, v, 0x4e));
        }
    }
}

/* ------------------------------------------------ the weight gradient */

/* words of a transposed output-gradient row (ts_nn_amx_wgrad_item) */
static inline size_t gt_ld(const ts_bf16_wg_args *a) { return (size_t)((a->nm1 + 15) & ~15); }

size_t ts_nn_amx_wgrad_scratch(int rows, int ocp, int OW)
{
    const size_t ld = (size_t)((OW / 2 + 1 + 15) & ~15);
    return (size_t)2 * rows * ocp * ld;
}

/* The item's output-gradient pairs transposed, the reduction along rows:
 * ge[q][oc][m] = pair m (g[2m], g[2m+1]) of channel oc in row q (a->g's
 * word [q nm + m][oc]; zero from nm0 on), go[q][oc][m] = (g[2m-1], g[2m])
 * made from ge's words m - 1 and m (the VDPBF16PS tiles' shift) */
/* 16 x 16 words: row i of dst (ldd words apart) = column i of the 16 rows
 * at src (lds words apart); unpacks within 128-bit lanes, then lane
 * shuffles */
TS_BF16_TARGET static inline void tr16(const uint32_t *src, size_t lds, uint32_t *dst, size_t ldd)
{
    __m512i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(src + (size_t)i * lds);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        t[j] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);
        t[4 + j] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);
        t[8 + j] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
        t[12 + j] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
    }
    for (int j = 0; j < 4; j++) {
        _mm512_storeu_si512(dst + (size_t)j * ldd, _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88));
        _mm512_storeu_si512(dst + (size_t)(8 + j) * ldd, _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd));
        _mm512_storeu_si512(dst + (size_t)(4 + j) * ldd, _mm512_shuffle_i32x4(t[4 + j], t[12 + j], 0x88));
        _mm512_storeu_si512(dst + (size_t)(12 + j) * ldd, _mm512_shuffle_i32x4(t[4 + j], t[12 + j], 0xdd));
    }
}

/* The blocks of 16 pairs read up to 15 entries past a row's nm0 (the
 * rows' zero tail, the next row, or the driver's buffers after the last:
 * in the scratch), then set to zero. */
TS_BF16_TARGET static void transpose_g(const ts_bf16_wg_args *a, uint32_t *gt)
{
    const int nq = a->np * a->nr, ocp = a->ocp, nm0 = a->nm0, nm1 = a->nm1;
    const size_t ld = gt_ld(a), half = (size_t)nq * ocp * ld;
    for (int q = 0; q < nq; q++) {
        const uint32_t *gr = a->g + (size_t)q * a->nm * ocp;
        uint32_t *ge = gt + (size_t)q * ocp * ld, *go = ge + half;
        for (int m0 = 0; m0 < nm0; m0 += 16)
            for (int oc = 0; oc < ocp; oc += 16) tr16(gr + (size_t)m0 * ocp + oc, (size_t)ocp, ge + (size_t)oc * ld + m0, ld);
        for (int oc = 0; oc < ocp; oc++) {
            uint32_t *e = ge + (size_t)oc * ld;
            for (int m = nm0; m < nm1; m++) e[m] = 0;
        }
        for (int oc = 0; oc < ocp; oc++) {
            const uint32_t *e = ge + (size_t)oc * ld;
            uint32_t *o = go + (size_t)oc * ld;
            o[0] = e[0] << 16;
            for (int m = 1; m < nm1; m++) o[m] = (e[m - 1] >> 16) | (e[m] << 16);
        }
    }
}

/* dw[tap][c][oc] += the accumulator tile buf[oc][c] (16 x 16) for c < nc */
static inline void add_tile_t(const float *buf, int nc, float *dwt, int ocp)
{
    for (int j = 0; j < nc; j++) {
        float *d = dwt + (size_t)j * ocp;
        for (int i = 0; i < 16; i++) d[i] += buf[16 * i + j];
    }
}

void ts_nn_amx_wgrad_item(const ts_bf16_wg_args *a, int p0, int pairs, uint32_t *gt)
{
    transpose_g(a, gt);
    const int k = a->k, s = a->s, C = a->C, ocp = a->ocp, nq = a->np * a->nr;
    const size_t ld = gt_ld(a), half = (size_t)nq * ocp * ld;
    const long astep = 4L * (long)ld, bstep = 4L * s * C;
    const int m2 = ocp >= 32; /* two output-channel tiles a block, else up to two channel tiles */
    float buf[2][256] __attribute__((aligned(64)));
    for (int e = 0; e < 2; e++) {
        const int K = e ? a->nm1 : a->nm0;
        int any = 0;
        for (int kw = 0; kw < k; kw++) any |= (kw % (2 * s) >= s) == e;
        if (!any || K == 0) continue;
        amx_config(m2, K % 16);
        const uint32_t *g0 = gt + (e ? half : 0);
        for (int pr = p0; pr < p0 + pairs; pr++) {
            const int kd = pr / k, kh = pr % k;
            for (int kw = 0; kw < k; kw++) {
                const int blk = kw / (2 * s), rm = kw % (2 * s), r = rm - s * (rm >= s);
                if ((rm >= s) != e) continue;
                float *dwt = a->dw + (size_t)((kd * k + kh) * k + kw) * C * ocp;
                for (int oc = 0; oc < ocp; oc += m2 ? 32 : 16)
                    for (int c = 0; c < C; c += m2 ? 16 : 32) {
                        const int two = m2 ? oc + 16 < ocp : c + 16 < C;
                        TZERO(0);
                        TZERO(1);
                        for (int q = 0, pl = 0, rr = 0; q < nq; q++, rr = rr + 1 == a->nr ? (pl++, 0) : rr + 1) {
                            const uint32_t *xr = a->plane[pl * s + kd] + (size_t)(rr * s + kh) * a->rstride +
                                                 ((size_t)blk * s + r) * C + c;
                            const uint32_t *ga = g0 + ((size_t)q * ocp + oc) * ld;
                            segment(m2, two, ga, ga + 16 * ld, xr, K, astep, bstep);
                        }
                        TSTORE(0, buf[0], 64);
                        TSTORE(1, buf[1], 64);
                        add_tile_t(buf[0], imin(16, C - c), dwt + (size_t)c * ocp + oc, ocp);
                        if (two) {
                            if (m2) add_tile_t(buf[1], imin(16, C - c), dwt + (size_t)c * ocp + oc + 16, ocp);
                            else add_tile_t(buf[1], imin(16, C - c - 16), dwt + (size_t)(c + 16) * ocp + oc, ocp);
                        }
                    }
            }
        }
    }
}

/* The peak probe's kernel (src/nn/peak.c): n rounds of four independent
 * TDPBF16PS chains on 16 x 32 tiles, 4 * 16 * 16 * 32 * 2 FLOP a round;
 * the configuration is its own (the gathers' is loaded again after it). */
float ts_nn_amx_chains(long n)
{
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(c) : "memory");
    cfg_key = -1;
    static const uint16_t one[16 * 32] __attribute__((aligned(64))) = {0}; /* zeros: the sums stay finite */
    float out[256] __attribute__((aligned(64)));
    TLOAD(4, one, 64);
    TLOAD(5, one, 64);
    TLOAD(6, one, 64);
    TLOAD(7, one, 64);
    TZERO(0);
    TZERO(1);
    TZERO(2);
    TZERO(3);
    for (long i = 0; i < n; i++) {
        TDP(0, 4, 6);
        TDP(1, 4, 7);
        TDP(2, 5, 6);
        TDP(3, 5, 7);
    }
    TSTORE(0, out, 64);
    return out[0] + out[255];
}

/* AMX-TILE (CPUID 7.0 EDX bit 24) and AMX-BF16 (bit 22), the OS's tile
 * state (XCR0 bits 17, 18), and the kernel's permission for this process */
static int amx_probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
#ifdef __linux__
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18) */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

int ts_nn_cpu_amx(void)
{
    static int v = -1; /* racing first calls compute the same value */
    if (v < 0) v = amx_probe();
    return v;
}
#else
int ts_nn_cpu_amx(void) { return 0; }
#endif
