/* The CUDA emulator's runtime beyond what the kernels' launchers call
 * (tests/nn/cuda_emu_rt.h): device memory, devices, streams, events and
 * cuBLAS's handles, for a build configured --with-cuda=emu, where all of
 * libtessera is built against the emulator (docs/testing.md, "The GPU
 * engine under the emulator"). Device memory is host memory that the
 * emulator keeps a table of: a copy or a memset is checked against it
 * (a host pointer where the copy's kind says device, a range past an
 * allocation's end, a free of what cudaMalloc did not give), and fresh
 * allocations hold NaN bytes, as fresh device memory holds garbage. Work
 * on a stream runs at once, so an ordering bug between streams is not
 * seen here. TSEMU_DEVICES sets the number of devices (default 1, 0 for
 * none), CUDA_VISIBLE_DEVICES which of them a process sees (as CUDA reads
 * it), TSEMU_DEVICE_MIB each one's memory (default 16384). */
#include "tests/nn/cuda_emu_rt.h"

#include <map>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" void tsemu_set_error(cudaError_t e);

namespace {

struct alloc_info {
    size_t bytes;
    int device;
};
std::map<const char *, alloc_info> device_mem; /* by start */
std::map<const char *, size_t> host_mem;       /* cudaMallocHost's */
int current_device;
size_t used[64];

int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}
/* TSEMU_DEVICES, of which CUDA_VISIBLE_DEVICES shows the indices it lists (up to the first that is
 * not one, as CUDA reads it; empty: none), renumbered from 0; phys[] holds each one's own index */
int phys[64];
int devices(void)
{
    int n = env_int("TSEMU_DEVICES", 1);
    n = n < 0 ? 0 : n > 64 ? 64 : n;
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v) {
        for (int i = 0; i < n; i++) phys[i] = i;
        return n;
    }
    int seen = 0;
    for (const char *p = v; *p && seen < 64;) {
        char *end;
        const long id = strtol(p, &end, 10);
        if (end == p || id < 0 || id >= n || (*end && *end != ',')) break;
        phys[seen++] = (int)id;
        p = *end ? end + 1 : end;
    }
    return seen;
}
size_t device_bytes(void) { return (size_t)env_int("TSEMU_DEVICE_MIB", 16384) << 20; }

cudaError_t fail(cudaError_t e)
{
    tsemu_set_error(e); /* returned by the next cudaGetLastError, as the runtime does */
    return e;
}

} // namespace

/* 1: [p, p + n) lies in one device allocation; 0: p is not device memory; -1: it starts in one and runs past its end */
extern "C" int tsemu_device_range(const void *p, size_t n)
{
    const char *c = (const char *)p;
    auto it = device_mem.upper_bound(c);
    if (it == device_mem.begin()) return 0;
    --it;
    if (c >= it->first + it->second.bytes) return 0;
    return c + n <= it->first + it->second.bytes ? 1 : -1;
}


extern "C" {

cudaError_t cudaMalloc(void **p, size_t n)
{
    if (!p) return fail(cudaErrorInvalidValue);
    if (devices() == 0) return fail(cudaErrorNoDevice);
    if (used[current_device] + n > device_bytes()) return fail(cudaErrorMemoryAllocation);
    char *m = (char *)malloc(n ? n : 1);
    if (!m) return fail(cudaErrorMemoryAllocation);
    memset(m, 0xff, n); /* NaN until written */
    device_mem[m] = {n, current_device};
    used[current_device] += n;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    auto it = device_mem.find((const char *)p);
    if (it == device_mem.end()) {
        fprintf(stderr, "cuda_emu: cudaFree(%p): not a pointer cudaMalloc gave\n", p);
        return fail(cudaErrorInvalidDevicePointer);
    }
    used[it->second.device] -= it->second.bytes;
    device_mem.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
    if (!p) return fail(cudaErrorInvalidValue);
    char *m = (char *)malloc(n ? n : 1);
    if (!m) return fail(cudaErrorMemoryAllocation);
    host_mem[m] = n;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    if (!p) return cudaSuccess;
    auto it = host_mem.find((const char *)p);
    if (it == host_mem.end()) {
        fprintf(stderr, "cuda_emu: cudaFreeHost(%p): not a pointer cudaMallocHost gave\n", p);
        return fail(cudaErrorInvalidValue);
    }
    host_mem.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k)
{
    return cudaMemcpyAsync(dst, src, n, k, NULL);
}

cudaError_t cudaMemset(void *p, int v, size_t n) { return cudaMemsetAsync(p, v, n, NULL); }

cudaError_t cudaGetDeviceCount(int *n)
{
    if (!n) return fail(cudaErrorInvalidValue);
    *n = devices();
    return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev)
{
    if (!p) return fail(cudaErrorInvalidValue);
    if (dev < 0 || dev >= devices()) return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "tessera CUDA emulator (CPU)");
    p->totalGlobalMem = device_bytes();
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 4;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int dev)
{
    if (!id || len < 13) return fail(cudaErrorInvalidValue);
    if (dev < 0 || dev >= devices()) return fail(cudaErrorInvalidDevice);
    snprintf(id, (size_t)len, "0000:%02x:00.0", 0xa0 + phys[dev]); /* the device's own, whatever its number here */
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev)
{
    if (!dev) return fail(cudaErrorInvalidValue);
    *dev = current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev)
{
    if (dev < 0 || dev >= devices()) return fail(cudaErrorInvalidDevice);
    current_device = dev;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    if (!free_bytes || !total) return fail(cudaErrorInvalidValue);
    if (devices() == 0) return fail(cudaErrorNoDevice);
    *total = device_bytes();
    *free_bytes = *total - used[current_device];
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v) return fail(cudaErrorInvalidValue);
    *v = 13000;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) { return cudaRuntimeGetVersion(v); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    if (!s) return fail(cudaErrorInvalidValue);
    *s = (cudaStream_t)malloc(16);
    return *s ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s) return fail(cudaErrorInvalidResourceHandle);
    free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; } /* work ran when it was issued */
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned)
{
    return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned)
{
    if (!e) return fail(cudaErrorInvalidValue);
    *e = (cudaEvent_t)malloc(16);
    return *e ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    free(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t)
{
    return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
/* the work before a record has run when it was queued (the emulator runs copies and kernels at once) */
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    if (!a) return fail(cudaErrorInvalidValue);
    memset(a, 0, sizeof *a);
    if (tsemu_device_range(p, 0)) {
        a->type = cudaMemoryTypeDevice;
        a->devicePointer = (void *)p;
        a->device = device_mem.upper_bound((const char *)p) == device_mem.begin()
                        ? 0
                        : std::prev(device_mem.upper_bound((const char *)p))->second.device;
    } else {
        a->type = host_mem.count((const char *)p) ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
        a->hostPointer = (void *)p;
    }
    return cudaSuccess;
}

/* cuBLAS's handles (the GEMM itself is in cuda_emu.cc) */
cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    *h = (cublasHandle_t)malloc(16);
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t) { return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE; }
cublasStatus_t cublasGetProperty(libraryPropertyType t, int *v)
{
    if (!v) return CUBLAS_STATUS_INVALID_VALUE;
    *v = t == MAJOR_VERSION ? 13 : 0;
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
