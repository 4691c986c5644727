/* The CUDA emulator in the place of cuDNN (a build configured
 * --with-cuda=emu; tests/nn/cuda_emu_dnn.cc): the legacy convolution API
 * as src/nn/cuda/conv_cudnn.c calls it (5-D NHWC tensors and filters,
 * cross-correlation, dilation 1, one group), computed in double on the
 * CPU; anything else is refused with CUDNN_STATUS_NOT_SUPPORTED. */
#ifndef TS_TESTS_NN_EMU_CUDNN_H
#define TS_TESTS_NN_EMU_CUDNN_H

#include <stddef.h>

#include "tests/nn/cuda_emu_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cudnnContext *cudnnHandle_t;
typedef struct cudnnTensorStruct *cudnnTensorDescriptor_t;
typedef struct cudnnFilterStruct *cudnnFilterDescriptor_t;
typedef struct cudnnConvolutionStruct *cudnnConvolutionDescriptor_t;
typedef enum {
    CUDNN_STATUS_SUCCESS = 0,
    CUDNN_STATUS_NOT_INITIALIZED = 1001,
    CUDNN_STATUS_BAD_PARAM = 2000,
    CUDNN_STATUS_NOT_SUPPORTED = 3000
} cudnnStatus_t;
typedef enum { CUDNN_DATA_FLOAT = 0, CUDNN_DATA_DOUBLE = 1, CUDNN_DATA_HALF = 2, CUDNN_DATA_BFLOAT16 = 9 } cudnnDataType_t;
typedef enum { CUDNN_TENSOR_NCHW = 0, CUDNN_TENSOR_NHWC = 1 } cudnnTensorFormat_t;
typedef enum { CUDNN_DEFAULT_MATH = 0, CUDNN_TENSOR_OP_MATH = 1, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,
               CUDNN_FMA_MATH = 3 } cudnnMathType_t;
typedef enum { CUDNN_CONVOLUTION = 0, CUDNN_CROSS_CORRELATION = 1 } cudnnConvolutionMode_t;
typedef enum { CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM = 0, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1 }
    cudnnConvolutionFwdAlgo_t;
typedef enum { CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 = 0, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1 }
    cudnnConvolutionBwdDataAlgo_t;
typedef enum { CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 = 0, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 = 1 }
    cudnnConvolutionBwdFilterAlgo_t;
typedef enum { CUDNN_NON_DETERMINISTIC = 0, CUDNN_DETERMINISTIC = 1 } cudnnDeterminism_t;
#define TS_EMU_PERF(name, algo_t) \
    typedef struct {              \
        algo_t algo;              \
        cudnnStatus_t status;     \
        float time;               \
        size_t memory;            \
        cudnnDeterminism_t determinism; \
        cudnnMathType_t mathType; \
        int reserved[3];          \
    } name
TS_EMU_PERF(cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t);
TS_EMU_PERF(cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t);
TS_EMU_PERF(cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t);
#undef TS_EMU_PERF

size_t cudnnGetVersion(void);
const char *cudnnGetErrorString(cudnnStatus_t s);
cudnnStatus_t cudnnCreate(cudnnHandle_t *h);
cudnnStatus_t cudnnDestroy(cudnnHandle_t h);
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s);
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d);
cudnnStatus_t cudnnSetTensorNdDescriptorEx(cudnnTensorDescriptor_t d, cudnnTensorFormat_t f, cudnnDataType_t t,
                                           int nd, const int dims[]);
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d);
cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t, cudnnTensorFormat_t f, int nd,
                                         const int dims[]);
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d);
cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t d, int n, const int pad[], const int stride[],
                                              const int dil[], cudnnConvolutionMode_t mode, cudnnDataType_t t);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m);
cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                   cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t c,
                                                   cudnnTensorDescriptor_t y, int want, int *got,
                                                   cudnnConvolutionFwdAlgoPerf_t *p);
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(cudnnHandle_t h, cudnnFilterDescriptor_t w,
                                                        cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t c,
                                                        cudnnTensorDescriptor_t dx, int want, int *got,
                                                        cudnnConvolutionBwdDataAlgoPerf_t *p);
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                          cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t c,
                                                          cudnnFilterDescriptor_t dw, int want, int *got,
                                                          cudnnConvolutionBwdFilterAlgoPerf_t *p);
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t xd, const void *x,
                                      cudnnFilterDescriptor_t wd, const void *w, cudnnConvolutionDescriptor_t c,
                                      cudnnConvolutionFwdAlgo_t algo, void *ws, size_t ws_bytes, const void *beta,
                                      cudnnTensorDescriptor_t yd, void *y);
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha, cudnnFilterDescriptor_t wd,
                                           const void *w, cudnnTensorDescriptor_t dyd, const void *dy,
                                           cudnnConvolutionDescriptor_t c, cudnnConvolutionBwdDataAlgo_t algo,
                                           void *ws, size_t ws_bytes, const void *beta, cudnnTensorDescriptor_t dxd,
                                           void *dx);
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t xd,
                                             const void *x, cudnnTensorDescriptor_t dyd, const void *dy,
                                             cudnnConvolutionDescriptor_t c, cudnnConvolutionBwdFilterAlgo_t algo,
                                             void *ws, size_t ws_bytes, const void *beta, cudnnFilterDescriptor_t dwd,
                                             void *dw);
cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t dyd,
                                           const void *dy, const void *beta, cudnnTensorDescriptor_t dbd, void *db);
cudnnStatus_t cudnnAddTensor(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t ad, const void *a,
                             const void *beta, cudnnTensorDescriptor_t cd, void *c);

#ifdef __cplusplus
}
#endif

#endif
