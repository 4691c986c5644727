/* One variant of the Winograd bf16 products (included twice by
 * winograd_bf16.c, no include guard), named by BT() (_nat: AVX512-BF16,
 * _emu: portable), the steps given by WDECL, WLOAD, XLOAD and DP. */

/* m[i][:] = (m[i][:] if acc, else 0) + sum over k < K of v[i vi + k vk]
 * u[k op + :] (pair words: two products each) for rows i < TB and NV
 * 16-lane output vectors, rows of m op floats apart. The forward takes rows
 * = tiles, k = input channel pairs (vi = the tiles' words, vk = 1); the
 * weight gradient rows = input channels, k = tile pairs (vi = 1, vk = the
 * pairs' words, accumulating). One function per (TB, NV), array sizes
 * constant, so that the accumulators stay in registers. */
#define DEF_BGEMM(TB, NV)                                                                                              \
    BATTR void BT(bg_##TB##x##NV)(const uint32_t *v, size_t vi, size_t vk, const uint32_t *u, int op, int K, float *m, \
                                  int acc)                                                                             \
    {                                                                                                                  \
        v16 a[TB][NV];                                                                                                 \
        _Pragma("GCC unroll 16") for (int i = 0; i < TB; i++) _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)    \
            a[i][j] = acc ? *(const v16u *)(m + (size_t)i * op + 16 * j) : (v16){0};                                    \
        for (int k = 0; k < K; k++) {                                                                                  \
            WDECL(NV);                                                                                                 \
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) WLOAD(j, u + (size_t)k * op + 16 * j);               \
            _Pragma("GCC unroll 16") for (int i = 0; i < TB; i++)                                                      \
            {                                                                                                          \
                XLOAD(x, v + (size_t)i * vi + (size_t)k * vk);                                                         \
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) DP(a[i][j], x, j);                                \
            }                                                                                                          \
        }                                                                                                              \
        _Pragma("GCC unroll 16") for (int i = 0; i < TB; i++) _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)    \
            *(v16u *)(m + (size_t)i * op + 16 * j) = a[i][j];                                                          \
    }
/* up to ts_nn_wino_blk's rows for each NV */
DEF_BGEMM(1, 4) DEF_BGEMM(2, 4) DEF_BGEMM(3, 4) DEF_BGEMM(4, 4) DEF_BGEMM(5, 4) DEF_BGEMM(6, 4)
DEF_BGEMM(1, 2) DEF_BGEMM(2, 2) DEF_BGEMM(3, 2) DEF_BGEMM(4, 2) DEF_BGEMM(5, 2) DEF_BGEMM(6, 2)
DEF_BGEMM(7, 2) DEF_BGEMM(8, 2) DEF_BGEMM(9, 2) DEF_BGEMM(10, 2) DEF_BGEMM(11, 2) DEF_BGEMM(12, 2)
DEF_BGEMM(1, 1) DEF_BGEMM(2, 1) DEF_BGEMM(3, 1) DEF_BGEMM(4, 1) DEF_BGEMM(5, 1) DEF_BGEMM(6, 1) DEF_BGEMM(7, 1)
DEF_BGEMM(8, 1) DEF_BGEMM(9, 1) DEF_BGEMM(10, 1) DEF_BGEMM(11, 1) DEF_BGEMM(12, 1) DEF_BGEMM(13, 1) DEF_BGEMM(14, 1)
DEF_BGEMM(15, 1) DEF_BGEMM(16, 1)
#undef DEF_BGEMM

/* [nv index: 1, 2, 4][rows - 1] */
static void (*const BT(fns)[3][16])(const uint32_t *, size_t, size_t, const uint32_t *, int, int, float *, int) = {
    {BT(bg_1x1), BT(bg_2x1), BT(bg_3x1), BT(bg_4x1), BT(bg_5x1), BT(bg_6x1), BT(bg_7x1), BT(bg_8x1), BT(bg_9x1),
     BT(bg_10x1), BT(bg_11x1), BT(bg_12x1), BT(bg_13x1), BT(bg_14x1), BT(bg_15x1), BT(bg_16x1)},
    {BT(bg_1x2), BT(bg_2x2), BT(bg_3x2), BT(bg_4x2), BT(bg_5x2), BT(bg_6x2), BT(bg_7x2), BT(bg_8x2), BT(bg_9x2),
     BT(bg_10x2), BT(bg_11x2), BT(bg_12x2)},
    {BT(bg_1x4), BT(bg_2x4), BT(bg_3x4), BT(bg_4x4), BT(bg_5x4), BT(bg_6x4)}};

/* M[xi] = V[xi] U[xi] for the 64 points: T tiles of cp bf16 channels (V
 * [64][T][cp], points vs half-words apart), U [64][K][op] pair words (K =
 * the input channels' pairs), M [64][T][op] floats, points ms apart */
BATTR void BT(bgemm)(const uint16_t *V, int T, int cp, size_t vs, const uint32_t *U, int K, int op, float *M, size_t ms)
{
    const size_t cw = (size_t)cp / 2; /* words per tile */
    for (int xi = 0; xi < 64; xi++) {
        const uint32_t *vx = (const uint32_t *)(V + (size_t)xi * vs), *ux = U + (size_t)xi * K * op;
        float *mx = M + (size_t)xi * ms;
        for (int oc0 = 0; oc0 < op;) {
            const ts_wino_blk b = ts_nn_wino_blk((op - oc0) / 16);
            for (int t = 0; t < T; t += b.rows)
                BT(fns)[b.idx][imin(b.rows, T - t) - 1](vx + (size_t)t * cw, cw, 1, ux + oc0, op, K,
                                                        mx + (size_t)t * op + oc0, 0);
            oc0 += 16 * b.nv;
        }
    }
}

/* dU[xi][c][op] += sum over the tile pairs tp < KP of V[xi][tp][c] Y[xi][tp][:]
 * (pair words: V [64][KP][cp], Y [64][KP][op], points vs and ys words
 * apart; dU fp32 [64][C][op]) */
BATTR void BT(bwgrad)(const uint32_t *V, size_t vs, const uint32_t *Y, size_t ys, int C, int cp, int op, int KP, float *du)
{
    for (int xi = 0; xi < 64; xi++) {
        const uint32_t *vx = V + (size_t)xi * vs, *yx = Y + (size_t)xi * ys;
        float *dx = du + (size_t)xi * C * op;
        for (int oc0 = 0; oc0 < op;) {
            const ts_wino_blk b = ts_nn_wino_blk((op - oc0) / 16);
            for (int c = 0; c < C; c += b.rows)
                BT(fns)[b.idx][imin(b.rows, C - c) - 1](vx + c, 1, (size_t)cp, yx + oc0, op, KP,
                                                        dx + (size_t)c * op + oc0, 1);
            oc0 += 16 * b.nv;
        }
    }
}
