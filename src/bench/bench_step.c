/* The step benchmark (src/bench/bench_step.h): what `tessera bench step`
 * measures. Owns the timed steps of the model on a layout, built as
 * `tessera train` builds them (the same layout, stepper and gradient
 * path), the calibration file and the JSON; the report is printed by
 * src/cli/bench_step.c, and a layout is chosen by src/plan/, not here. */
#include "tsbuild.h"
#include "src/bench/bench_step.h"
#include "src/bench/bench_peak.h"
#include "src/bench/bench_json.h"
#include "collectives/coll.h"
#include "src/core/error.h"
#include "src/core/perf.h"
#include "src/core/timer.h"
#include "src/model/cost.h"
#include "src/optim/loss_scale.h"
#include "src/optim/optim.h"
#include "src/parallel/grid.h"
#include "src/parallel/layout.h"
#include "src/parallel/pipe.h"
#include "src/parallel/pipeline.h"
#include "src/parallel/spatial.h"
#include "src/plan/plan.h"
#include "src/train/gradpath.h"
#include "src/train/run.h"
#include "src/train/step.h"
#include "src/train/synthetic.h"
#include "src/train/trainer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __GLIBC__
#include <malloc.h>
#endif

static int cmp_d(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

/* the process's resident high-water mark (VmHWM), MiB; reset_hwm starts it
 * again from the current RSS (Linux >= 4.0; returns -1 where it cannot) */
static double hwm_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb < 0 ? peak_rss_mb() : kb / 1024.0;
}
static int reset_hwm(void)
{
#ifdef __GLIBC__
    malloc_trim(0); /* freed activations leave the process, so the next variant's peak is its own */
#endif
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int bad = fputs("5", f) < 0;
    return fclose(f) || bad ? -1 : 0;
}

static double median(double *v, int n)
{
    if (n < 1) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* the pipeline's data: the same synthetic batch every micro-batch */
struct batch_pair {
    ts_tensor *image, *label;
};
static int same_batch(void *ctx, ts_tensor *img, ts_tensor *lab)
{
    const struct batch_pair *b = ctx;
    *img = *b->image;
    *lab = *b->label;
    return 0;
}

/* what a run holds */
typedef struct bench {
    MPI_Comm comm;
    const ts_config *cfg;
    const ts_bench_step_opts *o;
    ts_unet_cfg u;
    ts_optim opt;
    int64_t batch, seed, memlim;
    int first[4 * TS_UNET_MAX_LEVELS];
    double ucost[4 * TS_UNET_MAX_LEVELS];
    ts_mem_plan plan;
    ts_unet *m;
    ts_layout *L; /* the grid, the collectives, the spatial split, the gradient path: as `tessera train` */
    ts_pipeline *pipe;
    ts_gradpath *gp; /* the gradient path of `tessera train` (src/train/gradpath.h) */
    int64_t updates; /* optimizer steps taken (the gradient path's step count) */
    int dev_state;   /* the state on the GPU (TESSERA_CUDA_STATE=device, ts_stepper_set_device) */
    ts_stepper *stepper;
    ts_perf *perf;
    ts_tensor image, label;
    struct batch_pair bb;
    double peak_fp32, peak_bf16, peak_amx; /* --peak: the ranks' summed measured peaks, GFLOP/s */
} bench;

/* one training step as `tessera train` takes it: the micro-batches
 * (through the pipeline when there is one, else train.accum of them), the
 * gradient path's reduction, and with local SGD the parameter average every
 * parallel.local_steps updates; update = 0: the gradients are reduced but
 * not applied */
static int one_step(bench *b, int update, double *loss)
{
    const int M = b->L->micro;
    if (b->pipe) TS_TRY(ts_stepper_pipe_step(b->stepper, same_batch, &b->bb, loss));
    else
        for (int k = 0; k < M; k++) TS_TRY(ts_stepper_micro(b->stepper, b->bb.image, b->bb.label, k == 0, k == M - 1, loss));
    TS_TRY(ts_stepper_reduce(b->stepper, M));
    if (!update) return 0;
    return ts_gradpath_update(b->gp, ++b->updates, 1); /* the optimizer, then local SGD's average every H */
}

static void own_split(const bench *b, ts_unet_split *own)
{
    memset(own, 0, sizeof *own);
    ts_spatial_split_dims(b->L->spatial, own->on);
    for (int d = 0; d < 3; d++)
        for (int side = 0; side < 2; side++) own->nbr[d][side] = ts_spatial_neighbor(b->L->spatial, d, side);
}

/* the layout of `tessera train`: grid, spatial split, pipeline schedule, gradient path (its rules too) */
static int setup_grid(bench *b)
{
    const ts_config *cfg = b->cfg;
    ts_layout_spec spec;
    TS_TRY(ts_unet_cfg_from_config(cfg, &b->u));
    TS_TRY(ts_optim_cfg_from_config(cfg, &b->opt.cfg));
    TS_TRY(ts_config_get_int(cfg, "train.batch", &b->batch));
    TS_TRY(ts_config_get_int(cfg, "train.seed", &b->seed));
    TS_TRY(ts_config_get_int(cfg, "run.mem_limit_mb", &b->memlim));
    TS_TRY(ts_layout_spec_from_config(cfg, TS_LAYOUT_TRAIN, b->u.patch, b->u.levels, &spec));
    TS_TRY(ts_layout_create(b->comm, &spec, &b->L));
    TS_TRY(ts_gradpath_create(b->L, cfg, &b->gp)); /* train's rules: a refusal on every rank */
    if (b->L->note[0] && b->L->world_rank == 0) fprintf(stderr, "tessera bench step: note: %s\n", b->L->note);
    return 0;
}

/* the model, the stepper on the layout's gradient path (buckets, compression,
 * sharded optimizer, local SGD's group), the pipeline and the perf machinery */
static int setup_model(bench *b)
{
    const ts_config *cfg = b->cfg;
    const ts_layout *L = b->L;
    {
        char note[256]; /* train.engine as `tessera train` resolves it */
        TS_TRY(ts_err_agree(L->grid->world, ts_unet_engine_choose(&b->u, L->grid->local_rank, note, sizeof note)));
        if (note[0] && L->world_rank == 0) fprintf(stderr, "tessera bench step: note: %s\n", note);
    }
    TS_TRY(ts_unet_create(&b->u, ts_gradpath_arena_states(b->gp, ts_optim_state_count(&b->opt.cfg)), &b->m));
    int sync;
    TS_TRY(ts_config_get_bool(cfg, "model.sync_bn", &sync));
    TS_TRY(ts_stepper_create(b->m, &b->opt, ts_gradpath_reduce_group(b->gp), L->spec.bucket_mb, sync, L->spatial,
                               &b->stepper));
    ts_loss_scaler ls; /* fp16: the initial loss scale, fixed (a speed measurement; no overflow handling) */
    TS_TRY(ts_loss_scaler_from_config(cfg, b->u.precision, &ls));
    ts_stepper_set_loss_scale(b->stepper, ls.scale);
    if (b->o->overhead) { /* the trainer's per-phase machinery, switched on every other step */
        const char *ev = "perf::TASK-CLOCK,perf::PAGE-FAULTS,perf::CONTEXT-SWITCHES";
        if (ts_config_isset(cfg, "perf.papi_events")) TS_TRY(ts_config_get_str(cfg, "perf.papi_events", &ev));
        TS_TRY(ts_perf_create(b->comm, TS_PH_COUNT, ts_phase_names, ev, 1, &b->perf));
    }
    TS_TRY(ts_unet_init(b->m, (uint64_t)b->seed));
    TS_TRY(ts_pipeline_create_on(b->m, L, (int)b->batch, b->first, b->ucost, &b->pipe)); /* the cut of `tessera train` */
    if (b->pipe) TS_TRY(ts_stepper_set_pipeline(b->stepper, b->pipe, L->grid->pp_comm));
    TS_TRY(ts_gradpath_attach(b->gp, b->stepper)); /* compression, the sharded optimizer */
    char why[768];
    int on; /* the state on the GPU, where asked (as `tessera train`) */
    TS_TRY(ts_stepper_device_asked(b->stepper, L->grid->world, &on, why, sizeof why));
    b->dev_state = on > 0;
    if (on == 0 && L->world_rank == 0)
        fprintf(stderr, "tessera bench step: note: TESSERA_CUDA_STATE=device not taken (the host keeps the master copy): "
                "%s\n", why);
    return 0;
}

/* every rank's plan against the limit: the largest decides, so that all
 * stop together; then the synthetic batch */
static int setup_data(bench *b)
{
    ts_unet_split own;
    own_split(b, &own);
    TS_TRY(ts_train_memory_plan(b->m, b->L->grid->sp > 1 ? &own : NULL, &b->u, (int)b->batch, b->u.in_channels, 0, b->L->box,
                                b->L->sp_dims, 0, b->o->rss0_mb, &b->plan)); /* synthetic batches: nothing is read */
    double most = b->plan.total_mb;
    TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_DOUBLE, MPI_MAX, b->comm));
    if (b->memlim > 0 && most > (double)b->memlim)
        return TS_ERR(TS_ERR_CONFIG, "run.mem_limit_mb = %lld: this configuration needs about %.0f MiB on some rank "
                      "(this rank: activations and gradients %.0f MiB for a box of %lldx%lldx%lld); `tessera train` "
                      "names a parallel.sp that fits", (long long)b->memlim, most, b->plan.activations_mb,
                      (long long)b->L->box[0], (long long)b->L->box[1], (long long)b->L->box[2]);
    const int64_t *box = b->L->box;
    TS_TRY(ts_tensor_alloc(&b->image, TS_FLOAT32, 5, (const int64_t[]){b->batch, b->u.in_channels, box[0], box[1], box[2]}));
    TS_TRY(ts_tensor_alloc(&b->label, TS_UINT8, 4, (const int64_t[]){b->batch, box[0], box[1], box[2]}));
    ts_synthetic_batch((uint64_t)b->seed, b->L->grid->d, 0, (int)b->batch, b->u.in_channels, b->u.classes, b->u.patch,
                       b->L->box_lo, box, b->image.data, b->label.data);
    b->bb.image = &b->image;
    b->bb.label = &b->label;
    return ts_err_agree(b->comm, ts_unet_setup(b->m, (int)b->batch, (int)box[0], (int)box[1], (int)box[2]));
}

static void header(const bench *b, ts_bench_step_result *r)
{
    MPI_Comm_size(b->comm, &r->ranks);
    r->dp = b->L->grid->dp;
    r->pp = b->L->grid->pp;
    r->sp = b->L->grid->sp;
    r->micro = b->L->micro;
    r->steps = b->o->steps;
    r->warmup = b->o->warmup;
    r->batch = b->batch;
    for (int d = 0; d < 3; d++) {
        r->dims[d] = b->L->sp_dims[d];
        r->box[d] = b->L->box[d];
        r->patch[d] = b->u.patch[d];
    }
    r->threads = 1;
#ifdef _OPENMP
    r->threads = omp_get_max_threads();
#endif
    r->schedule = ts_pipe_kind_name(b->L->spec.schedule);
    r->precision = b->u.precision == TS_PREC_BF16 ? "bf16" : b->u.precision == TS_PREC_FP16 ? "fp16" : "fp32";
    r->engine = ts_unet_engine_name(b->u.engine);
    r->state = b->u.engine != TS_ENGINE_CUDA ? "cpu" : b->dev_state ? "gpu" : "host";
    static char bfw[256]; /* bf16 with train.conv = winograd: the ISA named in the line */
    snprintf(bfw, sizeof bfw, "%s; train.conv = winograd: 3x3x3 layers with 64+ channels in and out as Winograd F(2,3) "
             "ones with bf16 products (weight gradients from 256+ tiles), their FLOP counted as direct ones'", ts_nn_bf16_isa());
    r->kernels = b->u.engine == TS_ENGINE_CUDA ? "cuDNN"
                 : b->u.precision == TS_PREC_BF16 ? (b->u.conv_winograd ? bfw : ts_nn_bf16_isa())
                 : b->u.precision == TS_PREC_FP16 ? "fp32 on fp16-rounded operands"
                 : b->u.conv_winograd ? "fp32; train.conv = winograd: 3x3x3 layers with 16+ channels each side, or 16+ in "
                                        "and at most 8 out (forward, input gradient), as Winograd F(2,3) ones (weight "
                                        "gradients from 48+ channels, 256+ tiles), their FLOP counted as direct ones'"
                                      : "fp32";
}

typedef struct ck_variant {
    unsigned mask;
    double *t, *c; /* step wall and process CPU times, s (the slowest rank's) */
    int nt;
    double act, scratch, plan, rss; /* bytes, bytes, bytes, MiB: the largest over ranks */
} ck_variant;

/* Collective. One step of each variant from the same weights without an
 * update: A's gradients, then B's, compared bit for bit on every rank. */
static int compare_gradients(bench *b, ck_variant v[2], ts_bench_step_compare *r)
{
    int err = 0, differ = 0;
    const ts_arena *a = ts_unet_arena(b->m);
    float *g = TS_MALLOC(a->nparam * sizeof(float) + 1);
    double loss, nz = 0;
    const int64_t *box = b->L->box;
    if (!g) return TS_ERR(TS_ERR_NOMEM, "bench step: gradient copy");
    for (int k = 0; k < 2; k++) {
        TS_CHECK(ts_unet_set_checkpoint(b->m, v[k].mask));
        TS_CHECK(ts_err_agree(b->comm, ts_unet_setup(b->m, (int)b->batch, (int)box[0], (int)box[1], (int)box[2])));
        TS_CHECK(one_step(b, 0, &loss));
        if (k == 0) memcpy(g, a->grads, a->nparam * sizeof(float));
        else differ = memcmp(g, a->grads, a->nparam * sizeof(float)) != 0;
    }
    for (size_t i = 0; i < a->nparam; i++) nz += g[i] != 0;
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &differ, 1, MPI_INT, MPI_MAX, b->comm));
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &nz, 1, MPI_DOUBLE, MPI_MAX, b->comm));
    r->identical = !differ;
    r->nonzero = nz;
cleanup:
    free(g);
    return err;
}

/* Collective. One round of variant x: warm-up and timed steps, then its memory. */
static int compare_round(bench *b, const ts_unet_split *split, ck_variant *x)
{
    const int64_t *box = b->L->box;
    const int warmup = b->o->warmup, steps = b->o->steps;
    double loss;
    TS_TRY(ts_unet_set_checkpoint(b->m, x->mask));
    size_t plan = 0;
    TS_TRY(ts_unet_plan_bytes_split(b->m, split, (int)b->batch, (int)box[0], (int)box[1], (int)box[2], &plan));
    const int hwm_ok = reset_hwm() == 0;
    TS_TRY(ts_err_agree(b->comm, ts_unet_setup(b->m, (int)b->batch, (int)box[0], (int)box[1], (int)box[2])));
    for (int s = 0; s < warmup + steps; s++) {
        MPI_Barrier(b->comm);
        const double t0 = ts_time_now(), c0 = cpu_now();
        TS_TRY(one_step(b, 1, &loss));
        double dt[2] = {ts_time_now() - t0, cpu_now() - c0};
        TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, dt, 2, MPI_DOUBLE, MPI_MAX, b->comm));
        if (s >= warmup) {
            x->t[x->nt] = dt[0];
            x->c[x->nt++] = dt[1];
        }
    }
    double mv[4] = {(double)ts_unet_activation_bytes(b->m), (double)ts_unet_recompute_bytes(b->m), (double)plan,
                    hwm_ok ? hwm_mb() : peak_rss_mb()};
    TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, mv, 4, MPI_DOUBLE, MPI_MAX, b->comm));
    x->act = mv[0];
    x->scratch = mv[1];
    x->plan = mv[2];
    if (mv[3] > x->rss) x->rss = mv[3];
    return 0;
}

/* the comparison's figures from the variants' samples */
static void compare_figures(ck_variant v[2], int rounds, int steps, ts_bench_step_compare *r)
{
    for (int k = 0; k < rounds; k++) { /* each round's B against the A right after it (sorts within the round only) */
        const double ta = median(v[0].t + k * steps, steps), ca = median(v[0].c + k * steps, steps);
        r->round_step_ratio[k] = ta > 0 ? median(v[1].t + k * steps, steps) / ta : 0;
        r->round_cpu_ratio[k] = ca > 0 ? median(v[1].c + k * steps, steps) / ca : 0;
    }
    for (int k = 0; k < 2; k++) {
        r->step_s[k] = median(v[k].t, v[k].nt);
        r->cpu_s[k] = median(v[k].c, v[k].nt);
        r->nt[k] = v[k].nt;
        r->act[k] = v[k].act;
        r->scratch[k] = v[k].scratch;
        r->plan[k] = v[k].plan;
        r->rss_mb[k] = v[k].rss;
    }
    r->step_ratio = r->step_s[0] > 0 ? r->step_s[1] / r->step_s[0] : 0;
    r->cpu_ratio = r->cpu_s[0] > 0 ? r->cpu_s[1] / r->cpu_s[0] : 0;
    r->act_reduction = v[0].act > 0 ? 1 - v[1].act / v[0].act : 0;
    r->rss_reduction = v[0].rss > 0 ? 1 - v[1].rss / v[0].rss : 0;
    /* the medians over rounds (sorts copies: the per-round ratios stay in round order) */
    double *tmp = malloc(sizeof *tmp * (size_t)rounds * 2);
    if (tmp) {
        memcpy(tmp, r->round_step_ratio, sizeof *tmp * (size_t)rounds);
        memcpy(tmp + rounds, r->round_cpu_ratio, sizeof *tmp * (size_t)rounds);
        r->round_step_median = median(tmp, rounds);
        r->round_cpu_median = median(tmp + rounds, rounds);
        free(tmp);
    }
}

/* Collective. The checkpoint comparison: variants A (the config's levels)
 * and B on the same stepper; the gradients of one step each, then rounds of
 * B then A. Leaves the model at A. */
static int compare_checkpoint(bench *b, ts_bench_step_compare *r)
{
    int err = 0;
    const int rounds = b->o->rounds, steps = b->o->steps;
    ck_variant v[2];
    ts_unet_split own;
    memset(v, 0, sizeof v);
    own_split(b, &own);
    r->rounds = rounds;
    v[0].mask = b->u.ckpt_levels;
    TS_CHECK(ts_unet_parse_checkpoint_levels(b->o->compare, b->u.levels, "--compare-checkpoint", &v[1].mask));
    for (int k = 0; k < 2; k++) {
        v[k].t = TS_CALLOC((size_t)(rounds * steps), sizeof(double));
        v[k].c = TS_CALLOC((size_t)(rounds * steps), sizeof(double));
        if (!v[k].t || !v[k].c) TS_FAIL(TS_ERR_NOMEM, "bench step: step times");
    }
    r->round_step_ratio = TS_CALLOC((size_t)rounds, sizeof(double));
    r->round_cpu_ratio = TS_CALLOC((size_t)rounds, sizeof(double));
    if (!r->round_step_ratio || !r->round_cpu_ratio) TS_FAIL(TS_ERR_NOMEM, "bench step: step times");
    TS_CHECK(compare_gradients(b, v, r));
    for (int k = 0; k < rounds; k++)
        for (int x = 1; x >= 0; x--) TS_CHECK(compare_round(b, b->L->grid->sp > 1 ? &own : NULL, &v[x]));
    compare_figures(v, rounds, steps, r);
    ts_unet_checkpoint_str(v[0].mask, r->levels[0], sizeof r->levels[0]);
    ts_unet_checkpoint_str(v[1].mask, r->levels[1], sizeof r->levels[1]);
cleanup:
    for (int k = 0; k < 2; k++) {
        free(v[k].t);
        free(v[k].c);
    }
    return err;
}

/* per-step sums of the timed steps */
typedef struct step_sums {
    double fwd, bwd, opt, total, best, cpu, comm_exposed, comm_total, loss;
    double *t_on, *t_off; /* overhead: the slowest rank's step times with and without the perf machinery */
    int n_on, n_off;
    ts_pipeline_stats pst0;
} step_sums;

/* Collective. W warm-up and N timed steps; with overhead every other step
 * runs with the per-phase timers and counters. */
static int timed_steps(bench *b, step_sums *s)
{
    const int warmup = b->o->warmup, steps = b->o->steps, overhead = b->o->overhead;
    ts_spatial_stats halo0 = {0};
    s->best = 1e30;
    MPI_Barrier(b->comm);
    for (int k = 0; k < warmup + steps; k++) {
        const int timed = k >= warmup;
        if (k == warmup) {
            ts_gradpath_reset_stats(b->gp);
            ts_unet_profile_reset(b->m);
            ts_unet_set_profile_sync(b->m, b->o->profile); /* GPU engine: per-layer times are the device's */
            ts_spatial_set_stats(b->L->spatial, &halo0);
            if (b->pipe) s->pst0 = *ts_pipeline_get_stats(b->pipe);
        }
        const int with_perf = overhead && (k % 2 == 0);
        ts_stepper_set_perf(b->stepper, with_perf ? b->perf : NULL);
        if (overhead) MPI_Barrier(b->comm);
        const double t0 = ts_time_now(), c0 = cpu_now();
        if (with_perf) ts_perf_begin(b->perf, TS_PH_STEP);
        const ts_step_times *pt = ts_stepper_times(b->stepper);
        const double f0 = pt->forward, b0 = pt->backward, e0 = pt->comm_exposed, g0 = pt->comm_total, o0 = pt->optimizer;
        TS_TRY(one_step(b, 1, &s->loss));
        if (with_perf) ts_perf_end(b->perf, TS_PH_STEP);
        const double t3 = ts_time_now();
        if (overhead && timed) {
            double dt = t3 - t0;
            MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, b->comm);
            if (with_perf) s->t_on[s->n_on++] = dt;
            else s->t_off[s->n_off++] = dt;
        }
        /* phases: forward+loss, backward, optimizer (the exposed communication is reported apart) */
        const double t1 = t0 + (pt->forward - f0), t2 = t1 + (pt->backward - b0), t2o = t3 - (pt->optimizer - o0);
        if (timed) {
            s->comm_exposed += pt->comm_exposed - e0;
            s->comm_total += pt->comm_total - g0;
            s->cpu += cpu_now() - c0;
            s->fwd += t1 - t0;
            s->bwd += t2 - t1;
            s->opt += t3 - t2o;
            s->total += t3 - t0;
            if (t3 - t0 < s->best) s->best = t3 - t0;
        }
    }
    if (b->pipe) TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &s->loss, 1, MPI_DOUBLE, MPI_SUM, b->L->grid->pp_comm)); /* the last stage's */
    return 0;
}

/* Collective. Per stage (the largest over its ranks): busy, span, in-flight activations. */
static int stage_figures(bench *b, const step_sums *s, ts_bench_step_result *r)
{
    enum { NV = 8 };
    const int steps = b->o->steps, P = b->L->grid->pp;
    double *sv = TS_CALLOC((size_t)P * NV, sizeof *sv);
    r->stages = TS_CALLOC((size_t)P, sizeof *r->stages);
    if (!sv || !r->stages) {
        free(sv);
        return TS_ERR(TS_ERR_NOMEM, "stage figures");
    }
    const ts_pipeline_stats *ps = ts_pipeline_get_stats(b->pipe);
    int u0, u1, slots;
    ts_unet_stage(b->m, &u0, &u1, &slots);
    double *v = sv + b->L->grid->p * NV;
    v[0] = (ps->busy_s - s->pst0.busy_s) / steps;
    v[1] = (ps->span_s - s->pst0.span_s) / steps;
    v[2] = (ps->wait_s - s->pst0.wait_s) / steps;
    v[3] = slots;
    v[4] = (double)ts_unet_slot_bytes(b->m);
    v[5] = (double)ts_unet_activation_bytes(b->m);
    v[6] = (ps->forward_s - s->pst0.forward_s) / steps;
    v[7] = (ps->backward_s - s->pst0.backward_s) / steps;
    int rc = MPI_Allreduce(MPI_IN_PLACE, sv, P * NV, MPI_DOUBLE, MPI_MAX, b->comm);
    for (int k = 0; k < P; k++) {
        ts_bench_step_stage *st = &r->stages[k];
        const double *w = sv + k * NV;
        char name[32];
        size_t l = 0;
        for (int x = b->first[k]; x < b->first[k + 1] && l < sizeof st->units; x++)
            l += (size_t)snprintf(st->units + l, sizeof st->units - l, "%s%s", x > b->first[k] ? "," : "",
                                  ts_unet_unit_name(b->m, x, name, sizeof name));
        st->busy_s = w[0];
        st->span_s = w[1];
        st->wait_s = w[2];
        st->slots = w[3];
        st->slot_bytes = w[4];
        st->act_bytes = w[5];
        st->forward_s = w[6];
        st->backward_s = w[7];
        for (int x = b->first[k]; x < b->first[k + 1]; x++) st->estimated_s += b->ucost[x];
    }
    free(sv);
    return rc == MPI_SUCCESS ? 0 : ts_err_mpi(rc, __FILE__, __LINE__, "MPI_Allreduce");
}

/* the perf machinery's cost: medians with and without it, and one
 * begin/end pair timed in a loop */
static void overhead_figures(bench *b, step_sums *s, ts_bench_step_result *r)
{
    if (!s->n_on || !s->n_off) return;
    r->overhead = 1;
    r->perf_on_s = median(s->t_on, s->n_on);
    r->perf_off_s = median(s->t_off, s->n_off);
    r->perf_on_n = s->n_on;
    r->perf_off_n = s->n_off;
    r->perf_ratio = r->perf_on_s / r->perf_off_s;
    ts_perf_describe(b->perf, r->perf_what, sizeof r->perf_what);
    int64_t pairs = 0;
    for (int ph = 0; ph < TS_PH_COUNT; ph++) pairs += ts_perf_calls(b->perf, ph);
    const double tb = ts_time_now();
    for (int k = 0; k < 10000; k++) {
        ts_perf_begin(b->perf, TS_PH_EVAL);
        ts_perf_end(b->perf, TS_PH_EVAL);
    }
    r->pair_s = (ts_time_now() - tb) / 10000;
    r->brackets_per_step = (double)pairs / s->n_on;
}

/* Local. The gradient path's figures: local SGD's averages, compression's bytes. */
static void grad_figures(const bench *b, ts_bench_step_result *r)
{
    const ts_layout *L = b->L;
    ts_gradpath_stats gs;
    ts_gradpath_get_stats(b->gp, &gs);
    r->grad_path = ts_gradpath_name(ts_gradpath_kind(b->gp));
    r->local_steps = L->spec.local_steps;
    r->local_sgd = L->spec.local_node ? "node" : "global";
    r->param_averages = gs.param_averages;
    r->param_average_s = gs.param_average_s / b->o->steps;
    ts_dp_compress_stats cs;
    ts_dp_compress_get(ts_stepper_dp(b->stepper), &cs);
    if (ts_gradpath_kind(b->gp) == TS_GRAD_COMPRESS) ts_compress_name(&L->spec.compress.cfg, r->compress, sizeof r->compress);
    else snprintf(r->compress, sizeof r->compress, "none");
    r->compressed_steps = cs.compressed_steps;
    r->reduced_steps = cs.steps;
    r->grad_bytes = cs.step.wire;
    r->grad_bytes_fp32 = cs.step.wire_fp32;
}

/* Collective. The figures of the timed steps. */
static int step_figures(bench *b, step_sums *s, ts_bench_step_result *r)
{
    const int steps = b->o->steps;
    /* all replicas' samples over the slowest rank's time (a spatial group shares its samples) */
    double slowest = s->total;
    TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &slowest, 1, MPI_DOUBLE, MPI_MAX, b->comm));
    r->step_s = slowest / steps;
    r->samples_per_s = (double)b->batch * b->L->micro * b->L->grid->dp / r->step_s;
    r->voxels_per_s = r->samples_per_s * (double)b->u.patch[0] * b->u.patch[1] * b->u.patch[2];
    ts_unet_cost uc; /* the model's FLOP of one replica's samples, whole patches */
    TS_TRY(ts_unet_cost_of(&b->u, (int)(b->batch * b->L->micro), b->u.patch, NULL, &uc));
    r->flops = (uc.flops_forward + uc.flops_backward) * b->L->grid->dp;
    r->gflops = r->flops / r->step_s / 1e9;
    if (b->o->peak && b->u.engine != TS_ENGINE_CUDA) { /* the peak of the arithmetic the convolutions ran */
        /* AMX: its tiles' peak, though the weight gradients run VDPBF16PS (the machine's best bf16 rate) */
        const char *isa = ts_nn_bf16_isa();
        const int bfp = b->u.precision == TS_PREC_BF16;
        const int amx = bfp && b->peak_amx > 0 && !strcmp(isa, "amx"), bf16 = bfp && b->peak_bf16 > 0 && !strcmp(isa, "avx512bf16");
        r->peak_gflops = amx ? b->peak_amx : bf16 ? b->peak_bf16 : b->peak_fp32;
        r->peak_kind = amx ? "amx" : bf16 ? "bf16" : "fp32";
    }
    r->best_s = s->best;
    r->forward_s = s->fwd / steps;
    r->backward_s = s->bwd / steps;
    r->optimizer_s = s->opt / steps;
    r->cpu_s = s->cpu / steps;
    r->cores_busy = s->cpu / s->total;
    r->comm_total_s = s->comm_total / steps;
    r->comm_exposed_s = s->comm_exposed / steps;
    r->buckets = ts_stepper_buckets(b->stepper);
    r->loss = s->loss;
    r->bubble_formula = ts_pipe_bubble(b->L->grid->pp, b->L->micro);
    grad_figures(b, r);
    if (b->pipe) TS_TRY(stage_figures(b, s, r));
    double rss_all = peak_rss_mb();
    TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &rss_all, 1, MPI_DOUBLE, MPI_MAX, b->comm));
    r->rss_mb = rss_all; /* the largest over ranks */
    const ts_spatial_stats *hs = ts_spatial_get_stats(b->L->spatial);
    double hv[4] = {hs->exposed_s, hs->hidden_s, hs->sum_s, (double)ts_unet_activation_bytes(b->m)};
    TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, hv, 4, MPI_DOUBLE, MPI_MAX, b->comm));
    r->halo_exposed_s = hv[0] / steps;
    r->halo_hidden_s = hv[1] / steps;
    r->spatial_sums_s = hv[2] / steps;
    r->act_bytes = hv[3];
    const ts_arena *a = ts_unet_arena(b->m);
    r->arena_mb = (double)(a->nparam * 2 + a->nstate_floats * (size_t)a->nstate + a->nbuf) * 4 /
                  1048576.0; /* the state: a shard with parallel.zero = 1 */
    r->plan_mb = b->plan.total_mb;
    const double *p = ts_unet_profile(b->m);
    for (int k = 0; k < TS_PROF_COUNT; k++) r->prof[k] = p[k] / steps;
    r->profiled = b->o->profile;
    int split[3]; /* this rank's box, its split axes */
    for (int d = 0; d < 3; d++) split[d] = b->L->sp_dims[d] > 1;
    ts_unet_cost box;
    TS_TRY(ts_unet_cost_of(&b->u, (int)(b->batch * b->L->micro), b->L->box, split, &box));
    for (int k = 0; k < TS_PROF_COUNT; k++) {
        const int conv = k == TS_PROF_CONV_FWD || k == TS_PROF_CONV_WGRAD || k == TS_PROF_CONV_DGRAD || k == TS_PROF_CONVT;
        r->prof_flop[k] = conv ? box.work[k] : 0;
        r->prof_bytes[k] = box.bytes[k];
    }
    return 0;
}

void ts_bench_step_roof(const ts_bench_step_result *r, int k, double *gflops, double *gbps, const char **bound,
                        double *fraction)
{
    const double t = r->prof[k];
    *gflops = t > 0 ? r->prof_flop[k] / t / 1e9 : 0;
    *gbps = t > 0 ? r->prof_bytes[k] / t / 1e9 : 0;
    *bound = "-";
    *fraction = 0;
    if (r->peak_gflops <= 0 || r->peak_triad_GBps <= 0) return;
    const double pf = r->peak_gflops / r->ranks, pb = r->peak_triad_GBps / r->ranks; /* this rank's share */
    const int compute = r->prof_flop[k] > 0 && r->prof_bytes[k] > 0 && r->prof_flop[k] / r->prof_bytes[k] >= pf / pb;
    *bound = compute ? "compute" : "memory";
    *fraction = compute ? *gflops / pf : *gbps / pb;
}

/* rank 0: the rates of every layer kind for `tessera plan` (the caller writes them) */
static int calibrate(bench *b, ts_bench_step_result *r)
{
    const char *th = getenv("OMP_NUM_THREADS");
    return ts_plan_calib_from_profile(&b->u, (int)b->batch, b->L->box, r->prof, r->optimizer_s, r->step_s, r->act_bytes,
                                      (double)ts_unet_arena(b->m)->nparam, b->plan.process_mb,
                                      th ? atoi(th) : r->threads, &r->cal);
}

static void bench_free(bench *b)
{
    ts_stepper_destroy(&b->stepper);
    ts_pipeline_destroy(&b->pipe);
    ts_perf_destroy(&b->perf);
    ts_gradpath_destroy(&b->gp);
    ts_layout_destroy(&b->L);
    ts_tensor_free(&b->image);
    ts_tensor_free(&b->label);
    ts_unet_destroy(&b->m);
}

int ts_bench_step_run(MPI_Comm comm, const ts_config *cfg, const ts_bench_step_opts *o, ts_bench_step_result *r)
{
    int err = 0, rank;
    bench b;
    step_sums s;
    memset(&b, 0, sizeof b);
    memset(&s, 0, sizeof s);
    memset(r, 0, sizeof *r);
    b.comm = comm;
    b.cfg = cfg;
    b.o = o;
    MPI_Comm_rank(comm, &rank);
    if (o->steps < 1 || o->warmup < 0 || o->rounds < 1)
        TS_FAIL(TS_ERR_ARG, "bench step: steps >= 1, warm-up >= 0 and rounds >= 1, not %d, %d, %d", o->steps, o->warmup,
                o->rounds);
    if (o->peak) { /* every rank at once, before the model takes memory (`tessera bench peak`) */
        ts_bench_peak_result pk;
        TS_CHECK(ts_bench_peak_run(comm, 0, 2.0, &pk));
        r->peak_triad_GBps = pk.sum_triad_GBps;
        b.peak_fp32 = pk.sum_fp32_gflops;
        b.peak_bf16 = pk.sum_bf16_gflops;
        b.peak_amx = pk.sum_amx_gflops;
    }
    TS_CHECK(setup_grid(&b));
    TS_CHECK(setup_model(&b));
    if (o->overhead) {
        s.t_on = calloc((size_t)o->steps, sizeof *s.t_on);
        s.t_off = calloc((size_t)o->steps, sizeof *s.t_off);
        if (!s.t_on || !s.t_off) TS_FAIL(TS_ERR_NOMEM, "bench step");
    }
    TS_CHECK(setup_data(&b));
    header(&b, r);
    if (o->compare) {
        r->compared = 1;
        TS_CHECK(compare_checkpoint(&b, &r->cmp));
        goto cleanup;
    }
    TS_CHECK(timed_steps(&b, &s));
    TS_CHECK(step_figures(&b, &s, r));
    if (rank == 0 && o->overhead) overhead_figures(&b, &s, r);
    if (o->calibrate) TS_CHECK(ts_err_agree(comm, rank == 0 ? calibrate(&b, r) : 0));
cleanup:
    free(s.t_on);
    free(s.t_off);
    bench_free(&b);
    return err;
}

int ts_bench_step_verdict(const ts_bench_step_result *r)
{
    if (r->compared && !r->cmp.identical)
        return TS_ERR(TS_ERR_INTERNAL, "bench step: gradients with model.checkpoint_levels = %s differ from %s",
                      r->cmp.levels[1], r->cmp.levels[0]);
    return 0;
}

void ts_bench_step_result_free(ts_bench_step_result *r)
{
    free(r->stages);
    free(r->cmp.round_step_ratio);
    free(r->cmp.round_cpu_ratio);
    memset(r, 0, sizeof *r);
}

static void json_compare(cJSON *o, const ts_bench_step_result *r, const char *config)
{
    const ts_bench_step_compare *k = &r->cmp;
    cJSON *c = cJSON_AddObjectToObject(o, "checkpoint_compare");
    cJSON_AddStringToObject(c, "levels_a", k->levels[0]);
    cJSON_AddStringToObject(c, "levels_b", k->levels[1]);
    cJSON_AddNumberToObject(c, "step_ms_a", k->step_s[0] * 1e3);
    cJSON_AddNumberToObject(c, "step_ms_b", k->step_s[1] * 1e3);
    cJSON_AddNumberToObject(c, "step_ratio", k->step_ratio);
    cJSON_AddNumberToObject(c, "cpu_ms_a", k->cpu_s[0] * 1e3);
    cJSON_AddNumberToObject(c, "cpu_ms_b", k->cpu_s[1] * 1e3);
    cJSON_AddNumberToObject(c, "cpu_ratio", k->cpu_ratio);
    cJSON_AddNumberToObject(c, "round_step_ratio", k->round_step_median);
    cJSON_AddNumberToObject(c, "round_cpu_ratio", k->round_cpu_median);
    cJSON_AddNumberToObject(c, "act_bytes_a", k->act[0]);
    cJSON_AddNumberToObject(c, "act_bytes_b", k->act[1]);
    cJSON_AddNumberToObject(c, "act_reduction", k->act_reduction);
    cJSON_AddNumberToObject(c, "scratch_bytes_b", k->scratch[1]);
    cJSON_AddNumberToObject(c, "plan_bytes_a", k->plan[0]);
    cJSON_AddNumberToObject(c, "plan_bytes_b", k->plan[1]);
    cJSON_AddNumberToObject(c, "peak_rss_mb_a", k->rss_mb[0]);
    cJSON_AddNumberToObject(c, "peak_rss_mb_b", k->rss_mb[1]);
    cJSON_AddNumberToObject(c, "rss_reduction", k->rss_reduction);
    cJSON_AddBoolToObject(c, "grads_identical", k->identical);
    cJSON_AddNumberToObject(c, "rounds", k->rounds);
    cJSON_AddNumberToObject(c, "steps", r->steps);
    cJSON_AddNumberToObject(c, "warmup", r->warmup);
    cJSON_AddNumberToObject(o, "ranks", r->ranks);
    cJSON_AddNumberToObject(o, "batch", (double)r->batch);
    cJSON_AddStringToObject(o, "config", config);
}

static void json_stages(cJSON *o, const ts_bench_step_result *r)
{
    cJSON_AddNumberToObject(o, "bubble_formula", r->bubble_formula);
    cJSON_AddStringToObject(o, "schedule", r->schedule);
    cJSON *st = cJSON_AddArrayToObject(o, "stages");
    for (int k = 0; k < r->pp; k++) {
        const ts_bench_step_stage *v = &r->stages[k];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "units", v->units);
        cJSON_AddNumberToObject(e, "estimated_ms", v->estimated_s * 1e3); /* 0 with parallel.pp_cut given */
        cJSON_AddNumberToObject(e, "busy_ms", v->busy_s * 1e3);
        cJSON_AddNumberToObject(e, "forward_ms", v->forward_s * 1e3);
        cJSON_AddNumberToObject(e, "backward_ms", v->backward_s * 1e3);
        cJSON_AddNumberToObject(e, "span_ms", v->span_s * 1e3);
        cJSON_AddNumberToObject(e, "idle_ms", (v->span_s - v->busy_s) * 1e3);
        cJSON_AddNumberToObject(e, "wait_ms", v->wait_s * 1e3);
        cJSON_AddNumberToObject(e, "bubble", v->span_s > 0 ? (v->span_s - v->busy_s) / v->span_s : 0);
        cJSON_AddNumberToObject(e, "slots", v->slots);
        cJSON_AddNumberToObject(e, "slot_bytes", v->slot_bytes);
        cJSON_AddNumberToObject(e, "act_bytes", v->act_bytes);
        cJSON_AddItemToArray(st, e);
    }
}

static void json_steps(cJSON *o, const ts_bench_step_result *r, const char *config)
{
    if (r->overhead) {
        cJSON_AddNumberToObject(o, "perf_on_step_ms", r->perf_on_s * 1e3);
        cJSON_AddNumberToObject(o, "perf_off_step_ms", r->perf_off_s * 1e3);
        cJSON_AddNumberToObject(o, "perf_ratio", r->perf_ratio);
        cJSON_AddNumberToObject(o, "perf_pair_us", r->pair_s * 1e6);
        cJSON_AddNumberToObject(o, "perf_brackets_per_step", r->brackets_per_step);
        cJSON_AddNumberToObject(o, "perf_direct_fraction", r->brackets_per_step * r->pair_s / r->perf_off_s);
    }
    cJSON_AddNumberToObject(o, "samples_per_s", r->samples_per_s);
    cJSON_AddStringToObject(o, "precision", r->precision);
    cJSON_AddStringToObject(o, "engine", r->engine);
    cJSON_AddStringToObject(o, "state", r->state);
    cJSON_AddStringToObject(o, "conv_kernels", r->kernels);
    cJSON_AddNumberToObject(o, "voxels_per_s", r->voxels_per_s);
    cJSON_AddNumberToObject(o, "flop_per_step", r->flops);
    if (r->profiled) { /* --profile: the roofline per kind (this rank's) */
        cJSON *pa = cJSON_AddArrayToObject(o, "profile");
        double sum = r->optimizer_s;
        for (int k = 0; k < TS_PROF_COUNT; k++) {
            double gf, gb, fr;
            const char *bound;
            ts_bench_step_roof(r, k, &gf, &gb, &bound, &fr);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "kind", ts_unet_prof_name(k));
            cJSON_AddNumberToObject(e, "ms", r->prof[k] * 1e3);
            cJSON_AddNumberToObject(e, "flop", r->prof_flop[k]);
            cJSON_AddNumberToObject(e, "bytes", r->prof_bytes[k]);
            cJSON_AddNumberToObject(e, "gflops", gf);
            cJSON_AddNumberToObject(e, "GBps", gb);
            cJSON_AddStringToObject(e, "bound", bound);
            cJSON_AddNumberToObject(e, "fraction_of_roof", fr);
            cJSON_AddItemToArray(pa, e);
            sum += r->prof[k];
        }
        cJSON_AddNumberToObject(o, "profile_optimizer_ms", r->optimizer_s * 1e3);
        cJSON_AddNumberToObject(o, "profile_sum_ms", sum * 1e3);
        cJSON_AddNumberToObject(o, "profile_sum_over_step", sum / r->step_s);
    }
    cJSON_AddNumberToObject(o, "gflops", r->gflops);
    if (r->peak_gflops > 0) {
        cJSON_AddStringToObject(o, "peak_kind", r->peak_kind);
        cJSON_AddNumberToObject(o, "peak_gflops", r->peak_gflops);
        cJSON_AddNumberToObject(o, "fraction_of_peak", r->gflops / r->peak_gflops);
        cJSON_AddNumberToObject(o, "peak_triad_GBps", r->peak_triad_GBps);
    }
    cJSON_AddNumberToObject(o, "step_ms", r->step_s * 1e3);
    cJSON_AddNumberToObject(o, "best_step_ms", r->best_s * 1e3);
    cJSON_AddNumberToObject(o, "forward_ms", r->forward_s * 1e3);
    cJSON_AddNumberToObject(o, "backward_ms", r->backward_s * 1e3);
    cJSON_AddNumberToObject(o, "optimizer_ms", r->optimizer_s * 1e3);
    cJSON_AddNumberToObject(o, "cpu_ms", r->cpu_s * 1e3);
    cJSON_AddNumberToObject(o, "comm_total_ms", r->comm_total_s * 1e3);
    cJSON_AddNumberToObject(o, "comm_exposed_ms", r->comm_exposed_s * 1e3);
    cJSON_AddNumberToObject(o, "ranks", r->ranks);
    cJSON *gr = cJSON_AddObjectToObject(o, "grid");
    cJSON_AddNumberToObject(gr, "dp", r->dp);
    cJSON_AddNumberToObject(gr, "pp", r->pp);
    cJSON_AddNumberToObject(gr, "sp", r->sp);
    cJSON *sd = cJSON_AddArrayToObject(o, "sp_dims"), *bx = cJSON_AddArrayToObject(o, "box");
    for (int i = 0; i < 3; i++) {
        cJSON_AddItemToArray(sd, cJSON_CreateNumber(r->dims[i]));
        cJSON_AddItemToArray(bx, cJSON_CreateNumber((double)r->box[i]));
    }
    cJSON_AddNumberToObject(o, "act_bytes", r->act_bytes);
    cJSON_AddNumberToObject(o, "plan_mb", r->plan_mb);
    cJSON_AddNumberToObject(o, "arena_mb", r->arena_mb); /* parameters, gradients, optimizer state (a shard with zero) */
    cJSON_AddNumberToObject(o, "halo_exposed_ms", r->halo_exposed_s * 1e3);
    cJSON_AddNumberToObject(o, "halo_hidden_ms", r->halo_hidden_s * 1e3);
    cJSON_AddNumberToObject(o, "spatial_sums_ms", r->spatial_sums_s * 1e3);
    cJSON_AddNumberToObject(o, "microbatches", r->micro);
    cJSON *gp = cJSON_AddObjectToObject(o, "grad_path");
    cJSON_AddStringToObject(gp, "kind", r->grad_path);
    cJSON_AddNumberToObject(gp, "local_steps", r->local_steps);
    cJSON_AddStringToObject(gp, "local_sgd", r->local_sgd);
    cJSON_AddNumberToObject(gp, "parameter_averages", (double)r->param_averages);
    cJSON_AddNumberToObject(gp, "param_average_ms", r->param_average_s * 1e3);
    cJSON_AddStringToObject(gp, "compress", r->compress);
    cJSON_AddNumberToObject(gp, "reduced_steps", (double)r->reduced_steps);
    cJSON_AddNumberToObject(gp, "compressed_steps", (double)r->compressed_steps);
    cJSON_AddNumberToObject(gp, "bytes_per_step", r->grad_bytes);
    cJSON_AddNumberToObject(gp, "bytes_per_step_fp32", r->grad_bytes_fp32);
    if (r->stages) json_stages(o, r);
    cJSON_AddNumberToObject(o, "threads", r->threads);
    cJSON_AddStringToObject(o, "config", config);
    cJSON_AddNumberToObject(o, "batch", (double)r->batch);
    cJSON *p = cJSON_AddArrayToObject(o, "patch");
    for (int i = 0; i < 3; i++) cJSON_AddItemToArray(p, cJSON_CreateNumber((double)r->patch[i]));
    cJSON_AddNumberToObject(o, "steps", r->steps);
    cJSON_AddNumberToObject(o, "peak_rss_mb", r->rss_mb);
    cJSON_AddNumberToObject(o, "loss", r->loss);
}

int ts_bench_step_write_json(const char *path, const ts_bench_step_result *r, const char *config)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return TS_ERR(TS_ERR_NOMEM, "bench step: JSON");
    if (r->compared) json_compare(o, r, config);
    else json_steps(o, r, config);
    return ts_bench_json_write(o, path, "bench step");
}
