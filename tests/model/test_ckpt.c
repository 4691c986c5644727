/* Activation checkpointing (model.checkpoint_levels): for several sets of
 * levels and each norm (and instance norm with leaky ReLU), a training
 * step gives bit-identical gradients, logits, loss and batch-norm
 * statistics to no checkpointing (memcmp), with
 * less activation memory allocated (and the dry-run plan equal to what is
 * allocated); two optimizer steps give bit-identical weights that moved;
 * an eval-mode forward and backward too; a two-stage pipeline simulated in
 * one process (edges copied between the stages, two micro-batches in two
 * slots) with cuts between and inside checkpointed blocks gives the
 * gradients of one model; at 64^3 x batch 2 with the default channels the
 * top two levels cut the planned activation memory by >= 30%; level lists
 * are parsed and bad ones refused naming the key. */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/model/cost.h"
#include "src/model/unet.h"
#include "src/optim/optim.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N 2
static const int64_t D = 16, H = 12, W = 20;

typedef struct {
    float *grads, *logits, *bufs, *params;
    double loss;
    size_t ng, nl, nb;
    size_t act, plan, scratch;
} snap;

static void snap_free(snap *s)
{
    free(s->grads);
    free(s->logits);
    free(s->bufs);
    free(s->params);
    memset(s, 0, sizeof *s);
}

static ts_unet_cfg base_cfg(ts_norm_kind norm)
{
    ts_unet_cfg c;
    memset(&c, 0, sizeof c);
    c.levels = 3;
    c.channels[0] = 8;
    c.channels[1] = 16;
    c.channels[2] = 24;
    c.in_channels = 1;
    c.classes = 3;
    c.norm = norm;
    c.groups = 4;
    c.eps = 1e-5f;
    c.momentum = 0.1f;
    c.loss = TS_LOSS_CE_DICE;
    c.ignore_index = -1;
    return c;
}

static void *dup_mem(const void *p, size_t n)
{
    void *q = malloc(n ? n : 1);
    if (q) memcpy(q, p, n);
    return q;
}

/* a fresh model with levels `mask` checkpointed: `steps` SGD steps (0: one
 * forward, loss, backward without an update) on img/lab, train or eval mode */
static int run(const ts_unet_cfg *c0, unsigned mask, int steps, int train, const ts_tensor *img, const ts_tensor *lab,
               snap *s)
{
    int err = 0;
    ts_unet_cfg c = *c0;
    c.ckpt_levels = mask;
    ts_unet *m = NULL;
    ts_optim opt;
    memset(&opt, 0, sizeof opt);
    opt.cfg.kind = TS_OPT_SGD;
    opt.cfg.lr = 0.05;
    opt.cfg.momentum = 0.9;
    memset(s, 0, sizeof *s);
    TS_CHECK(ts_unet_create(&c, 1, &m));
    TS_CHECK(ts_unet_init(m, 11));
    TS_CHECK(ts_unet_plan_bytes(m, N, (int)D, (int)H, (int)W, &s->plan));
    ts_arena *a = ts_unet_arena(m);
    for (int k = 0; k < (steps ? steps : 1); k++) {
        ts_arena_zero_grad(a);
        TS_CHECK(ts_unet_forward(m, img, train));
        TS_CHECK(ts_unet_loss(m, lab, 1, &s->loss));
        TS_CHECK(ts_unet_backward(m));
        if (steps) TS_CHECK(ts_optim_step(&opt, a, NULL, NULL));
    }
    const ts_tensor *l = ts_unet_logits(m);
    s->nl = (size_t)ts_tensor_numel(l);
    s->ng = a->nparam;
    s->nb = a->nbuf;
    s->grads = dup_mem(a->grads, s->ng * sizeof(float));
    s->params = dup_mem(a->params, s->ng * sizeof(float));
    s->logits = dup_mem(l->data, s->nl * sizeof(float));
    s->bufs = dup_mem(a->buffers, s->nb * sizeof(float));
    s->act = ts_unet_activation_bytes(m);
    s->scratch = ts_unet_recompute_bytes(m);
    if (!s->grads || !s->params || !s->logits || !s->bufs) TS_FAIL(TS_ERR_NOMEM, "snapshot");
cleanup:
    ts_unet_destroy(&m);
    return err;
}

static int same(const snap *a, const snap *b)
{
    return a->loss == b->loss && a->ng == b->ng && !memcmp(a->grads, b->grads, a->ng * sizeof(float)) &&
           !memcmp(a->logits, b->logits, a->nl * sizeof(float)) && !memcmp(a->bufs, b->bufs, a->nb * sizeof(float)) &&
           !memcmp(a->params, b->params, a->ng * sizeof(float));
}

/* every weight tensor (conv, transposed conv, head) has a non-zero gradient */
static int grads_nonzero(const ts_unet_cfg *c, const snap *s)
{
    ts_unet *m = NULL;
    if (ts_unet_create(c, 1, &m)) return 0;
    const ts_arena *a = ts_unet_arena(m);
    int ok = 1;
    for (int i = 0; i < a->n; i++) {
        if (a->p[i].kind != TS_PARAM || a->p[i].ndim != 5) continue;
        int nz = 0;
        for (int64_t j = 0; j < a->p[i].numel; j++) nz |= s->grads[a->p[i].offset + (size_t)j] != 0;
        ok &= nz;
    }
    ts_unet_destroy(&m);
    return ok;
}

static const char *mask_str(unsigned mask)
{
    static char buf[32];
    return ts_unet_checkpoint_str(mask, buf, sizeof buf);
}

/* A two-stage pipeline in one process: stage A holds units [0, cut), B
 * [cut, U), each with 2 slots; two micro-batches forward (the activations
 * of the edges crossing the cut copied from A to B), then both backward
 * (their gradients copied back), as GPipe. grads: A's gradients for A's
 * parameters, B's for B's. */
static int pipe2(const ts_unet_cfg *c0, unsigned mask, int cut, const ts_tensor img[2], const ts_tensor lab[2],
                 float *grads, double *loss, size_t *act_a)
{
    int err = 0;
    ts_unet_cfg c = *c0;
    c.ckpt_levels = mask;
    ts_unet *st[2] = {NULL, NULL};
    ts_unet_edge e[6 * TS_UNET_MAX_LEVELS];
    for (int k = 0; k < 2; k++) {
        TS_CHECK(ts_unet_create(&c, 1, &st[k]));
        TS_CHECK(ts_unet_init(st[k], 11));
    }
    const int U = ts_unet_units(st[0]), ne = ts_unet_edges(st[0], e);
    TS_CHECK(ts_unet_set_stage(st[0], 0, cut, 2));
    TS_CHECK(ts_unet_set_stage(st[1], cut, U, 2));
    TS_CHECK(ts_unet_setup(st[1], N, (int)D, (int)H, (int)W));
    for (int k = 0; k < 2; k++) ts_arena_zero_grad(ts_unet_arena(st[k]));
    *loss = 0;
    for (int mb = 0; mb < 2; mb++) {
        double l;
        TS_CHECK(ts_unet_forward_slot(st[0], mb, &img[mb], 1));
        for (int i = 0; i < ne; i++) {
            if (!(e[i].producer < cut && e[i].consumer >= cut)) continue;
            ts_tensor *a0, *g0, *a1, *g1;
            TS_CHECK(ts_unet_edge_tensors(st[0], mb, &e[i], &a0, &g0));
            TS_CHECK(ts_unet_edge_tensors(st[1], mb, &e[i], &a1, &g1));
            TS_CHECK(ts_tensor_copy(a1, a0));
        }
        TS_CHECK(ts_unet_forward_slot(st[1], mb, NULL, 1));
        TS_CHECK(ts_unet_loss_slot(st[1], mb, &lab[mb], 1, &l));
        *loss += l;
    }
    for (int mb = 0; mb < 2; mb++) {
        TS_CHECK(ts_unet_backward_slot(st[1], mb));
        for (int i = 0; i < ne; i++) {
            if (!(e[i].producer < cut && e[i].consumer >= cut)) continue;
            ts_tensor *a0, *g0, *a1, *g1;
            TS_CHECK(ts_unet_edge_tensors(st[0], mb, &e[i], &a0, &g0));
            TS_CHECK(ts_unet_edge_tensors(st[1], mb, &e[i], &a1, &g1));
            TS_CHECK(ts_tensor_copy(g0, g1));
        }
        TS_CHECK(ts_unet_backward_slot(st[0], mb));
    }
    *act_a = ts_unet_activation_bytes(st[0]);
    {
        const ts_arena *a = ts_unet_arena(st[0]);
        memset(grads, 0, a->nparam * sizeof(float));
        for (int u = 0; u < U; u++) {
            int f, end;
            ts_unet_unit_params(st[0], u, &f, &end);
            const ts_arena *src = ts_unet_arena(st[u < cut ? 0 : 1]);
            for (int j = f; j < end; j++)
                if (a->p[j].kind == TS_PARAM)
                    memcpy(grads + a->p[j].offset, src->grads + a->p[j].offset, (size_t)a->p[j].numel * sizeof(float));
        }
    }
cleanup:
    ts_unet_destroy(&st[0]);
    ts_unet_destroy(&st[1]);
    return err;
}

/* the reference of pipe2: one model, the two micro-batches' gradients accumulated in order */
static int accum2(const ts_unet_cfg *c, const ts_tensor img[2], const ts_tensor lab[2], float *grads, double *loss)
{
    int err = 0;
    ts_unet *m = NULL;
    TS_CHECK(ts_unet_create(c, 1, &m));
    TS_CHECK(ts_unet_init(m, 11));
    ts_arena_zero_grad(ts_unet_arena(m));
    *loss = 0;
    for (int mb = 0; mb < 2; mb++) {
        double l;
        TS_CHECK(ts_unet_forward(m, &img[mb], 1));
        TS_CHECK(ts_unet_loss(m, &lab[mb], 1, &l));
        TS_CHECK(ts_unet_backward(m));
        *loss += l;
    }
    memcpy(grads, ts_unet_arena(m)->grads, ts_unet_arena(m)->nparam * sizeof(float));
cleanup:
    ts_unet_destroy(&m);
    return err;
}

static void random_batch(ts_rng *r, ts_tensor *img, ts_tensor *lab)
{
    for (int64_t i = 0; i < ts_tensor_numel(img); i++) ((float *)img->data)[i] = (float)ts_rng_normal(r);
    for (int64_t i = 0; i < ts_tensor_numel(lab); i++) ((uint8_t *)lab->data)[i] = (uint8_t)ts_rng_below(r, 3);
}

int main(void)
{
    ts_tensor img[2], lab[2];
    ts_rng r;
    ts_rng_init(&r, 5, 0, 0);
    int rc = 0;
    for (int k = 0; k < 2; k++) {
        rc |= ts_tensor_alloc(&img[k], TS_FLOAT32, 5, (const int64_t[]){N, 1, D, H, W});
        rc |= ts_tensor_alloc(&lab[k], TS_UINT8, 4, (const int64_t[]){N, D, H, W});
        if (!rc) random_batch(&r, &img[k], &lab[k]);
    }
    if (rc) {
        printf("Bail out! setup: %s\n", ts_err_message());
        return 1;
    }

    /* one step: every set of levels, each norm */
    static const unsigned masks[] = {1, 2, 4, 3, 6, 7};
    static const ts_norm_kind norms[] = {TS_NORM_BATCH, TS_NORM_GROUP, TS_NORM_INSTANCE, TS_NORM_INSTANCE};
    static const char *const norm_name[] = {"batch", "group", "instance", "leaky-ReLU instance"};
    for (int k = 0; k < 4; k++) {
        ts_unet_cfg c = base_cfg(norms[k]);
        if (k == 3) { /* the leaky ReLU runs after the norm, also when a checkpointed level is recomputed */
            c.act = TS_ACT_LEAKY;
            c.slope = 0.01f;
        }
        snap ref;
        rc = run(&c, 0, 0, 1, &img[0], &lab[0], &ref);
        ts_ok(rc == 0 && ref.act == ref.plan && ref.scratch == 0 && grads_nonzero(&c, &ref),
              "%s norm, no checkpointing: every weight has a gradient; %zu activation bytes, as planned", norm_name[k],
              ref.act);
        for (size_t j = 0; j < sizeof masks / sizeof *masks; j++) {
            snap s;
            rc = run(&c, masks[j], 0, 1, &img[0], &lab[0], &s);
            ts_ok(rc == 0 && same(&ref, &s) && s.act < ref.act && s.act == s.plan && s.scratch > 0,
                  "%s norm, levels %s: gradients, logits, loss, statistics bit-identical; activations %zu < %zu bytes "
                  "(recompute scratch %zu), as planned (%zu)%s%s",
                  norm_name[k], mask_str(masks[j]), s.act, ref.act, s.scratch, s.plan, rc ? ": " : "",
                  rc ? ts_err_message() : "");
            snap_free(&s);
        }
        snap_free(&ref);
    }

    /* training: two SGD steps move the weights, identically */
    {
        const ts_unet_cfg c = base_cfg(TS_NORM_BATCH);
        snap a, b, init;
        rc = run(&c, 0, 2, 1, &img[0], &lab[0], &a);
        rc |= run(&c, 3, 2, 1, &img[0], &lab[0], &b);
        rc |= run(&c, 0, 0, 1, &img[0], &lab[0], &init); /* params untouched */
        double moved = 0;
        for (size_t i = 0; !rc && i < a.ng; i++) moved = fmax(moved, fabs((double)a.params[i] - init.params[i]));
        ts_ok(rc == 0 && same(&a, &b) && moved > 1e-4,
              "two SGD steps with levels 0,1 checkpointed: weights, gradients, running statistics bit-identical; "
              "the weights moved by up to %.3g", moved);
        snap_free(&a);
        snap_free(&b);
        snap_free(&init);
    }

    /* eval-mode forward (running statistics) and backward */
    {
        const ts_unet_cfg c = base_cfg(TS_NORM_BATCH);
        snap a, b;
        rc = run(&c, 0, 0, 0, &img[0], &lab[0], &a);
        rc |= run(&c, 7, 0, 0, &img[0], &lab[0], &b);
        ts_ok(rc == 0 && same(&a, &b), "eval-mode forward and backward with every level checkpointed: bit-identical");
        snap_free(&a);
        snap_free(&b);
    }

    /* pipeline stages: cuts between levels and inside checkpointed blocks */
    {
        const ts_unet_cfg c = base_cfg(TS_NORM_BATCH);
        ts_unet *m = NULL;
        rc = ts_unet_create(&c, 1, &m);
        const size_t np = rc ? 0 : ts_unet_arena(m)->nparam;
        float *ref = calloc(np ? np : 1, sizeof(float)), *got = calloc(np ? np : 1, sizeof(float));
        double lref = 0, l = 0;
        rc |= !ref || !got || accum2(&c, img, lab, ref, &lref);
        /* units: enc0.conv1 0, enc0.conv2 1, enc1.conv1 2, ..., enc2.conv2 5, dec1.conv1 6, dec1.conv2 7,
         * dec0.conv1 8, dec0.conv2 9, head 10 */
        static const struct { unsigned mask; int cut; } cases[] = {{1, 1}, {3, 2}, {3, 3}, {3, 7}, {1, 9}, {7, 6}, {2, 8}};
        for (size_t j = 0; j < sizeof cases / sizeof *cases; j++) {
            char name[32];
            size_t act_ck = 0, act_no = 0;
            double l0 = 0;
            int prc = rc || pipe2(&c, 0, cases[j].cut, img, lab, got, &l0, &act_no); /* its memory */
            prc |= !prc && pipe2(&c, cases[j].mask, cases[j].cut, img, lab, got, &l, &act_ck);
            ts_ok(!prc && l == lref && !memcmp(got, ref, np * sizeof(float)) && act_ck <= act_no,
                  "pipeline of 2 stages cut before %s, levels %s, 2 micro-batches in 2 slots: gradients and loss of one "
                  "model, bit-identical; stage 0 holds %zu activation bytes (%zu without checkpointing)%s%s",
                  ts_unet_unit_name(m, cases[j].cut, name, sizeof name), mask_str(cases[j].mask), act_ck, act_no,
                  prc ? ": " : "", prc ? ts_err_message() : "");
        }
        free(ref);
        free(got);
        ts_unet_destroy(&m);
    }

    /* the acceptance case, planned: 64^3, batch 2, default channels, levels 0 and 1 */
    {
        ts_unet_cfg c = base_cfg(TS_NORM_BATCH);
        c.levels = 4;
        c.channels[0] = 16;
        c.channels[1] = 32;
        c.channels[2] = 64;
        c.channels[3] = 128;
        c.classes = 2;
        c.loss = TS_LOSS_CE;
        ts_unet *m = NULL;
        size_t full = 0, top2 = 0;
        rc = ts_unet_create(&c, 1, &m);
        rc |= !rc && ts_unet_plan_bytes(m, 2, 64, 64, 64, &full);
        rc |= !rc && ts_unet_set_checkpoint(m, 3);
        rc |= !rc && ts_unet_plan_bytes(m, 2, 64, 64, 64, &top2);
        ts_unet_cost c0, c1;
        const int64_t box[3] = {64, 64, 64};
        rc |= ts_unet_cost_of(&c, 2, box, NULL, &c0);
        c.ckpt_levels = 3;
        rc |= ts_unet_cost_of(&c, 2, box, NULL, &c1);
        const double cut = 1.0 - (double)top2 / (double)(full ? full : 1);
        ts_ok(rc == 0 && cut >= 0.30 && c1.act_elems < 0.75 * c0.act_elems && c1.flops_recompute > 0 &&
                  c1.flops_forward == c0.flops_forward && c1.work[TS_PROF_CONV_FWD] > c0.work[TS_PROF_CONV_FWD],
              "64^3 x 2, channels 16,32,64,128, levels 0,1: planned activations %.1f -> %.1f MiB (-%.1f%%); cost model "
              "%.3g -> %.3g activation elements, %.3g recomputed FLOPs", full / 1048576.0, top2 / 1048576.0, 100 * cut,
              c0.act_elems, c1.act_elems, c1.flops_recompute);
        ts_ok(ts_unet_set_checkpoint(m, 1u << 4) == TS_ERR_ARG, "a level the model lacks is refused: %s", ts_err_message());
        ts_unet_destroy(&m);
    }

    /* parsing */
    {
        unsigned mk = 99;
        int ok = !ts_unet_parse_checkpoint_levels("none", 3, "test", &mk) && mk == 0;
        ok &= !ts_unet_parse_checkpoint_levels("all", 3, "test", &mk) && mk == 7;
        ok &= !ts_unet_parse_checkpoint_levels("0,1", 3, "test", &mk) && mk == 3;
        ok &= !ts_unet_parse_checkpoint_levels(" 2, 0 ", 3, "test", &mk) && mk == 5;
        ts_ok(ok, "checkpoint levels parsed: none, all, 0,1, ' 2, 0 '");
        static const char *const bad[] = {"9", "-1", "x", "", "0,", ",1", "1.5", "3", "0,1,0", "2, 2"};
        for (size_t j = 0; j < sizeof bad / sizeof *bad; j++) {
            int e = ts_unet_parse_checkpoint_levels(bad[j], 3, "test", &mk);
            ts_ok(e == TS_ERR_CONFIG && strstr(ts_err_message(), "model.checkpoint_levels"),
                  "'%s' refused for a 3-level model: %s", bad[j], ts_err_message());
        }
    }
    for (int k = 0; k < 2; k++) {
        ts_tensor_free(&img[k]);
        ts_tensor_free(&lab[k]);
    }
    return ts_done();
}
