/* SGD as torch.optim.SGD (dampening 0): d = g + wd p; buf = momentum buf + d
 * (buf starts at 0, so the first step sets buf = d as PyTorch does);
 * Nesterov: d += momentum buf, else d = buf; p -= lr d. Owns the update of
 * one float range; buf is the arena's state region. No allocation, no MPI. */
#pragma GCC optimize("O3")
#pragma GCC optimize("fp-contract=off") /* no FMA: the GPU's kernels (src/optim/cuda) give the same bits */
#ifdef __clang__
#pragma clang fp contract(off) /* clang ignores the GCC pragma; a clang build failed test_cuda_emu */
#endif
#include "tsbuild.h"
#include "src/optim/optim.h"

void ts_sgd_update(float *p, const float *g, float *buf, size_t n, double lr, double momentum, double wd, int nesterov)
{
    const float flr = (float)lr, fm = (float)momentum, fwd = (float)wd;
#pragma omp parallel for schedule(dynamic, 16384)
    for (size_t i = 0; i < n; i++) {
        float d = g[i] + fwd * p[i];
        if (buf) {
            buf[i] = fm * buf[i] + d;
            d = nesterov ? d + fm * buf[i] : buf[i];
        }
        p[i] -= flr * d;
    }
}
