/* The Winograd F(2x2x2, 3x3x3) convolution forward (src/nn/winograd.c)
 * against a naive double-precision 3x3x3 convolution: every output within
 * 1e-5 of the output's largest magnitude (fp32 Winograd F(2, 3) keeps about
 * 1e-6), on odd and even edges, channel counts not multiples of 16, a
 * concatenated input, epilogues (folded norm, ReLU, leaky ReLU), items of
 * several row pairs and rows split into column blocks; the direct
 * convolution is held to the same bound as a control; with bf16 products
 * (bf16_case, bf16_wgrad) against double and the direct bf16 convolution; bad
 * arguments fail. */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/nn/conv_impl.h" /* ts_nn_winograd_cache_bytes, ts_nn_winograd_release */
#include "src/nn/layers.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "tests/nn/rand_tensor.h" /* rng, mk, MK */

/* y[n, d, h, w, o] = ep(b[o] + sum x[.., c] w[o][c][kd][kh][kw]) in double, x = [a, b2] */
static void ref(const ts_tensor *a, const ts_tensor *a2, const ts_tensor *w, const float *b, const ts_conv_ep *ep,
                double *y)
{
    const int N = (int)a->shape[0], D = (int)a->shape[1], H = (int)a->shape[2], W = (int)a->shape[3];
    const int ca = (int)a->shape[4], cb = a2 ? (int)a2->shape[4] : 0, C = ca + cb, OC = (int)w->shape[0];
    const float *pa = a->data, *pb = a2 ? a2->data : NULL, *pw = w->data;
    for (int n = 0; n < N; n++)
        for (int d = 0; d < D; d++)
            for (int h = 0; h < H; h++)
                for (int x = 0; x < W; x++)
                    for (int o = 0; o < OC; o++) {
                        double s = b ? b[o] : 0;
                        for (int kd = 0; kd < 3; kd++)
                            for (int kh = 0; kh < 3; kh++)
                                for (int kw = 0; kw < 3; kw++) {
                                    const int id = d + kd - 1, ih = h + kh - 1, iw = x + kw - 1;
                                    if (id < 0 || id >= D || ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                    const size_t v = (((size_t)n * D + id) * H + ih) * W + iw;
                                    for (int c = 0; c < C; c++) {
                                        const double xv = c < ca ? pa[v * ca + c] : pb[v * cb + c - ca];
                                        s += xv * pw[(((size_t)o * C + c) * 3 + kd) * 9 + kh * 3 + kw];
                                    }
                                }
                        if (ep && ep->scale) s = s * ep->scale[o] + ep->shift[o];
                        if (ep && ep->act != TS_EP_NONE && !(s > 0)) s = ep->act == TS_EP_LEAKY ? s * ep->slope : 0;
                        y[((((size_t)n * D + d) * H + h) * W + x) * OC + o] = s;
                    }
}

static double max_rel(const float *a, const double *r, size_t n, double *scale)
{
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) s = fmax(s, fabs(r[i]));
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - r[i]) / fmax(s, 1e-30));
    *scale = s;
    return m;
}

/* epilogue kind epk: 0 none, 1 folded norm (scale sc, shift sh) + ReLU, 2
 * folded norm + leaky ReLU, 3 ReLU alone */
static ts_conv_ep ep_kind(int epk, const ts_tensor *sc, const ts_tensor *sh)
{
    const int norm = epk == 1 || epk == 2;
    return (ts_conv_ep){norm ? (float *)sc->data : NULL, norm ? (float *)sh->data : NULL,
                        epk == 0 ? TS_EP_NONE : epk == 2 ? TS_EP_LEAKY : TS_EP_RELU, 0.01f, NULL};
}

/* ep: as ep_kind */
static void check(int N, int D, int H, int W, int ca, int cb, int OC, int epk)
{
    const int C = ca + cb;
    ts_tensor a = MK(-1, 1, N, D, H, W, ca), a2 = cb ? MK(-1, 1, N, D, H, W, cb) : (ts_tensor){0};
    ts_tensor w = MK(-0.3f, 0.3f, OC, C, 3, 3, 3), b = MK(-0.5f, 0.5f, OC), sc = MK(0.5f, 1.5f, OC), sh = MK(-0.5f, 0.5f, OC);
    ts_tensor y = MK(7, 7, N, D, H, W, OC), yd = MK(7, 7, N, D, H, W, OC);
    const ts_conv_ep ep = ep_kind(epk, &sc, &sh);
    const size_t n = (size_t)ts_tensor_numel(&y);
    double *r = malloc(n * sizeof *r);
    ref(&a, cb ? &a2 : NULL, &w, b.data, epk ? &ep : NULL, r);
    int rc = ts_conv3d_winograd_forward(&a, cb ? &a2 : NULL, &w, &b, epk ? &ep : NULL, &y);
    const ts_conv_split sp = {NULL, TS_CONV_ALL, NULL, NULL, epk ? &ep : NULL};
    rc |= cb ? ts_conv3d_cat_forward_split(&a, &a2, &w, &b, &sp, &yd) : ts_conv3d_forward_split(&a, &w, &b, &sp, &yd);
    double scale, sd, e = max_rel(y.data, r, n, &scale), ed = max_rel(yd.data, r, n, &sd);
    size_t pos = 0, neg = 0;
    for (size_t i = 0; i < n; i++) pos += r[i] > 0, neg += r[i] < 0;
    char cat[32] = "";
    if (cb) snprintf(cat, sizeof cat, "+%d", cb);
    ts_ok(rc == 0 && e <= 1e-5 && ed <= 1e-5 && scale > 0.1 && pos > n / 8 && (epk == 1 || epk == 3 || neg > n / 8),
          "winograd [%d, %dx%dx%d, %d%s] -> %d, epilogue %d: max error %.2e of the scale %.3g (direct %.2e), "
          "%zu positive, %zu negative of %zu",
          N, D, H, W, ca, cat, OC, epk, e, scale, ed, pos, neg, n);
    free(r);
    ts_tensor_free(&a);
    if (cb) ts_tensor_free(&a2);
    ts_tensor_free(&w);
    ts_tensor_free(&b);
    ts_tensor_free(&sc);
    ts_tensor_free(&sh);
    ts_tensor_free(&y);
    ts_tensor_free(&yd);
}

/* dx[n, d, h, w, c] = sum dy[n, d - kd + 1, .., oc] w[oc][c][kd][kh][kw] in double */
static void ref_dx(const ts_tensor *dy, const ts_tensor *w, int C, double *dx)
{
    const int N = (int)dy->shape[0], D = (int)dy->shape[1], H = (int)dy->shape[2], W = (int)dy->shape[3];
    const int OC = (int)dy->shape[4];
    const float *g = dy->data, *pw = w->data;
    for (int n = 0; n < N; n++)
        for (int d = 0; d < D; d++)
            for (int h = 0; h < H; h++)
                for (int x = 0; x < W; x++)
                    for (int c = 0; c < C; c++) {
                        double s = 0;
                        for (int kd = 0; kd < 3; kd++)
                            for (int kh = 0; kh < 3; kh++)
                                for (int kw = 0; kw < 3; kw++) {
                                    const int od = d - kd + 1, oh = h - kh + 1, ow = x - kw + 1;
                                    if (od < 0 || od >= D || oh < 0 || oh >= H || ow < 0 || ow >= W) continue;
                                    const float *gy = g + ((((size_t)n * D + od) * H + oh) * W + ow) * OC;
                                    for (int o = 0; o < OC; o++)
                                        s += gy[o] * (double)pw[(((size_t)o * C + c) * 3 + kd) * 9 + kh * 3 + kw];
                                }
                        dx[((((size_t)n * D + d) * H + h) * W + x) * C + c] = s;
                    }
}

/* dw[oc][c][tap] = sum x[.., o + tap - 1, c] dy[.., o, oc] in double, x = [a, b] */
static void ref_dw(const ts_tensor *a, const ts_tensor *a2, const ts_tensor *dy, double *dw)
{
    const int D = (int)a->shape[1], H = (int)a->shape[2], W = (int)a->shape[3], ca = (int)a->shape[4];
    const int cb = (int)a2->shape[4], C = ca + cb, OC = (int)dy->shape[4];
    const float *pa = a->data, *pb = a2->data, *g = dy->data;
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++)
            for (int t = 0; t < 27; t++) {
                const int kd = t / 9, kh = t / 3 % 3, kw = t % 3;
                double s = 0;
                for (int d = 0; d < D; d++)
                    for (int h = 0; h < H; h++)
                        for (int x = 0; x < W; x++) {
                            const int id = d + kd - 1, ih = h + kh - 1, iw = x + kw - 1;
                            if (id < 0 || id >= D || ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                            const size_t v = ((size_t)id * H + ih) * W + iw, vo = ((size_t)d * H + h) * W + x;
                            s += (c < ca ? pa[v * ca + c] : pb[v * cb + c - ca]) * (double)g[vo * OC + o];
                        }
                dw[((size_t)o * C + c) * 27 + t] = s;
            }
}

/* with ts_nn_set_winograd on: the layers' forward (ts_conv3d_forward, the
 * same bits as ts_conv3d_winograd_forward) and input gradient (through a
 * concatenation: dx split into da, db at ca) and, with 48+ channels and
 * 256+ tiles, weight gradient as Winograd convolutions, against double, and
 * not the direct bits; a layer under 16 channels stays direct (the same
 * bits) */
static void layer_switch(int D, int H, int W, int ca, int cb, int OC)
{
    const int C = ca + cb;
    ts_tensor a = MK(-1, 1, 1, D, H, W, ca), b2 = MK(-1, 1, 1, D, H, W, cb), w = MK(-0.3f, 0.3f, OC, C, 3, 3, 3);
    ts_tensor dy = MK(-1, 1, 1, D, H, W, OC), da = MK(0, 0, 1, D, H, W, ca), db = MK(0, 0, 1, D, H, W, cb);
    ts_tensor dw0 = MK(0, 0, OC, C, 3, 3, 3), dw1 = MK(0, 0, OC, C, 3, 3, 3), y0 = MK(0, 0, 1, D, H, W, OC),
              y1 = MK(0, 0, 1, D, H, W, OC);
    const size_t nx = (size_t)D * H * W * C;
    double *r = malloc(nx * sizeof *r), scale = 0, e = 0;
    ref_dx(&dy, &w, C, r);
    ts_tensor da0 = MK(0, 0, 1, D, H, W, ca), db0 = MK(0, 0, 1, D, H, W, cb);
    int rc = ts_conv3d_cat_backward(&a, &b2, &w, 1, 1, &dy, &da0, &db0, &dw0, NULL);
    rc |= ts_conv3d_cat_forward(&a, &b2, &w, NULL, 1, 1, &y0);
    ts_nn_set_winograd(1);
    rc |= ts_conv3d_cat_backward(&a, &b2, &w, 1, 1, &dy, &da, &db, &dw1, NULL);
    rc |= ts_conv3d_cat_forward(&a, &b2, &w, NULL, 1, 1, &y1);
    ts_nn_set_winograd(0);
    ts_tensor yw = MK(0, 0, 1, D, H, W, OC);
    rc |= ts_conv3d_winograd_forward(&a, &b2, &w, NULL, NULL, &yw);
    for (size_t i = 0; i < nx; i++) scale = fmax(scale, fabs(r[i]));
    for (size_t v = 0; v < nx / C; v++)
        for (int c = 0; c < C; c++) {
            const float got = c < ca ? ((float *)da.data)[v * ca + c] : ((float *)db.data)[v * cb + c - ca];
            e = fmax(e, fabs(got - r[v * C + c]) / scale);
        }
    const size_t ny = (size_t)ts_tensor_numel(&y0);
    int fwd_wino = !memcmp(y1.data, yw.data, ny * sizeof(float)), fwd_direct = !memcmp(y1.data, y0.data, ny * sizeof(float));
    const int dx_direct = !memcmp(da.data, da0.data, (size_t)ts_tensor_numel(&da) * sizeof(float)) &&
                          !memcmp(db.data, db0.data, (size_t)ts_tensor_numel(&db) * sizeof(float));
    int dw_same = !memcmp(dw0.data, dw1.data, (size_t)ts_tensor_numel(&dw0) * sizeof(float));
    const size_t nw = (size_t)ts_tensor_numel(&dw1);
    double *rw = malloc(nw * sizeof *rw), sw = 0, ew = 0;
    ref_dw(&a, &b2, &dy, rw);
    for (size_t i = 0; i < nw; i++) sw = fmax(sw, fabs(rw[i]));
    for (size_t i = 0; i < nw; i++) ew = fmax(ew, fabs(((float *)dw1.data)[i] - rw[i]) / sw);
    free(rw);
    const int wino = C >= 16 && OC >= 16;
    /* the weight gradient where src/nn/conv3d.c takes Winograd's: 48+ channels, 256+ tiles */
    const int wgw = wino && C + OC >= 48 && ((D + 1) / 2) * ((H + 1) / 2) * ((W + 1) / 2) >= 256;
    ts_ok(rc == 0 && e <= 1e-5 && scale > 0.1 && ew <= 1e-5 && sw > 0.1 && dw_same == !wgw &&
              (wino ? fwd_wino && !fwd_direct && !dx_direct : fwd_direct && dx_direct),
          "switch on, [%dx%dx%d, %d+%d] -> %d: dx (split at %d) max error %.2e of the scale %.3g, %s; forward %s; "
          "weight gradient max error %.2e of the scale %.3g, %s",
          D, H, W, ca, cb, OC, ca, e, scale, dx_direct ? "the direct bits" : "not the direct bits",
          fwd_wino && !fwd_direct ? "Winograd's bits" : fwd_direct ? "direct bits" : "neither", ew, sw,
          dw_same ? "the direct bits" : "not the direct bits");
    free(r);
    ts_tensor *all[] = {&a, &b2, &w, &dy, &da, &db, &da0, &db0, &dw0, &dw1, &y0, &y1, &yw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* fp32 convolutions with at most 8 output channels and 16+ input channels
 * (src/nn/winograd_narrow.c, tile pairs in a vector): with the switch on,
 * the layer's forward runs there (its call counter moves), gives exactly
 * ts_conv3d_winograd_forward's bits (winograd.c's sums, 16 lanes a voxel)
 * and is within 1e-5 of double; the input gradient of a layer with at most
 * 8 input and 16+ output channels likewise (against double, not the direct
 * bits) */
static void narrow_case(int N, int D, int H, int W, int ca, int cb, int OC, int epk)
{
    const int C = ca + cb;
    ts_tensor a = MK(-1, 1, N, D, H, W, ca), a2 = cb ? MK(-1, 1, N, D, H, W, cb) : (ts_tensor){0};
    ts_tensor w = MK(-0.3f, 0.3f, OC, C, 3, 3, 3), b = MK(-0.5f, 0.5f, OC), sc = MK(0.5f, 1.5f, OC), sh = MK(-0.5f, 0.5f, OC);
    ts_tensor y = MK(7, 7, N, D, H, W, OC), yw = MK(7, 7, N, D, H, W, OC);
    const ts_conv_ep ep = ep_kind(epk, &sc, &sh);
    const size_t n = (size_t)ts_tensor_numel(&y);
    double *r = malloc(n * sizeof *r), scale;
    ref(&a, cb ? &a2 : NULL, &w, b.data, epk ? &ep : NULL, r);
    int rc = ts_conv3d_winograd_forward(&a, cb ? &a2 : NULL, &w, &b, epk ? &ep : NULL, &yw);
    const ts_conv_split sp = {NULL, TS_CONV_ALL, NULL, NULL, epk ? &ep : NULL};
    const long c0 = ts_nn_winograd_narrow_calls();
    ts_nn_set_winograd(1);
    rc |= cb ? ts_conv3d_cat_forward_split(&a, &a2, &w, &b, &sp, &y) : ts_conv3d_forward_split(&a, &w, &b, &sp, &y);
    ts_nn_set_winograd(0);
    const long ran = ts_nn_winograd_narrow_calls() - c0;
    const double e = max_rel(y.data, r, n, &scale);
    const int same = !memcmp(y.data, yw.data, n * sizeof(float));
    char cat[32] = "";
    if (cb) snprintf(cat, sizeof cat, "+%d", cb);
    ts_ok(rc == 0 && ran == 1 && same && e <= 1e-5 && scale > 0.1,
          "narrow winograd [%d, %dx%dx%d, %d%s] -> %d, epilogue %d: %ld call(s), %s, max error %.2e of the scale %.3g", N,
          D, H, W, ca, cat, OC, epk, ran, same ? "winograd.c's bits" : "NOT winograd.c's bits", e, scale);
    free(r);
    /* the input gradient of OC' = C -> C' = OC channels: narrow where C' <= 8 */
    ts_tensor w2 = MK(-0.3f, 0.3f, C, OC, 3, 3, 3), dy = MK(-1, 1, N, D, H, W, C), dx = MK(0, 0, N, D, H, W, OC),
              dx0 = MK(0, 0, N, D, H, W, OC), xin = MK(-1, 1, N, D, H, W, OC);
    const size_t nx = (size_t)ts_tensor_numel(&dx);
    r = malloc(nx * sizeof *r);
    ref_dx(&dy, &w2, OC, r);
    rc = ts_conv3d_backward(&xin, &w2, 1, 1, &dy, &dx0, NULL, NULL);
    const long d0 = ts_nn_winograd_narrow_calls();
    ts_nn_set_winograd(1);
    rc |= ts_conv3d_backward(&xin, &w2, 1, 1, &dy, &dx, NULL, NULL);
    ts_nn_set_winograd(0);
    const long dran = ts_nn_winograd_narrow_calls() - d0;
    const double ed = max_rel(dx.data, r, nx, &scale);
    const int direct = !memcmp(dx.data, dx0.data, nx * sizeof(float));
    ts_ok(rc == 0 && dran == 1 && !direct && ed <= 1e-5 && scale > 0.1,
          "narrow winograd input gradient [%d, %dx%dx%d, %d] -> %d: %ld call(s), %s, max error %.2e of the scale %.3g", N,
          D, H, W, C, OC, dran, direct ? "the direct bits" : "not the direct bits", ed, scale);
    free(r);
    ts_tensor *all[] = {&a, &w, &b, &sc, &sh, &y, &yw, &w2, &dy, &dx, &dx0, &xin};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
    if (cb) ts_tensor_free(&a2);
}

/* 8 -> 8 (under 16 input channels: conv3d.c keeps the direct kernels, which
 * measured about as fast) with the switch on: the direct bits, forward and
 * input gradient, and the narrow driver not called */
static void narrow_direct(void)
{
    ts_tensor x = MK(-1, 1, 1, 6, 7, 8, 8), w = MK(-0.3f, 0.3f, 8, 8, 3, 3, 3), dy = MK(-1, 1, 1, 6, 7, 8, 8);
    ts_tensor y[2], dx[2];
    int rc = 0;
    const long c0 = ts_nn_winograd_narrow_calls();
    for (int k = 0; k < 2; k++) {
        y[k] = MK(0, 0, 1, 6, 7, 8, 8);
        dx[k] = MK(0, 0, 1, 6, 7, 8, 8);
        ts_nn_set_winograd(k);
        rc |= ts_conv3d_forward(&x, &w, NULL, 1, 1, &y[k]) | ts_conv3d_backward(&x, &w, 1, 1, &dy, &dx[k], NULL, NULL);
        ts_nn_set_winograd(0);
    }
    const size_t n = (size_t)ts_tensor_numel(&y[0]);
    ts_ok(rc == 0 && ts_nn_winograd_narrow_calls() == c0 && !memcmp(y[0].data, y[1].data, n * sizeof(float)) &&
              !memcmp(dx[0].data, dx[1].data, n * sizeof(float)),
          "8 -> 8 with the switch on: the direct bits (forward and input gradient), the narrow driver not called");
    ts_tensor *all[] = {&x, &w, &dy, &y[0], &y[1], &dx[0], &dx[1]};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* the memory plan's Winograd scratch (ts_conv3d_winograd_scratch_bytes):
 * none where no driver takes the channel counts (8 -> 8, 12 -> 16), the
 * few-output-channel driver's where it takes the forward (16 -> 8) or the
 * input gradient (8 -> 16), winograd.c's for 16 -> 16 */
static void plan_scratch(void)
{
    const size_t n88 = ts_conv3d_winograd_scratch_bytes(2, 24, 24, 24, 8, 8, 2, 1);
    const size_t n1216 = ts_conv3d_winograd_scratch_bytes(2, 24, 24, 24, 12, 16, 2, 1);
    const size_t n168 = ts_conv3d_winograd_scratch_bytes(2, 24, 24, 24, 16, 8, 2, 1);
    const size_t n816 = ts_conv3d_winograd_scratch_bytes(2, 24, 24, 24, 8, 16, 2, 1);
    const size_t n1616 = ts_conv3d_winograd_scratch_bytes(2, 24, 24, 24, 16, 16, 2, 1);
    ts_ok(n88 == 0 && n1216 == 0 && n168 > 0 && n816 == n168 && n1616 > 0,
          "Winograd scratch for the memory plan: 8 -> 8 %zu, 12 -> 16 %zu, 16 -> 8 %zu, 8 -> 16 %zu, 16 -> 16 %zu bytes", n88,
          n1216, n168, n816, n1616);
}

/* the Winograd weight gradient and input gradient on 1, 2 and 3 threads:
 * the same bits (fixed chunks summed in order) */
static void threads_same(void)
{
#ifdef _OPENMP
    ts_tensor x = MK(-1, 1, 2, 10, 12, 14, 32), w = MK(-0.3f, 0.3f, 48, 32, 3, 3, 3), dy = MK(-1, 1, 2, 10, 12, 14, 48);
    ts_tensor dw[3], dx[3];
    int rc = 0, same = 1;
    const int before = omp_get_max_threads();
    ts_nn_set_winograd(1);
    for (int k = 0; k < 3; k++) {
        dw[k] = MK(0, 0, 48, 32, 3, 3, 3);
        dx[k] = MK(0, 0, 2, 10, 12, 14, 32);
        omp_set_num_threads(k + 1);
        rc |= ts_conv3d_backward(&x, &w, 1, 1, &dy, &dx[k], &dw[k], NULL);
        if (k)
            same &= !memcmp(dw[k].data, dw[0].data, (size_t)ts_tensor_numel(&dw[0]) * sizeof(float)) &&
                    !memcmp(dx[k].data, dx[0].data, (size_t)ts_tensor_numel(&dx[0]) * sizeof(float));
    }
    ts_nn_set_winograd(0);
    omp_set_num_threads(before);
    ts_ok(rc == 0 && same, "Winograd weight and input gradients: the same bits on 1, 2 and 3 threads");
    for (int k = 0; k < 3; k++) {
        ts_tensor_free(&dw[k]);
        ts_tensor_free(&dx[k]);
    }
    ts_tensor_free(&x);
    ts_tensor_free(&w);
    ts_tensor_free(&dy);
#else
    ts_diag("threads: skipped, built without OpenMP (one thread only)");
#endif
}

/* the transformed weights are cached by the weights' address, from their
 * second call unchanged on: changed in place (a training step), they are
 * transformed again and no longer cached; weights that change on every
 * call (training) are never cached; each result within the bound and a
 * cached result the same bits as the uncached one */
static void weights_changed(void)
{
    ts_tensor x = MK(-1, 1, 1, 6, 6, 6, 16), w = MK(-0.3f, 0.3f, 16, 16, 3, 3, 3), y = MK(0, 0, 1, 6, 6, 6, 16);
    const size_t n = (size_t)ts_tensor_numel(&y);
    double *r = malloc(n * sizeof *r), scale, worst = 0;
    float *first = malloc(n * sizeof *first);
    /* per call: change the weights first?, the cache's bytes expected after it (0: none, 1: some):
     * the second call with the same weights caches them */
    const int change[8] = {0, 0, 1, 1, 1, 1, 0, 0}, held[8] = {0, 1, 0, 0, 0, 0, 1, 1};
    int ok = 1, same = 1;
    size_t bytes[8];
    ts_nn_winograd_release();
    for (int k = 0; k < 8; k++) {
        if (change[k]) ((float *)w.data)[(5 * 16 + 3) * 27 + 13] += 0.25f; /* output 5, input 3, the centre tap */
        if (change[k] || !k) ref(&x, NULL, &w, NULL, NULL, r);
        const int rc = ts_conv3d_winograd_forward(&x, NULL, &w, NULL, NULL, &y);
        const double e = rc ? 1 : max_rel(y.data, r, n, &scale);
        worst = e > worst ? e : worst;
        bytes[k] = ts_nn_winograd_cache_bytes();
        ok &= (bytes[k] > 0) == held[k];
        if (k == 5) memcpy(first, y.data, n * sizeof *first); /* uncached, then cached: the same bits */
        if (k == 6) same = !memcmp(first, y.data, n * sizeof *first);
    }
    ts_ok(worst <= 1e-5, "weights unchanged, changed in place on 4 calls in a row, unchanged again: max error %.2e", worst);
    ts_ok(ok, "cached from the second unchanged call on, dropped when changed, never while changing: bytes held "
          "%zu %zu | %zu %zu %zu %zu | %zu %zu", bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6],
          bytes[7]);
    ts_ok(same, "the cached transform gives the same bits as the uncached one");
    free(first);
    free(r);
    ts_tensor_free(&x);
    ts_tensor_free(&w);
    ts_tensor_free(&y);
}

/* bf16 (ts_nn_set_conv_precision(TS_PREC_BF16)): the forward and, with one
 * input, the input gradient as Winograd convolutions with bf16 products
 * (src/nn/winograd_bf16.c): against double within 1e-2 of the output's
 * scale and within 3x the direct bf16 convolution's error on the same data
 * (the control), not the fp32 Winograd bits (the products were rounded);
 * AVX512-BF16 and its emulation the same bits; the weight gradient keeps
 * the direct bf16 kernels' bits */
static void bf16_case(int N, int D, int H, int W, int ca, int cb, int OC, int epk)
{
    const int C = ca + cb, nat = ts_nn_cpu_bf16();
    ts_tensor a = MK(-1, 1, N, D, H, W, ca), a2 = cb ? MK(-1, 1, N, D, H, W, cb) : (ts_tensor){0};
    ts_tensor w = MK(-0.3f, 0.3f, OC, C, 3, 3, 3), b = MK(-0.5f, 0.5f, OC), sc = MK(0.5f, 1.5f, OC), sh = MK(-0.5f, 0.5f, OC);
    ts_tensor yf = MK(7, 7, N, D, H, W, OC), ye = MK(7, 7, N, D, H, W, OC), yn = MK(7, 7, N, D, H, W, OC),
              yd = MK(7, 7, N, D, H, W, OC), yl = MK(7, 7, N, D, H, W, OC);
    const ts_conv_ep ep = ep_kind(epk, &sc, &sh);
    const ts_conv_ep *e_ = epk ? &ep : NULL;
    const ts_conv_split sp = {NULL, TS_CONV_ALL, NULL, NULL, e_};
    const size_t n = (size_t)ts_tensor_numel(&yf);
    double *r = malloc(n * sizeof *r);
    ref(&a, cb ? &a2 : NULL, &w, b.data, e_, r);
    int rc = ts_conv3d_winograd_forward(&a, cb ? &a2 : NULL, &w, &b, e_, &yf);
    rc |= ts_nn_set_conv_precision(TS_PREC_BF16);
    rc |= ts_nn_bf16_select_isa("emulated");
    rc |= ts_conv3d_winograd_forward(&a, cb ? &a2 : NULL, &w, &b, e_, &ye);
    if (nat) {
        rc |= ts_nn_bf16_select_isa("avx512bf16");
        rc |= ts_conv3d_winograd_forward(&a, cb ? &a2 : NULL, &w, &b, e_, &yn);
    }
    rc |= cb ? ts_conv3d_cat_forward_split(&a, &a2, &w, &b, &sp, &yd) : ts_conv3d_forward_split(&a, &w, &b, &sp, &yd);
    ts_nn_set_winograd(1); /* the layer's forward through the switch: Winograd's bf16 bits */
    rc |= cb ? ts_conv3d_cat_forward_split(&a, &a2, &w, &b, &sp, &yl) : ts_conv3d_forward_split(&a, &w, &b, &sp, &yl);
    ts_nn_set_winograd(0);
    double scale, sd, e = max_rel(ye.data, r, n, &scale), ed = max_rel(yd.data, r, n, &sd);
    const int same_isa = !nat || !memcmp(ye.data, yn.data, n * sizeof(float)), qual = C + OC >= 64;
    /* the layer switch: Winograd's bf16 bits with 64+ channels in and out, else the direct ones */
    const int fp32_bits = !memcmp(ye.data, yf.data, n * sizeof(float));
    const int layer = !memcmp(qual ? ye.data : yd.data, yl.data, n * sizeof(float));
    char cat[32] = "";
    if (cb) snprintf(cat, sizeof cat, "+%d", cb);
    ts_ok(rc == 0 && e <= 1e-2 && e <= 3 * ed && scale > 0.1 && ed > 0 && same_isa && !fp32_bits && layer,
          "bf16 winograd [%d, %dx%dx%d, %d%s] -> %d, epilogue %d: max error %.2e of the scale %.3g (direct bf16 "
          "%.2e); emulated and AVX512-BF16 %s; %s the fp32 Winograd bits; the layer switch %s",
          N, D, H, W, ca, cat, OC, epk, e, scale, ed, nat ? (same_isa ? "the same bits" : "DIFFER") : "(no AVX512-BF16 here)",
          fp32_bits ? "EQUAL to" : "not", layer ? (qual ? "gives them" : "gives the direct bits (under 64 channels)") : "DIFFERS");
    if (!cb) { /* the input gradient (Winograd, bf16) and the weight gradient (direct bf16 bits) */
        ts_tensor dy = MK(-1, 1, N, D, H, W, OC), dx0 = MK(0, 0, N, D, H, W, C), dx1 = MK(0, 0, N, D, H, W, C);
        ts_tensor dw0 = MK(0, 0, OC, C, 3, 3, 3), dw1 = MK(0, 0, OC, C, 3, 3, 3);
        const size_t nx = (size_t)ts_tensor_numel(&dx0);
        double *rx = malloc(nx * sizeof *rx), sx, sx0;
        ref_dx(&dy, &w, C, rx);
        rc = ts_conv3d_backward(&a, &w, 1, 1, &dy, &dx0, &dw0, NULL);
        ts_nn_set_winograd(1);
        rc |= ts_conv3d_backward(&a, &w, 1, 1, &dy, &dx1, &dw1, NULL);
        ts_nn_set_winograd(0);
        const double ex = max_rel(dx1.data, rx, nx, &sx), ex0 = max_rel(dx0.data, rx, nx, &sx0);
        const int dw_same = !memcmp(dw0.data, dw1.data, (size_t)ts_tensor_numel(&dw0) * sizeof(float));
        const int dx_same = !memcmp(dx0.data, dx1.data, nx * sizeof(float));
        ts_ok(rc == 0 && ex <= 1e-2 && ex <= 3 * ex0 && sx > 0.1 && dw_same && dx_same == !qual,
              "bf16 winograd input gradient [%d, %dx%dx%d, %d] <- %d: max error %.2e of the scale %.3g (direct bf16 "
              "%.2e), %s; weight gradient %s", N, D, H, W, C, OC, ex, sx, ex0,
              dx_same ? "the direct bits (under 64 channels)" : "not the direct bits", dw_same ? "the direct bf16 bits" : "DIFFERS");
        free(rx);
        ts_tensor *bk[] = {&dy, &dx0, &dx1, &dw0, &dw1};
        for (size_t i = 0; i < sizeof bk / sizeof *bk; i++) ts_tensor_free(bk[i]);
    }
    ts_nn_set_conv_precision(TS_PREC_FP32);
    ts_nn_bf16_select_isa("auto");
    free(r);
    ts_tensor *all[] = {&a, &w, &b, &sc, &sh, &yf, &ye, &yn, &yd, &yl};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
    if (cb) ts_tensor_free(&a2);
}

/* bf16 weight gradient (48+ channels, 256+ tiles: the Winograd one with
 * bf16 products over pairs of tiles) through a concatenation: against
 * double within 1e-2 of its scale and 4x the direct bf16 kernels' error
 * (2.9-3.1x seen: V and Y each round sums of up to 8 values);
 * emulated and AVX512-BF16 the same bits, and 1 and 3 threads (the chunks'
 * fixed order); not the direct bits, but under 64 channels in and out
 * together exactly them */
static void bf16_wgrad(int D, int H, int W, int ca, int cb, int OC)
{
    const int C = ca + cb, nat = ts_nn_cpu_bf16();
    ts_tensor a = MK(-1, 1, 1, D, H, W, ca), b2 = MK(-1, 1, 1, D, H, W, cb), w = MK(-0.3f, 0.3f, OC, C, 3, 3, 3);
    ts_tensor dy = MK(-1, 1, 1, D, H, W, OC), da = MK(0, 0, 1, D, H, W, ca), db = MK(0, 0, 1, D, H, W, cb);
    ts_tensor dw[4];
    const size_t nw = (size_t)OC * C * 27;
    double *rw = malloc(nw * sizeof *rw), sw = 0, e[4] = {0};
    ref_dw(&a, &b2, &dy, rw);
    for (size_t i = 0; i < nw; i++) sw = fmax(sw, fabs(rw[i]));
    int rc = ts_nn_set_conv_precision(TS_PREC_BF16);
#ifdef _OPENMP
    const int before = omp_get_max_threads();
#endif
    /* 0: direct; 1: Winograd emulated; 2: Winograd native (or emulated again); 3: emulated on 3 threads */
    for (int k = 0; k < 4; k++) {
        dw[k] = MK(0, 0, OC, C, 3, 3, 3);
        rc |= ts_nn_bf16_select_isa(k == 2 && nat ? "avx512bf16" : "emulated");
        ts_nn_set_winograd(k > 0);
#ifdef _OPENMP
        omp_set_num_threads(k == 3 ? 3 : before);
#endif
        rc |= ts_conv3d_cat_backward(&a, &b2, &w, 1, 1, &dy, &da, &db, &dw[k], NULL);
        for (size_t i = 0; i < nw; i++) e[k] = fmax(e[k], fabs(((float *)dw[k].data)[i] - rw[i]) / sw);
    }
#ifdef _OPENMP
    omp_set_num_threads(before);
#endif
    ts_nn_set_winograd(0);
    ts_nn_set_conv_precision(TS_PREC_FP32);
    ts_nn_bf16_select_isa("auto");
    const size_t nb = nw * sizeof(float);
    const int isa = !memcmp(dw[1].data, dw[2].data, nb), thr = !memcmp(dw[1].data, dw[3].data, nb);
    const int direct = !memcmp(dw[0].data, dw[1].data, nb), qual = C + OC >= 64; /* else the direct bits */
    ts_ok(rc == 0 && sw > 0.1 && e[1] <= 1e-2 && e[1] <= 4 * e[0] && e[0] > 0 && isa && thr && direct == !qual,
          "bf16 winograd weight gradient [%dx%dx%d, %d+%d] -> %d: max error %.2e of the scale %.3g (direct bf16 %.2e); "
          "emulated and %s %s; 1 and 3 threads %s; %s the direct bits (expected: %s)",
          D, H, W, ca, cb, OC, e[1], sw, e[0], nat ? "AVX512-BF16" : "emulated again", isa ? "the same bits" : "DIFFER",
          thr ? "the same bits" : "DIFFER", direct ? "equal to" : "not", qual ? "not" : "equal, under 64 channels");
    free(rw);
    ts_tensor *all[] = {&a, &b2, &w, &dy, &da, &db, &dw[0], &dw[1], &dw[2], &dw[3]};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* the cache of transformed weights keeps fp32 and bf16 transforms of the
 * same weights apart: fp32, bf16, fp32, bf16 calls (each twice: uncached,
 * then cached) give one precision's bits each time */
static void bf16_cache(void)
{
    ts_tensor x = MK(-1, 1, 1, 6, 6, 6, 32), w = MK(-0.3f, 0.3f, 16, 32, 3, 3, 3);
    ts_tensor y[8];
    int rc = 0;
    ts_nn_winograd_release();
    for (int k = 0; k < 8; k++) {
        y[k] = MK(0, 0, 1, 6, 6, 6, 16);
        rc |= ts_nn_set_conv_precision(k / 2 % 2 ? TS_PREC_BF16 : TS_PREC_FP32);
        rc |= ts_conv3d_winograd_forward(&x, NULL, &w, NULL, NULL, &y[k]);
    }
    ts_nn_set_conv_precision(TS_PREC_FP32);
    const size_t nb = (size_t)ts_tensor_numel(&y[0]) * sizeof(float);
    int ok = rc == 0 && memcmp(y[0].data, y[2].data, nb);
    for (int k = 1; k < 8; k++) ok &= !memcmp(y[k].data, y[k / 2 % 2 ? 2 : 0].data, nb);
    ts_ok(ok, "cached fp32 and bf16 transforms of one weight tensor kept apart: each call its precision's bits");
    for (int k = 0; k < 8; k++) ts_tensor_free(&y[k]);
    ts_tensor_free(&x);
    ts_tensor_free(&w);
}

static void bad_args(void)
{
    ts_tensor x = MK(0, 1, 1, 4, 4, 4, 8), w1 = MK(0, 1, 8, 8, 1, 1, 1), w3 = MK(0, 1, 8, 8, 3, 3, 3);
    ts_tensor y = MK(0, 1, 1, 4, 4, 4, 8), y2 = MK(0, 1, 1, 4, 4, 5, 8), y6 = MK(0, 1, 1, 6, 6, 6, 8);
    int rc = ts_conv3d_winograd_forward(&x, NULL, &w1, NULL, NULL, &y6); /* padding 1: 6^3 outputs */
    ts_ok(rc == TS_ERR_ARG && strstr(ts_err_message(), "3x3x3 only"), "a 1x1x1 kernel is refused: %s", ts_err_message());
    rc = ts_conv3d_winograd_forward(&x, NULL, &w3, NULL, NULL, &y2);
    ts_ok(rc == TS_ERR_FORMAT && strstr(ts_err_message(), "conv3d output"), "a wrong output shape is refused: %s",
          ts_err_message());
    const ts_conv_ep half = {(float *)y.data, NULL, TS_EP_RELU, 0, NULL};
    rc = ts_conv3d_winograd_forward(&x, NULL, &w3, NULL, &half, &y);
    ts_ok(rc == TS_ERR_ARG && strstr(ts_err_message(), "scale and shift"), "a scale without a shift is refused: %s",
          ts_err_message());
    ts_tensor_free(&x);
    ts_tensor_free(&w1);
    ts_tensor_free(&w3);
    ts_tensor_free(&y);
    ts_tensor_free(&y2);
    ts_tensor_free(&y6);
}

int main(void)
{
    ts_rng_init(&rng, 7, 0, 0);
    check(1, 4, 4, 4, 16, 0, 16, 0);
    check(2, 5, 6, 7, 3, 0, 5, 0);    /* odd edges, few channels */
    check(1, 6, 6, 6, 24, 0, 40, 1);  /* channels not multiples of 16, folded norm + ReLU */
    check(1, 8, 8, 8, 16, 16, 32, 3); /* a concatenation, ReLU alone */
    check(1, 3, 9, 37, 64, 0, 80, 2); /* leaky ReLU; 4 + 1 output vectors */
    check(1, 3, 5, 9, 10, 7, 33, 1);  /* a concatenation not at a multiple of 16 */
    check(1, 12, 12, 12, 64, 0, 64, 1); /* several row pairs an item, a partial block */
    check(1, 2, 3, 300, 8, 0, 16, 0);   /* rows split into column blocks */
    check(1, 1, 1, 1, 4, 0, 4, 0);      /* one voxel */
    weights_changed();
    layer_switch(6, 7, 9, 10, 7, 20);  /* dx split inside a vector */
    layer_switch(8, 8, 8, 16, 16, 32); /* at a vector's edge */
    layer_switch(5, 5, 5, 8, 4, 16);   /* 12 input channels: direct */
    layer_switch(3, 5, 41, 40, 24, 80); /* 4 + 1 output vectors, 12 + 16 + 16 + 16 input rows a kernel call */
    layer_switch(16, 16, 18, 24, 8, 40); /* 576 tiles: the Winograd weight gradient */
    layer_switch(9, 20, 41, 40, 24, 80); /* 550 tiles, 4 + 1 vectors, 12 + 16 + 16 + 16 rows */
    threads_same();
    narrow_case(2, 5, 6, 9, 16, 0, 8, 0);    /* odd edges: a pair's second tile past the volume */
    narrow_case(1, 6, 6, 6, 8, 8, 8, 1);     /* a concatenation 8 + 8 -> 8, folded norm + ReLU */
    narrow_case(1, 3, 9, 37, 20, 0, 5, 2);   /* channels not multiples of 8, leaky ReLU, 3 pair blocks a row */
    narrow_case(1, 3, 7, 7, 5, 11, 8, 3);    /* a concatenation not at a multiple of 8, ReLU alone */
    narrow_case(1, 12, 12, 12, 16, 0, 8, 1); /* several row pairs an item, a partial block */
    narrow_case(1, 2, 3, 400, 16, 0, 8, 0);  /* rows split into column blocks */
    narrow_case(1, 1, 1, 1, 16, 0, 8, 0);    /* one voxel */
    narrow_case(2, 24, 24, 24, 8, 8, 8, 1);  /* the demo's decoder layer at 48^3 / 2, 2 windows */
    narrow_direct();
    plan_scratch();
    bf16_case(1, 6, 6, 6, 24, 0, 40, 1);   /* channels not multiples of 16, folded norm + ReLU */
    bf16_case(1, 8, 8, 8, 16, 16, 32, 3);  /* a concatenation, ReLU alone */
    bf16_case(2, 5, 7, 9, 17, 0, 20, 0);   /* an odd channel count: the last pair half zero */
    bf16_case(1, 3, 9, 37, 64, 0, 80, 2);  /* leaky ReLU; 4 + 1 output vectors */
    bf16_case(1, 12, 12, 12, 64, 0, 64, 1); /* several row pairs an item, a partial block */
    bf16_cache();
    bf16_wgrad(16, 16, 18, 24, 8, 40); /* 576 tiles, items of 63: a tile pair's second half zero */
    bf16_wgrad(9, 20, 41, 40, 24, 80); /* 4 + 1 output vectors, 12 + 16 + 16 + 16 rows a kernel call */
    bf16_wgrad(16, 16, 18, 16, 8, 24); /* 48 channels: the direct bf16 kernels */
    bad_args();
    ts_nn_release_scratch();
    return ts_done();
}
