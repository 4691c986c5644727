// Device kernels of the layers that cuDNN does not cover: weight layout
// changes between PyTorch's [rows][cols][taps] and cuDNN's channels-last
// filter [rows][taps][cols], and the fp32 <-> bf16/fp16 staging of the
// mixed-precision convolutions. Launchers only (declared in
// src/nn/cuda/cuda_nn.h): each is queued on the given stream and returns
// TS_ERR_CUDA if the launch failed; errors inside a kernel surface at the
// next synchronisation. No cuDNN, cuBLAS, MPI or NCCL here.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define TS_ERROR_NO_MPI 1
extern "C" {
#include "src/core/error.h"
#include "src/nn/cuda/cuda_nn.h"
}
#include "src/core/cuda_launch.h"

// wp[r][t][c] = w[r][c][t'] (t' = taps - 1 - t when flip)
__global__ void wpack_k(const float *w, float *wp, int rows, int cols, int taps, int flip)
{
    const size_t n = (size_t)rows * cols * taps;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t c = i % cols, t = (i / cols) % taps, r = i / ((size_t)cols * taps);
        const size_t ts = flip ? taps - 1 - t : t;
        wp[i] = w[(r * cols + c) * taps + ts];
    }
}

// w[r][c][t] += wp[r][t][c]
__global__ void wunpack_add_k(const float *wp, float *w, int rows, int cols, int taps)
{
    const size_t n = (size_t)rows * cols * taps;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i % taps, c = (i / taps) % cols, r = i / ((size_t)cols * taps);
        w[i] += wp[(r * taps + t) * cols + c];
    }
}

__global__ void to_bf16_k(const float *x, __nv_bfloat16 *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}
__global__ void to_fp16_k(const float *x, __half *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2half_rn(x[i]);
}
__global__ void from_bf16_k(const __nv_bfloat16 *x, float *y, size_t n, int add)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = (add ? y[i] : 0.0f) + __bfloat162float(x[i]);
}
__global__ void from_fp16_k(const __half *x, float *y, size_t n, int add)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = (add ? y[i] : 0.0f) + __half2float(x[i]);
}

__global__ void round_half_k(const float *x, float *y, size_t n, int fp16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = fp16 ? __half2float(__float2half_rn(x[i])) : __bfloat162float(__float2bfloat16_rn(x[i]));
}

extern "C" int ts_cuk_round_half(const float *x, float *y, size_t n, int fp16, void *stream)
{
    if (n == 0) return 0;
    round_half_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(x, y, n, fp16);
    return TS_CU_LAUNCHED("rounding to half");
}

extern "C" int ts_cuk_wpack(const float *w, float *wp, int rows, int cols, int taps, int flip, void *stream)
{
    const size_t n = (size_t)rows * cols * taps;
    if (n == 0) return 0;
    wpack_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(w, wp, rows, cols, taps, flip);
    return TS_CU_LAUNCHED("weight pack");
}

extern "C" int ts_cuk_wunpack_add(const float *wp, float *w, int rows, int cols, int taps, void *stream)
{
    const size_t n = (size_t)rows * cols * taps;
    if (n == 0) return 0;
    wunpack_add_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(wp, w, rows, cols, taps);
    return TS_CU_LAUNCHED("weight gradient unpack");
}

extern "C" int ts_cuk_to_half(const float *x, void *y, size_t n, int fp16, void *stream)
{
    if (n == 0) return 0;
    if (fp16) to_fp16_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(x, (__half *)y, n);
    else to_bf16_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(x, (__nv_bfloat16 *)y, n);
    return TS_CU_LAUNCHED("fp32 to half");
}

extern "C" int ts_cuk_from_half(const void *x, float *y, size_t n, int fp16, int add, void *stream)
{
    if (n == 0) return 0;
    if (fp16) from_fp16_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>((const __half *)x, y, n, add);
    else from_bf16_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>((const __nv_bfloat16 *)x, y, n, add);
    return TS_CU_LAUNCHED("half to fp32");
}

// ------------------------------------------ channels padded to a multiple of 8
// (half-precision convolutions of few channels: cuDNN runs them on padded
// copies, the padding channels zero, so that the results are the same)

// y[v][j] (half) = x[v][j] for j < c, 0 for c <= j < cp
template <typename H>
__global__ void to_half_pad_k(const float *x, int c, H *y, int cp, size_t nv)
{
    const size_t n = nv * cp;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t v = i / cp;
        const int j = (int)(i % cp);
        y[i] = H(j < c ? x[v * c + j] : 0.0f);
    }
}

// y[v][j] = x[v][j] (half, rows of cp) for j < c
template <typename H>
__global__ void from_half_slice_k(const H *x, int cp, float *y, int c, size_t nv)
{
    const size_t n = nv * c;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = (float)x[(i / c) * cp + i % c];
}

// wp[r][t][j] = w[r][j][t] for r < rows, j < cols; 0 elsewhere (r < rp, j < cp)
__global__ void wpack_pad_k(const float *w, float *wp, int rows, int cols, int taps, int rp, int cp)
{
    const size_t n = (size_t)rp * cp * taps;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t j = i % cp, t = (i / cp) % taps, r = i / ((size_t)cp * taps);
        wp[i] = r < (size_t)rows && j < (size_t)cols ? w[(r * cols + j) * taps + t] : 0.0f;
    }
}

// w[r][c][t] += wp[r][t][c] with rows of wp cp long
__global__ void wunpack_add_pad_k(const float *wp, float *w, int rows, int cols, int taps, int cp)
{
    const size_t n = (size_t)rows * cols * taps;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t t = i % taps, c = (i / taps) % cols, r = i / ((size_t)cols * taps);
        w[i] += wp[(r * taps + t) * cp + c];
    }
}

extern "C" int ts_cuk_to_half_pad(const float *x, int c, void *y, int cp, size_t nv, int fp16, void *stream)
{
    const size_t n = nv * cp;
    if (n == 0) return 0;
    if (fp16) to_half_pad_k<__half><<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(x, c, (__half *)y, cp, nv);
    else to_half_pad_k<__nv_bfloat16><<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(x, c, (__nv_bfloat16 *)y, cp, nv);
    return TS_CU_LAUNCHED("fp32 to half, channels padded");
}

extern "C" int ts_cuk_from_half_slice(const void *x, int cp, float *y, int c, size_t nv, int fp16, void *stream)
{
    const size_t n = nv * c;
    if (n == 0) return 0;
    if (fp16) from_half_slice_k<__half><<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>((const __half *)x, cp, y, c, nv);
    else
        from_half_slice_k<__nv_bfloat16>
            <<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>((const __nv_bfloat16 *)x, cp, y, c, nv);
    return TS_CU_LAUNCHED("half to fp32, padding channels dropped");
}

extern "C" int ts_cuk_wpack_pad(const float *w, float *wp, int rows, int cols, int taps, int rp, int cp, void *stream)
{
    const size_t n = (size_t)rp * cp * taps;
    if (n == 0) return 0;
    wpack_pad_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(w, wp, rows, cols, taps, rp, cp);
    return TS_CU_LAUNCHED("weight pack, channels padded");
}

extern "C" int ts_cuk_wunpack_add_pad(const float *wp, float *w, int rows, int cols, int taps, int cp, void *stream)
{
    const size_t n = (size_t)rows * cols * taps;
    if (n == 0) return 0;
    wunpack_add_pad_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(wp, w, rows, cols, taps, cp);
    return TS_CU_LAUNCHED("weight gradient unpack, padding channels dropped");
}

// ---------------------------------------------------------------- ReLU
__global__ void relu_fwd_k(const float *x, float *y, size_t n, float slope)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        y[i] = v > 0.0f ? v : slope * v;
    }
}
__global__ void relu_bwd_k(const float *y, const float *dy, float *dx, size_t n, float slope)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dx[i] = y[i] > 0.0f ? dy[i] : slope * dy[i];
}
extern "C" int ts_cuk_relu(const float *x, float *y, size_t n, float slope, void *stream)
{
    if (n == 0) return 0;
    relu_fwd_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(x, y, n, slope);
    return TS_CU_LAUNCHED("relu");
}
extern "C" int ts_cuk_relu_backward(const float *y, const float *dy, float *dx, size_t n, float slope, void *stream)
{
    if (n == 0) return 0;
    relu_bwd_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(y, dy, dx, n, slope);
    return TS_CU_LAUNCHED("relu backward");
}
__global__ void add_k(const float *x, float *y, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}
extern "C" int ts_cuk_add(const float *x, float *y, size_t n, void *stream)
{
    if (n == 0) return 0;
    add_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(x, y, n);
    return TS_CU_LAUNCHED("add");
}

// ---------------------------------------------------------------- max-pool (kernel = stride = k)
// one thread per output element [n][od][oh][ow][c]; first maximum on ties, a later NaN replaces
__global__ void pool_fwd_k(const float *x, float *y, uint8_t *idx, int D, int H, int W, int C, int k, size_t n_out)
{
    const int OD = D / k, OH = H / k, OW = W / k;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_out; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C);
        size_t r = i / C;
        const int ow = (int)(r % OW); r /= OW;
        const int oh = (int)(r % OH); r /= OH;
        const int od = (int)(r % OD);
        const size_t n = r / OD;
        float mx = 0.0f;
        int at = 0, t = 0;
        for (int kd = 0; kd < k; kd++)
            for (int kh = 0; kh < k; kh++)
                for (int kw = 0; kw < k; kw++, t++) {
                    const float v = x[((((n * D + od * k + kd) * H + oh * k + kh) * W) + ow * k + kw) * C + c];
                    if (t == 0 || v > mx || isnan(v)) {
                        mx = v;
                        at = t;
                    }
                }
        y[i] = mx;
        idx[i] = (uint8_t)at;
    }
}
// one thread per output element: its window's k^3 input gradients (windows do not overlap)
__global__ void pool_bwd_k(const float *dy, const uint8_t *idx, float *dx, int D, int H, int W, int C, int k,
                           size_t n_out)
{
    const int OD = D / k, OH = H / k, OW = W / k;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_out; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C);
        size_t r = i / C;
        const int ow = (int)(r % OW); r /= OW;
        const int oh = (int)(r % OH); r /= OH;
        const int od = (int)(r % OD);
        const size_t n = r / OD;
        const float g = dy[i];
        const int at = idx[i];
        int t = 0;
        for (int kd = 0; kd < k; kd++)
            for (int kh = 0; kh < k; kh++)
                for (int kw = 0; kw < k; kw++, t++)
                    dx[((((n * D + od * k + kd) * H + oh * k + kh) * W) + ow * k + kw) * C + c] = t == at ? g : 0.0f;
    }
}
extern "C" int ts_cuk_maxpool(const float *x, float *y, uint8_t *idx, int N, int D, int H, int W, int C, int k,
                              void *stream)
{
    const size_t n = (size_t)N * (D / k) * (H / k) * (W / k) * C;
    if (n == 0) return 0;
    pool_fwd_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(x, y, idx, D, H, W, C, k, n);
    return TS_CU_LAUNCHED("max-pool");
}
extern "C" int ts_cuk_maxpool_backward(const float *dy, const uint8_t *idx, float *dx, int N, int D, int H, int W, int C,
                                       int k, void *stream)
{
    const size_t n = (size_t)N * (D / k) * (H / k) * (W / k) * C;
    if (n == 0) return 0;
    pool_bwd_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(dy, idx, dx, D, H, W, C, k, n);
    return TS_CU_LAUNCHED("max-pool backward");
}

// ---------------------------------------------------------------- the norms' passes
// the fused activation of t (relu: t where t > 0, else slope t, 0 for a plain ReLU; else t itself)
__device__ inline float act_of(float t, int relu, float slope)
{
    return !relu || t > 0.0f ? t : slope != 0.0f ? slope * t : 0.0f;
}
// dy[i] through the fused activation's derivative: itself where the forward output mask[i] > 0 (or without a
// mask), else slope dy[i] (0 for a plain ReLU)
__device__ inline float grad_of(const float *mask, const float *dy, size_t i, float slope)
{
    const float g = dy[i];
    return !mask || mask[i] > 0.0f ? g : slope != 0.0f ? slope * g : 0.0f;
}

// per-(sample, channel) sums of x [N][S][C]
// mode 0: s1 += x - ctr, s2 += (x - ctr)^2; mode 1: s1 += dy', s2 += dy' (x - ctr), dy' = grad_of(mask, dy, slope).
// Block (VOX voxels of one sample) x threads over channels: float sums per thread over the block's voxels,
// then one double atomicAdd per (block, channel).
#define VOX 64
__global__ void chan_sums_k(int mode, const float *x, const float *dy, const float *mask, float slope, const float *ctr,
                            size_t S, int C, double *s1, double *s2)
{
    const size_t n = blockIdx.y, v0 = (size_t)blockIdx.x * VOX;
    const size_t v1 = v0 + VOX < S ? v0 + VOX : S;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float ce = ctr ? ctr[n * C + c] : 0.0f;
        float a1 = 0.0f, a2 = 0.0f;
        for (size_t v = v0; v < v1; v++) {
            const size_t i = (n * S + v) * C + c;
            const float d = x[i] - ce;
            if (mode == 0) {
                a1 += d;
                a2 += d * d;
            } else {
                const float g = grad_of(mask, dy, i, slope);
                a1 += g;
                a2 += g * d;
            }
        }
        atomicAdd(&s1[n * C + c], (double)a1);
        atomicAdd(&s2[n * C + c], (double)a2);
    }
}
extern "C" int ts_cuk_chan_sums(int mode, const float *x, const float *dy, const float *mask, float slope,
                                const float *ctr, int N, size_t S, int C, double *s1, double *s2, void *stream)
{
    if (cudaMemsetAsync(s1, 0, sizeof(double) * N * C, (cudaStream_t)stream) != cudaSuccess ||
        cudaMemsetAsync(s2, 0, sizeof(double) * N * C, (cudaStream_t)stream) != cudaSuccess)
        return TS_CU_LAUNCHED("channel sums (clear)");
    if (N == 0 || S == 0 || C == 0) return 0;
    const dim3 grid((unsigned)((S + VOX - 1) / VOX), (unsigned)N);
    const unsigned threads = C < 256 ? (unsigned)((C + 31) / 32) * 32 : 256u;
    chan_sums_k<<<grid, threads, 0, (cudaStream_t)stream>>>(mode, x, dy, mask, slope, ctr, S, C, s1, s2);
    return TS_CU_LAUNCHED("channel sums");
}

// y = act_of(x * scale[n][c] + shift[n][c], relu, slope)
__global__ void chan_affine_k(const float *x, const float *scale, const float *shift, size_t S, int C, int relu,
                              float slope, float *y, size_t n_all)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_all; i += (size_t)gridDim.x * blockDim.x) {
        const size_t c = i % C, n = i / ((size_t)S * C), j = n * C + c;
        y[i] = act_of(x[i] * scale[j] + shift[j], relu, slope);
    }
}
extern "C" int ts_cuk_chan_affine(const float *x, const float *scale, const float *shift, int N, size_t S, int C,
                                  int relu, float slope, float *y, void *stream)
{
    const size_t n = (size_t)N * S * C;
    if (n == 0) return 0;
    chan_affine_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(x, scale, shift, S, C, relu, slope, y, n);
    return TS_CU_LAUNCHED("norm affine");
}

// dx = dy' a + (x - ctr) b + k, per (n, c)
__global__ void norm_dx_k(const float *x, const float *dy, const float *mask, float slope, const float *ctr,
                          const float *a, const float *b, const float *k, size_t S, int C, float *dx, size_t n_all)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_all; i += (size_t)gridDim.x * blockDim.x) {
        const size_t c = i % C, n = i / ((size_t)S * C), j = n * C + c;
        dx[i] = grad_of(mask, dy, i, slope) * a[j] + (x[i] - ctr[j]) * b[j] + k[j];
    }
}
extern "C" int ts_cuk_norm_dx(const float *x, const float *dy, const float *mask, float slope, const float *ctr,
                              const float *a, const float *b, const float *k, int N, size_t S, int C, float *dx,
                              void *stream)
{
    const size_t n = (size_t)N * S * C;
    if (n == 0) return 0;
    norm_dx_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(x, dy, mask, slope, ctr, a, b, k, S, C, dx, n);
    return TS_CU_LAUNCHED("norm input gradient");
}

// ---------------------------------------------------------------- the tiled passes (TESSERA_CUDA_PASSES=tiled)
// The same sums, affine maps and input gradients as the three kernels above, and the concatenation, without
// a 64-bit division per element and with one atomic per (block, channel) instead of one per 64 voxels.
// A block has T = (256 / C) C threads (C <= 256): thread t keeps channel t % C for every element it visits,
// since T and the grid's stride are multiples of C; blockIdx.y is the sample. Written on 2026-12-06 without a
// GPU: opt-in until tests/nn/test_layers_cuda has passed them on one (docs/gpu.md). C > 256: the kernels above.
static unsigned row_threads(int C) { return (unsigned)((256 / C) * C); }
// blocks along x for one sample of n_items items, T threads each: enough for the GPU, at most 65535
static unsigned tiled_blocks(size_t n_items, unsigned T, int N)
{
    size_t b = (n_items + T - 1) / T, cap = (size_t)(2048 / (N > 0 ? N : 1));
    if (cap < 8) cap = 8;
    if (b > cap) b = cap;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

// per-(n, c) sums: each thread in double over its voxels, the block's threads of one channel summed in
// shared memory (2 T doubles), then one double atomicAdd per (block, channel)
__global__ void chan_sums_tiled_k(int mode, const float *x, const float *dy, const float *mask, float slope,
                                  const float *ctr, size_t S, int C, double *s1, double *s2)
{
    extern __shared__ double sh[];
    const unsigned t = threadIdx.x, T = blockDim.x;
    const int c = (int)(t % (unsigned)C);
    const size_t n = blockIdx.y, per = T / (unsigned)C, base = n * S * C;
    const float ce = ctr ? ctr[n * C + c] : 0.0f;
    double a1 = 0.0, a2 = 0.0;
    for (size_t v = (size_t)blockIdx.x * per + t / (unsigned)C; v < S; v += (size_t)gridDim.x * per) {
        const size_t i = base + v * C + c;
        const float d = x[i] - ce;
        if (mode == 0) {
            a1 += d;
            a2 += (double)d * d;
        } else {
            const float g = grad_of(mask, dy, i, slope);
            a1 += g;
            a2 += (double)g * d;
        }
    }
    sh[t] = a1;
    sh[T + t] = a2;
    __syncthreads();
    if (t < (unsigned)C) {
        double b1 = 0.0, b2 = 0.0;
        for (unsigned u = t; u < T; u += (unsigned)C) {
            b1 += sh[u];
            b2 += sh[T + u];
        }
        atomicAdd(&s1[n * C + c], b1);
        atomicAdd(&s2[n * C + c], b2);
    }
}
extern "C" int ts_cuk_chan_sums_tiled(int mode, const float *x, const float *dy, const float *mask, float slope,
                                      const float *ctr, int N, size_t S, int C, double *s1, double *s2, void *stream)
{
    if (C > 256) return ts_cuk_chan_sums(mode, x, dy, mask, slope, ctr, N, S, C, s1, s2, stream);
    if (cudaMemsetAsync(s1, 0, sizeof(double) * N * C, (cudaStream_t)stream) != cudaSuccess ||
        cudaMemsetAsync(s2, 0, sizeof(double) * N * C, (cudaStream_t)stream) != cudaSuccess)
        return TS_CU_LAUNCHED("channel sums (clear)");
    if (N == 0 || S == 0 || C == 0) return 0;
    const unsigned T = row_threads(C);
    const dim3 grid(tiled_blocks(S, T / (unsigned)C, N), (unsigned)N);
    chan_sums_tiled_k<<<grid, T, 2 * T * sizeof(double), (cudaStream_t)stream>>>(mode, x, dy, mask, slope, ctr, S, C,
                                                                                  s1, s2);
    return TS_CU_LAUNCHED("channel sums (tiled)");
}

// y = act_of(x scale + shift), the expression of chan_affine_k
__global__ void chan_affine_tiled_k(const float *x, const float *scale, const float *shift, size_t S, int C, int relu,
                                    float slope, float *y)
{
    const unsigned t = threadIdx.x;
    const size_t n = blockIdx.y, j = n * C + t % (unsigned)C, SC = S * C;
    const float sc = scale[j], sf = shift[j];
    const float *xn = x + n * SC;
    float *yn = y + n * SC;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + t; i < SC; i += (size_t)gridDim.x * blockDim.x) {
        yn[i] = act_of(xn[i] * sc + sf, relu, slope);
    }
}
extern "C" int ts_cuk_chan_affine_tiled(const float *x, const float *scale, const float *shift, int N, size_t S, int C,
                                        int relu, float slope, float *y, void *stream)
{
    if (C > 256) return ts_cuk_chan_affine(x, scale, shift, N, S, C, relu, slope, y, stream);
    if ((size_t)N * S * C == 0) return 0;
    const unsigned T = row_threads(C);
    const dim3 grid(tiled_blocks(S * C, T, N), (unsigned)N);
    chan_affine_tiled_k<<<grid, T, 0, (cudaStream_t)stream>>>(x, scale, shift, S, C, relu, slope, y);
    return TS_CU_LAUNCHED("norm affine (tiled)");
}

// dx = dy' a + (x - ctr) b + k, the expression of norm_dx_k
__global__ void norm_dx_tiled_k(const float *x, const float *dy, const float *mask, float slope, const float *ctr,
                                const float *a, const float *b, const float *k, size_t S, int C, float *dx)
{
    const unsigned t = threadIdx.x;
    const size_t n = blockIdx.y, j = n * C + t % (unsigned)C, SC = S * C, o = n * SC;
    const float cj = ctr[j], aj = a[j], bj = b[j], kj = k[j];
    for (size_t i = o + (size_t)blockIdx.x * blockDim.x + t; i < o + SC; i += (size_t)gridDim.x * blockDim.x) {
        dx[i] = grad_of(mask, dy, i, slope) * aj + (x[i] - cj) * bj + kj;
    }
}
extern "C" int ts_cuk_norm_dx_tiled(const float *x, const float *dy, const float *mask, float slope,
                                    const float *ctr, const float *a, const float *b, const float *k, int N, size_t S,
                                    int C, float *dx, void *stream)
{
    if (C > 256) return ts_cuk_norm_dx(x, dy, mask, slope, ctr, a, b, k, N, S, C, dx, stream);
    if ((size_t)N * S * C == 0) return 0;
    const unsigned T = row_threads(C);
    const dim3 grid(tiled_blocks(S * C, T, N), (unsigned)N);
    norm_dx_tiled_k<<<grid, T, 0, (cudaStream_t)stream>>>(x, dy, mask, slope, ctr, a, b, k, S, C, dx);
    return TS_CU_LAUNCHED("norm input gradient (tiled)");
}

// concatenation along the channels of rows rows: back 0: y[v] = [a[v] (ca), b[v] (cb)]; back 1: a[v], b[v] from
// y[v] (a or b NULL: not written). Elements of type F (float, or float4 where ca and cb are multiples of 4):
// threadIdx.x along the row's C = ca + cb elements, threadIdx.y along the rows.
template <typename F>
__global__ void concat_k(int back, F *y, F *a, F *b, int ca, int cb, size_t rows)
{
    const int C = ca + cb;
    for (size_t v = (size_t)blockIdx.x * blockDim.y + threadIdx.y; v < rows; v += (size_t)gridDim.x * blockDim.y)
        for (int j = threadIdx.x; j < C; j += blockDim.x) {
            F *p = j < ca ? (a ? a + v * ca + j : NULL) : (b ? b + v * cb + (j - ca) : NULL);
            if (!p) continue;
            if (back) *p = y[v * C + j];
            else y[v * C + j] = *p;
        }
}
extern "C" int ts_cuk_concat(int back, float *y, float *a, float *b, int ca, int cb, size_t rows, void *stream)
{
    if (rows == 0 || ca + cb == 0) return 0;
    const int vec = ca % 4 == 0 && cb % 4 == 0 && !((uintptr_t)y & 15) && !((uintptr_t)a & 15) && !((uintptr_t)b & 15);
    const int C = vec ? (ca + cb) / 4 : ca + cb;
    const unsigned bx = C < 32 ? (unsigned)C : 32u, by = 256u / bx;
    size_t nb = (rows + by - 1) / by;
    const unsigned blocks = (unsigned)(nb > 65535 ? 65535 : nb);
    const dim3 threads(bx, by);
    if (vec)
        concat_k<float4><<<blocks, threads, 0, (cudaStream_t)stream>>>(back, (float4 *)y, (float4 *)a, (float4 *)b,
                                                                       ca / 4, cb / 4, rows);
    else concat_k<float><<<blocks, threads, 0, (cudaStream_t)stream>>>(back, y, a, b, ca, cb, rows);
    return TS_CU_LAUNCHED(back ? "concatenation backward (tiled)" : "concatenation (tiled)");
}

// ---------------------------------------------------------------- losses on logits [V][K], labels [V] (uint8)
__global__ void hist_k(const uint8_t *y, size_t V, unsigned long long *count)
{
    __shared__ unsigned int h[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) h[i] = 0;
    __syncthreads();
    for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < V; v += (size_t)gridDim.x * blockDim.x)
        atomicAdd(&h[y[v]], 1u);
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
        if (h[i]) atomicAdd(&count[i], (unsigned long long)h[i]);
}
// first voxel holding label t
__global__ void first_k(const uint8_t *y, size_t V, int t, unsigned long long *at)
{
    for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < V; v += (size_t)gridDim.x * blockDim.x)
        if (y[v] == t) atomicMin(at, (unsigned long long)v);
}
extern "C" int ts_cuk_label_hist(const uint8_t *y, size_t V, unsigned long long *count, void *stream)
{
    if (cudaMemsetAsync(count, 0, 256 * sizeof(unsigned long long), (cudaStream_t)stream) != cudaSuccess)
        return TS_CU_LAUNCHED("label histogram (clear)");
    if (V == 0) return 0;
    const unsigned b = ts_cu_grid(V) < 1024 ? ts_cu_grid(V) : 1024u;
    hist_k<<<b, 256, 0, (cudaStream_t)stream>>>(y, V, count);
    return TS_CU_LAUNCHED("label histogram");
}
extern "C" int ts_cuk_label_first(const uint8_t *y, size_t V, int t, unsigned long long *at, void *stream)
{
    const unsigned long long big = ~0ull;
    if (cudaMemcpyAsync(at, &big, sizeof big, cudaMemcpyHostToDevice, (cudaStream_t)stream) != cudaSuccess)
        return TS_CU_LAUNCHED("label search (set)");
    if (V == 0) return 0;
    first_k<<<ts_cu_grid(V), 256, 0, (cudaStream_t)stream>>>(y, V, t, at);
    return TS_CU_LAUNCHED("label search");
}

__device__ float softmax_dev(const float *l, int K, float *p)
{
    float m = l[0];
    for (int k = 1; k < K; k++) m = l[k] > m ? l[k] : m;
    float s = 0.0f;
    for (int k = 0; k < K; k++) s += (p[k] = expf(l[k] - m));
    const float r = 1.0f / s;
    for (int k = 0; k < K; k++) p[k] *= r;
    return m + logf(s);
}

__device__ void block_add(double v, double *out)
{
    __shared__ double part[256];
    part[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

// cross-entropy: num += w[t] (lse - l[t]); dl += f w[t] (p - onehot(t)) where dl
#define KMAX 256
__global__ void ce_k(const float *l, const uint8_t *y, size_t V, int K, int ign, const float *w, float f, float *dl,
                     double *num)
{
    float p[KMAX];
    double a = 0;
    for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < V; v += (size_t)gridDim.x * blockDim.x) {
        const int t = y[v];
        if (t == ign) continue;
        const float lse = softmax_dev(l + v * K, K, p), wt = w ? w[t] : 1.0f;
        a += (double)wt * (lse - l[v * K + t]);
        if (dl) {
            const float c = f * wt;
            for (int k = 0; k < K; k++) dl[v * K + k] += c * (p[k] - (k == t ? 1.0f : 0.0f));
        }
    }
    block_add(a, num);
}
extern "C" int ts_cuk_ce(const float *l, const uint8_t *y, size_t V, int K, int ign, const float *w, float f, float *dl,
                         double *num, void *stream)
{
    if (cudaMemsetAsync(num, 0, sizeof(double), (cudaStream_t)stream) != cudaSuccess) return TS_CU_LAUNCHED("ce (clear)");
    if (V == 0) return 0;
    const unsigned b = ts_cu_grid(V) < 4096 ? ts_cu_grid(V) : 4096;
    ce_k<<<b, 256, 0, (cudaStream_t)stream>>>(l, y, V, K, ign, w, f, dl, num);
    return TS_CU_LAUNCHED("cross-entropy");
}

// dice sums per sample n (blockIdx.y) and class k: s[3k] += p[t] at k = t, s[3k+1] += p[k], s[3k+2] += 1 at k = t
__global__ void dice_sums_k(const float *l, const uint8_t *y, size_t S, int K, int ign, double *s,
                            unsigned long long *bad)
{
    extern __shared__ double sh[]; // 3 K
    float p[KMAX];
    const size_t n = blockIdx.y;
    for (int i = threadIdx.x; i < 3 * K; i += blockDim.x) sh[i] = 0;
    __syncthreads();
    for (size_t sv = blockIdx.x * (size_t)blockDim.x + threadIdx.x; sv < S; sv += (size_t)gridDim.x * blockDim.x) {
        const size_t v = n * S + sv;
        const int t = y[v];
        if (t == ign) continue;
        if (t >= K) {
            atomicMin(bad, (unsigned long long)v);
            continue;
        }
        softmax_dev(l + v * K, K, p);
        for (int k = 0; k < K; k++) atomicAdd(&sh[3 * k + 1], (double)p[k]);
        atomicAdd(&sh[3 * t], (double)p[t]);
        atomicAdd(&sh[3 * t + 2], 1.0);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 3 * K; i += blockDim.x)
        if (sh[i] != 0) atomicAdd(&s[n * 3 * K + i], sh[i]);
}
extern "C" int ts_cuk_dice_sums(const float *l, const uint8_t *y, int N, size_t S, int K, int ign, double *s,
                                unsigned long long *bad, void *stream)
{
    const unsigned long long big = ~0ull;
    if (cudaMemsetAsync(s, 0, sizeof(double) * 3 * K * N, (cudaStream_t)stream) != cudaSuccess ||
        cudaMemcpyAsync(bad, &big, sizeof big, cudaMemcpyHostToDevice, (cudaStream_t)stream) != cudaSuccess)
        return TS_CU_LAUNCHED("dice sums (clear)");
    if (N == 0 || S == 0) return 0;
    const unsigned bx = ts_cu_grid(S) < 1024 ? ts_cu_grid(S) : 1024;
    dice_sums_k<<<dim3(bx, (unsigned)N), 256, 3 * K * sizeof(double), (cudaStream_t)stream>>>(l, y, S, K, ign, s, bad);
    return TS_CU_LAUNCHED("dice sums");
}

// dice gradient: dL/dp[v][k] = A[n][k] + (k == t) B[n][k]; dl += p (dp - <p, dp>)
__global__ void dice_grad_k(const float *l, const uint8_t *y, size_t S, size_t V, int K, int ign, const float *AB,
                            float *dl)
{
    float p[KMAX];
    for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < V; v += (size_t)gridDim.x * blockDim.x) {
        const int t = y[v];
        if (t == ign) continue;
        const float *ab = AB + (v / S) * K * 2;
        softmax_dev(l + v * K, K, p);
        float dot = 0.0f;
        for (int k = 0; k < K; k++) dot += p[k] * (ab[2 * k] + (k == t ? ab[2 * k + 1] : 0.0f));
        for (int k = 0; k < K; k++) dl[v * K + k] += p[k] * (ab[2 * k] + (k == t ? ab[2 * k + 1] : 0.0f) - dot);
    }
}
extern "C" int ts_cuk_dice_grad(const float *l, const uint8_t *y, int N, size_t S, int K, int ign, const float *AB,
                                float *dl, void *stream)
{
    const size_t V = (size_t)N * S;
    if (V == 0) return 0;
    dice_grad_k<<<ts_cu_grid(V), 256, 0, (cudaStream_t)stream>>>(l, y, S, V, K, ign, AB, dl);
    return TS_CU_LAUNCHED("dice gradient");
}

// ------------------------------------ transposed convolutions with kernel = stride
// (conv_gemm.c: one GEMM z [M][taps][C] = x [M][Cin] wp [Cin][taps][C] over
// the M input voxels, each output voxel then taking exactly one of z's
// entries; the backward gathers dy into the same layout)

// y [N][D k][H k][W k][C] = z [((n D + d) H + h) W + w][tap of (od, oh, ow)][c] (+ bias[c])
__global__ void convt_scatter_k(const float *z, const float *bias, float *y, int D, int H, int W, int C, int k,
                                size_t n)
{
    const size_t taps = (size_t)k * k * k, OW = (size_t)W * k, OH = (size_t)H * k, OD = (size_t)D * k;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C);
        size_t v = i / C;
        const size_t ow = v % OW;
        v /= OW;
        const size_t oh = v % OH;
        v /= OH;
        const size_t od = v % OD, nn = v / OD;
        const size_t m = ((nn * D + od / k) * H + oh / k) * W + ow / k;
        const size_t t = ((od % k) * k + oh % k) * k + ow % k;
        y[i] = z[(m * taps + t) * C + c] + (bias ? bias[c] : 0.0f);
    }
}

// dz [M][taps][C] (T: float, bf16 or fp16) = dy at the output voxel of (m, tap)
template <typename T>
__global__ void convt_gather_k(const float *dy, T *dz, int D, int H, int W, int C, int k, size_t n)
{
    const size_t taps = (size_t)k * k * k, OW = (size_t)W * k, OH = (size_t)H * k, OD = (size_t)D * k;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C);
        const size_t t = (i / C) % taps, m = i / ((size_t)C * taps);
        const size_t w = m % W, h = (m / W) % H, d = (m / ((size_t)W * H)) % D, nn = m / ((size_t)W * H * D);
        const size_t a = t / ((size_t)k * k), b = (t / k) % k, e = t % k;
        dz[i] = T(dy[(((nn * OD + d * k + a) * OH + h * k + b) * OW + w * k + e) * C + c]);
    }
}

extern "C" int ts_cuk_convt_scatter(const float *z, const float *bias, float *y, int N, int D, int H, int W, int C,
                                    int k, void *stream)
{
    const size_t n = (size_t)N * D * H * W * k * k * k * C;
    if (n == 0) return 0;
    convt_scatter_k<<<ts_cu_grid(n), 256, 0, (cudaStream_t)stream>>>(z, bias, y, D, H, W, C, k, n);
    return TS_CU_LAUNCHED("transposed convolution scatter");
}

extern "C" int ts_cuk_convt_gather(const float *dy, void *dz, int type, int N, int D, int H, int W, int C, int k,
                                   void *stream)
{
    const size_t n = (size_t)N * D * H * W * k * k * k * C;
    if (n == 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (type == 1) convt_gather_k<__nv_bfloat16><<<ts_cu_grid(n), 256, 0, s>>>(dy, (__nv_bfloat16 *)dz, D, H, W, C, k, n);
    else if (type == 2) convt_gather_k<__half><<<ts_cu_grid(n), 256, 0, s>>>(dy, (__half *)dz, D, H, W, C, k, n);
    else convt_gather_k<float><<<ts_cu_grid(n), 256, 0, s>>>(dy, (float *)dz, D, H, W, C, k, n);
    return TS_CU_LAUNCHED("transposed convolution gather");
}

// ------------------------------------------ im2col for the weight gradient as a GEMM
// (conv_gemm.c): col [mc][taps][C] for the output voxels m0 .. m0+mc-1 of a
// convolution of x [N][D][H][W][C] (kernel k, stride s, padding p, output
// OD x OH x OW): the input voxel under each tap, zero outside x
template <typename T>
__global__ void im2col_k(const float *x, T *col, int D, int H, int W, int C, int k, int s, int p, int OD, int OH,
                         int OW, size_t m0, size_t n)
{
    const size_t taps = (size_t)k * k * k;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C);
        const size_t t = (i / C) % taps, m = m0 + i / ((size_t)C * taps);
        const long ow = (long)(m % OW), oh = (long)((m / OW) % OH), od = (long)((m / ((size_t)OW * OH)) % OD);
        const size_t nn = m / ((size_t)OW * OH * OD);
        const long id = od * s - p + (long)(t / ((size_t)k * k)), ih = oh * s - p + (long)((t / k) % k),
                   iw = ow * s - p + (long)(t % k);
        float v = 0.0f;
        if (id >= 0 && id < D && ih >= 0 && ih < H && iw >= 0 && iw < W)
            v = x[(((nn * D + (size_t)id) * H + (size_t)ih) * W + (size_t)iw) * C + c];
        col[i] = T(v);
    }
}

extern "C" int ts_cuk_im2col(const float *x, void *col, int type, int D, int H, int W, int C, int k, int s, int p,
                             int OD, int OH, int OW, size_t m0, size_t mc, void *stream)
{
    const size_t n = mc * k * k * k * C;
    if (n == 0) return 0;
    cudaStream_t st = (cudaStream_t)stream;
    if (type == 1)
        im2col_k<__nv_bfloat16><<<ts_cu_grid(n), 256, 0, st>>>(x, (__nv_bfloat16 *)col, D, H, W, C, k, s, p, OD, OH, OW, m0, n);
    else if (type == 2)
        im2col_k<__half><<<ts_cu_grid(n), 256, 0, st>>>(x, (__half *)col, D, H, W, C, k, s, p, OD, OH, OW, m0, n);
    else im2col_k<float><<<ts_cu_grid(n), 256, 0, st>>>(x, (float *)col, D, H, W, C, k, s, p, OD, OH, OW, m0, n);
    return TS_CU_LAUNCHED("im2col");
}
