/* Whole-model benchmark of the conv precision (not a test; `make
 * tests/nn/bench_step_prec`): the UNet3D of configs/unet3d-small.ini
 * (16-32-64-128, 1 input channel, 4 classes, batch norm, cross-entropy) on
 * random D^3 patches, batch N: forward, loss and backward (no optimizer
 * step: the weights stay fixed), alternating fp32 and bf16
 * (ts_unet_set_precision) step by step after one warm-up step of each.
 * Prints the median step time of each, their ratio (by wall and by process
 * CPU time), the per-layer-kind profile (ts_unet_profile) and the losses.
 * usage: bench_step_prec [D [N [STEPS]]] (64 2 5) */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/core/timer.h"
#include "src/model/unet.h"
#include "src/nn/layers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

int main(int argc, char **argv)
{
    const int D = argc > 1 ? atoi(argv[1]) : 64, N = argc > 2 ? atoi(argv[2]) : 2, steps = argc > 3 ? atoi(argv[3]) : 5;
    if (D < 8 || D % 8 || N < 1 || steps < 1) {
        fprintf(stderr, "usage: bench_step_prec [D (multiple of 8) [N [STEPS]]]\n");
        return 2;
    }
    ts_unet_cfg c;
    memset(&c, 0, sizeof c);
    c.levels = 4;
    for (int l = 0; l < 4; l++) c.channels[l] = 16 << l;
    c.in_channels = 1;
    c.classes = 4;
    c.norm = TS_NORM_BATCH;
    c.eps = 1e-5f;
    c.momentum = 0.1f;
    c.loss = TS_LOSS_CE;
    c.ignore_index = -1;
    c.patch[0] = c.patch[1] = c.patch[2] = D;
    ts_unet *m = NULL;
    ts_tensor img, lab;
    ts_rng r;
    ts_rng_init(&r, 7, 0, 0);
    int rc = ts_unet_create(&c, 0, &m);
    rc = rc ? rc : ts_unet_init(m, 3);
    rc = rc ? rc : ts_tensor_alloc(&img, TS_FLOAT32, 5, (const int64_t[]){N, 1, D, D, D});
    rc = rc ? rc : ts_tensor_alloc(&lab, TS_UINT8, 4, (const int64_t[]){N, D, D, D});
    rc = rc ? rc : ts_unet_setup(m, N, D, D, D);
    if (rc) {
        fprintf(stderr, "setup: %s\n", ts_err_message());
        return 1;
    }
    for (int64_t i = 0; i < ts_tensor_numel(&img); i++) ((float *)img.data)[i] = (float)ts_rng_normal(&r);
    for (int64_t i = 0; i < ts_tensor_numel(&lab); i++) ((uint8_t *)lab.data)[i] = (uint8_t)ts_rng_below(&r, 4);
    double *t = calloc((size_t)4 * steps, sizeof(double)), prof[2][TS_PROF_COUNT] = {{0}}, loss[2] = {0, 0};
    if (!t) return 1;
    for (int s = -1; s < steps && !rc; s++)
        for (int p = 0; p < 2 && !rc; p++) {
            ts_unet_set_precision(m, p ? TS_PREC_BF16 : TS_PREC_FP32);
            ts_arena_zero_grad(ts_unet_arena(m));
            ts_unet_profile_reset(m);
            const double t0 = ts_time_now(), c0 = cpu_now();
            rc = rc ? rc : ts_unet_forward(m, &img, 1);
            rc = rc ? rc : ts_unet_loss(m, &lab, 1, &loss[p]);
            rc = rc ? rc : ts_unet_backward(m);
            if (s < 0) continue; /* warm-up */
            t[(2 * p) * steps + s] = ts_time_now() - t0;
            t[(2 * p + 1) * steps + s] = cpu_now() - c0;
            const double *pr = ts_unet_profile(m);
            for (int k = 0; k < TS_PROF_COUNT; k++) prof[p][k] += pr[k] / steps;
        }
    ts_nn_set_conv_precision(TS_PREC_FP32);
    if (rc) {
        fprintf(stderr, "step: %s\n", ts_err_message());
        return 1;
    }
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    double med[4];
    for (int i = 0; i < 4; i++) med[i] = median(t + i * steps, steps);
    printf("UNet3D 16-32-64-128, [%d, %d^3], forward+loss+backward, %d thread%s, median of %d (bf16 kernels: %s)\n", N, D, nt,
           nt > 1 ? "s" : "", steps, ts_nn_bf16_isa());
    for (int p = 0; p < 2; p++) {
        printf("  %s  step %7.1f ms  %.3f samples/s  CPU %7.1f ms  loss %.6f\n   ", p ? "bf16" : "fp32", med[2 * p] * 1e3,
               N / med[2 * p], med[2 * p + 1] * 1e3, loss[p]);
        for (int k = 0; k < TS_PROF_COUNT; k++) printf(" %s %.1f", ts_unet_prof_name(k), prof[p][k] * 1e3);
        printf(" (ms, mean)\n");
    }
    printf("  ratio fp32/bf16: %.2f by wall time, %.2f by CPU time; convolutions (conv fwd, wgrad, dgrad, convt): %.2f\n",
           med[0] / med[2], med[1] / med[3],
           (prof[0][0] + prof[0][1] + prof[0][2] + prof[0][3]) / (prof[1][0] + prof[1][1] + prof[1][2] + prof[1][3]));
    free(t);
    ts_tensor_free(&img);
    ts_tensor_free(&lab);
    ts_unet_destroy(&m);
    return 0;
}
