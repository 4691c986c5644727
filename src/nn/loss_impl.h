/* Private to src/nn: shape checks and per-voxel softmax shared by the losses. */
#ifndef TS_NN_LOSS_IMPL_H
#define TS_NN_LOSS_IMPL_H

#include <math.h>
#include <stdint.h>

#include "src/core/error.h"
#include "src/core/tensor.h"

/* logits [N, ..., K] float32, labels [N, ...] uint8 with the same leading dims. */
static inline int ts_nn_loss_shapes(const ts_tensor *logits, const ts_tensor *labels, const char *who, int64_t *voxels,
                                    int *K, int64_t *N)
{
    char a[96], b[96];
    int ok = ts_tensor_f32(logits) && labels->dtype == TS_UINT8 && logits->ndim >= 2 && labels->ndim == logits->ndim - 1;
    for (int i = 0; ok && i < labels->ndim; i++) ok = labels->shape[i] == logits->shape[i];
    if (!ok)
        return TS_ERR(TS_ERR_ARG, "%s: logits %s (float32, classes last) and labels %s (uint8) do not match", who,
                      ts_tensor_shape_str(logits, a, sizeof a), ts_tensor_shape_str(labels, b, sizeof b));
    *K = (int)logits->shape[logits->ndim - 1];
    *voxels = ts_tensor_numel(labels);
    *N = logits->shape[0];
    if (*K < 1 || *K > 256) return TS_ERR(TS_ERR_ARG, "%s: %d classes (1..256)", who, *K);
    return 0;
}

/* p[k] = softmax(l)[k]; returns log-sum-exp */
static inline float ts_nn_softmax(const float *l, int K, float *p)
{
    float m = l[0];
    for (int k = 1; k < K; k++) m = l[k] > m ? l[k] : m;
    float s = 0;
    for (int k = 0; k < K; k++) s += (p[k] = expf(l[k] - m));
    const float r = 1.0f / s;
    for (int k = 0; k < K; k++) p[k] *= r;
    return m + logf(s);
}

static inline int ts_nn_ignored(int label, int ignore_index) { return label == ignore_index; }

#endif
