/* The layers on the GPU against the same layers on the CPU (whose kernels
 * tests/nn/test_layers.c checks against naive double references): the same
 * random inputs, every output and gradient compared tensor by tensor,
 * relative to that tensor's largest magnitude, and each checked to be
 * non-zero (something was computed). Parameter gradients start from random
 * values to check that they are accumulated.
 * fp32 with TF32 off: <= 1e-4. bf16 and fp16 on the GPU against the CPU's
 * bf16 and fp16 (the same rounded operands, fp32 sums): <= 1e-2 (cuDNN
 * rounds the weight gradient to the half type; the CPU keeps it fp32).
 * ReLU, max-pool, concatenation, the norms and the losses: fp32, <= 1e-4
 * (max-pool and concatenation: exact).
 * Skips (TAP "1..0 # SKIP", with the reason) in a build without CUDA or
 * where no GPU is visible. Run by `make check` and by jobs/gpu/check.sh. */
#include "tsbuild.h"
#include "src/core/device.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/nn/layers.h"
#ifdef TS_HAVE_CUDA
#include "src/nn/cuda/cuda_nn.h" /* ts_cuda_set_fewch */
#endif
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/nn/rand_tensor.h" /* rng, mk */


static ts_tensor host_like(const ts_tensor *a)
{
    ts_tensor t;
    if (ts_tensor_alloc(&t, TS_FLOAT32, a->ndim, a->shape)) exit(1);
    return t;
}

/* a device copy of a host tensor */
static ts_tensor up(const ts_tensor *h)
{
    ts_tensor d;
    if (ts_tensor_alloc_device(&d, h->dtype, h->ndim, h->shape) || ts_tensor_transfer(&d, h)) {
        fprintf(stderr, "upload: %s\n", ts_err_message());
        exit(1);
    }
    return d;
}

/* max |gpu - cpu| / max |cpu|; 1e30 when the GPU tensor cannot be read or cpu is all zero */
static double rel(const ts_tensor *gpu, const ts_tensor *cpu)
{
    ts_tensor h = host_like(cpu);
    if (ts_tensor_transfer(&h, gpu)) {
        fprintf(stderr, "download: %s\n", ts_err_message());
        ts_tensor_free(&h);
        return 1e30;
    }
    const float *a = h.data, *b = cpu->data;
    double m = 0, s = 0;
    for (int64_t i = 0; i < ts_tensor_numel(cpu); i++) s = fmax(s, fabs(b[i]));
    for (int64_t i = 0; i < ts_tensor_numel(cpu); i++) m = fmax(m, fabs((double)a[i] - b[i]));
    ts_tensor_free(&h);
    return s > 0 ? m / s : 1e30;
}

static const char *prec_name(ts_precision p) { return p == TS_PREC_FP32 ? "fp32" : p == TS_PREC_BF16 ? "bf16" : "fp16"; }

static void check(const char *what, const ts_tensor *gpu, const ts_tensor *cpu, double bound, ts_precision p)
{
    const double r = rel(gpu, cpu);
    ts_ok(r <= bound, "%s %s: GPU vs CPU max rel %.2e (bound %.0e)", what, prec_name(p), r, bound);
}

/* conv3d: x [n, d, h, w, ci], weight [co, ci, k, k, k], stride s, padding pad */
/* the few-channel half convolutions' path (conv_cudnn.c), named in the test lines */
static const char *fewch_name = "";
static const char *gemm_name = ""; /* which cuBLAS path is on, if one is */

static void test_conv(int n, int d, int h, int w, int ci, int co, int k, int s, int pad, ts_precision p)
{
    const double bound = p == TS_PREC_FP32 ? 1e-4 : 1e-2;
    char what[160];
    snprintf(what, sizeof what, "conv3d [%d,%d,%d,%d,%d] -> %d k%d s%d p%d%s%s", n, d, h, w, ci, co, k, s, pad,
             p != TS_PREC_FP32 && (ci % 8 || co % 8) ? fewch_name : "", gemm_name);
    const int64_t od = ts_conv_out_size(d, k, s, pad), oh = ts_conv_out_size(h, k, s, pad),
                  ow = ts_conv_out_size(w, k, s, pad);
    ts_tensor x = mk(5, (int64_t[]){n, d, h, w, ci}, -1, 1), wt = mk(5, (int64_t[]){co, ci, k, k, k}, -0.5f, 0.5f),
              b = mk(1, (int64_t[]){co}, -1, 1), y = mk(5, (int64_t[]){n, od, oh, ow, co}, 0, 0),
              dy = mk(5, (int64_t[]){n, od, oh, ow, co}, -1, 1), dx = host_like(&x),
              dw = mk(5, wt.shape, -0.1f, 0.1f), db = mk(1, b.shape, -0.1f, 0.1f);
    ts_tensor gx = up(&x), gw = up(&wt), gb = up(&b), gy = up(&y), gdy = up(&dy), gdx = up(&dx), gdw = up(&dw),
              gdb = up(&db);
    ts_nn_set_conv_precision(p);
    int e1 = ts_conv3d_forward(&x, &wt, &b, s, pad, &y) || ts_conv3d_backward(&x, &wt, s, pad, &dy, &dx, &dw, &db);
    int e2 = ts_conv3d_forward(&gx, &gw, &gb, s, pad, &gy) ||
             ts_conv3d_backward(&gx, &gw, s, pad, &gdy, &gdx, &gdw, &gdb) || ts_device_sync();
    if (!ts_ok(!e1 && !e2, "%s %s: ran (%s)", what, prec_name(p), e1 || e2 ? ts_err_message() : "ok")) goto out;
    char t[200];
    snprintf(t, sizeof t, "%s output", what), check(t, &gy, &y, bound, p);
    snprintf(t, sizeof t, "%s input gradient", what), check(t, &gdx, &dx, bound, p);
    snprintf(t, sizeof t, "%s weight gradient (accumulated)", what), check(t, &gdw, &dw, bound, p);
    snprintf(t, sizeof t, "%s bias gradient (accumulated)", what), check(t, &gdb, &db, bound, p);
out:
    ts_nn_set_conv_precision(TS_PREC_FP32);
    ts_tensor *all[] = {&x, &wt, &b, &y, &dy, &dx, &dw, &db, &gx, &gw, &gb, &gy, &gdy, &gdx, &gdw, &gdb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* the stride-2 convolution of a split box (ts_conv3d_s2_*_split) with no halo (zeros around): the box
 * padded on the device and convolved with padding 0 (input gradient: padding 2, cropped) = the plain
 * stride-2, padding-1 convolution on the CPU */
static void test_conv_s2_split(int n, int d, int h, int w, int ci, int co)
{
    char what[160];
    snprintf(what, sizeof what, "conv3d stride-2 split, no halo [%d,%d,%d,%d,%d] -> %d", n, d, h, w, ci, co);
    ts_tensor x = mk(5, (int64_t[]){n, d, h, w, ci}, -1, 1), wt = mk(5, (int64_t[]){co, ci, 3, 3, 3}, -0.5f, 0.5f),
              b = mk(1, (int64_t[]){co}, -1, 1), y = mk(5, (int64_t[]){n, d / 2, h / 2, w / 2, co}, 0, 0),
              dy = mk(5, y.shape, -1, 1), dx = host_like(&x), dw = mk(5, wt.shape, -0.1f, 0.1f),
              db = mk(1, b.shape, -0.1f, 0.1f);
    ts_tensor gx = up(&x), gw = up(&wt), gb = up(&b), gy = up(&y), gdy = up(&dy), gdx = up(&dx), gdw = up(&dw),
              gdb = up(&db);
    int e1 = ts_conv3d_forward(&x, &wt, &b, 2, 1, &y) || ts_conv3d_backward(&x, &wt, 2, 1, &dy, &dx, &dw, &db);
    int e2 = ts_conv3d_s2_forward_split(&gx, &gw, &gb, NULL, &gy) ||
             ts_conv3d_s2_backward_split(&gx, &gw, NULL, NULL, &gdy, NULL, &gdw, &gdb) ||
             ts_conv3d_s2_backward_split(&gx, &gw, NULL, NULL, &gdy, &gdx, NULL, NULL) || ts_device_sync();
    if (ts_ok(!e1 && !e2, "%s: ran (%s)", what, e1 || e2 ? ts_err_message() : "ok")) {
        char t[200];
        snprintf(t, sizeof t, "%s output", what), check(t, &gy, &y, 1e-4, TS_PREC_FP32);
        snprintf(t, sizeof t, "%s input gradient", what), check(t, &gdx, &dx, 1e-4, TS_PREC_FP32);
        snprintf(t, sizeof t, "%s weight gradient (accumulated)", what), check(t, &gdw, &dw, 1e-4, TS_PREC_FP32);
        snprintf(t, sizeof t, "%s bias gradient (accumulated)", what), check(t, &gdb, &db, 1e-4, TS_PREC_FP32);
    }
    /* an odd edge is refused with the edge named */
    ts_tensor odd = mk(5, (int64_t[]){1, 3, 4, 4, ci}, -1, 1), godd = up(&odd);
    e2 = ts_conv3d_s2_forward_split(&godd, &gw, &gb, NULL, &gy);
    ts_ok(e2 == TS_ERR_ARG && strstr(ts_err_message(), "D edge is 3 voxels"), "%s: an odd box refused: %s", what,
          e2 ? ts_err_message() : "(accepted)");
    ts_tensor *all[] = {&x, &wt, &b, &y, &dy, &dx, &dw, &db, &gx, &gw, &gb, &gy, &gdy, &gdx, &gdw, &gdb, &odd, &godd};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* page-locked staging (ts_tensor_alloc_pinned) copied up without waiting (ts_tensor_upload_async): the
 * device copy holds the values once ts_device_upload_wait returns; a device source is refused */
static void test_upload(void)
{
    ts_tensor p, g, back;
    const int64_t sh[4] = {2, 5, 6, 7};
    if (ts_tensor_alloc_pinned(&p, TS_FLOAT32, 4, sh) || ts_tensor_alloc_device(&g, TS_FLOAT32, 4, sh)) {
        ts_ok(0, "pinned and device buffers: %s", ts_err_message());
        return;
    }
    ts_ok(p.owns == 2 && !p.device, "a pinned tensor is host memory freed as page-locked (owns %d)", p.owns);
    float *v = p.data;
    for (int64_t i = 0; i < ts_tensor_numel(&p); i++) v[i] = (float)i * 0.5f - 3.0f;
    back = host_like(&p);
    int e = ts_tensor_upload_async(&g, &p) || ts_device_upload_wait() || ts_device_upload_wait() ||
            ts_tensor_transfer(&back, &g);
    if (ts_ok(!e, "upload, wait (twice), download: %s", e ? ts_err_message() : "ok"))
        ts_ok(!memcmp(back.data, p.data, ts_tensor_bytes(&p)), "the uploaded tensor holds the pinned values");
    e = ts_tensor_upload_async(&g, &g);
    ts_ok(e == TS_ERR_ARG, "a device source is refused: %s", e ? ts_err_message() : "(accepted)");
    ts_tensor_free(&p), ts_tensor_free(&g), ts_tensor_free(&back);
}

/* transposed conv3d: x [n, d, d, d, ci], weight [ci, co, k, k, k], stride s */
static void test_convt(int n, int d, int ci, int co, int k, int s, ts_precision p)
{
    const double bound = p == TS_PREC_FP32 ? 1e-4 : 1e-2;
    char what[160];
    snprintf(what, sizeof what, "convt3d [%d,%d^3,%d] -> %d k%d s%d%s", n, d, ci, co, k, s, gemm_name);
    const int64_t o = (int64_t)(d - 1) * s + k;
    ts_tensor x = mk(5, (int64_t[]){n, d, d, d, ci}, -1, 1), wt = mk(5, (int64_t[]){ci, co, k, k, k}, -0.5f, 0.5f),
              b = mk(1, (int64_t[]){co}, -1, 1), y = mk(5, (int64_t[]){n, o, o, o, co}, 0, 0),
              dy = mk(5, (int64_t[]){n, o, o, o, co}, -1, 1), dx = host_like(&x),
              dw = mk(5, wt.shape, -0.1f, 0.1f), db = mk(1, b.shape, -0.1f, 0.1f);
    ts_tensor gx = up(&x), gw = up(&wt), gb = up(&b), gy = up(&y), gdy = up(&dy), gdx = up(&dx), gdw = up(&dw),
              gdb = up(&db);
    ts_nn_set_conv_precision(p);
    int e1 = ts_convt3d_forward(&x, &wt, &b, s, &y) || ts_convt3d_backward(&x, &wt, s, &dy, &dx, &dw, &db);
    int e2 = ts_convt3d_forward(&gx, &gw, &gb, s, &gy) || ts_convt3d_backward(&gx, &gw, s, &gdy, &gdx, &gdw, &gdb) ||
             ts_device_sync();
    if (!ts_ok(!e1 && !e2, "%s %s: ran (%s)", what, prec_name(p), e1 || e2 ? ts_err_message() : "ok")) goto out;
    char t[200];
    snprintf(t, sizeof t, "%s output", what), check(t, &gy, &y, bound, p);
    snprintf(t, sizeof t, "%s input gradient", what), check(t, &gdx, &dx, bound, p);
    snprintf(t, sizeof t, "%s weight gradient (accumulated)", what), check(t, &gdw, &dw, bound, p);
    snprintf(t, sizeof t, "%s bias gradient (accumulated)", what), check(t, &gdb, &db, bound, p);
out:
    ts_nn_set_conv_precision(TS_PREC_FP32);
    ts_tensor *all[] = {&x, &wt, &b, &y, &dy, &dx, &dw, &db, &gx, &gw, &gb, &gy, &gdy, &gdx, &gdw, &gdb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* conv3d over [a, b] (the decoder's first conv), 3x3x3, padding 1 */
static void test_cat(int ca, int cb, int co, ts_precision p)
{
    const double bound = p == TS_PREC_FP32 ? 1e-4 : 1e-2;
    char what[160];
    snprintf(what, sizeof what, "conv3d over [%d, %d] channels -> %d%s", ca, cb, co, gemm_name);
    ts_tensor a = mk(5, (int64_t[]){2, 5, 6, 7, ca}, -1, 1), bb = mk(5, (int64_t[]){2, 5, 6, 7, cb}, -1, 1),
              wt = mk(5, (int64_t[]){co, ca + cb, 3, 3, 3}, -0.5f, 0.5f), bias = mk(1, (int64_t[]){co}, -1, 1),
              y = mk(5, (int64_t[]){2, 5, 6, 7, co}, 0, 0), dy = mk(5, y.shape, -1, 1), da = host_like(&a),
              db = host_like(&bb), dw = mk(5, wt.shape, -0.1f, 0.1f), dbias = mk(1, bias.shape, -0.1f, 0.1f);
    ts_tensor ga = up(&a), gbb = up(&bb), gw = up(&wt), gbias = up(&bias), gy = up(&y), gdy = up(&dy), gda = up(&da),
              gdb = up(&db), gdw = up(&dw), gdbias = up(&dbias);
    ts_nn_set_conv_precision(p);
    int e1 = ts_conv3d_cat_forward(&a, &bb, &wt, &bias, 1, 1, &y) ||
             ts_conv3d_cat_backward(&a, &bb, &wt, 1, 1, &dy, &da, &db, &dw, &dbias);
    int e2 = ts_conv3d_cat_forward(&ga, &gbb, &gw, &gbias, 1, 1, &gy) ||
             ts_conv3d_cat_backward(&ga, &gbb, &gw, 1, 1, &gdy, &gda, &gdb, &gdw, &gdbias) || ts_device_sync();
    if (!ts_ok(!e1 && !e2, "%s %s: ran (%s)", what, prec_name(p), e1 || e2 ? ts_err_message() : "ok")) goto out;
    char t[200];
    snprintf(t, sizeof t, "%s output", what), check(t, &gy, &y, bound, p);
    snprintf(t, sizeof t, "%s gradient of the first input", what), check(t, &gda, &da, bound, p);
    snprintf(t, sizeof t, "%s gradient of the second input", what), check(t, &gdb, &db, bound, p);
    snprintf(t, sizeof t, "%s weight gradient (accumulated)", what), check(t, &gdw, &dw, bound, p);
    snprintf(t, sizeof t, "%s bias gradient (accumulated)", what), check(t, &gdbias, &dbias, bound, p);
out:
    ts_nn_set_conv_precision(TS_PREC_FP32);
    ts_tensor *all[] = {&a, &bb, &wt, &bias, &y, &dy, &da, &db, &dw, &dbias,
                        &ga, &gbb, &gw, &gbias, &gy, &gdy, &gda, &gdb, &gdw, &gdbias};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}


/* ---- the other layers: GPU against CPU, fp32 (<= 1e-4) ---- */
static ts_tensor labels_host(int64_t n, int64_t v, int K, int ign)
{
    ts_tensor t;
    if (ts_tensor_alloc(&t, TS_UINT8, 4, (int64_t[]){n, v, 1, 1})) exit(1);
    uint8_t *p = t.data;
    for (int64_t i = 0; i < n * v; i++) {
        p[i] = (uint8_t)(ts_rng_uniformf(&rng) * K);
        if (ign >= 0 && ts_rng_uniformf(&rng) < 0.1f) p[i] = (uint8_t)ign;
    }
    return t;
}

static const char *passes_name = ""; /* " (tiled passes)" while ts_cuda_set_passes(1) */
static float norm_slope = 0.0f;      /* > 0: the norms' fused ReLU is a leaky ReLU of this slope */

static void test_relu_pool_concat(void)
{
    ts_tensor x = mk(5, (int64_t[]){2, 6, 4, 8, 5}, -1, 1), y = host_like(&x), dy = mk(5, x.shape, -1, 1),
              dx = host_like(&x);
    ts_tensor gx = up(&x), gy = up(&y), gdy = up(&dy), gdx = up(&dx);
    int e = ts_relu_forward(&x, 0.01f, &y) || ts_relu_backward(&y, 0.01f, &dy, &dx) ||
            ts_relu_forward(&gx, 0.01f, &gy) || ts_relu_backward(&gy, 0.01f, &gdy, &gdx) || ts_device_sync();
    if (ts_ok(!e, "leaky relu ran (%s)%s", e ? ts_err_message() : "ok", passes_name)) {
        check("leaky relu output", &gy, &y, 1e-6, TS_PREC_FP32);
        check("leaky relu input gradient", &gdx, &dx, 1e-6, TS_PREC_FP32);
    }
    /* max-pool 2: output, indices (as the gradient they route) */
    ts_tensor py = mk(5, (int64_t[]){2, 3, 2, 4, 5}, 0, 0), pdy = mk(5, py.shape, -1, 1), pdx = host_like(&x), pi;
    ts_tensor gpy = up(&py), gpdy = up(&pdy), gpdx = up(&pdx), gpi;
    if (ts_tensor_alloc(&pi, TS_UINT8, 5, py.shape) || ts_tensor_alloc_device(&gpi, TS_UINT8, 5, py.shape)) exit(1);
    e = ts_maxpool3d_forward(&x, 2, &py, &pi) || ts_maxpool3d_backward(&pdy, &pi, 2, &pdx) ||
        ts_maxpool3d_forward(&gx, 2, &gpy, &gpi) || ts_maxpool3d_backward(&gpdy, &gpi, 2, &gpdx) || ts_device_sync();
    if (ts_ok(!e, "max-pool ran (%s)%s", e ? ts_err_message() : "ok", passes_name)) {
        check("max-pool output", &gpy, &py, 0, TS_PREC_FP32);
        check("max-pool input gradient", &gpdx, &pdx, 0, TS_PREC_FP32);
    }
    /* concatenation along the channels and back */
    ts_tensor b = mk(5, (int64_t[]){2, 6, 4, 8, 3}, -1, 1), cy = mk(5, (int64_t[]){2, 6, 4, 8, 8}, 0, 0),
              da = host_like(&x), dbb = host_like(&b);
    ts_tensor gb = up(&b), gcy = up(&cy), gda = up(&da), gdbb = up(&dbb);
    e = ts_concat_forward(&x, &b, &cy) || ts_concat_backward(&cy, &da, &dbb) || ts_concat_forward(&gx, &gb, &gcy) ||
        ts_concat_backward(&gcy, &gda, &gdbb) || ts_device_sync();
    if (ts_ok(!e, "concat ran (%s)%s", e ? ts_err_message() : "ok", passes_name)) {
        char t[96];
        snprintf(t, sizeof t, "concat output%s", passes_name), check(t, &gcy, &cy, 0, TS_PREC_FP32);
        snprintf(t, sizeof t, "concat gradient of the first input%s", passes_name), check(t, &gda, &da, 0, TS_PREC_FP32);
        snprintf(t, sizeof t, "concat gradient of the second input%s", passes_name), check(t, &gdbb, &dbb, 0, TS_PREC_FP32);
    }
    ts_tensor *all[] = {&x, &y, &dy, &dx, &gx, &gy, &gdy, &gdx, &py, &pdy, &pdx, &pi, &gpy, &gpdy, &gpdx, &gpi,
                        &b, &cy, &da, &dbb, &gb, &gcy, &gda, &gdbb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* kind 0 batch norm (train), 1 batch norm (eval), 2 group norm (groups 4), 3 instance norm; relu fused or not;
 * [2, D, D + 1, D + 2, C] */
static void test_norm(int kind, int relu, int C, int D)
{
    static const char *const names[] = {"batch norm (train)", "batch norm (eval)", "group norm", "instance norm"};
    char what[96];
    snprintf(what, sizeof what, "%s%s, %d channels, %dx%dx%d%s", names[kind],
             relu ? (norm_slope > 0 ? " + leaky relu" : " + relu") : "", C, D, D + 1, D + 2, passes_name);
    const int N = 2, G = kind == 2 ? 4 : kind == 3 ? C : 1, nstat = kind <= 1 ? C : N * G;
    ts_tensor x = mk(5, (int64_t[]){N, D, D + 1, D + 2, C}, -2, 3), y = host_like(&x), dy = mk(5, x.shape, -1, 1),
              dx = host_like(&x), g = mk(1, (int64_t[]){C}, 0.5f, 1.5f), b = mk(1, (int64_t[]){C}, -0.5f, 0.5f),
              rm = mk(1, (int64_t[]){C}, -0.2f, 0.2f), rv = mk(1, (int64_t[]){C}, 0.5f, 1.5f),
              sm = mk(1, (int64_t[]){nstat}, 0, 0), si = mk(1, (int64_t[]){nstat}, 0, 0),
              dg = mk(1, (int64_t[]){C}, -0.1f, 0.1f), db = mk(1, (int64_t[]){C}, -0.1f, 0.1f);
    ts_tensor gx = up(&x), gy = up(&y), gdy = up(&dy), gdx = up(&dx), gg = up(&g), gb = up(&b), grm = up(&rm),
              grv = up(&rv), gsm = up(&sm), gsi = up(&si), gdg = up(&dg), gdb = up(&db);
    ts_norm_opts o = {1e-5f, 0.1f, G, relu, norm_slope, NULL, NULL, NULL};
    int e1, e2;
    if (kind <= 1) {
        const int train = kind == 0;
        e1 = ts_batchnorm_forward(&x, &g, &b, &rm, &rv, train, &o, &y, &sm, &si) ||
             ts_batchnorm_backward(&x, &y, &g, &b, &sm, &si, train, &o, &dy, &dx, &dg, &db);
        e2 = ts_batchnorm_forward(&gx, &gg, &gb, &grm, &grv, train, &o, &gy, &gsm, &gsi) ||
             ts_batchnorm_backward(&gx, &gy, &gg, &gb, &gsm, &gsi, train, &o, &gdy, &gdx, &gdg, &gdb) || ts_device_sync();
    } else if (kind == 2) {
        e1 = ts_groupnorm_forward(&x, &g, &b, &o, &y, &sm, &si) ||
             ts_groupnorm_backward(&x, &y, &g, &b, &sm, &si, &o, &dy, &dx, &dg, &db);
        e2 = ts_groupnorm_forward(&gx, &gg, &gb, &o, &gy, &gsm, &gsi) ||
             ts_groupnorm_backward(&gx, &gy, &gg, &gb, &gsm, &gsi, &o, &gdy, &gdx, &gdg, &gdb) || ts_device_sync();
    } else {
        e1 = ts_instancenorm_forward(&x, &g, &b, &o, &y, &sm, &si) ||
             ts_instancenorm_backward(&x, &y, &g, &b, &sm, &si, &o, &dy, &dx, &dg, &db);
        e2 = ts_instancenorm_forward(&gx, &gg, &gb, &o, &gy, &gsm, &gsi) ||
             ts_instancenorm_backward(&gx, &gy, &gg, &gb, &gsm, &gsi, &o, &gdy, &gdx, &gdg, &gdb) || ts_device_sync();
    }
    if (ts_ok(!e1 && !e2, "%s ran (%s)", what, e1 || e2 ? ts_err_message() : "ok")) {
        char t[160];
        snprintf(t, sizeof t, "%s output", what), check(t, &gy, &y, 1e-4, TS_PREC_FP32);
        snprintf(t, sizeof t, "%s saved mean", what), check(t, &gsm, &sm, 1e-4, TS_PREC_FP32);
        snprintf(t, sizeof t, "%s saved 1/std", what), check(t, &gsi, &si, 1e-4, TS_PREC_FP32);
        snprintf(t, sizeof t, "%s input gradient", what), check(t, &gdx, &dx, 1e-4, TS_PREC_FP32);
        snprintf(t, sizeof t, "%s weight gradient (accumulated)", what), check(t, &gdg, &dg, 1e-4, TS_PREC_FP32);
        snprintf(t, sizeof t, "%s bias gradient (accumulated)", what), check(t, &gdb, &db, 1e-4, TS_PREC_FP32);
        if (kind == 0) {
            snprintf(t, sizeof t, "%s running mean", what), check(t, &grm, &rm, 1e-4, TS_PREC_FP32);
            snprintf(t, sizeof t, "%s running var", what), check(t, &grv, &rv, 1e-4, TS_PREC_FP32);
        }
    }
    ts_tensor *all[] = {&x, &y, &dy, &dx, &g, &b, &rm, &rv, &sm, &si, &dg, &db,
                        &gx, &gy, &gdy, &gdx, &gg, &gb, &grm, &grv, &gsm, &gsi, &gdg, &gdb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* concatenation [2, D, D, D, ca] + [.., cb] along the channels, and back (both inputs' gradients, then each
 * alone: the other is left as it was) */
static void test_concat(int ca, int cb, int D)
{
    char what[96];
    snprintf(what, sizeof what, "concat [%d, %d] at %d^3%s", ca, cb, D, passes_name);
    ts_tensor a = mk(5, (int64_t[]){2, D, D, D, ca}, -1, 1), b = mk(5, (int64_t[]){2, D, D, D, cb}, -1, 1),
              y = mk(5, (int64_t[]){2, D, D, D, ca + cb}, 0, 0), dy = mk(5, y.shape, -1, 1), da = host_like(&a),
              db = host_like(&b), ga0 = mk(5, a.shape, -1, 1), gb0 = mk(5, b.shape, -1, 1);
    ts_tensor ga = up(&a), gb = up(&b), gy = up(&y), gdy = up(&dy), gda = up(&da), gdb = up(&db), gda1 = up(&ga0),
              gdb1 = up(&gb0);
    int e = ts_concat_forward(&a, &b, &y) || ts_concat_backward(&dy, &da, &db) || ts_concat_forward(&ga, &gb, &gy) ||
            ts_concat_backward(&gdy, &gda, &gdb) || ts_concat_backward(&gdy, &gda1, NULL) ||
            ts_concat_backward(&gdy, NULL, &gdb1) || ts_device_sync();
    if (ts_ok(!e, "%s ran (%s)", what, e ? ts_err_message() : "ok")) {
        char t[160];
        snprintf(t, sizeof t, "%s output", what), check(t, &gy, &y, 0, TS_PREC_FP32);
        snprintf(t, sizeof t, "%s gradient of the first input", what), check(t, &gda, &da, 0, TS_PREC_FP32);
        snprintf(t, sizeof t, "%s gradient of the second input", what), check(t, &gdb, &db, 0, TS_PREC_FP32);
        snprintf(t, sizeof t, "%s first gradient alone", what), check(t, &gda1, &da, 0, TS_PREC_FP32);
        snprintf(t, sizeof t, "%s second gradient alone", what), check(t, &gdb1, &db, 0, TS_PREC_FP32);
    }
    ts_tensor *all[] = {&a, &b, &y, &dy, &da, &db, &ga0, &gb0, &ga, &gb, &gy, &gdy, &gda, &gdb, &gda1, &gdb1};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* the losses: value and gradient (added to a random start) */
static void test_loss(int dice, int ignore, int weighted)
{
    char what[96];
    snprintf(what, sizeof what, "%s%s%s", dice ? "soft Dice" : "cross-entropy", ignore ? ", ignore index 3" : "",
             weighted ? ", class weights" : "");
    const int K = 3, N = 2;
    const int64_t V = 300;
    const float w[3] = {0.5f, 1.0f, 2.0f};
    ts_loss_opts o = {ignore ? 3 : -1, weighted ? w : NULL, 1e-5f, NULL, NULL};
    ts_tensor l = mk(5, (int64_t[]){N, V, 1, 1, K}, -3, 3), y = labels_host(N, V, K, ignore ? 3 : -1),
              d = mk(5, l.shape, -0.1f, 0.1f);
    ts_tensor gl = up(&l), gy = up(&y), gd = up(&d);
    double lc = 0, lg = 0;
    int e1 = dice ? ts_dice_forward_backward(&l, &y, &o, 0.5f, &lc, &d) : ts_softmax_ce_forward_backward(&l, &y, &o, 0.5f, &lc, &d);
    int e2 = dice ? ts_dice_forward_backward(&gl, &gy, &o, 0.5f, &lg, &gd)
                  : ts_softmax_ce_forward_backward(&gl, &gy, &o, 0.5f, &lg, &gd);
    if (!e2) e2 = ts_device_sync();
    if (ts_ok(!e1 && !e2, "%s ran (%s)", what, e1 || e2 ? ts_err_message() : "ok")) {
        ts_ok(fabs(lg - lc) <= 1e-5 * fabs(lc) && lc != 0, "%s loss: GPU %.9g, CPU %.9g", what, lg, lc);
        char t[160];
        snprintf(t, sizeof t, "%s logit gradient (accumulated)", what), check(t, &gd, &d, 1e-4, TS_PREC_FP32);
    }
    /* a label that is not a class: refused with the voxel */
    uint8_t bad = 7;
    ts_tensor one = ts_tensor_view(&bad, TS_UINT8, 1, (int64_t[]){1});
    ts_tensor at = gy;
    at.data = (uint8_t *)gy.data + 17;
    at.ndim = 1, at.shape[0] = 1;
    at.owns = 0;
    if (!ts_tensor_transfer(&at, &one)) {
        e2 = dice ? ts_dice_forward(&gl, &gy, &o, &lg) : ts_softmax_ce_forward(&gl, &gy, &o, &lg);
        ts_ok(e2 == TS_ERR_ARG && strstr(ts_err_message(), "label 7 at voxel 17"), "%s: a bad label is named: %s", what,
              e2 ? ts_err_message() : "(accepted)");
    }
    ts_tensor *all[] = {&l, &y, &d, &gl, &gy, &gd};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* a device tensor handed to a layer with a host tensor is refused with a message */
static void test_mixed(void)
{
    ts_tensor x = mk(5, (int64_t[]){1, 4, 4, 4, 2}, -1, 1), w = mk(5, (int64_t[]){3, 2, 3, 3, 3}, -1, 1),
              y = mk(5, (int64_t[]){1, 4, 4, 4, 3}, 0, 0);
    ts_tensor gx = up(&x);
    const int e = ts_conv3d_forward(&gx, &w, NULL, 1, 1, &y);
    ts_ok(e == TS_ERR_ARG && strstr(ts_err_message(), "device memory"),
          "a device input with host weights is refused: %s", e ? ts_err_message() : "(accepted)");
    ts_tensor_free(&x), ts_tensor_free(&w), ts_tensor_free(&y), ts_tensor_free(&gx);
}

int main(void)
{
    /* make check hides GPUs from the tests (Makefile.am): this one sees the caller's again */
    const char *gpus = getenv("TS_GPUS");
    if (gpus && !strcmp(gpus, "unset")) unsetenv("CUDA_VISIBLE_DEVICES");
    else if (gpus) setenv("CUDA_VISIBLE_DEVICES", gpus, 1);
    if (!ts_device_compiled()) {
        ts_skip_all("this build has no CUDA (configure --with-cuda): the GPU layers are not compiled");
        return 0;
    }
    if (ts_device_count() == 0) {
        char why[256];
        snprintf(why, sizeof why, "no GPU visible here (%s)", ts_device_absent_reason());
        ts_skip_all(why);
        return 0;
    }
    const ts_device *dev = NULL;
    ts_device_info info;
    if (ts_device_open(0, &dev) || ts_device_info_get(dev->id, &info)) {
        printf("1..1\nnot ok 1 - opening the GPU: %s\n", ts_err_message());
        return 1;
    }
    ts_diag("GPU %d: %s, sm_%d%d, %d SMs, %.1f GiB", dev->id, info.name, info.major, info.minor, info.sms,
            info.mem_total / 1073741824.0);
    ts_rng_init(&rng, 42, 0, 0);
    ts_nn_set_tf32(0);
    const ts_precision precs[] = {TS_PREC_FP32, TS_PREC_BF16, TS_PREC_FP16};
#ifdef TS_HAVE_CUDA
    ts_cuda_set_fewch(1);
    fewch_name = " (few channels: padded to 8)";
#endif
    test_upload();
    test_conv_s2_split(2, 4, 6, 8, 3, 5);
    test_conv_s2_split(1, 6, 4, 2, 8, 16);
    for (int i = 0; i < 3; i++) {
        const ts_precision p = precs[i];
        test_conv(2, 5, 6, 7, 3, 5, 3, 1, 1, p);     /* odd shape, few channels (the first level) */
        test_conv(1, 4, 4, 37, 16, 16, 3, 1, 1, p);  /* long rows */
        test_conv(2, 4, 4, 4, 64, 128, 3, 1, 1, p);  /* wide */
        test_conv(1, 5, 6, 7, 1, 16, 3, 1, 1, p);    /* one input channel */
        test_conv(2, 4, 5, 6, 16, 4, 1, 1, 0, p);    /* 1x1x1 head */
        test_conv(1, 7, 6, 9, 5, 6, 3, 2, 1, p);     /* strided */
        test_conv(1, 8, 8, 8, 4, 3, 2, 2, 0, p);     /* 2x2x2 stride 2 */
        test_conv(1, 6, 5, 7, 3, 4, 3, 1, 0, p);     /* no padding */
        test_convt(2, 3, 32, 16, 2, 2, p);
        test_convt(1, 4, 5, 7, 2, 2, p);
        test_convt(1, 3, 3, 4, 3, 2, p);
        test_cat(16, 16, 16, p);
        test_cat(4, 8, 6, p);
    }
#ifdef TS_HAVE_CUDA
    /* the few-channel half convolutions also through the default fallback
     * (fp32 on rounded operands); the loop above ran them padded */
    ts_cuda_set_fewch(0);
    fewch_name = " (few channels: fp32 fallback)";
    for (int i = 1; i < 3; i++) {
        test_conv(2, 5, 6, 7, 3, 5, 3, 1, 1, precs[i]);
        test_conv(1, 5, 6, 7, 1, 16, 3, 1, 1, precs[i]);
        test_conv(2, 4, 5, 6, 16, 4, 1, 1, 0, precs[i]);
        test_cat(4, 8, 6, precs[i]);
    }
    /* the transposed convolutions whose kernel equals their stride also as
     * cuBLAS GEMMs (TESSERA_CUDA_CONVT=gemm; src/nn/cuda/conv_gemm.c) */
    ts_cuda_set_convt_gemm(1);
    gemm_name = " (GEMM)";
    for (int i = 0; i < 3; i++) {
        test_convt(2, 3, 32, 16, 2, 2, precs[i]);
        test_convt(1, 4, 5, 7, 2, 2, precs[i]);   /* channels not multiples of 8 */
        test_convt(2, 2, 16, 8, 3, 3, precs[i]);  /* k = s = 3 */
        test_convt(1, 3, 3, 4, 3, 2, precs[i]);   /* k != s: still cuDNN */
    }
    ts_cuda_set_convt_gemm(0);
    /* every weight gradient as im2col + cuBLAS (TESSERA_CUDA_WGRAD=gemm),
     * few-channel half convolutions included; the im2col buffer cut to
     * 20000 bytes, so that most cases take several chunks, the last one
     * partial (3 -> 5 in fp32: 61 output voxels a chunk, 420 in 7 chunks;
     * 64 -> 128 in bf16: 5 a chunk, 128 in 26) */
    ts_cuda_set_wgrad_gemm(1, 20000);
    gemm_name = " (weight gradient GEMM)";
    for (int i = 0; i < 3; i++) {
        const ts_precision p = precs[i];
        test_conv(2, 5, 6, 7, 3, 5, 3, 1, 1, p);
        test_conv(2, 4, 4, 4, 64, 128, 3, 1, 1, p);
        test_conv(1, 5, 6, 7, 1, 16, 3, 1, 1, p);
        test_conv(2, 4, 5, 6, 16, 4, 1, 1, 0, p);
        test_conv(1, 7, 6, 9, 5, 6, 3, 2, 1, p);
        test_conv(1, 8, 8, 8, 4, 3, 2, 2, 0, p);
        test_convt(1, 3, 3, 4, 3, 2, p); /* cuDNN's transposed conv, its weight gradient by GEMM */
        test_cat(16, 16, 16, p);
    }
    ts_cuda_set_wgrad_gemm(1, 0); /* one chunk of the default size */
    test_conv(2, 5, 6, 7, 3, 5, 3, 1, 1, TS_PREC_BF16);
    ts_cuda_set_wgrad_gemm(0, 0);
    gemm_name = "";
#endif
    test_relu_pool_concat();
    for (int kind = 0; kind < 4; kind++)
        for (int relu = 0; relu < 2; relu++) test_norm(kind, relu, 8, 5);
#ifdef TS_HAVE_CUDA
    /* the norms' passes and the concatenation through the tiled kernels
     * (TESSERA_CUDA_PASSES=tiled): channel counts that divide 256 and not
     * (48: 240 threads a block), above 256 (the plain kernels), volumes of
     * many blocks; concatenations as float4 rows ([16, 16], [8, 8]) and as
     * floats ([5, 3], [6, 2]: halves not multiples of 4) */
    ts_cuda_set_passes(1);
    passes_name = " (tiled passes)";
    test_relu_pool_concat();
    for (int kind = 0; kind < 4; kind++)
        for (int relu = 0; relu < 2; relu++) test_norm(kind, relu, 8, 5);
    /* 2 x 40 x 41 x 42 voxels of 16 channels, 2 x 30 x 31 x 32 of 48: more
     * blocks than the launchers start, so the grid-stride loops go round */
    for (int kind = 0; kind < 4; kind++) test_norm(kind, 1, 16, 40);
    test_norm(0, 0, 48, 30);
    test_norm(3, 1, 48, 30);
    test_norm(0, 1, 320, 4);
    test_norm(2, 0, 320, 4);
    test_concat(16, 16, 20);
    test_concat(8, 8, 20);
    test_concat(5, 3, 9);
    test_concat(6, 2, 9);
    ts_cuda_set_passes(0);
    passes_name = "";
    test_concat(16, 16, 9);
    /* the norms' statistics on the device (TESSERA_CUDA_NORMSTATS=device),
     * with the plain and the tiled passes */
    ts_cuda_set_normstats(1);
    for (int t = 0; t < 2; t++) {
        ts_cuda_set_passes(t);
        passes_name = t ? " (statistics on the device, tiled passes)" : " (statistics on the device)";
        for (int kind = 0; kind < 4; kind++)
            for (int relu = 0; relu < 2; relu++) test_norm(kind, relu, 8, 5);
        test_norm(0, 1, 16, 40);
        test_norm(3, 1, 48, 30);
        test_norm(2, 0, 320, 4);
    }
    ts_cuda_set_normstats(0);
    ts_cuda_set_passes(0);
    passes_name = "";
    /* the fused leaky ReLU (nnU-Net's instance norm + leaky ReLU): statistics on the host, plain passes, and on
     * the device, tiled passes */
    norm_slope = 0.01f;
    for (int t = 0; t < 2; t++) {
        ts_cuda_set_normstats(t);
        ts_cuda_set_passes(t);
        passes_name = t ? " (statistics on the device, tiled passes)" : "";
        for (int kind = 0; kind < 4; kind++) test_norm(kind, 1, 8, 5);
        test_norm(3, 1, 32, 12);
    }
    norm_slope = 0.0f;
    ts_cuda_set_normstats(0);
    ts_cuda_set_passes(0);
    passes_name = "";
#endif
    for (int dice = 0; dice < 2; dice++) {
        test_loss(dice, 0, 0);
        test_loss(dice, 1, 0);
        if (!dice) test_loss(dice, 1, 1);
    }
    test_mixed();
    return ts_done();
}
