/* Every kernel launcher of src/nn/cuda/nn_kernels.cu (and of
 * src/optim/cuda/optim_kernels.cu: the updates bit for bit the CPU
 * optimizer's) run on the CPU by the
 * CUDA emulator (tests/nn/cuda_emu.h; the .cu rewritten by cuda_emu.py):
 * each result against a plain loop written here from the launcher's
 * contract in src/nn/cuda/cuda_nn.h, on random data of odd sizes, with
 * the tiled kernels' grid-stride loops going round and channel counts
 * past their 256-thread blocks. Layout kernels (packing, padding,
 * gathers, im2col, concatenation, pooling) must match bit for bit; sums
 * within 1e-5 of the tensor's own scale (float sums in another order).
 * Every buffer has guard bytes on both sides, checked after each launch:
 * a write out of bounds fails the check that made it. Runs in every build
 * (no GPU, no CUDA needed); what it cannot see: races between blocks
 * (they run one after another), warps, speed, and cuDNN/cuBLAS. */
#include "tsbuild.h"
#include "src/core/dtype.h"
#include "src/core/tensor.h"
#include "src/nn/layers.h"
#include "tests/nn/kernels_emu.h" /* ts_cuk_* -> tsemu_cuk_* */
#include "src/core/error.h"
#include "src/nn/cuda/cuda_nn.h"
#include "src/optim/cuda/optim_cuda.h"
#include "src/optim/optim.h"
#include "tests/tap.h"
#include "tests/nn/rand_tensor.h" /* rng, mk */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/nn/cuda_emu_rt.h" /* tsemu_launches, tsemu_gemms, tsemu_selftest */

/* ---- guarded buffers: 64 guard bytes before and after, checked by guards_ok ---- */
enum { GUARD = 64, MAXBUF = 64 };
static unsigned char *bufs[MAXBUF];
static size_t sizes[MAXBUF];
static int nbuf;

static void *galloc(size_t bytes)
{
    if (nbuf == MAXBUF) abort();
    unsigned char *p = malloc(bytes + 2 * GUARD);
    if (!p) abort();
    memset(p, 0xA5, bytes + 2 * GUARD);
    bufs[nbuf] = p;
    sizes[nbuf++] = bytes;
    return p + GUARD;
}

/* 1 when no guard byte changed; frees every buffer */
static int guards_ok(void)
{
    int ok = 1;
    for (int i = 0; i < nbuf; i++) {
        for (size_t k = 0; k < GUARD; k++)
            if (bufs[i][k] != 0xA5 || bufs[i][GUARD + sizes[i] + k] != 0xA5) ok = 0;
        free(bufs[i]);
    }
    nbuf = 0;
    return ok;
}

/* cond, after checking and freeing the buffers (always, so that a failed check leaks nothing) */
static int checked(int cond) { return guards_ok() && cond; }

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}
static float *frand(size_t n, double lo, double hi)
{
    float *p = galloc(n * sizeof(float) + 1); /* + 1: never a 16-byte multiple by accident */
    for (size_t i = 0; i < n; i++) p[i] = (float)(lo + (hi - lo) * urand());
    return p;
}
static float *fzero(size_t n)
{
    float *p = galloc(n * sizeof(float));
    memset(p, 0, n * sizeof(float));
    return p;
}

/* max |a - b| / max |b|: 1e30 if b is all zero or a holds a NaN (fmax would drop it) */
static double rel(const double *a, const double *b, size_t n)
{
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs(a[i] - b[i]);
        if (!(d <= m)) m = isnan(d) ? 1e30 : d;
        s = fmax(s, fabs(b[i]));
    }
    return s > 0 ? m / s : 1e30;
}
static double relf(const float *a, const float *b, size_t n)
{
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = isnan(d) ? 1e30 : d;
        s = fmax(s, fabs((double)b[i]));
    }
    return s > 0 ? m / s : 1e30;
}

static uint16_t to16(float f, int fp16) { return fp16 ? ts_f32_to_f16(f) : ts_f32_to_bf16(f); }

/* ------------------------------------------------------------------ weights and half staging */
static void check_pack(void)
{
    const int rows = 5, cols = 7, taps = 27;
    const size_t n = (size_t)rows * cols * taps;
    for (int flip = 0; flip < 2; flip++) {
        float *w = frand(n, -1, 1), *wp = fzero(n);
        int err = ts_cuk_wpack(w, wp, rows, cols, taps, flip, NULL), bad = 0;
        for (int r = 0; r < rows; r++)
            for (int t = 0; t < taps; t++)
                for (int c = 0; c < cols; c++)
                    bad += wp[((size_t)r * taps + t) * cols + c] != w[((size_t)r * cols + c) * taps + (flip ? taps - 1 - t : t)];
        float *acc = frand(n, -1, 1), *want = fzero(n);
        for (size_t i = 0; i < n; i++) want[i] = acc[i];
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++)
                for (int t = 0; t < taps; t++) want[((size_t)r * cols + c) * taps + t] += wp[((size_t)r * taps + t) * cols + c];
        err |= ts_cuk_wunpack_add(wp, acc, rows, cols, taps, NULL);
        ts_ok(checked(!err && !bad && !memcmp(acc, want, n * sizeof(float))),
              "weight pack (flip %d) and unpack-add: %d misplaced", flip, bad);
    }
    /* padded to rp x cp, and the gradient unpacked from rows of cp */
    const int rp = 8, cp = 8;
    float *w = frand(n, -1, 1), *wp = frand((size_t)rp * cp * taps, 5, 6);
    int err = ts_cuk_wpack_pad(w, wp, rows, cols, taps, rp, cp, NULL), bad = 0;
    for (int r = 0; r < rp; r++)
        for (int t = 0; t < taps; t++)
            for (int j = 0; j < cp; j++) {
                const float want = r < rows && j < cols ? w[((size_t)r * cols + j) * taps + t] : 0.0f;
                bad += wp[((size_t)r * taps + t) * cp + j] != want;
            }
    float *acc = frand(n, -1, 1), *want = fzero(n);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            for (int t = 0; t < taps; t++) {
                const size_t i = ((size_t)r * cols + c) * taps + t;
                want[i] = acc[i] + wp[((size_t)r * taps + t) * cp + c];
            }
    err |= ts_cuk_wunpack_add_pad(wp, acc, rows, cols, taps, cp, NULL);
    ts_ok(checked(!err && !bad && !memcmp(acc, want, n * sizeof(float))),
          "weight pack and unpack-add padded to 8 x 8: %d misplaced", bad);
}

static void check_half(void)
{
    const size_t n = 70001;
    for (int fp16 = 0; fp16 < 2; fp16++) {
        float *x = frand(n, -3, 3), *r = fzero(n), *back = frand(n, -1, 1), *back0 = fzero(n);
        uint16_t *h = galloc(n * 2);
        memcpy(back0, back, n * sizeof(float));
        int err = ts_cuk_to_half(x, h, n, fp16, NULL) | ts_cuk_round_half(x, r, n, fp16, NULL) |
                  ts_cuk_from_half(h, back, n, fp16, 1, NULL);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            const uint16_t b = to16(x[i], fp16);
            const float v = fp16 ? ts_f16_to_f32(b) : ts_bf16_to_f32(b);
            bad += h[i] != b || r[i] != v || back[i] != back0[i] + v;
        }
        err |= ts_cuk_from_half(h, back, n, fp16, 0, NULL);
        for (size_t i = 0; i < n; i++) bad += back[i] != (fp16 ? ts_f16_to_f32(h[i]) : ts_bf16_to_f32(h[i]));
        /* in place, as conv_cudnn.c rounds its weight gradient */
        err |= ts_cuk_round_half(x, x, n, fp16, NULL);
        bad += memcmp(x, r, n * sizeof(float)) != 0;
        ts_ok(checked(!err && !bad), "%s: fp32 -> half, rounded in fp32, half -> fp32 (set and added): %zu wrong",
              fp16 ? "fp16" : "bf16", bad);
    }
    /* channels padded with zeros to cp, and sliced back */
    const size_t nv = 1001;
    const int c = 3, cp = 8;
    for (int fp16 = 0; fp16 < 2; fp16++) {
        float *x = frand(nv * c, -2, 2), *y = frand(nv * c, 7, 8);
        uint16_t *h = galloc(nv * cp * 2);
        int err = ts_cuk_to_half_pad(x, c, h, cp, nv, fp16, NULL);
        size_t bad = 0;
        for (size_t v = 0; v < nv; v++)
            for (int j = 0; j < cp; j++) bad += h[v * cp + j] != (j < c ? to16(x[v * c + j], fp16) : 0);
        err |= ts_cuk_from_half_slice(h, cp, y, c, nv, fp16, NULL);
        for (size_t v = 0; v < nv; v++)
            for (int j = 0; j < c; j++)
                bad += y[v * c + j] != (fp16 ? ts_f16_to_f32(h[v * cp + j]) : ts_bf16_to_f32(h[v * cp + j]));
        ts_ok(checked(!err && !bad), "%s: 3 channels padded to 8 and sliced back: %zu wrong",
              fp16 ? "fp16" : "bf16", bad);
    }
}

/* ------------------------------------------------------------------ elementwise, pooling */
static void check_elementwise(void)
{
    const size_t n = 100003;
    const float slope = 0.01f;
    float *x = frand(n, -1, 1), *y = fzero(n), *dy = frand(n, -1, 1), *dx = fzero(n), *acc = frand(n, -1, 1);
    float *acc0 = fzero(n);
    memcpy(acc0, acc, n * sizeof(float));
    int err = ts_cuk_relu(x, y, n, slope, NULL) | ts_cuk_relu_backward(y, dy, dx, n, slope, NULL) |
              ts_cuk_add(x, acc, n, NULL);
    size_t bad = 0, neg = 0;
    for (size_t i = 0; i < n; i++) {
        const float f = x[i] > 0.0f ? x[i] : slope * x[i];
        neg += x[i] < 0;
        bad += y[i] != f || dx[i] != (y[i] > 0.0f ? dy[i] : slope * dy[i]) || acc[i] != acc0[i] + x[i];
    }
    ts_ok(checked(!err && !bad && neg > n / 3), "leaky ReLU forward and backward, add: %zu wrong", bad);
}

/* the optimizer's kernels against src/optim's CPU updates, bit for bit (neither side contracts an FMA) */
static void check_optim(void)
{
    const size_t n = 100003;
    float *p = frand(n, -1, 1), *g = frand(n, -0.1, 0.1), *b = frand(n, -0.1, 0.1), *v = frand(n, 0, 0.01);
    float *p2 = fzero(n), *b2 = fzero(n), *v2 = fzero(n), *g2 = fzero(n);
    memcpy(p2, p, n * sizeof(float));
    memcpy(b2, b, n * sizeof(float));
    memcpy(v2, v, n * sizeof(float));
    memcpy(g2, g, n * sizeof(float));
    int err = 0, same = 1;
    for (int nest = 0; nest < 2; nest++) { /* SGD with momentum, weight decay; plain and Nesterov */
        ts_sgd_update(p, g, b, n, 0.05, 0.9, 1e-4, nest);
        err |= ts_cuo_sgd(p2, g2, b2, n, 0.05f, 0.9f, 1e-4f, nest, NULL);
        same = same && !memcmp(p, p2, n * sizeof(float)) && !memcmp(b, b2, n * sizeof(float));
    }
    ts_sgd_update(p, g, NULL, n, 0.05, 0, 0, 0); /* plain SGD: no state */
    err |= ts_cuo_sgd(p2, g2, NULL, n, 0.05f, 0.0f, 0.0f, 0, NULL);
    same = same && !memcmp(p, p2, n * sizeof(float));
    for (int64_t t = 1; t <= 3; t++) { /* AdamW, the step's constants as src/optim/optim.c computes them */
        const double lr = 3e-3, b1 = 0.9, b2v = 0.999, eps = 1e-8, wd = 0.01;
        const double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2v, (double)t);
        ts_adamw_update(p, g, b, v, n, lr, b1, b2v, eps, wd, t);
        err |= ts_cuo_adamw(p2, g2, b2, v2, n, (float)(lr / bc1), (float)(1.0 / sqrt(bc2)), (float)(1.0 - lr * wd),
                            (float)b1, (float)b2v, (float)eps, NULL);
        same = same && !memcmp(p, p2, n * sizeof(float)) && !memcmp(b, b2, n * sizeof(float)) &&
               !memcmp(v, v2, n * sizeof(float));
    }
    err |= ts_cuo_scale(g2, n, 0.37f, NULL);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += g2[i] != g[i] * 0.37f;
    double part[TS_CUO_SUMSQ_PARTS], sq = 0, ref = 0;
    err |= ts_cuo_sumsq(g, n, part, NULL);
    for (int k = 0; k < TS_CUO_SUMSQ_PARTS; k++) sq += part[k];
    for (size_t i = 0; i < n; i++) ref += (double)g[i] * g[i];
    const double rsq = fabs(sq - ref) / ref;
    ts_ok(checked(!err && same && !bad && rsq < 1e-11),
          "the optimizer's kernels: SGD (momentum, Nesterov, none) and AdamW bit for bit the CPU's; scaling %zu wrong; "
          "sum of squares %.1e from the double sum", bad, rsq);
}

static void check_pool(void)
{
    const int N = 2, D = 6, H = 4, W = 10, C = 5, k = 2;
    const int OD = D / k, OH = H / k, OW = W / k;
    const size_t nin = (size_t)N * D * H * W * C, nout = (size_t)N * OD * OH * OW * C;
    float *x = frand(nin, -1, 1), *y = fzero(nout), *dy = frand(nout, -1, 1), *dx = frand(nin, 3, 4);
    for (size_t i = 0; i + C < nin; i += 7) x[i + C] = x[i]; /* ties along W, some inside one window */
    uint8_t *idx = galloc(nout);
    int err = ts_cuk_maxpool(x, y, idx, N, D, H, W, C, k, NULL) |
              ts_cuk_maxpool_backward(dy, idx, dx, N, D, H, W, C, k, NULL);
    size_t bad = 0;
    for (int n = 0; n < N; n++)
        for (int od = 0; od < OD; od++)
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++)
                    for (int c = 0; c < C; c++) {
                        const size_t o = ((((size_t)n * OD + od) * OH + oh) * OW + ow) * C + c;
                        float mx = 0;
                        int at = 0, t = 0;
                        for (int a = 0; a < k; a++)
                            for (int b = 0; b < k; b++)
                                for (int e = 0; e < k; e++, t++) {
                                    const size_t i = ((((size_t)n * D + od * k + a) * H + oh * k + b) * W + ow * k + e) * C + c;
                                    if (t == 0 || x[i] > mx) mx = x[i], at = t;
                                }
                        bad += y[o] != mx || idx[o] != at;
                        t = 0;
                        for (int a = 0; a < k; a++)
                            for (int b = 0; b < k; b++)
                                for (int e = 0; e < k; e++, t++) {
                                    const size_t i = ((((size_t)n * D + od * k + a) * H + oh * k + b) * W + ow * k + e) * C + c;
                                    bad += dx[i] != (t == at ? dy[o] : 0.0f);
                                }
                    }
    ts_ok(checked(!err && !bad), "max-pool 2^3 forward (first maximum on ties) and backward: %zu wrong", bad);
}

/* ------------------------------------------------------------------ norm passes, plain and tiled */
typedef int (*sums_fn)(int, const float *, const float *, const float *, float, const float *, int, size_t, int,
                       double *, double *, void *);

static void check_norm_sums(int N, size_t S, int C)
{
    const size_t n = (size_t)N * S * C, nc = (size_t)N * C;
    const float *x = frand(n, -1, 3), *dy = frand(n, -1, 1), *mask = frand(n, -1, 1), *ctr = frand(nc, 0, 2);
    double *s1 = galloc(nc * sizeof(double)), *s2 = galloc(nc * sizeof(double));
    double *w1 = malloc(nc * sizeof(double)), *w2 = malloc(nc * sizeof(double));
    const sums_fn fns[2] = {ts_cuk_chan_sums, ts_cuk_chan_sums_tiled};
    int err = 0;
    double worst = 0;
    /* mode 0 without and with centres, mode 1 without and with the mask (a ReLU's, then a leaky ReLU's) */
    for (int m = 0; m < 5; m++) {
        const int mode = m >= 2;
        const float *ce = m == 1 || m >= 3 ? ctr : NULL, *mk = m >= 3 ? mask : NULL;
        const float slope = m == 4 ? 0.1f : 0.0f;
        memset(w1, 0, nc * sizeof(double));
        memset(w2, 0, nc * sizeof(double));
        for (size_t i = 0; i < n; i++) {
            const size_t j = i / (S * C) * C + i % C;
            const double d = (double)x[i] - (ce ? ce[j] : 0.0f), g = mk && !(mk[i] > 0.0f) ? slope * (double)dy[i] : dy[i];
            w1[j] += mode ? g : d;
            w2[j] += mode ? g * d : d * d;
        }
        for (int f = 0; f < 2; f++) {
            memset(s1, 0x7f, nc * sizeof(double)); /* cleared by the launcher */
            memset(s2, 0x7f, nc * sizeof(double));
            err |= fns[f](mode, x, dy, mk, slope, ce, N, S, C, s1, s2, NULL);
            worst = fmax(worst, fmax(rel(s1, w1, nc), rel(s2, w2, nc))); /* rel is never NaN */
        }
    }
    free(w1), free(w2);
    ts_ok(checked(!err && worst <= 1e-5),
          "norm sums, N %d, S %zu, C %d, plain and tiled, both modes, centred, masked (ReLU, leaky): %.2e of the sums' "
          "scale", N, S,
          C, worst);
}

static void check_norm_maps(int N, size_t S, int C)
{
    const size_t n = (size_t)N * S * C, nc = (size_t)N * C;
    const float *x = frand(n, -1, 3), *dy = frand(n, -1, 1), *mask = frand(n, -1, 1), *ctr = frand(nc, 0, 2);
    const float *sc = frand(nc, 0.5, 2), *sh = frand(nc, -1, 1), *a = frand(nc, -1, 1), *b = frand(nc, -1, 1);
    const float *kk = frand(nc, -1, 1);
    float *y0 = fzero(n), *y1 = fzero(n), *want = fzero(n);
    int err = 0;
    size_t bad = 0;
    double worst = 0;
    for (int act = 0; act < 3; act++) { /* none, ReLU, leaky ReLU */
        const int relu = act > 0;
        const float slope = act == 2 ? 0.01f : 0.0f;
        err |= ts_cuk_chan_affine(x, sc, sh, N, S, C, relu, slope, y0, NULL) |
               ts_cuk_chan_affine_tiled(x, sc, sh, N, S, C, relu, slope, y1, NULL);
        for (size_t i = 0; i < n; i++) {
            const size_t j = i / (S * C) * C + i % C;
            const float t = x[i] * sc[j] + sh[j];
            want[i] = relu && !(t > 0.0f) ? slope * t : t;
        }
        worst = fmax(worst, fmax(relf(y0, want, n), relf(y1, want, n)));
        bad += memcmp(y0, y1, n * sizeof(float)) != 0;
    }
    for (int m = 0; m < 3; m++) { /* no mask, a ReLU's, a leaky ReLU's */
        const float *mk = m ? mask : NULL, slope = m == 2 ? 0.01f : 0.0f;
        err |= ts_cuk_norm_dx(x, dy, mk, slope, ctr, a, b, kk, N, S, C, y0, NULL) |
               ts_cuk_norm_dx_tiled(x, dy, mk, slope, ctr, a, b, kk, N, S, C, y1, NULL);
        for (size_t i = 0; i < n; i++) {
            const size_t j = i / (S * C) * C + i % C;
            const float g = mk && !(mk[i] > 0.0f) ? slope * dy[i] : dy[i];
            want[i] = g * a[j] + (x[i] - ctr[j]) * b[j] + kk[j];
        }
        worst = fmax(worst, fmax(relf(y0, want, n), relf(y1, want, n)));
        bad += memcmp(y0, y1, n * sizeof(float)) != 0;
    }
    /* plain and tiled evaluate one expression: the same bits; the loop here may contract differently */
    ts_ok(checked(!err && worst <= 1e-6 && !bad),
          "norm affine (+ReLU, +leaky) and input gradient (+their masks), N %d, S %zu, C %d, plain and tiled: %.2e, %zu "
          "differ", N, S,
          C, worst, bad);
}

/* ------------------------------------------------------------------ concatenation */
static void check_concat(int ca, int cb, size_t rows, int misalign)
{
    const int C = ca + cb;
    /* float4 rows need 16-byte alignment: misalign 1 shifts y by one float (the scalar kernel) */
    float *ybuf = frand(rows * C + 4, -1, 1), *abuf = frand(rows * ca + 4, -1, 1), *bbuf = frand(rows * cb + 4, -1, 1);
    float *y = (float *)(((uintptr_t)ybuf + 15) & ~(uintptr_t)15) + misalign;
    float *a = (float *)(((uintptr_t)abuf + 15) & ~(uintptr_t)15), *b = (float *)(((uintptr_t)bbuf + 15) & ~(uintptr_t)15);
    float *ra = fzero(rows * ca), *rb = fzero(rows * cb);
    int err = ts_cuk_concat(0, y, a, b, ca, cb, rows, NULL);
    size_t bad = 0;
    for (size_t v = 0; v < rows; v++)
        for (int j = 0; j < C; j++) bad += y[v * C + j] != (j < ca ? a[v * ca + j] : b[v * cb + j - ca]);
    /* backward: each part alone, then both */
    for (size_t i = 0; i < rows * C; i++) y[i] = (float)urand();
    err |= ts_cuk_concat(1, y, ra, NULL, ca, cb, rows, NULL);
    for (size_t v = 0; v < rows; v++)
        for (int j = 0; j < ca; j++) bad += ra[v * ca + j] != y[v * C + j];
    for (size_t i = 0; i < rows * cb; i++) bad += rb[i] != 0.0f;
    err |= ts_cuk_concat(1, y, NULL, rb, ca, cb, rows, NULL);
    for (size_t v = 0; v < rows; v++)
        for (int j = 0; j < cb; j++) bad += rb[v * cb + j] != y[v * C + ca + j];
    ts_ok(checked(!err && !bad), "concatenation %d + %d channels, %zu rows (%s rows): forward, backward of each "
          "part: %zu wrong", ca, cb, rows, ca % 4 || cb % 4 || misalign ? "float" : "float4", bad);
}

/* ------------------------------------------------------------------ labels and losses */
static void softmax(const float *l, int K, double *p)
{
    double m = l[0], s = 0;
    for (int k = 1; k < K; k++) m = fmax(m, l[k]);
    for (int k = 0; k < K; k++) s += p[k] = exp(l[k] - m);
    for (int k = 0; k < K; k++) p[k] /= s;
}

static void check_losses(int N, size_t S, int K)
{
    const size_t V = (size_t)N * S;
    const int ign = K; /* the ignore label: one past the classes */
    float *l = frand(V * K, -3, 3), *w = frand(K, 0.5, 2), *dl = frand(V * K, -1, 1), *dl0 = fzero(V * K);
    float *AB = frand((size_t)N * K * 2, -1, 1);
    uint8_t *y = galloc(V);
    for (size_t v = 0; v < V; v++) y[v] = (uint8_t)(urand() * (K + 1)); /* ign included */
    y[V / 2] = (uint8_t)(K + 1);                                        /* one bad label past ign */
    unsigned long long *count = galloc(256 * sizeof *count), *at = galloc(sizeof *at), *bad = galloc(sizeof *bad);
    double *num = galloc(sizeof *num), *s = galloc((size_t)N * 3 * K * sizeof(double));
    memcpy(dl0, dl, V * K * sizeof(float));
    int err = ts_cuk_label_hist(y, V, count, NULL) | ts_cuk_label_first(y, V, 1, at, NULL);
    size_t wrong = 0, first = ~(size_t)0;
    unsigned long long c[256] = {0};
    for (size_t v = 0; v < V; v++) c[y[v]]++, first = y[v] == 1 && first == ~(size_t)0 ? v : first;
    for (int i = 0; i < 256; i++) wrong += count[i] != c[i];
    wrong += *at != first;
    ts_ok(!err && !wrong, "label histogram and first voxel of label 1 (%zu voxels): %zu wrong", V, wrong);
    /* cross-entropy: the loss sum and dl += f w[t] (p - onehot); the bad label is the loss's to refuse, not the kernel's */
    y[V / 2] = 0;
    const float f = 0.37f;
    err |= ts_cuk_ce(l, y, V, K, ign, w, f, dl, num, NULL);
    double want = 0, *p = malloc(K * sizeof(double)), *gd = malloc(V * K * sizeof(double)), *gw = malloc(V * K * sizeof(double));
    for (size_t v = 0; v < V; v++) {
        const int t = y[v];
        for (int k = 0; k < K; k++) gd[v * K + k] = dl[v * K + k], gw[v * K + k] = dl0[v * K + k];
        if (t == ign) continue;
        softmax(l + v * K, K, p);
        want += w[t] * -log(p[t]);
        for (int k = 0; k < K; k++) gw[v * K + k] += f * w[t] * (p[k] - (k == t));
    }
    const double e_ce = fabs(*num - want) / fabs(want), e_dl = rel(gd, gw, V * K);
    /* soft Dice sums per sample and class, with a bad label back in */
    y[V / 3] = (uint8_t)(K + 2);
    double *ws = calloc((size_t)N * 3 * K, sizeof(double));
    err |= ts_cuk_dice_sums(l, y, N, S, K, ign, s, bad, NULL);
    for (size_t v = 0; v < V; v++) {
        const int t = y[v];
        if (t == ign || t >= K) continue;
        softmax(l + v * K, K, p);
        double *sn = ws + v / S * 3 * K;
        for (int k = 0; k < K; k++) sn[3 * k + 1] += p[k];
        sn[3 * t] += p[t];
        sn[3 * t + 2] += 1;
    }
    const double e_ds = rel(s, ws, (size_t)N * 3 * K);
    const int bad_ok = *bad == V / 3;
    /* the Dice gradient: dl += p (dp - <p, dp>) */
    y[V / 3] = 0;
    memcpy(dl0, dl, V * K * sizeof(float));
    err |= ts_cuk_dice_grad(l, y, N, S, K, ign, AB, dl, NULL);
    for (size_t v = 0; v < V; v++) {
        const int t = y[v];
        const float *ab = AB + v / S * K * 2;
        for (int k = 0; k < K; k++) gd[v * K + k] = dl[v * K + k], gw[v * K + k] = dl0[v * K + k];
        if (t == ign) continue;
        softmax(l + v * K, K, p);
        double dot = 0;
        for (int k = 0; k < K; k++) dot += p[k] * (ab[2 * k] + (k == t ? ab[2 * k + 1] : 0));
        for (int k = 0; k < K; k++) gw[v * K + k] += p[k] * (ab[2 * k] + (k == t ? ab[2 * k + 1] : 0) - dot);
    }
    const double e_dg = rel(gd, gw, V * K);
    free(p), free(gd), free(gw), free(ws);
    ts_ok(checked(!err && e_ce <= 1e-5 && e_dl <= 1e-5 && e_ds <= 1e-5 && bad_ok && e_dg <= 1e-5),
          "losses, N %d, S %zu, K %d: cross-entropy %.1e, its gradient %.1e; Dice sums %.1e, bad label %s, "
          "gradient %.1e", N, S, K, e_ce, e_dl, e_ds, bad_ok ? "found" : "MISSED", e_dg);
}

/* ------------------------------------------------------------------ a split's halos (halo_kernels.cu) */
/* the voxel (id, ih, iw) of box [a, b] with faces f (layers.h's ts_halo layouts), channel c; 0 where none */
static float halo_ref(const float *a, int ca, const float *b, int cb, float *const f[3][2], const int on[3], int n,
                      int D, int H, int W, int id, int ih, int iw, int c)
{
    const int C = ca + cb, e1 = on[1], e2 = on[2];
    if (id >= 0 && id < D && ih >= 0 && ih < H && iw >= 0 && iw < W) {
        const size_t s = (((size_t)n * D + id) * H + ih) * W + iw;
        return c < ca ? a[s * ca + c] : b[s * cb + c - ca];
    }
    if (id < 0 || id >= D) {
        const float *g = f[0][id >= D];
        if (!g || ih < -e1 || ih >= H + e1 || iw < -e2 || iw >= W + e2) return 0;
        return g[(((size_t)n * (H + 2 * e1) + ih + e1) * (W + 2 * e2) + iw + e2) * C + c];
    }
    if (ih < 0 || ih >= H) {
        const float *g = f[1][ih >= H];
        if (!g || iw < -e2 || iw >= W + e2) return 0;
        return g[(((size_t)n * D + id) * (W + 2 * e2) + iw + e2) * C + c];
    }
    const float *g = f[2][iw >= W];
    return g ? g[(((size_t)n * D + id) * H + ih) * C + c] : 0;
}

/* pack, pad and crop against plain loops, bit for bit: a box of N x D x H x W, [a (ca), b (cb)], split along
 * the dims of on, with faces on the sides of sides (bit 2 d + side) and neighbours at the offsets of mask */
static void check_halo(int N, int D, int H, int W, int ca, int cb, const int on[3], unsigned sides, unsigned mask)
{
    const int C = ca + cb;
    const int64_t dhw[3] = {D, H, W};
    const size_t V = (size_t)N * D * H * W, PV = (size_t)N * (D + 2) * (H + 2) * (W + 2);
    float *a = frand(V * ca, -1, 1), *b = cb ? frand(V * cb, -1, 1) : NULL;
    float *f[3][2] = {{NULL, NULL}, {NULL, NULL}, {NULL, NULL}};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 2; s++)
            if (on[d] && (sides >> (2 * d + s) & 1u)) f[d][s] = frand((size_t)ts_halo_face_floats(dhw, on, d, N, C), -1, 1);
    float *P = fzero(PV * C), *X = frand(PV * C, -1, 1), *ga = fzero(V * ca), *gb = cb ? fzero(V * cb) : NULL;
    const size_t np = (size_t)ts_halo_send_floats(dhw, mask, N, C);
    float *pk = fzero(np ? np : 1);
    const float *cf[3][2];
    for (int d = 0; d < 3; d++) cf[d][0] = f[d][0], cf[d][1] = f[d][1];
    int err = ts_cuk_halo_pad(a, ca, b, cb, cf, on, N, dhw, P, NULL) |
              ts_cuk_halo_crop(X, ca, cb, N, dhw, ga, gb, NULL) | ts_cuk_halo_pack(a, ca, b, cb, N, dhw, mask, pk, NULL);
    size_t bad_pad = 0, bad_crop = 0, bad_pack = 0, faces = 0, k = 0;
    for (int n = 0; n < N; n++)
        for (int d = -1; d <= D; d++)
            for (int h = -1; h <= H; h++)
                for (int w = -1; w <= W; w++)
                    for (int c = 0; c < C; c++) {
                        const float want = halo_ref(a, ca, b, cb, f, on, n, D, H, W, d, h, w, c);
                        const int inside = d >= 0 && d < D && h >= 0 && h < H && w >= 0 && w < W;
                        faces += !inside && want != 0;
                        bad_pad += P[k] != want;
                        if (inside) {
                            const size_t o = (((size_t)n * D + d) * H + h) * W + w;
                            bad_crop += c < ca ? ga[o * ca + c] != X[k] : gb[o * cb + c - ca] != X[k];
                        }
                        k++;
                    }
    size_t q = 0;
    for (int i = 0; i < 27; i++) { /* the regions in offset order, as src/parallel/spatial.c packs them */
        if (!(mask >> i & 1u)) continue;
        const int o[3] = {i / 9 - 1, i / 3 % 3 - 1, i % 3 - 1}, nn[3] = {D, H, W};
        int lo[3], hi[3];
        for (int e = 0; e < 3; e++) {
            lo[e] = o[e] > 0 ? nn[e] - 1 : 0;
            hi[e] = o[e] ? lo[e] + 1 : nn[e];
        }
        for (int n = 0; n < N; n++)
            for (int z = lo[0]; z < hi[0]; z++)
                for (int y = lo[1]; y < hi[1]; y++)
                    for (int x = lo[2]; x < hi[2]; x++)
                        for (int c = 0; c < C; c++)
                            bad_pack += pk[q++] != halo_ref(a, ca, b, cb, f, on, n, D, H, W, z, y, x, c);
    }
    ts_ok(checked(!err && !bad_pad && !bad_crop && !bad_pack && q == np && faces > 0),
          "halo, %dx%dx%dx%d, %d+%d channels, split (%d, %d, %d): padded %zu wrong (%zu face values), cropped %zu, "
          "packed %zu of %zu", N, D, H, W, ca, cb, on[0], on[1], on[2], bad_pad, faces, bad_crop, bad_pack, np);
}

/* ------------------------------------------------------------------ transposed convolution gathers, im2col */
static float from16(const void *p, size_t i, int type)
{
    const uint16_t h = ((const uint16_t *)p)[i];
    return type == 0 ? ((const float *)p)[i] : type == 1 ? ts_bf16_to_f32(h) : ts_f16_to_f32(h);
}

static void check_convt(int N, int D, int H, int W, int C, int k)
{
    const size_t M = (size_t)N * D * H * W, taps = (size_t)k * k * k, n = M * taps * C;
    float *z = frand(n, -1, 1), *bias = frand(C, -1, 1), *yv = fzero(n), *dy = frand(n, -1, 1);
    void *dz = galloc(n * sizeof(float));
    int err = 0;
    size_t bad = 0;
    for (int withb = 0; withb < 2; withb++) {
        err |= ts_cuk_convt_scatter(z, withb ? bias : NULL, yv, N, D, H, W, C, k, NULL);
        for (size_t m = 0; m < M; m++)
            for (size_t t = 0; t < taps; t++)
                for (int c = 0; c < C; c++) {
                    const size_t w = m % W, h = m / W % H, d = m / ((size_t)W * H) % D, nn = m / ((size_t)W * H * D);
                    const size_t od = d * k + t / (k * k), oh = h * k + t / k % k, ow = w * k + t % k;
                    const size_t o = (((nn * D * k + od) * H * k + oh) * W * k + ow) * C + c;
                    bad += yv[o] != z[(m * taps + t) * C + c] + (withb ? bias[c] : 0.0f);
                }
    }
    for (int type = 0; type < 3; type++) {
        err |= ts_cuk_convt_gather(dy, dz, type, N, D, H, W, C, k, NULL);
        for (size_t m = 0; m < M; m++)
            for (size_t t = 0; t < taps; t++)
                for (int c = 0; c < C; c++) {
                    const size_t w = m % W, h = m / W % H, d = m / ((size_t)W * H) % D, nn = m / ((size_t)W * H * D);
                    const size_t od = d * k + t / (k * k), oh = h * k + t / k % k, ow = w * k + t % k;
                    const float g = dy[(((nn * D * k + od) * H * k + oh) * W * k + ow) * C + c];
                    const float want = type == 0 ? g : type == 1 ? ts_bf16_to_f32(ts_f32_to_bf16(g)) : ts_f16_to_f32(ts_f32_to_f16(g));
                    bad += from16(dz, (m * taps + t) * C + c, type) != want;
                }
    }
    ts_ok(checked(!err && !bad), "transposed convolution %dx%dx%dx%d, %d channels, k %d: scatter (with and "
          "without bias), gather as fp32, bf16, fp16: %zu wrong", N, D, H, W, C, k, bad);
}

static void check_im2col(int N, int D, int H, int W, int C, int k, int s, int p)
{
    const int OD = (D + 2 * p - k) / s + 1, OH = (H + 2 * p - k) / s + 1, OW = (W + 2 * p - k) / s + 1;
    const size_t mo = (size_t)N * OD * OH * OW, kk = (size_t)k * k * k * C;
    float *x = frand((size_t)N * D * H * W * C, -1, 1);
    const size_t mc = mo / 3 + 1; /* three chunks, the last shorter */
    void *col = galloc(mc * kk * sizeof(float));
    int err = 0;
    size_t bad = 0, zeros = 0;
    for (int type = 0; type < 3; type++)
        for (size_t m0 = 0; m0 < mo; m0 += mc) {
            const size_t n = mo - m0 < mc ? mo - m0 : mc;
            err |= ts_cuk_im2col(x, col, type, D, H, W, C, k, s, p, OD, OH, OW, m0, n, NULL);
            for (size_t i = 0; i < n; i++) {
                const size_t m = m0 + i, ow = m % OW, oh = m / OW % OH, od = m / ((size_t)OW * OH) % OD;
                const size_t nn = m / ((size_t)OW * OH * OD);
                for (int t = 0; t < k * k * k; t++)
                    for (int c = 0; c < C; c++) {
                        const long id = (long)od * s - p + t / (k * k), ih = (long)oh * s - p + t / k % k,
                                   iw = (long)ow * s - p + t % k;
                        const int in = id >= 0 && id < D && ih >= 0 && ih < H && iw >= 0 && iw < W;
                        const float v = in ? x[(((nn * D + id) * H + ih) * W + iw) * C + c] : 0.0f;
                        const float want = type == 0 ? v : type == 1 ? ts_bf16_to_f32(ts_f32_to_bf16(v)) : ts_f16_to_f32(ts_f32_to_f16(v));
                        zeros += !in;
                        bad += from16(col, (i * k * k * k + t) * C + c, type) != want;
                    }
            }
        }
    ts_ok(checked(!err && !bad && (p == 0 || zeros > 0)), "im2col %dx%dx%dx%d, %d channels, k %d, stride %d, "
          "padding %d, 3 chunks, fp32/bf16/fp16: %zu wrong", N, D, H, W, C, k, s, p, bad);
}

/* ------------------------------------------------------------------ norms with their statistics on the device */
/* a guarded copy of a host tensor's values */
static float *gcopy(const ts_tensor *t)
{
    float *p = galloc(ts_tensor_bytes(t));
    memcpy(p, t->data, ts_tensor_bytes(t));
    return p;
}
static double relt(const float *a, const ts_tensor *b) { return relf(a, b->data, (size_t)ts_tensor_numel(b)); }

/* ts_cuk_norm_forward and _backward (norm_kernels.cu) against the CPU's batch
 * norm (gn 0: the N samples folded into one, G = C) or group norm (G groups),
 * x [N, D, D+1, D+2, C]: every output, saved statistic, running statistic
 * and gradient within 1e-5 of its own scale */
static void check_norm_chain(int gn, int N, int D, int C, int G, int relu, float slope, int train, int tiled)
{
    const int64_t xs[5] = {N, D, D + 1, D + 2, C}, cs[1] = {C}, gs[1] = {(int64_t)N * G};
    const size_t S = (size_t)D * (D + 1) * (D + 2), n = (size_t)N * S * C;
    const int Nn = gn ? N : 1, Gg = gn ? G : C;
    const size_t Sn = gn ? S : (size_t)N * S, ng = (size_t)Nn * Gg;
    ts_tensor x = mk(5, xs, -1, 3), dy = mk(5, xs, -1, 1), g = mk(1, cs, 0.5, 1.5);
    ts_tensor b = mk(1, cs, -0.5, 0.5), rm = mk(1, cs, -0.2, 0.2), rv = mk(1, cs, 0.5, 2);
    ts_tensor dg = mk(1, cs, -1, 1), db = mk(1, cs, -1, 1), y = mk(5, xs, 0, 0), dx = mk(5, xs, 0, 0);
    ts_tensor sm = mk(1, gn ? gs : cs, 0, 0), si = mk(1, gn ? gs : cs, 0, 0);
    /* the device copies, taken before the CPU layers update anything in place */
    float *ex = gcopy(&x), *edy = gcopy(&dy), *eg = gcopy(&g), *eb = gcopy(&b), *erm = gcopy(&rm), *erv = gcopy(&rv);
    float *edg = gcopy(&dg), *edb = gcopy(&db), *ey = galloc(n * sizeof(float)), *edx = galloc(n * sizeof(float));
    float *esm = galloc(ng * sizeof(float)), *esi = galloc(ng * sizeof(float));
    void *work = galloc(ts_cuk_norm_work_bytes(Nn, C));
    ts_norm_opts o = {.eps = 1e-5f, .momentum = 0.1f, .groups = G, .relu = relu, .slope = slope};
    int err = gn ? ts_groupnorm_forward(&x, &g, &b, &o, &y, &sm, &si) ||
                       ts_groupnorm_backward(&x, &y, &g, &b, &sm, &si, &o, &dy, &dx, &dg, &db)
                 : ts_batchnorm_forward(&x, &g, &b, &rm, &rv, train, &o, &y, &sm, &si) ||
                       ts_batchnorm_backward(&x, &y, &g, &b, &sm, &si, train, &o, &dy, &dx, &dg, &db);
    if (err) {
        ts_ok(0, "the CPU norm failed: %s", ts_err_message());
        return;
    }
    err = ts_cuk_norm_forward(ex, Nn, Sn, C, Gg, eg, eb, o.eps, o.momentum, train, relu, slope, tiled, gn ? NULL : erm,
                              gn ? NULL : erv, esm, esi, ey, work, NULL) ||
          ts_cuk_norm_backward(ex, edy, relu ? ey : NULL, slope, Nn, Sn, C, Gg, eg, esm, esi, train, tiled, edg, edb, edx,
                               work, NULL);
    double e[7] = {relt(ey, &y), relt(esm, &sm), relt(esi, &si), relt(edx, &dx), relt(edg, &dg), relt(edb, &db),
                   gn || !train ? 0 : fmax(relt(erm, &rm), relt(erv, &rv))};
    double worst = 0;
    for (int i = 0; i < 7; i++) worst = fmax(worst, e[i]);
    ts_ok(checked(!err && worst <= 1e-5), "%s %s, N %d, %d^3-ish, C %d%s%s, %s passes, statistics on the device: "
          "y %.1e, mean %.1e, invstd %.1e, dx %.1e, dgamma %.1e, dbeta %.1e, running %.1e",
          gn ? (G == C ? "instance norm" : "group norm") : "batch norm", train ? "train" : "eval", N, D, C,
          gn && G != C ? " in groups" : "", relu ? (slope > 0 ? " + leaky ReLU" : " + ReLU") : "", tiled ? "tiled" : "plain", e[0], e[1], e[2], e[3],
          e[4], e[5], e[6]);
    ts_tensor *all[] = {&x, &dy, &g, &b, &rm, &rv, &dg, &db, &y, &dx, &sm, &si};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* ------------------------------------------------------------------ the GEMM convolutions (conv_gemm.c) */
/* a guarded tensor of random values, and its copy as a host tensor for the CPU layers */
static ts_tensor gtensor(int nd, const int64_t *shape, double lo, double hi, ts_tensor *copy)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    float *p = frand((size_t)n, lo, hi);
    if (copy) {
        if (ts_tensor_alloc(copy, TS_FLOAT32, nd, shape)) abort();
        memcpy(copy->data, p, (size_t)n * sizeof(float));
    }
    return ts_tensor_view(p, TS_FLOAT32, nd, shape);
}
static double rel_tt(const ts_tensor *a, const ts_tensor *b) { return relf(a->data, b->data, (size_t)ts_tensor_numel(b)); }
static const char *prec_name(ts_precision p) { return p == TS_PREC_BF16 ? "bf16" : p == TS_PREC_FP16 ? "fp16" : "fp32"; }

/* the transposed convolution with kernel = stride k as cuBLAS GEMMs (TESSERA_CUDA_CONVT=gemm) against the CPU's
 * fp32 layer: y, dx and dw (accumulated) within tol of their scale */
static void check_convt_gemm(int N, int D, int H, int W, int Cin, int Cout, int k, ts_precision prec, double tol)
{
    const int64_t xs[5] = {N, D, H, W, Cin}, ws[5] = {Cin, Cout, k, k, k}, bs[1] = {Cout},
                  ys[5] = {N, D * k, H * k, W * k, Cout};
    ts_tensor cx, cw, cb, cy, cdy, cdx, cdw, cdb;
    ts_tensor x = gtensor(5, xs, -1, 1, &cx), w = gtensor(5, ws, -1, 1, &cw), b = gtensor(1, bs, -1, 1, &cb);
    ts_tensor y = gtensor(5, ys, 0, 0, &cy), dy = gtensor(5, ys, -1, 1, &cdy), dx = gtensor(5, xs, 0, 0, &cdx);
    ts_tensor dw = gtensor(5, ws, -1, 1, &cdw);
    if (ts_tensor_alloc(&cdb, TS_FLOAT32, 1, bs)) abort();
    memset(cdb.data, 0, ts_tensor_bytes(&cdb));
    ts_nn_set_conv_precision(TS_PREC_FP32);
    ts_nn_set_tf32(0);
    int err = ts_convt3d_forward(&cx, &cw, &cb, k, &cy) || ts_convt3d_backward(&cx, &cw, k, &cdy, &cdx, &cdw, &cdb);
    const unsigned long long g0 = tsemu_gemms();
    ts_nn_set_conv_precision(prec);
    ts_cuda_set_convt_gemm(1);
    const int fits = ts_cuda_convt_gemm_fits(&x, &w, k);
    err = err || !fits || ts_cuda_convt_gemm_forward(&x, &w, &b, &y) || ts_cuda_convt_gemm_backward(&x, &w, &dy, &dx, &dw);
    ts_cuda_set_convt_gemm(0);
    ts_nn_set_conv_precision(TS_PREC_FP32);
    const double ey = rel_tt(&y, &cy), edx = rel_tt(&dx, &cdx), edw = rel_tt(&dw, &cdw);
    ts_ok(checked(!err && ey <= tol && edx <= tol && edw <= tol && tsemu_gemms() - g0 == 3),
          "transposed convolution %d -> %d, k = stride %d, %dx%dx%dx%d, %s, as 3 GEMMs (%llu ran): y %.1e, dx %.1e, "
          "dw %.1e (tol %.0e)%s", Cin, Cout, k, N, D, H, W, prec_name(prec), tsemu_gemms() - g0, ey, edx, edw, tol,
          err ? ts_err_message() : "");
    ts_tensor *all[] = {&cx, &cw, &cb, &cy, &cdy, &cdx, &cdw, &cdb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* the weight gradient as im2col + GEMM in chunks (TESSERA_CUDA_WGRAD=gemm) against the CPU's: dw accumulated */
static void check_wgrad_gemm(int N, int D, int C, int K, int k, int st, int pad, ts_precision prec, size_t chunk,
                             double tol)
{
    const int in3[3] = {D, D + 1, D + 2}, out3[3] = {(in3[0] + 2 * pad - k) / st + 1, (in3[1] + 2 * pad - k) / st + 1,
                                                     (in3[2] + 2 * pad - k) / st + 1};
    const int64_t xs[5] = {N, in3[0], in3[1], in3[2], C}, ws[5] = {K, C, k, k, k}, bs[1] = {K},
                  ys[5] = {N, out3[0], out3[1], out3[2], K};
    ts_tensor cx, cw, cdy, cdw, cdx, cdb;
    ts_tensor x = gtensor(5, xs, -1, 1, &cx), dy = gtensor(5, ys, -1, 1, &cdy), dw = gtensor(5, ws, -1, 1, &cdw);
    (void)gtensor(5, ws, -1, 1, &cw);
    if (ts_tensor_alloc(&cdx, TS_FLOAT32, 5, xs) || ts_tensor_alloc(&cdb, TS_FLOAT32, 1, bs)) abort();
    memset(cdb.data, 0, ts_tensor_bytes(&cdb));
    ts_nn_set_conv_precision(TS_PREC_FP32);
    ts_nn_set_tf32(0);
    int err = ts_conv3d_backward(&cx, &cw, st, pad, &cdy, &cdx, &cdw, &cdb);
    const unsigned long long g0 = tsemu_gemms();
    const size_t per = (size_t)k * k * k * C * (prec == TS_PREC_FP32 ? 4 : 2), mo = (size_t)N * out3[0] * out3[1] * out3[2];
    const size_t mc = chunk / per ? chunk / per : 1, chunks = (mo + mc - 1) / mc;
    ts_nn_set_conv_precision(prec);
    ts_cuda_set_wgrad_gemm(1, chunk);
    err = err || !ts_cuda_wgrad_gemm_on() || ts_cuda_wgrad_gemm(N, C, in3, K, out3, k, st, pad, x.data, dy.data, dw.data);
    ts_cuda_set_wgrad_gemm(0, 0);
    ts_nn_set_conv_precision(TS_PREC_FP32);
    const double e = rel_tt(&dw, &cdw);
    ts_ok(checked(!err && e <= tol && tsemu_gemms() - g0 == chunks && chunks > 1),
          "weight gradient %d -> %d, k %d, stride %d, padding %d, %dx%dx%dx%d, %s, im2col + GEMM in %llu chunks of "
          "%zu voxels: %.1e (tol %.0e)%s", C, K, k, st, pad, N, in3[0], in3[1], in3[2], prec_name(prec),
          tsemu_gemms() - g0, mc, e, tol, err ? ts_err_message() : "");
    ts_tensor *all[] = {&cx, &cw, &cdy, &cdw, &cdx, &cdb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

/* ------------------------------------------------------------------ the norm layers' host side (layers_cuda.c) */
/* a guarded "device" copy of a host tensor (the emulator's device memory is the host's) */
static ts_tensor dev_copy(const ts_tensor *h)
{
    ts_tensor d = ts_tensor_view(gcopy(h), h->dtype, h->ndim, h->shape);
    d.device = 1;
    return d;
}

/* ts_cuda_batchnorm_* / ts_cuda_groupnorm_* (kind 0 batch norm train, 1 eval, 2 group norm, 3 instance norm)
 * with the statistics on the host (the default) or on the device (TESSERA_CUDA_NORMSTATS=device), plain or
 * tiled passes, against the CPU layers: every output within 1e-5 of its scale */
static void check_layer_norm(int kind, int relu, float slope, int C, int D, int dev, int tiled)
{
    static const char *const names[] = {"batch norm (train)", "batch norm (eval)", "group norm", "instance norm"};
    const int N = 2, G = kind == 2 ? 4 : C, train = kind != 1, nstat = kind <= 1 ? C : N * G;
    const int64_t xs[5] = {N, D, D + 1, D + 2, C}, cs[1] = {C}, ss[1] = {nstat};
    ts_tensor x = mk(5, xs, -1, 3), dy = mk(5, xs, -1, 1), g = mk(1, cs, 0.5, 1.5);
    ts_tensor b = mk(1, cs, -0.5, 0.5), rm = mk(1, cs, -0.2, 0.2), rv = mk(1, cs, 0.5, 2);
    ts_tensor dg = mk(1, cs, -1, 1), db = mk(1, cs, -1, 1), y = mk(5, xs, 0, 0), dx = mk(5, xs, 0, 0);
    ts_tensor sm = mk(1, ss, 0, 0), si = mk(1, ss, 0, 0);
    ts_tensor ex = dev_copy(&x), edy = dev_copy(&dy), eg = dev_copy(&g), eb = dev_copy(&b), erm = dev_copy(&rm);
    ts_tensor erv = dev_copy(&rv), edg = dev_copy(&dg), edb = dev_copy(&db), ey = dev_copy(&y), edx = dev_copy(&dx);
    ts_tensor esm = dev_copy(&sm), esi = dev_copy(&si);
    ts_norm_opts o = {.eps = 1e-5f, .momentum = 0.1f, .groups = G, .relu = relu, .slope = slope};
    int err = kind <= 1 ? ts_batchnorm_forward(&x, &g, &b, &rm, &rv, train, &o, &y, &sm, &si) ||
                              ts_batchnorm_backward(&x, &y, &g, &b, &sm, &si, train, &o, &dy, &dx, &dg, &db)
                        : ts_groupnorm_forward(&x, &g, &b, &o, &y, &sm, &si) ||
                              ts_groupnorm_backward(&x, &y, &g, &b, &sm, &si, &o, &dy, &dx, &dg, &db);
    ts_cuda_set_normstats(dev);
    ts_cuda_set_passes(tiled);
    err = err ||
          (kind <= 1 ? ts_cuda_batchnorm_forward(&ex, &eg, &eb, &erm, &erv, train, &o, &ey, &esm, &esi) ||
                           ts_cuda_batchnorm_backward(&ex, &ey, &eg, &esm, &esi, train, &o, &edy, &edx, &edg, &edb)
                     : ts_cuda_groupnorm_forward(&ex, &eg, &eb, &o, &ey, &esm, &esi) ||
                           ts_cuda_groupnorm_backward(&ex, &ey, &eg, &esm, &esi, &o, &edy, &edx, &edg, &edb));
    ts_cuda_set_normstats(0);
    ts_cuda_set_passes(0);
    double e[7] = {rel_tt(&ey, &y), rel_tt(&esm, &sm), rel_tt(&esi, &si), rel_tt(&edx, &dx), rel_tt(&edg, &dg),
                   rel_tt(&edb, &db), kind ? 0 : fmax(rel_tt(&erm, &rm), rel_tt(&erv, &rv))};
    double worst = 0;
    for (int i = 0; i < 7; i++) worst = fmax(worst, e[i]);
    ts_ok(checked(!err && worst <= 1e-5), "layers_cuda.c: %s%s, %d channels, statistics on the %s, %s passes: y %.1e, "
          "mean %.1e, invstd %.1e, dx %.1e, dgamma %.1e, dbeta %.1e, running %.1e%s%s", names[kind],
          relu ? (slope > 0 ? " + leaky ReLU" : " + ReLU") : "",
          C, dev ? "device" : "host", tiled ? "tiled" : "plain", e[0], e[1], e[2], e[3], e[4], e[5], e[6],
          err ? ": " : "", err ? ts_err_message() : "");
    ts_tensor *all[] = {&x, &dy, &g, &b, &rm, &rv, &dg, &db, &y, &dx, &sm, &si};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
}

int main(void)
{
    char why[256];
    ts_rng_init(&rng, 7, 0, 0);
    ts_plan(65);
    ts_ok(tsemu_selftest(why, sizeof why), "the emulator: %s", why);
    check_pack();
    check_half();
    check_elementwise();
    check_optim();
    check_halo(2, 3, 4, 5, 3, 0, (const int[]){1, 0, 0}, 0x3u, (1u << 4) | (1u << 22)); /* D: both sides */
    check_halo(1, 4, 3, 5, 2, 3, (const int[]){1, 1, 0}, 0x6u, 0x7fffffu & ~(1u << 13)); /* D x H, a concatenation */
    check_halo(2, 2, 3, 4, 4, 0, (const int[]){1, 1, 1}, 0x3fu, 0x7ffffffu & ~(1u << 13)); /* corners */
    check_pool();
    /* channels: 1, 3, 8, 48 (tiled blocks of 240 threads), 256, 320 (past the tiled kernels: the plain ones);
     * S large enough that the tiled grid (2048 / N blocks at most) goes round */
    const unsigned long long rounds0 = tsemu_barrier_rounds();
    check_norm_sums(2, 9001, 3);
    check_norm_sums(3, 25000, 8);
    check_norm_sums(1, 777, 48);
    check_norm_sums(2, 300, 320);
    check_norm_maps(2, 9001, 3);
    check_norm_maps(3, 40000, 8);
    check_norm_maps(1, 777, 48);
    check_norm_maps(2, 300, 256);
    check_norm_maps(2, 300, 320);
    ts_ok(tsemu_barrier_rounds() > rounds0, "the tiled sums waited at their barrier (%llu rounds)",
          tsemu_barrier_rounds() - rounds0);
    check_concat(8, 8, 1001, 0);
    check_concat(8, 8, 1001, 1);
    check_concat(3, 5, 777, 0);
    check_concat(64, 32, 300, 0);
    check_losses(2, 3001, 3);
    check_losses(1, 1000, 14);
    check_convt(2, 3, 4, 5, 6, 2);
    check_im2col(2, 5, 6, 7, 3, 3, 1, 1);
    check_im2col(1, 8, 7, 6, 4, 3, 2, 1);
    check_norm_chain(0, 2, 9, 16, 16, 1, 0.0f, 1, 0);
    check_norm_chain(0, 2, 9, 8, 8, 0, 0.0f, 1, 1);
    check_norm_chain(0, 1, 7, 32, 32, 1, 0.0f, 0, 1);
    check_norm_chain(1, 2, 8, 16, 4, 1, 0.0f, 1, 1);
    check_norm_chain(1, 3, 6, 8, 8, 0, 0.0f, 1, 0);
    check_norm_chain(1, 2, 5, 320, 320, 1, 0.0f, 1, 1);
    check_norm_chain(1, 2, 6, 16, 16, 1, 0.01f, 1, 1); /* nnU-Net's instance norm + leaky ReLU */
    check_norm_chain(0, 2, 6, 8, 8, 1, 0.01f, 1, 0);
    check_convt_gemm(2, 3, 4, 5, 16, 8, 2, TS_PREC_FP32, 1e-5);
    check_convt_gemm(1, 3, 3, 2, 6, 5, 3, TS_PREC_FP32, 1e-5);
    check_convt_gemm(2, 3, 4, 5, 16, 8, 2, TS_PREC_BF16, 2e-2);
    check_wgrad_gemm(2, 6, 8, 16, 3, 1, 1, TS_PREC_FP32, 20000, 1e-5);
    check_wgrad_gemm(1, 7, 4, 6, 3, 2, 1, TS_PREC_FP32, 5000, 1e-5);
    check_wgrad_gemm(2, 6, 8, 16, 3, 1, 1, TS_PREC_BF16, 20000, 2e-2);
    check_wgrad_gemm(1, 5, 16, 3, 1, 1, 0, TS_PREC_FP16, 300, 2e-2);
    for (int kind = 0; kind < 4; kind++)
        for (int dev = 0; dev < 2; dev++) check_layer_norm(kind, kind != 2, 0.0f, 8, 5, dev, dev);
    check_layer_norm(0, 0, 0.0f, 16, 6, 1, 0);
    check_layer_norm(3, 1, 0.0f, 48, 4, 0, 1);
    for (int dev = 0; dev < 2; dev++) { /* the fused leaky ReLU (nnU-Net's), both paths */
        check_layer_norm(3, 1, 0.01f, 16, 5, dev, !dev);
        check_layer_norm(0, 1, 0.01f, 8, 5, dev, dev);
    }
    ts_ok(tsemu_launches() > 100, "%llu launches and %llu GEMMs emulated", tsemu_launches(), tsemu_gemms());
    return ts_tap_failed ? 1 : 0;
}
