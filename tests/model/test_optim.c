/* Optimizers, schedules, clipping and the parameter arena: SGD (momentum,
 * Nesterov, weight decay) and AdamW over several steps against a double-
 * precision transcription of torch.optim's update rules (max error relative
 * to the largest parameter); learning rates at
 * known points of each schedule; global-norm clipping on gradients of known
 * norm; arena layout (64-byte aligned views, regions, names); a sharded
 * optimizer's update of pieces with packed state against the whole one. */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/model/arena.h"
#include "src/optim/optim.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N 1000

static void test_sgd(double momentum, double wd, int nesterov)
{
    ts_rng r;
    ts_rng_init(&r, 7, 0, 0);
    float p[N], g[N], buf[N] = {0};
    double rp[N], rbuf[N] = {0};
    for (int i = 0; i < N; i++) rp[i] = p[i] = ts_rng_uniformf(&r) - 0.5f;
    const double lr = 0.05;
    double err = 0;
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < N; i++) g[i] = ts_rng_uniformf(&r) - 0.5f;
        ts_sgd_update(p, g, momentum > 0 ? buf : NULL, N, lr, momentum, wd, nesterov);
        for (int i = 0; i < N; i++) { /* torch.optim.SGD, dampening 0 */
            double d = g[i] + wd * rp[i];
            if (momentum > 0) {
                rbuf[i] = step == 0 ? d : momentum * rbuf[i] + d;
                d = nesterov ? d + momentum * rbuf[i] : rbuf[i];
            }
            rp[i] -= lr * d;
        }
    }
    double mx = 0;
    for (int i = 0; i < N; i++) mx = fmax(mx, fabs(rp[i]));
    for (int i = 0; i < N; i++) err = fmax(err, fabs(p[i] - rp[i]) / mx);
    ts_ok(err < 1e-6, "SGD momentum %g, weight decay %g%s: 4 steps match torch.optim.SGD (max rel err %.1e)", momentum,
          wd, nesterov ? ", Nesterov" : "", err);
}

static void test_adamw(double wd)
{
    ts_rng r;
    ts_rng_init(&r, 8, 0, 0);
    float p[N], g[N], m[N] = {0}, v[N] = {0};
    double rp[N], rm[N] = {0}, rv[N] = {0};
    for (int i = 0; i < N; i++) rp[i] = p[i] = ts_rng_uniformf(&r) - 0.5f;
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (int t = 1; t <= 5; t++) {
        for (int i = 0; i < N; i++) g[i] = (ts_rng_uniformf(&r) - 0.5f) * 0.1f;
        ts_adamw_update(p, g, m, v, N, lr, b1, b2, eps, wd, t);
        for (int i = 0; i < N; i++) { /* torch.optim.AdamW */
            rp[i] *= 1 - lr * wd;
            rm[i] = b1 * rm[i] + (1 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1 - b2) * (double)g[i] * g[i];
            const double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
            rp[i] -= lr / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + eps);
        }
    }
    double err = 0, mx = 0;
    for (int i = 0; i < N; i++) mx = fmax(mx, fabs(rp[i]));
    for (int i = 0; i < N; i++) err = fmax(err, fabs(p[i] - rp[i]) / mx);
    ts_ok(err < 1e-6, "AdamW weight decay %g: 5 steps match torch.optim.AdamW (max rel err %.1e)", wd, err);
}

static void test_schedules(void)
{
    ts_optim_cfg c = {0};
    c.lr = 0.1;
    c.warmup_steps = 10;
    c.total_steps = 110;
    c.min_lr = 0.001;
    c.poly_power = 0.9;
    c.sched = TS_SCHED_CONSTANT;
    int ok = fabs(ts_optim_lr(&c, 0) - 0.01) < 1e-12 && fabs(ts_optim_lr(&c, 4) - 0.05) < 1e-12 &&
             fabs(ts_optim_lr(&c, 9) - 0.1) < 1e-12 && fabs(ts_optim_lr(&c, 500) - 0.1) < 1e-12;
    ts_ok(ok, "warm-up then constant: lr(0) = lr/10, lr(4) = lr/2, lr(9..) = lr");
    c.sched = TS_SCHED_COSINE;
    ok = fabs(ts_optim_lr(&c, 10) - 0.1) < 1e-12 && fabs(ts_optim_lr(&c, 60) - (0.1 + 0.001) / 2) < 1e-12 &&
         fabs(ts_optim_lr(&c, 110) - 0.001) < 1e-12 && fabs(ts_optim_lr(&c, 200) - 0.001) < 1e-12;
    ts_ok(ok, "cosine: lr at the end of warm-up, the mean of lr and min_lr half-way, min_lr at the end");
    c.sched = TS_SCHED_POLY;
    ok = fabs(ts_optim_lr(&c, 10) - 0.1) < 1e-12 && fabs(ts_optim_lr(&c, 60) - 0.1 * pow(0.5, 0.9)) < 1e-12 &&
         ts_optim_lr(&c, 110) == 0.0;
    ts_ok(ok, "poly 0.9: lr, lr 0.5^0.9 half-way, 0 at the end");
}

static void test_arena_and_clip(void)
{
    ts_arena *a = NULL;
    int i0, i1, i2, ib;
    int rc = ts_arena_create(&a);
    rc |= ts_arena_add(a, "w", TS_PARAM, TS_FLOAT32, 2, (const int64_t[]){3, 5}, &i0);
    rc |= ts_arena_add(a, "b", TS_PARAM, TS_FLOAT32, 1, (const int64_t[]){1}, &i1);
    rc |= ts_arena_add(a, "bn.running_mean", TS_BUFFER, TS_FLOAT32, 1, (const int64_t[]){7}, &ib);
    rc |= ts_arena_add(a, "v", TS_PARAM, TS_FLOAT32, 1, (const int64_t[]){17}, &i2);
    int dup = ts_arena_add(a, "w", TS_PARAM, TS_FLOAT32, 1, (const int64_t[]){1}, NULL);
    rc |= ts_arena_alloc(a, 2);
    ts_ok(rc == 0 && dup == TS_ERR_INTERNAL, "arena: declare, reject a duplicate name, allocate with 2 state regions");
    ts_tensor w = ts_arena_value(a, i0), g = ts_arena_grad(a, i2), s1 = ts_arena_state(a, 1, i1), bm = ts_arena_value(a, ib);
    int aligned = ((uintptr_t)w.data % 64 == 0) && ((uintptr_t)g.data % 64 == 0) && ((uintptr_t)s1.data % 64 == 0) &&
                  ((uintptr_t)bm.data % 64 == 0);
    ts_ok(aligned && a->nparam == 16 + 16 + 32 && (float *)g.data == a->grads + 32 && a->state[1] == a->grads + 2 * 64 &&
              ts_arena_grad(a, ib).data == NULL && ts_arena_find(a, "v") == i2 && ts_arena_count(a) == 15 + 1 + 17,
          "arena: 64-byte aligned views at equal offsets in params, grads and state; buffers have no gradient");
    /* gradients 3 and 4 (norm 5) */
    ((float *)ts_arena_grad(a, i0).data)[0] = 3;
    ((float *)ts_arena_grad(a, i2).data)[16] = 4;
    double nrm;
    rc = ts_optim_clip(a, 10.0, &nrm);
    ts_ok(rc == 0 && fabs(nrm - 5) < 1e-6 && ((float *)ts_arena_grad(a, i0).data)[0] == 3,
          "clip: norm 5 below max 10 leaves the gradients");
    rc = ts_optim_clip(a, 1.0, &nrm);
    double n2 = 0;
    for (size_t i = 0; i < a->nparam; i++) n2 += (double)a->grads[i] * a->grads[i];
    ts_ok(rc == 0 && fabs(nrm - 5) < 1e-6 && fabs(sqrt(n2) - 1.0 / (1.0 + 1e-6 / 5)) < 1e-6,
          "clip: norm 5 above max 1 scales to norm 1 (max / (norm + 1e-6), as PyTorch)");
    a->grads[3] = NAN;
    rc = ts_optim_clip(a, 1.0, &nrm);
    ts_ok(rc == TS_ERR_NUMERIC, "clip: a NaN gradient is an error: %s", ts_err_message());
    ts_arena_zero_grad(a);
    int zero = 1;
    for (size_t i = 0; i < a->nparam; i++) zero &= a->grads[i] == 0;
    ts_ok(zero, "zero_grad clears every gradient");
    ts_arena_destroy(&a);
    ts_ok(a == NULL, "destroy sets the pointer to NULL");
}

/* ts_optim_step_pieces on an arena with shard-sized state regions gives,
 * on the pieces, the bits of ts_optim_step_range on the whole arena
 * (AdamW, clipped by the global norm), and leaves the rest alone */
static void test_pieces(void)
{
    ts_arena *a = NULL, *b = NULL;
    int rc = ts_arena_create(&a) | ts_arena_create(&b);
    for (int k = 0; k < 2; k++) {
        ts_arena *x = k ? b : a;
        rc |= ts_arena_add(x, "w", TS_PARAM, TS_FLOAT32, 2, (const int64_t[]){3, 5}, NULL);
        rc |= ts_arena_add(x, "v", TS_PARAM, TS_FLOAT32, 1, (const int64_t[]){17}, NULL);
    }
    const size_t lo[2] = {0, 20}, len[2] = {5, 21};
    rc |= ts_arena_alloc(a, 2) | ts_arena_alloc(b, 0) | ts_arena_alloc_state(b, 2, 26);
    ts_ok(rc == 0 && b->nstate == 2 && b->nstate_floats == 26 && ts_arena_state(b, 0, 0).data == NULL &&
              ts_arena_state(a, 0, 0).data != NULL,
          "arena: shard-sized state regions of their own; no named state views then");
    ts_rng r;
    ts_rng_init(&r, 11, 0, 0);
    for (size_t i = 0; i < a->nparam; i++) a->params[i] = b->params[i] = ts_rng_uniformf(&r) - 0.5f;
    float init[64];
    memcpy(init, b->params, a->nparam * sizeof(float));
    ts_optim oa = {.cfg = {.kind = TS_OPT_ADAMW, .lr = 0.01, .weight_decay = 0.05, .beta1 = 0.9, .beta2 = 0.999,
                           .eps = 1e-8, .clip_norm = 0.5}},
              ob = oa;
    for (int step = 0; step < 3; step++) {
        for (size_t i = 0; i < a->nparam; i++) a->grads[i] = b->grads[i] = ts_rng_uniformf(&r) - 0.5f;
        const double norm = sqrt(ts_optim_sumsq(b, 0, b->nparam)); /* the shards' sums added */
        rc |= ts_optim_step_range(&oa, a, 0, a->nparam, -1, NULL, NULL);
        rc |= ts_optim_step_pieces(&ob, b, 2, lo, len, norm, NULL);
    }
    int same = rc == 0 && oa.step == 3 && ob.step == 3;
    for (size_t i = 0; i < a->nparam; i++) {
        const int in = i < 5 || (i >= 20 && i < 41);
        same &= in ? a->params[i] == b->params[i] : b->params[i] == init[i];
    }
    for (int st = 0; st < 2; st++) {
        same &= !memcmp(b->state[st], a->state[st], 5 * sizeof(float));
        same &= !memcmp(b->state[st] + 5, a->state[st] + 20, 21 * sizeof(float));
    }
    ts_ok(same, "pieces: AdamW with clipping on a shard gives the whole update's bits there (state packed) and "
                "leaves the rest");
    int e1 = ts_optim_step_range(&ob, b, 0, b->nparam, -1, NULL, NULL);
    int e2 = ts_optim_step_pieces(&ob, b, 2, lo, len, -1, NULL);
    const size_t big[1] = {30};
    int e3 = ts_optim_step_pieces(&ob, b, 1, lo, big, 1.0, NULL);
    ts_ok(e1 != 0 && e2 != 0 && e3 != 0, "pieces: refused on a whole-arena call, without the global norm, or "
                                         "beyond the state regions");
    ts_arena_destroy(&a);
    ts_arena_destroy(&b);
}

int main(void)
{
    test_sgd(0.0, 0.0, 0);
    test_sgd(0.9, 0.0, 0);
    test_sgd(0.9, 1e-3, 0);
    test_sgd(0.9, 1e-3, 1);
    test_adamw(0.0);
    test_adamw(0.05);
    test_schedules();
    test_arena_and_clip();
    test_pieces();
    return ts_done();
}
