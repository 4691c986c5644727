/* conv3d: forward and backward of a cubic-kernel 3D convolution on
 * channels-last activations (weights in PyTorch's [Cout, Cin, k, k, k]).
 * Forward and weight gradient use the register-blocked kernels of
 * conv_kernels.c; the input gradient is a gather convolution with flipped
 * taps at stride 1 and a transposed gather otherwise. */
#include "tsbuild.h"
#include "src/nn/layers.h"
#include "src/nn/conv_impl.h"
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
 * transpose swaps the roles: wp[t][co][cip] = w[co][ci][t']. */
static float *pack(const float *w, int cout, int cin, int taps, int flip, int transpose)
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
    }
    return wp;
}

int ts_conv3d_forward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, int pad, ts_tensor *y)
{
    ts_conv_geom g;
    TS_TRY(conv_shapes(x, w, b, stride, pad, y, "conv3d output", &g));
    float *wp = pack(w->data, g.OC, g.C, g.k * g.k * g.k, 0, 0);
    if (!wp) return TS_ERR_NOMEM;
    return ts_nn_gather(&g, x->data, wp, b ? b->data : NULL, y->data);
}

int ts_conv3d_backward(const ts_tensor *x, const ts_tensor *w, int stride, int pad, const ts_tensor *dy,
                       ts_tensor *dx, ts_tensor *dw, ts_tensor *db)
{
    int err = 0;
    ts_conv_geom g;
    float *wp = NULL, *dwp = NULL;
    TS_CHECK(conv_shapes(x, w, db, stride, pad, dy, "conv3d output gradient", &g));
    const int taps = g.k * g.k * g.k;
    if (db) TS_CHECK(ts_nn_bias_grad(dy->data, (size_t)g.N * g.OD * g.OH * g.OW, g.OC, db->data));
    if (dw) {
        if (!ts_tensor_f32(dw) || !ts_tensor_same_shape(dw, w))
            TS_FAIL(TS_ERR_ARG, "conv3d: weight gradient must be float32 shaped like the weight");
        dwp = ts_nn_scratch(2, (size_t)taps * g.C * g.OC * sizeof(float));
        if (!dwp) TS_FAIL(TS_ERR_NOMEM, "conv3d weight gradient");
        TS_CHECK(ts_nn_wgrad(&g, x->data, dy->data, dwp));
        float *d = dw->data;
#pragma omp parallel for schedule(dynamic, 1)
        for (int co = 0; co < g.OC; co++)
            for (int ci = 0; ci < g.C; ci++)
                for (int t = 0; t < taps; t++) d[((size_t)co * g.C + ci) * taps + t] += dwp[((size_t)t * g.C + ci) * g.OC + co];
    }
    if (dx) {
        if (!ts_tensor_f32(dx) || !ts_tensor_same_shape(dx, x))
            TS_FAIL(TS_ERR_ARG, "conv3d: input gradient must be float32 shaped like the input");
        if (stride == 1 && pad <= g.k - 1) {
            /* dx = conv(dy, flipped w^T) with padding k-1-pad */
            ts_conv_geom b = {g.N, g.OD, g.OH, g.OW, g.OC, g.D, g.H, g.W, g.C, g.k, 1, g.k - 1 - pad};
            wp = pack(w->data, g.OC, g.C, taps, 1, 1);
            if (!wp) TS_FAIL(TS_ERR_NOMEM, "conv3d backward weights");
            TS_CHECK(ts_nn_gather(&b, dy->data, wp, NULL, dx->data));
        } else {
            ts_conv_geom b = {g.N, g.OD, g.OH, g.OW, g.OC, g.D, g.H, g.W, g.C, g.k, stride, pad};
            wp = pack(w->data, g.OC, g.C, taps, 0, 1);
            if (!wp) TS_FAIL(TS_ERR_NOMEM, "conv3d backward weights");
            TS_CHECK(ts_nn_tgather(&b, dy->data, wp, NULL, dx->data));
        }
    }
cleanup:
    return err;
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

int ts_conv3d_cat_forward(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_tensor *bias,
                          int stride, int pad, ts_tensor *y)
{
    ts_conv_geom g;
    ts_tensor x;
    TS_TRY(cat_shapes(a, b, &x));
    TS_TRY(conv_shapes(&x, w, bias, stride, pad, y, "conv3d output", &g));
    float *wp = pack(w->data, g.OC, g.C, g.k * g.k * g.k, 0, 0);
    if (!wp) return TS_ERR_NOMEM;
    return ts_nn_gather2(&g, (ts_conv_src){a->data, b->data, (int)a->shape[4]}, wp, bias ? bias->data : NULL,
                         (ts_conv_dst){y->data, NULL, g.OC});
}

int ts_conv3d_cat_backward(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, int stride, int pad,
                           const ts_tensor *dy, ts_tensor *da, ts_tensor *db, ts_tensor *dw, ts_tensor *dbias)
{
    int err = 0;
    ts_conv_geom g;
    ts_tensor x;
    TS_CHECK(cat_shapes(a, b, &x));
    TS_CHECK(conv_shapes(&x, w, dbias, stride, pad, dy, "conv3d output gradient", &g));
    const int taps = g.k * g.k * g.k, ca = (int)a->shape[4];
    const ts_conv_src src = {a->data, b->data, ca};
    if (dbias) TS_CHECK(ts_nn_bias_grad(dy->data, (size_t)g.N * g.OD * g.OH * g.OW, g.OC, dbias->data));
    if (dw) {
        if (!ts_tensor_f32(dw) || !ts_tensor_same_shape(dw, w))
            TS_FAIL(TS_ERR_ARG, "conv3d: weight gradient must be float32 shaped like the weight");
        float *dwp = ts_nn_scratch(2, (size_t)taps * g.C * g.OC * sizeof(float));
        if (!dwp) TS_FAIL(TS_ERR_NOMEM, "conv3d weight gradient");
        TS_CHECK(ts_nn_wgrad2(&g, src, dy->data, dwp));
        float *d = dw->data;
#pragma omp parallel for schedule(dynamic, 1)
        for (int co = 0; co < g.OC; co++)
            for (int ci = 0; ci < g.C; ci++)
                for (int t = 0; t < taps; t++) d[((size_t)co * g.C + ci) * taps + t] += dwp[((size_t)t * g.C + ci) * g.OC + co];
    }
    if (da || db) {
        if (!da || !db || !ts_tensor_f32(da) || !ts_tensor_f32(db) || !ts_tensor_same_shape(da, a) || !ts_tensor_same_shape(db, b))
            TS_FAIL(TS_ERR_ARG, "conv3d over a concatenation: both input gradients, shaped like the inputs");
        if (stride != 1 || pad > g.k - 1)
            TS_FAIL(TS_ERR_UNSUPPORTED, "conv3d over a concatenation: input gradient needs stride 1, padding < kernel");
        ts_conv_geom r = {g.N, g.OD, g.OH, g.OW, g.OC, g.D, g.H, g.W, g.C, g.k, 1, g.k - 1 - pad};
        float *wp = pack(w->data, g.OC, g.C, taps, 1, 1);
        if (!wp) TS_FAIL(TS_ERR_NOMEM, "conv3d backward weights");
        TS_CHECK(ts_nn_gather2(&r, (ts_conv_src){dy->data, NULL, g.OC}, wp, NULL, (ts_conv_dst){da->data, db->data, ca}));
    }
cleanup:
    return err;
}
