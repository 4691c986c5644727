// GPU kernels of the collectives: the benchmark's check pattern (fill and
// count wrong elements) and the division that finishes an AVG that NCCL
// reduced as a SUM. C launchers are declared in collectives/device.h.
// Kernels and their launchers only: no MPI and no NCCL here (device.c).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define TS_ERROR_NO_MPI 1
extern "C" {
#include "collectives/check.h"
#include "src/core/dtype.h"
#include "src/core/error.h"
int ts_coll_device_fill(void *p, size_t n, ts_dtype dt, int rank, int seed);
int ts_coll_device_wrong(const void *p, size_t n, ts_dtype dt, int nranks, int op, int seed, size_t *wrong);
int ts_coll_device_avg(void *p, size_t n, ts_dtype dt, int nranks, void *stream);
}

template <typename T> __device__ T from_int(double v) { return (T)v; }
template <> __device__ __nv_bfloat16 from_int<__nv_bfloat16>(double v) { return __float2bfloat16((float)v); }
template <> __device__ __half from_int<__half>(double v) { return __float2half((float)v); }
template <typename T> __device__ double to_double(T v) { return (double)v; }
template <> __device__ double to_double<__nv_bfloat16>(__nv_bfloat16 v) { return (double)__bfloat162float(v); }
template <> __device__ double to_double<__half>(__half v) { return (double)__half2float(v); }

template <typename T> __global__ void fill_k(T *p, size_t n, int rank, int seed, int half)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = from_int<T>(TS_CHECK_VALUE(i, rank, seed, half));
}

// op: 0 sum, 1 avg, 2 max, 3 min (ts_op)
template <typename T>
__global__ void wrong_k(const T *p, size_t n, int nranks, int op, int seed, int half, int isint,
                        unsigned long long *wrong)
{
    unsigned long long w = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        long long s = 0, mx = -1000, mn = 1000;
        for (int r = 0; r < nranks; r++) {
            long long v = TS_CHECK_VALUE(i, r, seed, half);
            s += v;
            mx = v > mx ? v : mx;
            mn = v < mn ? v : mn;
        }
        double e = op == 0 ? (double)s : op == 2 ? (double)mx : op == 3 ? (double)mn
                 : isint ? (double)(s / nranks) : (double)s / nranks;
        double got = to_double<T>(p[i]), want = to_double<T>(from_int<T>(e));
        if (got != want) w++;
    }
    atomicAdd(wrong, w);
}

// x / d as the host's ts_reduce_finish: in the type (integer division for
// integers), half types in float32 rounded once
template <typename T> __device__ T div_by(T v, int d) { return v / (T)d; }
template <> __device__ __nv_bfloat16 div_by<__nv_bfloat16>(__nv_bfloat16 v, int d)
{
    return __float2bfloat16(__bfloat162float(v) / (float)d);
}
template <> __device__ __half div_by<__half>(__half v, int d) { return __float2half(__half2float(v) / (float)d); }

template <typename T> __global__ void div_k(T *p, size_t n, int d)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = div_by<T>(p[i], d);
}

static int launch_check(const char *what)
{
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) return ts_err(TS_ERR_CUDA, __FILE__, __LINE__, "%s: %s", what, cudaGetErrorString(e));
    return 0;
}

int ts_coll_device_fill(void *p, size_t n, ts_dtype dt, int rank, int seed)
{
    if (n == 0) return 0;
    int half = dt == TS_BFLOAT16 || dt == TS_FLOAT16;
    switch (dt) {
    case TS_FLOAT32: fill_k<<<1024, 256>>>((float *)p, n, rank, seed, half); break;
    case TS_FLOAT64: fill_k<<<1024, 256>>>((double *)p, n, rank, seed, half); break;
    case TS_BFLOAT16: fill_k<<<1024, 256>>>((__nv_bfloat16 *)p, n, rank, seed, half); break;
    case TS_FLOAT16: fill_k<<<1024, 256>>>((__half *)p, n, rank, seed, half); break;
    case TS_INT32: fill_k<<<1024, 256>>>((int32_t *)p, n, rank, seed, half); break;
    case TS_INT64: fill_k<<<1024, 256>>>((int64_t *)p, n, rank, seed, half); break;
    default: return ts_err(TS_ERR_UNSUPPORTED, __FILE__, __LINE__, "device fill: dtype %d", (int)dt);
    }
    return launch_check("device fill");
}

int ts_coll_device_wrong(const void *p, size_t n, ts_dtype dt, int nranks, int op, int seed, size_t *wrong)
{
    unsigned long long *d = NULL, h = 0;
    *wrong = 0;
    if (n == 0) return 0;
    if (cudaMalloc(&d, sizeof *d) != cudaSuccess) return ts_err(TS_ERR_CUDA, __FILE__, __LINE__, "cudaMalloc");
    cudaMemset(d, 0, sizeof *d);
    int half = dt == TS_BFLOAT16 || dt == TS_FLOAT16;
    int isint = dt == TS_INT32 || dt == TS_INT64;
    switch (dt) {
    case TS_FLOAT32: wrong_k<<<1024, 256>>>((const float *)p, n, nranks, op, seed, half, isint, d); break;
    case TS_FLOAT64: wrong_k<<<1024, 256>>>((const double *)p, n, nranks, op, seed, half, isint, d); break;
    case TS_BFLOAT16: wrong_k<<<1024, 256>>>((const __nv_bfloat16 *)p, n, nranks, op, seed, half, isint, d); break;
    case TS_FLOAT16: wrong_k<<<1024, 256>>>((const __half *)p, n, nranks, op, seed, half, isint, d); break;
    case TS_INT32: wrong_k<<<1024, 256>>>((const int32_t *)p, n, nranks, op, seed, half, isint, d); break;
    case TS_INT64: wrong_k<<<1024, 256>>>((const int64_t *)p, n, nranks, op, seed, half, isint, d); break;
    default: cudaFree(d); return ts_err(TS_ERR_UNSUPPORTED, __FILE__, __LINE__, "device check: dtype %d", (int)dt);
    }
    int err = launch_check("device check");
    cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    *wrong = (size_t)h;
    return err;
}

int ts_coll_device_avg(void *p, size_t n, ts_dtype dt, int nranks, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (n == 0 || nranks == 1) return 0;
    switch (dt) {
    case TS_FLOAT32: div_k<<<1024, 256, 0, st>>>((float *)p, n, nranks); break;
    case TS_FLOAT64: div_k<<<1024, 256, 0, st>>>((double *)p, n, nranks); break;
    case TS_BFLOAT16: div_k<<<1024, 256, 0, st>>>((__nv_bfloat16 *)p, n, nranks); break;
    case TS_FLOAT16: div_k<<<1024, 256, 0, st>>>((__half *)p, n, nranks); break;
    case TS_INT32: div_k<<<1024, 256, 0, st>>>((int32_t *)p, n, nranks); break;
    case TS_INT64: div_k<<<1024, 256, 0, st>>>((int64_t *)p, n, nranks); break;
    default: return ts_err(TS_ERR_UNSUPPORTED, __FILE__, __LINE__, "device average: dtype %d", (int)dt);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return ts_err(TS_ERR_CUDA, __FILE__, __LINE__, "device average: %s", cudaGetErrorString(e));
    return 0;
}
