/* Convolution kernel benchmark (not a test; `make tests/nn/bench_conv`):
 * times tessera's 3x3x3 pad-1 conv3d forward, weight gradient and input
 * gradient on channels-last [2, D, D, D, C] data, and the textbook
 * alternative: im2col per depth plane + OpenBLAS sgemm (forward only),
 * planes spread over the OpenMP threads, OpenBLAS single-threaded inside.
 * Prints GFLOP/s by wall time and by process CPU time (the latter is what
 * to compare on a shared machine). docs/performance-engine.md uses it.
 * The split rows run the same shapes as one box of a split volume with a
 * halo on all six sides (ts_conv3d_*_split; forward all, and interior then
 * border).
 * usage: bench_conv D CIN COUT [REPS] */
#include "tsbuild.h"
#include "src/core/timer.h"
#include "src/nn/layers.h"

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

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bench_conv D CIN COUT [REPS]\n");
        return 2;
    }
    const int N = 2, D = atoi(argv[1]), C = atoi(argv[2]), OC = atoi(argv[3]), reps = argc > 4 ? atoi(argv[4]) : 3;
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
    const ts_conv_split sall = {&hx, TS_CONV_ALL, NULL, NULL}, sint = {&hx, TS_CONV_INTERIOR, NULL, NULL},
                        sbor = {&hx, TS_CONV_BORDER, NULL, NULL}, sdy = {&hy, TS_CONV_ALL, NULL, NULL};
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
