/* Softmax cross-entropy over the class dimension (last) of channels-last
 * logits, with ignore-index and class weights, PyTorch's mean reduction. */
#pragma GCC optimize("O3")
#include "tsbuild.h"
#include "src/nn/layers.h"
#include "src/nn/loss_impl.h"

#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define CHUNK 4096

/* sums over chunks in a fixed order: loss numerator and weight sum; bad = first bad label + 1 */
static int ce_sums(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, double *num, double *den)
{
    int64_t V, N;
    int K;
    TS_TRY(ts_nn_loss_shapes(logits, labels, "cross-entropy", &V, &K, &N));
    const float *l = logits->data, *w = o ? o->class_weights : NULL;
    const uint8_t *y = labels->data;
    const int ign = o ? o->ignore_index : -1;
    const int64_t nch = (V + CHUNK - 1) / CHUNK;
    double *part = TS_CALLOC((size_t)nch * 2, sizeof(double));
    if (!part) return TS_ERR_NOMEM;
    int64_t bad = -1;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t ch = 0; ch < nch; ch++) {
        float p[256];
        double a = 0, b = 0;
        for (int64_t v = ch * CHUNK; v < V && v < (ch + 1) * CHUNK; v++) {
            const int t = y[v];
            if (ts_nn_ignored(t, ign)) continue;
            if (t >= K) {
#pragma omp critical(ts_ce_bad)
                if (bad < 0 || v < bad) bad = v;
                continue;
            }
            const float lse = ts_nn_softmax(l + v * K, K, p), wt = w ? w[t] : 1.0f;
            a += (double)wt * (lse - l[v * K + t]);
            b += wt;
        }
        part[2 * ch] = a;
        part[2 * ch + 1] = b;
    }
    double sa = 0, sb = 0;
    for (int64_t ch = 0; ch < nch; ch++) {
        sa += part[2 * ch];
        sb += part[2 * ch + 1];
    }
    free(part);
    if (bad >= 0)
        return TS_ERR(TS_ERR_ARG, "cross-entropy: label %d at voxel %lld is not a class (0..%d) nor the ignore index",
                      y[bad], (long long)bad, K - 1);
    *num = sa;
    *den = sb;
    return 0;
}

int ts_softmax_ce_forward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, double *loss)
{
    double num, den;
    TS_TRY(ce_sums(logits, labels, o, &num, &den));
    *loss = den > 0 ? num / den : 0.0; /* every voxel ignored: 0 (PyTorch gives NaN) */
    return 0;
}

int ts_softmax_ce_backward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale,
                           ts_tensor *dlogits)
{
    double num, den;
    TS_TRY(ce_sums(logits, labels, o, &num, &den));
    if (!ts_tensor_f32(dlogits) || !ts_tensor_same_shape(dlogits, logits))
        return TS_ERR(TS_ERR_ARG, "cross-entropy: the logit gradient must be float32 shaped like the logits");
    if (den <= 0) return 0;
    const int K = (int)logits->shape[logits->ndim - 1];
    const int64_t V = ts_tensor_numel(labels);
    const float *l = logits->data, *w = o ? o->class_weights : NULL, f = (float)(scale / den);
    const uint8_t *y = labels->data;
    const int ign = o ? o->ignore_index : -1;
    float *d = dlogits->data;
#pragma omp parallel for schedule(dynamic, 1024)
    for (int64_t v = 0; v < V; v++) {
        const int t = y[v];
        if (ts_nn_ignored(t, ign)) continue;
        float p[256];
        ts_nn_softmax(l + v * K, K, p);
        const float c = f * (w ? w[t] : 1.0f);
        for (int k = 0; k < K; k++) d[v * K + k] += c * (p[k] - (k == t ? 1.0f : 0.0f));
    }
    return 0;
}
