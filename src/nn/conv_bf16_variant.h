/* One variant of the bf16 kernels (included twice by conv_bf16.c, no
 * include guard): the generated tiles and the row / tap loops over them,
 * named by BT() (_nat: AVX512-BF16, _emu: portable), the steps given by
 * BW, BX, BDP (see conv_tiles_bf16.h). Mirrors gather_row, the tgather tap
 * loop and the wgrad tap loop of conv_kernels.c. */

#include "src/nn/conv_tiles_bf16.h"

/* at most 8 output channels: NP pairs of output voxels from ow0 of tile row
 * r (the final pair's first nlast: 1 or 2), lane 2o + v channel o of voxel
 * ow0 + 2i + v; the products in the order of the gk3b tiles (kd, kh, c,
 * then kw), so the same bits (see ts_bf16_gc_args.ppl) */
BATTR __attribute__((always_inline)) void BT(gqb_tile)(const ts_bf16_gc_args *a, int NP, int r, int ow0, int nlast, int OC, float *y, int yo, int ldy)
{
    v16 acc[GQB_NP];
    const v16 b = vld(a->bq);
    const int C = a->C;
    const size_t col = (size_t)2 * C, tapw = (size_t)C * 16;
#pragma GCC unroll 16
    for (int i = 0; i < GQB_NP; i++) acc[i] = b;
    for (int kd = 0; kd < 3; kd++)
        for (int kh = 0; kh < 3; kh++) {
            const uint32_t *row = a->ppl[kd] + (size_t)(r + kh) * a->prs + (size_t)ow0 * col;
            const uint32_t *wr = a->wq + (size_t)((kd * 3 + kh) * 3) * tapw;
            for (int c = 0; c < C; c++) {
                BW(w0, wr + (size_t)c * 16);
                BW(w1, wr + tapw + (size_t)c * 16);
                BW(w2, wr + 2 * tapw + (size_t)c * 16);
                const uint32_t *xc = row + 2 * c;
#pragma GCC unroll 16
                for (int i = 0; i < GQB_NP; i++)
                    if (i < NP) {
                        { BX2(x, xc + (size_t)(2 * i) * col); BDP(acc[i], x, w0); }
                        { BX2(x, xc + (size_t)(2 * i + 1) * col); BDP(acc[i], x, w1); }
                        { BX2(x, xc + (size_t)(2 * i + 2) * col); BDP(acc[i], x, w2); }
                    }
            }
        }
#pragma GCC unroll 16
    for (int i = 0; i < GQB_NP; i++)
        if (i < NP) ts_nn_pair_store(y + (size_t)(ow0 + 2 * i) * ldy + yo, ldy, acc[i], OC, i < NP - 1 || nlast == 2);
}

BATTR_RUN void BT(gqb_row)(const ts_bf16_gc_args *a, int r, int OW, int OC, float *y, int yo, int ldy)
{
    int ow = 0;
    for (; ow + 2 * GQB_NP <= OW; ow += 2 * GQB_NP) BT(gqb_tile)(a, GQB_NP, r, ow, 2, OC, y, yo, ldy);
    const int left = OW - ow, np = (left + 1) / 2, nlast = left % 2 ? 1 : 2;
#define GQB_CALL(n) BT(gqb_tile)(a, n, r, ow, nlast, OC, y, yo, ldy)
    TS_NP_SWITCH(np, GQB_CALL)
#undef GQB_CALL
}

/* gqb_row with the pair words per voxel a constant where it is 1, 4 or 8
 * (1 or 2, 8 and 16 channels): the column addresses become immediates (as
 * GK3B_CONST below) */
#define GQB_CONST(cc)                                                                                                   \
    BATTR_RUN __attribute__((flatten)) void BT(gqb_row_c##cc)(const ts_bf16_gc_args *a, int r, int OW, int OC, float *y, \
                                                              int yo, int ldy)                                          \
    {                                                                                                                   \
        ts_bf16_gc_args b = *a;                                                                                         \
        b.C = cc;                                                                                                       \
        BT(gqb_row)(&b, r, OW, OC, y, yo, ldy);                                                                         \
    }
GQB_CONST(1)
GQB_CONST(4)
GQB_CONST(8)
#undef GQB_CONST

/* the 3x3x3 stride-1 runs with the pairs per voxel C a constant (1, 8, 16
 * or 32 pairs: the first layer's one channel, 16, 32, 64 channels): the
 * tiles' 18 input offsets i * C become immediates instead of registers
 * spilled to the stack */
#define GK3B_CONST(nv, cc)                                                                                              \
    BATTR_RUN __attribute__((flatten)) void BT(gk3b_run_##nv##_c##cc)(const ts_bf16_gc_args *a, int r, int OW, int oc, \
                                                                      int yo, int nco, float *yr, int ldy)             \
    {                                                                                                                   \
        ts_bf16_gc_args b = *a;                                                                                         \
        b.C = cc;                                                                                                       \
        BT(gk3b_run_##nv)(&b, r, OW, oc, yo, nco, yr, ldy);                                                            \
    }
GK3B_CONST(1, 1)
GK3B_CONST(1, 8)
GK3B_CONST(1, 16)
GK3B_CONST(1, 32)
GK3B_CONST(2, 8)
GK3B_CONST(2, 16)
GK3B_CONST(2, 32)
#undef GK3B_CONST

BATTR_RUN void BT(gk3b_run)(const ts_bf16_gc_args *a, int nv, int r, int OW, int oc, int yo, int nco, float *yr, int ldy)
{
#define GK3B_C(nv)                                                                                                      \
    (a->C == 8    ? BT(gk3b_run_##nv##_c8)(a, r, OW, oc, yo, nco, yr, ldy)                                              \
     : a->C == 16 ? BT(gk3b_run_##nv##_c16)(a, r, OW, oc, yo, nco, yr, ldy)                                             \
     : a->C == 32 ? BT(gk3b_run_##nv##_c32)(a, r, OW, oc, yo, nco, yr, ldy)                                             \
                  : BT(gk3b_run_##nv)(a, r, OW, oc, yo, nco, yr, ldy))
    if (nv == 2) GK3B_C(2);
    else if (a->C == 1) BT(gk3b_run_1_c1)(a, r, OW, oc, yo, nco, yr, ldy); /* the first layer's one channel */
    else GK3B_C(1);
#undef GK3B_C
}

/* the k = s = 2 gather (the up-convolutions' input gradient: 16 -> 32,
 * 32 -> 64, 64 -> 128 channels) with the kernel, stride, pairs per voxel
 * and output channels constants, as above */
#define GCB2_CONST(cc, oo, nv)                                                                                          \
    BATTR_RUN __attribute__((flatten)) void BT(gcb2_c##cc##_o##oo)(const ts_bf16_gc_args *a, int r, int OW, float *yr)  \
    {                                                                                                                   \
        ts_bf16_gc_args b = *a;                                                                                         \
        b.k = 2;                                                                                                        \
        b.s = 2;                                                                                                        \
        b.C = cc;                                                                                                       \
        b.ocp = oo;                                                                                                     \
        for (int oc = 0; oc < oo; oc += 16 * nv) BT(gcb_run_##nv)(&b, 2 * r, OW, oc, oc, 16 * nv, yr, oo);            \
    }
GCB2_CONST(8, 32, 2)
GCB2_CONST(16, 64, 4)
GCB2_CONST(32, 128, 4)
#undef GCB2_CONST

/* one output row of the gather: channel tiles oc0 .. oc1 (global channel
 * index for the weights) written at channel yo0 of rows of ldy floats */
BATTR_RUN void BT(gather_row)(const ts_bf16_gc_args *a, int k3s1, int r, int OW, int oc0, int oc1, int OC, float *yr,
                              int yo0, int ldy)
{
    if (a->ppl && k3s1 && oc0 == 0 && oc1 == OC) {
        if (a->C == 4) BT(gqb_row_c4)(a, r, OW, OC, yr, yo0, ldy);
        else if (a->C == 8) BT(gqb_row_c8)(a, r, OW, OC, yr, yo0, ldy);
        else if (a->C == 1) BT(gqb_row_c1)(a, r, OW, OC, yr, yo0, ldy);
        else BT(gqb_row)(a, r, OW, OC, yr, yo0, ldy);
        return;
    }
    if (!k3s1 && a->k == 2 && a->s == 2 && oc0 == 0 && oc1 == OC && ldy == OC && yo0 == 0 && a->ocp == OC) {
        const int C = a->C;
        if (C == 8 && OC == 32) {
            BT(gcb2_c8_o32)(a, r, OW, yr);
            return;
        }
        if (C == 16 && OC == 64) {
            BT(gcb2_c16_o64)(a, r, OW, yr);
            return;
        }
        if (C == 32 && OC == 128) {
            BT(gcb2_c32_o128)(a, r, OW, yr);
            return;
        }
    }
    for (int oc = oc0; oc < oc1;) {
        const int lanes = ts_nn_pad16(oc1) - oc, yo = yo0 + oc - oc0;
        if (k3s1) { /* 3x3x3, stride 1: broadcasts shared across kw */
            const int nv = lanes >= 32 ? 2 : 1, nco = imin(16 * nv, imin(oc1, OC) - oc);
            BT(gk3b_run)(a, nv, r, OW, oc, yo, nco, yr, ldy);
            oc += 16 * nv;
        } else {
            const int nv = nv_for(lanes), nco = imin(16 * nv, imin(oc1, OC) - oc);
            if (nv == 4) BT(gcb_run_4)(a, r * a->s, OW, oc, yo, nco, yr, ldy);
            else if (nv == 2) BT(gcb_run_2)(a, r * a->s, OW, oc, yo, nco, yr, ldy);
            else BT(gcb_run_1)(a, r * a->s, OW, oc, yo, nco, yr, ldy);
            oc += 16 * nv;
        }
    }
}

/* one tap of the transposed gather: input columns lo .. hi-1 of row xr */
BATTR_RUN void BT(tgather_tap)(const uint32_t *xr, const uint32_t *wr, int C, int ocp, int s, int off, int lo, int hi,
                               int OC, float *yr)
{
    for (int oc0 = 0; oc0 < ocp;) {
        const int nv = nv_for(ocp - oc0), nco = imin(16 * nv, OC - oc0);
        if (nv == 4) BT(tgb_run_4)(xr, wr, C, ocp, s, off, lo, hi, oc0, nco, yr, OC);
        else if (nv == 2) BT(tgb_run_2)(xr, wr, C, ocp, s, off, lo, hi, oc0, nco, yr, OC);
        else BT(tgb_run_1)(xr, wr, C, ocp, s, off, lo, hi, oc0, nco, yr, OC);
        oc0 += 16 * nv;
    }
}

/* k = s = 2: one output row from input row xr (W voxels) and the two kw
 * taps at wr, every output-channel tile, from the bias b (ocp floats) */
BATTR_RUN void BT(tgather_k2_any)(const uint32_t *xr, const uint32_t *wr, const float *b, int C, int ocp, int W, int OC,
                                  float *yr)
{
    for (int oc0 = 0; oc0 < ocp;) {
        const int nv = nv_for(ocp - oc0), nco = imin(16 * nv, OC - oc0);
        if (nv == 4) BT(tg2b_run_4)(xr, wr, b, C, ocp, W, oc0, nco, yr, OC);
        else if (nv == 2) BT(tg2b_run_2)(xr, wr, b, C, ocp, W, oc0, nco, yr, OC);
        else BT(tg2b_run_1)(xr, wr, b, C, ocp, W, oc0, nco, yr, OC);
        oc0 += 16 * nv;
    }
}

/* the U-Net's up-convolutions (32 -> 16, 64 -> 32, 128 -> 64 channels) with
 * the pairs per input voxel and the output channels constants: the tiles'
 * input offsets and output addresses become immediates (a tile's 16
 * channel pairs left the loop too short to hide their set-up) */
#define TK2_CONST(cc, oo)                                                                                               \
    BATTR_RUN __attribute__((flatten)) void BT(tgather_k2_c##cc##_o##oo)(const uint32_t *xr, const uint32_t *wr,         \
                                                                         const float *b, int W, float *yr)              \
    {                                                                                                                   \
        BT(tgather_k2_any)(xr, wr, b, cc, oo, W, oo, yr);                                                               \
    }
TK2_CONST(16, 16)
TK2_CONST(32, 32)
TK2_CONST(64, 64)
#undef TK2_CONST

BATTR_RUN void BT(tgather_k2_row)(const uint32_t *xr, const uint32_t *wr, const float *b, int C, int ocp, int W, int OC,
                                  float *yr)
{
    if (C == 16 && OC == 16) BT(tgather_k2_c16_o16)(xr, wr, b, W, yr);
    else if (C == 32 && OC == 32) BT(tgather_k2_c32_o32)(xr, wr, b, W, yr);
    else if (C == 64 && OC == 64) BT(tgather_k2_c64_o64)(xr, wr, b, W, yr);
    else BT(tgather_k2_any)(xr, wr, b, C, ocp, W, OC, yr);
}

/* one input channel (the first layer), 3x3x3 stride 1, one output vector:
 * all 27 taps at once, 27 independent sums (wk3b_1x1, one (kd, kh) at a
 * time, has three, and waits on VDPBF16PS's latency), each tap's sum in
 * wk3b_1x1's order (rows, then voxel pairs): the same bits */
BATTR_RUN void BT(wgrad_c1)(const ts_bf16_wg_args *a)
{
    const int nm = a->nm, nx = a->nx;
    float *dw = a->dw; /* [27][1][16] */
    v16 acc[27];
#pragma GCC unroll 27
    for (int t = 0; t < 27; t++) acc[t] = *(v16 *)(dw + (size_t)t * 16);
    for (int q = 0, pl = 0, rr = 0; q < a->np * a->nr; q++, rr = rr + 1 == a->nr ? (pl++, 0) : rr + 1) {
        const uint32_t *xr[9];
#pragma GCC unroll 9
        for (int p = 0; p < 9; p++) xr[p] = a->plane[pl + p / 3] + (size_t)(rr + p % 3) * a->rstride;
        const uint32_t *gr = a->g + (size_t)q * nm * 16;
        BWZERO(gm0);
        for (int m = 0; m < nx; m++) {
            BW(g00, gr + (size_t)m * 16);
            BWSHIFT(g10, g00, gm0);
#pragma GCC unroll 9
            for (int p = 0; p < 9; p++) {
                BX(x, xr[p] + m);
                BDP(acc[3 * p], x, g00);
                BDP(acc[3 * p + 1], x, g10);
                BDP(acc[3 * p + 2], x, gm0);
            }
            BWSET(gm0, g00);
        }
    }
#pragma GCC unroll 27
    for (int t = 0; t < 27; t++) *(v16 *)(dw + (size_t)t * 16) = acc[t];
}

/* all kw taps and output-channel tiles of the weight gradient at (kd, kh) */
BATTR_RUN void BT(wgrad_pair)(const ts_bf16_wg_args *a, int kd, int kh, int k3s1)
{
    if (k3s1 && a->ocp == 16) { /* 3x3x3 stride 1, one output vector: the three kw taps together */
        BT(wk3b_run_1)(a, kd, kh, 0);
        return;
    }
    if (k3s1 && a->ocp % 32 == 0) { /* two vectors at a time */
        for (int oc0 = 0; oc0 < a->ocp; oc0 += 32) BT(wk3b_run_2)(a, kd, kh, oc0);
        return;
    }
    for (int kw = 0; kw < a->k; kw++)
        for (int oc0 = 0; oc0 < a->ocp;) {
            const int nv = nv_for(a->ocp - oc0);
            if (nv == 4) BT(wgb_run_4)(a, kd, kh, kw, oc0);
            else if (nv == 2) BT(wgb_run_2)(a, kd, kh, kw, oc0);
            else BT(wgb_run_1)(a, kd, kh, kw, oc0);
            oc0 += 16 * nv;
        }
}

/* The k = s = 2 transposed convolution's weight gradient (convt3d.c): for
 * each tap t < 8, dw[t][c][0 .. ocp) += the sums over rows i < nr and voxel
 * pairs m < nm of x's pair of channel c (word xq[(i nm + m) C + c]) times
 * tap t's output-gradient pairs (words gq[t] + i gri + m gm + [0, ocp)),
 * in the order (i, m) for every channel and block of 16 channels: the same
 * bits however the channels are blocked */
BATTR void BT(tk2_col)(const uint32_t *xq, int C, int c, const uint32_t *g, size_t gri, size_t gm, int nr, int nm,
                       float *d)
{
    v16 a = *(v16 *)d;
    for (int i = 0; i < nr; i++)
        for (int m = 0; m < nm; m++) {
            BW(gv, g + i * gri + m * gm);
            BX(xx, xq + ((size_t)i * nm + m) * C + c);
            BDP(a, xx, gv);
        }
    *(v16 *)d = a;
}

BATTR void BT(tk2_16)(const uint32_t *xq, int C, int c0, const uint32_t *g, size_t gri, size_t gm, int nr, int nm,
                      float *d, int ocp)
{
    v16 a[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) a[j] = *(v16 *)(d + (size_t)j * ocp);
    for (int i = 0; i < nr; i++)
        for (int m = 0; m < nm; m++) {
            BW(gv, g + i * gri + m * gm);
            const uint32_t *xv = xq + ((size_t)i * nm + m) * C + c0;
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) {
                BX(xx, xv + j);
                BDP(a[j], xx, gv);
            }
        }
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) *(v16 *)(d + (size_t)j * ocp) = a[j];
}

BATTR_RUN void BT(tk2_wgrad)(const uint32_t *xq, int C, const uint32_t *const *gq, size_t gri, size_t gm, int nr, int nm,
                             int ocp, float *dw)
{
    for (int t = 0; t < 8; t++)
        for (int oc0 = 0; oc0 < ocp; oc0 += 16) {
            float *d = dw + (size_t)t * C * ocp + oc0;
            int c = 0;
            for (; c + 16 <= C; c += 16) BT(tk2_16)(xq, C, c, gq[t] + oc0, gri, gm, nr, nm, d + (size_t)c * ocp, ocp);
            for (; c < C; c++) BT(tk2_col)(xq, C, c, gq[t] + oc0, gri, gm, nr, nm, d + (size_t)c * ocp);
        }
}
