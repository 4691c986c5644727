/* The voxel-pair tiles of conv_kernels.c (included there once, after the
 * gc_args type and the AI / vld / vst helpers; no include guard): a 3x3x3
 * stride-1 convolution with at most 8 output channels, two output voxels
 * per 16-lane vector (see below). */
/* A 3x3x3 stride-1 convolution with OC <= 8 output channels would fill only
 * half of a 16-lane accumulator per voxel. This path puts two neighbouring
 * output voxels in one vector instead: lane 2o + v holds channel o of voxel
 * ow + v. The slab is restaged as column pairs, pair j of a row holding
 * (x[j][c], x[j+1][c]) for each channel c (a 64-bit broadcast gives every
 * lane pair its two inputs), the weights and bias with each channel's value
 * in lanes 2o and 2o + 1. Each output sums the same products in the same
 * order as the gk3 kernels (kd, kh, c, then kw), with the same fused
 * multiply-adds: the results are the same bits, about twice as fast where OC is 8
 * (docs/performance.md, "Inference"). */
typedef double v8d __attribute__((vector_size(64)));

/* voxel pairs per tile (gq_tile): 16 independent accumulator chains */
#define GQ_NP 16
typedef int v16i __attribute__((vector_size(64)));

AI v16 bcast_pair(const float *p)
{
    double d;
    memcpy(&d, p, sizeof d);
    return (v16)(v8d){d, d, d, d, d, d, d, d};
}

/* rows slab rows of CS columns x C channels -> the pair layout (2 C floats a
 * column; the last column's partner is zero) */
static void pair_rows(const float *src, float *dst, int rows, int CS, int C)
{
    typedef float v8 __attribute__((vector_size(32)));
    typedef float v8u __attribute__((vector_size(32), aligned(4)));
    for (int r = 0; r < rows; r++) {
        const float *sr = src + (size_t)r * CS * C;
        float *d = dst + (size_t)r * CS * 2 * C;
        int j0 = 0;
        if (C % 8 == 4) /* 4 words of two columns interleaved by one shuffle */
            for (; j0 + 1 < CS; j0++)
                for (int c = 0; c < C; c += 4) {
                    typedef float v4 __attribute__((vector_size(16)));
                    typedef float v4u __attribute__((vector_size(16), aligned(4)));
                    typedef float v8w __attribute__((vector_size(32), aligned(4)));
                    const v4 a = *(const v4u *)(sr + (size_t)j0 * C + c), b = *(const v4u *)(sr + (size_t)(j0 + 1) * C + c);
                    *(v8w *)(d + (size_t)j0 * 2 * C + 2 * c) = __builtin_shufflevector(a, b, 0, 4, 1, 5, 2, 6, 3, 7);
                }
        else if (C % 8 == 0) /* 8 channels of two columns interleaved by one shuffle */
            for (; j0 + 1 < CS; j0++)
                for (int c = 0; c < C; c += 8) {
                    const v8 a = *(const v8u *)(sr + (size_t)j0 * C + c), b = *(const v8u *)(sr + (size_t)(j0 + 1) * C + c);
                    vst(d + (size_t)j0 * 2 * C + 2 * c,
                        __builtin_shufflevector(a, b, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15));
                }
        for (int j = j0; j < CS; j++) {
            const float *a = sr + (size_t)j * C, *b = a + C;
            float *dj = d + (size_t)j * 2 * C;
            for (int c = 0; c < C; c++) {
                dj[2 * c] = a[c];
                dj[2 * c + 1] = j + 1 < CS ? b[c] : 0.0f;
            }
        }
    }
}

/* the weights [27][C][ocp] (channels 0..7 used) as [27][C][16] with channel o
 * in lanes 2o and 2o + 1; the bias likewise (bias NULL: zeros) */
static void pair_weights(const float *wp, const float *bias, int C, int ocp, int OC, float *wq, float *bq)
{
    for (size_t t = 0; t < (size_t)27 * C; t++)
        for (int o = 0; o < 8; o++) wq[t * 16 + 2 * o] = wq[t * 16 + 2 * o + 1] = o < OC ? wp[t * ocp + o] : 0.0f;
    for (int o = 0; o < 8; o++) bq[2 * o] = bq[2 * o + 1] = bias && o < OC ? bias[o] : 0.0f;
}

/* NP pairs (output voxels ow0 .. ow0 + 2 NP - 1, the last nlast of the final
 * pair only: 1 or 2) of tile row r; OC channels stored at yo of rows of ldy */
AI void gq_tile(const gc_args *a, int NP, int r, int ow0, int nlast, int OC, float *y, int yo, int ldy)
{
    v16 acc[GQ_NP];
    const v16 b = vld(a->bq);
    const int C = a->C;
    const size_t col = (size_t)2 * C, tapw = (size_t)C * 16;
#pragma GCC unroll 16
    for (int i = 0; i < GQ_NP; i++) acc[i] = b;
    for (int kd = 0; kd < 3; kd++)
        for (int kh = 0; kh < 3; kh++) {
            const float *row = a->ppl[kd] + (size_t)(r + kh) * a->prs + (size_t)ow0 * col;
            const float *wr = a->wq + (size_t)((kd * 3 + kh) * 3) * tapw;
            for (int c = 0; c < C; c++) {
                const v16 w0 = vld(wr + (size_t)c * 16), w1 = vld(wr + tapw + (size_t)c * 16);
                const v16 w2 = vld(wr + 2 * tapw + (size_t)c * 16);
                const float *xc = row + 2 * c;
#pragma GCC unroll 16
                for (int i = 0; i < GQ_NP; i++)
                    if (i < NP) {
                        acc[i] += bcast_pair(xc + (size_t)(2 * i) * col) * w0;
                        acc[i] += bcast_pair(xc + (size_t)(2 * i + 1) * col) * w1;
                        acc[i] += bcast_pair(xc + (size_t)(2 * i + 2) * col) * w2;
                    }
            }
        }
#pragma GCC unroll 16
    for (int i = 0; i < GQ_NP; i++)
        if (i < NP) ts_nn_pair_store(y + (size_t)(ow0 + 2 * i) * ldy + yo, ldy, acc[i], OC, i < NP - 1 || nlast == 2);
}

/* one output row of OW voxels by the pair path */
static void gq_row(const gc_args *a, int r, int OW, int OC, float *y, int yo, int ldy)
{
    int ow = 0;
    for (; ow + 2 * GQ_NP <= OW; ow += 2 * GQ_NP) gq_tile(a, GQ_NP, r, ow, 2, OC, y, yo, ldy);
    const int left = OW - ow, np = (left + 1) / 2, nlast = left % 2 ? 1 : 2;
#define GQ_CALL(n) gq_tile(a, n, r, ow, nlast, OC, y, yo, ldy)
    TS_NP_SWITCH(np, GQ_CALL)
#undef GQ_CALL
}

/* gq_row with C a constant where it is 1, 8 or 16 (the demo's first, 8- and
 * 16-channel inputs): the tiles' 33 column addresses become immediates
 * from one base instead of pointers reloaded from the stack (GK3_CONST) */
#define GQ_CONST(cc)                                                                                                    \
    __attribute__((flatten)) static void gq_row_c##cc(const gc_args *a, int r, int OW, int OC, float *y, int yo, int ldy) \
    {                                                                                                                   \
        gc_args b = *a;                                                                                                 \
        b.C = cc;                                                                                                       \
        gq_row(&b, r, OW, OC, y, yo, ldy);                                                                              \
    }
GQ_CONST(1)
GQ_CONST(8)
GQ_CONST(16)
#undef GQ_CONST

static void gq_row_any(const gc_args *a, int r, int OW, int OC, float *y, int yo, int ldy)
{
    if (a->C == 8) gq_row_c8(a, r, OW, OC, y, yo, ldy);
    else if (a->C == 16) gq_row_c16(a, r, OW, OC, y, yo, ldy);
    else if (a->C == 1) gq_row_c1(a, r, OW, OC, y, yo, ldy);
    else gq_row(a, r, OW, OC, y, yo, ldy);
}

/* The weight gradient of the same convolutions (fp32, 3x3x3 stride 1, OC <=
 * 8), two output voxels a vector as above: the output gradient's rows staged
 * as voxel pairs (wq_stage: lane 2o + v of pair m holds channel o of voxel
 * 2m + v, zeros past OC and past the row), the input's slab planes as the
 * column pairs of pair_rows. For tap (kd, kh, kw) and channel c, pair m
 * meets the 64-bit broadcast of input columns (2m + kw, 2m + kw + 1); lanes
 * 2o and 2o + 1 hold the even and odd voxels' sums of channel o, added into
 * dw once per item. Not the bits of the 16-lane tiles (another order). */
static void wq_stage(const float *gy, int OW, int OC, float *dst)
{
    int m0 = 0;
    if (OC == 8) /* whole pairs: 16 floats interleaved by one shuffle */
        for (; 2 * m0 + 1 < OW; m0++) {
            const v16 t = vld(gy + (size_t)m0 * 16);
            vst(dst + (size_t)m0 * 16, __builtin_shufflevector(t, t, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15));
        }
    for (int m = m0; m < (OW + 1) / 2; m++)
        for (int o = 0; o < 8; o++)
            for (int v = 0; v < 2; v++) dst[m * 16 + 2 * o + v] = o < OC && 2 * m + v < OW ? gy[(size_t)(2 * m + v) * OC + o] : 0.0f;
}

/* channels c0 .. c0 + CB - 1, the three kw taps of (kd, kh), over the item's
 * rows; here a->planes are the pair planes, a->rstride their row stride and
 * a->gy the staged pairs ((OW + 1) / 2 of 16 floats a row) */
AI void wq_tile(const wg_args *a, int kd, int kh, int c0, const int CB)
{
    v16 acc[3][8];
    const int C = a->C, nmp = (a->OW + 1) / 2;
    const size_t col = (size_t)2 * C;
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) acc[0][c] = acc[1][c] = acc[2][c] = (v16){0};
    for (int q = 0; q < a->np * a->nr; q++) {
        const float *xr = a->planes[q / a->nr + kd] + (size_t)(q % a->nr + kh) * a->rstride + 2 * c0;
        const float *gr = a->gy + (size_t)q * nmp * 16;
        for (int m = 0; m < nmp; m++) {
            const v16 gv = vld(gr + (size_t)m * 16);
            const float *xm = xr + (size_t)(2 * m) * col;
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++)
                if (c < CB) {
                    acc[0][c] += bcast_pair(xm + 2 * c) * gv;
                    acc[1][c] += bcast_pair(xm + col + 2 * c) * gv;
                    acc[2][c] += bcast_pair(xm + 2 * col + 2 * c) * gv;
                }
        }
    }
    for (int kw = 0; kw < 3; kw++)
        for (int c = 0; c < CB; c++) {
            float *d = a->dw + ((size_t)((kd * 3 + kh) * 3 + kw) * C + c0 + c) * a->ocp;
            for (int o = 0; o < 8; o++) d[o] += acc[kw][c][2 * o] + acc[kw][c][2 * o + 1];
        }
}

/* every channel of (kd, kh) */
static void wq_pair(const wg_args *a, int kd, int kh)
{
    int c = 0;
    for (; c + 8 <= a->C; c += 8) wq_tile(a, kd, kh, c, 8);
    for (; c + 4 <= a->C; c += 4) wq_tile(a, kd, kh, c, 4);
    for (; c + 2 <= a->C; c += 2) wq_tile(a, kd, kh, c, 2);
    for (; c < a->C; c++) wq_tile(a, kd, kh, c, 1);
}
