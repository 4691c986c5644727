/* The process's GPU: device discovery, selection by local rank, the compute
 * and comm streams, device memory and host <-> device tensor copies (see
 * device.h). CUDA runtime calls only: no kernels (src/nn/cuda), no cuDNN or
 * cuBLAS (src/nn/cuda/context.c), no NCCL (collectives/device.c), no MPI.
 * Every CUDA status is checked; a failure becomes TS_ERR_CUDA naming the
 * call and the runtime's message. */
#include "tsbuild.h"
#include "src/core/device.h"
#include "src/core/error.h"

#include <stdio.h>
#include <string.h>

#ifdef TS_HAVE_CUDA
#include <cuda_runtime.h>

#define CK(call)                                                                                         \
    do {                                                                                                 \
        cudaError_t e_ = (call);                                                                         \
        if (e_ != cudaSuccess) return TS_ERR(TS_ERR_CUDA, "%s: %s", #call, cudaGetErrorString(e_)); \
    } while (0)

static ts_device dev = {-1, NULL, NULL, NULL, NULL, 0};
static char absent[160];

int ts_device_compiled(void) { return 1; }

int ts_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(absent, sizeof absent, "%s", cudaGetErrorString(e));
        cudaGetLastError(); /* not sticky: clear it */
        return 0;
    }
    if (n == 0) snprintf(absent, sizeof absent, "the CUDA runtime sees no device");
    else absent[0] = 0;
    return n;
}

const char *ts_device_absent_reason(void)
{
    if (ts_device_count() > 0) return "";
    return absent;
}

const char *ts_device_versions(char *buf, size_t n)
{
    int rt = 0, drv = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
    cudaGetLastError();
    char d[32] = "none";
    if (drv) snprintf(d, sizeof d, "%d.%d", drv / 1000, drv % 1000 / 10);
    snprintf(buf, n, "CUDA runtime %d.%d, driver %s", rt / 1000, rt % 1000 / 10, d);
    return buf;
}

int ts_device_info_get(int i, ts_device_info *out)
{
    struct cudaDeviceProp p;
    memset(out, 0, sizeof *out);
    const int n = ts_device_count();
    if (i < 0 || i >= n) return TS_ERR(TS_ERR_ARG, "GPU %d: %d visible", i, n);
    CK(cudaGetDeviceProperties(&p, i));
    snprintf(out->name, sizeof out->name, "%s", p.name);
    CK(cudaDeviceGetPCIBusId(out->pci, (int)sizeof out->pci, i));
    out->mem_total = p.totalGlobalMem;
    out->major = p.major;
    out->minor = p.minor;
    out->sms = p.multiProcessorCount;
    int cur = 0;
    CK(cudaGetDevice(&cur));
    CK(cudaSetDevice(i));
    size_t fr = 0, tot = 0;
    cudaError_t e = cudaMemGetInfo(&fr, &tot);
    CK(cudaSetDevice(cur));
    if (e != cudaSuccess) return TS_ERR(TS_ERR_CUDA, "cudaMemGetInfo on GPU %d: %s", i, cudaGetErrorString(e));
    out->mem_free = fr;
    return 0;
}

int ts_device_open(int local_rank, const ts_device **out)
{
    if (dev.id < 0) {
        const int n = ts_device_count();
        if (n == 0) return TS_ERR(TS_ERR_UNSUPPORTED, "no GPU: %s", absent);
        const int id = (local_rank < 0 ? 0 : local_rank) % n;
        CK(cudaSetDevice(id));
        cudaStream_t a = NULL, b = NULL;
        cudaEvent_t ev = NULL, up = NULL;
        CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
        cudaError_t e = cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&up, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            cudaStreamDestroy(a);
            if (b) cudaStreamDestroy(b);
            if (ev) cudaEventDestroy(ev);
            return TS_ERR(TS_ERR_CUDA, "creating the streams of GPU %d: %s", id, cudaGetErrorString(e));
        }
        dev = (ts_device){id, a, b, ev, up, 0};
    }
    if (out) *out = &dev;
    return 0;
}

const ts_device *ts_device_current(void) { return dev.id < 0 ? NULL : &dev; }

void ts_device_close(void)
{
    if (dev.id < 0) return;
    cudaStreamSynchronize((cudaStream_t)dev.compute);
    cudaStreamSynchronize((cudaStream_t)dev.comm);
    cudaEventDestroy((cudaEvent_t)dev.ev);
    cudaEventDestroy((cudaEvent_t)dev.up);
    cudaStreamDestroy((cudaStream_t)dev.compute);
    cudaStreamDestroy((cudaStream_t)dev.comm);
    dev = (ts_device){-1, NULL, NULL, NULL, NULL, 0};
}

static int need_open(void)
{
    return dev.id < 0 ? ts_device_open(0, NULL) : 0;
}

int ts_device_sync(void)
{
    TS_TRY(need_open());
    CK(cudaStreamSynchronize((cudaStream_t)dev.compute));
    CK(cudaStreamSynchronize((cudaStream_t)dev.comm));
    CK(cudaGetLastError());
    return 0;
}

int ts_device_comm_wait_compute(void)
{
    TS_TRY(need_open());
    CK(cudaEventRecord((cudaEvent_t)dev.ev, (cudaStream_t)dev.compute));
    CK(cudaStreamWaitEvent((cudaStream_t)dev.comm, (cudaEvent_t)dev.ev, 0));
    return 0;
}

int ts_device_alloc(size_t bytes, void **p)
{
    *p = NULL;
    TS_TRY(need_open());
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *p = NULL;
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return TS_ERR(TS_ERR_NOMEM, "cudaMalloc of %zu bytes on GPU %d (%zu of %zu free): %s", bytes, dev.id, fr, tot,
                      cudaGetErrorString(e));
    }
    return 0;
}

void ts_device_free(void *p)
{
    if (p) cudaFree(p);
}

/* *s = an unallocated tensor of the shape (t cleared), or an error naming the bad dimension */
static int shaped(ts_tensor *t, ts_dtype dtype, int ndim, const int64_t *shape, ts_tensor *s)
{
    memset(t, 0, sizeof *t);
    if (ndim < 0 || ndim > TS_MAX_DIMS) return TS_ERR(TS_ERR_ARG, "tensor with %d dims (max %d)", ndim, TS_MAX_DIMS);
    *s = ts_tensor_view(NULL, dtype, ndim, shape);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) return TS_ERR(TS_ERR_ARG, "tensor dim %d is negative (%lld)", i, (long long)shape[i]);
    return 0;
}

int ts_tensor_alloc_device(ts_tensor *t, ts_dtype dtype, int ndim, const int64_t *shape)
{
    ts_tensor s;
    TS_TRY(shaped(t, dtype, ndim, shape, &s));
    void *p = NULL;
    TS_TRY(ts_device_alloc(ts_tensor_bytes(&s), &p));
    s.data = p;
    s.device = 1;
    s.owns = 1;
    const int err = ts_device_zero(&s);
    if (err) {
        ts_device_free(p);
        return err;
    }
    *t = s;
    return 0;
}

int ts_tensor_transfer(ts_tensor *dst, const ts_tensor *src)
{
    char a[128], b[128];
    if (dst->dtype != src->dtype || ts_tensor_numel(dst) != ts_tensor_numel(src))
        return TS_ERR(TS_ERR_ARG, "transfer: %s %s to %s %s (dtype and element count must match)",
                      ts_dtype_name(src->dtype), ts_tensor_shape_str(src, a, sizeof a), ts_dtype_name(dst->dtype),
                      ts_tensor_shape_str(dst, b, sizeof b));
    const size_t n = ts_tensor_bytes(src);
    if (n == 0) return 0;
    if (!dst->device && !src->device) {
        memcpy(dst->data, src->data, n);
        return 0;
    }
    TS_TRY(need_open());
    const enum cudaMemcpyKind k = dst->device && src->device ? cudaMemcpyDeviceToDevice
                                  : dst->device              ? cudaMemcpyHostToDevice
                                                             : cudaMemcpyDeviceToHost;
    CK(cudaMemcpyAsync(dst->data, src->data, n, k, (cudaStream_t)dev.compute));
    CK(cudaStreamSynchronize((cudaStream_t)dev.compute));
    return 0;
}

int ts_tensor_alloc_pinned(ts_tensor *t, ts_dtype dtype, int ndim, const int64_t *shape)
{
    ts_tensor s;
    TS_TRY(shaped(t, dtype, ndim, shape, &s));
    TS_TRY(need_open());
    const size_t n = ts_tensor_bytes(&s);
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, n ? n : 64);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return TS_ERR(TS_ERR_NOMEM, "cudaMallocHost of %zu bytes (page-locked host memory): %s", n,
                      cudaGetErrorString(e));
    }
    memset(p, 0, n);
    s.data = p;
    s.owns = 2;
    *t = s;
    return 0;
}

void ts_device_free_host(void *p)
{
    if (p) cudaFreeHost(p);
}

int ts_tensor_upload_async(ts_tensor *dst, const ts_tensor *src)
{
    if (!dst->device || src->device || dst->dtype != src->dtype || ts_tensor_numel(dst) != ts_tensor_numel(src))
        return TS_ERR(TS_ERR_ARG, "upload: a host tensor to a device tensor of the same dtype and element count");
    const size_t n = ts_tensor_bytes(src);
    if (n == 0) return 0;
    TS_TRY(need_open());
    CK(cudaMemcpyAsync(dst->data, src->data, n, cudaMemcpyHostToDevice, (cudaStream_t)dev.compute));
    CK(cudaEventRecord((cudaEvent_t)dev.up, (cudaStream_t)dev.compute));
    dev.up_pending = 1;
    return 0;
}

int ts_device_upload_wait(void)
{
    if (dev.id < 0 || !dev.up_pending) return 0;
    dev.up_pending = 0;
    CK(cudaEventSynchronize((cudaEvent_t)dev.up));
    return 0;
}

int ts_device_zero(ts_tensor *t)
{
    if (!t->device) return TS_ERR(TS_ERR_ARG, "ts_device_zero: a host tensor");
    TS_TRY(need_open());
    CK(cudaMemsetAsync(t->data, 0, ts_tensor_bytes(t), (cudaStream_t)dev.compute));
    return 0;
}

#else /* no CUDA */

#define NO_CUDA "this build has no CUDA (configure --with-cuda)"

int ts_device_compiled(void) { return 0; }
int ts_device_count(void) { return 0; }
const char *ts_device_absent_reason(void) { return NO_CUDA; }
const char *ts_device_versions(char *buf, size_t n)
{
    snprintf(buf, n, "%s", NO_CUDA);
    return buf;
}
int ts_device_info_get(int i, ts_device_info *out)
{
    (void)i;
    memset(out, 0, sizeof *out);
    return TS_ERR(TS_ERR_UNSUPPORTED, NO_CUDA);
}
int ts_device_open(int local_rank, const ts_device **out)
{
    (void)local_rank;
    if (out) *out = NULL;
    return TS_ERR(TS_ERR_UNSUPPORTED, NO_CUDA);
}
const ts_device *ts_device_current(void) { return NULL; }
void ts_device_close(void) {}
int ts_device_sync(void) { return TS_ERR(TS_ERR_UNSUPPORTED, NO_CUDA); }
int ts_device_comm_wait_compute(void) { return TS_ERR(TS_ERR_UNSUPPORTED, NO_CUDA); }
int ts_device_alloc(size_t bytes, void **p)
{
    (void)bytes;
    *p = NULL;
    return TS_ERR(TS_ERR_UNSUPPORTED, NO_CUDA);
}
void ts_device_free(void *p) { (void)p; }
int ts_tensor_alloc_device(ts_tensor *t, ts_dtype dtype, int ndim, const int64_t *shape)
{
    (void)dtype, (void)ndim, (void)shape;
    memset(t, 0, sizeof *t);
    return TS_ERR(TS_ERR_UNSUPPORTED, NO_CUDA);
}
int ts_tensor_transfer(ts_tensor *dst, const ts_tensor *src)
{
    if (dst->device || src->device) return TS_ERR(TS_ERR_UNSUPPORTED, NO_CUDA);
    if (dst->dtype != src->dtype || ts_tensor_numel(dst) != ts_tensor_numel(src))
        return TS_ERR(TS_ERR_ARG, "transfer: dtype and element count must match");
    memcpy(dst->data, src->data, ts_tensor_bytes(src));
    return 0;
}
int ts_tensor_alloc_pinned(ts_tensor *t, ts_dtype dtype, int ndim, const int64_t *shape)
{
    return ts_tensor_alloc(t, dtype, ndim, shape);
}
void ts_device_free_host(void *p) { free(p); }
int ts_tensor_upload_async(ts_tensor *dst, const ts_tensor *src)
{
    (void)dst, (void)src;
    return TS_ERR(TS_ERR_UNSUPPORTED, NO_CUDA);
}
int ts_device_upload_wait(void) { return 0; }
int ts_device_zero(ts_tensor *t)
{
    (void)t;
    return TS_ERR(TS_ERR_UNSUPPORTED, NO_CUDA);
}

#endif
