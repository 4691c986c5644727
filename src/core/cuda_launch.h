/* What the launchers of every .cu file share (src/nn/cuda, src/optim/cuda):
 * the grid for n elements in blocks of 256 threads (at most 65535 blocks:
 * the kernels' grid-stride loops go round beyond) and the check after a
 * launch, which turns a launch error into TS_ERR_CUDA naming the launch.
 * Included by .cu files only, after <cuda_runtime.h> and
 * src/core/error.h (CUDA builds, and the CPU's CUDA emulator). */
#ifndef TS_CORE_CUDA_LAUNCH_H
#define TS_CORE_CUDA_LAUNCH_H

#include <stddef.h>

static inline unsigned ts_cu_grid(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

static inline int ts_cu_launched_at(const char *what, const char *file, int line)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return ts_err(TS_ERR_CUDA, file, line, "%s: %s", what, cudaGetErrorString(e));
    return 0;
}
/* 0, or TS_ERR_CUDA naming what and the launching line */
#define TS_CU_LAUNCHED(what) ts_cu_launched_at((what), __FILE__, __LINE__)

#endif
