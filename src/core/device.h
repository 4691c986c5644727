/* GPUs for the engine: which device a rank uses, its two streams, device
 * memory and copies between host and device tensors. One GPU per process
 * (local rank % device count); everything here is local (no MPI).
 * Device memory is plain cudaMalloc, never managed memory. In a build
 * without CUDA, ts_device_count() is 0, ts_device_compiled() is 0 and every
 * other call returns TS_ERR_UNSUPPORTED saying so. */
#ifndef TS_CORE_DEVICE_H
#define TS_CORE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/tensor.h"

/* Local. 1 when this build has CUDA (configure found nvcc, cuBLAS, cuDNN
 * and NCCL). */
int ts_device_compiled(void);
/* Local. Visible GPUs (0 without CUDA, without a driver or without devices). */
int ts_device_count(void);
/* Local. Why there is no GPU, for messages: "" when ts_device_count() > 0,
 * else e.g. "this build has no CUDA (configure --with-cuda)" or the CUDA
 * runtime's answer ("no CUDA-capable device is detected"). Static string. */
const char *ts_device_absent_reason(void);

/* Local. "CUDA runtime 13.0, driver 13.0" (driver "none" where no driver
 * is loaded), or the reason there is no CUDA in this build. */
const char *ts_device_versions(char *buf, size_t n);

typedef struct ts_device_info {
    char name[96];
    char pci[32];          /* PCI bus id, "0000:3b:00.0" */
    size_t mem_total;      /* bytes */
    size_t mem_free;       /* bytes, at the time of the call */
    int major, minor;      /* compute capability */
    int sms;               /* multiprocessors */
} ts_device_info;
/* Local. Properties of device i (0 <= i < ts_device_count()). */
int ts_device_info_get(int i, ts_device_info *out);

/* The process's GPU once opened: the device ordinal and the engine's two
 * streams (cudaStream_t, as void * so that C code without CUDA headers can
 * hold them): compute (layers) and comm (gradient buckets, halo copies).
 * Work on comm that needs compute's results waits on an event recorded on
 * compute (ts_device_comm_wait_compute). */
typedef struct ts_device {
    int id;
    void *compute, *comm;
    void *ev; /* cudaEvent_t, reused by ts_device_comm_wait_compute */
    void *up; /* cudaEvent_t, recorded after the latest ts_tensor_upload_async */
    int up_pending; /* up was recorded and not yet waited for */
} ts_device;

/* Local. Selects device local_rank % ts_device_count() for this process and
 * creates its streams; idempotent (a second call returns the open device,
 * whatever local_rank). *out may be NULL. TS_ERR_UNSUPPORTED without a GPU. */
int ts_device_open(int local_rank, const ts_device **out);
/* Local. The open device, or NULL. */
const ts_device *ts_device_current(void);
/* Local. Destroys the streams (device memory is the caller's to free first). */
void ts_device_close(void);
/* Local. Waits until both streams are idle; reports a pending CUDA error. */
int ts_device_sync(void);
/* Local. Makes the comm stream wait for the work queued on compute so far. */
int ts_device_comm_wait_compute(void);

/* Local. bytes of device memory (the open device; 64 B when bytes is 0). */
int ts_device_alloc(size_t bytes, void **p);
void ts_device_free(void *p);
/* Local. Zeroed device storage for the shape (t->device = 1, t owns it);
 * ts_tensor_free releases it. */
int ts_tensor_alloc_device(ts_tensor *t, ts_dtype dtype, int ndim, const int64_t *shape);
/* Local. Copies between tensors of the same dtype and element count, in any
 * direction (host or device on either side), ordered on the compute stream
 * and complete when the call returns. */
int ts_tensor_transfer(ts_tensor *dst, const ts_tensor *src);
/* Local. Zeroed page-locked host storage (cudaMallocHost) for the shape:
 * copies from it to the GPU need no staging copy and do not synchronise the
 * stream (ts_tensor_upload_async). t owns it (t->owns = 2; ts_tensor_free
 * releases it). In a build without CUDA, plain host storage. */
int ts_tensor_alloc_pinned(ts_tensor *t, ts_dtype dtype, int ndim, const int64_t *shape);
void ts_device_free_host(void *p);
/* Local. Queues the copy of host tensor src (page-locked:
 * ts_tensor_alloc_pinned, or a view of such memory) to device tensor dst
 * (same dtype and element count) on the compute stream, in order with the
 * layers' kernels, and returns without waiting for it: src must not be
 * written again until ts_device_upload_wait has returned. */
int ts_tensor_upload_async(ts_tensor *dst, const ts_tensor *src);
/* Local. Waits until every copy ts_tensor_upload_async queued has read its
 * source (at once when none is pending); reports a CUDA error. */
int ts_device_upload_wait(void);
/* Local. Sets a device tensor's bytes to zero on the compute stream. */
int ts_device_zero(ts_tensor *t);

#endif
