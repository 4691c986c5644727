// The norms' per-channel arithmetic on the device (TESSERA_CUDA_NORMSTATS=device,
// layers_cuda.c): batch, group and instance norm forward and backward as one
// chain of kernels on the stream, without the host round trips of the
// default path (about six synchronisations a norm call there: sums down,
// scale and shift up, gamma, beta and the running statistics down and up).
// Only for a norm whose statistics no other rank shares (ts_norm_opts.sync
// NULL); shared ones keep the host path, which calls MPI. The arithmetic is
// the host path's (layers_cuda.c), in the same types (the group norms'
// shift rounds once differently: beta - mean (gamma inv)): two-pass moments in
// double (sums around the float-rounded group mean), statistics per (sample,
// group), batch norm as N = 1, G = C. Launchers declared in cuda_nn.h.
// Written on 2026-12-06 without a GPU: tests/nn/test_cuda_emu runs the chains
// under the CUDA emulator against the CPU layers; opt-in until
// tests/nn/test_layers_cuda has passed on a GPU (docs/gpu.md).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define TS_ERROR_NO_MPI 1
extern "C" {
#include "src/core/error.h"
#include "src/nn/cuda/cuda_nn.h"
}
#include "src/core/cuda_launch.h"

static unsigned blocks(size_t n) { return (unsigned)((n + 255) / 256 < 1 ? 1 : (n + 255) / 256); }

// ctr[n][c] = the float-rounded mean of the sums s1 of c's group: sum over the group's channels / count
__global__ void norm_centre_k(const double *s1, int N, int C, int G, double count, float *ctr)
{
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    const int cg = C / G, c0 = (int)(i % C) / cg * cg;
    const size_t row = i / C * C;
    double t = 0;
    for (int c = c0; c < c0 + cg; c++) t += s1[row + c];
    ctr[i] = (float)(t / count);
}

// per (n, g): the moments around ctr (s1, s2) give mean and variance; the saved statistics, scale and shift per
// (n, c) of the group, and (batch norm, rmean non-NULL) the running statistics with the unbiased variance.
// s1 NULL: eval batch norm, mean and variance from the running statistics.
__global__ void norm_finish_k(const double *s1, const double *s2, const float *ctr, int N, int C, int G, double count,
                              float eps, float momentum, const float *gamma, const float *beta, float *rmean,
                              float *rvar, float *save_mean, float *save_invstd, float *scsh)
{
    const size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (j >= (size_t)N * G) return;
    const int cg = C / G, g0 = (int)(j % G) * cg;
    const size_t row = j / G * C, nc = (size_t)N * C;
    float mean, inv;
    if (s1) {
        double t1 = 0, t2 = 0;
        for (int c = g0; c < g0 + cg; c++) {
            t1 += s1[row + c];
            t2 += s2[row + c];
        }
        const double m1 = t1 / count, mu = ctr[row + g0] + m1, var = fmax(t2 / count - m1 * m1, 0.0);
        mean = (float)mu;
        inv = (float)(1.0 / sqrt(var + eps));
        if (rmean) {
            rmean[j] = (float)((1.0 - momentum) * rmean[j] + momentum * mu);
            rvar[j] = (float)((1.0 - momentum) * rvar[j] + momentum * var * count / (count - 1));
        }
    } else {
        mean = rmean[j];
        inv = (float)(1.0 / sqrt((double)rvar[j] + eps));
    }
    save_mean[j] = mean;
    save_invstd[j] = inv;
    for (int c = g0; c < g0 + cg; c++) {
        const float sc = gamma[c] * inv;
        scsh[row + c] = sc;
        scsh[nc + row + c] = beta[c] - mean * sc;
    }
}

// ctr[n][c] = mean[n][g of c]
__global__ void norm_expand_k(const float *mean, int N, int C, int G, float *ctr)
{
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < (size_t)N * C) ctr[i] = mean[i / C * G + (int)(i % C) / (C / G)];
}

// Backward from the gradient sums s1 = sum dy', s2 = sum dy' (x - mean) per (n, c), count values per group:
// threads 0 .. C-1: dbeta[c] += s1, dgamma[c] += s2 inv summed over the samples in order (float, as the
// host); threads C .. C + N G - 1: per (n, g) the input gradient's coefficients of the group's channels,
// a = gamma inv, b = -inv^2 B / count, k = -inv A / count (A = sum gamma s1, B = sum gamma s2 inv; b, k 0
// when !train: eval batch norm)
__global__ void norm_coef_k(const double *s1, const double *s2, int N, int C, int G, double count, int train,
                            const float *gamma, const float *inv, float *dgamma, float *dbeta, float *abk)
{
    const size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, nc = (size_t)N * C;
    const int cg = C / G;
    if (t < (size_t)C) {
        const int c = (int)t;
        for (int n = 0; n < N; n++) {
            const size_t i = (size_t)n * C + c;
            if (dgamma) dgamma[c] += (float)(s2[i] * inv[(size_t)n * G + c / cg]);
            if (dbeta) dbeta[c] += (float)s1[i];
        }
        return;
    }
    const size_t j = t - C;
    if (!abk || j >= (size_t)N * G) return;
    const int g0 = (int)(j % G) * cg;
    const size_t row = j / G * C;
    const double iv = inv[j];
    double A = 0, B = 0;
    for (int c = g0; c < g0 + cg; c++) {
        A += (double)gamma[c] * s1[row + c];
        B += (double)gamma[c] * s2[row + c] * iv;
    }
    for (int c = g0; c < g0 + cg; c++) {
        abk[row + c] = (float)(gamma[c] * iv);
        abk[nc + row + c] = train ? (float)(-iv * iv * B / count) : 0.0f;
        abk[2 * nc + row + c] = train ? (float)(-iv * A / count) : 0.0f;
    }
}

extern "C" size_t ts_cuk_norm_work_bytes(int N, int C)
{
    const size_t nc = (size_t)N * C;
    return 2 * nc * sizeof(double) + 4 * nc * sizeof(float);
}

extern "C" int ts_cuk_norm_forward(const float *x, int N, size_t S, int C, int G, const float *gamma, const float *beta,
                                   float eps, float momentum, int train, int relu, float slope, int tiled,
                                   float *rmean, float *rvar, float *save_mean, float *save_invstd, float *y,
                                   void *work, void *stream)
{
    const size_t nc = (size_t)N * C, ng = (size_t)N * G;
    double *s1 = (double *)work, *s2 = s1 + nc;
    float *ctr = (float *)(s2 + nc), *scsh = ctr + nc;
    cudaStream_t st = (cudaStream_t)stream;
    if (N < 1 || C < 1 || G < 1 || C % G || S < 1) return ts_err(TS_ERR_ARG, __FILE__, __LINE__, "norm on the GPU: N %d, S %zu, C %d, %d groups", N, S, C, G);
    if (train) {
        const double count = (double)S * (C / G);
        int (*sums)(int, const float *, const float *, const float *, float, const float *, int, size_t, int,
                    double *, double *, void *) = tiled ? ts_cuk_chan_sums_tiled : ts_cuk_chan_sums;
        int err = sums(0, x, NULL, NULL, 0.0f, NULL, N, S, C, s1, s2, stream);
        if (err) return err;
        norm_centre_k<<<blocks(nc), 256, 0, st>>>(s1, N, C, G, count, ctr);
        if ((err = TS_CU_LAUNCHED("norm centres"))) return err;
        if ((err = sums(0, x, NULL, NULL, 0.0f, ctr, N, S, C, s1, s2, stream))) return err;
        norm_finish_k<<<blocks(ng), 256, 0, st>>>(s1, s2, ctr, N, C, G, count, eps, momentum, gamma, beta, rmean, rvar,
                                                  save_mean, save_invstd, scsh);
    } else {
        if (!rmean || !rvar || N != 1 || G != C)
            return ts_err(TS_ERR_ARG, __FILE__, __LINE__, "norm on the GPU: eval mode is batch norm's, with running statistics");
        norm_finish_k<<<blocks(ng), 256, 0, st>>>(NULL, NULL, NULL, N, C, G, 1.0, eps, momentum, gamma, beta, rmean,
                                                  rvar, save_mean, save_invstd, scsh);
    }
    int err = TS_CU_LAUNCHED("norm statistics");
    if (err) return err;
    return (tiled ? ts_cuk_chan_affine_tiled : ts_cuk_chan_affine)(x, scsh, scsh + nc, N, S, C, relu, slope, y, stream);
}

extern "C" int ts_cuk_norm_backward(const float *x, const float *dy, const float *mask, float slope, int N, size_t S,
                                    int C, int G, const float *gamma, const float *save_mean, const float *save_invstd,
                                    int train, int tiled, float *dgamma, float *dbeta, float *dx, void *work,
                                    void *stream)
{
    const size_t nc = (size_t)N * C, ng = (size_t)N * G;
    double *s1 = (double *)work, *s2 = s1 + nc;
    float *ctr = (float *)(s2 + nc), *abk = ctr + nc;
    cudaStream_t st = (cudaStream_t)stream;
    if (N < 1 || C < 1 || G < 1 || C % G || S < 1) return ts_err(TS_ERR_ARG, __FILE__, __LINE__, "norm backward on the GPU: N %d, S %zu, C %d, %d groups", N, S, C, G);
    norm_expand_k<<<blocks(nc), 256, 0, st>>>(save_mean, N, C, G, ctr);
    int err = TS_CU_LAUNCHED("norm backward centres");
    if (err) return err;
    if ((err = (tiled ? ts_cuk_chan_sums_tiled : ts_cuk_chan_sums)(1, x, dy, mask, slope, ctr, N, S, C, s1, s2, stream)))
        return err;
    norm_coef_k<<<blocks((size_t)C + ng), 256, 0, st>>>(s1, s2, N, C, G, (double)S * (C / G), train, gamma, save_invstd,
                                                        dgamma, dbeta, dx ? abk : NULL);
    if ((err = TS_CU_LAUNCHED("norm backward coefficients")) || !dx) return err;
    return (tiled ? ts_cuk_norm_dx_tiled : ts_cuk_norm_dx)(x, dy, mask, slope, ctr, abk, abk + nc, abk + 2 * nc, N, S,
                                                           C, dx, stream);
}
