/* The CUDA emulator's scheduler and runtime calls (tests/nn/cuda_emu.h):
 * a launch's blocks run one after another, a block's threads as ucontext
 * fibers that run until __syncthreads or their end, then the next; all
 * at the barrier, the round starts again. Threads and blocks run in an
 * order that changes with each launch (forward, backward, shuffled), so a
 * thread that reads what another writes without a barrier between them
 * reads a stale value in at least one of them. A launch site whose launch
 * never waited at a barrier runs its later launches without fibers (a
 * barrier there then stops the test: tsemu_* report it). */
#include "tests/nn/cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

enum { STACK = 64 << 10, MAX_THREADS = 1024, MAX_SITES = 256, DYN_MAX = 48 << 10 };
enum { READY, WAITING, DONE };

struct fiber {
    ucontext_t ctx;
    int state;
    uint3 idx;
};

fiber fibers[MAX_THREADS];
char *stacks;
ucontext_t sched;
int current = -1;      /* the fiber running, -1 none (direct mode or outside a launch) */
int direct = 0;        /* running without fibers: a barrier there is an error */
int waited = 0;        /* a barrier was reached in this launch */
cudaError_t last = cudaSuccess;
unsigned long long launches = 0, barrier_rounds = 0;
void (*run_body)(void *);
void *run_ctx;
alignas(16) unsigned char dyn[DYN_MAX]; /* read as doubles and float4s */
size_t dyn_bytes;

struct site {
    const void *key;
    int barrier_free;
};
site sites[MAX_SITES];
int nsites;

/* static shared arrays seen, and the block they were last poisoned in */
struct shared_array {
    void *p;
    unsigned long long block;
};
shared_array arrays[MAX_SITES];
int narrays;
unsigned long long block_serial;

site *site_of(const void *key)
{
    for (int i = 0; i < nsites; i++)
        if (sites[i].key == key) return &sites[i];
    if (nsites == MAX_SITES) return NULL; /* unknown sites always run as fibers */
    sites[nsites] = {key, 0};
    return &sites[nsites++];
}

/* the k-th of n in launch order mode: 0 forward, 1 backward, 2 a stride coprime to n */
unsigned long long nth(unsigned long long k, unsigned long long n, int mode)
{
    if (mode == 0) return k;
    if (mode == 1) return n - 1 - k;
    unsigned long long s = n / 2 + 1;
    while (s > 1) {
        unsigned long long a = s, b = n;
        while (b) {
            const unsigned long long t = a % b;
            a = b;
            b = t;
        }
        if (a == 1) break;
        s++;
    }
    return (k * s + n / 3) % n;
}

void entry(void)
{
    run_body(run_ctx);
    fibers[current].state = DONE;
    /* returns to sched through uc_link */
}

uint3 coords(unsigned long long t, dim3 b)
{
    return {(unsigned)(t % b.x), (unsigned)(t / b.x % b.y), (unsigned)(t / ((unsigned long long)b.x * b.y))};
}

void run_block_fibers(dim3 block, int mode)
{
    const unsigned long long T = (unsigned long long)block.x * block.y * block.z;
    if (!stacks && !(stacks = (char *)malloc((size_t)STACK * MAX_THREADS))) {
        fprintf(stderr, "cuda_emu: no memory for the fibers' stacks\n");
        exit(2);
    }
    for (unsigned long long t = 0; t < T; t++) {
        fiber *f = &fibers[t];
        f->state = READY;
        f->idx = coords(t, block);
        getcontext(&f->ctx);
        f->ctx.uc_stack.ss_sp = stacks + (size_t)STACK * t;
        f->ctx.uc_stack.ss_size = STACK;
        f->ctx.uc_link = &sched;
        makecontext(&f->ctx, entry, 0);
    }
    for (;;) {
        int alive = 0;
        for (unsigned long long k = 0; k < T; k++) {
            const unsigned long long t = nth(k, T, mode);
            if (fibers[t].state == DONE) continue;
            fibers[t].state = READY;
            current = (int)t;
            threadIdx = fibers[t].idx;
            swapcontext(&sched, &fibers[t].ctx);
            if (fibers[t].state != DONE) alive = 1;
        }
        current = -1;
        if (!alive) break;
        barrier_rounds++;
    }
}

} // namespace

void __syncthreads(void)
{
    if (direct) {
        fprintf(stderr, "cuda_emu: __syncthreads in a launch from a site whose earlier launch never waited at a "
                        "barrier (a barrier under a data-dependent condition is not emulated)\n");
        exit(2);
    }
    if (current < 0) return; /* outside a launch */
    waited = 1;
    fiber *f = &fibers[current];
    f->state = WAITING;
    swapcontext(&f->ctx, &sched);
}

void *emu_dynamic_shared(void) { return dyn_bytes ? dyn : NULL; }

void emu_shared_poison(void *p, size_t bytes)
{
    int i = 0;
    while (i < narrays && arrays[i].p != p) i++;
    if (i == narrays) {
        if (narrays == MAX_SITES) {
            fprintf(stderr, "cuda_emu: more than %d static shared arrays\n", MAX_SITES);
            exit(2);
        }
        arrays[narrays++] = {p, 0};
    }
    if (arrays[i].block == block_serial) return;
    arrays[i].block = block_serial;
    memset(p, 0xff, bytes);
}

void emu_launch_fn(dim3 grid, dim3 block, size_t shared, void (*body)(void *), void *ctx, const void *key)
{
    const unsigned long long T = (unsigned long long)block.x * block.y * block.z;
    if (!grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 || !T || T > 1024 ||
        block.x > 1024 || block.y > 1024 || block.z > 64) {
        last = cudaErrorInvalidConfiguration;
        return;
    }
    if (shared > DYN_MAX) {
        last = cudaErrorInvalidValue;
        return;
    }
    const int mode = (int)(launches++ % 3);
    site *s = site_of(key);
    direct = s && s->barrier_free;
    waited = 0;
    run_body = body;
    run_ctx = ctx;
    gridDim = grid;
    blockDim = block;
    dyn_bytes = shared;
    const unsigned long long B = (unsigned long long)grid.x * grid.y * grid.z;
    for (unsigned long long k = 0; k < B; k++) {
        const unsigned long long b = nth(k, B, mode);
        blockIdx = {(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
                    (unsigned)(b / ((unsigned long long)grid.x * grid.y))};
        memset(dyn, 0xff, shared); /* NaN doubles and floats until written */
        block_serial++;
        if (direct) {
            for (unsigned long long j = 0; j < T; j++) {
                threadIdx = coords(nth(j, T, mode), block);
                body(ctx);
            }
        } else {
            run_block_fibers(block, mode);
        }
    }
    if (s && !direct && !waited) s->barrier_free = 1;
    direct = 0;
}

void tsemu_set_error(cudaError_t e) { last = e; }

#ifdef TS_CUDA_EMU_FULL
/* the whole library against the emulator (cuda_emu_runtime.cc keeps the
 * table of device memory): each side of a copy must be what its kind says,
 * a device range inside one allocation */
extern "C" int tsemu_device_range(const void *p, size_t n);
namespace {
cudaError_t side(const void *p, size_t n, int device, const char *what, const char *call)
{
    const int r = tsemu_device_range(p, n);
    if (r == (device ? 1 : 0)) return cudaSuccess;
    fprintf(stderr, "cuda_emu: %s: the %s %p (%zu bytes) %s\n", call, what, p, n,
            r < 0 ? "runs past the end of its device allocation" : device ? "is not device memory" : "is device memory");
    last = r < 0 ? cudaErrorInvalidValue : cudaErrorInvalidDevicePointer;
    return last;
}
cudaError_t sides(const void *dst, size_t dn, const void *src, size_t sn, cudaMemcpyKind k, const char *call)
{
    if (k == cudaMemcpyHostToHost) return cudaSuccess;
    cudaError_t e = side(dst, dn, k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice, "destination", call);
    if (e == cudaSuccess)
        e = side(src, sn, k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice, "source", call);
    return e;
}
} // namespace
#endif

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t)
{
    if (n && !p) return cudaErrorInvalidValue;
#ifdef TS_CUDA_EMU_FULL
    if (n && side(p, n, 1, "destination", "cudaMemset") != cudaSuccess) return last;
#endif
    memset(p, v, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t)
{
    (void)k;
    if (n && (!dst || !src)) return cudaErrorInvalidValue;
#ifdef TS_CUDA_EMU_FULL
    if (n && sides(dst, n, src, n, k, "cudaMemcpy") != cudaSuccess) return last;
#endif
    memmove(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind k, cudaStream_t)
{
    (void)k;
    if (height && (!dst || !src || width > dpitch || width > spitch)) return cudaErrorInvalidValue;
#ifdef TS_CUDA_EMU_FULL
    if (height && width &&
        sides(dst, (height - 1) * dpitch + width, src, (height - 1) * spitch + width, k, "cudaMemcpy2D") != cudaSuccess)
        return last;
#endif
    for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaGetLastError(void)
{
    const cudaError_t e = last;
    last = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (the CUDA emulator: TSEMU_DEVICES=0)";
    }
    return "unknown error";
}

/* ---- cuBLAS's GEMM: C (fp32, column-major) = alpha op(A) op(B) + beta C ---- */
namespace {
unsigned long long gemms;
double operand(const void *p, cudaDataType_t t, size_t i)
{
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    return t == CUDA_R_16BF ? ts_bf16_to_f32(h) : ts_f16_to_f32(h);
}
} // namespace

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t comp, cublasGemmAlgo_t)
{
    /* cuBLAS's rules: sizes >= 0, lda >= rows of A as stored (m, or k when transposed), ldb likewise (k, or
     * n), ldc >= m; fp32 results; operands of one type */
    const int ra = ta == CUBLAS_OP_N ? m : k, rb = tb == CUBLAS_OP_N ? k : n;
    if (!h || m < 0 || n < 0 || k < 0 || lda < (ra > 1 ? ra : 1) || ldb < (rb > 1 ? rb : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (ct != CUDA_R_32F || at != bt || (comp != CUBLAS_COMPUTE_32F && comp != CUBLAS_COMPUTE_32F_FAST_TF32))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    gemms++;
    const double al = *(const float *)alpha, be = *(const float *)beta;
    float *c = (float *)C;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int l = 0; l < k; l++)
                s += operand(A, at, ta == CUBLAS_OP_N ? i + (size_t)l * lda : l + (size_t)i * lda) *
                     operand(B, bt, tb == CUBLAS_OP_N ? l + (size_t)j * ldb : j + (size_t)l * ldb);
            float *o = &c[i + (size_t)j * ldc];
            *o = (float)(al * s + (be != 0 ? be * *o : 0.0));
        }
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS          ? "CUBLAS_STATUS_SUCCESS"
           : s == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE"
                                               : "CUBLAS_STATUS_NOT_SUPPORTED";
}

unsigned long long tsemu_gemms(void) { return gemms; }

/* ---- for tests/nn/test_cuda_emu.c ---- */

unsigned long long tsemu_launches(void) { return launches; }
unsigned long long tsemu_barrier_rounds(void) { return barrier_rounds; }

namespace {
/* a block's sum of 0 .. T-1 in shared memory, the tree with or without its barriers */
__global__ void tree_k(int barriers, unsigned *out)
{
    static unsigned part[256]; /* __shared__, as cuda_emu.py rewrites it */
    emu_shared_poison(part, sizeof part);
    part[threadIdx.x] = threadIdx.x;
    if (barriers) __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        if (barriers) __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}
} // namespace

/* The emulator's own checks: the tree sum right with its barriers in every
 * order, wrong without them in at least one of three launches, and
 * launches beyond a GPU's limits refused. 1 when all hold, else 0 with why. */
int tsemu_selftest(char *why, size_t len)
{
    const unsigned want = 4 * (255 * 256 / 2);
    int wrong = 0;
    for (int rep = 0; rep < 3; rep++) {
        unsigned out = 0;
        emu_launch(dim3(4), dim3(256), 0, nullptr, [&] { tree_k(1, &out); });
        if (out != want) {
            snprintf(why, len, "the tree sum with barriers gave %u, not %u", out, want);
            return 0;
        }
        out = 0;
        emu_launch(dim3(4), dim3(256), 0, nullptr, [&] { tree_k(0, &out); });
        wrong += out != want;
    }
    if (!wrong) {
        snprintf(why, len, "the tree sum without barriers was right in all three orders");
        return 0;
    }
    emu_launch(dim3(1), dim3(1025), 0, nullptr, [] {});
    const cudaError_t a = cudaGetLastError();
    emu_launch(dim3(1, 65536), dim3(32), 0, nullptr, [] {});
    const cudaError_t b = cudaGetLastError();
    emu_launch(dim3(1), dim3(32), (48 << 10) + 8, nullptr, [] {});
    const cudaError_t c = cudaGetLastError();
    if (a != cudaErrorInvalidConfiguration || b != cudaErrorInvalidConfiguration || c != cudaErrorInvalidValue) {
        snprintf(why, len, "oversized launches not refused (%d %d %d)", (int)a, (int)b, (int)c);
        return 0;
    }
    snprintf(why, len, "tree sums right with barriers, wrong without in %d of 3 orders; oversized launches refused",
             wrong);
    return 1;
}
