/* The CUDA emulator's runtime and cuBLAS calls, for C and C++ (tests/nn/
 * cuda_emu.h for the kernels; tests/nn/emu_include/ puts this header in
 * the place of <cuda_runtime.h> and <cublas_v2.h>, so that src/nn/cuda/
 * conv_gemm.c and layers_cuda.c compile against it): what the launchers,
 * the GEMM convolutions and the layers call, executed at once on the CPU (every pointer is host
 * memory, streams are ignored). cublasGemmEx checks its arguments as
 * cuBLAS documents (sizes, leading dimensions, types) and computes in
 * double from the operands' values. */
#ifndef TS_TESTS_NN_CUDA_EMU_RT_H
#define TS_TESTS_NN_CUDA_EMU_RT_H

#include <stddef.h>

/* the emulator's definitions under their own names: a CUDA build links the
 * real runtime and cuBLAS too, which these must not replace */
#define cudaMemsetAsync tsemu_cudaMemsetAsync
#define cudaMemcpyAsync tsemu_cudaMemcpyAsync
#define cudaMemcpy2DAsync tsemu_cudaMemcpy2DAsync
#define cudaStreamSynchronize tsemu_cudaStreamSynchronize
#define cudaGetLastError tsemu_cudaGetLastError
#define cudaGetErrorString tsemu_cudaGetErrorString
#define cublasGemmEx tsemu_cublasGemmEx
#define cublasGetStatusString tsemu_cublasGetStatusString

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *cudaStream_t;
typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorInvalidConfiguration = 9
} cudaError_t;
typedef enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3
} cudaMemcpyKind;
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);

/* cuBLAS: cublasGemmEx with fp32 results, as conv_gemm.c calls it */
typedef struct cublasContext *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_NOT_SUPPORTED = 15 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t comp, cublasGemmAlgo_t algo);
const char *cublasGetStatusString(cublasStatus_t s);

/* the emulator's counts, for the tests */
unsigned long long tsemu_launches(void);
unsigned long long tsemu_barrier_rounds(void);
unsigned long long tsemu_gemms(void);
int tsemu_selftest(char *why, size_t len);

#ifdef __cplusplus
}
#endif

#endif
