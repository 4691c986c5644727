/* Batch norm (PyTorch BatchNorm3d semantics) on channels-last activations:
 * batch statistics in training (exact sums, the same over any split of the
 * batch: norm_impl.h), running
 * statistics with momentum and the unbiased variance, eval mode with the
 * running statistics; optionally with a fused ReLU. */
#include "tsbuild.h"
#include "src/nn/layers.h"
#ifdef TS_HAVE_CUDA
#include "src/nn/cuda/cuda_nn.h"
#endif
#include "src/nn/norm_impl.h"
#include "src/core/error.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int vec_ok(const ts_tensor *t, int64_t c, const char *what)
{
    if (!t) return 0;
    if (!ts_tensor_f32(t)) return TS_ERR(TS_ERR_ARG, "batchnorm: %s must be float32", what);
    return ts_tensor_check_shape(t, what, 1, &c);
}

static int bn_shapes(const ts_tensor *x, const ts_tensor *y, const char *yname)
{
    if (!ts_tensor_f32(x) || !ts_tensor_f32(y)) return TS_ERR(TS_ERR_ARG, "batchnorm: tensors must be float32");
    if (x->ndim < 2) return TS_ERR(TS_ERR_ARG, "batchnorm: input needs a channel dimension");
    if (!ts_tensor_same_shape(x, y)) return TS_ERR(TS_ERR_ARG, "batchnorm: %s must have the input's shape", yname);
    return 0;
}

/* eval mode's inverse standard deviation, and the affine map of a channel:
 * shared by the forward and ts_batchnorm_fold (the same bits) */
static float eval_inv(float rv, double eps) { return (float)(1.0 / sqrt((double)rv + eps)); }
static void affine_of(float g, float b, float mean, float inv, float *scale, float *shift)
{
    *scale = g * inv;
    *shift = b - mean * *scale;
}

int ts_batchnorm_fold(const ts_tensor *gamma, const ts_tensor *beta, const ts_tensor *running_mean,
                      const ts_tensor *running_var, double eps, float *scale, float *shift)
{
    if (!ts_tensor_f32(gamma) || gamma->ndim != 1) return TS_ERR(TS_ERR_ARG, "batchnorm fold: weight must be a float32 vector on the host");
    const int C = (int)gamma->shape[0];
    TS_TRY(vec_ok(beta, C, "batchnorm bias"));
    TS_TRY(vec_ok(running_mean, C, "batchnorm running_mean"));
    TS_TRY(vec_ok(running_var, C, "batchnorm running_var"));
    if (!beta || !running_mean || !running_var || !scale || !shift)
        return TS_ERR(TS_ERR_ARG, "batchnorm fold: bias, running statistics, scale and shift are required");
    const float *g = gamma->data, *b = beta->data, *rm = running_mean->data, *rv = running_var->data;
    for (int c = 0; c < C; c++) affine_of(g[c], b[c], rm[c], eval_inv(rv[c], eps), &scale[c], &shift[c]);
    return 0;
}

int ts_batchnorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, ts_tensor *running_mean,
                         ts_tensor *running_var, int train, const ts_norm_opts *o, ts_tensor *y,
                         ts_tensor *save_mean, ts_tensor *save_invstd)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_batchnorm_forward(x, gamma, beta, running_mean, running_var, train, o, y, save_mean, save_invstd);
#endif
    int err = 0;
    double *s = NULL;
    float *sc = NULL;
    TS_CHECK(bn_shapes(x, y, "output"));
    const int C = (int)x->shape[x->ndim - 1];
    const size_t M = (size_t)(ts_tensor_numel(x) / C);
    TS_CHECK(vec_ok(gamma, C, "batchnorm weight"));
    TS_CHECK(vec_ok(beta, C, "batchnorm bias"));
    TS_CHECK(vec_ok(running_mean, C, "batchnorm running_mean"));
    TS_CHECK(vec_ok(running_var, C, "batchnorm running_var"));
    TS_CHECK(vec_ok(save_mean, C, "batchnorm saved mean"));
    TS_CHECK(vec_ok(save_invstd, C, "batchnorm saved invstd"));
    if (!gamma || !beta || !save_mean || !save_invstd) TS_FAIL(TS_ERR_ARG, "batchnorm: weight, bias and saved statistics are required");
    if (!train && (!running_mean || !running_var)) TS_FAIL(TS_ERR_ARG, "batchnorm: eval mode needs the running statistics");
    /* with sync the count that matters is the group's (checked after the sums, on every rank alike) */
    if (train && !o->sync && M < 2) TS_FAIL(TS_ERR_ARG, "batchnorm: training needs more than one value per channel");
    if (o->sync && 8 * (size_t)C + 1 > INT_MAX) TS_FAIL(TS_ERR_UNSUPPORTED, "batchnorm: %d channels to synchronise", C);
    s = TS_CALLOC((size_t)3 * C, sizeof(double));
    sc = TS_ALIGNED_ALLOC((size_t)2 * C * sizeof(float));
    if (!s || !sc) TS_FAIL(TS_ERR_NOMEM, "batchnorm statistics");
    float *mean = ts_tensor_f32(save_mean), *inv = ts_tensor_f32(save_invstd), *scale = sc, *shift = sc + C;
    const float *g = gamma->data, *b = beta->data;
    double Mt = (double)M; /* values per channel over the ranks that share the statistics */
    if (train) {
        /* mean and variance per channel over the ranks that share them (norm_impl.h) */
        if (o->amax) { /* the epilogue's per-sample maxima, over the batch */
            const int64_t ns = x->shape[0];
            for (int c = 0; c < C; c++) {
                float m = 0.0f;
                for (int64_t n = 0; n < ns; n++) m = fmaxf(m, o->amax[n * C + c]);
                sc[c] = m;
            }
        }
        TS_CHECK(ts_nn_exact_stats(x->data, o->amax ? sc : NULL, 1, M, C, C, o, s, s + C, s + 2 * C));
        Mt = s[2 * C];
        if (o->sync && Mt < 2) TS_FAIL(TS_ERR_ARG, "batchnorm: training needs more than one value per channel (the group has %.0f)", Mt);
        for (int c = 0; c < C; c++) {
            const double mu = s[c], var = s[C + c];
            mean[c] = (float)mu;
            inv[c] = (float)(1.0 / sqrt(var + o->eps));
            if (running_mean && running_var) {
                float *rm = running_mean->data, *rv = running_var->data;
                rm[c] = (float)((1.0 - o->momentum) * rm[c] + o->momentum * mu);
                rv[c] = (float)((1.0 - o->momentum) * rv[c] + o->momentum * var * Mt / (Mt - 1));
            }
        }
    } else {
        const float *rm = running_mean->data, *rv = running_var->data;
        for (int c = 0; c < C; c++) {
            mean[c] = rm[c];
            inv[c] = eval_inv(rv[c], o->eps);
        }
    }
    for (int c = 0; c < C; c++) affine_of(g[c], b[c], mean[c], inv[c], &scale[c], &shift[c]);
    ts_nn_channel_affine(x->data, scale, shift, 1, M, C, o->relu, o->slope, y->data);
cleanup:
    free(s);
    free(sc);
    return err;
}

int ts_batchnorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *beta,
                          const ts_tensor *save_mean, const ts_tensor *save_invstd, int train, const ts_norm_opts *o,
                          const ts_tensor *dy, ts_tensor *dx, ts_tensor *dgamma, ts_tensor *dbeta)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_batchnorm_backward(x, y, gamma, save_mean, save_invstd, train, o, dy, dx, dgamma, dbeta);
#endif
    int err = 0;
    double *s = NULL;
    float *k = NULL;
    TS_CHECK(bn_shapes(x, dy, "output gradient"));
    const int C = (int)x->shape[x->ndim - 1];
    const size_t M = (size_t)(ts_tensor_numel(x) / C);
    TS_CHECK(vec_ok(gamma, C, "batchnorm weight"));
    TS_CHECK(vec_ok(save_mean, C, "batchnorm saved mean"));
    TS_CHECK(vec_ok(save_invstd, C, "batchnorm saved invstd"));
    TS_CHECK(vec_ok(dgamma, C, "batchnorm weight gradient"));
    TS_CHECK(vec_ok(dbeta, C, "batchnorm bias gradient"));
    if (dx) TS_CHECK(bn_shapes(x, dx, "input gradient"));
    TS_CHECK(vec_ok(beta, C, "batchnorm bias"));
    if (o->relu && !beta) TS_FAIL(TS_ERR_ARG, "batchnorm backward: the fused ReLU needs the bias (its mask is recomputed)");
    if (!gamma || !save_mean || !save_invstd) TS_FAIL(TS_ERR_ARG, "batchnorm backward: weight and saved statistics are required");
    (void)y; /* the GPU engine's mask; here it is recomputed from x (layers.h) */
    s = TS_CALLOC((size_t)2 * C, sizeof(double));
    k = TS_ALIGNED_ALLOC((size_t)5 * C * sizeof(float));
    if (!s || !k) TS_FAIL(TS_ERR_NOMEM, "batchnorm backward");
    const float *mean = save_mean->data, *inv = save_invstd->data, *g = gamma->data;
    /* the fused ReLU's mask: the forward's pre-activation, from its scale and shift (the same bits) */
    float *msc = o->relu ? k + 3 * C : NULL, *msh = msc ? msc + C : NULL;
    if (msc)
        for (int c = 0; c < C; c++) affine_of(g[c], ((const float *)beta->data)[c], mean[c], inv[c], &msc[c], &msh[c]);
    TS_CHECK(ts_nn_channel_grad_sums(x->data, dy->data, msc, msh, o->slope, mean, 1, M, C, s, s + C)); /* sum dy, sum dy (x - mean) */
    for (int c = 0; c < C; c++) {
        if (dgamma) ((float *)dgamma->data)[c] += (float)(s[C + c] * inv[c]);
        if (dbeta) ((float *)dbeta->data)[c] += (float)s[c];
    }
    /* synchronised: the weight and bias gradients stay local (data
     * parallelism averages them), the input gradient uses the group's sums
     * over the group's count (PyTorch SyncBatchNorm) */
    double Mt = (double)M;
    if (o->sync && train && dx) {
        double *t = TS_CALLOC((size_t)2 * C + 1, sizeof(double));
        if (!t) TS_FAIL(TS_ERR_NOMEM, "batchnorm backward");
        memcpy(t, s, sizeof *t * (size_t)(2 * C));
        t[2 * C] = (double)M;
        int e = o->sync(o->sync_ctx, t, 2 * C + 1, TS_SYNC_SUM);
        memcpy(s, t, sizeof *t * (size_t)(2 * C));
        Mt = t[2 * C];
        free(t);
        TS_CHECK(e);
    }
    if (dx) {
        float *a = k, *b = k + C, *kk = k + 2 * C;
        for (int c = 0; c < C; c++) {
            const double scale = (double)g[c] * inv[c];
            a[c] = (float)scale;
            if (train) {
                b[c] = (float)(-scale * inv[c] * inv[c] * s[C + c] / Mt);
                kk[c] = (float)(-scale * s[c] / Mt);
            } else {
                b[c] = kk[c] = 0.0f;
            }
        }
        ts_nn_norm_dx(x->data, dy->data, msc, msh, o->slope, mean, a, b, kk, 1, M, C, dx->data);
    }
cleanup:
    free(s);
    free(k);
    return err;
}
