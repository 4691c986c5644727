/* Transposed conv3d (PyTorch ConvTranspose3d, padding 0, weights
 * [Cin, Cout, k, k, k]) on channels-last activations: forward is a
 * transposed gather, the input gradient a strided gather convolution, the
 * weight gradient the wgrad kernel with the roles of input and output
 * gradient exchanged; fp32, bf16 or fp16 (fp32 kernels on fp16-rounded
 * operands) kernels by ts_nn_conv_precision(), read once per call. */
#include "tsbuild.h"
#include "src/nn/layers.h"
#include "src/nn/conv_impl.h"
#ifdef TS_HAVE_CUDA
#include "src/nn/cuda/cuda_nn.h"
#endif
#include "src/core/error.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static int convt_shapes(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, const ts_tensor *y,
                        const char *yname, ts_conv_geom *g)
{
    if (!ts_tensor_f32(x) || !ts_tensor_f32(w) || !ts_tensor_f32(y) || (b && !ts_tensor_f32(b)))
        return TS_ERR(TS_ERR_ARG, "convt3d: tensors must be float32 on the host");
    TS_TRY(ts_tensor_check_shape(x, "convt3d input", 5, (const int64_t[]){-1, -1, -1, -1, -1}));
    TS_TRY(ts_tensor_check_shape(w, "convt3d weight", 5, (const int64_t[]){x->shape[4], -1, -1, -1, -1}));
    const int k = (int)w->shape[2];
    if (w->shape[3] != k || w->shape[4] != k || k < 1)
        return TS_ERR(TS_ERR_ARG, "convt3d: only cubic kernels");
    if (stride < 1) return TS_ERR(TS_ERR_ARG, "convt3d: stride %d", stride);
    const int64_t cout = w->shape[1];
    if (b) TS_TRY(ts_tensor_check_shape(b, "convt3d bias", 1, &cout));
    int64_t od[3];
    for (int i = 0; i < 3; i++) od[i] = (x->shape[1 + i] - 1) * stride + k;
    TS_TRY(ts_tensor_check_shape(y, yname, 5, (const int64_t[]){x->shape[0], od[0], od[1], od[2], cout}));
    /* tgather geometry: the small side (x) is the input */
    *g = (ts_conv_geom){(int)x->shape[0], (int)x->shape[1], (int)x->shape[2], (int)x->shape[3], (int)x->shape[4],
                        (int)od[0], (int)od[1], (int)od[2], (int)cout, k, stride, 0};
    return 0;
}

/* w [Cin][Cout][taps] -> wp[t][ci][cop] (by_out = 0) or wp[t][co][cip] (by_out = 1);
 * half: the values rounded through fp16 */
static float *pack(const float *w, int cin, int cout, int taps, int by_out, int half)
{
    const int rows = by_out ? cout : cin, cols = by_out ? cin : cout, colp = ts_nn_pad16(cols);
    float *wp = ts_nn_scratch(1, (size_t)taps * rows * colp * sizeof(float));
    if (!wp) return NULL;
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < taps; t++) {
        float *dst = wp + (size_t)t * rows * colp;
        memset(dst, 0, (size_t)rows * colp * sizeof(float));
        for (int ci = 0; ci < cin; ci++)
            for (int co = 0; co < cout; co++)
                dst[(size_t)(by_out ? co : ci) * colp + (by_out ? ci : co)] = w[((size_t)ci * cout + co) * taps + t];
        if (half)
            for (size_t i = 0; i < (size_t)rows * colp; i++) dst[i] = ts_nn_fp16_round(dst[i]);
    }
    return wp;
}

/* --------------------------------- bf16, k = s = 2: one pass over dy */

static atomic_int fused_off;
static atomic_long fused_calls;

int ts_nn_set_convt_fused(int on)
{
    atomic_store(&fused_off, on ? 0 : 1);
    return 0;
}

long ts_nn_convt_fused_calls(void) { return atomic_load(&fused_calls); }

/* The input and weight gradients of a bf16 k = s = 2 transposed convolution
 * (the U-Net's up-convolutions) from one reading of dy: a work item is a
 * block of nr rows of x (sample n, plane id, rows ih0 ..) and the 2 x 2 nr
 * rows of dy over it, staged once as channel pairs (the input gradient:
 * the strided gather's tiles, ts_nn_bf16_gather_row, so the same bits as
 * ts_nn_gather2_bf16) and as voxel pairs (the weight gradient:
 * ts_nn_bf16_tk2_wgrad, each tap's sums over the item's voxel pairs);
 * fixed chunks of items, their sums added in order: the same bits for any
 * thread count. dx and dw may each be NULL; dw (w's layout) is added to. */
/* long-function: one OpenMP region staging each item's rows once for both gradients */
static int convt_k2_backward_bf16(const ts_conv_geom *g, const float *x, const float *w, const float *dy, float *dx,
                                  float *dw)
{
    const int nat = ts_nn_bf16_native(), C = g->C, OC = g->OC, W = g->W, nt = ts_nn_nthreads();
    const int ocp = ts_nn_pad16(OC), cxp = ts_nn_pad16(C), OCq = (OC + 1) / 2, nm = (W + 1) / 2;
    if (!g->N || !g->D || !g->H || !W || !C || !OC) return 0; /* nothing to add */
    int hb = 1;
    while (hb < g->H && hb * W < 256) hb *= 2;
    hb = hb < g->H ? hb : g->H;
    const int nhb = (g->H + hb - 1) / hb;
    const long items = (long)g->N * g->D * nhb;
    /* chunks: up to 16, fewer for large weights (their partial sums zeroed and added: at most ~256K floats) */
    long nch = items < 16 ? items : 16;
    while (dw && nch > 2 && (size_t)nch * 8 * C * ocp > ((size_t)1 << 18)) nch--;
    const uint32_t *wb = NULL;
    if (dx && !(wb = ts_nn_bf16_pack(w, OC, C, 8, 0, 0))) return TS_ERR(TS_ERR_NOMEM, "convt3d backward bf16 weights");
    /* per thread: dy rows as channel pairs, as voxel pairs (rows of rq words), x rows as voxel pairs */
    const size_t nat_n = (size_t)2 * 2 * hb * 2 * W * OCq + (nat == 2 ? TS_NN_AMX_MARGIN(2, OCq) : 0), rq = (size_t)((2 * W + 3) / 4) * 2 * ocp;
    const size_t gq_n = dw ? (size_t)2 * 2 * hb * rq : 0, xq_n = dw ? (size_t)hb * nm * C : 0;
    const size_t per = (nat_n + gq_n + xq_n + 15) & ~(size_t)15, part_n = dw ? (size_t)8 * C * ocp : 0;
    uint32_t *buf = ts_nn_scratch(0, (per * nt + part_n * nch) * sizeof(uint32_t));
    if (!buf) return TS_ERR(TS_ERR_NOMEM, "convt3d backward bf16 scratch");
    float *parts = (float *)(buf + per * nt);
    /* the voxel-pair rows need zeros first unless the staging writes every word: whole pairs (W even) and
     * no padded channels */
    const int zero = W % 2 || OC != ocp;
    atomic_fetch_add(&fused_calls, 1);
#pragma omp parallel
    {
        uint32_t *nb = buf + per * ts_nn_thread_id(), *gq = nb + nat_n, *xq = gq + gq_n;
        const uint32_t *plane[2] = {nb, nb + (size_t)2 * hb * 2 * W * OCq};
        const ts_bf16_gc_args ga = {plane, (size_t)2 * W * OCq, 2, 2, OCq, cxp, wb, NULL, NULL, NULL, NULL, 0};
        const uint32_t *gt[8];
        for (int t = 0; t < 8; t++) gt[t] = gq + (size_t)((t >> 2) * 2 * hb + ((t >> 1) & 1)) * rq + (size_t)(t & 1) * ocp;
#pragma omp for schedule(dynamic, 1)
        for (long ch = 0; ch < nch; ch++) {
            float *part = parts + part_n * ch;
            if (dw) memset(part, 0, part_n * sizeof(float));
            for (long it = items * ch / nch; it < items * (ch + 1) / nch; it++) {
                const int n = (int)(it / ((long)g->D * nhb)), id = (int)(it / nhb % g->D), ih0 = (int)(it % nhb) * hb;
                const int nr = g->H - ih0 < hb ? g->H - ih0 : hb;
                if (dw && zero) memset(gq, 0, (gq_n + xq_n) * sizeof(uint32_t));
                for (int kd = 0; kd < 2; kd++)
                    for (int j = 0; j < 2 * nr; j++) {
                        const float *src = dy + (((size_t)n * g->OD + 2 * id + kd) * g->OH + 2 * ih0 + j) * (size_t)g->OW * OC;
                        const size_t q = (size_t)kd * 2 * hb + j;
                        if (dx) ts_nn_bf16_put(nat, 0, 1, OC, OC, nb + q * 2 * W * OCq, 0, 2 * W, src, OC, NULL);
                        if (dw) ts_nn_bf16_put(nat, 1, 2, OC, ocp, gq + q * rq, 0, 2 * W, src, OC, NULL);
                    }
                const size_t row0 = ((size_t)n * g->D + id) * g->H + ih0; /* the item's first x row */
                if (dx)
                    for (int i = 0; i < nr; i++)
                        ts_nn_bf16_gather_row(nat, &ga, 0, i, W, 0, C, C, dx + (row0 + i) * W * C, 0, C);
                if (dw) {
                    for (int i = 0; i < nr; i++)
                        ts_nn_bf16_put(nat, 1, 1, C, C, xq + (size_t)i * nm * C, 0, W, x + (row0 + i) * W * C, C, NULL);
                    ts_nn_bf16_tk2_wgrad(nat, xq, C, gt, 2 * rq, 2 * (size_t)ocp, nr, nm, ocp, part);
                }
            }
        }
    }
    if (dw) { /* dw[ci][co][t] += 0 + chunk 0 + chunk 1 + ...: the chunks summed into chunk 0's buffer, element by element */
#pragma omp parallel for schedule(static)
        for (size_t i0 = 0; i0 < part_n; i0 += 1024) {
            const size_t i1 = i0 + 1024 < part_n ? i0 + 1024 : part_n;
            for (size_t i = i0; i < i1; i++) parts[i] = 0.0f + parts[i];
            for (long ch = 1; ch < nch; ch++)
                for (size_t i = i0; i < i1; i++) parts[i] += parts[part_n * ch + i];
        }
#pragma omp parallel for schedule(static)
        for (int ci = 0; ci < C; ci++)
            for (int t = 0; t < 8; t++)
                for (int co = 0; co < OC; co++) dw[((size_t)ci * OC + co) * 8 + t] += parts[((size_t)t * C + ci) * ocp + co];
    }
    return 0;
}

int ts_convt3d_forward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, ts_tensor *y)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_convt3d_forward(x, w, b, stride, y);
#endif
    ts_conv_geom g;
    TS_TRY(convt_shapes(x, w, b, stride, y, "convt3d output", &g));
    if (ts_nn_conv_precision() == TS_PREC_BF16) {
        const uint32_t *wb = ts_nn_bf16_pack(w->data, g.C, g.OC, g.k * g.k * g.k, 0, 1);
        if (!wb) return TS_ERR(TS_ERR_NOMEM, "convt3d packed bf16 weights");
        return ts_nn_tgather_bf16(&g, x->data, wb, b ? b->data : NULL, y->data);
    }
    const int h = ts_nn_conv_precision() == TS_PREC_FP16;
    float *wp = pack(w->data, g.C, g.OC, g.k * g.k * g.k, 0, h);
    if (!wp) return TS_ERR_NOMEM;
    return (h ? ts_nn_tgather_fp16 : ts_nn_tgather)(&g, x->data, wp, b ? b->data : NULL, y->data);
}

int ts_convt3d_backward(const ts_tensor *x, const ts_tensor *w, int stride, const ts_tensor *dy, ts_tensor *dx,
                        ts_tensor *dw, ts_tensor *db)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_convt3d_backward(x, w, stride, dy, dx, dw, db);
#endif
    int err = 0;
    ts_conv_geom g;
    float *wp = NULL, *dwp = NULL;
    const ts_precision prec = ts_nn_conv_precision();
    const int bf = prec == TS_PREC_BF16, h = prec == TS_PREC_FP16;
    TS_CHECK(convt_shapes(x, w, db, stride, dy, "convt3d output gradient", &g));
    const int taps = g.k * g.k * g.k;
    /* the big side (dy) as the input of gather / wgrad */
    ts_conv_geom r = {g.N, g.OD, g.OH, g.OW, g.OC, g.D, g.H, g.W, g.C, g.k, stride, 0};
    if (dx && (!ts_tensor_f32(dx) || !ts_tensor_same_shape(dx, x)))
        TS_FAIL(TS_ERR_ARG, "convt3d: input gradient must be float32 shaped like the input");
    if (dw && (!ts_tensor_f32(dw) || !ts_tensor_same_shape(dw, w)))
        TS_FAIL(TS_ERR_ARG, "convt3d: weight gradient must be float32 shaped like the weight");
    if (bf && g.k == 2 && stride == 2 && !atomic_load(&fused_off) && (dx || dw)) {
        TS_CHECK(convt_k2_backward_bf16(&g, x->data, w->data, dy->data, dx ? dx->data : NULL, dw ? dw->data : NULL));
        dx = NULL;
        dw = NULL;
    }
    if (dx) {
        if (bf) {
            const uint32_t *wb = ts_nn_bf16_pack(w->data, g.OC, g.C, taps, 0, 0);
            if (!wb) TS_FAIL(TS_ERR_NOMEM, "convt3d backward bf16 weights");
            TS_CHECK(ts_nn_gather2_bf16(&r, (ts_conv_src){dy->data, NULL, r.C, NULL}, wb, NULL,
                                        (ts_conv_dst){dx->data, NULL, r.OC, NULL}, NULL));
        } else {
            wp = pack(w->data, g.C, g.OC, taps, 1, h);
            if (!wp) TS_FAIL(TS_ERR_NOMEM, "convt3d backward weights");
            if (h)
                TS_CHECK(ts_nn_gather2_fp16(&r, (ts_conv_src){dy->data, NULL, r.C, NULL}, wp, NULL,
                                            (ts_conv_dst){dx->data, NULL, r.OC, NULL}, NULL));
            else
                TS_CHECK(ts_nn_gather(&r, dy->data, wp, NULL, dx->data));
        }
    }
    if (dw) {
        dwp = ts_nn_scratch(2, (size_t)taps * g.C * g.OC * sizeof(float));
        if (!dwp) TS_FAIL(TS_ERR_NOMEM, "convt3d weight gradient");
        if (bf) TS_CHECK(ts_nn_wgrad2_bf16(&r, (ts_conv_src){dy->data, NULL, r.C, NULL}, x->data, dwp, NULL, NULL));
        else if (h) TS_CHECK(ts_nn_wgrad2_fp16(&r, (ts_conv_src){dy->data, NULL, r.C, NULL}, x->data, dwp, NULL, NULL));
        else TS_CHECK(ts_nn_wgrad(&r, dy->data, x->data, dwp)); /* dwp[t][co][ci] */
        float *d = dw->data;
        /* blocks of 16 input channels: each line of dwp is read once */
#pragma omp parallel for schedule(dynamic, 1)
        for (int cb = 0; cb < g.C; cb += 16)
            for (int co = 0; co < g.OC; co++)
                for (int t = 0; t < taps; t++) {
                    const float *src = dwp + ((size_t)t * g.OC + co) * g.C;
                    for (int ci = cb; ci < cb + 16 && ci < g.C; ci++) d[((size_t)ci * g.OC + co) * taps + t] += src[ci];
                }
    }
    if (db) TS_CHECK(ts_nn_bias_grad(dy->data, (size_t)g.N * g.OD * g.OH * g.OW, g.OC, db->data));
cleanup:
    return err;
}
