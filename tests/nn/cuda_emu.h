/* A CUDA emulator for the kernels of src/nn/cuda/nn_kernels.cu on the CPU
 * (C++): the built-ins, types and runtime calls those kernels use, and
 * emu_launch, which runs a launch's blocks one after another and each
 * block's threads as fibers that switch at __syncthreads (tests/nn/
 * cuda_emu.cc). tests/nn/cuda_emu.py rewrites the .cu into plain C++
 * against this header; tests/nn/test_cuda_emu.c checks every launcher.
 * It checks the launch configuration as a GPU does, runs threads and blocks
 * in orders that change from launch to launch (so a missing barrier shows),
 * and poisons dynamic shared memory with NaNs; it knows nothing of warps,
 * memory coalescing or speed. */
#ifndef TS_TESTS_NN_CUDA_EMU_H
#define TS_TESTS_NN_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "src/core/dtype.h" /* the round-to-nearest-even conversions */

/* internal linkage: a CUDA build's libtessera holds the real kernels' host stubs under the same names */
#define __global__ static
#define __device__ static
#define __host__

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct float4 {
    float x, y, z, w;
};

/* the running thread's coordinates: set by the scheduler before each switch */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

/* 16-bit floats stored as CUDA stores them; conversions round to nearest even */
struct __nv_bfloat16 {
    uint16_t bits;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : bits(ts_f32_to_bf16(f)) {}
    operator float() const { return ts_bf16_to_f32(bits); }
};
struct __half {
    uint16_t bits;
    __half() = default;
    __half(float f) : bits(ts_f32_to_f16(f)) {}
    operator float() const { return ts_f16_to_f32(bits); }
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
static inline __half __float2half(float f) { return __half(f); }
static inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }
static inline __half __float2half_rn(float f) { return __half(f); }
static inline float __half2float(__half h) { return (float)h; }
/* products and sums rounded one at a time, never contracted into an FMA with
 * what surrounds them (a call the compiler does not inline: its result is
 * rounded to float before any later operation) */
__attribute__((noinline, unused)) static float __fmul_rn(float a, float b) { return a * b; }
__attribute__((noinline, unused)) static float __fadd_rn(float a, float b) { return a + b; }

/* atomics: one OS thread runs every fiber, so a plain update is atomic */
template <typename T> static inline T atomicAdd(T *p, T v)
{
    const T old = *p;
    *p = old + v;
    return old;
}
template <typename T> static inline T atomicMin(T *p, T v)
{
    const T old = *p;
    if (v < old) *p = v;
    return old;
}

/* waits for every thread of the block (switches fibers) */
void __syncthreads(void);
/* the block's dynamic shared memory (the launch's third argument), NaN bytes at the block's start */
void *emu_dynamic_shared(void);
/* a static __shared__ array (cuda_emu.py makes it a static local and calls
 * this after its declaration): filled with 0xff bytes (NaN) once per block,
 * by the first thread that reaches it, so nothing of the last block is read */
void emu_shared_poison(void *p, size_t bytes);

#include "tests/nn/cuda_emu_rt.h" /* the runtime calls the launchers make */

/* Runs body(ctx) once per thread (emu_launch: f() on the stream, which is
 * ignored) of grid x block; an invalid configuration
 * (a GPU's limits: at most 1024 threads a block, 1024 x 1024 x 64 a
 * dimension, grid y and z at most 65535, 48 KiB of dynamic shared memory,
 * no zero sizes) runs nothing and is returned by the next cudaGetLastError.
 * site names the launch for the scheduler (fibers until a launch from it
 * has shown it never waits at a barrier). */
void emu_launch_fn(dim3 grid, dim3 block, size_t shared, void (*body)(void *), void *ctx, const void *site);

template <typename F> static inline void emu_launch(dim3 grid, dim3 block, size_t shared, cudaStream_t, F f)
{
    void (*body)(void *) = [](void *c) { (*(F *)c)(); };
    emu_launch_fn(grid, block, shared, body, &f, (const void *)body);
}

#endif
