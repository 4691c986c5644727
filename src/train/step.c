/* One data-parallel step; see step.h. */
#include "tsbuild.h"
#include "src/train/step.h"
#include "src/core/error.h"
#include "src/core/timer.h"
#include "src/train/run.h"

#include <stdlib.h>
#include <string.h>

struct ts_stepper {
    ts_unet *model;
    ts_arena *arena;
    ts_optim *opt;
    ts_coll *coll;
    ts_dp *dp;
    unsigned char *final; /* per arena entry: gradient final in this backward */
    int frontier;         /* entries [frontier, n) are final (or buffers) */
    int hook_err;
    ts_step_times t;
    ts_perf *perf; /* may be NULL */
};

/* called by backward as each parameter's gradient becomes final */
static void grad_ready(void *ctx, int i)
{
    ts_stepper *s = ctx;
    if (s->hook_err) return;
    s->final[i] = 1;
    const ts_arena *a = s->arena;
    int f = s->frontier;
    while (f > 0 && (s->final[f - 1] || a->p[f - 1].kind != TS_PARAM)) f--;
    if (f == s->frontier) return;
    s->frontier = f;
    /* the lowest offset among the (final) parameters at or after the
     * frontier; buffers have offsets in another region and do not count */
    size_t lo = a->nparam;
    for (int j = f; j < a->n; j++)
        if (a->p[j].kind == TS_PARAM && a->p[j].offset < lo) lo = a->p[j].offset;
    s->hook_err = ts_dp_ready(s->dp, lo);
}

static int norm_sync(void *ctx, double *buf, int n)
{
    ts_stepper *s = ctx;
    return ts_coll_allreduce(s->coll, TS_IN_PLACE, buf, (size_t)n, TS_FLOAT64, TS_OP_SUM);
}

/* the model's split hooks on src/parallel's spatial group */
static int sp_halo_start(void *ctx, const float *a, int ca, const float *b, int cb, int N, const int64_t dhw[3],
                         const ts_halo *h)
{
    return ts_spatial_halo_start(ctx, a, ca, b, cb, N, dhw, h);
}
static void sp_halo_progress(void *ctx) { ts_spatial_halo_progress(ctx); }
static int sp_halo_wait(void *ctx) { return ts_spatial_halo_wait(ctx); }
static int sp_sum(void *ctx, double *buf, int n) { return ts_spatial_sum(ctx, buf, n); }

void ts_stepper_split_model(ts_unet *m, ts_spatial *sp)
{
    if (!sp || ts_spatial_size(sp) == 1) {
        ts_unet_set_split(m, NULL);
        return;
    }
    ts_unet_split u;
    memset(&u, 0, sizeof u);
    ts_spatial_split_dims(sp, u.on);
    for (int d = 0; d < 3; d++)
        for (int side = 0; side < 2; side++) u.nbr[d][side] = ts_spatial_neighbor(sp, d, side);
    u.halo_start = sp_halo_start;
    u.halo_progress = sp_halo_progress;
    u.halo_wait = sp_halo_wait;
    u.sum = sp_sum;
    u.ctx = sp;
    ts_unet_set_split(m, &u);
}

int ts_stepper_create(ts_unet *m, ts_optim *opt, ts_coll *coll, double bucket_mb, int sync_bn, ts_spatial *sp,
                      ts_stepper **out)
{
    int err = 0;
    ts_stepper *s = TS_CALLOC(1, sizeof *s);
    *out = NULL;
    if (!s) return TS_ERR_NOMEM;
    s->model = m;
    s->arena = ts_unet_arena(m);
    s->opt = opt;
    s->coll = coll;
    s->final = TS_CALLOC((size_t)s->arena->n + 1, 1);
    if (!s->final) TS_FAIL(TS_ERR_NOMEM, "gradient flags");
    size_t bf = (size_t)(bucket_mb * 1e6 / sizeof(float));
    TS_CHECK(ts_dp_create(coll, s->arena->grads, s->arena->nparam, bf ? bf : 16, &s->dp));
    if (sync_bn && ts_coll_size(coll) > 1) ts_unet_set_norm_sync(m, norm_sync, s);
    ts_stepper_split_model(m, sp);
    ts_unet_set_loss_scale(m, sp ? (float)ts_spatial_size(sp) : 1.0f);
    *out = s;
    return 0;
cleanup:
    ts_stepper_destroy(&s);
    return err;
}

void ts_stepper_destroy(ts_stepper **sp)
{
    if (!sp || !*sp) return;
    ts_stepper *s = *sp;
    if (s->model) {
        ts_unet_set_grad_hook(s->model, NULL, NULL);
        ts_unet_set_norm_sync(s->model, NULL, NULL);
        ts_unet_set_loss_scale(s->model, 1.0f);
    }
    ts_dp_destroy(&s->dp);
    free(s->final);
    free(s);
    *sp = NULL;
}

int ts_stepper_micro(ts_stepper *s, const ts_tensor *image, const ts_tensor *label, int first, int last, double *loss)
{
    if (first) ts_arena_zero_grad(s->arena);
    ts_perf_begin(s->perf, TS_PH_FORWARD);
    double t0 = ts_time_now();
    int err = ts_unet_forward(s->model, image, 1);
    if (!err) err = ts_unet_loss(s->model, label, 1, loss);
    double t1 = ts_time_now();
    ts_perf_end(s->perf, TS_PH_FORWARD);
    TS_TRY(err);
    s->t.forward += t1 - t0;
    if (last) { /* buckets go out as backward finishes them */
        ts_dp_begin(s->dp);
        memset(s->final, 0, (size_t)s->arena->n);
        s->frontier = s->arena->n;
        s->hook_err = 0;
    }
    ts_unet_set_grad_hook(s->model, last ? grad_ready : NULL, s);
    ts_perf_begin(s->perf, TS_PH_BACKWARD);
    err = ts_unet_backward(s->model);
    ts_perf_end(s->perf, TS_PH_BACKWARD);
    TS_TRY(err);
    TS_TRY(s->hook_err);
    s->t.backward += ts_time_now() - t1;
    return 0;
}

int ts_stepper_update(ts_stepper *s, int accum)
{
    ts_dp_stats st = {0, 0, 0};
    ts_perf_begin(s->perf, TS_PH_COMM_EXPOSED);
    int err = ts_dp_finish(s->dp, &st);
    ts_perf_end(s->perf, TS_PH_COMM_EXPOSED);
    TS_TRY(err);
    s->t.comm_exposed += st.exposed_s;
    s->t.comm_total += st.comm_s;
    ts_perf_add(s->perf, TS_PH_COMM_TOTAL, st.comm_s);
    if (accum > 1) { /* summed over micro-batches (scaled only now: buckets were in flight) */
        float f = 1.0f / (float)accum, *g = s->arena->grads;
        for (size_t i = 0; i < s->arena->nparam; i++) g[i] *= f;
    }
    ts_perf_begin(s->perf, TS_PH_OPTIM);
    double t = ts_time_now();
    err = ts_optim_step(s->opt, s->arena, NULL, NULL);
    s->t.optimizer += ts_time_now() - t;
    ts_perf_end(s->perf, TS_PH_OPTIM);
    return err;
}

void ts_stepper_set_perf(ts_stepper *s, ts_perf *p) { s->perf = p; }
const ts_step_times *ts_stepper_times(const ts_stepper *s) { return &s->t; }
int ts_stepper_buckets(const ts_stepper *s) { return ts_dp_buckets(s->dp); }
