/* Private to winograd.c and winograd_narrow.c: the pieces of the Winograd
 * F(2x2x2, 3x3x3) convolution both use on 16-lane vectors - the weight
 * transform of one input channel (wt_chan), the input block's transform
 * B^T d B (in_tile) and the output's A^T M A (out_tile), and where a
 * transform's points go (put_pt: floats, bf16, or words of bf16 tile
 * pairs). docs/engine.md, "Winograd convolution". */
#ifndef TS_NN_WINOGRAD_IMPL_H
#define TS_NN_WINOGRAD_IMPL_H

#include "src/nn/conv_impl.h"

#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef uint32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16iu __attribute__((vector_size(64), aligned(4)));
#define AI static inline __attribute__((always_inline))
#pragma GCC diagnostic ignored "-Wpsabi" /* always inlined: no call whose ABI could differ */
AI v16 vld(const float *p) { return *(const v16u *)p; }
AI void vst(float *p, v16 v) { *(v16u *)p = v; }

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* The 64 transform points of input channel c (zeros: c >= C) for output
 * channels oc0 .. oc0 + 15 (zeros past OC), u[xi], from w [OC][C][3][3][3],
 * or with flip from w [C][OC][3][3][3] with the taps reversed (the input
 * gradient's convolution: dx = conv(dy, flipped w^T)):
 * G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1] along kw, kh, then kd;
 * xi = (a * 4 + b) * 4 + e for the kd, kh, kw rows a, b, e of G */
AI void wt_chan(const float *w, int flip, int C, int OC, int c, int oc0, v16 u[64])
{
    float kb[27][16];
    memset(kb, 0, sizeof kb);
    for (int j = 0; j < 16 && oc0 + j < OC && c < C; j++) {
        const int oc = oc0 + j;
        const float *src = w + (flip ? (size_t)c * OC + oc : (size_t)oc * C + c) * 27;
        for (int t = 0; t < 27; t++) kb[t][j] = src[flip ? 26 - t : t];
    }
    v16 t1[3][3][4], t2[3][4][4];
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            const v16 r0 = vld(kb[(a * 3 + b) * 3]), r1 = vld(kb[(a * 3 + b) * 3 + 1]), r2 = vld(kb[(a * 3 + b) * 3 + 2]);
            t1[a][b][0] = r0;
            t1[a][b][1] = 0.5f * (r0 + r1 + r2);
            t1[a][b][2] = 0.5f * (r0 - r1 + r2);
            t1[a][b][3] = r2;
        }
    for (int a = 0; a < 3; a++)
        for (int e = 0; e < 4; e++) {
            t2[a][0][e] = t1[a][0][e];
            t2[a][1][e] = 0.5f * (t1[a][0][e] + t1[a][1][e] + t1[a][2][e]);
            t2[a][2][e] = 0.5f * (t1[a][0][e] - t1[a][1][e] + t1[a][2][e]);
            t2[a][3][e] = t1[a][2][e];
        }
    for (int be = 0; be < 16; be++) {
        const int b = be / 4, e = be % 4;
        u[be] = t2[0][b][e];
        u[16 + be] = 0.5f * (t2[0][b][e] + t2[1][b][e] + t2[2][b][e]);
        u[32 + be] = 0.5f * (t2[0][b][e] - t2[1][b][e] + t2[2][b][e]);
        u[48 + be] = t2[2][b][e];
    }
}

/* ts_nn_bf16_round on 16 lanes (round to nearest even; zeros and
 * denormals to signed zero, NaN quiet), the bf16 bits in each word's low half */
AI v16i bf16_bits(v16 f)
{
    const v16i u = (v16i)f, r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const v16i z = (v16i)((u & 0x7f800000u) == 0), n = (v16i)((u & 0x7fffffffu) > 0x7f800000u);
    return (r & ~(z | n)) | ((u >> 16) & 0x8000u & z) | (((u >> 16) | 0x40u) & n);
}

/* 16 floats rounded to bf16 at dst */
AI void st_bf16(uint16_t *dst, v16 v)
{
#if TS_BF16_X86 && defined(__AVX512BF16__)
    _mm256_storeu_si256((__m256i *)dst, (__m256i)_mm512_cvtneps_pbh((__m512)v));
#else
    typedef uint16_t v16h __attribute__((vector_size(32), aligned(2)));
    *(v16h *)dst = __builtin_convertvector(bf16_bits(v), v16h);
#endif
}

/* B^T applied to four values (one dim of a 4x4x4 block) */
#define BT(d0, d1, d2, d3, r0, r1, r2, r3)                                                                           \
    do {                                                                                                             \
        const v16 d0_ = (d0), d1_ = (d1), d2_ = (d2), d3_ = (d3);                                                    \
        r0 = d0_ - d2_;                                                                                              \
        r1 = d1_ + d2_;                                                                                              \
        r2 = d2_ - d1_;                                                                                              \
        r3 = d1_ - d3_;                                                                                              \
    } while (0)

/* Where a transform's 64 points of 16 lanes go, point pt at pt * stride
 * elements: mode 0 the floats at F; 1 rounded to the bf16 at H; 2 the
 * words at Wd of bf16 pairs (lo[pt], this point), lo the points of the
 * pair's first tile ([64][16] floats; the weight gradient's tile pairs,
 * winograd_bf16.c). The mode a constant where inlined. */
typedef struct ptdst {
    float *F;
    uint16_t *H;
    uint32_t *Wd;
    const float *lo;
    size_t stride;
} ptdst;
AI void put_pt(const ptdst *d, int mode, int pt, v16 r)
{
    const size_t o = (size_t)pt * d->stride;
    if (mode == 0) vst(d->F + o, r);
    else if (mode == 1) st_bf16(d->H + o, r);
    else *(v16iu *)(d->Wd + o) = bf16_bits(vld(d->lo + 16 * pt)) | bf16_bits(r) << 16;
}


/* V[xi][t][16 cv ..] of one tile from the slab at s (its block's first
 * voxel; rows sr floats apart, planes sp, voxels cp) to d (put_pt) */
AI void in_tile(const float *s, size_t sr, size_t sp, int cp, const ptdst *d, int mode)
{
    v16 tmp[4][16];
    for (int z = 0; z < 4; z++) {
        v16 e[4][4];
        for (int y = 0; y < 4; y++) {
            const float *p = s + z * sp + y * sr;
            BT(vld(p), vld(p + cp), vld(p + 2 * cp), vld(p + 3 * cp), e[y][0], e[y][1], e[y][2], e[y][3]);
        }
        for (int x = 0; x < 4; x++) BT(e[0][x], e[1][x], e[2][x], e[3][x], tmp[z][x], tmp[z][4 + x], tmp[z][8 + x], tmp[z][12 + x]);
    }
    for (int yx = 0; yx < 16; yx++) {
        v16 r0, r1, r2, r3;
        BT(tmp[0][yx], tmp[1][yx], tmp[2][yx], tmp[3][yx], r0, r1, r2, r3);
        put_pt(d, mode, yx, r0);
        put_pt(d, mode, 16 + yx, r1);
        put_pt(d, mode, 32 + yx, r2);
        put_pt(d, mode, 48 + yx, r3);
    }
}

/* A^T = [1 1 1 0; 0 1 -1 -1] on four values */
#define AT(m0, m1, m2, m3, o0, o1)                                                                                   \
    do {                                                                                                             \
        const v16 m1_ = (m1), m2_ = (m2);                                                                            \
        o0 = (m0) + m1_ + m2_;                                                                                       \
        o1 = m1_ - m2_ - (m3);                                                                                       \
    } while (0)

/* the 2x2x2 outputs of one tile, 16 channels: o[z][y][x] from M[xi] at m
 * (points mstride floats apart) */
AI void out_tile(const float *m, size_t mstride, v16 o[2][2][2])
{
    v16 s[2][16], q[2][2][4];
    for (int yx = 0; yx < 16; yx++)
        AT(vld(m + yx * mstride), vld(m + (16 + yx) * mstride), vld(m + (32 + yx) * mstride),
           vld(m + (48 + yx) * mstride), s[0][yx], s[1][yx]);
    for (int z = 0; z < 2; z++)
        for (int x = 0; x < 4; x++) AT(s[z][x], s[z][4 + x], s[z][8 + x], s[z][12 + x], q[z][0][x], q[z][1][x]);
    for (int z = 0; z < 2; z++)
        for (int y = 0; y < 2; y++) AT(q[z][y][0], q[z][y][1], q[z][y][2], q[z][y][3], o[z][y][0], o[z][y][1]);
}

#endif
