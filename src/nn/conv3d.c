/* conv3d: forward and backward of a cubic-kernel 3D convolution on
 * channels-last activations (weights in PyTorch's [Cout, Cin, k, k, k]),
 * of a channel concatenation [a, b], and of one box of a spatially split
 * volume with its halo (the *_split entry points). Forward and weight
 * gradient use the register-blocked kernels of conv_kernels.c; the input
 * gradient is a gather convolution with flipped taps at stride 1 and a
 * transposed gather otherwise. ts_nn_conv_precision() selects the fp32,
 * bf16 or fp16 (fp32 kernels on fp16-rounded operands) kernels, read once
 * per call. */
#include "tsbuild.h"
#include "src/nn/layers.h"
#include "src/nn/conv_impl.h"
#ifdef TS_HAVE_CUDA
#include "src/nn/cuda/cuda_nn.h"
#endif
#include "src/core/error.h"

#include <stdlib.h>
#include <string.h>

/* Checks x, w, b, y (y may be the gradient dy) and fills the geometry. */
static int conv_shapes(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, int pad,
                       const ts_tensor *y, const char *yname, ts_conv_geom *g)
{
    if (!ts_tensor_f32(x) || !ts_tensor_f32(w) || !ts_tensor_f32(y) || (b && !ts_tensor_f32(b)))
        return TS_ERR(TS_ERR_ARG, "conv3d: tensors must be float32 on the host");
    TS_TRY(ts_tensor_check_shape(x, "conv3d input", 5, (const int64_t[]){-1, -1, -1, -1, -1}));
    TS_TRY(ts_tensor_check_shape(w, "conv3d weight", 5, (const int64_t[]){-1, x->shape[4], -1, -1, -1}));
    const int k = (int)w->shape[2];
    if (w->shape[3] != k || w->shape[4] != k || k < 1)
        return TS_ERR(TS_ERR_ARG, "conv3d: only cubic kernels (weight has kernel %lldx%lldx%lld)",
                      (long long)w->shape[2], (long long)w->shape[3], (long long)w->shape[4]);
    if (stride < 1 || pad < 0) return TS_ERR(TS_ERR_ARG, "conv3d: stride %d, padding %d", stride, pad);
    const int64_t cout = w->shape[0];
    if (b) TS_TRY(ts_tensor_check_shape(b, "conv3d bias", 1, &cout));
    int64_t od[3];
    for (int i = 0; i < 3; i++) {
        od[i] = ts_conv_out_size(x->shape[1 + i], k, stride, pad);
        if (od[i] < 1) return TS_ERR(TS_ERR_ARG, "conv3d: input edge %lld too small for kernel %d, padding %d",
                                     (long long)x->shape[1 + i], k, pad);
    }
    TS_TRY(ts_tensor_check_shape(y, yname, 5, (const int64_t[]){x->shape[0], od[0], od[1], od[2], cout}));
    *g = (ts_conv_geom){(int)x->shape[0], (int)x->shape[1], (int)x->shape[2], (int)x->shape[3], (int)x->shape[4],
                        (int)od[0], (int)od[1], (int)od[2], (int)cout, k, stride, pad};
    return 0;
}

/* wp[t][ci][cop] = w[co][ci][t'] with t' = flip ? taps-1-t : t (w is [Cout][Cin][taps]);
 * transpose swaps the roles: wp[t][co][cip] = w[co][ci][t']. half: the
 * values rounded through fp16. */
static float *pack(const float *w, int cout, int cin, int taps, int flip, int transpose, int half)
{
    const int rows = transpose ? cout : cin, cols = transpose ? cin : cout, colp = ts_nn_pad16(cols);
    float *wp = ts_nn_scratch(1, (size_t)taps * rows * colp * sizeof(float));
    if (!wp) return NULL;
    /* one tap per iteration: contiguous writes, threads over taps */
#pragma omp parallel for schedule(dynamic, 1)
    for (int tp = 0; tp < taps; tp++) {
        const int t = flip ? taps - 1 - tp : tp;
        float *dst = wp + (size_t)tp * rows * colp;
        memset(dst, 0, (size_t)rows * colp * sizeof(float));
        for (int co = 0; co < cout; co++)
            for (int ci = 0; ci < cin; ci++)
                dst[(size_t)(transpose ? co : ci) * colp + (transpose ? ci : co)] = w[((size_t)co * cin + ci) * taps + t];
        if (half)
            for (size_t i = 0; i < (size_t)rows * colp; i++) dst[i] = ts_nn_fp16_round(dst[i]);
    }
    return wp;
}

/* shapes of the two inputs: same N, D, H, W; x describes [a, b] for conv_shapes */
static int cat_shapes(const ts_tensor *a, const ts_tensor *b, ts_tensor *x)
{
    char s1[96], s2[96];
    if (!ts_tensor_f32(a) || !ts_tensor_f32(b) || a->ndim != 5 || b->ndim != 5)
        return TS_ERR(TS_ERR_ARG, "conv3d over a concatenation: inputs must be 5-d float32");
    for (int i = 0; i < 4; i++)
        if (a->shape[i] != b->shape[i])
            return TS_ERR(TS_ERR_ARG, "conv3d over a concatenation: inputs %s and %s differ before the channels",
                          ts_tensor_shape_str(a, s1, sizeof s1), ts_tensor_shape_str(b, s2, sizeof s2));
    *x = ts_tensor_view(a->data, TS_FLOAT32, 5,
                        (const int64_t[]){a->shape[0], a->shape[1], a->shape[2], a->shape[3], a->shape[4] + b->shape[4]});
    return 0;
}

/* A halo needs the 3x3x3, stride 1, padding 1 geometry: one voxel beyond
 * the box is all that the kernels then read. */
static int halo_ok(const ts_halo *h, const ts_conv_geom *g, const char *who)
{
    if (!h) return 0;
    if (g->k != 3)
        return TS_ERR(TS_ERR_ARG, "%s: a halo needs a 3x3x3 kernel (stride 1, padding 1), the weight has kernel %dx%dx%d",
                      who, g->k, g->k, g->k);
    for (int d = 0; d < 3; d++)
        if (h->on[d] != 0 && h->on[d] != 1) return TS_ERR(TS_ERR_ARG, "%s: halo on[%d] = %d (0 or 1)", who, d, h->on[d]);
    return 0;
}

/* The schedule of a kernel call from the splits' part and progress hooks
 * (either split may be NULL; a hook given twice is called once). */
static ts_conv_sched sched_of(const ts_conv_split *s1, const ts_conv_split *s2, ts_conv_part part)
{
    ts_conv_sched r = {part, {NULL, NULL}, {NULL, NULL}};
    if (s1) {
        r.progress[0] = s1->progress;
        r.ctx[0] = s1->progress_ctx;
    }
    if (s2 && (s2->progress != r.progress[0] || s2->progress_ctx != r.ctx[0])) {
        r.progress[1] = s2->progress;
        r.ctx[1] = s2->progress_ctx;
    }
    return r;
}

/* Whether a call of geometry g (forward; for the input gradient its
 * transposed geometry) runs as a Winograd convolution (ts_nn_set_winograd) */
static int wino_any(const ts_conv_geom *g, const ts_halo *halo, const ts_conv_sched *sch)
{
    return ts_nn_winograd_on() && g->k == 3 && g->s == 1 && g->p == 1 && !halo && (!sch || sch->part == TS_CONV_ALL);
}
static int wino_geom(const ts_conv_geom *g, const ts_halo *halo, const ts_conv_sched *sch)
{
    return wino_any(g, halo, sch) && ts_nn_winograd_fits(g);
}
/* the few-output-channel ones (winograd_narrow.c: 16+ channels in, at most
 * 8 out, one output tensor, no maxima), fp32 only: 1.11-1.28x the direct
 * kernels at 16 -> 8 (12^3 to 48^3, batch 2), 0.9-1.2x at 8 -> 8, so not
 * taken there (docs/engine.md) */
static int wino_narrow(const ts_conv_geom *g, const ts_halo *halo, const ts_conv_sched *sch, ts_conv_dst y)
{
    return wino_any(g, halo, sch) && ts_nn_winograd_narrow_fits(g) && ts_nn_conv_precision() == TS_PREC_FP32 && !y.b &&
           !(y.ep && y.ep->amax);
}
/* the precisions Winograd runs in: fp32, or bf16 products (winograd_bf16.c)
 * with 64+ channels in and out together, where they measured faster than
 * the direct bf16 kernels (docs/engine.md: forward 0.99-1.07x at 16 -> 16
 * and 16 -> 32, 1.33x at 32 -> 32, 1.76-2.33x from 64 -> 64; weight
 * gradient 0.97x at 16 -> 32, 1.15-1.44x from 32 -> 32) */
static int wino_prec(const ts_conv_geom *g)
{
    const ts_precision p = ts_nn_conv_precision();
    return p == TS_PREC_FP32 || (p == TS_PREC_BF16 && g->C + g->OC >= 64);
}
/* the forward and the input gradient */
static int wino_fits(const ts_conv_geom *g, const ts_halo *halo, const ts_conv_sched *sch)
{
    return wino_geom(g, halo, sch) && wino_prec(g);
}

/* Winograd's weight gradient where it measured faster (docs/engine.md):
 * 48+ channels in and out together, 256+ tiles to sum over */
static int wgrad_wino_size(const ts_conv_geom *g)
{
    const long tiles = (long)g->N * ((g->D + 1) / 2) * ((g->H + 1) / 2) * ((g->W + 1) / 2);
    return g->C + g->OC >= 48 && tiles >= 256;
}

/* an epilogue (NULL: none) the forward kernels take */
static int ep_ok(const ts_conv_ep *ep)
{
    if (ep && ep->act != TS_EP_NONE && ep->act != TS_EP_RELU && ep->act != TS_EP_LEAKY)
        return TS_ERR(TS_ERR_ARG, "conv3d epilogue: activation %d (none, relu or leaky)", (int)ep->act);
    if (ep && !ep->scale != !ep->shift) return TS_ERR(TS_ERR_ARG, "conv3d epilogue: scale and shift, both or neither");
    return 0;
}

/* Whether a call runs through the pointwise kernels (ts_nn_pw_fits: 1x1x1
 * with few output channels; fp32 or bf16; one input without a halo; every
 * item; the progress hooks, if any, run before and after) */
static int pw_geom(const ts_conv_geom *g, ts_conv_src x, const ts_conv_sched *sch)
{
    return ts_nn_pw_fits(g) && !x.b && !x.halo && (!sch || sch->part == TS_CONV_ALL);
}
static int pw_path(const ts_conv_geom *g, ts_conv_src x, const ts_conv_sched *sch)
{
    return pw_geom(g, x, sch) && ts_nn_conv_precision() != TS_PREC_FP16;
}

/* Forward shared by the entry points: y = conv(x) (+ bias). */
static int conv_forward(const ts_conv_geom *g, ts_conv_src x, const ts_tensor *w, const ts_tensor *b,
                        const ts_conv_sched *sch, const ts_conv_ep *ep, ts_tensor *y)
{
    TS_TRY(ep_ok(ep));
    if (!ep && pw_path(g, x, sch)) {
        ts_nn_run_hooks(sch);
        TS_TRY(ts_nn_pw_forward(ts_nn_conv_precision() == TS_PREC_BF16, g, x.a, w->data, b ? b->data : NULL, y->data));
        ts_nn_run_hooks(sch);
        return 0;
    }
    const ts_conv_dst yd = {y->data, NULL, g->OC, ep};
    if (wino_narrow(g, x.halo, sch, yd)) return ts_nn_winograd_narrow(g, x, w->data, 0, b ? b->data : NULL, yd);
    if (wino_fits(g, x.halo, sch)) return ts_nn_winograd(g, x, w->data, 0, b ? b->data : NULL, yd);
    if (ts_nn_conv_precision() == TS_PREC_BF16) {
        const uint32_t *wb = ts_nn_bf16_pack(w->data, g->C, g->OC, g->k * g->k * g->k, 0, 0);
        if (!wb) return TS_ERR(TS_ERR_NOMEM, "conv3d packed bf16 weights");
        return ts_nn_gather2_bf16(g, x, wb, b ? b->data : NULL, (ts_conv_dst){y->data, NULL, g->OC, ep}, sch);
    }
    const int h = ts_nn_conv_precision() == TS_PREC_FP16;
    float *wp = pack(w->data, g->OC, g->C, g->k * g->k * g->k, 0, 0, h);
    if (!wp) return TS_ERR(TS_ERR_NOMEM, "conv3d packed weights");
    return (h ? ts_nn_gather2_fp16 : ts_nn_gather2)(g, x, wp, b ? b->data : NULL, (ts_conv_dst){y->data, NULL, g->OC, ep}, sch);
}

/* Backward shared by the entry points, in this order: db += sum dy (summed
 * by the weight-gradient driver from its items' rows where it runs, else in
 * a pass of its own); dw +=
 * the weight gradient over x (with x.halo; sch's hooks run between its work
 * items); the input gradient into dx (dx.a NULL: none) by a gather of dy
 * with flipped taps reading dy's halo hy (stride 1), or a transposed gather
 * (stride > 1, one input tensor only: the callers check). Shapes are checked
 * by the callers. */
static int conv_backward(const ts_conv_geom *g, ts_conv_src x, const ts_tensor *w, const ts_tensor *dy,
                         const ts_halo *hy, const ts_conv_sched *sch, ts_conv_dst dx, ts_tensor *dw, ts_tensor *db)
{
    int err = 0;
    const ts_precision prec = ts_nn_conv_precision();
    const int taps = g->k * g->k * g->k, bf = prec == TS_PREC_BF16, h = prec == TS_PREC_FP16;
    /* db with the generic weight gradient (its items' rows as they are staged), else a pass of its own;
     * chosen by the geometry, not by the precision, so that db has the same bits in every precision */
    const int pw = dw && pw_path(g, x, sch), wino = dw && !pw && wino_fits(g, x.halo, NULL) && wgrad_wino_size(g);
    const int own = !dw || pw_geom(g, x, sch) || (wino_geom(g, x.halo, NULL) && wgrad_wino_size(g));
    if (db && own) TS_CHECK(ts_nn_bias_grad(dy->data, (size_t)g->N * g->OD * g->OH * g->OW, g->OC, db->data));
    float *dbw = db && !own ? db->data : NULL;
    if (dw) {
        float *dwp = ts_nn_scratch(2, (size_t)taps * g->C * g->OC * sizeof(float));
        if (!dwp) TS_FAIL(TS_ERR_NOMEM, "conv3d weight gradient");
        if (pw) {
            ts_nn_run_hooks(sch);
            TS_CHECK(ts_nn_pw_wgrad(bf, g, x.a, dy->data, dwp));
            ts_nn_run_hooks(sch);
        } else if (wino)
            TS_CHECK(ts_nn_winograd_wgrad(g, x, dy->data, dwp, sch));
        else if (bf) TS_CHECK(ts_nn_wgrad2_bf16(g, x, dy->data, dwp, dbw, sch));
        else TS_CHECK((h ? ts_nn_wgrad2_fp16 : ts_nn_wgrad2)(g, x, dy->data, dwp, dbw, sch));
        float *d = dw->data;
        const int C = g->C, OC = g->OC;
        /* blocks of 16 output channels: each line of dwp is read once */
#pragma omp parallel for schedule(dynamic, 1)
        for (int cb = 0; cb < OC; cb += 16)
            for (int ci = 0; ci < C; ci++)
                for (int t = 0; t < taps; t++) {
                    const float *src = dwp + ((size_t)t * C + ci) * OC;
                    for (int co = cb; co < cb + 16 && co < OC; co++) d[((size_t)co * C + ci) * taps + t] += src[co];
                }
    }
    if (dx.a) {
        if (g->s == 1 && g->p <= g->k - 1) {
            /* dx = conv(dy, flipped w^T) with padding k-1-pad */
            ts_conv_geom r = {g->N, g->OD, g->OH, g->OW, g->OC, g->D, g->H, g->W, g->C, g->k, 1, g->k - 1 - g->p};
            if (!dx.b && !dx.ep && !hy && pw_path(g, (ts_conv_src){dy->data, NULL, g->OC, NULL}, NULL)) {
                TS_CHECK(ts_nn_pw_dgrad(bf, g, dy->data, w->data, dx.a));
                goto cleanup;
            }
            if (wino_narrow(&r, hy, NULL, dx)) {
                TS_CHECK(ts_nn_winograd_narrow(&r, (ts_conv_src){dy->data, NULL, g->OC, NULL}, w->data, 1, NULL, dx));
                goto cleanup;
            }
            if (wino_fits(&r, hy, NULL)) {
                TS_CHECK(ts_nn_winograd(&r, (ts_conv_src){dy->data, NULL, g->OC, NULL}, w->data, 1, NULL, dx));
                goto cleanup;
            }
            if (bf) {
                const uint32_t *wb = ts_nn_bf16_pack(w->data, g->OC, g->C, taps, 1, 1);
                if (!wb) TS_FAIL(TS_ERR_NOMEM, "conv3d backward bf16 weights");
                TS_CHECK(ts_nn_gather2_bf16(&r, (ts_conv_src){dy->data, NULL, g->OC, hy}, wb, NULL, dx, NULL));
                goto cleanup;
            }
            float *wp = pack(w->data, g->OC, g->C, taps, 1, 1, h);
            if (!wp) TS_FAIL(TS_ERR_NOMEM, "conv3d backward weights");
            TS_CHECK((h ? ts_nn_gather2_fp16 : ts_nn_gather2)(&r, (ts_conv_src){dy->data, NULL, g->OC, hy}, wp, NULL, dx, NULL));
        } else {
            ts_conv_geom r = {g->N, g->OD, g->OH, g->OW, g->OC, g->D, g->H, g->W, g->C, g->k, g->s, g->p};
            if (bf) {
                const uint32_t *wb = ts_nn_bf16_pack(w->data, g->OC, g->C, taps, 0, 1);
                if (!wb) TS_FAIL(TS_ERR_NOMEM, "conv3d backward bf16 weights");
                TS_CHECK(ts_nn_tgather_bf16(&r, dy->data, wb, NULL, dx.a));
                goto cleanup;
            }
            float *wp = pack(w->data, g->OC, g->C, taps, 0, 1, h);
            if (!wp) TS_FAIL(TS_ERR_NOMEM, "conv3d backward weights");
            TS_CHECK((h ? ts_nn_tgather_fp16 : ts_nn_tgather)(&r, dy->data, wp, NULL, dx.a));
        }
    }
cleanup:
    return err;
}

static int check_dw(const ts_tensor *dw, const ts_tensor *w)
{
    if (dw && (!ts_tensor_f32(dw) || !ts_tensor_same_shape(dw, w)))
        return TS_ERR(TS_ERR_ARG, "conv3d: weight gradient must be float32 shaped like the weight");
    return 0;
}

/* da, db: both or neither, shaped like a, b */
static int check_dcat(const ts_tensor *a, const ts_tensor *b, const ts_tensor *da, const ts_tensor *db)
{
    if ((da || db) && (!da || !db || !ts_tensor_f32(da) || !ts_tensor_f32(db) || !ts_tensor_same_shape(da, a) ||
                       !ts_tensor_same_shape(db, b)))
        return TS_ERR(TS_ERR_ARG, "conv3d over a concatenation: both input gradients, shaped like the inputs");
    return 0;
}

int ts_conv3d_forward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, int pad, ts_tensor *y)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_conv3d_forward(x, w, b, stride, pad, y);
#endif
    ts_conv_geom g;
    TS_TRY(conv_shapes(x, w, b, stride, pad, y, "conv3d output", &g));
    return conv_forward(&g, (ts_conv_src){x->data, NULL, g.C, NULL}, w, b, NULL, NULL, y);
}

int ts_conv3d_winograd_forward(const ts_tensor *x, const ts_tensor *x2, const ts_tensor *w, const ts_tensor *b,
                               const ts_conv_ep *ep, ts_tensor *y)
{
    ts_conv_geom g;
    ts_tensor cat;
    if (x2) TS_TRY(cat_shapes(x, x2, &cat));
    TS_TRY(conv_shapes(x2 ? &cat : x, w, b, 1, 1, y, "conv3d output", &g));
    if (g.k != 3) return TS_ERR(TS_ERR_ARG, "conv3d Winograd forward: kernel %d (3x3x3 only)", g.k);
    TS_TRY(ep_ok(ep));
    return ts_nn_winograd(&g, (ts_conv_src){x->data, x2 ? x2->data : NULL, x2 ? (int)x->shape[4] : g.C, NULL}, w->data, 0,
                          b ? b->data : NULL, (ts_conv_dst){y->data, NULL, g.OC, ep});
}

size_t ts_conv3d_winograd_scratch_bytes(int N, int D, int H, int W, int C, int OC, int nthreads, int wgrad)
{
    ts_conv_geom g = {0};
    g.N = N, g.D = g.OD = D, g.H = g.OH = H, g.W = g.OW = W, g.C = C, g.OC = OC, g.k = 3, g.s = 1, g.p = 1;
    return ts_nn_winograd_scratch_bytes(&g, nthreads > 0 ? nthreads : ts_nn_nthreads(), wgrad && wgrad_wino_size(&g));
}

int ts_conv3d_backward(const ts_tensor *x, const ts_tensor *w, int stride, int pad, const ts_tensor *dy,
                       ts_tensor *dx, ts_tensor *dw, ts_tensor *db)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_conv3d_backward(x, w, stride, pad, dy, dx, dw, db);
#endif
    ts_conv_geom g;
    TS_TRY(conv_shapes(x, w, db, stride, pad, dy, "conv3d output gradient", &g));
    TS_TRY(check_dw(dw, w));
    if (dx && (!ts_tensor_f32(dx) || !ts_tensor_same_shape(dx, x)))
        return TS_ERR(TS_ERR_ARG, "conv3d: input gradient must be float32 shaped like the input");
    return conv_backward(&g, (ts_conv_src){x->data, NULL, g.C, NULL}, w, dy, NULL, NULL,
                         (ts_conv_dst){dx ? dx->data : NULL, NULL, g.C, NULL}, dw, db);
}

int ts_conv3d_cat_forward(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_tensor *bias,
                          int stride, int pad, ts_tensor *y)
{
#ifdef TS_HAVE_CUDA
    if (a->device) return ts_cuda_conv3d_cat_forward(a, b, w, bias, stride, pad, y);
#endif
    ts_conv_geom g;
    ts_tensor x;
    TS_TRY(cat_shapes(a, b, &x));
    TS_TRY(conv_shapes(&x, w, bias, stride, pad, y, "conv3d output", &g));
    return conv_forward(&g, (ts_conv_src){a->data, b->data, (int)a->shape[4], NULL}, w, bias, NULL, NULL, y);
}

int ts_conv3d_cat_backward(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, int stride, int pad,
                           const ts_tensor *dy, ts_tensor *da, ts_tensor *db, ts_tensor *dw, ts_tensor *dbias)
{
#ifdef TS_HAVE_CUDA
    if (a->device) return ts_cuda_conv3d_cat_backward(a, b, w, stride, pad, dy, da, db, dw, dbias);
#endif
    ts_conv_geom g;
    ts_tensor x;
    TS_TRY(cat_shapes(a, b, &x));
    TS_TRY(conv_shapes(&x, w, dbias, stride, pad, dy, "conv3d output gradient", &g));
    TS_TRY(check_dw(dw, w));
    TS_TRY(check_dcat(a, b, da, db));
    if (da && (stride != 1 || pad > g.k - 1))
        return TS_ERR(TS_ERR_UNSUPPORTED, "conv3d over a concatenation: input gradient needs stride 1, padding < kernel");
    const int ca = (int)a->shape[4];
    return conv_backward(&g, (ts_conv_src){a->data, b->data, ca, NULL}, w, dy, NULL, NULL,
                         (ts_conv_dst){da ? da->data : NULL, da ? db->data : NULL, ca, NULL}, dw, dbias);
}

/* ---- one box of a split volume: 3x3x3, stride 1, padding 1 with halos ---- */

int ts_conv3d_forward_split(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, const ts_conv_split *s,
                            ts_tensor *y)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_conv3d_forward_split(x, NULL, w, b, s, y);
#endif
    ts_conv_geom g;
    const ts_halo *h = s ? s->halo : NULL;
    TS_TRY(conv_shapes(x, w, b, 1, 1, y, "conv3d output", &g));
    TS_TRY(halo_ok(h, &g, "conv3d split forward"));
    if (s && (s->part < TS_CONV_ALL || s->part > TS_CONV_BORDER))
        return TS_ERR(TS_ERR_ARG, "conv3d split forward: part %d (ALL, INTERIOR or BORDER)", (int)s->part);
    const ts_conv_sched sch = sched_of(s, NULL, s ? s->part : TS_CONV_ALL);
    return conv_forward(&g, (ts_conv_src){x->data, NULL, g.C, h}, w, b, &sch, s ? s->ep : NULL, y);
}

int ts_conv3d_cat_forward_split(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_tensor *bias,
                                const ts_conv_split *s, ts_tensor *y)
{
#ifdef TS_HAVE_CUDA
    if (a->device) return ts_cuda_conv3d_forward_split(a, b, w, bias, s, y);
#endif
    ts_conv_geom g;
    ts_tensor x;
    const ts_halo *h = s ? s->halo : NULL;
    TS_TRY(cat_shapes(a, b, &x));
    TS_TRY(conv_shapes(&x, w, bias, 1, 1, y, "conv3d output", &g));
    TS_TRY(halo_ok(h, &g, "conv3d split forward over a concatenation"));
    if (s && (s->part < TS_CONV_ALL || s->part > TS_CONV_BORDER))
        return TS_ERR(TS_ERR_ARG, "conv3d split forward: part %d (ALL, INTERIOR or BORDER)", (int)s->part);
    const ts_conv_sched sch = sched_of(s, NULL, s ? s->part : TS_CONV_ALL);
    return conv_forward(&g, (ts_conv_src){a->data, b->data, (int)a->shape[4], h}, w, bias, &sch, s ? s->ep : NULL, y);
}

int ts_conv3d_backward_split(const ts_tensor *x, const ts_tensor *w, const ts_conv_split *xs, const ts_conv_split *dys,
                             const ts_tensor *dy, ts_tensor *dx, ts_tensor *dw, ts_tensor *db)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_conv3d_backward_split(x, NULL, w, xs, dys, dy, dx, NULL, dw, db);
#endif
    ts_conv_geom g;
    const ts_halo *hx = xs ? xs->halo : NULL, *hy = dys ? dys->halo : NULL;
    TS_TRY(conv_shapes(x, w, db, 1, 1, dy, "conv3d output gradient", &g));
    TS_TRY(halo_ok(hx, &g, "conv3d split backward (input halo)"));
    TS_TRY(halo_ok(hy, &g, "conv3d split backward (output-gradient halo)"));
    TS_TRY(check_dw(dw, w));
    if (dx && (!ts_tensor_f32(dx) || !ts_tensor_same_shape(dx, x)))
        return TS_ERR(TS_ERR_ARG, "conv3d: input gradient must be float32 shaped like the input");
    const ts_conv_sched sch = sched_of(xs, dys, TS_CONV_ALL);
    return conv_backward(&g, (ts_conv_src){x->data, NULL, g.C, hx}, w, dy, hy, &sch,
                         (ts_conv_dst){dx ? dx->data : NULL, NULL, g.C, NULL}, dw, db);
}

int ts_conv3d_cat_backward_split(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_conv_split *xs,
                                 const ts_conv_split *dys, const ts_tensor *dy, ts_tensor *da, ts_tensor *db,
                                 ts_tensor *dw, ts_tensor *dbias)
{
#ifdef TS_HAVE_CUDA
    if (a->device) return ts_cuda_conv3d_backward_split(a, b, w, xs, dys, dy, da, db, dw, dbias);
#endif
    ts_conv_geom g;
    ts_tensor x;
    const ts_halo *hx = xs ? xs->halo : NULL, *hy = dys ? dys->halo : NULL;
    TS_TRY(cat_shapes(a, b, &x));
    TS_TRY(conv_shapes(&x, w, dbias, 1, 1, dy, "conv3d output gradient", &g));
    TS_TRY(halo_ok(hx, &g, "conv3d split backward over a concatenation (input halo)"));
    TS_TRY(halo_ok(hy, &g, "conv3d split backward over a concatenation (output-gradient halo)"));
    TS_TRY(check_dw(dw, w));
    TS_TRY(check_dcat(a, b, da, db));
    if (da && g.k < 2) /* padding 1 > k - 1: no gather form of the input gradient */
        return TS_ERR(TS_ERR_UNSUPPORTED, "conv3d over a concatenation: input gradient needs stride 1, padding < kernel");
    const int ca = (int)a->shape[4];
    const ts_conv_sched sch = sched_of(xs, dys, TS_CONV_ALL);
    return conv_backward(&g, (ts_conv_src){a->data, b->data, ca, hx}, w, dy, hy, &sch,
                         (ts_conv_dst){da ? da->data : NULL, da ? db->data : NULL, ca, NULL}, dw, dbias);
}

int ts_conv3d_s2_forward_split(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, const ts_halo *h, ts_tensor *y)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_conv3d_s2_forward_split(x, w, b, h, y);
#endif
    (void)w;
    (void)b;
    (void)h;
    (void)y;
    return TS_ERR(TS_ERR_UNSUPPORTED, "conv3d stride-2 split forward: device tensors only (the model grows a host box)");
}

int ts_conv3d_s2_backward_split(const ts_tensor *x, const ts_tensor *w, const ts_halo *xh, const ts_halo *dyh,
                                const ts_tensor *dy, ts_tensor *dx, ts_tensor *dw, ts_tensor *db)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_conv3d_s2_backward_split(x, w, xh, dyh, dy, dx, dw, db);
#endif
    (void)w;
    (void)xh;
    (void)dyh;
    (void)dy;
    (void)dx;
    (void)dw;
    (void)db;
    return TS_ERR(TS_ERR_UNSUPPORTED, "conv3d stride-2 split backward: device tensors only (the model grows a host box)");
}

int ts_halo_pack(const ts_tensor *a, const ts_tensor *b, unsigned mask, ts_tensor *dst)
{
#ifdef TS_HAVE_CUDA
    if (a->device) return ts_cuda_halo_pack(a, b, mask, dst);
#endif
    (void)b;
    (void)mask;
    (void)dst;
    return TS_ERR(TS_ERR_UNSUPPORTED, "halo pack: device tensors only (a host box is packed by the spatial exchange)");
}
