/* Softmax cross-entropy over the class dimension (last) of channels-last
 * logits, with ignore-index and class weights, PyTorch's mean reduction.
 * Two passes: the weight sum over the labels (no softmax), then one softmax
 * per voxel giving the loss and, when asked, the gradient. With o->sync
 * (samples split over the ranks of a group) the weight sum is summed over
 * the group before the gradient pass and the numerator after it; errors
 * travel in the same sums, so that every rank of the group fails together. */
#pragma GCC optimize("O3")
#include "tsbuild.h"
#include "src/nn/layers.h"
#ifdef TS_HAVE_CUDA
#include "src/nn/cuda/cuda_nn.h"
#endif
#include "src/nn/loss_impl.h"
#pragma GCC diagnostic ignored "-Wpsabi" /* loss_impl.h's vector helpers are static: no call leaves this file, no ABI to differ */

#include <stdlib.h>
#include <string.h>

#define CHUNK 4096

/* sum of w[label] over kept voxels; a label >= K that is not ignored is an error */
static int ce_den(const ts_tensor *labels, int K, const ts_loss_opts *o, double *den)
{
    const uint8_t *y = labels->data;
    const float *w = o ? o->class_weights : NULL;
    const int ign = o ? o->ignore_index : -1;
    const int64_t V = ts_tensor_numel(labels);
    int64_t count[256] = {0};
    for (int64_t v = 0; v < V; v++) count[y[v]]++;
    double d = 0;
    for (int t = 0; t < 256; t++) {
        if (!count[t] || ts_nn_ignored(t, ign)) continue;
        if (t >= K) {
            int64_t v = 0;
            while (y[v] != t) v++;
            return TS_ERR(TS_ERR_ARG, "cross-entropy: label %d at voxel %lld is not a class (0..%d) nor the ignore index",
                          t, (long long)v, K - 1);
        }
        d += (double)count[t] * (w ? w[t] : 1.0f);
    }
    *den = d;
    return 0;
}

/* the loss numerator; with dl: dl += f * w[label] (softmax - onehot) */
static int ce_pass(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float f, float *dl,
                   double *num)
{
    const int K = (int)logits->shape[logits->ndim - 1];
    const int64_t V = ts_tensor_numel(labels), nch = (V + CHUNK - 1) / CHUNK;
    const float *l = logits->data, *w = o ? o->class_weights : NULL;
    const uint8_t *y = labels->data;
    const int ign = o ? o->ignore_index : -1;
    double *part = TS_CALLOC((size_t)nch, sizeof(double));
    if (!part) return TS_ERR_NOMEM;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t ch = 0; ch < nch; ch++) {
        float p[256 * TS_LANES], lse[TS_LANES];
        double a = 0;
        const int64_t c1 = (ch + 1) * CHUNK < V ? (ch + 1) * CHUNK : V;
        for (int64_t v0 = ch * CHUNK; v0 < c1; v0 += TS_LANES) {
            const int nv = c1 - v0 < TS_LANES ? (int)(c1 - v0) : TS_LANES;
            ts_nn_softmax16(l + v0 * K, K, nv, p, lse);
            for (int j = 0; j < nv; j++) {
                const int64_t v = v0 + j;
                const int t = y[v];
                if (ts_nn_ignored(t, ign)) continue;
                a += (double)(w ? w[t] : 1.0f) * (lse[j] - l[v * K + t]);
            }
            if (dl) { /* dl += f w[label] (softmax - onehot), 16 voxels at a time */
                const ts_li16 t = ts_nn_labels16(y + v0, nv), keep = (t != ign) & (t >= 0);
                ts_lv16 c = ts_nn_vsel(keep, (ts_lv16){0} + f, (ts_lv16){0}); /* f w[label], 0 where ignored */
                if (w)
                    for (int j = 0; j < nv; j++) c[j] *= keep[j] ? w[t[j]] : 1.0f;
                for (int k = 0; k < K; k++) {
                    ts_lv16 pk;
                    memcpy(&pk, p + k * TS_LANES, sizeof pk);
                    pk = c * (pk - ts_nn_vsel(t == k, (ts_lv16){0} + 1.0f, (ts_lv16){0}));
                    memcpy(p + k * TS_LANES, &pk, sizeof pk);
                }
                ts_nn_add_lanes(dl + v0 * K, K, nv, p);
            }
        }
        part[ch] = a;
    }
    double s = 0;
    for (int64_t ch = 0; ch < nch; ch++) s += part[ch];
    free(part);
    *num = s;
    return 0;
}

static int ce(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale, ts_tensor *dlogits,
              double *loss)
{
    int64_t V = 0, N = 1;
    int K = 1, err = 0;
    double den = 0, num = 0;
    /* errors before the first sum: a label that is not a class (agreed as
     * such), or anything else (agreed as another rank's failure) */
    int label_err = 0;
    err = ts_nn_loss_shapes(logits, labels, "cross-entropy", &V, &K, &N);
    if (!err && dlogits && (!ts_tensor_f32(dlogits) || !ts_tensor_same_shape(dlogits, logits)))
        err = TS_ERR(TS_ERR_ARG, "cross-entropy: the logit gradient must be float32 shaped like the logits");
    if (!err) label_err = (err = ce_den(labels, K, o, &den)) != 0;
    if (o && o->sync) {
        double t[3] = {err ? 0.0 : den, label_err ? 1.0 : 0.0, err && !label_err ? 1.0 : 0.0};
        TS_TRY(o->sync(o->sync_ctx, t, 3, TS_SYNC_SUM));
        if (err) return err; /* this rank's own message */
        if (t[1] > 0)
            return TS_ERR(TS_ERR_ARG, "cross-entropy: a label on another rank of the group is not a class (0..%d) nor the "
                                      "ignore index", K - 1);
        if (t[2] > 0) return TS_ERR(TS_ERR_REMOTE, "cross-entropy: another rank of the group failed");
        den = t[0];
    }
    if (err) return err;
    if (den <= 0) { /* every voxel ignored: loss 0, no gradient (PyTorch gives NaN) */
        if (loss) *loss = 0;
        return 0;
    }
    err = ce_pass(logits, labels, o, (float)(scale / den), dlogits ? dlogits->data : NULL, &num);
    if (o && o->sync && loss) { /* the numerator over the group (with a failure flag) */
        double t[2] = {err ? 0.0 : num, err ? 1.0 : 0.0};
        TS_TRY(o->sync(o->sync_ctx, t, 2, TS_SYNC_SUM));
        if (err) return err;
        if (t[1] > 0) return TS_ERR(TS_ERR_REMOTE, "cross-entropy: another rank of the group failed");
        num = t[0];
    }
    if (err) return err;
    if (loss) *loss = num / den;
    return 0;
}

int ts_softmax_ce_forward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, double *loss)
{
#ifdef TS_HAVE_CUDA
    if (logits->device) return ts_cuda_softmax_ce(logits, labels, o, 0.0f, loss, NULL);
#endif
    return ce(logits, labels, o, 0.0f, NULL, loss);
}

int ts_softmax_ce_backward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale,
                           ts_tensor *dlogits)
{
#ifdef TS_HAVE_CUDA
    if (logits->device && dlogits) return ts_cuda_softmax_ce(logits, labels, o, scale, NULL, dlogits);
#endif
    if (!dlogits) return TS_ERR(TS_ERR_ARG, "cross-entropy backward: no gradient tensor");
    return ce(logits, labels, o, scale, dlogits, NULL);
}

int ts_softmax_ce_forward_backward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale,
                                   double *loss, ts_tensor *dlogits)
{
#ifdef TS_HAVE_CUDA
    if (logits->device && dlogits) return ts_cuda_softmax_ce(logits, labels, o, scale, loss, dlogits);
#endif
    if (!dlogits) return TS_ERR(TS_ERR_ARG, "cross-entropy backward: no gradient tensor");
    return ce(logits, labels, o, scale, dlogits, loss);
}
