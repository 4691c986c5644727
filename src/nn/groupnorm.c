/* Group norm and instance norm (PyTorch GroupNorm; InstanceNorm3d with
 * affine=True) on channels-last activations: statistics per sample and group
 * over the voxels and the group's channels, affine per channel. With
 * o->sync the voxels of a sample are spread over the ranks of a group
 * (spatial parallelism): the forward statistics are exact sums over the
 * group (norm_impl.h), the same on every layout; backward sums its two
 * gradient sums and the voxel counts over the group. */
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

typedef struct {
    int N, C, G, cg;
    size_t S;
} gn_dims;

/* the affine map of channel c in a group of mean m and inverse deviation iv:
 * shared by the forward and the backward's recomputed ReLU mask (the same bits) */
static void gn_affine(float g, float b, float m, float iv, float *scale, float *shift)
{
    *scale = g * iv;
    *shift = b - m * g * iv;
}

static int gn_shapes(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *mean, const ts_tensor *inv,
                     int groups, const ts_tensor *y, const char *yname, gn_dims *d)
{
    if (!ts_tensor_f32(x) || !ts_tensor_f32(y) || !ts_tensor_f32(gamma) || !ts_tensor_f32(mean) || !ts_tensor_f32(inv))
        return TS_ERR(TS_ERR_ARG, "groupnorm: tensors (input, %s, weight, saved statistics) must be float32", yname);
    if (x->ndim < 3) return TS_ERR(TS_ERR_ARG, "groupnorm: input must be [N, ..., C]");
    if (!ts_tensor_same_shape(x, y)) return TS_ERR(TS_ERR_ARG, "groupnorm: %s must have the input's shape", yname);
    d->N = (int)x->shape[0];
    d->C = (int)x->shape[x->ndim - 1];
    d->S = (size_t)(ts_tensor_numel(x) / ((int64_t)d->N * d->C));
    if (groups < 1 || d->C % groups || d->C / groups > 4096)
        return TS_ERR(TS_ERR_ARG, "groupnorm: %d groups do not divide %d channels", groups, d->C);
    d->G = groups;
    d->cg = d->C / groups;
    int64_t c = d->C;
    TS_TRY(ts_tensor_check_shape(gamma, "groupnorm weight", 1, &c));
    if (ts_tensor_numel(mean) != (int64_t)d->N * groups || ts_tensor_numel(inv) != (int64_t)d->N * groups)
        return TS_ERR(TS_ERR_ARG, "groupnorm: saved statistics need N*groups = %d values", d->N * groups);
    return 0;
}

int ts_groupnorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, const ts_norm_opts *o,
                         ts_tensor *y, ts_tensor *save_mean, ts_tensor *save_invstd)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_groupnorm_forward(x, gamma, beta, o, y, save_mean, save_invstd);
#endif
    int err = 0;
    gn_dims d;
    double *s = NULL;
    float *t = NULL;
    TS_CHECK(gn_shapes(x, gamma, save_mean, save_invstd, o->groups, y, "output", &d));
    {
        int64_t c = d.C;
        if (!ts_tensor_f32(beta)) TS_FAIL(TS_ERR_ARG, "groupnorm: bias must be float32");
        TS_CHECK(ts_tensor_check_shape(beta, "groupnorm bias", 1, &c));
    }
    if (d.S * d.cg < 1) TS_FAIL(TS_ERR_ARG, "groupnorm: empty groups");
    const size_t nc = (size_t)d.N * d.C, ng = (size_t)d.N * d.G;
    if (o->sync && 8 * ng + 1 > INT_MAX) TS_FAIL(TS_ERR_UNSUPPORTED, "groupnorm: %zu statistics to synchronise", ng);
    s = TS_CALLOC(3 * ng, sizeof(double));
    t = TS_ALIGNED_ALLOC(2 * nc * sizeof(float));
    if (!s || !t) TS_FAIL(TS_ERR_NOMEM, "groupnorm statistics");
    float *scale = t, *shift = t + nc, *mean = save_mean->data, *inv = save_invstd->data;
    const float *g = gamma->data, *b = beta->data;
    /* mean and variance per sample and group over the ranks that share them (norm_impl.h) */
    TS_CHECK(ts_nn_exact_stats(x->data, o->amax, d.N, d.S, d.C, d.G, o, s, s + ng, s + 2 * ng));
    for (int n = 0; n < d.N; n++)
        for (int gi = 0; gi < d.G; gi++) {
            const size_t j = (size_t)n * d.G + gi;
            const float iv = (float)(1.0 / sqrt(s[ng + j] + o->eps));
            mean[j] = (float)s[j];
            inv[j] = iv;
            for (int c = gi * d.cg; c < (gi + 1) * d.cg; c++)
                gn_affine(g[c], b[c], mean[j], iv, &scale[(size_t)n * d.C + c], &shift[(size_t)n * d.C + c]);
        }
    ts_nn_channel_affine(x->data, scale, shift, d.N, d.S, d.C, o->relu, o->slope, y->data);
cleanup:
    free(s);
    free(t);
    return err;
}

int ts_groupnorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *beta,
                          const ts_tensor *save_mean, const ts_tensor *save_invstd, const ts_norm_opts *o,
                          const ts_tensor *dy, ts_tensor *dx, ts_tensor *dgamma, ts_tensor *dbeta)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_groupnorm_backward(x, y, gamma, save_mean, save_invstd, o, dy, dx, dgamma, dbeta);
#endif
    int err = 0;
    gn_dims d;
    double *s = NULL;
    float *t = NULL;
    TS_CHECK(gn_shapes(x, gamma, save_mean, save_invstd, o->groups, dy, "output gradient", &d));
    if (dx && (!ts_tensor_f32(dx) || !ts_tensor_same_shape(dx, x)))
        TS_FAIL(TS_ERR_ARG, "groupnorm: input gradient must be float32 shaped like the input");
    (void)y; /* the GPU engine's mask; here it is recomputed from x (layers.h) */
    {
        int64_t c = d.C;
        if (beta) {
            if (!ts_tensor_f32(beta)) TS_FAIL(TS_ERR_ARG, "groupnorm: bias must be float32");
            TS_CHECK(ts_tensor_check_shape(beta, "groupnorm bias", 1, &c));
        } else if (o->relu) {
            TS_FAIL(TS_ERR_ARG, "groupnorm backward: the fused ReLU needs the bias (its mask is recomputed)");
        }
        if (dgamma) TS_CHECK(ts_tensor_check_shape(dgamma, "groupnorm weight gradient", 1, &c));
        if (dbeta) TS_CHECK(ts_tensor_check_shape(dbeta, "groupnorm bias gradient", 1, &c));
    }
    const size_t nc = (size_t)d.N * d.C;
    if (o->sync && 2 * nc + 1 > INT_MAX) TS_FAIL(TS_ERR_UNSUPPORTED, "groupnorm: %zu statistics to synchronise", nc);
    s = TS_CALLOC(2 * nc + 1, sizeof(double));
    t = TS_ALIGNED_ALLOC(6 * nc * sizeof(float));
    if (!s || !t) TS_FAIL(TS_ERR_NOMEM, "groupnorm backward");
    float *ctr = t, *a = t + nc, *b = t + 2 * nc, *k = t + 3 * nc;
    /* the fused ReLU's mask: the forward's pre-activation, from its scale and shift (the same bits) */
    float *msc = o->relu ? t + 4 * nc : NULL, *msh = msc ? msc + nc : NULL;
    const float *mean = save_mean->data, *inv = save_invstd->data, *g = gamma->data;
    for (int n = 0; n < d.N; n++)
        for (int c = 0; c < d.C; c++) {
            const size_t i = (size_t)n * d.C + c, j = (size_t)n * d.G + c / d.cg;
            ctr[i] = mean[j];
            if (msc) gn_affine(g[c], ((const float *)beta->data)[c], mean[j], inv[j], &msc[i], &msh[i]);
        }
    TS_CHECK(ts_nn_channel_grad_sums(x->data, dy->data, msc, msh, o->slope, ctr, d.N, d.S, d.C, s, s + nc));
    /* the weight and bias gradients from this rank's sums (its share) */
    for (int n = 0; n < d.N; n++)
        for (int c = 0; c < d.C; c++) {
            const size_t i = (size_t)n * d.C + c;
            const double iv = inv[n * d.G + c / d.cg];
            if (dgamma) ((float *)dgamma->data)[c] += (float)(s[nc + i] * iv);
            if (dbeta) ((float *)dbeta->data)[c] += (float)s[i];
        }
    if (!dx) goto cleanup;
    double St = (double)d.S;
    if (o->sync) { /* the input gradient from the group's sums over the group's count */
        s[2 * nc] = (double)d.S;
        TS_CHECK(o->sync(o->sync_ctx, s, (int)(2 * nc + 1), TS_SYNC_SUM));
        St = s[2 * nc];
    }
    const double m = St * d.cg;
    for (int n = 0; n < d.N; n++)
        for (int gi = 0; gi < d.G; gi++) {
            const double iv = inv[n * d.G + gi];
            double A = 0, B = 0;
            for (int c = gi * d.cg; c < (gi + 1) * d.cg; c++) {
                const size_t i = (size_t)n * d.C + c;
                A += (double)g[c] * s[i];
                B += (double)g[c] * s[nc + i] * iv;
            }
            for (int c = gi * d.cg; c < (gi + 1) * d.cg; c++) {
                const size_t i = (size_t)n * d.C + c;
                a[i] = (float)(g[c] * iv);
                b[i] = (float)(-iv * iv * B / m);
                k[i] = (float)(-iv * A / m);
            }
        }
    ts_nn_norm_dx(x->data, dy->data, msc, msh, o->slope, ctr, a, b, k, d.N, d.S, d.C, dx->data);
cleanup:
    free(s);
    free(t);
    return err;
}

int ts_instancenorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, const ts_norm_opts *o,
                            ts_tensor *y, ts_tensor *save_mean, ts_tensor *save_invstd)
{
    ts_norm_opts io = *o;
    io.groups = (int)x->shape[x->ndim - 1];
    return ts_groupnorm_forward(x, gamma, beta, &io, y, save_mean, save_invstd);
}

int ts_instancenorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *beta,
                             const ts_tensor *save_mean, const ts_tensor *save_invstd, const ts_norm_opts *o,
                             const ts_tensor *dy, ts_tensor *dx, ts_tensor *dgamma, ts_tensor *dbeta)
{
    ts_norm_opts io = *o;
    io.groups = (int)x->shape[x->ndim - 1];
    return ts_groupnorm_backward(x, y, gamma, beta, save_mean, save_invstd, &io, dy, dx, dgamma, dbeta);
}
