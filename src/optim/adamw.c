/* AdamW as torch.optim.AdamW: p *= 1 - lr wd; m = b1 m + (1-b1) g;
 * v = b2 v + (1-b2) g^2; p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps).
 * Owns the update of one float range; m and v are the arena's state regions,
 * handed in. No allocation, no MPI. */
#pragma GCC optimize("O3")
#pragma GCC optimize("fp-contract=off") /* no FMA: the GPU's kernels (src/optim/cuda) give the same bits */
#ifdef __clang__
#pragma clang fp contract(off) /* clang ignores the GCC pragma; a clang build failed test_cuda_emu */
#endif
#include "tsbuild.h"
#include "src/optim/optim.h"

#include <math.h>

void ts_adamw_update(float *p, const float *g, float *m, float *v, size_t n, double lr, double b1, double b2,
                     double eps, double wd, int64_t t)
{
    const double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
    const float step = (float)(lr / bc1), rbc2 = (float)(1.0 / sqrt(bc2)), decay = (float)(1.0 - lr * wd);
    const float fb1 = (float)b1, fb2 = (float)b2, feps = (float)eps;
#pragma omp parallel for schedule(dynamic, 16384)
    for (size_t i = 0; i < n; i++) {
        const float gi = g[i];
        p[i] *= decay;
        m[i] = fb1 * m[i] + (1.0f - fb1) * gi;
        v[i] = fb2 * v[i] + (1.0f - fb2) * gi * gi;
        p[i] -= step * m[i] / (sqrtf(v[i]) * rbc2 + feps);
    }
}
