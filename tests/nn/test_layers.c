/* Layer tests: the fast convolution kernels against naive double-precision
 * references on many shapes, and a finite-difference gradient check of every
 * layer (directional derivatives of L = sum r * y for random r and random
 * directions, plus single coordinates). */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/nn/conv_impl.h" /* ts_nn_bf16_select_isa: the bf16 tests run both variants */
#include "src/nn/layers.h"
#include "src/nn/norm_impl.h" /* ts_nn_channel_affine: its 16-lane path against a naive one */
#include "src/nn/loss_impl.h" /* ts_nn_softmax16: the losses' vector softmax against double */
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "tests/nn/rand_tensor.h" /* rng, mk, MK */

static double max_rel(const float *a, const double *b, int64_t n)
{
    double m = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]) / fmax(scale, 1e-30));
    return m;
}

/* ------------------------------------------------ naive references (double) */

static void ref_conv(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int s, int p, const ts_tensor *y,
                     double *out)
{
    const int64_t N = x->shape[0], D = x->shape[1], H = x->shape[2], W = x->shape[3], C = x->shape[4];
    const int64_t OD = y->shape[1], OH = y->shape[2], OW = y->shape[3], OC = y->shape[4], k = w->shape[2];
    const float *px = x->data, *pw = w->data;
    for (int64_t n = 0; n < N; n++)
        for (int64_t od = 0; od < OD; od++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++)
                    for (int64_t co = 0; co < OC; co++) {
                        double acc = b ? ((float *)b->data)[co] : 0;
                        for (int64_t kd = 0; kd < k; kd++)
                            for (int64_t kh = 0; kh < k; kh++)
                                for (int64_t kw = 0; kw < k; kw++) {
                                    int64_t id = od * s - p + kd, ih = oh * s - p + kh, iw = ow * s - p + kw;
                                    if (id < 0 || id >= D || ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                    for (int64_t ci = 0; ci < C; ci++)
                                        acc += (double)px[(((n * D + id) * H + ih) * W + iw) * C + ci] *
                                               pw[((co * C + ci) * k + kd) * k * k + kh * k + kw];
                                }
                        out[(((n * OD + od) * OH + oh) * OW + ow) * OC + co] = acc;
                    }
}

/* conv backward references: dx, dw, db from dy */
static void ref_conv_bwd(const ts_tensor *x, const ts_tensor *w, int s, int p, const ts_tensor *dy, double *dx,
                         double *dw, double *db)
{
    const int64_t N = x->shape[0], D = x->shape[1], H = x->shape[2], W = x->shape[3], C = x->shape[4];
    const int64_t OD = dy->shape[1], OH = dy->shape[2], OW = dy->shape[3], OC = dy->shape[4], k = w->shape[2];
    const float *px = x->data, *pw = w->data, *g = dy->data;
    memset(dx, 0, sizeof(double) * ts_tensor_numel(x));
    memset(dw, 0, sizeof(double) * ts_tensor_numel(w));
    memset(db, 0, sizeof(double) * OC);
    for (int64_t n = 0; n < N; n++)
        for (int64_t od = 0; od < OD; od++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++)
                    for (int64_t co = 0; co < OC; co++) {
                        double gv = g[(((n * OD + od) * OH + oh) * OW + ow) * OC + co];
                        db[co] += gv;
                        for (int64_t kd = 0; kd < k; kd++)
                            for (int64_t kh = 0; kh < k; kh++)
                                for (int64_t kw = 0; kw < k; kw++) {
                                    int64_t id = od * s - p + kd, ih = oh * s - p + kh, iw = ow * s - p + kw;
                                    if (id < 0 || id >= D || ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                    for (int64_t ci = 0; ci < C; ci++) {
                                        int64_t xi = (((n * D + id) * H + ih) * W + iw) * C + ci;
                                        int64_t wi = ((co * C + ci) * k + kd) * k * k + kh * k + kw;
                                        dx[xi] += gv * pw[wi];
                                        dw[wi] += gv * px[xi];
                                    }
                                }
                    }
}

static void ref_convt(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int s, const ts_tensor *y,
                      double *out)
{
    const int64_t N = x->shape[0], D = x->shape[1], H = x->shape[2], W = x->shape[3], C = x->shape[4];
    const int64_t OD = y->shape[1], OH = y->shape[2], OW = y->shape[3], OC = y->shape[4], k = w->shape[2];
    const float *px = x->data, *pw = w->data;
    for (int64_t i = 0; i < ts_tensor_numel(y); i++) out[i] = b ? ((float *)b->data)[i % OC] : 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t d = 0; d < D; d++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t ww = 0; ww < W; ww++)
                    for (int64_t kd = 0; kd < k; kd++)
                        for (int64_t kh = 0; kh < k; kh++)
                            for (int64_t kw = 0; kw < k; kw++)
                                for (int64_t co = 0; co < OC; co++) {
                                    double acc = 0;
                                    for (int64_t ci = 0; ci < C; ci++)
                                        acc += (double)px[(((n * D + d) * H + h) * W + ww) * C + ci] *
                                               pw[((ci * OC + co) * k + kd) * k * k + kh * k + kw];
                                    out[(((n * OD + d * s + kd) * OH + h * s + kh) * OW + ww * s + kw) * OC + co] += acc;
                                }
}

static void test_conv_vs_ref(int N, int D, int H, int W, int C, int OC, int k, int s, int p, int bias)
{
    ts_tensor x = MK(-1, 1, N, D, H, W, C), w = MK(-0.5f, 0.5f, OC, C, k, k, k), b = MK(-1, 1, OC);
    int64_t OD = ts_conv_out_size(D, k, s, p), OH = ts_conv_out_size(H, k, s, p), OW = ts_conv_out_size(W, k, s, p);
    ts_tensor y = MK(0, 0, N, OD, OH, OW, OC), dy = MK(-1, 1, N, OD, OH, OW, OC);
    ts_tensor dx = MK(0, 0, N, D, H, W, C), dw = MK(0, 0, OC, C, k, k, k), db = MK(0, 0, OC);
    double *ry = malloc(sizeof(double) * ts_tensor_numel(&y)), *rdx = malloc(sizeof(double) * ts_tensor_numel(&x));
    double *rdw = malloc(sizeof(double) * ts_tensor_numel(&w)), *rdb = malloc(sizeof(double) * OC);
    int rc = ts_conv3d_forward(&x, &w, bias ? &b : NULL, s, p, &y);
    ref_conv(&x, &w, bias ? &b : NULL, s, p, &y, ry);
    double e = max_rel(y.data, ry, ts_tensor_numel(&y));
    ts_ok(rc == 0 && e < 2e-6, "conv3d forward %dx%dx%dx%dx%d -> %d k%d s%d p%d%s: max rel err %.2e", N, D, H, W, C, OC, k,
          s, p, bias ? " bias" : "", e);
    /* accumulate semantics: start dw, db at 1 */
    ts_tensor_fill(&dw, 1.0f);
    ts_tensor_fill(&db, 1.0f);
    rc = ts_conv3d_backward(&x, &w, s, p, &dy, &dx, &dw, &db);
    ref_conv_bwd(&x, &w, s, p, &dy, rdx, rdw, rdb);
    for (int64_t i = 0; i < ts_tensor_numel(&w); i++) rdw[i] += 1.0;
    for (int64_t i = 0; i < OC; i++) rdb[i] += 1.0;
    double ex = max_rel(dx.data, rdx, ts_tensor_numel(&x)), ew = max_rel(dw.data, rdw, ts_tensor_numel(&w)),
           eb = max_rel(db.data, rdb, OC);
    /* 5e-6: fp32 sums rounded without fused multiply-adds (a build without
     * -march=native) reached 2.2e-6 here; a wrong term is orders above */
    ts_ok(rc == 0 && ex < 5e-6 && ew < 5e-6 && eb < 5e-6, "conv3d backward same shape: dx %.2e dw %.2e db %.2e", ex, ew, eb);
    ts_tensor *all[] = {&x, &w, &b, &y, &dy, &dx, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
    free(ry);
    free(rdx);
    free(rdw);
    free(rdb);
}

/* 3x3x3 stride-1 convolutions with at most 8 output channels run two
 * voxels per vector (src/nn/conv_kernels.c, gq_tile): their outputs must be
 * the very bits of the 16-lane tiles, i.e. of the same convolution widened
 * to OC2 > 8 channels (the first OC weights and biases shared) */
static void test_conv_pairs(int N, int D, int H, int W, int C, int OC, int OC2, int p, int bias)
{
    ts_tensor x = MK(-1, 1, N, D, H, W, C), w = MK(-0.5f, 0.5f, OC, C, 3, 3, 3), b = MK(-1, 1, OC);
    ts_tensor w2 = MK(-0.5f, 0.5f, OC2, C, 3, 3, 3), b2 = MK(-1, 1, OC2);
    memcpy(w2.data, w.data, sizeof(float) * (size_t)ts_tensor_numel(&w)); /* [OC][C][3][3][3]: the first OC rows */
    memcpy(b2.data, b.data, sizeof(float) * (size_t)OC);
    const int64_t OD = ts_conv_out_size(D, 3, 1, p), OH = ts_conv_out_size(H, 3, 1, p), OW = ts_conv_out_size(W, 3, 1, p);
    ts_tensor y = MK(0, 0, N, OD, OH, OW, OC), y2 = MK(0, 0, N, OD, OH, OW, OC2);
    int rc = ts_conv3d_forward(&x, &w, bias ? &b : NULL, 1, p, &y);
    rc |= ts_conv3d_forward(&x, &w2, bias ? &b2 : NULL, 1, p, &y2);
    const float *a = y.data, *a2 = y2.data;
    int64_t diff = 0, nz = 0;
    for (int64_t v = 0; v < N * OD * OH * OW; v++)
        for (int o = 0; o < OC; o++) {
            diff += memcmp(&a[v * OC + o], &a2[v * OC2 + o], sizeof(float)) != 0;
            nz += a[v * OC + o] != 0;
        }
    ts_ok(rc == 0 && diff == 0 && nz > 0, "conv3d forward %dx%dx%dx%dx%d -> %d (pairs of voxels) p%d%s: bitwise the "
          "first %d of %d channels (%lld of %lld differ)", N, D, H, W, C, OC, p, bias ? " bias" : "", OC, OC2,
          (long long)diff, (long long)(N * OD * OH * OW * OC));
    ts_tensor *all[] = {&x, &w, &b, &w2, &b2, &y, &y2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

static void test_convt_vs_ref(int N, int D, int C, int OC, int k, int s)
{
    ts_tensor x = MK(-1, 1, N, D, D + 1, D, C), w = MK(-0.5f, 0.5f, C, OC, k, k, k), b = MK(-1, 1, OC);
    int64_t O = (D - 1) * s + k, OH = (int64_t)D * s + k;
    ts_tensor y = MK(0, 0, N, O, OH, O, OC);
    double *ry = malloc(sizeof(double) * ts_tensor_numel(&y));
    int rc = ts_convt3d_forward(&x, &w, &b, s, &y);
    ref_convt(&x, &w, &b, s, &y, ry);
    double e = max_rel(y.data, ry, ts_tensor_numel(&y));
    ts_ok(rc == 0 && e < 2e-6, "convt3d forward %d^3 x %d -> %d k%d s%d: max rel err %.2e", D, C, OC, k, s, e);
    ts_tensor_free(&x);
    ts_tensor_free(&w);
    ts_tensor_free(&b);
    ts_tensor_free(&y);
    free(ry);
}

/* convt3d with k = s = 2 (the tg2 tiles, both kw taps of a voxel at once,
 * from the bias): every output is exactly the sequential sum bias + x[0] w[0]
 * + x[1] w[1] + ... in channel order that the general transposed gather
 * computes (each product added with or without contraction, so either
 * chain's value is accepted per output), not only close to it; channel
 * counts with full and partial vectors, 1, 2 and 4 vectors a tile */
static void test_convt_k2_order(int C, int OC, int bias)
{
    const int N = 2, D = 3, H = 2, W = 11, s = 2;
    ts_tensor x = MK(-1, 1, N, D, H, W, C), w = MK(-0.5f, 0.5f, C, OC, 2, 2, 2), b = MK(-1, 1, OC);
    ts_tensor y = MK(0, 0, N, 2 * D, 2 * H, 2 * W, OC);
    int rc = ts_convt3d_forward(&x, &w, bias ? &b : NULL, s, &y);
    const float *px = x.data, *pw = w.data, *pb = b.data, *py = y.data;
    int64_t differ = 0, nz = 0;
    for (int n = 0; n < N; n++)
        for (int od = 0; od < 2 * D; od++)
            for (int oh = 0; oh < 2 * H; oh++)
                for (int ow = 0; ow < 2 * W; ow++)
                    for (int oc = 0; oc < OC; oc++) {
                        const int t = ((od % 2) * 2 + oh % 2) * 2 + ow % 2;
                        const float *xv = px + (((size_t)n * D + od / 2) * H + oh / 2) * W * C + (size_t)(ow / 2) * C;
                        float f = bias ? pb[oc] : 0.0f, m = f;
                        for (int c = 0; c < C; c++) {
                            const float wv = pw[((size_t)c * OC + oc) * 8 + t];
                            f = fmaf(xv[c], wv, f);
                            volatile float prod = xv[c] * wv; /* rounded, then added */
                            m = m + prod;
                        }
                        const float got = py[((((size_t)n * 2 * D + od) * 2 * H + oh) * 2 * W + ow) * OC + oc];
                        differ += memcmp(&got, &f, 4) != 0 && memcmp(&got, &m, 4) != 0;
                        nz += got != 0;
                    }
    ts_ok(rc == 0 && differ == 0 && nz > 0, "convt3d k2 s2 %d -> %d%s: every output the sequential sum in channel order "
          "bit for bit (%lld of %lld differ)", C, OC, bias ? " bias" : "", (long long)differ,
          (long long)ts_tensor_numel(&y));
    ts_tensor *all[] = {&x, &w, &b, &y};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* ---------------------------------------------------- bf16 convolutions */

/* the test's own round to nearest even (inputs here are normal numbers) */
static float bf16r(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* a copy of t with every value rounded to bf16 */
static ts_tensor rounded(const ts_tensor *t)
{
    ts_tensor r = mk(t->ndim, t->shape, 0, 0);
    const float *a = t->data;
    float *b = r.data;
    for (int64_t i = 0; i < ts_tensor_numel(t); i++) b[i] = bf16r(a[i]);
    return r;
}

/* transposed conv backward reference: dx, dw (db is a plain sum, not checked here) */
static void ref_convt_bwd(const ts_tensor *x, const ts_tensor *w, int s, const ts_tensor *dy, double *dx, double *dw)
{
    const int64_t N = x->shape[0], D = x->shape[1], H = x->shape[2], W = x->shape[3], C = x->shape[4];
    const int64_t OD = dy->shape[1], OH = dy->shape[2], OW = dy->shape[3], OC = dy->shape[4], k = w->shape[2];
    const float *px = x->data, *pw = w->data, *g = dy->data;
    memset(dx, 0, sizeof(double) * ts_tensor_numel(x));
    memset(dw, 0, sizeof(double) * ts_tensor_numel(w));
    for (int64_t n = 0; n < N; n++)
        for (int64_t d = 0; d < D; d++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t ww = 0; ww < W; ww++)
                    for (int64_t kd = 0; kd < k; kd++)
                        for (int64_t kh = 0; kh < k; kh++)
                            for (int64_t kw = 0; kw < k; kw++)
                                for (int64_t ci = 0; ci < C; ci++)
                                    for (int64_t co = 0; co < OC; co++) {
                                        const int64_t xi = (((n * D + d) * H + h) * W + ww) * C + ci;
                                        const int64_t wi = ((ci * OC + co) * k + kd) * k * k + kh * k + kw;
                                        const double gv = g[(((n * OD + d * s + kd) * OH + h * s + kh) * OW + ww * s + kw) * OC + co];
                                        dx[xi] += gv * pw[wi];
                                        dw[wi] += gv * px[xi];
                                    }
}

/* max |a - b| / max |b| over floats */
static double max_rel_f(const float *a, const float *b, int64_t n)
{
    double m = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]) / fmax(scale, 1e-30));
    return m;
}

/* the bf16 variants to test: emulated always, native where the CPU has
 * it, then AMX where the CPU and kernel have it (names[2]: its gathers sum
 * in another order, so it is compared with tolerances, not bitwise) */
static int bf16_variants(const char *names[3])
{
    names[0] = "emulated";
    if (ts_nn_bf16_select_isa("avx512bf16") != 0) {
        ts_diag("this CPU has no AVX512-BF16: the native bf16 kernels are not tested");
        return 1;
    }
    names[1] = "avx512bf16";
    if (ts_nn_bf16_select_isa("amx") != 0) {
        static int said;
        if (!said++) ts_diag("this CPU (or kernel) has no AMX-BF16: the AMX gathers are not tested");
        return 2;
    }
    names[2] = "amx";
    return 3;
}

/* shapes run on AMX, and of those the ones whose y, dx, dw differ from VDPBF16PS's bits */
static int amx_shapes, amx_differ[3];

/* One conv3d (or, transposed, convt3d) shape in bf16: forward, input
 * gradient and weight gradient of each variant against double references
 * on bf16-rounded operands (only fp32 summation differs: < 1e-5); the
 * variants bitwise equal; and the bf16 results off the fp32 ones by the
 * bf16 error (1e-4 .. 3e-2: the setting does change the arithmetic). */
static void test_bf16_shape(int transposed, int N, int D, int H, int W, int C, int OC, int k, int s, int p, int bias)
{
    ts_tensor x = MK(-1, 1, N, D, H, W, C), b = MK(-1, 1, OC);
    ts_tensor w = transposed ? MK(-0.5f, 0.5f, C, OC, k, k, k) : MK(-0.5f, 0.5f, OC, C, k, k, k);
    const int64_t OD = transposed ? (D - 1) * s + k : ts_conv_out_size(D, k, s, p);
    const int64_t OH = transposed ? (H - 1) * s + k : ts_conv_out_size(H, k, s, p);
    const int64_t OW = transposed ? (W - 1) * s + k : ts_conv_out_size(W, k, s, p);
    ts_tensor dy = MK(-1, 1, N, OD, OH, OW, OC), xr = rounded(&x), wr = rounded(&w), dyr = rounded(&dy);
    const int64_t ny = N * OD * OH * OW * OC, nx = ts_tensor_numel(&x), nw = ts_tensor_numel(&w);
    double *ry = malloc(sizeof(double) * ny), *rdx = malloc(sizeof(double) * nx), *rdw = malloc(sizeof(double) * nw);
    double *rdb = malloc(sizeof(double) * OC);
    ts_tensor out[3][4], f32[4]; /* y, dx, dw, db per variant; fp32 */
    const char *names[3];
    const int nvar = bf16_variants(names);
    int rc = 0;
    for (int v = 0; v <= nvar; v++) { /* v < nvar: bf16 variants; v == nvar: fp32 */
        ts_tensor *o = v < nvar ? out[v] : f32;
        o[0] = MK(0, 0, N, OD, OH, OW, OC);
        o[1] = mk(5, x.shape, 0, 0);
        o[2] = mk(5, w.shape, 1, 1); /* accumulated into */
        o[3] = MK(1, 1, OC);
        if (v < nvar) rc |= ts_nn_bf16_select_isa(names[v]);
        rc |= ts_nn_set_conv_precision(v < nvar ? TS_PREC_BF16 : TS_PREC_FP32);
        if (transposed) {
            rc |= ts_convt3d_forward(&x, &w, bias ? &b : NULL, s, &o[0]);
            rc |= ts_convt3d_backward(&x, &w, s, &dy, &o[1], &o[2], &o[3]);
        } else {
            rc |= ts_conv3d_forward(&x, &w, bias ? &b : NULL, s, p, &o[0]);
            rc |= ts_conv3d_backward(&x, &w, s, p, &dy, &o[1], &o[2], &o[3]);
        }
    }
    rc |= ts_nn_set_conv_precision(TS_PREC_FP32);
    rc |= ts_nn_bf16_select_isa("auto");
    /* references on the rounded operands (bias and its gradient: fp32) */
    if (transposed) {
        ref_convt(&xr, &wr, bias ? &b : NULL, s, &out[0][0], ry);
        ref_convt_bwd(&xr, &wr, s, &dyr, rdx, rdw);
    } else {
        ref_conv(&xr, &wr, bias ? &b : NULL, s, p, &out[0][0], ry);
        ref_conv_bwd(&xr, &wr, s, p, &dyr, rdx, rdw, rdb);
    }
    for (int64_t i = 0; i < nw; i++) rdw[i] += 1.0;
    char what[128];
    snprintf(what, sizeof what, "%s %dx%dx%dx%dx%d -> %d k%d s%d%s", transposed ? "convt3d" : "conv3d", N, D, H, W, C, OC, k, s,
             transposed ? "" : (p ? " p1" : " p0"));
    for (int v = 0; v < nvar; v++) {
        const double ey = max_rel(out[v][0].data, ry, ny), ex = max_rel(out[v][1].data, rdx, nx),
                     ew = max_rel(out[v][2].data, rdw, nw);
        ts_ok(rc == 0 && ey < 1e-5 && ex < 1e-5 && ew < 1e-5,
              "bf16 (%s) %s = double on bf16-rounded operands: y %.1e dx %.1e dw %.1e", names[v], what, ey, ex, ew);
    }
    if (nvar == 3) { /* that AMX ran: its sums' order shows in the last bits of some results */
        amx_shapes++;
        for (int t = 0; t < 3; t++) amx_differ[t] += memcmp(out[2][t].data, out[1][t].data, (size_t)ts_tensor_numel(&out[1][t]) * 4) != 0;
    }
    if (nvar >= 2) {
        int same = 1;
        for (int t = 0; t < 4; t++)
            same &= !memcmp(out[0][t].data, out[1][t].data, (size_t)ts_tensor_numel(&out[0][t]) * 4);
        ts_ok(rc == 0 && same, "bf16 %s: emulated and avx512bf16 results bitwise equal (y, dx, dw, db)", what);
    }
    /* bf16 against fp32: the rounding error of bf16 operands, and db identical (fp32 sum of dy) */
    double lo = 1, hi = 0;
    for (int t = 0; t < 3; t++) {
        const double e = max_rel_f(out[0][t].data, f32[t].data, ts_tensor_numel(&f32[t]));
        lo = fmin(lo, e);
        hi = fmax(hi, e);
    }
    const int db_same = !memcmp(out[0][3].data, f32[3].data, (size_t)OC * 4);
    ts_ok(rc == 0 && lo > 1e-4 && hi < 3e-2 && db_same,
          "bf16 %s differs from fp32 by bf16 rounding: %.1e .. %.1e relative (y, dx, dw); db as fp32", what, lo, hi);
    for (int v = 0; v <= nvar; v++)
        for (int t = 0; t < 4; t++) ts_tensor_free(v < nvar ? &out[v][t] : &f32[t]);
    ts_tensor *all[] = {&x, &w, &b, &dy, &xr, &wr, &dyr};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
    free(ry);
    free(rdx);
    free(rdw);
    free(rdb);
}

/* conv over [a, b] in bf16: against the double reference on the rounded
 * concatenation, and against concat + bf16 conv3d */
static void test_bf16_cat(int ca, int cb, int OC)
{
    const int64_t N = 2, D = 4, H = 5, W = 19;
    ts_tensor a = MK(-1, 1, N, D, H, W, ca), b = MK(-1, 1, N, D, H, W, cb), cat = MK(0, 0, N, D, H, W, ca + cb);
    ts_tensor w = MK(-0.3f, 0.3f, OC, ca + cb, 3, 3, 3), bias = MK(-1, 1, OC), dy = MK(-1, 1, N, D, H, W, OC);
    ts_tensor y1 = MK(0, 0, N, D, H, W, OC), y2 = MK(0, 0, N, D, H, W, OC), dcat = MK(0, 0, N, D, H, W, ca + cb);
    ts_tensor da = MK(0, 0, N, D, H, W, ca), db = MK(0, 0, N, D, H, W, cb), dac = MK(0, 0, N, D, H, W, ca),
              dbc = MK(0, 0, N, D, H, W, cb);
    ts_tensor dw1 = MK(0, 0, OC, ca + cb, 3, 3, 3), dw2 = MK(0, 0, OC, ca + cb, 3, 3, 3);
    int rc = ts_concat_forward(&a, &b, &cat);
    ts_tensor catr = rounded(&cat), wr = rounded(&w), dyr = rounded(&dy);
    double *ry = malloc(sizeof(double) * ts_tensor_numel(&y1)), *rdx = malloc(sizeof(double) * ts_tensor_numel(&cat));
    double *rdw = malloc(sizeof(double) * ts_tensor_numel(&w)), *rdb = malloc(sizeof(double) * OC);
    ref_conv(&catr, &wr, &bias, 1, 1, &y1, ry);
    ref_conv_bwd(&catr, &wr, 1, 1, &dyr, rdx, rdw, rdb);
    const char *names[3];
    const int nvar = bf16_variants(names);
    for (int v = 0; v < nvar; v++) {
        rc |= ts_nn_bf16_select_isa(names[v]);
        rc |= ts_nn_set_conv_precision(TS_PREC_BF16);
        ts_tensor_zero(&dw1);
        ts_tensor_zero(&dw2);
        rc |= ts_conv3d_cat_forward(&a, &b, &w, &bias, 1, 1, &y1);
        rc |= ts_conv3d_cat_backward(&a, &b, &w, 1, 1, &dy, &da, &db, &dw1, NULL);
        rc |= ts_conv3d_forward(&cat, &w, &bias, 1, 1, &y2);
        rc |= ts_conv3d_backward(&cat, &w, 1, 1, &dy, &dcat, &dw2, NULL);
        rc |= ts_concat_backward(&dcat, &dac, &dbc);
        rc |= ts_nn_set_conv_precision(TS_PREC_FP32);
        /* the reference's dx is the concatenation: compare [da, db] through dcat's layout */
        double ex = 0, sx = 0;
        const float *pa = da.data, *pb = db.data;
        for (int64_t vx = 0; vx < N * D * H * W; vx++)
            for (int c = 0; c < ca + cb; c++) {
                const double r = rdx[vx * (ca + cb) + c], got = c < ca ? pa[vx * ca + c] : pb[vx * cb + c - ca];
                ex = fmax(ex, fabs(got - r));
                sx = fmax(sx, fabs(r));
            }
        ex /= fmax(sx, 1e-30);
        const double ey = max_rel(y1.data, ry, ts_tensor_numel(&y1)), ew = max_rel(dw1.data, rdw, ts_tensor_numel(&w));
        const double ec = fmax(fmax(max_rel_f(y1.data, y2.data, ts_tensor_numel(&y1)), max_rel_f(dw1.data, dw2.data, ts_tensor_numel(&w))),
                               fmax(max_rel_f(da.data, dac.data, ts_tensor_numel(&da)), max_rel_f(db.data, dbc.data, ts_tensor_numel(&db))));
        ts_ok(rc == 0 && ey < 1e-5 && ex < 1e-5 && ew < 1e-5 && ec < 1e-6,
              "bf16 (%s) conv over [a (%d), b (%d)] -> %d = double on rounded operands: y %.1e dx %.1e dw %.1e; = concat + conv %.1e",
              names[v], ca, cb, OC, ey, ex, ew, ec);
    }
    rc |= ts_nn_bf16_select_isa("auto");
    ts_tensor *all[] = {&a, &b, &cat, &w, &bias, &dy, &y1, &y2, &dcat, &da, &db, &dac, &dbc, &dw1, &dw2, &catr, &wr, &dyr};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
    free(ry);
    free(rdx);
    free(rdw);
    free(rdb);
}

/* bf16 results do not depend on the thread count (fixed items and chunks,
 * as fp32): conv, conv over a concatenation and transposed conv, forward
 * and backward, with 1, 2, 3 and 5 threads, bitwise */
static void test_bf16_threads(void)
{
#ifdef _OPENMP
    const int nt0 = omp_get_max_threads();
    ts_tensor x = MK(-1, 1, 2, 6, 17, 40, 8), xb = MK(-1, 1, 2, 6, 17, 40, 8), w = MK(-0.3f, 0.3f, 20, 16, 3, 3, 3);
    ts_tensor b = MK(-1, 1, 20), dy = MK(-1, 1, 2, 6, 17, 40, 20), wt = MK(-0.3f, 0.3f, 8, 6, 2, 2, 2);
    ts_tensor dyt = MK(-1, 1, 2, 12, 34, 80, 6);
    ts_tensor out[4][7];
    int rc = ts_nn_set_conv_precision(TS_PREC_BF16), same = 1;
    const int threads[4] = {1, 2, 3, 5};
    for (int i = 0; i < 4; i++) {
        omp_set_num_threads(threads[i]);
        ts_tensor *o = out[i];
        o[0] = MK(0, 0, 2, 6, 17, 40, 20);
        o[1] = MK(0, 0, 2, 6, 17, 40, 8);
        o[2] = MK(0, 0, 2, 6, 17, 40, 8);
        o[3] = MK(0, 0, 20, 16, 3, 3, 3);
        o[4] = MK(0, 0, 2, 12, 34, 80, 6);
        o[5] = MK(0, 0, 2, 6, 17, 40, 8);
        o[6] = MK(0, 0, 8, 6, 2, 2, 2);
        rc |= ts_conv3d_cat_forward(&x, &xb, &w, &b, 1, 1, &o[0]);
        rc |= ts_conv3d_cat_backward(&x, &xb, &w, 1, 1, &dy, &o[1], &o[2], &o[3], NULL);
        rc |= ts_convt3d_forward(&x, &wt, NULL, 2, &o[4]);
        rc |= ts_convt3d_backward(&x, &wt, 2, &dyt, &o[5], &o[6], NULL);
        if (i)
            for (int t = 0; t < 7; t++) same &= !memcmp(o[t].data, out[0][t].data, (size_t)ts_tensor_numel(&o[t]) * 4);
    }
    omp_set_num_threads(nt0);
    rc |= ts_nn_set_conv_precision(TS_PREC_FP32);
    ts_ok(rc == 0 && same, "bf16 (%s) conv over a concatenation and transposed conv, forward and backward: bitwise the same with 1, 2, 3, 5 threads",
          ts_nn_bf16_isa());
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < 7; t++) ts_tensor_free(&out[i][t]);
    ts_tensor *all[] = {&x, &xb, &w, &b, &dy, &wt, &dyt};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
#endif
}

/* the switch: default fp32, bad values refused, the ISA names */
static void test_bf16_switch(void)
{
    int ok = ts_nn_conv_precision() == TS_PREC_FP32;
    ok &= ts_nn_set_conv_precision((ts_precision)7) == TS_ERR_ARG && ts_nn_conv_precision() == TS_PREC_FP32;
    ok &= ts_nn_set_conv_precision(TS_PREC_BF16) == 0 && ts_nn_conv_precision() == TS_PREC_BF16;
    ok &= ts_nn_set_conv_precision(TS_PREC_FP16) == 0 && ts_nn_conv_precision() == TS_PREC_FP16;
    ok &= ts_nn_set_conv_precision(TS_PREC_FP32) == 0 && ts_nn_conv_precision() == TS_PREC_FP32;
    ok &= ts_nn_bf16_select_isa("emulated") == 0 && !strcmp(ts_nn_bf16_isa(), "emulated");
    ok &= ts_nn_bf16_select_isa("fp8") == TS_ERR_ARG && !strcmp(ts_nn_bf16_isa(), "emulated");
    ok &= ts_nn_bf16_select_isa("auto") == 0;
    const char *isa = ts_nn_bf16_isa();
    ok &= !strcmp(isa, "amx") || !strcmp(isa, "avx512bf16") || !strcmp(isa, "emulated");
    ts_ok(ok, "conv precision: fp32 by default, bf16, fp16 and back, bad values refused; bf16 kernels here: %s", isa);
}

/* ---------------------------------------------------- fp16 convolutions */

/* the reference rounding: the compiler's own conversion to _Float16 (IEEE
 * binary16, ties to even, overflow to inf, subnormals); where the compiler
 * has no _Float16 (clang 14 on x86), the CPU's F16C conversion, rounding to
 * nearest even */
#ifdef __FLT16_MAX__
static float fp16r(float f) { return (float)(_Float16)f; }
#elif defined(__F16C__)
#include <immintrin.h>
static float fp16r(float f) { return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }
#else
#error "no reference fp16 conversion: a compiler with _Float16, or a build for a CPU with F16C"
#endif

static ts_tensor rounded16(const ts_tensor *t)
{
    ts_tensor r = mk(t->ndim, t->shape, 0, 0);
    const float *a = t->data;
    float *b = r.data;
    for (int64_t i = 0; i < ts_tensor_numel(t); i++) b[i] = fp16r(a[i]);
    return r;
}

/* ts_nn_fp16_round against _Float16 on the edges of half's range and on
 * random values over every exponent */
static void test_fp16_round(void)
{
    static const float edge[] = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e5f, 3.4e38f,
                                 0x1p-14f, 0x1.ffcp-15f, 0x1p-24f, 0x1p-25f, 0x1.0001p-25f, 0x1.8p-24f, 0x1p-26f,
                                 6e-8f, -6e-8f, 0x1p-149f, 1.0009765625f, 1.00048828125f, 1.00146484375f,
                                 2047.5f, 2048.5f, 4097.0f};
    int bad = 0;
    uint64_t st = 12345;
    for (int i = 0; i < 200000 + (int)(sizeof edge / sizeof *edge); i++) {
        float f;
        if (i < (int)(sizeof edge / sizeof *edge)) {
            f = edge[i];
        } else {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t u = (uint32_t)(st >> 32);
            memcpy(&f, &u, 4);
            if (isnan(f)) continue;
        }
        const float a = ts_nn_fp16_round(f), b = fp16r(f);
        if (memcmp(&a, &b, 4)) {
            if (bad++ < 3) ts_diag("fp16 rounding of %a: %a, _Float16 gives %a", f, a, b);
        }
    }
    const float qn = ts_nn_fp16_round(NAN);
    ts_ok(bad == 0 && isnan(qn) && isinf(ts_nn_fp16_round(65520.0f)) && ts_nn_fp16_round(65519.0f) == 65504.0f,
          "fp16 rounding = _Float16 conversion on 200k random floats and the edges (65504, 65520 -> inf, subnormals, NaN)");
}

/* One conv3d (or convt3d) shape in fp16: forward, input and weight
 * gradients against double references on fp16-rounded operands (< 1e-5),
 * and off fp32 by the fp16 rounding (1e-6 .. 3e-3), db as fp32. */
static void test_fp16_shape(int transposed, int N, int D, int H, int W, int C, int OC, int k, int s, int p, int bias)
{
    ts_tensor x = MK(-1, 1, N, D, H, W, C), b = MK(-1, 1, OC);
    ts_tensor w = transposed ? MK(-0.5f, 0.5f, C, OC, k, k, k) : MK(-0.5f, 0.5f, OC, C, k, k, k);
    const int64_t OD = transposed ? (D - 1) * s + k : ts_conv_out_size(D, k, s, p);
    const int64_t OH = transposed ? (H - 1) * s + k : ts_conv_out_size(H, k, s, p);
    const int64_t OW = transposed ? (W - 1) * s + k : ts_conv_out_size(W, k, s, p);
    ts_tensor dy = MK(-1, 1, N, OD, OH, OW, OC), xr = rounded16(&x), wr = rounded16(&w), dyr = rounded16(&dy);
    const int64_t ny = N * OD * OH * OW * OC, nx = ts_tensor_numel(&x), nw = ts_tensor_numel(&w);
    double *ry = malloc(sizeof(double) * ny), *rdx = malloc(sizeof(double) * nx), *rdw = malloc(sizeof(double) * nw);
    double *rdb = malloc(sizeof(double) * OC);
    ts_tensor o16[4], f32[4];
    int rc = 0;
    for (int v = 0; v < 2; v++) {
        ts_tensor *o = v == 0 ? o16 : f32;
        o[0] = MK(0, 0, N, OD, OH, OW, OC);
        o[1] = mk(5, x.shape, 0, 0);
        o[2] = mk(5, w.shape, 1, 1);
        o[3] = MK(1, 1, OC);
        rc |= ts_nn_set_conv_precision(v == 0 ? TS_PREC_FP16 : TS_PREC_FP32);
        if (transposed) {
            rc |= ts_convt3d_forward(&x, &w, bias ? &b : NULL, s, &o[0]);
            rc |= ts_convt3d_backward(&x, &w, s, &dy, &o[1], &o[2], &o[3]);
        } else {
            rc |= ts_conv3d_forward(&x, &w, bias ? &b : NULL, s, p, &o[0]);
            rc |= ts_conv3d_backward(&x, &w, s, p, &dy, &o[1], &o[2], &o[3]);
        }
    }
    rc |= ts_nn_set_conv_precision(TS_PREC_FP32);
    if (transposed) {
        ref_convt(&xr, &wr, bias ? &b : NULL, s, &o16[0], ry);
        ref_convt_bwd(&xr, &wr, s, &dyr, rdx, rdw);
    } else {
        ref_conv(&xr, &wr, bias ? &b : NULL, s, p, &o16[0], ry);
        ref_conv_bwd(&xr, &wr, s, p, &dyr, rdx, rdw, rdb);
    }
    for (int64_t i = 0; i < nw; i++) rdw[i] += 1.0;
    char what[128];
    snprintf(what, sizeof what, "%s %dx%dx%dx%dx%d -> %d k%d s%d%s", transposed ? "convt3d" : "conv3d", N, D, H, W, C, OC, k, s,
             transposed ? "" : (p ? " p1" : " p0"));
    const double ey = max_rel(o16[0].data, ry, ny), ex = max_rel(o16[1].data, rdx, nx), ew = max_rel(o16[2].data, rdw, nw);
    ts_ok(rc == 0 && ey < 1e-5 && ex < 1e-5 && ew < 1e-5, "fp16 %s = double on fp16-rounded operands: y %.1e dx %.1e dw %.1e",
          what, ey, ex, ew);
    double lo = 1, hi = 0;
    for (int t = 0; t < 3; t++) {
        const double e = max_rel_f(o16[t].data, f32[t].data, ts_tensor_numel(&f32[t]));
        lo = fmin(lo, e);
        hi = fmax(hi, e);
    }
    const int db_same = !memcmp(o16[3].data, f32[3].data, (size_t)OC * 4);
    ts_ok(rc == 0 && lo > 1e-6 && hi < 3e-3 && db_same,
          "fp16 %s differs from fp32 by fp16 rounding: %.1e .. %.1e relative (y, dx, dw); db as fp32", what, lo, hi);
    for (int t = 0; t < 4; t++) {
        ts_tensor_free(&o16[t]);
        ts_tensor_free(&f32[t]);
    }
    ts_tensor *all[] = {&x, &w, &b, &dy, &xr, &wr, &dyr};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
    free(ry);
    free(rdx);
    free(rdw);
    free(rdb);
}

/* fp16's range: an input of 70000 (beyond 65504) is inf in fp16, finite in
 * fp32 and bf16; an output gradient of 1e-8 (below half's smallest
 * subnormal / 2) contributes nothing to the fp16 weight gradient */
static void test_fp16_range(void)
{
    ts_tensor x = MK(-1, 1, 1, 4, 4, 4, 2), w = MK(-0.5f, 0.5f, 3, 2, 3, 3, 3), y = MK(0, 0, 1, 4, 4, 4, 3);
    ts_tensor dy = MK(0, 0, 1, 4, 4, 4, 3), dw = MK(0, 0, 3, 2, 3, 3, 3);
    ((float *)x.data)[2 * (4 * 4 * 1 + 4 * 1 + 1)] = 70000.0f; /* voxel (1,1,1) channel 0 */
    int rc = 0, inf16 = 0, fin[2] = {1, 1};
    const ts_precision pr[3] = {TS_PREC_FP16, TS_PREC_FP32, TS_PREC_BF16};
    for (int v = 0; v < 3; v++) {
        rc |= ts_nn_set_conv_precision(pr[v]);
        rc |= ts_conv3d_forward(&x, &w, NULL, 1, 1, &y);
        for (int64_t i = 0; i < ts_tensor_numel(&y); i++) {
            const float f = ((float *)y.data)[i];
            if (v == 0) inf16 += isinf(f) ? 1 : 0;
            else fin[v - 1] &= isfinite(f);
        }
    }
    for (int64_t i = 0; i < ts_tensor_numel(&dy); i++) ((float *)dy.data)[i] = 1e-8f;
    ((float *)x.data)[2 * (4 * 4 * 1 + 4 * 1 + 1)] = 1.0f;
    rc |= ts_nn_set_conv_precision(TS_PREC_FP16);
    rc |= ts_conv3d_backward(&x, &w, 1, 1, &dy, NULL, &dw, NULL);
    double m16 = 0;
    for (int64_t i = 0; i < ts_tensor_numel(&dw); i++) m16 = fmax(m16, fabs(((float *)dw.data)[i]));
    ts_tensor_zero(&dw);
    rc |= ts_nn_set_conv_precision(TS_PREC_FP32);
    rc |= ts_conv3d_backward(&x, &w, 1, 1, &dy, NULL, &dw, NULL);
    double m32 = 0;
    for (int64_t i = 0; i < ts_tensor_numel(&dw); i++) m32 = fmax(m32, fabs(((float *)dw.data)[i]));
    ts_ok(rc == 0 && inf16 > 0 && fin[0] && fin[1] && m16 == 0 && m32 > 0,
          "fp16 range: 70000 in x gives %d inf outputs in fp16, none in fp32 or bf16; dy = 1e-8 underflows to a zero "
          "weight gradient in fp16 (fp32: %.1e)", inf16, m32);
    ts_tensor *all[] = {&x, &w, &y, &dy, &dw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* ---------------------------------------------------- finite differences */

typedef struct fd_case fd_case;
struct fd_case {
    int (*fwd)(fd_case *c, ts_tensor *y); /* y from the inputs */
    int (*bwd)(fd_case *c, const ts_tensor *dy); /* fills grads */
    ts_tensor *in[4], *grad[4];
    const char *names[4];
    ts_tensor y; /* output (or [1] holding the loss) */
    void *extra;
    int k, s, p, train, groups;
    float slope;
    ts_tensor *t[8]; /* layer-specific tensors */
    ts_loss_opts lo;
};

static double proj(const ts_tensor *y, const ts_tensor *r)
{
    double s = 0;
    const float *a = y->data, *b = r->data;
    for (int64_t i = 0; i < ts_tensor_numel(y); i++) s += (double)a[i] * b[i];
    return s;
}

/* checks every input's gradient along 3 random directions and 4 coordinates */
static void fd_check(fd_case *c, const char *what, float eps, double tol)
{
    ts_tensor r = mk(c->y.ndim, c->y.shape, -1, 1);
    int rc = c->fwd(c, &c->y);
    for (int i = 0; i < 4 && c->grad[i]; i++) ts_tensor_zero(c->grad[i]);
    rc = rc ? rc : c->bwd(c, &r);
    if (rc) {
        ts_ok(0, "%s: forward/backward failed: %s", what, ts_err_message());
        ts_tensor_free(&r);
        return;
    }
    for (int i = 0; i < 4 && c->in[i]; i++) {
        ts_tensor *x = c->in[i];
        const int64_t n = ts_tensor_numel(x);
        float *px = x->data, *pg = c->grad[i]->data;
        float *save = malloc(sizeof(float) * n), *v = malloc(sizeof(float) * n);
        memcpy(save, px, sizeof(float) * n);
        double worst = 0;
        for (int trial = 0; trial < 7; trial++) {
            double an = 0;
            if (trial < 3) {
                for (int64_t j = 0; j < n; j++) v[j] = ts_rng_uniformf(&rng) * 2 - 1;
            } else {
                memset(v, 0, sizeof(float) * n);
                v[ts_rng_below(&rng, (uint64_t)n)] = 1;
            }
            for (int64_t j = 0; j < n; j++) an += (double)pg[j] * v[j];
            for (int64_t j = 0; j < n; j++) px[j] = save[j] + eps * v[j];
            c->fwd(c, &c->y);
            double lp = proj(&c->y, &r);
            for (int64_t j = 0; j < n; j++) px[j] = save[j] - eps * v[j];
            c->fwd(c, &c->y);
            double lm = proj(&c->y, &r);
            memcpy(px, save, sizeof(float) * n);
            double fd = (lp - lm) / (2.0 * eps);
            double scale = 0;
            for (int64_t j = 0; j < n; j++) scale = fmax(scale, fabs(pg[j]));
            double err = fabs(fd - an) / fmax(fmax(fabs(an), fabs(fd)), scale + 1e-12);
            worst = fmax(worst, err);
        }
        ts_ok(worst < tol, "%s: d/d%s finite differences, worst rel err %.2e (tol %.0e)", what, c->names[i], worst, tol);
        free(save);
        free(v);
    }
    ts_tensor_free(&r);
}

/* conv */
static int conv_f(fd_case *c, ts_tensor *y) { return ts_conv3d_forward(c->in[0], c->in[1], c->in[2], c->s, c->p, y); }
static int conv_b(fd_case *c, const ts_tensor *dy)
{
    return ts_conv3d_backward(c->in[0], c->in[1], c->s, c->p, dy, c->grad[0], c->grad[1], c->grad[2]);
}
static void fd_conv(int C, int OC, int D, int k, int s, int p)
{
    ts_tensor x = MK(-1, 1, 2, D, D - 1, D + 1, C), w = MK(-0.5f, 0.5f, OC, C, k, k, k), b = MK(-1, 1, OC);
    ts_tensor gx = MK(0, 0, 2, D, D - 1, D + 1, C), gw = MK(0, 0, OC, C, k, k, k), gb = MK(0, 0, OC);
    fd_case c = {conv_f, conv_b, {&x, &w, &b}, {&gx, &gw, &gb}, {"x", "w", "b"}, .s = s, .p = p};
    ts_tensor_alloc(&c.y, TS_FLOAT32, 5,
                    (int64_t[]){2, ts_conv_out_size(D, k, s, p), ts_conv_out_size(D - 1, k, s, p), ts_conv_out_size(D + 1, k, s, p), OC});
    char what[96];
    snprintf(what, sizeof what, "conv3d %d->%d k%d s%d p%d", C, OC, k, s, p);
    fd_check(&c, what, 1e-2f, 1e-3);
    ts_tensor *all[] = {&x, &w, &b, &gx, &gw, &gb, &c.y};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* transposed conv */
static int convt_f(fd_case *c, ts_tensor *y) { return ts_convt3d_forward(c->in[0], c->in[1], c->in[2], c->s, y); }
static int convt_b(fd_case *c, const ts_tensor *dy)
{
    return ts_convt3d_backward(c->in[0], c->in[1], c->s, dy, c->grad[0], c->grad[1], c->grad[2]);
}
static void fd_convt(int C, int OC, int D, int k, int s)
{
    ts_tensor x = MK(-1, 1, 2, D, D + 1, D, C), w = MK(-0.5f, 0.5f, C, OC, k, k, k), b = MK(-1, 1, OC);
    ts_tensor gx = MK(0, 0, 2, D, D + 1, D, C), gw = MK(0, 0, C, OC, k, k, k), gb = MK(0, 0, OC);
    fd_case c = {convt_f, convt_b, {&x, &w, &b}, {&gx, &gw, &gb}, {"x", "w", "b"}, .s = s};
    ts_tensor_alloc(&c.y, TS_FLOAT32, 5, (int64_t[]){2, (D - 1) * s + k, (int64_t)D * s + k, (D - 1) * s + k, OC});
    char what[96];
    snprintf(what, sizeof what, "convt3d %d->%d k%d s%d", C, OC, k, s);
    fd_check(&c, what, 1e-2f, 1e-3);
    ts_tensor *all[] = {&x, &w, &b, &gx, &gw, &gb, &c.y};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* max-pool: inputs are a shuffled grid of well-separated values (no near-ties) */
static int pool_f(fd_case *c, ts_tensor *y) { return ts_maxpool3d_forward(c->in[0], c->k, y, c->t[0]); }
static int pool_b(fd_case *c, const ts_tensor *dy) { return ts_maxpool3d_backward(dy, c->t[0], c->k, c->grad[0]); }
static void fd_pool(int k)
{
    int64_t D = 2 * k, C = 3;
    ts_tensor x = MK(0, 0, 2, D, D, D, C), gx = MK(0, 0, 2, D, D, D, C), idx;
    int64_t n = ts_tensor_numel(&x), *perm = malloc(sizeof(int64_t) * n);
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    ts_rng_shuffle(&rng, perm, n);
    for (int64_t i = 0; i < n; i++) ((float *)x.data)[i] = (float)perm[i] * 0.1f;
    free(perm);
    ts_tensor_alloc(&idx, TS_UINT8, 5, (int64_t[]){2, 2, 2, 2, C});
    fd_case c = {pool_f, pool_b, {&x}, {&gx}, {"x"}, .k = k, .t = {&idx}};
    ts_tensor_alloc(&c.y, TS_FLOAT32, 5, (int64_t[]){2, 2, 2, 2, C});
    char what[64];
    snprintf(what, sizeof what, "maxpool3d k%d", k);
    fd_check(&c, what, 1e-2f, 1e-3);
    ts_tensor_free(&x);
    ts_tensor_free(&gx);
    ts_tensor_free(&idx);
    ts_tensor_free(&c.y);
}

/* conv over [a, b] = concat then conv, forward and backward */
static void test_conv_cat(int ca, int cb, int OC)
{
    const int64_t N = 2, D = 4, H = 5, W = 19;
    ts_tensor a = MK(-1, 1, N, D, H, W, ca), b = MK(-1, 1, N, D, H, W, cb), cat = MK(0, 0, N, D, H, W, ca + cb);
    ts_tensor w = MK(-0.3f, 0.3f, OC, ca + cb, 3, 3, 3), bias = MK(-1, 1, OC), y1 = MK(0, 0, N, D, H, W, OC),
              y2 = MK(0, 0, N, D, H, W, OC), dy = MK(-1, 1, N, D, H, W, OC);
    ts_tensor dcat = MK(0, 0, N, D, H, W, ca + cb), da1 = MK(0, 0, N, D, H, W, ca), db1 = MK(0, 0, N, D, H, W, cb),
              da2 = MK(0, 0, N, D, H, W, ca), db2 = MK(0, 0, N, D, H, W, cb);
    ts_tensor dw1 = MK(0, 0, OC, ca + cb, 3, 3, 3), dw2 = MK(0, 0, OC, ca + cb, 3, 3, 3), dbi1 = MK(0, 0, OC), dbi2 = MK(0, 0, OC);
    int rc = ts_concat_forward(&a, &b, &cat);
    rc |= ts_conv3d_forward(&cat, &w, &bias, 1, 1, &y1);
    rc |= ts_conv3d_backward(&cat, &w, 1, 1, &dy, &dcat, &dw1, &dbi1);
    rc |= ts_concat_backward(&dcat, &da1, &db1);
    rc |= ts_conv3d_cat_forward(&a, &b, &w, &bias, 1, 1, &y2);
    rc |= ts_conv3d_cat_backward(&a, &b, &w, 1, 1, &dy, &da2, &db2, &dw2, &dbi2);
    double e = 0;
    const ts_tensor *p1[] = {&y1, &da1, &db1, &dw1, &dbi1}, *p2[] = {&y2, &da2, &db2, &dw2, &dbi2};
    for (int t = 0; t < 5; t++) {
        double mx = 0, d = 0;
        for (int64_t i = 0; i < ts_tensor_numel(p1[t]); i++) {
            mx = fmax(mx, fabs(((float *)p1[t]->data)[i]));
            d = fmax(d, fabs(((float *)p1[t]->data)[i] - ((float *)p2[t]->data)[i]));
        }
        e = fmax(e, d / fmax(mx, 1e-30));
    }
    /* in place: input gradients over the inputs themselves */
    ts_tensor_zero(&dw2);
    rc |= ts_conv3d_cat_backward(&a, &b, &w, 1, 1, &dy, &a, &b, &dw2, NULL);
    double e2 = 0;
    for (int64_t i = 0; i < ts_tensor_numel(&a); i++) e2 = fmax(e2, fabs(((float *)a.data)[i] - ((float *)da1.data)[i]));
    for (int64_t i = 0; i < ts_tensor_numel(&dw1); i++) e2 = fmax(e2, fabs(((float *)dw2.data)[i] - ((float *)dw1.data)[i]));
    ts_ok(rc == 0 && e < 1e-6 && e2 < 1e-4, "conv3d over [a (%d), b (%d)] -> %d = concat + conv3d: max rel diff %.1e (in place %.1e)",
          ca, cb, OC, e, e2);
    ts_tensor *all[] = {&a, &b, &cat, &w, &bias, &y1, &y2, &dy, &dcat, &da1, &db1, &da2, &db2, &dw1, &dw2, &dbi1, &dbi2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* max-pool with ties and NaNs, C channels (20: the 16-lane and scalar paths; 8, 28: the 8-lane one), against a naive scan */
static void test_pool_ties(int64_t C)
{
    ts_tensor x = MK(0, 0, 2, 4, 4, 6, C), y = MK(0, 0, 2, 2, 2, 3, C), dy = MK(-1, 1, 2, 2, 2, 3, C), dx = MK(0, 0, 2, 4, 4, 6, C);
    ts_tensor idx;
    ts_tensor_alloc(&idx, TS_UINT8, 5, (int64_t[]){2, 2, 2, 3, C});
    float *p = x.data;
    for (int64_t i = 0; i < ts_tensor_numel(&x); i++) p[i] = (float)ts_rng_below(&rng, 3); /* many ties */
    for (int i = 0; i < 12; i++) p[ts_rng_below(&rng, (uint64_t)ts_tensor_numel(&x))] = NAN;
    int rc = ts_maxpool3d_forward(&x, 2, &y, &idx);
    rc |= ts_maxpool3d_backward(&dy, &idx, 2, &dx);
    int bad = 0;
    double *want_dx = calloc((size_t)ts_tensor_numel(&x), sizeof(double));
    for (int64_t n = 0; n < 2; n++)
        for (int64_t od = 0; od < 2; od++)
            for (int64_t oh = 0; oh < 2; oh++)
                for (int64_t ow = 0; ow < 3; ow++)
                    for (int64_t c = 0; c < C; c++) {
                        float m = 0;
                        int at = -1, t = 0;
                        int64_t pos = 0;
                        for (int kd = 0; kd < 2; kd++)
                            for (int kh = 0; kh < 2; kh++)
                                for (int kw = 0; kw < 2; kw++, t++) {
                                    int64_t i = (((n * 4 + 2 * od + kd) * 4 + 2 * oh + kh) * 6 + 2 * ow + kw) * C + c;
                                    if (at < 0 || p[i] > m || isnan(p[i])) {
                                        m = p[i];
                                        at = t;
                                        pos = i;
                                    }
                                }
                        int64_t o = (((n * 2 + od) * 2 + oh) * 3 + ow) * C + c;
                        float got = ((float *)y.data)[o];
                        if (((uint8_t *)idx.data)[o] != at || !(got == m || (isnan(got) && isnan(m)))) bad++;
                        want_dx[pos] = ((float *)dy.data)[o];
                    }
    for (int64_t i = 0; i < ts_tensor_numel(&x); i++)
        if (((float *)dx.data)[i] != (float)want_dx[i]) bad++;
    ts_ok(rc == 0 && bad == 0, "maxpool3d, %lld channels with ties and NaNs: first maximum, later NaN wins, gradient routed (%d wrong)",
          (long long)C, bad);
    free(want_dx);
    ts_tensor *all[] = {&x, &y, &dy, &dx, &idx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* norms: t[0], t[1] saved statistics, t[2], t[3] running stats */
static ts_norm_opts nopt(int groups, int relu) { return (ts_norm_opts){.eps = 1e-5f, .momentum = 0.1f, .groups = groups, .relu = relu}; }
static int bn_f(fd_case *c, ts_tensor *y)
{
    ts_norm_opts o = nopt(0, c->k);
    return ts_batchnorm_forward(c->in[0], c->in[1], c->in[2], c->t[2], c->t[3], c->train, &o, y, c->t[0], c->t[1]);
}
static int bn_b(fd_case *c, const ts_tensor *dy)
{
    ts_norm_opts o = nopt(0, c->k);
    return ts_batchnorm_backward(c->in[0], &c->y, c->in[1], c->in[2], c->t[0], c->t[1], c->train, &o, dy, c->grad[0], c->grad[1],
                                 c->grad[2]);
}
static int gn_f(fd_case *c, ts_tensor *y)
{
    ts_norm_opts o = nopt(c->groups, c->k);
    return c->groups ? ts_groupnorm_forward(c->in[0], c->in[1], c->in[2], &o, y, c->t[0], c->t[1])
                     : ts_instancenorm_forward(c->in[0], c->in[1], c->in[2], &o, y, c->t[0], c->t[1]);
}
static int gn_b(fd_case *c, const ts_tensor *dy)
{
    ts_norm_opts o = nopt(c->groups, c->k);
    return c->groups ? ts_groupnorm_backward(c->in[0], &c->y, c->in[1], c->in[2], c->t[0], c->t[1], &o, dy, c->grad[0], c->grad[1],
                                             c->grad[2])
                     : ts_instancenorm_backward(c->in[0], &c->y, c->in[1], c->in[2], c->t[0], c->t[1], &o, dy, c->grad[0],
                                                c->grad[1], c->grad[2]);
}
/* relu: norm with the fused ReLU (fd_check runs the forward before backward, so c->y holds the output) */
static void fd_norm(const char *what, int kind, int train, int groups, int relu)
{
    const int64_t C = 6, N = 2;
    ts_tensor x = MK(-2, 3, N, 3, 4, 5, C), g = MK(0.5f, 1.5f, C), b = MK(-1, 1, C);
    ts_tensor gx = MK(0, 0, N, 3, 4, 5, C), gg = MK(0, 0, C), gb = MK(0, 0, C);
    int64_t ns = kind == 0 ? C : N * (groups ? groups : C);
    ts_tensor sm = MK(0, 0, ns), si = MK(0, 0, ns), rm = MK(-0.5f, 0.5f, C), rv = MK(0.5f, 2, C);
    fd_case c = {kind == 0 ? bn_f : gn_f, kind == 0 ? bn_b : gn_b, {&x, &g, &b}, {&gx, &gg, &gb}, {"x", "gamma", "beta"},
                 .train = train, .groups = groups, .k = relu, .t = {&sm, &si, &rm, &rv}};
    ts_tensor_alloc(&c.y, TS_FLOAT32, 5, x.shape);
    fd_check(&c, what, 4e-3f, 2e-3);
    ts_tensor *all[] = {&x, &g, &b, &gx, &gg, &gb, &sm, &si, &rm, &rv, &c.y};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* group (groups > 0) or instance norm, forward (fwd = 1) or backward */
static int gn_any(int fwd, int groups, const ts_tensor *x, const ts_tensor *g, const ts_tensor *b, const ts_tensor *yb,
                  const ts_norm_opts *o, ts_tensor *y, ts_tensor *sm, ts_tensor *si, const ts_tensor *dy, ts_tensor *dx,
                  ts_tensor *dg, ts_tensor *db)
{
    if (fwd)
        return groups ? ts_groupnorm_forward(x, g, b, o, y, sm, si) : ts_instancenorm_forward(x, g, b, o, y, sm, si);
    return groups ? ts_groupnorm_backward(x, yb, g, b, sm, si, o, dy, dx, dg, db)
                  : ts_instancenorm_backward(x, yb, g, b, sm, si, o, dy, dx, dg, db);
}

/* The fused norm + ReLU (slope 0) or leaky ReLU (slope > 0) against the
 * composition of the separately checked layers (finite differences across
 * the kink are unreliable): forward = relu(norm(x)); backward = norm
 * backward of relu backward; the same values (every output, input gradient
 * and parameter gradient equal, not only close), for a channel count with
 * the vector passes (C = 16) and one without (C = 6). */
static void fused_norm(const char *what, int kind, int train, int groups, int64_t C, float slope)
{
    const int64_t N = 2;
    ts_tensor x = MK(-2, 3, N, 3, 4, 5, C), g = MK(0.5f, 1.5f, C), b = MK(-1, 1, C), dy = MK(-1, 1, N, 3, 4, 5, C);
    ts_tensor y1 = MK(0, 0, N, 3, 4, 5, C), y2 = MK(0, 0, N, 3, 4, 5, C), dx1 = MK(0, 0, N, 3, 4, 5, C),
              dx2 = MK(0, 0, N, 3, 4, 5, C), dm = MK(0, 0, N, 3, 4, 5, C);
    ts_tensor gg1 = MK(0, 0, C), gb1 = MK(0, 0, C), gg2 = MK(0, 0, C), gb2 = MK(0, 0, C);
    int64_t ns = kind == 0 ? C : N * (groups ? groups : C);
    ts_tensor sm = MK(0, 0, ns), si = MK(0, 0, ns), rm = MK(-0.5f, 0.5f, C), rv = MK(0.5f, 2, C);
    ts_norm_opts plain = nopt(groups, 0), fused = nopt(groups, 1);
    fused.slope = slope;
    int rc = 0;
    /* fused */
    if (kind == 0) {
        rc |= ts_batchnorm_forward(&x, &g, &b, &rm, &rv, train, &fused, &y1, &sm, &si);
        rc |= ts_batchnorm_backward(&x, NULL, &g, &b, &sm, &si, train, &fused, &dy, &dx1, &gg1, &gb1);
        rc |= ts_batchnorm_forward(&x, &g, &b, &rm, &rv, train, &plain, &y2, &sm, &si);
        rc |= ts_relu_forward(&y2, slope, &y2);
        rc |= ts_relu_backward(&y2, slope, &dy, &dm);
        rc |= ts_batchnorm_backward(&x, NULL, &g, NULL, &sm, &si, train, &plain, &dm, &dx2, &gg2, &gb2);
    } else {
        rc |= gn_any(1, groups, &x, &g, &b, NULL, &fused, &y1, &sm, &si, NULL, NULL, NULL, NULL);
        rc |= gn_any(0, groups, &x, &g, &b, NULL, &fused, NULL, &sm, &si, &dy, &dx1, &gg1, &gb1);
        rc |= gn_any(1, groups, &x, &g, &b, NULL, &plain, &y2, &sm, &si, NULL, NULL, NULL, NULL);
        rc |= ts_relu_forward(&y2, slope, &y2);
        rc |= ts_relu_backward(&y2, slope, &dy, &dm);
        rc |= gn_any(0, groups, &x, &g, &b, NULL, &plain, NULL, &sm, &si, &dm, &dx2, &gg2, &gb2);
    }
    double e = 0;
    int64_t neg = 0, differ = 0;
    const ts_tensor *pa[] = {&y1, &dx1, &gg1, &gb1}, *pb[] = {&y2, &dx2, &gg2, &gb2};
    for (int t = 0; t < 4; t++) {
        const float *u = pa[t]->data, *v = pb[t]->data;
        double mx = 0, d = 0;
        for (int64_t i = 0; i < ts_tensor_numel(pa[t]); i++) {
            mx = fmax(mx, fabs(v[i]));
            d = fmax(d, fabs(u[i] - v[i]));
            differ += u[i] != v[i];
            neg += t == 0 && u[i] < 0;
        }
        e = fmax(e, d / fmax(mx, 1e-30));
    }
    /* the leaky branch taken (negative outputs) where slope > 0, none where 0 */
    ts_ok(rc == 0 && differ == 0 && (slope > 0) == (neg > 0),
          "%s, C = %lld, fused %s (slope %g) = the separate passes, forward and backward: %lld values differ "
          "(max rel diff %.2e; %lld negative outputs)",
          what, (long long)C, slope > 0 ? "leaky ReLU" : "ReLU", (double)slope, (long long)differ, e, (long long)neg);
    /* the backward above had no forward output (the mask is recomputed from x and the bias); without the bias it
     * is refused with a message that names it */
    const int eb = kind == 0 ? ts_batchnorm_backward(&x, &y1, &g, NULL, &sm, &si, train, &fused, &dy, &dx1, &gg1, &gb1)
                             : gn_any(0, groups, &x, &g, NULL, &y1, &fused, NULL, &sm, &si, &dy, &dx1, &gg1, &gb1);
    ts_ok(eb != 0 && strstr(ts_err_message(), "bias") != NULL, "%s, C = %lld: fused backward without the bias refused (%s)",
          what, (long long)C, eb ? ts_err_message() : "accepted");
    ts_tensor *all[] = {&x, &g, &b, &dy, &y1, &y2, &dx1, &dx2, &dm, &gg1, &gb1, &gg2, &gb2, &sm, &si, &rm, &rv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* relu: inputs kept away from the kink */
static int relu_f(fd_case *c, ts_tensor *y) { return ts_relu_forward(c->in[0], c->slope, y); }
static int relu_b(fd_case *c, const ts_tensor *dy)
{
    ts_tensor y;
    ts_tensor_alloc(&y, TS_FLOAT32, c->in[0]->ndim, c->in[0]->shape);
    int rc = ts_relu_forward(c->in[0], c->slope, &y);
    rc = rc ? rc : ts_relu_backward(&y, c->slope, dy, c->grad[0]);
    ts_tensor_free(&y);
    return rc;
}
static void fd_relu(float slope)
{
    ts_tensor x = MK(0.1f, 1, 2, 3, 3, 3, 4), gx = MK(0, 0, 2, 3, 3, 3, 4);
    float *p = x.data;
    for (int64_t i = 0; i < ts_tensor_numel(&x); i += 2) p[i] = -p[i];
    fd_case c = {.fwd = relu_f, .bwd = relu_b, .in = {&x}, .grad = {&gx}, .names = {"x"}, .slope = slope};
    ts_tensor_alloc(&c.y, TS_FLOAT32, 5, x.shape);
    fd_check(&c, slope > 0 ? "leaky relu 0.01" : "relu", 1e-3f, 1e-3);
    ts_tensor_free(&x);
    ts_tensor_free(&gx);
    ts_tensor_free(&c.y);
}

static int cat_f(fd_case *c, ts_tensor *y) { return ts_concat_forward(c->in[0], c->in[1], y); }
static int cat_b(fd_case *c, const ts_tensor *dy) { return ts_concat_backward(dy, c->grad[0], c->grad[1]); }
static void fd_concat(void)
{
    ts_tensor a = MK(-1, 1, 2, 2, 3, 2, 3), b = MK(-1, 1, 2, 2, 3, 2, 5), ga = MK(0, 0, 2, 2, 3, 2, 3), gb = MK(0, 0, 2, 2, 3, 2, 5);
    fd_case c = {.fwd = cat_f, .bwd = cat_b, .in = {&a, &b}, .grad = {&ga, &gb}, .names = {"a", "b"}};
    ts_tensor_alloc(&c.y, TS_FLOAT32, 5, (int64_t[]){2, 2, 3, 2, 8});
    fd_check(&c, "concat", 1e-2f, 1e-4);
    ts_tensor *all[] = {&a, &b, &ga, &gb, &c.y};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* losses: y = [1] holding the loss; t[0] = labels; kind in k (0 ce, 1 dice) */
static int loss_f(fd_case *c, ts_tensor *y)
{
    double l;
    int rc = c->k ? ts_dice_forward(c->in[0], c->t[0], &c->lo, &l) : ts_softmax_ce_forward(c->in[0], c->t[0], &c->lo, &l);
    ((float *)y->data)[0] = (float)l;
    return rc;
}
static int loss_b(fd_case *c, const ts_tensor *dy)
{
    float s = ((float *)dy->data)[0];
    return c->k ? ts_dice_backward(c->in[0], c->t[0], &c->lo, s, c->grad[0])
                : ts_softmax_ce_backward(c->in[0], c->t[0], &c->lo, s, c->grad[0]);
}
static void fd_loss(int kind, int ignore, int weighted)
{
    const int K = 4;
    ts_tensor l = MK(-2, 2, 2, 3, 2, 4, K), gl = MK(0, 0, 2, 3, 2, 4, K), lab;
    ts_tensor_alloc(&lab, TS_UINT8, 4, (int64_t[]){2, 3, 2, 4});
    uint8_t *p = lab.data;
    for (int64_t i = 0; i < ts_tensor_numel(&lab); i++) p[i] = (uint8_t)ts_rng_below(&rng, K);
    if (ignore >= 0)
        for (int64_t i = 0; i < ts_tensor_numel(&lab); i += 5) p[i] = (uint8_t)ignore;
    float cw[4] = {0.5f, 2.0f, 1.0f, 3.0f};
    fd_case c = {loss_f, loss_b, {&l}, {&gl}, {"logits"}, .k = kind, .t = {&lab}};
    c.lo = (ts_loss_opts){.ignore_index = ignore, .class_weights = weighted ? cw : NULL, .dice_smooth = 1e-5f};
    ts_tensor_alloc(&c.y, TS_FLOAT32, 1, (int64_t[]){1});
    char what[96];
    snprintf(what, sizeof what, "%s%s%s", kind ? "soft dice" : "softmax cross-entropy", ignore >= 0 ? " ignore-index" : "",
             weighted ? " class weights" : "");
    fd_check(&c, what, 1e-2f, 2e-3);
    ts_tensor_free(&l);
    ts_tensor_free(&gl);
    ts_tensor_free(&lab);
    ts_tensor_free(&c.y);
}

/* forward values of the losses against direct formulas */
static void test_loss_values(void)
{
    /* one voxel per sample, 2 samples, 3 classes */
    ts_tensor l = MK(0, 0, 2, 1, 1, 1, 3), lab;
    float *pl = l.data;
    const float v[6] = {1, 2, 3, 0.5f, -1, 0};
    memcpy(pl, v, sizeof v);
    ts_tensor_alloc(&lab, TS_UINT8, 4, (int64_t[]){2, 1, 1, 1});
    ((uint8_t *)lab.data)[0] = 2;
    ((uint8_t *)lab.data)[1] = 0;
    double ce, want = 0, p[2][3];
    for (int n = 0; n < 2; n++) {
        double s = 0;
        for (int k = 0; k < 3; k++) s += exp(v[3 * n + k]);
        for (int k = 0; k < 3; k++) p[n][k] = exp(v[3 * n + k]) / s;
    }
    float cw[3] = {2, 1, 0.5f};
    ts_loss_opts o = {.ignore_index = -1, .class_weights = cw, .dice_smooth = 1e-5f};
    int rc = ts_softmax_ce_forward(&l, &lab, &o, &ce);
    want = (0.5 * -log(p[0][2]) + 2 * -log(p[1][0])) / 2.5;
    ts_ok(rc == 0 && fabs(ce - want) < 1e-6, "cross-entropy with class weights = %.7f (expected %.7f)", ce, want);
    o.ignore_index = 0;
    rc = ts_softmax_ce_forward(&l, &lab, &o, &ce);
    ts_ok(rc == 0 && fabs(ce + log(p[0][2])) < 1e-6, "cross-entropy ignores label 0: %.7f", ce);
    o = (ts_loss_opts){.ignore_index = -1, .dice_smooth = 1e-5f};
    double dice;
    rc = ts_dice_forward(&l, &lab, &o, &dice);
    want = 0;
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 3; k++) {
            double g = (k == (n ? 0 : 2));
            want += 1 - (2 * p[n][k] * g + 1e-5) / (p[n][k] + g + 1e-5);
        }
    want /= 6;
    ts_ok(rc == 0 && fabs(dice - want) < 1e-6, "soft dice = %.7f (expected %.7f)", dice, want);
    ((uint8_t *)lab.data)[1] = 3;
    rc = ts_softmax_ce_forward(&l, &lab, &o, &ce);
    ts_ok(rc == TS_ERR_ARG && strstr(ts_err_message(), "label 3"), "a label outside the classes is an error: %s",
          ts_err_message());
    ts_tensor_free(&l);
    ts_tensor_free(&lab);
}

/* The losses on volumes of whole and partial 16-voxel blocks (per sample 7 x
 * 9 x 5 voxels), 2, 3 and 4 classes (2 and 4 move between voxels and lanes
 * by shuffles), with and without an ignore index: the loss and each logit
 * gradient of cross-entropy (also class-weighted) and soft Dice against
 * double precision, the gradients relative to their own largest value, and
 * something must be there (a nonzero gradient, some voxels ignored). */
static double ref_loss(int kind, const float *l, const uint8_t *y, int N, int S, int K, int ign, const float *w,
                       float scale, double *g)
{
    double den = 0, num = 0, I[2][4] = {{0}}, P[2][4] = {{0}}, G[2][4] = {{0}};
    for (int n = 0; n < N; n++)
        for (int v = n * S; v < (n + 1) * S; v++) {
            double m = l[v * K], s = 0, p[4];
            for (int k = 1; k < K; k++) m = fmax(m, l[v * K + k]);
            for (int k = 0; k < K; k++) s += p[k] = exp((double)l[v * K + k] - m);
            for (int k = 0; k < K; k++) p[k] /= s;
            if (y[v] == ign) continue;
            const double wt = w ? w[y[v]] : 1.0;
            den += wt;
            num += wt * -log(p[y[v]]);
            for (int k = 0; k < K; k++) {
                P[n][k] += p[k];
                I[n][k] += p[k] * (y[v] == k);
                G[n][k] += y[v] == k;
            }
        }
    double loss = 0;
    if (kind == 0) loss = num / den;
    else
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) loss += (1 - (2 * I[n][k] + 1e-5) / (P[n][k] + G[n][k] + 1e-5)) / (N * K);
    for (int n = 0; n < N; n++)
        for (int v = n * S; v < (n + 1) * S; v++) {
            double m = l[v * K], s = 0, p[4], dp[4], dot = 0;
            for (int k = 1; k < K; k++) m = fmax(m, l[v * K + k]);
            for (int k = 0; k < K; k++) s += p[k] = exp((double)l[v * K + k] - m);
            for (int k = 0; k < K; k++) p[k] /= s;
            for (int k = 0; k < K; k++) {
                const double d = P[n][k] + G[n][k] + 1e-5, nu = 2 * I[n][k] + 1e-5;
                dp[k] = scale / (N * K) * (nu / (d * d) - (y[v] == k) * 2 / d);
                dot += p[k] * dp[k];
            }
            for (int k = 0; k < K; k++) {
                double gk = 0;
                if (y[v] != ign)
                    gk = kind == 0 ? scale / den * (w ? w[y[v]] : 1.0) * (p[k] - (y[v] == k)) : p[k] * (dp[k] - dot);
                g[v * K + k] = gk;
            }
        }
    return loss;
}

static void test_loss_blocks(void)
{
    const int N = 2, D = 7, H = 9, W = 5, S = D * H * W;
    double worst_l = 0, worst_g = 0;
    int cases = 0, ignored = 0, nonzero = 0;
    for (int K = 2; K <= 4; K++)
        for (int c = 0; c < 6; c++) {
            const int kind = c % 2, ign = c / 2 == 1 ? 1 : c / 2 == 2 ? 255 : -1, weighted = kind == 0 && c / 2 == 2;
            const float cw[4] = {0.5f, 2.0f, 1.5f, 3.0f};
            ts_tensor l = MK(-4, 4, N, D, H, W, K), gl = MK(0, 0, N, D, H, W, K), lab;
            ts_tensor_alloc(&lab, TS_UINT8, 4, (int64_t[]){N, D, H, W});
            uint8_t *y = lab.data;
            for (int v = 0; v < N * S; v++) y[v] = (uint8_t)ts_rng_below(&rng, K);
            if (ign >= 0)
                for (int v = 3; v < N * S; v += 7) y[v] = (uint8_t)ign, ignored++;
            ts_loss_opts o = {.ignore_index = ign, .class_weights = weighted ? cw : NULL, .dice_smooth = 1e-5f};
            double got = 0, *want_g = calloc((size_t)N * S * K, sizeof(double));
            const float scale = 0.75f;
            const double want = ref_loss(kind, l.data, y, N, S, K, ign, weighted ? cw : NULL, scale, want_g);
            int rc = kind ? ts_dice_forward_backward(&l, &lab, &o, scale, &got, &gl)
                          : ts_softmax_ce_forward_backward(&l, &lab, &o, scale, &got, &gl);
            double gmax = 0, gerr = 0;
            const float *g = gl.data;
            for (int i = 0; i < N * S * K; i++) {
                gmax = fmax(gmax, fabs(want_g[i]));
                gerr = fmax(gerr, fabs(g[i] - want_g[i]));
            }
            nonzero += gmax > 0;
            const double el = fabs(got - want) / fabs(want), eg = gmax > 0 ? gerr / gmax : 1;
            worst_l = fmax(worst_l, rc ? 1 : el);
            worst_g = fmax(worst_g, eg);
            cases++;
            free(want_g);
            ts_tensor *all[] = {&l, &gl, &lab};
            for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
        }
    ts_ok(cases == 18 && nonzero == 18 && ignored > 0 && worst_l < 1e-6 && worst_g < 2e-6,
          "losses on whole and partial 16-voxel blocks, 2-4 classes, ignore index, class weights (%d cases): loss %.2e "
          "relative (bound 1e-6), logit gradients %.2e of their largest (bound 2e-6) from double precision",
          cases, worst_l, worst_g);
}

static void test_bn_running(void)
{
    ts_tensor x = MK(-1, 3, 2, 2, 2, 2, 3), y = MK(0, 0, 2, 2, 2, 2, 3), g = MK(1, 1, 3), b = MK(0, 0, 3);
    ts_tensor rm = MK(0, 0, 3), rv = MK(1, 1, 3), sm = MK(0, 0, 3), si = MK(0, 0, 3);
    ts_norm_opts o = nopt(0, 0);
    int rc = ts_batchnorm_forward(&x, &g, &b, &rm, &rv, 1, &o, &y, &sm, &si);
    double mean = 0, var = 0;
    const float *px = x.data;
    for (int i = 0; i < 16; i++) mean += px[i * 3 + 1];
    mean /= 16;
    for (int i = 0; i < 16; i++) var += (px[i * 3 + 1] - mean) * (px[i * 3 + 1] - mean);
    double rmw = 0.1 * mean, rvw = 0.9 + 0.1 * var / 15;
    ts_ok(rc == 0 && fabs(((float *)rm.data)[1] - rmw) < 1e-6 && fabs(((float *)rv.data)[1] - rvw) < 1e-6,
          "batch norm running statistics (momentum 0.1, unbiased variance)");
    ts_tensor *all[] = {&x, &y, &g, &b, &rm, &rv, &sm, &si};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* statistics of a channel with a large mean and a small spread, and atypical first voxels */
static void test_bn_accuracy(void)
{
    ts_tensor x = MK(-1, 1, 1, 16, 16, 32, 2), y = MK(0, 0, 1, 16, 16, 32, 2), g = MK(1, 1, 2), b = MK(0, 0, 2);
    ts_tensor sm = MK(0, 0, 2), si = MK(0, 0, 2), gm = MK(0, 0, 2), gi = MK(0, 0, 2);
    float *p = x.data;
    const int64_t V = 16 * 16 * 32;
    for (int64_t v = 0; v < V; v++) {
        p[2 * v] = 1000.0f + 0.01f * p[2 * v] + (v < 300 ? 0.05f : 0.0f);
        p[2 * v + 1] = 0.001f * p[2 * v + 1];
    }
    ts_norm_opts o = nopt(0, 0);
    int rc = ts_batchnorm_forward(&x, &g, &b, NULL, NULL, 1, &o, &y, &sm, &si);
    rc |= ts_groupnorm_forward(&x, &g, &b, &(ts_norm_opts){.eps = 1e-5f, .groups = 2}, &y, &gm, &gi);
    double worst = 0;
    for (int c = 0; c < 2; c++) {
        double mu = 0, var = 0;
        for (int64_t v = 0; v < V; v++) mu += p[2 * v + c];
        mu /= V;
        for (int64_t v = 0; v < V; v++) var += (p[2 * v + c] - mu) * (p[2 * v + c] - mu);
        var /= V;
        const double inv = 1.0 / sqrt(var + 1e-5);
        worst = fmax(worst, fabs(((float *)si.data)[c] - inv) / inv);
        worst = fmax(worst, fabs(((float *)gi.data)[c] - inv) / inv);
        worst = fmax(worst, fabs(((float *)sm.data)[c] - mu) / fmax(fabs(mu), 1e-3));
    }
    ts_ok(rc == 0 && worst < 1e-4, "batch/instance-style statistics of mean 1000, spread 0.01: max rel err %.1e", worst);
    ts_tensor *all[] = {&x, &y, &g, &b, &sm, &si, &gm, &gi};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* The forward statistics are exact sums (src/nn/norm_impl.h): any order of
 * the voxels gives bitwise the same statistics and outputs, over a dynamic
 * range of 2^80 with a mean far from zero; a non-finite value makes its
 * statistic (and only its) NaN. */
/* The norm passes take 16 channels a vector where C is a multiple of 16,
 * 8 where C is a multiple of 8 only (src/nn/norm_common.c), and one channel
 * at a time otherwise: each channel of a C = 80 tensor (vectors of 4 and 1,
 * and 4, 4, 2 for the exact statistics), of C = 40 (8-lane runs of 4 and 1)
 * and of C = 24 (a run of 3) must give bitwise what it gives alone (C = 1),
 * forward and backward, batch and instance norm, with and without the fused
 * ReLU. (GCC's tuning for AMD cores left 8-lane sums unfused where the
 * scalar loop's multiply-add is fused: C = 40 caught it.) */
static void test_norm_channels(int C)
{
    enum { N = 2, D = 7, H = 9, W = 11 };
    const int64_t V = (int64_t)N * D * H * W;
    ts_tensor x = MK(-1, 1, N, D, H, W, C), dy = MK(-1, 1, N, D, H, W, C), g = MK(0.5f, 1.5f, C), b = MK(-1, 1, C);
    float *px = x.data;
    for (int64_t v = 0; v < V; v++)
        for (int c = 0; c < C; c++) px[v * C + c] = ldexpf(px[v * C + c], c % 7 - 3) + (float)(c % 5);
    for (int kind = 0; kind < 2; kind++)
        for (int relu = 0; relu < 3; relu++) { /* 2: leaky ReLU */
            ts_norm_opts o = nopt(0, relu != 0);
            o.slope = relu == 2 ? 0.01f : 0.0f;
            ts_tensor y = MK(0, 0, N, D, H, W, C), dx = MK(0, 0, N, D, H, W, C), dg = MK(0, 0, C), db = MK(0, 0, C);
            const int ns = kind ? N : 1; /* statistics per channel (batch) or per sample and channel (instance) */
            ts_tensor m = MK(0, 0, ns * C), iv = MK(0, 0, ns * C);
            int rc = 0;
            if (kind == 0) {
                rc |= ts_batchnorm_forward(&x, &g, &b, NULL, NULL, 1, &o, &y, &m, &iv);
                rc |= ts_batchnorm_backward(&x, &y, &g, &b, &m, &iv, 1, &o, &dy, &dx, &dg, &db);
            } else {
                rc |= ts_instancenorm_forward(&x, &g, &b, &o, &y, &m, &iv);
                rc |= ts_instancenorm_backward(&x, &y, &g, &b, &m, &iv, &o, &dy, &dx, &dg, &db);
            }
            int64_t differ = 0, nonzero = 0;
            for (int c = 0; c < C; c++) {
                ts_tensor x1 = MK(0, 0, N, D, H, W, 1), d1 = MK(0, 0, N, D, H, W, 1), y1 = MK(0, 0, N, D, H, W, 1);
                ts_tensor dx1 = MK(0, 0, N, D, H, W, 1), g1 = MK(0, 0, 1), b1 = MK(0, 0, 1), dg1 = MK(0, 0, 1),
                          db1 = MK(0, 0, 1), m1 = MK(0, 0, ns), i1 = MK(0, 0, ns);
                float *a = x1.data, *e = d1.data;
                for (int64_t v = 0; v < V; v++) a[v] = px[v * C + c], e[v] = ((float *)dy.data)[v * C + c];
                ((float *)g1.data)[0] = ((float *)g.data)[c];
                ((float *)b1.data)[0] = ((float *)b.data)[c];
                if (kind == 0) {
                    rc |= ts_batchnorm_forward(&x1, &g1, &b1, NULL, NULL, 1, &o, &y1, &m1, &i1);
                    rc |= ts_batchnorm_backward(&x1, &y1, &g1, &b1, &m1, &i1, 1, &o, &d1, &dx1, &dg1, &db1);
                } else {
                    rc |= ts_instancenorm_forward(&x1, &g1, &b1, &o, &y1, &m1, &i1);
                    rc |= ts_instancenorm_backward(&x1, &y1, &g1, &b1, &m1, &i1, &o, &d1, &dx1, &dg1, &db1);
                }
                const float *Y = y.data, *DX = dx.data, *y1p = y1.data, *dx1p = dx1.data;
                for (int64_t v = 0; v < V; v++) {
                    differ += memcmp(&Y[v * C + c], &y1p[v], 4) != 0;
                    differ += memcmp(&DX[v * C + c], &dx1p[v], 4) != 0;
                    nonzero += Y[v * C + c] != 0 && DX[v * C + c] != 0;
                }
                for (int n = 0; n < ns; n++) {
                    differ += memcmp((float *)m.data + n * C + c, (float *)m1.data + n, 4) != 0;
                    differ += memcmp((float *)iv.data + n * C + c, (float *)i1.data + n, 4) != 0;
                }
                differ += memcmp((float *)dg.data + c, dg1.data, 4) != 0;
                differ += memcmp((float *)db.data + c, db1.data, 4) != 0;
                ts_tensor *t1[] = {&x1, &d1, &y1, &dx1, &g1, &b1, &dg1, &db1, &m1, &i1};
                for (size_t i = 0; i < sizeof t1 / sizeof *t1; i++) ts_tensor_free(t1[i]);
            }
            ts_ok(rc == 0 && differ == 0 && nonzero > V * C / 3,
                  "%s norm%s, C = %d (vector passes) against each channel alone (C = 1): %lld of %lld values differ "
                  "bitwise (outputs, input gradients, statistics, weight and bias gradients; %lld voxel-channels with "
                  "both nonzero)",
                  kind ? "instance" : "batch", relu == 2 ? " + leaky ReLU" : relu ? " + ReLU" : "", C, (long long)differ,
                  (long long)(2 * V * C + 2 * ns * C + 2 * C), (long long)nonzero);
            ts_tensor *t[] = {&y, &dx, &dg, &db, &m, &iv};
            for (size_t i = 0; i < sizeof t / sizeof *t; i++) ts_tensor_free(t[i]);
        }
    ts_tensor *all[] = {&x, &dy, &g, &b};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* The convolutions' bias gradient sums 16 channels a vector where OC is a
 * multiple of 16 (up to 64 channels in registers at a time), 8 where OC is
 * a multiple of 8 only, and one channel at a time otherwise: each channel
 * of OC = 80, 320, 40 and 24 must give bitwise what it gives alone (OC = 1). */
static void test_bias_grad_channels(void)
{
    const int OCs[] = {80, 320, 40, 24};
    for (int k = 0; k < 4; k++) {
        const int OC = OCs[k];
        const size_t V = 5000; /* 64 chunks of 78-79 voxels */
        float *gy = malloc(V * OC * sizeof(float)), *one = malloc(V * sizeof(float));
        float *db = calloc((size_t)OC, sizeof(float));
        int rc = 0;
        size_t differ = 0, nonzero = 0;
        /* values whose sums round: another order of the additions gives other bits */
        for (size_t i = 0; i < V * OC; i++) gy[i] = ldexpf((float)((i * 2654435761u) % 2001) - 1000.0f, -(int)(i % 13)) / 997.0f;
        rc |= ts_nn_bias_grad(gy, V, OC, db);
        for (int c = 0; c < OC; c++) {
            float d1 = 0.0f;
            for (size_t v = 0; v < V; v++) one[v] = gy[v * OC + c];
            rc |= ts_nn_bias_grad(one, V, 1, &d1);
            differ += memcmp(&d1, &db[c], sizeof d1) != 0;
            nonzero += db[c] != 0.0f;
        }
        ts_ok(rc == 0 && differ == 0 && nonzero > (size_t)OC / 2,
              "conv bias gradient, OC = %d (vector sums) against each channel alone: %zu of %d differ bitwise (%zu nonzero)",
              OC, differ, OC, nonzero);
        free(gy);
        free(one);
        free(db);
    }
}

static void test_norm_order(void)
{
    const int64_t V = 7 * 9 * 11;
    ts_tensor x = MK(-1, 1, 1, 7, 9, 11, 3), r = MK(0, 0, 1, 7, 9, 11, 3), g = MK(0.5f, 1.5f, 3), b = MK(-1, 1, 3);
    ts_tensor y1 = MK(0, 0, 1, 7, 9, 11, 3), y2 = MK(0, 0, 1, 7, 9, 11, 3);
    ts_tensor m1 = MK(0, 0, 3), i1 = MK(0, 0, 3), m2 = MK(0, 0, 3), i2 = MK(0, 0, 3);
    float *p = x.data, *q = r.data;
    for (int64_t v = 0; v < V; v++) {
        p[3 * v] = 100.0f + p[3 * v];                               /* mean far from 0 */
        p[3 * v + 1] = ldexpf(p[3 * v + 1], (int)(v % 80) - 60);    /* 2^-60 .. 2^19 */
        p[3 * v + 2] = v % 5 ? 0.0f : p[3 * v + 2];                 /* mostly zeros (after a ReLU) */
    }
    for (int64_t v = 0; v < V; v++) /* a permutation of the voxels: v -> (v * 97) mod V */
        for (int c = 0; c < 3; c++) q[(v * 97 % V) * 3 + c] = p[v * 3 + c];
    int rc = 0, same = 1;
    for (int kind = 0; kind < 2; kind++) {
        ts_norm_opts o = nopt(0, 0);
        if (kind == 0) {
            rc |= ts_batchnorm_forward(&x, &g, &b, NULL, NULL, 1, &o, &y1, &m1, &i1);
            rc |= ts_batchnorm_forward(&r, &g, &b, NULL, NULL, 1, &o, &y2, &m2, &i2);
        } else {
            rc |= ts_instancenorm_forward(&x, &g, &b, &o, &y1, &m1, &i1);
            rc |= ts_instancenorm_forward(&r, &g, &b, &o, &y2, &m2, &i2);
        }
        same = same && !memcmp(m1.data, m2.data, 12) && !memcmp(i1.data, i2.data, 12);
        const float *a = y1.data, *c2 = y2.data;
        for (int64_t v = 0; v < V; v++)
            for (int c = 0; c < 3; c++) same = same && a[v * 3 + c] == c2[(v * 97 % V) * 3 + c];
    }
    ts_ok(rc == 0 && same, "batch and instance norm: a permutation of the voxels gives bitwise the same statistics "
                           "and outputs (mean 100, a 2^80 range, mostly zeros)");
    p[3 * 5 + 1] = NAN;
    rc = ts_instancenorm_forward(&x, &g, &b, &(ts_norm_opts){.eps = 1e-5f}, &y1, &m1, &i1);
    const float *mm = m1.data;
    ts_ok(rc == 0 && isfinite(mm[0]) && isnan(mm[1]) && isfinite(mm[2]),
          "instance norm: a NaN in channel 1 makes its statistics NaN, the others' stay finite (%g %g %g)", mm[0], mm[1], mm[2]);
    ts_tensor *all[] = {&x, &r, &g, &b, &y1, &y2, &m1, &i1, &m2, &i2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* ts_nn_channel_affine: y = x scale[n][c] + shift[n][c] (ReLU: NaN and -0 to +0) for channel counts
 * that take its 16-lane path (C divides 16) and others, voxel counts with a tail, against a naive loop
 * with fmaf (the kernel may round with or without contraction: 1 ulp of each output allowed) */
static void test_channel_affine(void)
{
    const int Cs[] = {1, 2, 4, 8, 16, 3, 24};
    const int N = 2;
    const size_t S = 300; /* 1 block of 256 and a partial one; 300 C is not a multiple of 16 for C = 1 */
    for (size_t ci = 0; ci < sizeof Cs / sizeof *Cs; ci++)
        for (int relu = 0; relu < 3; relu++) { /* 2: leaky, slope 0.01 */
            const int C = Cs[ci];
            const size_t n = (size_t)N * S * C;
            float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *sc = malloc((size_t)N * C * sizeof *sc),
                  *sh = malloc((size_t)N * C * sizeof *sh);
            ts_rng r;
            ts_rng_init(&r, 11 + C, 0, relu);
            for (size_t i = 0; i < n; i++) x[i] = 4 * ts_rng_uniformf(&r) - 2;
            for (int i = 0; i < N * C; i++) sc[i] = 0.5f + i, sh[i] = (float)(i % 3) - 1; /* every channel its own */
            x[7] = NAN;    /* ReLU: 0 */
            x[8] = -0.0f; /* times a positive scale plus shift 0 (channel 8 % C with (8 % C) % 3 == 1): -0 or 0 */
            ts_nn_channel_affine(x, sc, sh, N, S, C, relu != 0, relu == 2 ? 0.01f : 0.0f, y);
            size_t bad = 0, pos = 0, neg = 0;
            for (size_t i = 0; i < n; i++) {
                const size_t k = i / (S * C) * C + i % C;
                neg += y[i] < 0;
                float t = fmaf(x[i], sc[k], sh[k]);
                const float t2 = x[i] * sc[k] + sh[k];
                int ok;
                if (relu == 2) { /* leaky: relu.c's t > 0 ? t : slope t (NaN stays NaN) */
                    const float l = t > 0 ? t : 0.01f * t, l2 = t2 > 0 ? t2 : 0.01f * t2;
                    ok = isnan(t) ? isnan(y[i]) : !memcmp(&y[i], &l, 4) || !memcmp(&y[i], &l2, 4);
                } else if (relu) {
                    t = t > 0 ? t : 0.0f;
                    ok = (y[i] == t || y[i] == (t2 > 0 ? t2 : 0.0f)) && !signbit(y[i]) && !isnan(y[i]);
                } else {
                    ok = isnan(t) ? isnan(y[i]) : fabsf(y[i] - t) <= 1.2e-7f * fabsf(t) + 1e-30f || y[i] == t2;
                }
                bad += !ok;
                pos += y[i] > 0;
            }
            ts_ok(bad == 0 && pos > n / 10 && (relu == 1 ? neg == 0 : neg > n / 20),
                  "channel affine, C %d, %s: %zu of %zu outputs differ from x scale + shift (%zu positive, %zu negative)", C,
                  relu == 2 ? "leaky ReLU" : relu ? "ReLU" : "no activation", bad, n, pos, neg);
            free(x);
            free(y);
            free(sc);
            free(sh);
        }
}

/* The forward epilogue (ts_conv_ep): conv + eval batch norm (folded by
 * ts_batchnorm_fold) + ReLU / leaky ReLU in one call equals the three
 * passes bit for bit, on one input or a concatenation [ca, cb] (cb 0:
 * none), fp32 or bf16; both activations' branches are taken and the
 * affine map changed the values. Also the epilogue without an affine map,
 * and bad epilogues refused. */
static void test_conv_epilogue(int ca, int cb, int OC, ts_conv_act act, int bf16)
{
    const int64_t N = 2, D = 5, H = 4, W = 23;
    ts_tensor a = MK(-1, 1, N, D, H, W, ca), b = MK(-1, 1, N, D, H, W, cb ? cb : 1);
    ts_tensor w = MK(-0.3f, 0.3f, OC, ca + cb, 3, 3, 3), bias = MK(-0.5f, 0.5f, OC), y = MK(0, 0, N, D, H, W, OC),
              ref = MK(0, 0, N, D, H, W, OC), fused = MK(0, 0, N, D, H, W, OC);
    ts_tensor g = MK(0.5f, 2, OC), be = MK(-0.5f, 0.5f, OC), rm = MK(-0.3f, 0.3f, OC), rv = MK(0.2f, 3, OC);
    ts_tensor sm = MK(0, 0, OC), si = MK(0, 0, OC);
    float *ss = malloc(2 * (size_t)OC * sizeof(float));
    int rc = ts_nn_set_conv_precision(bf16 ? TS_PREC_BF16 : TS_PREC_FP32);
    ts_norm_opts o = nopt(0, act == TS_EP_RELU);
    const float slope = 0.07f;
    /* the three passes */
    rc |= cb ? ts_conv3d_cat_forward(&a, &b, &w, &bias, 1, 1, &y) : ts_conv3d_forward(&a, &w, &bias, 1, 1, &y);
    rc |= ts_batchnorm_forward(&y, &g, &be, &rm, &rv, 0, &o, &ref, &sm, &si);
    if (act == TS_EP_LEAKY) rc |= ts_relu_forward(&ref, slope, &ref);
    /* one call */
    rc |= ts_batchnorm_fold(&g, &be, &rm, &rv, o.eps, ss, ss + OC);
    const ts_conv_ep ep = {ss, ss + OC, act, slope, NULL};
    const ts_conv_split sp = {NULL, TS_CONV_ALL, NULL, NULL, &ep};
    rc |= cb ? ts_conv3d_cat_forward_split(&a, &b, &w, &bias, &sp, &fused) : ts_conv3d_forward_split(&a, &w, &bias, &sp, &fused);
    const int64_t n = ts_tensor_numel(&y);
    int64_t diff = 0, neg = 0, pos = 0, changed = 0;
    for (int64_t i = 0; i < n; i++) {
        const float r = ((float *)ref.data)[i], f = ((float *)fused.data)[i], c = ((float *)y.data)[i];
        diff += memcmp(&r, &f, sizeof r) != 0;
        neg += act == TS_EP_RELU ? r == 0.0f : r < 0.0f;
        pos += r > 0.0f;
        changed += fabsf(r - c) > 1e-3f * fabsf(c) + 1e-6f;
    }
    char in[32];
    if (cb) snprintf(in, sizeof in, "[%d, %d]", ca, cb);
    else snprintf(in, sizeof in, "%d", ca);
    ts_ok(rc == 0 && diff == 0 && neg > n / 10 && pos > n / 10 && changed > n / 2,
          "conv3d%s %s -> %d with the eval batch norm and %s in its epilogue = the three passes bit for bit "
          "(%lld of %lld differ; %lld non-positive)", bf16 ? " bf16" : "", in, OC,
          act == TS_EP_RELU ? "ReLU" : "leaky ReLU", (long long)diff, (long long)n, (long long)neg);
    /* the activation alone */
    const ts_conv_ep ea = {NULL, NULL, act, slope, NULL};
    const ts_conv_split spa = {NULL, TS_CONV_ALL, NULL, NULL, &ea};
    rc = cb ? ts_conv3d_cat_forward_split(&a, &b, &w, &bias, &spa, &fused) : ts_conv3d_forward_split(&a, &w, &bias, &spa, &fused);
    diff = 0;
    for (int64_t i = 0; i < n; i++) { /* ReLU: +0 below zero (batch norm's fused ReLU); leaky: ts_relu_forward's */
        const float c = ((float *)y.data)[i], r = c > 0.0f ? c : act == TS_EP_RELU ? 0.0f : slope * c;
        diff += memcmp(&r, (float *)fused.data + i, sizeof(float)) != 0;
    }
    ts_ok(rc == 0 && diff == 0, "... and the activation alone in the epilogue = conv, then the activation (%lld differ)",
          (long long)diff);
    const ts_conv_ep bad1 = {ss, NULL, act, slope, NULL}, bad2 = {NULL, NULL, (ts_conv_act)7, 0, NULL};
    const ts_conv_split sb1 = {NULL, TS_CONV_ALL, NULL, NULL, &bad1}, sb2 = {NULL, TS_CONV_ALL, NULL, NULL, &bad2};
    const int r1 = cb ? ts_conv3d_cat_forward_split(&a, &b, &w, &bias, &sb1, &fused)
                      : ts_conv3d_forward_split(&a, &w, &bias, &sb1, &fused);
    char m1[256];
    snprintf(m1, sizeof m1, "%s", ts_err_message());
    const int r2 = cb ? ts_conv3d_cat_forward_split(&a, &b, &w, &bias, &sb2, &fused)
                      : ts_conv3d_forward_split(&a, &w, &bias, &sb2, &fused);
    ts_ok(r1 == TS_ERR_ARG && r2 == TS_ERR_ARG && strstr(ts_err_message(), "activation 7"),
                   "bad epilogues refused: %s; %s", m1, ts_err_message());
    ts_nn_set_conv_precision(TS_PREC_FP32);
    free(ss);
    ts_tensor *all[] = {&a, &b, &w, &bias, &y, &ref, &fused, &g, &be, &rm, &rv, &sm, &si};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* The epilogue's maxima (ts_conv_ep.amax), which the U-Net hands to the
 * norm after the conv instead of a pass of its own: for each sample and
 * channel the largest |y| (+inf for a value that is not finite), the same
 * bits as a scalar pass over the output of the conv without them, which
 * the epilogue leaves unchanged; raised, not overwritten (a split's two
 * calls); in fp32, fp16 and bf16, direct and Winograd, on one input or a
 * concatenation. With inf a non-finite input voxel in sample 1. Then a
 * batch and an instance norm given the maxima (ts_norm_opts.amax) equal
 * the norms that find them, bit for bit. */
static void test_conv_amax(ts_precision prec, int wino, int ca, int cb, int OC, int inf)
{
    const int64_t N = 2, D = 6, H = 5, W = 9, V = D * H * W;
    ts_tensor a = MK(-1, 1, N, D, H, W, ca), b = MK(-1, 1, N, D, H, W, cb ? cb : 1);
    ts_tensor w = MK(-0.3f, 0.3f, OC, ca + cb, 3, 3, 3), bias = MK(-0.5f, 0.5f, OC), y = MK(0, 0, N, D, H, W, OC),
              y2 = MK(0, 0, N, D, H, W, OC);
    if (inf) ((float *)a.data)[((V + 2 * H * W + 3 * W + 4) * ca)] = INFINITY; /* sample 1 */
    float *am = malloc(2 * (size_t)N * OC * sizeof(float)), *ref = am + N * OC;
    int rc = ts_nn_set_conv_precision(prec) | ts_nn_set_winograd(wino);
    rc |= cb ? ts_conv3d_cat_forward(&a, &b, &w, &bias, 1, 1, &y) : ts_conv3d_forward(&a, &w, &bias, 1, 1, &y);
    for (int64_t i = 0; i < N * OC; i++) am[i] = i % 3 == 0 ? 0.25f : 0.0f; /* raised, not overwritten */
    const ts_conv_ep ep = {NULL, NULL, TS_EP_NONE, 0.0f, am};
    const ts_conv_split sp = {NULL, TS_CONV_ALL, NULL, NULL, &ep};
    rc |= cb ? ts_conv3d_cat_forward_split(&a, &b, &w, &bias, &sp, &y2) : ts_conv3d_forward_split(&a, &w, &bias, &sp, &y2);
    ts_nn_set_winograd(0);
    ts_nn_set_conv_precision(TS_PREC_FP32);
    const float *Y = y.data, *Y2 = y2.data;
    int64_t ydiff = 0, adiff = 0, infs = 0, big = 0;
    for (int64_t i = 0; i < N * V * OC; i++) ydiff += memcmp(Y + i, Y2 + i, sizeof(float)) != 0;
    for (int64_t n = 0; n < N; n++)
        for (int c = 0; c < OC; c++) {
            float m = (n * OC + c) % 3 == 0 ? 0.25f : 0.0f;
            for (int64_t v = 0; v < V; v++) {
                const float t = fabsf(Y[(n * V + v) * OC + c]), u = t <= FLT_MAX ? t : INFINITY;
                m = u > m ? u : m;
            }
            ref[n * OC + c] = m;
            adiff += memcmp(&m, am + n * OC + c, sizeof m) != 0;
            infs += isinf(m);
            big += m > 0.25f;
        }
    char in[32];
    if (cb) snprintf(in, sizeof in, "[%d, %d]", ca, cb);
    else snprintf(in, sizeof in, "%d", ca);
    const char *pn = prec == TS_PREC_BF16 ? "bf16" : prec == TS_PREC_FP16 ? "fp16" : "fp32";
    ts_ok(rc == 0 && ydiff == 0 && adiff == 0 && big == N * OC && (inf ? infs > 0 && infs < N * OC : infs == 0),
          "conv3d %s%s %s -> %d: the epilogue's maxima = a pass over the output, bit for bit (%lld of %lld differ; "
          "%lld +inf), the output unchanged (%lld differ)",
          pn, wino ? " Winograd" : "", in, OC, (long long)adiff, (long long)(N * OC), (long long)infs, (long long)ydiff);
    if (!inf) { /* the norms given the maxima */
        for (int64_t i = 0; i < N * OC; i++) am[i] = 0.0f;
        rc = cb ? ts_conv3d_cat_forward_split(&a, &b, &w, &bias, &sp, &y2) : ts_conv3d_forward_split(&a, &w, &bias, &sp, &y2);
        int64_t ndiff = 0;
        for (int kind = 0; kind < 2; kind++) {
            const int64_t ns = kind ? N * OC : OC;
            ts_tensor g = MK(0.5f, 2, OC), be = MK(-0.5f, 0.5f, OC), o1 = MK(0, 0, N, D, H, W, OC), o2 = MK(0, 0, N, D, H, W, OC);
            ts_tensor m1 = MK(0, 0, ns), i1 = MK(0, 0, ns), m2 = MK(0, 0, ns), i2 = MK(0, 0, ns);
            ts_norm_opts o = nopt(0, 1), oa = nopt(0, 1);
            oa.amax = am;
            if (kind == 0) {
                rc |= ts_batchnorm_forward(&y, &g, &be, NULL, NULL, 1, &o, &o1, &m1, &i1);
                rc |= ts_batchnorm_forward(&y, &g, &be, NULL, NULL, 1, &oa, &o2, &m2, &i2);
            } else {
                rc |= ts_instancenorm_forward(&y, &g, &be, &o, &o1, &m1, &i1);
                rc |= ts_instancenorm_forward(&y, &g, &be, &oa, &o2, &m2, &i2);
            }
            ndiff += memcmp(o1.data, o2.data, (size_t)(N * V * OC) * sizeof(float)) != 0;
            ndiff += memcmp(m1.data, m2.data, (size_t)ns * sizeof(float)) != 0;
            ndiff += memcmp(i1.data, i2.data, (size_t)ns * sizeof(float)) != 0;
            ts_tensor *t[] = {&g, &be, &o1, &o2, &m1, &i1, &m2, &i2};
            for (size_t k = 0; k < sizeof t / sizeof *t; k++) ts_tensor_free(t[k]);
        }
        ts_ok(rc == 0 && ndiff == 0, "... batch and instance norm given those maxima = finding them (%lld of 6 differ)",
              (long long)ndiff);
    }
    free(am);
    ts_tensor *all[] = {&a, &b, &w, &bias, &y, &y2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* The losses' 16-voxel softmax (its own vector exp) against double
 * precision over logits spread from -100 to 100 (exp's cut-off at -87 and
 * probabilities down to 1e-38 included), every block size; a voxel's
 * results must not depend on its lane; NaN stays NaN. */
static void test_softmax16(void)
{
    const int Ks[] = {1, 2, 3, 4, 17};
    double worst_p = 0, worst_l = 0;
    int lane_diff = 0, n = 0, tiny = 0;
    for (int ki = 0; ki < 5; ki++) {
        const int K = Ks[ki];
        float l[16 * 17], p[17 * 16], lse[16], p1[17 * 16], lse1[16];
        for (int rep = 0; rep < 200; rep++) {
            const float spread = rep % 4 == 0 ? 200.0f : rep % 4 == 1 ? 20.0f : rep % 4 == 2 ? 2.0f : 1e-3f;
            for (int i = 0; i < 16 * K; i++) l[i] = (ts_rng_uniform(&rng) - 0.5f) * spread;
            const int nv = 1 + rep % 16;
            ts_nn_softmax16(l, K, nv, p, lse);
            for (int j = 0; j < nv; j++) {
                double m = l[j * K], s = 0;
                for (int k = 1; k < K; k++) m = l[j * K + k] > m ? l[j * K + k] : m;
                for (int k = 0; k < K; k++) s += exp((double)l[j * K + k] - m);
                for (int k = 0; k < K; k++) {
                    const double want = exp((double)l[j * K + k] - m) / s;
                    const float got = p[k * 16 + j];
                    /* relative down to 1e-36; below, within 1e-37 absolute (exp is
                     * cut to 0 below -87.3, where its value is 1.2e-38) */
                    if (want > 1e-36) {
                        /* over its bound: exp (about 1.5 ulp), the division, and the float
                         * difference l - max (half an ulp of it, relative to exp) */
                        const double d = fabs((double)l[j * K + k] - m);
                        const double e = fabs(got - want) / want / (4e-7 + 6e-8 * d);
                        worst_p = e > worst_p ? e : worst_p;
                    } else {
                        tiny++;
                        if (fabs(got - want) > 1e-37) worst_p = 2;
                    }
                    n++;
                }
                const double wl = m + log(s), el = fabs(lse[j] - wl) / (fabs(wl) > 1 ? fabs(wl) : 1);
                worst_l = el > worst_l ? el : worst_l;
                /* the same voxel alone in lane 0 */
                ts_nn_softmax16(l + j * K, K, 1, p1, lse1);
                for (int k = 0; k < K; k++) lane_diff += memcmp(&p1[k * 16], &p[k * 16 + j], sizeof(float)) != 0;
                lane_diff += memcmp(&lse1[0], &lse[j], sizeof(float)) != 0;
            }
        }
    }
    ts_ok(n > 10000 && worst_p <= 1 && worst_l < 1e-6 && tiny > 0,
          "16-voxel softmax vs double: %d probabilities (%d below 1e-36: within 1e-37), worst error %.2f of its bound "
          "(4e-7 + 6e-8 |l - max| relative), log-sum-exp %.2e (bound 1e-6)",
          n, tiny, worst_p, worst_l);
    ts_ok(lane_diff == 0, "16-voxel softmax: a voxel alone in lane 0 = the same voxel in its block, bit for bit (%d differ)",
          lane_diff);
    float l[3] = {0.5f, NAN, 1.0f}, p[3 * 16], lse[16];
    ts_nn_softmax16(l, 3, 1, p, lse);
    ts_ok(isnan(lse[0]) || isnan(p[0]) || isnan(p[32]), "16-voxel softmax: a NaN logit gives NaN (lse %g, p %g %g %g)",
          lse[0], p[0], p[16], p[32]);
}

/* 1x1x1 convolutions with at most 16 output channels (the segmentation
 * heads) run the pointwise kernels (src/nn/conv_pointwise.c): forward and
 * input gradient bitwise equal to the gather driver's
 * (ts_nn_set_pointwise(0)) in fp32 and in each bf16 variant, also with a
 * NaN, infinities, denormals and signed zeros among the inputs (specials:
 * forward and input gradient only); the weight gradient against double
 * references (bf16: on rounded operands) and bitwise the same with 1, 2, 3
 * threads; the kernels counted as they run */
static void test_pointwise(int N, int D, int H, int W, int C, int OC, int bias, int specials)
{
    ts_tensor x = MK(-1, 1, N, D, H, W, C), w = MK(-0.5f, 0.5f, OC, C, 1, 1, 1), b = MK(-1, 1, OC);
    ts_tensor dy = MK(-1, 1, N, D, H, W, OC);
    const int64_t nx = ts_tensor_numel(&x), ny = ts_tensor_numel(&dy), nw = ts_tensor_numel(&w);
    if (specials) {
        float *p = x.data, *q = dy.data;
        const float sp[] = {NAN, INFINITY, -INFINITY, 1e-40f, -3e-39f, -0.0f, 0.0f, 3.4e38f, -1.5e-38f};
        for (size_t i = 0; i < sizeof sp / sizeof *sp; i++) {
            p[(i * 37 + 5) % (size_t)nx] = sp[i];
            if (i >= 3) q[(i * 11 + 2) % (size_t)ny] = sp[i]; /* dy: finite specials (a NaN would spread to all of dx's row) */
        }
    }
    const ts_conv_geom g = {N, D, H, W, C, D, H, W, OC, 1, 1, 0};
    const char *names[3];
    const int nvar = bf16_variants(names);
    char what[96];
    snprintf(what, sizeof what, "1x1x1 conv %dx%dx%dx%dx%d -> %d%s%s", N, D, H, W, C, OC, bias ? " (bias)" : "",
             specials ? " with NaN, inf, denormals, -0" : "");
    int rc = 0, fits = ts_nn_pw_fits(&g);
    for (int v = 0; v <= nvar; v++) { /* v == 0: fp32; then the bf16 variants */
        const int bf = v > 0;
        if (bf) rc |= ts_nn_bf16_select_isa(names[v - 1]);
        rc |= ts_nn_set_conv_precision(bf ? TS_PREC_BF16 : TS_PREC_FP32);
        ts_tensor y[2], dx[2], dw[2];
        long calls[2];
        for (int pw = 0; pw < 2; pw++) {
            ts_nn_set_pointwise(pw);
            y[pw] = MK(0, 0, N, D, H, W, OC);
            dx[pw] = MK(0, 0, N, D, H, W, C);
            dw[pw] = MK(0, 0, OC, C, 1, 1, 1);
            const long c0 = ts_nn_pw_calls();
            rc |= ts_conv3d_forward(&x, &w, bias ? &b : NULL, 1, 0, &y[pw]);
            rc |= ts_conv3d_backward(&x, &w, 1, 0, &dy, &dx[pw], specials ? NULL : &dw[pw], NULL);
            calls[pw] = ts_nn_pw_calls() - c0;
        }
        ts_nn_set_pointwise(1);
        /* AMX: the gather driver's tiles sum in another order than the
         * pointwise kernels (VDPBF16PS): equal within fp32 rounding of the
         * tensor's scale, specials (NaN, inf) in the same places */
        const int amx = bf && !strcmp(names[v - 1], "amx");
        int same_y = 1, same_dx = !memcmp(dx[0].data, dx[1].data, (size_t)nx * 4);
        double ymax = 0, yerr = 0, dxerr = 0;
        for (int64_t i = 0; i < ny; i++) {
            const float a = ((const float *)y[0].data)[i], c = ((const float *)y[1].data)[i];
            if (amx && isfinite(a) && isfinite(c)) yerr = fmax(yerr, fabs((double)a - c));
            else same_y &= !memcmp(&a, &c, 4) || (isnan(a) && isnan(c));
            if (isfinite(c)) ymax = fmax(ymax, fabs(c));
        }
        if (amx) {
            dxerr = max_rel_f(dx[1].data, dx[0].data, nx);
            same_dx = dxerr < 1e-5 || specials; /* specials: NaN spreads along dx's rows in both */
            same_y &= yerr <= 1e-5 * ymax;
        }
        const char *vn = bf ? names[v - 1] : "fp32";
        ts_ok(rc == 0 && fits && calls[0] == 0 && calls[1] == (specials ? 2 : 3) && same_y && same_dx && ymax > 0,
              "%s %s: the pointwise kernels ran (%ld calls) and equal the gather driver's forward and input gradient %s", vn,
              what, calls[1], amx ? "within fp32 rounding (the AMX gather sums in another order)" : "bit for bit");
        if (!specials) {
            ts_tensor xr = bf ? rounded(&x) : x, wr = bf ? rounded(&w) : w, dyr = bf ? rounded(&dy) : dy;
            double *rdx = malloc(sizeof(double) * nx), *rdw = malloc(sizeof(double) * nw), *rdb = malloc(sizeof(double) * OC);
            ref_conv_bwd(&xr, &wr, 1, 0, &dyr, rdx, rdw, rdb);
            const double ew = max_rel(dw[1].data, rdw, nw), eg = max_rel_f(dw[1].data, dw[0].data, nw);
            ts_ok(rc == 0 && ew < 1e-5 && eg < 1e-5,
                  "%s %s: pointwise weight gradient = double reference%s (%.1e; %.1e from the wgrad driver's)", vn, what,
                  bf ? " on bf16-rounded operands" : "", ew, eg);
            free(rdx);
            free(rdw);
            free(rdb);
            if (bf) {
                ts_tensor_free(&xr);
                ts_tensor_free(&wr);
                ts_tensor_free(&dyr);
            }
#ifdef _OPENMP
            const int nt0 = omp_get_max_threads();
            int same = 1;
            for (int nt = 1; nt <= 3; nt++) {
                omp_set_num_threads(nt);
                ts_tensor o[3] = {MK(0, 0, N, D, H, W, OC), MK(0, 0, N, D, H, W, C), MK(0, 0, OC, C, 1, 1, 1)};
                rc |= ts_conv3d_forward(&x, &w, bias ? &b : NULL, 1, 0, &o[0]);
                rc |= ts_conv3d_backward(&x, &w, 1, 0, &dy, &o[1], &o[2], NULL);
                same &= !memcmp(o[0].data, y[1].data, (size_t)ny * 4) && !memcmp(o[1].data, dx[1].data, (size_t)nx * 4) &&
                        !memcmp(o[2].data, dw[1].data, (size_t)nw * 4);
                for (int t = 0; t < 3; t++) ts_tensor_free(&o[t]);
            }
            omp_set_num_threads(nt0);
            ts_ok(rc == 0 && same, "%s %s: pointwise forward and backward bitwise the same with 1, 2, 3 threads", vn, what);
#endif
        }
        for (int pw = 0; pw < 2; pw++) {
            ts_tensor_free(&y[pw]);
            ts_tensor_free(&dx[pw]);
            ts_tensor_free(&dw[pw]);
        }
    }
    rc |= ts_nn_set_conv_precision(TS_PREC_FP32);
    rc |= ts_nn_bf16_select_isa("auto");
    ts_tensor *all[] = {&x, &w, &b, &dy};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* The bias gradient summed by the weight-gradient driver from its items'
 * rows (conv_kernels.c, wgrad_impl): against a double sum of dy, the same
 * bits in fp32, bf16 and fp16 and with 1, 2, 3 threads; shapes with one
 * chunk per item group (taps split in groups), strides 1 and 2, channel
 * counts with and without whole vectors */
static void test_wgrad_bias(int N, int D, int C, int OC, int k, int s, int p)
{
    ts_tensor x = MK(-1, 1, N, D, D + 1, D + 2, C), w = MK(-0.5f, 0.5f, OC, C, k, k, k);
    const int64_t OD = ts_conv_out_size(D, k, s, p), OH = ts_conv_out_size(D + 1, k, s, p), OW = ts_conv_out_size(D + 2, k, s, p);
    ts_tensor dy = MK(-1, 1, N, OD, OH, OW, OC), dw = MK(0, 0, OC, C, k, k, k);
    const int64_t V = N * OD * OH * OW;
    const float *g = dy.data;
    double *ref = calloc((size_t)OC, sizeof(double));
    for (int64_t v = 0; v < V; v++)
        for (int c = 0; c < OC; c++) ref[c] += g[v * OC + c];
    for (int c = 0; c < OC; c++) ref[c] += 0.5;
    float db[3][4][128];
    int rc = 0, same = 1;
#ifdef _OPENMP
    const int nt0 = omp_get_max_threads();
#endif
    for (int pr = 0; pr < 3; pr++)
        for (int t = 1; t <= 3; t++) {
#ifdef _OPENMP
            omp_set_num_threads(t);
#endif
            rc |= ts_nn_set_conv_precision(pr == 0 ? TS_PREC_FP32 : pr == 1 ? TS_PREC_BF16 : TS_PREC_FP16);
            ts_tensor b = mk(1, (const int64_t[]){OC}, 0.5f, 0.5f);
            rc |= ts_conv3d_backward(&x, &w, s, p, &dy, NULL, &dw, &b);
            memcpy(db[pr][t], b.data, (size_t)OC * 4);
            same &= !memcmp(db[pr][t], db[0][1], (size_t)OC * 4);
            ts_tensor_free(&b);
        }
#ifdef _OPENMP
    omp_set_num_threads(nt0);
#endif
    rc |= ts_nn_set_conv_precision(TS_PREC_FP32);
    const double e = max_rel(db[0][1], ref, OC);
    ts_ok(rc == 0 && e < 5e-6 && same,
          "conv %dx%dx%dx%dx%d -> %d k%d s%d: bias gradient from the weight gradient's items = double sum + 0.5 (%.1e), the same bits "
          "in fp32, bf16, fp16 and with 1, 2, 3 threads", N, D, D + 1, D + 2, C, OC, k, s, e);
    free(ref);
    ts_tensor *all[] = {&x, &w, &dy, &dw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* The one-pass bf16 backward of k = s = 2 transposed convolutions
 * (convt3d.c) against the separate drivers it replaces: it ran; the input
 * gradient bit for bit; the weight gradient against the double reference on
 * bf16-rounded operands and the same bits with 1, 2, 3 threads and with dx
 * not asked; each bf16 variant. Shapes: odd widths, partial row blocks,
 * channel counts off the 16-blocks. */
static void test_convt_fused(int N, int D, int H, int W, int C, int OC)
{
    ts_tensor x = MK(-1, 1, N, D, H, W, C), w = MK(-0.5f, 0.5f, C, OC, 2, 2, 2);
    ts_tensor dy = MK(-1, 1, N, 2 * D, 2 * H, 2 * W, OC), xr = rounded(&x), wr = rounded(&w), dyr = rounded(&dy);
    const int64_t nx = ts_tensor_numel(&x), nw = ts_tensor_numel(&w);
    double *rdx = malloc(sizeof(double) * nx), *rdw = malloc(sizeof(double) * nw);
    ref_convt_bwd(&xr, &wr, 2, &dyr, rdx, rdw);
    const char *names[3];
    const int nvar = bf16_variants(names);
#ifdef _OPENMP
    const int nt0 = omp_get_max_threads();
#endif
    int rc = ts_nn_set_conv_precision(TS_PREC_BF16);
    for (int v = 0; v < nvar; v++) {
        rc |= ts_nn_bf16_select_isa(names[v]);
        ts_tensor dx[5], dw[5]; /* 0: separate drivers; 1-3: one pass on 1-3 threads; 4: dw alone */
        long calls = 0;
        for (int r = 0; r < 5; r++) {
            dx[r] = MK(0, 0, N, D, H, W, C);
            dw[r] = MK(0, 0, C, OC, 2, 2, 2);
            ts_nn_set_convt_fused(r > 0);
#ifdef _OPENMP
            omp_set_num_threads(r >= 1 && r <= 3 ? r : nt0);
#endif
            const long c0 = ts_nn_convt_fused_calls();
            rc |= ts_convt3d_backward(&x, &w, 2, &dy, r < 4 ? &dx[r] : NULL, &dw[r], NULL);
            calls += ts_nn_convt_fused_calls() - c0;
        }
#ifdef _OPENMP
        omp_set_num_threads(nt0);
#endif
        ts_nn_set_convt_fused(1);
        int same_dx = 1, same_dw = 1;
        for (int r = 1; r < 4; r++) same_dx &= !memcmp(dx[r].data, dx[0].data, (size_t)nx * 4);
        for (int r = 2; r < 5; r++) same_dw &= !memcmp(dw[r].data, dw[1].data, (size_t)nw * 4);
        const double ex = max_rel(dx[1].data, rdx, nx), ew = max_rel(dw[1].data, rdw, nw), e0 = max_rel(dw[0].data, rdw, nw);
        const double wmax = fabs(((const float *)dw[1].data)[nw / 2]) + fabs(((const float *)dw[1].data)[0]);
        ts_ok(rc == 0 && calls == 4 && same_dx && same_dw && ex < 1e-5 && ew < 1e-5 && e0 < 1e-5 && wmax > 0,
              "bf16 (%s) convt3d %dx%dx%dx%dx%d -> %d k2 s2 in one pass (%ld calls): dx bitwise the separate gather's, dw "
              "= double on rounded operands %.1e (separate drivers %.1e), the same bits on 1-3 threads and without dx",
              names[v], N, D, H, W, C, OC, calls, ew, e0);
        for (int r = 0; r < 5; r++) {
            ts_tensor_free(&dx[r]);
            ts_tensor_free(&dw[r]);
        }
    }
    rc |= ts_nn_set_conv_precision(TS_PREC_FP32);
    rc |= ts_nn_bf16_select_isa("auto");
    free(rdx);
    free(rdw);
    ts_tensor *all[] = {&x, &w, &dy, &xr, &wr, &dyr};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "isa")) { /* for tests/nn/bf16_isa.sh: the variant chosen on first use */
        printf("%s\n", ts_nn_bf16_isa());
        return 0;
    }
    ts_rng_init(&rng, 42, 0, 0);
    test_softmax16();
    /* fast kernels vs references: tile tails, padded channels, strides */
    test_conv_vs_ref(2, 5, 6, 7, 3, 5, 3, 1, 1, 1);
    test_conv_vs_ref(1, 4, 4, 37, 16, 16, 3, 1, 1, 1);
    test_conv_vs_ref(1, 3, 5, 19, 32, 32, 3, 1, 1, 0);
    test_conv_vs_ref(1, 3, 3, 13, 20, 70, 3, 1, 1, 1);
    test_conv_vs_ref(2, 4, 4, 4, 64, 128, 3, 1, 1, 1);
    test_conv_vs_ref(1, 5, 6, 7, 1, 16, 3, 1, 1, 1);
    test_conv_vs_ref(2, 8, 12, 20, 1, 16, 3, 1, 1, 1); /* one channel: the weight gradient's every-tap kernel */
    test_conv_vs_ref(2, 8, 12, 20, 1, 13, 3, 1, 1, 0);
    test_conv_vs_ref(2, 4, 5, 6, 16, 4, 1, 1, 0, 1);
    test_conv_vs_ref(1, 7, 6, 9, 5, 6, 3, 2, 1, 1);
    test_conv_vs_ref(1, 8, 8, 8, 4, 3, 2, 2, 0, 1);
    test_conv_vs_ref(1, 6, 5, 7, 3, 4, 3, 1, 0, 1);
    test_conv_vs_ref(1, 5, 5, 5, 2, 3, 1, 2, 0, 1);
    /* at most 8 output channels, 3x3x3 stride 1: voxel pairs (odd and even
     * widths, tails of 1..7 pairs, channels a multiple of 8 or not) */
    test_conv_vs_ref(2, 4, 3, 17, 8, 8, 3, 1, 1, 1);
    test_conv_vs_ref(1, 3, 4, 1, 8, 8, 3, 1, 1, 0);
    test_conv_vs_ref(1, 3, 3, 30, 16, 8, 3, 1, 1, 1);
    test_conv_vs_ref(1, 4, 4, 5, 1, 8, 3, 1, 1, 1);
    test_conv_vs_ref(1, 3, 3, 11, 12, 3, 3, 1, 1, 1);
    test_conv_vs_ref(2, 6, 7, 9, 13, 7, 3, 1, 1, 1); /* fp32 weight gradient's voxel-pair tiles: channel runs 8, 4, 1; odd W */
    test_conv_pairs(2, 5, 6, 33, 8, 8, 16, 1, 1);
    test_conv_pairs(1, 4, 5, 18, 16, 8, 9, 1, 0);
    test_conv_pairs(1, 3, 4, 7, 1, 8, 24, 1, 1);
    test_conv_pairs(1, 4, 4, 9, 12, 5, 16, 0, 1);
    test_convt_vs_ref(2, 3, 32, 16, 2, 2);
    test_convt_vs_ref(1, 4, 5, 7, 2, 2);
    test_convt_vs_ref(1, 3, 3, 4, 3, 2);
    test_convt_vs_ref(1, 3, 64, 40, 2, 2);
    test_convt_k2_order(32, 16, 1);
    test_convt_k2_order(5, 7, 0);
    test_convt_k2_order(24, 40, 1);
    test_convt_k2_order(64, 80, 1);
    test_conv_cat(16, 16, 16);
    test_conv_cat(32, 32, 32);
    test_conv_cat(4, 8, 6);
    test_conv_cat(20, 12, 16);
    for (int bf = 0; bf < 2; bf++) {
        test_conv_epilogue(8, 0, 8, TS_EP_RELU, bf);  /* voxel pairs, the 16-lane pattern */
        test_conv_epilogue(3, 0, 5, TS_EP_LEAKY, bf); /* pairs, a channel count not dividing 16 */
        test_conv_epilogue(8, 8, 8, TS_EP_RELU, bf);  /* a concatenation */
        test_conv_epilogue(16, 0, 16, TS_EP_LEAKY, bf);
        test_conv_epilogue(16, 16, 24, TS_EP_RELU, bf); /* a partial channel vector */
        test_conv_epilogue(12, 0, 32, TS_EP_RELU, bf);  /* whole vectors of 16 */
    }
    /* the epilogue's maxima for the norm after the conv */
    for (int pi = 0; pi < 3; pi++) {
        const ts_precision pr = pi == 0 ? TS_PREC_FP32 : pi == 1 ? TS_PREC_BF16 : TS_PREC_FP16;
        test_conv_amax(pr, 0, 3, 0, 5, 0);   /* a channel count not dividing 16 */
        test_conv_amax(pr, 0, 1, 0, 8, 1);   /* the voxel pairs, a non-finite input */
        test_conv_amax(pr, 0, 8, 8, 16, 0);  /* a concatenation, lanes = channels */
        test_conv_amax(pr, 0, 16, 0, 24, 1); /* a partial vector */
        test_conv_amax(pr, 0, 12, 0, 32, 0);
    }
    test_conv_amax(TS_PREC_FP32, 1, 16, 0, 16, 0); /* Winograd */
    test_conv_amax(TS_PREC_FP32, 1, 16, 16, 24, 1);
    test_conv_amax(TS_PREC_FP32, 1, 32, 0, 40, 0);
    /* bf16: the same shapes, each variant, against references on rounded operands */
    test_bf16_switch();
    test_bf16_shape(0, 2, 5, 6, 7, 3, 5, 3, 1, 1, 1);
    test_bf16_shape(0, 1, 4, 4, 37, 16, 16, 3, 1, 1, 1);
    test_bf16_shape(0, 1, 3, 5, 19, 32, 32, 3, 1, 1, 0);
    test_bf16_shape(0, 1, 3, 3, 13, 20, 70, 3, 1, 1, 1);
    test_bf16_shape(0, 2, 4, 4, 4, 64, 128, 3, 1, 1, 1);
    test_bf16_shape(0, 1, 3, 4, 11, 8, 96, 3, 1, 1, 1); /* 96 output channels: the three-tap weight gradient, 32 at a time */
    test_bf16_shape(0, 1, 5, 6, 7, 1, 16, 3, 1, 1, 1);
    test_bf16_shape(0, 2, 8, 12, 20, 1, 16, 3, 1, 1, 1); /* one channel: the weight gradient's every-tap kernel */
    test_bf16_shape(0, 2, 8, 12, 20, 1, 13, 3, 1, 1, 0);
    test_bf16_shape(0, 2, 4, 5, 6, 16, 4, 1, 1, 0, 1);
    test_bf16_shape(0, 1, 7, 6, 9, 5, 6, 3, 2, 1, 1);
    test_bf16_shape(0, 1, 8, 8, 8, 4, 3, 2, 2, 0, 1);
    /* at most 8 output channels: voxel pairs (channel pairs 4, 8, 12 and 6 a voxel) */
    test_bf16_shape(0, 1, 3, 3, 37, 8, 8, 3, 1, 1, 1); /* a whole tile of 16 voxel pairs and a remainder */
    test_bf16_shape(0, 2, 4, 3, 17, 8, 8, 3, 1, 1, 1);
    test_bf16_shape(0, 1, 3, 3, 30, 16, 8, 3, 1, 1, 0);
    test_bf16_shape(0, 1, 3, 4, 9, 24, 7, 3, 1, 1, 1);
    test_bf16_shape(0, 1, 3, 3, 11, 12, 3, 3, 1, 0, 1);
    test_bf16_shape(0, 1, 6, 5, 7, 3, 4, 3, 1, 0, 1);
    test_bf16_shape(0, 1, 5, 5, 5, 2, 3, 1, 2, 0, 1);
    test_bf16_shape(0, 1, 4, 5, 6, 17, 33, 3, 1, 1, 1);
    test_bf16_shape(0, 1, 9, 7, 11, 6, 5, 3, 3, 1, 1);
    /* one output channel: the weight gradient's output-gradient rows (one channel, 16 words a column pair) */
    test_bf16_shape(0, 1, 4, 4, 4, 4, 1, 3, 1, 1, 1);
    test_bf16_shape(0, 1, 4, 4, 9, 8, 1, 1, 1, 0, 1);
    /* weight-gradient items that follow each other along D (the bf16 plane ring), strides 1 and 2 */
    test_bf16_shape(0, 2, 6, 9, 70, 5, 20, 3, 1, 1, 1);
    test_bf16_shape(0, 1, 5, 16, 40, 16, 16, 3, 1, 1, 0);
    test_bf16_shape(0, 1, 9, 20, 60, 4, 6, 3, 2, 1, 1);
    test_bf16_shape(1, 2, 3, 4, 3, 32, 16, 2, 2, 0, 1);
    test_bf16_shape(1, 1, 4, 5, 4, 5, 7, 2, 2, 0, 1);
    test_bf16_shape(1, 1, 3, 4, 3, 3, 4, 3, 2, 0, 1);
    test_bf16_shape(1, 1, 3, 4, 3, 64, 40, 2, 2, 0, 0);
    if (amx_shapes)
        ts_ok(amx_differ[0] > 0 && amx_differ[1] > 0 && amx_differ[2] > 0,
              "the AMX variant ran: y differs from VDPBF16PS's last bits in %d of %d shapes, dx in %d, dw in %d", amx_differ[0],
              amx_shapes, amx_differ[1], amx_differ[2]);
    test_bf16_cat(16, 16, 16);
    test_bf16_cat(32, 32, 32);
    test_bf16_cat(4, 8, 6);
    test_bf16_cat(20, 12, 16);
    test_bf16_cat(3, 6, 5);
    test_bf16_cat(8, 8, 8);  /* eights: the unpaired put's [8, 8] path (the demo's last level) */
    test_bf16_cat(24, 8, 12);
    test_bf16_threads();
    /* the pointwise kernels (1x1x1, at most 16 output channels, channels a multiple of 8): whole and partial blocks of 16 voxels */
    test_pointwise(2, 4, 5, 8, 16, 4, 1, 0);
    test_pointwise(1, 3, 5, 7, 32, 3, 0, 0);
    test_pointwise(2, 2, 3, 5, 48, 16, 1, 0);
    test_pointwise(1, 4, 4, 4, 16, 1, 1, 0);
    test_pointwise(1, 3, 4, 5, 16, 4, 1, 1);
    test_pointwise(1, 2, 3, 7, 32, 7, 0, 1);
    test_pointwise(1, 3, 4, 6, 8, 4, 1, 0);  /* 8 channels: the demo's head, half blocks */
    test_pointwise(2, 2, 3, 5, 24, 3, 0, 0); /* a whole and a half block */
    test_pointwise(1, 2, 5, 5, 8, 2, 1, 1);
    /* fp16: the rounding, the same kinds of shapes, the range */
    test_fp16_round();
    test_fp16_shape(0, 2, 5, 6, 7, 3, 5, 3, 1, 1, 1);
    test_fp16_shape(0, 1, 4, 4, 37, 16, 16, 3, 1, 1, 1);
    test_fp16_shape(0, 1, 3, 3, 13, 20, 70, 3, 1, 1, 1);
    test_fp16_shape(0, 2, 4, 5, 6, 16, 4, 1, 1, 0, 1);
    test_fp16_shape(0, 1, 7, 6, 9, 5, 6, 3, 2, 1, 1);
    test_fp16_shape(0, 1, 8, 8, 8, 4, 3, 2, 2, 0, 1);
    test_fp16_shape(0, 2, 6, 9, 70, 5, 20, 3, 1, 1, 1);
    test_fp16_shape(1, 2, 3, 4, 3, 32, 16, 2, 2, 0, 1);
    test_fp16_shape(1, 1, 3, 4, 3, 3, 4, 3, 2, 0, 1);
    test_fp16_range();
    /* finite differences */
    fd_conv(3, 4, 4, 3, 1, 1);
    fd_conv(3, 2, 5, 3, 2, 1);
    fd_conv(4, 3, 3, 1, 1, 0);
    fd_convt(4, 3, 2, 2, 2);
    fd_convt(2, 3, 2, 3, 2);
    fd_pool(2);
    test_pool_ties(20);
    test_pool_ties(8);
    test_pool_ties(28);
    fd_norm("batch norm (train)", 0, 1, 0, 0);
    fd_norm("batch norm (eval)", 0, 0, 0, 0);
    fd_norm("group norm (3 groups)", 1, 1, 3, 0);
    fd_norm("instance norm", 1, 1, 0, 0);
    for (int leaky = 0; leaky < 2; leaky++)
        for (int64_t C = 6; C <= 16; C += 10) {
            const float slope = leaky ? 0.01f : 0.0f;
            fused_norm("batch norm (train)", 0, 1, 0, C, slope);
            fused_norm("batch norm (eval)", 0, 0, 0, C, slope);
            fused_norm("group norm", 1, 1, C == 6 ? 3 : 4, C, slope);
            fused_norm("instance norm", 1, 1, 0, C, slope);
        }
    fd_relu(0);
    fd_relu(0.01f);
    fd_concat();
    fd_loss(0, -1, 0);
    fd_loss(0, 1, 1);
    fd_loss(1, -1, 0);
    fd_loss(1, 2, 0);
    test_loss_values();
    test_loss_blocks();
    test_bn_running();
    test_bn_accuracy();
    test_norm_order();
    test_norm_channels(80);
    test_norm_channels(40);
    test_norm_channels(24);
    test_bias_grad_channels();
    test_wgrad_bias(1, 3, 4, 5, 3, 1, 1);   /* few items: the taps in groups */
    test_wgrad_bias(2, 9, 16, 32, 3, 1, 1); /* whole vectors, 16 chunks */
    test_wgrad_bias(1, 11, 8, 20, 3, 2, 1); /* stride 2, a partial vector */
    test_wgrad_bias(2, 6, 32, 80, 3, 1, 0);
    test_convt_fused(2, 3, 5, 7, 32, 16);  /* odd width */
    test_convt_fused(1, 2, 10, 64, 20, 7); /* row blocks of 4 (the last of 2), 16 + 4 channels, odd OC */
    test_convt_fused(2, 4, 4, 4, 64, 40);  /* three output-channel vectors */
    test_convt_fused(2, 3, 4, 6, 32, 16);  /* even width, whole vectors: the staging writes every word, no zeroing */
    test_channel_affine();
    return ts_done();
}
