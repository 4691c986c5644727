/* The layers' CUDA context: one cuDNN and one cuBLAS handle per process,
 * bound to the engine's compute stream, grow-only device scratch slots
 * (cuDNN workspace, packed weights, half-precision staging), and cuBLAS
 * opened at its first use (cublas_lib.h). Owns no layer arithmetic
 * (conv_cudnn.c, nn_kernels.cu) and no device selection
 * (src/core/device.c). Every cuDNN/cuBLAS/CUDA status is checked. */
#include "tsbuild.h"
#include "src/nn/cuda/cuda_nn.h"
#include "src/core/device.h"
#include "src/core/error.h"

#include "src/nn/cuda/cublas_lib.h"

#include <cuda_runtime.h>
#include <cudnn.h>
#ifndef TS_CUDA_EMU_FULL
#include <dlfcn.h>
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cudnnHandle_t dnn;
static cublasHandle_t blas;
static ts_cublas_lib bl;
static char bl_absent[512] = "not opened"; /* why cuBLAS could not be opened; "" once it is */
static pthread_once_t bl_once = PTHREAD_ONCE_INIT;

#define TS_STR_(x) #x
#define TS_STR(x) TS_STR_(x)

static void bl_load(void)
{
#ifdef TS_CUDA_EMU_FULL
    bl = (ts_cublas_lib){cublasCreate, cublasDestroy, cublasSetStream, cublasGemmEx, cublasGetProperty,
                         cublasGetStatusString};
#else
    /* the soname of the major version the headers describe; found as the
     * linked libraries are (LD_LIBRARY_PATH, this program's run path, the
     * loader's cache) */
    const char *file = "libcublas.so." TS_STR(CUBLAS_VER_MAJOR);
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(bl_absent, sizeof bl_absent, "cannot open %s: %s", file, dlerror());
        return;
    }
    /* the exported names: the headers map some to versioned ones
     * (cublasCreate is cublasCreate_v2) */
    static const char *const names[] = {TS_STR(cublasCreate), TS_STR(cublasDestroy), TS_STR(cublasSetStream),
                                        TS_STR(cublasGemmEx), TS_STR(cublasGetProperty),
                                        TS_STR(cublasGetStatusString)};
    void *f[6];
    for (int i = 0; i < 6; i++) {
        dlerror();
        f[i] = dlsym(h, names[i]);
        if (!f[i]) {
            const char *e = dlerror();
            snprintf(bl_absent, sizeof bl_absent, "%s has no %s: %s", file, names[i], e ? e : "symbol is NULL");
            return; /* the handle stays open: another library may share it */
        }
    }
    bl.create = (__typeof__(bl.create))f[0];
    bl.destroy = (__typeof__(bl.destroy))f[1];
    bl.set_stream = (__typeof__(bl.set_stream))f[2];
    bl.gemm_ex = (__typeof__(bl.gemm_ex))f[3];
    bl.get_property = (__typeof__(bl.get_property))f[4];
    bl.status_string = (__typeof__(bl.status_string))f[5];
#endif
    bl_absent[0] = 0;
}

int ts_cublas_lib_open(const ts_cublas_lib **lib)
{
    *lib = NULL;
    pthread_once(&bl_once, bl_load);
    if (bl_absent[0]) return TS_ERR(TS_ERR_CUDA, "cuBLAS (the GPU engine's GEMMs): %s", bl_absent);
    *lib = &bl;
    return 0;
}
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
    if (!blas && cublas) { /* only a caller that uses it opens cuBLAS */
        const ts_cublas_lib *l;
        TS_TRY(ts_cublas_lib_open(&l));
        cublasStatus_t s = l->create(&blas);
        if (s != CUBLAS_STATUS_SUCCESS) {
            blas = NULL;
            return TS_ERR(TS_ERR_CUDA, "cublasCreate: %s", l->status_string(s));
        }
        s = l->set_stream(blas, (cudaStream_t)d->compute);
        if (s != CUBLAS_STATUS_SUCCESS) return TS_ERR(TS_ERR_CUDA, "cublasSetStream: %s", l->status_string(s));
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
    const ts_cublas_lib *l;
    if (ts_cublas_lib_open(&l)) {
        ts_err_clear();
        snprintf(buf, n, "cuDNN %zu.%zu.%zu, cuBLAS not loaded (%s)", v / 10000, v % 10000 / 100, v % 100, bl_absent);
        return buf;
    }
    if (l->get_property(MAJOR_VERSION, &ma) != CUBLAS_STATUS_SUCCESS ||
        l->get_property(MINOR_VERSION, &mi) != CUBLAS_STATUS_SUCCESS ||
        l->get_property(PATCH_LEVEL, &pa) != CUBLAS_STATUS_SUCCESS)
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
    if (blas) bl.destroy(blas);
    dnn = NULL;
    blas = NULL;
}
