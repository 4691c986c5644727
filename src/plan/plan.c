/* The performance model of `tessera plan`; see plan.h. Every assumption
 * is a named constant or a machine parameter, and docs/scaling.md lists
 * them. Owns the model's predictions and the calibration of its rates;
 * must not choose for a run (plan_auto.c) nor print (plan_report.c,
 * src/cli/plan.c). */
#include "tsbuild.h"
#include "src/plan/plan.h"
#include "collectives/coll.h"
#include "src/core/error.h"
#include "src/core/timer.h"
#include "src/model/cost.h"
#include "src/optim/optim.h"
#include "src/parallel/layout.h"
#include "src/parallel/spatial.h"
#include "src/train/step.h"
#include "src/train/synthetic.h"
#include "src/train/trainer.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* defaults where nothing was measured */
#define SHM_ALPHA_S 2e-6          /* intra-node allreduce latency term */
#define SHM_BETA_S (1.0 / 5e9)    /* intra-node seconds per byte of the shm shape */
#define NCCL_ALPHA_S 10e-6        /* GPU ring step latency */
#define P2P_ALPHA_S 2e-6          /* intra-node point-to-point message */
#define MEM_COPY_BPS 10e9         /* intra-node point-to-point bytes per second (shared memory) */
#define GPU_MEMBOUND_FACTOR 20.0  /* GPU speed-up of the memory-bound kinds (norm, pool, ...) over one CPU rank */
#define GPU_PROCESS_MB 600.0      /* CUDA context and libraries per rank */

static const char *const kind_keys[TS_PROF_COUNT] = {"conv_forward", "conv_weight_grad", "conv_input_grad",
                                                     "transposed_conv", "norm_relu", "max_pool", "loss", "halo",
                                                     "other"};

int ts_plan_calib_from_profile(const ts_unet_cfg *u, int n, const int64_t box[3], const double *prof, double opt_s,
                               double step_s, double act_bytes, double params, double process_mb, int threads,
                               ts_plan_calib *c)
{
    ts_unet_cost cost;
    memset(c, 0, sizeof *c);
    TS_TRY(ts_unet_cost_of(u, n, box, NULL, &cost));
    double profiled = 0;
    for (int k = 0; k < TS_PROF_COUNT; k++) {
        profiled += prof[k];
        if (k != TS_PROF_HALO && prof[k] > 0 && cost.work[k] > 0) c->rate[k] = cost.work[k] / prof[k];
    }
    c->opt_s_per_param = params > 0 ? opt_s / params : 0;
    double rest = step_s - profiled - opt_s;
    c->other_s_per_elem = rest > 0 && cost.act_elems > 0 ? rest / cost.act_elems : 0;
    c->act_bytes_per_elem = cost.act_elems > 0 ? act_bytes / cost.act_elems : 8;
    c->process_mb = process_mb;
    c->step_s = step_s;
    c->threads = threads > 0 ? threads : 1;
    snprintf(c->what, sizeof c->what, "channels %d.. (%d levels), batch %d, box %lldx%lldx%lld, %d thread%s",
             u->channels[0], u->levels, n, (long long)box[0], (long long)box[1], (long long)box[2], c->threads,
             c->threads > 1 ? "s" : "");
    return 0;
}

int ts_plan_calib_write(const char *path, const ts_plan_calib *c)
{
    int err = 0;
    cJSON *o = cJSON_CreateObject(), *r;
    char *txt = NULL;
    FILE *f = NULL;
    if (!o) return TS_ERR(TS_ERR_NOMEM, "calibration");
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddStringToObject(o, "what", c->what);
    cJSON_AddNumberToObject(o, "threads", c->threads);
    cJSON_AddNumberToObject(o, "step_s", c->step_s);
    r = cJSON_AddObjectToObject(o, "rates_per_s");
    for (int k = 0; k < TS_PROF_COUNT; k++)
        if (c->rate[k] > 0) cJSON_AddNumberToObject(r, kind_keys[k], c->rate[k]);
    cJSON_AddNumberToObject(o, "optimizer_s_per_param", c->opt_s_per_param);
    cJSON_AddNumberToObject(o, "other_s_per_act_elem", c->other_s_per_elem);
    cJSON_AddNumberToObject(o, "act_bytes_per_elem", c->act_bytes_per_elem);
    cJSON_AddNumberToObject(o, "process_mb", c->process_mb);
    cJSON *bs = cJSON_AddArrayToObject(o, "boxes"); /* rates at smaller boxes (docs/formats.md) */
    for (int i = 0; i < c->nbox; i++) {
        const ts_plan_box_rates *b = &c->boxes[i];
        cJSON *e = cJSON_CreateObject(), *bx = cJSON_AddArrayToObject(e, "box"), *br = cJSON_AddObjectToObject(e, "rates_per_s");
        for (int d = 0; d < 3; d++) cJSON_AddItemToArray(bx, cJSON_CreateNumber((double)b->box[d]));
        for (int k = 0; k < TS_PROF_COUNT; k++)
            if (b->rate[k] > 0) cJSON_AddNumberToObject(br, kind_keys[k], b->rate[k]);
        cJSON_AddNumberToObject(e, "other_s_per_act_elem", b->other_s_per_elem);
        cJSON_AddItemToArray(bs, e);
    }
    txt = cJSON_Print(o);
    if (!txt) TS_FAIL(TS_ERR_NOMEM, "calibration");
    f = fopen(path, "w");
    if (!f || fprintf(f, "%s\n", txt) < 0) TS_FAIL(TS_ERR_IO, "%s: cannot write", path);
cleanup:
    if (f && fclose(f) && !err) err = TS_ERR(TS_ERR_IO, "%s: write failed", path);
    free(txt);
    cJSON_Delete(o);
    return err;
}

int ts_plan_calib_load(const char *path, ts_plan_calib *c)
{
    int err = 0;
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    cJSON *o = NULL;
    memset(c, 0, sizeof *c);
    if (!f) return TS_ERR(TS_ERR_IO, "%s: cannot open the calibration (tessera bench step --calibrate writes it)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n) TS_FAIL(TS_ERR_IO, "%s: cannot read", path);
    text[n] = '\0';
    o = cJSON_Parse(text);
    cJSON *r = o ? cJSON_GetObjectItemCaseSensitive(o, "rates_per_s") : NULL;
    if (!cJSON_IsObject(r)) TS_FAIL(TS_ERR_FORMAT, "%s: not a calibration (no rates_per_s)", path);
    for (int k = 0; k < TS_PROF_COUNT; k++) {
        cJSON *x = cJSON_GetObjectItemCaseSensitive(r, kind_keys[k]);
        if (cJSON_IsNumber(x)) c->rate[k] = x->valuedouble;
    }
    if (c->rate[TS_PROF_CONV_FWD] <= 0) TS_FAIL(TS_ERR_FORMAT, "%s: no conv_forward rate", path);
#define NUM(key, field)                                                         \
    do {                                                                        \
        cJSON *x_ = cJSON_GetObjectItemCaseSensitive(o, key);                   \
        if (cJSON_IsNumber(x_)) field = x_->valuedouble;                        \
    } while (0)
    double th = 1;
    NUM("optimizer_s_per_param", c->opt_s_per_param);
    NUM("other_s_per_act_elem", c->other_s_per_elem);
    NUM("act_bytes_per_elem", c->act_bytes_per_elem);
    NUM("process_mb", c->process_mb);
    NUM("step_s", c->step_s);
    NUM("threads", th);
#undef NUM
    if (!(th <= 65536)) TS_FAIL(TS_ERR_FORMAT, "%s: threads %g: at most 65536", path, th);
    c->threads = th >= 1 ? (int)th : 1;
    cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "what"), *bs = cJSON_GetObjectItemCaseSensitive(o, "boxes"), *e;
    snprintf(c->what, sizeof c->what, "%s (%s)", cJSON_IsString(w) ? w->valuestring : "?", path);
    cJSON_ArrayForEach(e, bs) {
        cJSON *bx = cJSON_GetObjectItemCaseSensitive(e, "box"), *br = cJSON_GetObjectItemCaseSensitive(e, "rates_per_s");
        cJSON *ot = cJSON_GetObjectItemCaseSensitive(e, "other_s_per_act_elem");
        if (c->nbox == TS_PLAN_MAX_BOXES) TS_FAIL(TS_ERR_FORMAT, "%s: more than %d boxes", path, TS_PLAN_MAX_BOXES);
        if (cJSON_GetArraySize(bx) != 3 || !cJSON_IsObject(br))
            TS_FAIL(TS_ERR_FORMAT, "%s: boxes[%d] needs box [d, h, w] and rates_per_s", path, c->nbox);
        ts_plan_box_rates *b = &c->boxes[c->nbox];
        for (int d = 0; d < 3; d++) {
            cJSON *x = cJSON_GetArrayItem(bx, d);
            if (!cJSON_IsNumber(x) || x->valuedouble < 1)
                TS_FAIL(TS_ERR_FORMAT, "%s: boxes[%d].box: three sizes >= 1", path, c->nbox);
            b->box[d] = (int64_t)x->valuedouble;
        }
        for (int k = 0; k < TS_PROF_COUNT; k++) {
            cJSON *x = cJSON_GetObjectItemCaseSensitive(br, kind_keys[k]);
            if (cJSON_IsNumber(x) && x->valuedouble > 0) b->rate[k] = x->valuedouble;
        }
        if (b->rate[TS_PROF_CONV_FWD] <= 0) TS_FAIL(TS_ERR_FORMAT, "%s: boxes[%d]: no conv_forward rate", path, c->nbox);
        b->other_s_per_elem = cJSON_IsNumber(ot) && ot->valuedouble > 0 ? ot->valuedouble : 0;
        c->nbox++;
    }
cleanup:
    if (f) fclose(f);
    free(text);
    cJSON_Delete(o);
    return err;
}

static double voxels(const int64_t b[3])
{
    return (double)b[0] * (double)b[1] * (double)b[2];
}

void ts_plan_calib_add_box(ts_plan_calib *c, const ts_plan_calib *bc, const int64_t box[3])
{
    int i = 0;
    while (i < c->nbox && memcmp(c->boxes[i].box, box, sizeof c->boxes[i].box)) i++;
    if (i == TS_PLAN_MAX_BOXES) return;
    if (i == c->nbox) c->nbox++;
    ts_plan_box_rates *b = &c->boxes[i];
    memcpy(b->box, box, sizeof b->box);
    memcpy(b->rate, bc->rate, sizeof b->rate);
    b->other_s_per_elem = bc->other_s_per_elem;
}

void ts_plan_calib_rates(const ts_plan_calib *c, const int64_t box[3], double rate[TS_PROF_COUNT], double *other)
{
    memcpy(rate, c->rate, sizeof c->rate);
    *other = c->other_s_per_elem;
    if (c->nbox == 0) return;
    /* the nearest measured box below and above in voxels (log scale) */
    const double v = log(voxels(box));
    int lo = -1, hi = -1;
    for (int i = 0; i < c->nbox; i++) {
        const double x = log(voxels(c->boxes[i].box));
        if (x <= v && (lo < 0 || x > log(voxels(c->boxes[lo].box)))) lo = i;
        if (x >= v && (hi < 0 || x < log(voxels(c->boxes[hi].box)))) hi = i;
    }
    if (lo < 0) lo = hi;
    if (hi < 0) hi = lo;
    const double xl = log(voxels(c->boxes[lo].box)), xh = log(voxels(c->boxes[hi].box));
    const double f = xh > xl ? (v - xl) / (xh - xl) : 0;
    const ts_plan_box_rates *a = &c->boxes[lo], *b = &c->boxes[hi];
    for (int k = 0; k < TS_PROF_COUNT; k++) {
        if (a->rate[k] > 0 && b->rate[k] > 0) rate[k] = exp((1 - f) * log(a->rate[k]) + f * log(b->rate[k]));
        else if (a->rate[k] > 0 || b->rate[k] > 0) rate[k] = a->rate[k] > 0 ? a->rate[k] : b->rate[k];
    }
    if (a->other_s_per_elem > 0 || b->other_s_per_elem > 0) *other = (1 - f) * a->other_s_per_elem + f * b->other_s_per_elem;
}

int ts_plan_calibrate(const ts_config *cfg, int steps, ts_plan_calib *c)
{
    int err = 0;
    ts_unet *m = NULL;
    ts_layout *L = NULL;
    ts_stepper *st = NULL;
    ts_tensor img = {0}, lab = {0};
    ts_unet_cfg u;
    ts_optim opt;
    int64_t batch;
    memset(&opt, 0, sizeof opt);
    TS_CHECK(ts_unet_cfg_from_config(cfg, &u));
    TS_CHECK(ts_optim_cfg_from_config(cfg, &opt.cfg));
    TS_CHECK(ts_config_get_int(cfg, "train.batch", &batch));
    TS_CHECK(ts_unet_create(&u, ts_optim_state_count(&opt.cfg), &m));
    TS_CHECK(ts_unet_init(m, 1));
    ts_layout_spec one; /* this rank alone */
    ts_layout_spec_default(TS_LAYOUT_TRAIN, u.patch, u.levels, &one);
    TS_CHECK(ts_layout_create(MPI_COMM_SELF, &one, &L));
    TS_CHECK(ts_stepper_create(m, &opt, L->grad, one.bucket_mb, 0, NULL, &st));
    const int64_t *p = u.patch;
    TS_CHECK(ts_tensor_alloc(&img, TS_FLOAT32, 5, (const int64_t[]){batch, u.in_channels, p[0], p[1], p[2]}));
    TS_CHECK(ts_tensor_alloc(&lab, TS_UINT8, 4, (const int64_t[]){batch, p[0], p[1], p[2]}));
    int64_t lo[3] = {0, 0, 0};
    ts_synthetic_batch(1, 0, 0, (int)batch, u.in_channels, u.classes, u.patch, lo, u.patch, img.data, lab.data);
    double rss0 = ts_train_peak_rss_mb(), loss, t = 0, o0 = 0;
    for (int s = 0; s <= steps; s++) { /* the first is warm-up */
        if (s == 1) {
            ts_unet_profile_reset(m);
            o0 = ts_stepper_times(st)->optimizer;
            t = ts_time_now();
        }
        TS_CHECK(ts_stepper_micro(st, &img, &lab, 1, 1, &loss));
        TS_CHECK(ts_stepper_update(st, 1));
    }
    t = (ts_time_now() - t) / steps;
    double prof[TS_PROF_COUNT];
    for (int k = 0; k < TS_PROF_COUNT; k++) prof[k] = ts_unet_profile(m)[k] / steps;
    double opt_s = (ts_stepper_times(st)->optimizer - o0) / steps;
    /* the threads that ran (OMP_NUM_THREADS, or the CPUs' share ts_launch_split_cpus chose, or all) */
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    TS_CHECK(ts_plan_calib_from_profile(&u, (int)batch, u.patch, prof, opt_s, t, (double)ts_unet_activation_bytes(m),
                                        (double)ts_unet_arena(m)->nparam, rss0, threads, c));
cleanup:
    ts_tensor_free(&img);
    ts_tensor_free(&lab);
    ts_stepper_destroy(&st);
    ts_layout_destroy(&L);
    ts_unet_destroy(&m);
    return err;
}

/* intra-node allreduce of `bytes` over p ranks of one node */
static double intra_allreduce(const ts_plan_machine *m, int p, double bytes)
{
    if (p <= 1) return 0;
    if (m->gpus_per_node > 0) /* NCCL ring over the node's links */
        return 2.0 * (p - 1) * NCCL_ALPHA_S + 2.0 * (p - 1) / p * bytes / (m->link_GBps * 1e9);
    double t = m->fits ? ts_coll_model_best(m->fits, m->nfits, "allreduce", 1, p, bytes, NULL) : -1;
    if (t >= 0) return t;
    return 2 * SHM_ALPHA_S + (4.0 - 2.0 / p) * bytes * SHM_BETA_S;
}

/* allreduce over a group of g ranks, g_node of them on each node */
static double group_allreduce(const ts_plan_machine *m, int g, int g_node, double bytes)
{
    if (g <= 1) return 0;
    if (g_node >= g) return intra_allreduce(m, g, bytes);
    int nn = (g + g_node - 1) / g_node;
    /* measured on nn nodes (bench coll --tune there): the fastest fit */
    double t = m->fits ? ts_coll_model_best(m->fits, m->nfits, "allreduce", nn, g, bytes, NULL) : -1;
    if (t >= 0) return t;
    /* hierarchical: within the node, then a ring between nodes carrying the
     * node's whole message through its network link, then back in the node */
    return intra_allreduce(m, g_node, bytes) + 2.0 * (nn - 1) * m->net_latency_us * 1e-6 +
           2.0 * (nn - 1) / nn * bytes / (m->net_GBps * 1e9);
}

/* point-to-point: one message of `bytes`, within a node or across */
static double p2p(const ts_plan_machine *m, double bytes, int across)
{
    if (across) return m->net_latency_us * 1e-6 + bytes / (m->net_GBps * 1e9);
    if (m->gpus_per_node > 0) return NCCL_ALPHA_S + bytes / (m->link_GBps * 1e9);
    return P2P_ALPHA_S + bytes / MEM_COPY_BPS;
}

/* seconds for the layers of cost at the rank's speed */
static double layers_time(const ts_unet_cost *cost, const double *rate, const ts_plan_machine *m, double speed)
{
    double t = 0;
    for (int k = 0; k < TS_PROF_COUNT; k++) {
        if (k == TS_PROF_HALO || cost->work[k] <= 0) continue;
        double r = rate[k] > 0 ? rate[k] : rate[TS_PROF_OTHER] > 0 ? rate[TS_PROF_OTHER] : 1e9;
        if (m->gpus_per_node > 0) {
            const int conv = k == TS_PROF_CONV_FWD || k == TS_PROF_CONV_WGRAD || k == TS_PROF_CONV_DGRAD || k == TS_PROF_CONVT;
            t += conv ? cost->work[k] / (m->gpu_tflops * 1e12) : cost->work[k] / (r * GPU_MEMBOUND_FACTOR);
        } else {
            t += cost->work[k] / (r * speed);
        }
    }
    return t;
}

/* the spatial terms of a layout: halo faces of every conv (forward and backward), in flight while its
 * interior runs; the norm and loss sums over the spatial group */
static void spatial_terms(const ts_plan_machine *m, const ts_unet_cost *cost, const double *rate, double speed,
                          const int split[3], int sp, int R, ts_plan_layout *L)
{
    const int sp_across = sp > R; /* a spatial group larger than a node */
    int nbrs = 2 * (split[0] + split[1] + split[2]);
    double msgs = 2.0 * cost->convs * nbrs;
    double bytes = cost->halo_elems * 4.0;
    double t_lat = msgs * p2p(m, 0, sp_across), t_bw = p2p(m, bytes, sp_across) - p2p(m, 0, sp_across);
    /* the interior of every convolution runs while its faces are in flight: what it cannot cover is
     * exposed (small boxes have little interior), and at least (1 - halo_hidden) of the transfer is
     * (packing, unpacking, the waits themselves: measured, docs/scaling.md) */
    const double r_conv = rate[TS_PROF_CONV_FWD] > 0 ? rate[TS_PROF_CONV_FWD] : 1e9;
    const double t_hide = m->gpus_per_node > 0 ? cost->conv_interior_flops / (m->gpu_tflops * 1e12)
                                               : cost->conv_interior_flops / (r_conv * speed);
    double exposed = t_bw - t_hide;
    if (exposed < (1 - m->halo_hidden) * t_bw) exposed = (1 - m->halo_hidden) * t_bw;
    L->halo_s = t_lat + exposed;
    const double sums = 2.0 * cost->norms + 2; /* statistics forward, gradients backward, loss terms */
    L->sums_s = sums * group_allreduce(m, sp, sp < R ? sp : R, 64.0);
}

/* the bottleneck: the largest part of the step (stage: the layers' compute on one rank) */
static void bottleneck(ts_plan_layout *L, double stage)
{
    struct {
        const char *what;
        double s;
    } parts[] = {{"compute (layers on one rank)", stage},       {"pipeline bubble", L->bubble_s},
                 {"optimizer", L->opt_s},                       {"gradient allreduce (not hidden by backward)", L->grad_exposed_s},
                 {"halo exchange", L->halo_s},                  {"spatial norm/loss sums (latency)", L->sums_s},
                 {"pipeline transfers", L->p2p_s}};
    int best = 0;
    for (int i = 1; i < (int)(sizeof parts / sizeof parts[0]); i++)
        if (parts[i].s > parts[best].s) best = i;
    snprintf(L->bottleneck, sizeof L->bottleneck, "%s, %.0f%% of the step", parts[best].what,
             L->step_s > 0 ? 100 * parts[best].s / L->step_s : 0.0);
}

void ts_plan_predict(const ts_plan_job *j, const ts_plan_calib *c, const ts_plan_machine *m, int dp, int pp, int sp,
                     ts_plan_layout *L)
{
    memset(L, 0, sizeof *L);
    L->dp = dp;
    L->pp = pp;
    L->sp = sp;
    const ts_unet_cfg *u = &j->u;
    L->runnable = 1; /* every model variant trains on every grid (dp x pp x sp) */
    const int R = m->ranks_per_node, P = m->nodes * R;
    if (dp * pp * sp != P) {
        snprintf(L->why, sizeof L->why, "dp x pp x sp = %d, not the %d ranks", dp * pp * sp, P);
        return;
    }
    if (j->global_batch % dp) {
        snprintf(L->why, sizeof L->why, "global batch %d not divisible by dp %d", j->global_batch, dp);
        return;
    }
    L->batch = j->global_batch / dp;
    /* a pipeline runs micro-batches of train.batch samples, as tessera train does */
    const int msize = j->micro_batch > 0 ? j->micro_batch : 1;
    if (pp > 1 && L->batch % msize) {
        snprintf(L->why, sizeof L->why, "%d samples per replica not divisible into micro-batches of %d", L->batch, msize);
        return;
    }
    L->micro = pp > 1 ? L->batch / msize : 1;
    if (pp > 2 * u->levels) {
        snprintf(L->why, sizeof L->why, "pp %d: more stages than the %d layer groups", pp, 2 * u->levels);
        return;
    }
    if (pp > 1 && sp > 1 && R % (pp * sp) && (pp * sp) % R) {
        snprintf(L->why, sizeof L->why, "pp x sp = %d does not tile nodes of %d ranks", pp * sp, R);
        return;
    }
    if (ts_spatial_plan(sp, "auto", u->patch, u->levels, L->dims)) {
        ts_err_clear();
        snprintf(L->why, sizeof L->why, "the patch cannot be split over sp %d", sp);
        return;
    }
    for (int d = 0; d < 3; d++) L->box[d] = u->patch[d] / L->dims[d];
    int split[3] = {L->dims[0] > 1, L->dims[1] > 1, L->dims[2] > 1};
    ts_unet_cost cost, one, micro;
    if (ts_unet_cost_of(u, L->batch, L->box, split, &cost) || ts_unet_cost_of(u, 1, u->patch, NULL, &one) ||
        ts_unet_cost_of(u, L->batch / L->micro, L->box, split, &micro)) {
        ts_err_clear();
        snprintf(L->why, sizeof L->why, "box %lldx%lldx%lld too small for %d levels", (long long)L->box[0],
                 (long long)L->box[1], (long long)L->box[2], u->levels);
        return;
    }
    /* a rank's speed: its threads over the calibration's, times its share of the cores */
    const int threads = m->threads > 0 ? m->threads : 1;
    double share = m->cores_per_node / ((double)R * threads);
    const double speed = (double)threads / c->threads * (share < 1 ? share : 1);
    /* compute of the whole model for this rank's box (rates measured at that box size), then split over stages */
    double rate[TS_PROF_COUNT], other_pe, rate1[TS_PROF_COUNT], other1_pe;
    ts_plan_calib_rates(c, L->box, rate, &other_pe);
    ts_plan_calib_rates(c, u->patch, rate1, &other1_pe);
    const double layers = layers_time(&cost, rate, m, speed);
    const double other = m->gpus_per_node > 0 ? 0 : other_pe * cost.act_elems / speed;
    const double params = cost.params / pp;
    L->opt_s = m->gpus_per_node > 0 ? params * c->opt_s_per_param / GPU_MEMBOUND_FACTOR
                                    : params * c->opt_s_per_param / speed;
    const double stage = (layers + other) / pp;
    L->bubble_s = pp > 1 ? stage * (pp - 1) / L->micro : 0;
    L->compute_s = stage + L->bubble_s + L->opt_s;
    /* gradients: allreduce over the dp x sp ranks of a stage, buckets overlapped with backward */
    const double gbytes = params * 4.0;
    int g = dp * sp, g_node = R / pp > 0 ? R / pp : 1;
    if (g_node > g) g_node = g;
    L->grad_s = group_allreduce(m, g, g_node, gbytes);
    const double bucket = m->bucket_mb > 0 ? m->bucket_mb * 1e6 : 25e6;
    const double nb = ceil(gbytes / bucket) > 1 ? ceil(gbytes / bucket) : 1;
    const double backward = stage * (cost.flops_backward / (cost.flops_forward + cost.flops_backward));
    double window = backward * (nb - 1) / nb, exposed = L->grad_s - window;
    if (exposed < L->grad_s / nb) exposed = L->grad_s / nb;
    L->grad_exposed_s = g > 1 ? exposed : 0;
    /* spatial: halo faces every conv (forward and backward), mostly hidden; norm and loss sums */
    if (sp > 1) spatial_terms(m, &cost, rate, speed, split, sp, R, L);
    /* pipeline: each micro-batch's boundary activations forward and their gradients back, per stage boundary */
    if (pp > 1) {
        double per_micro = micro.act_elems / (2.0 * micro.convs) * 4.0 * 2; /* a typical layer's output, plus skips */
        L->p2p_s = (L->micro + pp - 2) * 2 * p2p(m, per_micro, pp > R);
    }
    L->comm_s = L->grad_exposed_s + L->halo_s + L->sums_s + L->p2p_s;
    L->step_s = L->compute_s + L->comm_s;
    L->samples_per_s = L->step_s > 0 ? j->global_batch / L->step_s : 0;
    /* ideal: one rank (same threads, a core per thread) doing the whole global batch, over P */
    const double t1 = (layers_time(&one, rate1, m, (double)threads / c->threads) +
                       (m->gpus_per_node > 0 ? 0 : other1_pe * one.act_elems / ((double)threads / c->threads))) *
                          j->global_batch +
                      cost.params * c->opt_s_per_param / (m->gpus_per_node > 0 ? GPU_MEMBOUND_FACTOR : (double)threads / c->threads);
    L->efficiency = L->step_s > 0 ? t1 / P / L->step_s : 0;
    /* memory: the stage's share of activations for the micro-batches in flight, parameters and state */
    const double inflight = pp > 1 ? (L->micro < pp ? L->micro : pp) : 1; /* 1F1B */
    const double act = (pp > 1 ? micro.act_elems * inflight / pp : cost.act_elems) * c->act_bytes_per_elem;
    const double pstate = params * 4.0 * (2 + j->nstate) + cost.buffers * 4.0;
    const double data = (j->prefetch + 1.0) * L->batch * (double)(L->box[0] * L->box[1] * L->box[2]) * (4.0 * u->in_channels + 1);
    L->mem_mb = (act + pstate + data) / 1048576.0 + (m->gpus_per_node > 0 ? GPU_PROCESS_MB : c->process_mb);
    double limit = m->mem_per_rank_mb > 0 ? m->mem_per_rank_mb : m->gpus_per_node > 0 ? m->gpu_mem_gb * 1024 : 0;
    if (limit > 0 && L->mem_mb > limit) {
        snprintf(L->why, sizeof L->why, "needs %.0f MiB per rank, more than the %.0f MiB there are", L->mem_mb, limit);
        return;
    }
    L->feasible = 1;
    bottleneck(L, stage);
}

static int cmp_layout(const void *a, const void *b)
{
    const ts_plan_layout *x = a, *y = b;
    if (x->feasible != y->feasible) return y->feasible - x->feasible;
    if (!x->feasible) return 0;
    return x->step_s < y->step_s ? -1 : x->step_s > y->step_s;
}

int ts_plan_layouts(const ts_plan_job *j, const ts_plan_calib *c, const ts_plan_machine *m, ts_plan_layout **out, int *n)
{
    const int P = m->nodes * m->ranks_per_node;
    int cap = 64, k = 0;
    ts_plan_layout *v = malloc(sizeof *v * (size_t)cap);
    if (!v) return TS_ERR(TS_ERR_NOMEM, "layouts");
    for (int pp = 1; pp <= P && pp <= 2 * j->u.levels; pp++) {
        if (P % pp) continue;
        for (int sp = 1; sp <= P / pp; sp++) {
            if ((P / pp) % sp) continue;
            if (k == cap) {
                ts_plan_layout *w = realloc(v, sizeof *v * (size_t)(cap *= 2));
                if (!w) {
                    free(v);
                    return TS_ERR(TS_ERR_NOMEM, "layouts");
                }
                v = w;
            }
            ts_plan_predict(j, c, m, P / pp / sp, pp, sp, &v[k++]);
        }
    }
    qsort(v, (size_t)k, sizeof *v, cmp_layout);
    *out = v;
    *n = k;
    return 0;
}
