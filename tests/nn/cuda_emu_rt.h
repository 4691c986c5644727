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
/* the rest of the runtime and cuBLAS: defined only in a build configured
 * --with-cuda=emu (tests/nn/cuda_emu_runtime.cc), where libtessera is built
 * against the emulator instead of CUDA */
#define cudaMalloc tsemu_cudaMalloc
#define cudaFree tsemu_cudaFree
#define cudaMallocHost tsemu_cudaMallocHost
#define cudaFreeHost tsemu_cudaFreeHost
#define cudaMemcpy tsemu_cudaMemcpy
#define cudaMemset tsemu_cudaMemset
#define cudaGetDeviceCount tsemu_cudaGetDeviceCount
#define cudaGetDeviceProperties tsemu_cudaGetDeviceProperties
#define cudaDeviceGetPCIBusId tsemu_cudaDeviceGetPCIBusId
#define cudaGetDevice tsemu_cudaGetDevice
#define cudaSetDevice tsemu_cudaSetDevice
#define cudaMemGetInfo tsemu_cudaMemGetInfo
#define cudaDeviceSynchronize tsemu_cudaDeviceSynchronize
#define cudaRuntimeGetVersion tsemu_cudaRuntimeGetVersion
#define cudaDriverGetVersion tsemu_cudaDriverGetVersion
#define cudaStreamCreateWithFlags tsemu_cudaStreamCreateWithFlags
#define cudaStreamDestroy tsemu_cudaStreamDestroy
#define cudaStreamQuery tsemu_cudaStreamQuery
#define cudaStreamWaitEvent tsemu_cudaStreamWaitEvent
#define cudaEventCreateWithFlags tsemu_cudaEventCreateWithFlags
#define cudaEventDestroy tsemu_cudaEventDestroy
#define cudaEventRecord tsemu_cudaEventRecord
#define cudaEventSynchronize tsemu_cudaEventSynchronize
#define cudaPointerGetAttributes tsemu_cudaPointerGetAttributes
#define cublasCreate tsemu_cublasCreate
#define cublasDestroy tsemu_cublasDestroy
#define cublasSetStream tsemu_cublasSetStream
#define cublasGetProperty tsemu_cublasGetProperty

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *cudaStream_t;
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100
} cudaError_t;
typedef struct CUevent_st *cudaEvent_t;
enum { cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2 };
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2, cudaMemoryTypeManaged = 3 };
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer, *hostPointer;
};
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor, multiProcessorCount;
};
typedef enum cudaMemcpyKind {
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
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev);
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);

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
typedef enum { MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2 } libraryPropertyType;
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasGetProperty(libraryPropertyType t, int *v);

/* the sticky error the next cudaGetLastError returns */
void tsemu_set_error(cudaError_t e);

/* the emulator's counts, for the tests */
unsigned long long tsemu_launches(void);
unsigned long long tsemu_barrier_rounds(void);
unsigned long long tsemu_gemms(void);
int tsemu_selftest(char *why, size_t len);

#ifdef __cplusplus
}
/* the CUDA runtime's typed overload, for the .cu files */
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
template <typename T> static inline cudaError_t cudaMallocHost(T **p, size_t n) { return cudaMallocHost((void **)p, n); }
#endif

#endif
