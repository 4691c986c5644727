/* One variant of the bf16 kernels (included twice by conv_bf16.c, no
 * include guard): the generated tiles and the row / tap loops over them,
 * named by BT() (_nat: AVX512-BF16, _emu: portable), the steps given by
 * BW, BX, BDP (see conv_tiles_bf16.h). Mirrors gather_row, the tgather tap
 * loop and the wgrad tap loop of conv_kernels.c. */

#include "src/nn/conv_tiles_bf16.h"

/* one output row of the gather: channel tiles oc0 .. oc1 (global channel
 * index for the weights) written at channel yo0 of rows of ldy floats */
BATTR_RUN void BT(gather_row)(const ts_bf16_gc_args *a, int k3s1, int r, int OW, int oc0, int oc1, int OC, float *yr,
                              int yo0, int ldy)
{
    for (int oc = oc0; oc < oc1;) {
        const int lanes = ts_nn_pad16(oc1) - oc, yo = yo0 + oc - oc0;
        if (k3s1) { /* 3x3x3, stride 1: broadcasts shared across kw */
            const int nv = lanes >= 32 ? 2 : 1, nco = imin(16 * nv, imin(oc1, OC) - oc);
            if (nv == 2) BT(gk3b_run_2)(a, r, OW, oc, yo, nco, yr, ldy);
            else BT(gk3b_run_1)(a, r, OW, oc, yo, nco, yr, ldy);
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

/* all kw taps and output-channel tiles of the weight gradient at (kd, kh) */
BATTR_RUN void BT(wgrad_pair)(const ts_bf16_wg_args *a, int kd, int kh, int k3s1)
{
    if (k3s1 && a->ocp == 16) { /* 3x3x3 stride 1, one output vector: the three kw taps together */
        BT(wk3b_run_1)(a, kd, kh, 0);
        return;
    }
    if (k3s1 && a->ocp == 32) { /* two vectors */
        BT(wk3b_run_2)(a, kd, kh, 0);
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
