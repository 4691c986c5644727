/* UNet3D engine properties the golden test does not cover: a training step
 * gives bit-identical logits, loss and gradients when repeated and with 1 or
 * 2 threads (the kernels' sums do not depend on the schedule); gradients are
 * accumulated (two backward passes give twice the gradient); the tensor
 * helpers (channels-first <-> channels-last, bfloat16 storage) round-trip.
 * The residual encoder and deep supervision: the same determinism, and the
 * cost model counts exactly the parameters and buffers the model has. */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/model/cost.h"
#include "src/model/unet.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct {
    float *logits, *grads;
    double loss;
    size_t nl, ng;
} snap;

static int step(ts_unet *m, const ts_tensor *img, const ts_tensor *lab, int threads, int twice, snap *s)
{
#ifdef _OPENMP
    omp_set_num_threads(threads);
#else
    (void)threads;
#endif
    ts_arena *a = ts_unet_arena(m);
    ts_arena_zero_grad(a);
    for (int r = 0; r < (twice ? 2 : 1); r++) {
        TS_TRY(ts_unet_forward(m, img, 1));
        TS_TRY(ts_unet_loss(m, lab, 1, &s->loss));
        TS_TRY(ts_unet_backward(m));
    }
    const ts_tensor *l = ts_unet_logits(m);
    s->nl = (size_t)ts_tensor_numel(l);
    s->ng = a->nparam;
    s->logits = malloc(s->nl * sizeof(float));
    s->grads = malloc(s->ng * sizeof(float));
    memcpy(s->logits, l->data, s->nl * sizeof(float));
    memcpy(s->grads, a->grads, s->ng * sizeof(float));
    return 0;
}

static int same(const snap *a, const snap *b)
{
    return a->loss == b->loss && !memcmp(a->logits, b->logits, a->nl * sizeof(float)) &&
           !memcmp(a->grads, b->grads, a->ng * sizeof(float));
}

/* Inference's folding (ts_unet_set_fold_eval): an eval forward with the
 * batch norms and activations in the convolutions' epilogues gives the
 * unfolded eval forward's logits bit for bit, runs no norm pass, and a
 * backward after it is refused. m has trained (non-trivial running
 * statistics). */
static void fold_check(ts_unet *m, const ts_tensor *img, const ts_tensor *lab, const char *name)
{
    int rc = ts_unet_forward(m, img, 0);
    const ts_tensor *l = ts_unet_logits(m);
    const size_t n = rc ? 0 : (size_t)ts_tensor_numel(l);
    float *ref = malloc(n * sizeof(float) + 1);
    if (!rc) memcpy(ref, l->data, n * sizeof(float));
    const double norm_unfolded = rc ? 0 : ts_unet_profile(m)[TS_PROF_NORM];
    ts_unet_profile_reset(m);
    ts_unet_set_fold_eval(m, 1);
    rc |= ts_unet_forward(m, img, 0);
    const double norm_folded = ts_unet_profile(m)[TS_PROF_NORM];
    l = ts_unet_logits(m);
    size_t diff = 0, nonzero = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        diff += memcmp(&ref[i], (const float *)l->data + i, sizeof(float)) != 0;
        nonzero += ref[i] != 0.0f;
    }
    ts_ok(rc == 0 && n > 0 && diff == 0 && nonzero > n / 2 && norm_unfolded > 0 && norm_folded == 0,
          "%s: the eval forward with batch norm folded into the convolutions gives the same logits bit for bit "
          "(%zu of %zu differ), with no norm pass", name, diff, n);
    double loss;
    rc = ts_unet_loss(m, lab, 1, &loss);
    const int brc = ts_unet_backward(m);
    ts_ok(rc == 0 && brc == TS_ERR_ARG && strstr(ts_err_message(), "folded"),
          "%s: a backward after a folded forward is refused: %s", name, ts_err_message());
    ts_unet_set_fold_eval(m, 0);
    rc = ts_unet_forward(m, img, 0);
    l = ts_unet_logits(m);
    ts_ok(rc == 0 && !memcmp(ref, l->data, n * sizeof(float)), "%s: folding off again: the unfolded forward as before", name);
    free(ref);
}

int main(void)
{
    ts_unet_cfg c;
    memset(&c, 0, sizeof c);
    c.levels = 3;
    c.channels[0] = 16;
    c.channels[1] = 24;
    c.channels[2] = 32;
    c.in_channels = 1;
    c.classes = 3;
    c.norm = TS_NORM_BATCH;
    c.eps = 1e-5f;
    c.momentum = 0.1f;
    c.loss = TS_LOSS_CE_DICE;
    c.ignore_index = -1;
    ts_unet *m = NULL;
    ts_tensor img, lab;
    ts_rng r;
    ts_rng_init(&r, 5, 0, 0);
    int rc = ts_unet_create(&c, 1, &m);
    rc |= ts_unet_init(m, 11);
    rc |= ts_tensor_alloc(&img, TS_FLOAT32, 5, (const int64_t[]){2, 1, 16, 12, 20});
    rc |= ts_tensor_alloc(&lab, TS_UINT8, 4, (const int64_t[]){2, 16, 12, 20});
    if (rc) {
        printf("Bail out! setup: %s\n", ts_err_message());
        return 1;
    }
    for (int64_t i = 0; i < ts_tensor_numel(&img); i++) ((float *)img.data)[i] = (float)ts_rng_normal(&r);
    for (int64_t i = 0; i < ts_tensor_numel(&lab); i++) ((uint8_t *)lab.data)[i] = (uint8_t)ts_rng_below(&r, 3);
    snap s1, s2, s3, s4;
    rc = step(m, &img, &lab, 2, 0, &s1);
    rc |= step(m, &img, &lab, 2, 0, &s2);
    ts_ok(rc == 0 && same(&s1, &s2), "two training steps on the same input: bit-identical logits, loss, gradients");
    rc = step(m, &img, &lab, 1, 0, &s3);
    ts_ok(rc == 0 && same(&s1, &s3), "1 thread and 2 threads: bit-identical logits, loss (%.6f), gradients", s1.loss);
    /* more threads than weight-gradient chunks: the taps are split among threads */
    for (int nt = 5; nt <= 19; nt += 14) {
        snap s5;
        rc = step(m, &img, &lab, nt, 0, &s5);
        ts_ok(rc == 0 && same(&s1, &s5), "%d threads: bit-identical logits, loss, gradients", nt);
        free(s5.logits);
        free(s5.grads);
    }
    rc = step(m, &img, &lab, 2, 1, &s4);
    double e = 0, mx = 0;
    for (size_t i = 0; i < s1.ng; i++) {
        mx = fmax(mx, fabs(s1.grads[i]));
        e = fmax(e, fabs(s4.grads[i] - 2 * s1.grads[i]));
    }
    ts_ok(rc == 0 && e <= 1e-6 * mx && mx > 0, "backward accumulates: two passes give twice the gradient (max diff %.1e of %.1e)", e, mx);
    /* the model refuses a backward without a loss gradient */
    ts_ok(ts_unet_backward(m) == TS_ERR_ARG, "backward twice without a new forward and loss is an error: %s", ts_err_message());
    fold_check(m, &img, &lab, "batch norm, ReLU, 16/24/32 channels");
    {
        ts_unet_cfg cl = c;
        cl.channels[0] = 8;
        cl.channels[1] = 16;
        cl.channels[2] = 20;
        cl.act = TS_ACT_LEAKY;
        cl.slope = 0.01f;
        ts_unet *ml = NULL;
        snap sl;
        int rl = ts_unet_create(&cl, 1, &ml);
        rl |= ts_unet_init(ml, 12);
        if (!rl) rl = step(ml, &img, &lab, 2, 0, &sl);
        ts_ok(rl == 0, "leaky model trained one step: %s", rl ? ts_err_message() : "ok");
        if (!rl) {
            fold_check(ml, &img, &lab, "batch norm, leaky ReLU, 8/16/20 channels");
            free(sl.logits);
            free(sl.grads);
        }
        ts_unet_destroy(&ml);
    }

    /* tensor helpers */
    ts_tensor cl, back, bf, f2;
    rc = ts_tensor_alloc(&cl, TS_FLOAT32, 5, (const int64_t[]){2, 3, 4, 5, 6});
    rc |= ts_tensor_alloc(&back, TS_FLOAT32, 5, (const int64_t[]){2, 6, 3, 4, 5});
    ts_tensor src;
    rc |= ts_tensor_alloc(&src, TS_FLOAT32, 5, (const int64_t[]){2, 6, 3, 4, 5});
    for (int64_t i = 0; i < ts_tensor_numel(&src); i++) ((float *)src.data)[i] = (float)i;
    rc |= ts_tensor_to_channels_last(&src, &cl);
    /* element (n=1, c=4, d=2, h=3, w=1) */
    const float want = (float)((((1 * 6 + 4) * 3 + 2) * 4 + 3) * 5 + 1);
    const float got = ((float *)cl.data)[(((1 * 3 + 2) * 4 + 3) * 5 + 1) * 6 + 4];
    rc |= ts_tensor_to_channels_first(&cl, &back);
    ts_ok(rc == 0 && got == want && !memcmp(src.data, back.data, ts_tensor_bytes(&src)),
          "channels-first -> channels-last puts [n][c][d][h][w] at [n][d][h][w][c] and back");
    rc = ts_tensor_alloc(&bf, TS_BFLOAT16, 1, (const int64_t[]){4});
    rc |= ts_tensor_alloc(&f2, TS_FLOAT32, 1, (const int64_t[]){4});
    const float vals[4] = {1.0f, -2.5f, 3.0078125f, 1e-3f};
    ts_tensor fv = ts_tensor_view((void *)vals, TS_FLOAT32, 1, (const int64_t[]){4});
    rc |= ts_tensor_copy(&bf, &fv);
    rc |= ts_tensor_copy(&f2, &bf);
    const float *o = f2.data;
    ts_ok(rc == 0 && o[0] == 1.0f && o[1] == -2.5f && o[2] == 3.0f && fabsf(o[3] - 1e-3f) < 1e-5f,
          "float32 -> bfloat16 -> float32 rounds to nearest even (3.0078125 -> 3.0)");
    ts_tensor u8;
    rc = ts_tensor_alloc(&u8, TS_UINT8, 1, (const int64_t[]){4});
    ts_ok(ts_tensor_copy(&u8, &fv) == TS_ERR_ARG, "copy refuses float32 -> uint8: %s", ts_err_message());
    ts_tensor *all[] = {&img, &lab, &cl, &back, &src, &bf, &f2, &u8};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ts_tensor_free(all[i]);
    snap *ss[] = {&s1, &s2, &s3, &s4};
    for (int i = 0; i < 4; i++) {
        free(ss[i]->logits);
        free(ss[i]->grads);
    }
    ts_unet_destroy(&m);
    /* the nnU-Net variants on 4 levels (deep supervision needs them): resenc, ds, both */
    ts_tensor img4, lab4;
    rc = ts_tensor_alloc(&img4, TS_FLOAT32, 5, (const int64_t[]){2, 1, 8, 16, 16});
    rc |= ts_tensor_alloc(&lab4, TS_UINT8, 4, (const int64_t[]){2, 8, 16, 16});
    for (int64_t i = 0; !rc && i < ts_tensor_numel(&img4); i++) ((float *)img4.data)[i] = (float)ts_rng_normal(&r);
    for (int64_t i = 0; !rc && i < ts_tensor_numel(&lab4); i++) ((uint8_t *)lab4.data)[i] = (uint8_t)ts_rng_below(&r, 3);
    for (int v = 0; v < 3; v++) {
        static const char *const name[] = {"resenc", "deep supervision", "resenc + deep supervision"};
        ts_unet_cfg c4 = c;
        c4.levels = 4;
        c4.channels[2] = 24;
        c4.channels[3] = 32;
        c4.arch = v != 1 ? TS_ARCH_RESENC : TS_ARCH_UNET;
        c4.deep_supervision = v >= 1;
        c4.act = TS_ACT_LEAKY;
        c4.slope = 0.01f;
        for (int l = 0; l < 4; l++) c4.res_blocks[l] = 1 + l % 2;
        ts_unet *m4 = NULL;
        ts_unet_cost cost;
        snap a, b;
        int r4 = rc || ts_unet_create(&c4, 1, &m4) || ts_unet_init(m4, 3);
        r4 = r4 || ts_unet_cost_of(&c4, 2, (const int64_t[]){8, 16, 16}, NULL, &cost);
        int64_t nbuf = 0;
        const ts_arena *a4 = r4 ? NULL : ts_unet_arena(m4);
        for (int i = 0; a4 && i < a4->n; i++)
            if (a4->p[i].kind == TS_BUFFER && a4->p[i].dtype == TS_FLOAT32) nbuf += a4->p[i].numel;
        ts_ok(!r4 && cost.params == (double)ts_arena_count(a4) && cost.buffers == (double)nbuf,
              "%s: the cost model counts %.0f parameters and %.0f buffers, the model has %lld and %lld", name[v],
              r4 ? 0.0 : cost.params, r4 ? 0.0 : cost.buffers, a4 ? (long long)ts_arena_count(a4) : -1LL,
              (long long)nbuf);
        r4 = r4 || step(m4, &img4, &lab4, 2, 0, &a) || step(m4, &img4, &lab4, 1, 0, &b);
        ts_ok(!r4 && same(&a, &b) && isfinite(a.loss), "%s: 1 and 2 threads give bit-identical logits, loss (%.6f), "
              "gradients", name[v], r4 ? 0.0 : a.loss);
        if (!r4) {
            free(a.logits);
            free(a.grads);
            free(b.logits);
            free(b.grads);
        }
        ts_unet_destroy(&m4);
    }
    ts_tensor_free(&img4);
    ts_tensor_free(&lab4);
    return ts_done();
}
