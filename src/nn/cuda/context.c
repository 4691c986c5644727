/* The layers' CUDA context: one cuDNN and one cuBLAS handle per process,
 * bound to the engine's compute stream, and grow-only device scratch slots
 * (cuDNN workspace, packed weights, half-precision staging). Owns no layer
 * arithmetic (conv_cudnn.c, nn_kernels.cu) and no device selection
 * (src/core/device.c). Every cuDNN/cuBLAS/CUDA status is checked. */
#include "tsbuild.h"
#include "src/nn/cuda/cuda_nn.h"
#include "src/core/device.h"
#include "src/core/error.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cudnnHandle_t dnn;
static cublasHandle_t blas;
static struct {
    void *p;
    size_t bytes;
} slots[TS_CUDA_SLOTS];

int ts_cuda_nn_handles(void **cudnn, void **cublas, void **stream)
{
    const ts_device *d = ts_device_current();
    if (!d) TS_TRY(ts_device_open(0, &d));
    if (!dnn) {
        cudnnStatus_t s = cudnnCreate(&dnn);
        if (s != CUDNN_STATUS_SUCCESS) {
            dnn = NULL;
            return TS_ERR(TS_ERR_CUDA, "cudnnCreate: %s", cudnnGetErrorString(s));
        }
        s = cudnnSetStream(dnn, (cudaStream_t)d->compute);
        if (s != CUDNN_STATUS_SUCCESS) return TS_ERR(TS_ERR_CUDA, "cudnnSetStream: %s", cudnnGetErrorString(s));
    }
    if (!blas) {
        cublasStatus_t s = cublasCreate(&blas);
        if (s != CUBLAS_STATUS_SUCCESS) {
            blas = NULL;
            return TS_ERR(TS_ERR_CUDA, "cublasCreate: %s", cublasGetStatusString(s));
        }
        s = cublasSetStream(blas, (cudaStream_t)d->compute);
        if (s != CUBLAS_STATUS_SUCCESS) return TS_ERR(TS_ERR_CUDA, "cublasSetStream: %s", cublasGetStatusString(s));
    }
    if (cudnn) *cudnn = dnn;
    if (cublas) *cublas = blas;
    if (stream) *stream = d->compute;
    return 0;
}

int ts_cuda_scratch(int slot, size_t bytes, void **p)
{
    if (slot < 0 || slot >= TS_CUDA_SLOTS) return TS_ERR(TS_ERR_INTERNAL, "device scratch slot %d", slot);
    if (bytes > slots[slot].bytes) {
        /* the old buffer may still be read by queued work: wait before freeing */
        if (slots[slot].p) {
            TS_TRY(ts_device_sync());
            ts_device_free(slots[slot].p);
            slots[slot].p = NULL;
            slots[slot].bytes = 0;
        }
        const size_t want = bytes + bytes / 4; /* headroom: fewer regrowths */
        TS_TRY(ts_device_alloc(want, &slots[slot].p));
        slots[slot].bytes = want;
    }
    *p = slots[slot].p;
    return 0;
}

const char *ts_cuda_nn_versions(char *buf, size_t n)
{
    const size_t v = cudnnGetVersion();
    int ma = 0, mi = 0, pa = 0;
    if (cublasGetProperty(MAJOR_VERSION, &ma) != CUBLAS_STATUS_SUCCESS ||
        cublasGetProperty(MINOR_VERSION, &mi) != CUBLAS_STATUS_SUCCESS ||
        cublasGetProperty(PATCH_LEVEL, &pa) != CUBLAS_STATUS_SUCCESS)
        ma = mi = pa = 0;
    snprintf(buf, n, "cuDNN %zu.%zu.%zu, cuBLAS %d.%d.%d", v / 10000, v % 10000 / 100, v % 100, ma, mi, pa);
    return buf;
}

void ts_cuda_nn_release(void)
{
    if (!ts_device_current()) return;
    ts_device_sync();
    for (int i = 0; i < TS_CUDA_SLOTS; i++) {
        ts_device_free(slots[i].p);
        slots[i].p = NULL;
        slots[i].bytes = 0;
    }
    if (dnn) cudnnDestroy(dnn);
    if (blas) cublasDestroy(blas);
    dnn = NULL;
    blas = NULL;
}
