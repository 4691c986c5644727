/* The optimizer's device kernels (internal to src/optim): SGD and AdamW
 * over flat float ranges of the arena's device regions, the gradient
 * scaling (micro-batch average, loss scale, clipping) and the sum of
 * squares of a range, all queued on the given stream (a cudaStream_t).
 * The update rules are sgd.c's and adamw.c's, element by element in the
 * same float expressions, each product and sum rounded on its own on both
 * sides (no FMA): the same bits as the CPU's.
 * Launchers only, in optim_kernels.cu; compiled in CUDA builds
 * (TS_HAVE_CUDA). Each returns TS_ERR_CUDA when the launch fails; errors
 * inside a kernel surface at the next synchronisation. */
#ifndef TS_OPTIM_CUDA_OPTIM_CUDA_H
#define TS_OPTIM_CUDA_OPTIM_CUDA_H

#include <stddef.h>

/* partial sums ts_cuo_sumsq writes (one per block, a fixed launch) */
#define TS_CUO_SUMSQ_PARTS 256

/* p, g, buf (NULL: no momentum) device arrays of n floats: ts_sgd_update */
int ts_cuo_sgd(float *p, const float *g, float *buf, size_t n, float lr, float momentum, float wd, int nesterov,
               void *stream);
/* ts_adamw_update with its per-step constants computed by the caller:
 * step = lr / (1 - b1^t), rbc2 = 1 / sqrt(1 - b2^t), decay = 1 - lr wd */
int ts_cuo_adamw(float *p, const float *g, float *m, float *v, size_t n, float step, float rbc2, float decay, float b1,
                 float b2, float eps, void *stream);
/* g[i] *= f */
int ts_cuo_scale(float *g, size_t n, float f, void *stream);
/* part[b] (device, TS_CUO_SUMSQ_PARTS doubles) = sum of g[i]^2 in double
 * over the elements block b visits; the same n always sums in the same
 * order (the caller adds the parts in index order) */
int ts_cuo_sumsq(const float *g, size_t n, double *part, void *stream);

#endif
