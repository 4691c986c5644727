// The optimizer on the GPU (src/optim/cuda/optim_cuda.h): SGD, AdamW,
// gradient scaling and the sum of squares over the arena's device
// regions. Launchers only; each queues one kernel on the given stream and
// returns TS_ERR_CUDA if the launch failed. No cuDNN, cuBLAS, MPI or NCCL.
#include <cuda_runtime.h>
#include <stdint.h>

// The updates are the CPU's bit for bit: no multiply-add is contracted into
// an FMA on either side (sgd.c and adamw.c are compiled with
// fp-contract=off), products and sums are rounded one at a time (__fmul_rn
// and __fadd_rn, which nvcc never contracts; the CPU's CUDA emulator calls
// them as functions it does not inline), division and square root are
// IEEE's (nvcc's defaults, without --use_fast_math).
#define MUL(a, b) __fmul_rn((a), (b))
#define ADD(a, b) __fadd_rn((a), (b))

#define TS_ERROR_NO_MPI 1
extern "C" {
#include "src/core/error.h"
#include "src/optim/cuda/optim_cuda.h"
}
#include "src/core/cuda_launch.h"

// sgd.c's loop (p -= x is p + -x, the same rounding): d = g + wd p; buf = m buf + d; d = nesterov ? d + m buf : buf; p -= lr d
__global__ void sgd_k(float *p, const float *g, float *buf, size_t n, float lr, float fm, float fwd, int nesterov)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float d = ADD(g[i], MUL(fwd, p[i]));
        if (buf) {
            buf[i] = ADD(MUL(fm, buf[i]), d);
            d = nesterov ? ADD(d, MUL(fm, buf[i])) : buf[i];
        }
        p[i] = ADD(p[i], -MUL(lr, d));
    }
}

// adamw.c's loop
__global__ void adamw_k(float *p, const float *g, float *m, float *v, size_t n, float step, float rbc2, float decay,
                        float fb1, float fb2, float feps)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float gi = g[i];
        p[i] = MUL(p[i], decay);
        m[i] = ADD(MUL(fb1, m[i]), MUL(1.0f - fb1, gi));
        v[i] = ADD(MUL(fb2, v[i]), MUL(MUL(1.0f - fb2, gi), gi));
        p[i] = ADD(p[i], -(MUL(step, m[i]) / ADD(MUL(sqrtf(v[i]), rbc2), feps)));
    }
}

__global__ void scale_k(float *g, size_t n, float f)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] = MUL(g[i], f);
}

// block b: the elements i with (i / 256) % gridDim == b, each thread its column of them, then a tree in
// shared memory (256 threads): a fixed order for a given n
__global__ void sumsq_k(const float *g, size_t n, double *part)
{
    __shared__ double s[256];
    double acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += (double)g[i] * g[i];
    s[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned h = blockDim.x / 2; h > 0; h /= 2) {
        if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = s[0];
}

extern "C" int ts_cuo_sgd(float *p, const float *g, float *buf, size_t n, float lr, float momentum, float wd,
                          int nesterov, void *stream)
{
    if (n == 0) return 0;
    sgd_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(p, g, buf, n, lr, momentum, wd, nesterov);
    return TS_CU_LAUNCHED("SGD update");
}

extern "C" int ts_cuo_adamw(float *p, const float *g, float *m, float *v, size_t n, float step, float rbc2,
                            float decay, float b1, float b2, float eps, void *stream)
{
    if (n == 0) return 0;
    adamw_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(p, g, m, v, n, step, rbc2, decay, b1, b2, eps);
    return TS_CU_LAUNCHED("AdamW update");
}

extern "C" int ts_cuo_scale(float *g, size_t n, float f, void *stream)
{
    if (n == 0) return 0;
    scale_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(g, n, f);
    return TS_CU_LAUNCHED("gradient scaling");
}

extern "C" int ts_cuo_sumsq(const float *g, size_t n, double *part, void *stream)
{
    sumsq_k<<<TS_CUO_SUMSQ_PARTS, 256, 0, (cudaStream_t)stream>>>(g, n, part);
    return TS_CU_LAUNCHED("gradient sum of squares");
}
