/* Convolution kernel benchmark (not a test; `make tests/nn/bench_conv`):
 * times tessera's 3x3x3 pad-1 conv3d forward, weight gradient and input
 * gradient on channels-last [2, D, D, D, C] data, and the textbook
 * alternative: im2col per depth plane + OpenBLAS sgemm (forward only),
 * planes spread over the OpenMP threads, OpenBLAS single-threaded inside.
 * Prints GFLOP/s by wall time and by process CPU time (the latter is what
 * to compare on a shared machine). docs/performance-engine.md uses it.
 * The split rows run the same shapes as one box of a split volume with a
 * halo on all six sides (ts_conv3d_*_split; forward all, and interior then
 * border). The bf16 rows run the same calls with
 * ts_nn_set_conv_precision(TS_PREC_BF16), interleaved with the fp32 ones in
 * every repetition; the ratio lines compare medians.
 * usage: bench_conv D CIN COUT [REPS] [ROWS]
 *   ROWS all (default): the rows above plus bf16; prec: fp32 and bf16
 *   forward, weight grad, input grad; cat: the same over a concatenation
 *   [CIN/2, CIN - CIN/2]; convt: transposed conv 2x2x2 stride 2 from
 *   [2, (D/2)^3, CIN] to [2, D^3, COUT]; ct2: that transposed conv's bf16
 *   backward, the separate drivers against the one-pass kernel. */
#include "tsbuild.h"
#include "src/core/timer.h"
#include "src/nn/layers.h"
#include "src/nn/conv_impl.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

void openblas_set_num_threads(int);

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void fill(ts_tensor *t)
{
    float *p = t->data;
    for (int64_t i = 0; i < ts_tensor_numel(t); i++) p[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
}

/* y = conv(x) by im2col (one depth plane at a time) and sgemm */
static void im2col_forward(const float *x, const float *wm, float *y, int N, int D, int C, int OC, float *cols_all)
{
    const size_t plane = (size_t)D * D, colsz = plane * 27 * C;
#pragma omp parallel for schedule(dynamic, 1)
    for (int nd = 0; nd < N * D; nd++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *cols = cols_all + colsz * tid;
        const int n = nd / D, d = nd % D;
        for (int h = 0; h < D; h++)
            for (int w = 0; w < D; w++) {
                float *c = cols + ((size_t)h * D + w) * 27 * C;
                int t = 0;
                for (int kd = 0; kd < 3; kd++)
                    for (int kh = 0; kh < 3; kh++)
                        for (int kw = 0; kw < 3; kw++, t++) {
                            const int id = d + kd - 1, ih = h + kh - 1, iw = w + kw - 1;
                            if (id < 0 || id >= D || ih < 0 || ih >= D || iw < 0 || iw >= D)
                                memset(c + t * C, 0, sizeof(float) * C);
                            else
                                memcpy(c + t * C, x + ((((size_t)n * D + id) * D + ih) * D + iw) * C, sizeof(float) * C);
                        }
            }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)plane, OC, 27 * C, 1.0f, cols, 27 * C, wm, OC, 0.0f,
                    y + (size_t)nd * plane * OC, OC);
    }
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

/* fp32 against bf16 for one layer: forward, weight gradient, input
 * gradient, each precision in turn within every repetition */
static int bench_prec(int N, int D, int C, int OC, int reps, const char *mode)
{
    const int cat = !strcmp(mode, "cat"), convt = !strcmp(mode, "convt"), ca = C / 2;
    const int Di = convt ? D / 2 : D, k = convt ? 2 : 3, pad = 1;
    ts_tensor x, xb, w, b, y, dx, dxb, dw;
    int rc = ts_tensor_alloc(&x, TS_FLOAT32, 5, (const int64_t[]){N, Di, Di, Di, cat ? ca : C});
    rc |= ts_tensor_alloc(&xb, TS_FLOAT32, 5, (const int64_t[]){N, Di, Di, Di, cat ? C - ca : 1});
    rc |= ts_tensor_alloc(&dx, TS_FLOAT32, 5, x.shape);
    rc |= ts_tensor_alloc(&dxb, TS_FLOAT32, 5, xb.shape);
    rc |= ts_tensor_alloc(&y, TS_FLOAT32, 5, (const int64_t[]){N, D, D, D, OC});
    rc |= ts_tensor_alloc(&w, TS_FLOAT32, 5, convt ? (const int64_t[]){C, OC, k, k, k} : (const int64_t[]){OC, C, k, k, k});
    rc |= ts_tensor_alloc(&dw, TS_FLOAT32, 5, w.shape);
    rc |= ts_tensor_alloc(&b, TS_FLOAT32, 1, (const int64_t[]){OC});
    if (rc) return 1;
    fill(&x);
    fill(&xb);
    fill(&w);
    fill(&y);
    fill(&b);
    enum { K = 3 };
    double *t = malloc(sizeof(double) * 2 * K * reps), *tc = malloc(sizeof(double) * 2 * K * reps);
    if (!t || !tc) return 1;
    for (int r = 0; r < reps; r++)
        for (int pr = 0; pr < 2; pr++) {
            rc |= ts_nn_set_conv_precision(pr ? TS_PREC_BF16 : TS_PREC_FP32);
            for (int kk = 0; kk < K; kk++) {
                const double t0 = ts_time_now(), c0 = cpu_now();
                if (convt) {
                    if (kk == 0) rc |= ts_convt3d_forward(&x, &w, &b, 2, &y);
                    else if (kk == 1) rc |= ts_convt3d_backward(&x, &w, 2, &y, NULL, &dw, NULL);
                    else rc |= ts_convt3d_backward(&x, &w, 2, &y, &dx, NULL, NULL);
                } else if (cat) {
                    if (kk == 0) rc |= ts_conv3d_cat_forward(&x, &xb, &w, &b, 1, 1, &y);
                    else if (kk == 1) rc |= ts_conv3d_cat_backward(&x, &xb, &w, 1, 1, &y, NULL, NULL, &dw, NULL);
                    else rc |= ts_conv3d_cat_backward(&x, &xb, &w, 1, 1, &y, &dx, &dxb, NULL, NULL);
                } else {
                    if (kk == 0) rc |= ts_conv3d_forward(&x, &w, &b, 1, pad, &y);
                    else if (kk == 1) rc |= ts_conv3d_backward(&x, &w, 1, pad, &y, NULL, &dw, NULL);
                    else rc |= ts_conv3d_backward(&x, &w, 1, pad, &y, &dx, NULL, NULL);
                }
                t[(pr * K + kk) * reps + r] = ts_time_now() - t0;
                tc[(pr * K + kk) * reps + r] = cpu_now() - c0;
            }
        }
    rc |= ts_nn_set_conv_precision(TS_PREC_FP32);
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    const double fl = 2.0 * N * D * D * D * (double)C * OC * (convt ? 1 : 27);
    if (convt) printf("convt3d 2x2x2 s2 [2, %d^3, %d] -> [2, %d^3, %d]", Di, C, D, OC);
    else printf("conv3d 3x3x3 [2, %d^3, %s%d] -> %d", D, cat ? "cat " : "", C, OC);
    printf(", %d thread%s, median of %d (bf16 kernels: %s); GFLOP/s by wall time, ratios by wall and by process CPU time:\n",
           nt, nt > 1 ? "s" : "", reps, ts_nn_bf16_isa());
    static const char *const name[K] = {"forward", "weight grad", "input grad"};
    for (int kk = 0; kk < K; kk++) {
        const double m32 = median(t + kk * reps, reps), m16 = median(t + (K + kk) * reps, reps);
        const double c32 = median(tc + kk * reps, reps), c16 = median(tc + (K + kk) * reps, reps);
        printf("  %-12s fp32 %8.2f ms %6.1f GFLOP/s   bf16 %8.2f ms %6.1f GFLOP/s   ratio %.2f (CPU %.2f)\n", name[kk],
               m32 * 1e3, fl / m32 / 1e9, m16 * 1e3, fl / m16 / 1e9, m32 / m16, c32 / c16);
    }
    free(t);
    free(tc);
    ts_tensor *all[] = {&x, &xb, &w, &b, &y, &dx, &dxb, &dw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
    return rc ? 1 : 0;
}

/* fp32 forward with a folded norm + ReLU epilogue: the direct convolution
 * against the Winograd one (ts_conv3d_winograd_forward), the same in bf16
 * (ts_nn_set_conv_precision), and the weight gradients, interleaved in
 * every repetition; GFLOP/s of the direct convolution's count for all */
static int bench_wino(int N, int D, int C, int OC, int reps)
{
    ts_tensor x, w, b, y, sc, sh, dw;
    int rc = ts_tensor_alloc(&x, TS_FLOAT32, 5, (const int64_t[]){N, D, D, D, C});
    rc |= ts_tensor_alloc(&dw, TS_FLOAT32, 5, (const int64_t[]){OC, C, 3, 3, 3});
    rc |= ts_tensor_alloc(&y, TS_FLOAT32, 5, (const int64_t[]){N, D, D, D, OC});
    rc |= ts_tensor_alloc(&w, TS_FLOAT32, 5, (const int64_t[]){OC, C, 3, 3, 3});
    rc |= ts_tensor_alloc(&b, TS_FLOAT32, 1, (const int64_t[]){OC});
    rc |= ts_tensor_alloc(&sc, TS_FLOAT32, 1, (const int64_t[]){OC});
    rc |= ts_tensor_alloc(&sh, TS_FLOAT32, 1, (const int64_t[]){OC});
    if (rc) return 1;
    fill(&x);
    fill(&w);
    fill(&b);
    fill(&sc);
    fill(&sh);
    const ts_conv_ep ep = {sc.data, sh.data, TS_EP_RELU, 0, NULL};
    const ts_conv_split sp = {NULL, TS_CONV_ALL, NULL, NULL, &ep};
    double t[9][64];
    if (reps > 64) reps = 64;
    fill(&y);
    for (int r = 0; r < reps; r++)
        for (int kk = 0; kk < 9; kk++) {
            const int k = kk == 0 ? 0 : kk == 1 ? 8 : kk - 1; /* the layer (8) right after the direct forward (0) */
            const double t0 = ts_time_now();
            if (k == 8) { /* the layer with the switch on: what conv3d.c picks (few output channels: winograd_narrow.c) */
                ts_nn_set_winograd(1);
                rc |= ts_conv3d_forward_split(&x, &w, &b, &sp, &y);
                ts_nn_set_winograd(0);
            } else if (k < 2 || k == 4 || k == 5) {
                ts_nn_set_conv_precision(k >= 4 ? TS_PREC_BF16 : TS_PREC_FP32);
                rc |= k % 2 ? ts_conv3d_winograd_forward(&x, NULL, &w, &b, &ep, &y) : ts_conv3d_forward_split(&x, &w, &b, &sp, &y);
                ts_nn_set_conv_precision(TS_PREC_FP32);
            } else { /* the weight gradient (over y as the output gradient), the switch off then on; fp32, bf16 */
                ts_nn_set_conv_precision(k >= 6 ? TS_PREC_BF16 : TS_PREC_FP32);
                ts_nn_set_winograd(k % 2);
                rc |= ts_conv3d_backward(&x, &w, 1, 1, &y, NULL, &dw, NULL);
                ts_nn_set_winograd(0);
                ts_nn_set_conv_precision(TS_PREC_FP32);
            }
            t[k][r] = ts_time_now() - t0;
        }
    const double fl = 2.0 * N * D * D * D * (double)C * OC * 27, md = median(t[0], reps), mw = median(t[1], reps);
    const double gd = median(t[2], reps), gw = median(t[3], reps), bd = median(t[4], reps), bw = median(t[5], reps);
    const double bgd = median(t[6], reps), bgw = median(t[7], reps), ml = median(t[8], reps);
    printf("conv3d 3x3x3 [%d, %d^3, %d] -> %d forward + folded norm + ReLU, fp32, median of %d:\n", N, D, C, OC, reps);
    printf("  direct   %8.2f ms  %7.1f GFLOP/s\n  winograd %8.2f ms  %7.1f GFLOP/s (direct-equivalent)   ratio %.2f\n",
           md * 1e3, fl / md / 1e9, mw * 1e3, fl / mw / 1e9, md / mw);
    printf("  layer, switch on %8.2f ms  %7.1f GFLOP/s (direct-equivalent)   ratio %.2f (conv3d.c's choice: at most 8 "
           "outputs from 16+ inputs in winograd_narrow.c)\n",
           ml * 1e3, fl / ml / 1e9, md / ml);
    printf("  weight gradient: direct %8.2f ms  %7.1f GFLOP/s, winograd %8.2f ms  %7.1f GFLOP/s   ratio %.2f\n", gd * 1e3,
           fl / gd / 1e9, gw * 1e3, fl / gw / 1e9, gd / gw);
    printf("  bf16 forward:    direct %8.2f ms  %7.1f GFLOP/s, winograd %8.2f ms  %7.1f GFLOP/s   ratio %.2f\n", bd * 1e3,
           fl / bd / 1e9, bw * 1e3, fl / bw / 1e9, bd / bw);
    printf("  bf16 weight gradient: direct %8.2f ms  %7.1f GFLOP/s, winograd %8.2f ms  %7.1f GFLOP/s   ratio %.2f\n",
           bgd * 1e3, fl / bgd / 1e9, bgw * 1e3, fl / bgw / 1e9, bgd / bgw);
    ts_tensor_free(&x);
    ts_tensor_free(&y);
    ts_tensor_free(&w);
    ts_tensor_free(&b);
    ts_tensor_free(&sc);
    ts_tensor_free(&sh);
    ts_tensor_free(&dw);
    return rc ? 1 : 0;
}

/* 1x1x1 convolutions (the segmentation heads): the pointwise kernels
 * against the gather / wgrad drivers (ts_nn_set_pointwise), fp32 and bf16,
 * alternated in every repetition; GB/s of the tensors each pass must move */
static int bench_pw(int N, int D, int C, int OC, int reps)
{
    ts_tensor x, w, b, y, dx, dw;
    int rc = ts_tensor_alloc(&x, TS_FLOAT32, 5, (const int64_t[]){N, D, D, D, C});
    rc |= ts_tensor_alloc(&dx, TS_FLOAT32, 5, x.shape);
    rc |= ts_tensor_alloc(&y, TS_FLOAT32, 5, (const int64_t[]){N, D, D, D, OC});
    rc |= ts_tensor_alloc(&w, TS_FLOAT32, 5, (const int64_t[]){OC, C, 1, 1, 1});
    rc |= ts_tensor_alloc(&dw, TS_FLOAT32, 5, w.shape);
    rc |= ts_tensor_alloc(&b, TS_FLOAT32, 1, (const int64_t[]){OC});
    if (rc) return 1;
    fill(&x);
    fill(&w);
    fill(&y);
    fill(&b);
    enum { K = 3 };
    if (reps > 64) reps = 64;
    double t[4][K][64];
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < 4; v++) { /* bf16 or not x pointwise or not */
            rc |= ts_nn_set_conv_precision(v & 2 ? TS_PREC_BF16 : TS_PREC_FP32);
            ts_nn_set_pointwise(v & 1);
            for (int kk = 0; kk < K; kk++) {
                const double t0 = ts_time_now();
                if (kk == 0) rc |= ts_conv3d_forward(&x, &w, &b, 1, 0, &y);
                else if (kk == 1) rc |= ts_conv3d_backward(&x, &w, 1, 0, &y, NULL, &dw, NULL);
                else rc |= ts_conv3d_backward(&x, &w, 1, 0, &y, &dx, NULL, NULL);
                t[v][kk][r] = ts_time_now() - t0;
            }
        }
    ts_nn_set_pointwise(1);
    rc |= ts_nn_set_conv_precision(TS_PREC_FP32);
    const double vox = (double)N * D * D * D, mb = vox * (C + OC) * 4 / 1e6;
    printf("conv3d 1x1x1 [%d, %d^3, %d] -> %d, median of %d, ms (GB/s of the %.1f MB each pass moves): gather/wgrad drivers "
           "against the pointwise kernels\n", N, D, C, OC, reps, mb);
    static const char *const name[K] = {"forward", "weight grad", "input grad"};
    for (int kk = 0; kk < K; kk++) {
        printf("  %-12s", name[kk]);
        for (int p = 0; p < 2; p++) {
            const double g = median(t[2 * p][kk], reps), q = median(t[2 * p + 1][kk], reps);
            printf("  %s %6.2f (%5.1f) -> %6.2f (%5.1f) %.2fx", p ? "bf16" : "fp32", g * 1e3, mb / g / 1e3, q * 1e3,
                   mb / q / 1e3, g / q);
        }
        printf("\n");
    }
    ts_tensor *all[] = {&x, &w, &b, &y, &dx, &dw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
    return rc ? 1 : 0;
}

/* The bf16 backward of a k = s = 2 transposed convolution from [N, (D/2)^3,
 * C] to [N, D^3, OC] (the U-Net's up-convolutions): the separate gather and
 * weight-gradient drivers against the one-pass kernel
 * (ts_nn_set_convt_fused), alternated in every repetition; dx, dw and db as
 * in a training step */
static int bench_ct2(int N, int D, int C, int OC, int reps)
{
    const int Di = D / 2;
    ts_tensor x, w, dy, dx, dw, db;
    int rc = ts_tensor_alloc(&x, TS_FLOAT32, 5, (const int64_t[]){N, Di, Di, Di, C});
    rc |= ts_tensor_alloc(&dx, TS_FLOAT32, 5, x.shape);
    rc |= ts_tensor_alloc(&dy, TS_FLOAT32, 5, (const int64_t[]){N, D, D, D, OC});
    rc |= ts_tensor_alloc(&w, TS_FLOAT32, 5, (const int64_t[]){C, OC, 2, 2, 2});
    rc |= ts_tensor_alloc(&dw, TS_FLOAT32, 5, w.shape);
    rc |= ts_tensor_alloc(&db, TS_FLOAT32, 1, (const int64_t[]){OC});
    if (rc) return 1;
    fill(&x);
    fill(&w);
    fill(&dy);
    if (reps > 64) reps = 64;
    double t[2][64];
    rc |= ts_nn_set_conv_precision(TS_PREC_BF16);
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < 2; v++) {
            ts_nn_set_convt_fused(v);
            const double t0 = ts_time_now();
            rc |= ts_convt3d_backward(&x, &w, 2, &dy, &dx, &dw, &db);
            t[v][r] = ts_time_now() - t0;
        }
    ts_nn_set_convt_fused(1);
    rc |= ts_nn_set_conv_precision(TS_PREC_FP32);
    const double a = median(t[0], reps), b = median(t[1], reps), mb = (double)N * D * D * D * OC * 4 / 1e6;
    printf("convt3d 2x2x2 s2 bf16 backward (dx, dw, db) [%d, %d^3, %d] -> [%d, %d^3, %d] (dy %.1f MB), median of %d: "
           "separate drivers %.2f ms -> one pass %.2f ms, %.2fx\n", N, Di, C, N, D, OC, mb, reps, a * 1e3, b * 1e3, a / b);
    ts_tensor *all[] = {&x, &w, &dy, &dx, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bench_conv D CIN COUT [REPS] [all|prec|cat|convt|pw|ct2|wino]\n");
        return 2;
    }
    const int N = 2, D = atoi(argv[1]), C = atoi(argv[2]), OC = atoi(argv[3]), reps = argc > 4 ? atoi(argv[4]) : 3;
    const char *mode = argc > 5 ? argv[5] : "all";
    if (!strcmp(mode, "wino")) return bench_wino(N, D, C, OC, reps);
    if (!strcmp(mode, "pw")) return bench_pw(N, D, C, OC, reps);
    if (!strcmp(mode, "ct2")) return bench_ct2(N, D, C, OC, reps);
    if (strcmp(mode, "all") && strcmp(mode, "prec") && strcmp(mode, "cat") && strcmp(mode, "convt") && strcmp(mode, "pw")) {
        fprintf(stderr, "bench_conv: ROWS is all, prec, cat, convt, pw, ct2 or wino\n");
        return 2;
    }
    if (strcmp(mode, "all")) return bench_prec(N, D, C, OC, reps, mode);
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    openblas_set_num_threads(1);
    ts_tensor x, w, b, y, dx, dw;
    int rc = ts_tensor_alloc(&x, TS_FLOAT32, 5, (const int64_t[]){N, D, D, D, C});
    rc |= ts_tensor_alloc(&y, TS_FLOAT32, 5, (const int64_t[]){N, D, D, D, OC});
    rc |= ts_tensor_alloc(&dx, TS_FLOAT32, 5, (const int64_t[]){N, D, D, D, C});
    rc |= ts_tensor_alloc(&w, TS_FLOAT32, 5, (const int64_t[]){OC, C, 3, 3, 3});
    rc |= ts_tensor_alloc(&dw, TS_FLOAT32, 5, (const int64_t[]){OC, C, 3, 3, 3});
    rc |= ts_tensor_alloc(&b, TS_FLOAT32, 1, (const int64_t[]){OC});
    float *wm = malloc(sizeof(float) * 27 * C * OC), *cols = malloc(sizeof(float) * (size_t)D * D * 27 * C * nt);
    if (rc || !wm || !cols) return 1;
    fill(&x);
    fill(&w);
    fill(&y);
    for (int i = 0; i < 27 * C * OC; i++) wm[i] = (float)(i % 13) * 0.01f;
    /* halos of x (C channels) and of dy (OC channels) on all six sides */
    ts_halo hx = {{1, 1, 1}, {NULL}, {NULL}}, hy = hx;
    const int64_t dhw[3] = {D, D, D};
    for (int d = 0; d < 3; d++) {
        const int64_t fx = ts_halo_face_floats(dhw, hx.on, d, N, C), fy = ts_halo_face_floats(dhw, hy.on, d, N, OC);
        float *f[4] = {malloc(sizeof(float) * fx), malloc(sizeof(float) * fx), malloc(sizeof(float) * fy),
                       malloc(sizeof(float) * fy)};
        for (int i = 0; i < 4; i++) {
            if (!f[i]) return 1;
            for (int64_t j = 0; j < (i < 2 ? fx : fy); j++) f[i][j] = (float)((j * 31) % 1000) / 1000.0f - 0.5f;
        }
        hx.lo[d] = f[0];
        hx.hi[d] = f[1];
        hy.lo[d] = f[2];
        hy.hi[d] = f[3];
    }
    const ts_conv_split sall = {&hx, TS_CONV_ALL, NULL, NULL, NULL}, sint = {&hx, TS_CONV_INTERIOR, NULL, NULL, NULL},
                        sbor = {&hx, TS_CONV_BORDER, NULL, NULL, NULL}, sdy = {&hy, TS_CONV_ALL, NULL, NULL, NULL};
    enum { ROWS = 8 };
    const double fl = 2.0 * N * D * D * D * (double)C * OC * 27;
    double best[ROWS][2];
    for (int k = 0; k < ROWS; k++) best[k][0] = best[k][1] = 1e30;
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < ROWS; k++) {
            const double t0 = ts_time_now(), c0 = cpu_now();
            if (k == 0) rc |= ts_conv3d_forward(&x, &w, &b, 1, 1, &y);
            else if (k == 1) rc |= ts_conv3d_backward(&x, &w, 1, 1, &y, NULL, &dw, NULL);
            else if (k == 2) rc |= ts_conv3d_backward(&x, &w, 1, 1, &y, &dx, NULL, NULL);
            else if (k == 3) im2col_forward(x.data, wm, y.data, N, D, C, OC, cols);
            else if (k == 4) rc |= ts_conv3d_forward_split(&x, &w, &b, &sall, &y);
            else if (k == 5) rc |= ts_conv3d_forward_split(&x, &w, &b, &sint, &y) | ts_conv3d_forward_split(&x, &w, &b, &sbor, &y);
            else if (k == 6) rc |= ts_conv3d_backward_split(&x, &w, &sall, &sdy, &y, NULL, &dw, NULL);
            else rc |= ts_conv3d_backward_split(&x, &w, &sall, &sdy, &y, &dx, NULL, NULL);
            const double t = ts_time_now() - t0, c = cpu_now() - c0;
            if (t < best[k][0]) best[k][0] = t;
            if (c < best[k][1]) best[k][1] = c;
        }
    static const char *const name[ROWS] = {"tessera forward", "tessera weight grad", "tessera input grad",
                                           "im2col+sgemm forward", "split forward (halo)", "split fwd int.+border",
                                           "split weight grad", "split input grad"};
    printf("conv3d 3x3x3 [2, %d^3, %d] -> %d, %d thread%s, best of %d:\n", D, C, OC, nt, nt > 1 ? "s" : "", reps);
    for (int k = 0; k < ROWS; k++)
        printf("  %-22s %8.2f ms  %7.1f GFLOP/s wall  %7.1f GFLOP/s per CPU-second\n", name[k], best[k][0] * 1e3,
               fl / best[k][0] / 1e9, fl / best[k][1] / 1e9);
    free(wm);
    free(cols);
    for (int d = 0; d < 3; d++) {
        free(hx.lo[d]);
        free(hx.hi[d]);
        free(hy.lo[d]);
        free(hy.hi[d]);
    }
    return rc ? 1 : 0;
}
