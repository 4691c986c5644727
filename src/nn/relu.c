/* ReLU and leaky ReLU, elementwise, in place or not, and the elementwise
 * sum of two gradients (y += x). Local: no MPI, allocates nothing. */
#pragma GCC optimize("O3")
#include "tsbuild.h"
#include "src/nn/layers.h"
#ifdef TS_HAVE_CUDA
#include "src/nn/cuda/cuda_nn.h"
#endif
#include "src/core/error.h"

int ts_relu_forward(const ts_tensor *x, float slope, ts_tensor *y)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_relu_forward(x, slope, y);
#endif
    if (!ts_tensor_f32(x) || !ts_tensor_f32(y) || ts_tensor_numel(x) != ts_tensor_numel(y))
        return TS_ERR(TS_ERR_ARG, "relu: input and output must be float32 of the same size");
    const float *a = x->data;
    float *b = y->data;
    const int64_t n = ts_tensor_numel(x);
#pragma omp parallel for schedule(dynamic, 16384)
    for (int64_t i = 0; i < n; i++) b[i] = a[i] > 0.0f ? a[i] : slope * a[i];
    return 0;
}

int ts_add_inplace(ts_tensor *y, const ts_tensor *x)
{
#ifdef TS_HAVE_CUDA
    if (y->device) return ts_cuda_add_inplace(y, x);
#endif
    if (!ts_tensor_f32(x) || !ts_tensor_f32(y) || ts_tensor_numel(x) != ts_tensor_numel(y))
        return TS_ERR(TS_ERR_ARG, "add: both tensors must be float32 of the same size on the host");
    const float *a = x->data;
    float *b = y->data;
    const int64_t n = ts_tensor_numel(x);
#pragma omp parallel for schedule(dynamic, 16384)
    for (int64_t i = 0; i < n; i++) b[i] += a[i];
    return 0;
}

int ts_relu_backward(const ts_tensor *y, float slope, const ts_tensor *dy, ts_tensor *dx)
{
#ifdef TS_HAVE_CUDA
    if (y->device) return ts_cuda_relu_backward(y, slope, dy, dx);
#endif
    if (!ts_tensor_f32(y) || !ts_tensor_f32(dy) || !ts_tensor_f32(dx) || ts_tensor_numel(y) != ts_tensor_numel(dy) ||
        ts_tensor_numel(dy) != ts_tensor_numel(dx))
        return TS_ERR(TS_ERR_ARG, "relu backward: output, gradients must be float32 of the same size");
    const float *a = y->data, *g = dy->data;
    float *d = dx->data;
    const int64_t n = ts_tensor_numel(y);
#pragma omp parallel for schedule(dynamic, 16384)
    for (int64_t i = 0; i < n; i++) d[i] = a[i] > 0.0f ? g[i] : slope * g[i];
    return 0;
}
