/* tessera bench step: times full training steps (forward, loss, backward,
 * optimizer step) of the config's UNet3D on random data of the configured
 * patch and batch, after warm-up; reports samples/s, voxels/s, step time,
 * per-phase times and the peak resident memory of the process. */
#include "tsbuild.h"
#include "collectives/coll.h"
#include "src/cli/cli.h"
#include "src/cli/engine.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/core/timer.h"
#include "src/model/unet.h"
#include "src/optim/optim.h"
#include "src/parallel/grid.h"
#include "src/parallel/spatial.h"
#include "src/train/step.h"
#include "src/train/synthetic.h"
#include "src/train/plan.h"
#include "src/train/run.h"
#include "src/train/trainer.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static void help(void)
{
    printf("usage: tessera bench step CONFIG [section.key=value ...] [--steps N] [--warmup W] [--json FILE]\n"
           "                          [--profile] [--calibrate FILE] [--perf-overhead]\n\n"
           "Times N (default 5) full training steps - forward, loss, backward, optimizer step - after W\n"
           "(default 2) warm-up steps, on random data (normal images, uniform labels) of data.patch and\n"
           "train.batch, with the config's model, loss and optimizer. Threads: OMP_NUM_THREADS (default: all\n"
           "cores). Prints samples/s, voxels/s, the mean step time and its phases, and the peak resident\n"
           "memory of the process; --json writes samples_per_s, voxels_per_s, step_ms, ranks, threads,\n"
           "config, peak_rss_mb, forward_ms, backward_ms, optimizer_ms, cpu_ms (process CPU time per step),\n"
           "batch, patch. --profile adds the time per kind of layer. --calibrate FILE writes the rates of\n"
           "every layer kind (work from the model's analytic cost over the measured time), the optimizer's\n"
           "time per parameter and the activation bytes per element, for `tessera plan --calib FILE`\n"
           "(measure on one rank, with the threads per rank the plan assumes). --perf-overhead alternates\n"
           "steps with the per-phase timers and counters of `tessera train` (perf.papi_events, default the\n"
           "software counters) and steps without, and reports both medians and their ratio.\n"
           "On N ranks (mpiexec -n N) the steps run on the grid `tessera train` would use: parallel.dp\n"
           "replicas x parallel.pp pipeline stages x parallel.sp spatial pieces (parallel.sp_dims,\n"
           "parallel.microbatches, parallel.schedule, parallel.pp_cut). Each replica trains its own batch\n"
           "(parallel.microbatches micro-batches of train.batch through the pipeline), each spatial group\n"
           "splits every sample's volume (halo exchange); gradient buckets are reduced while backward runs\n"
           "(parallel.bucket_mb, model.sync_bn; reduce-scattered, the shards stepped and the parameters\n"
           "all-gathered with parallel.zero = 1). samples/s counts all replicas' samples over the slowest\n"
           "rank's time; comm_exposed_ms / comm_total_ms give the gradient communication not hidden / in\n"
           "total, halo_exposed_ms / halo_hidden_ms the halo exchange. The JSON also has grid {dp, pp, sp},\n"
           "sp_dims, box, act_bytes (the model's activations, gradients and halo faces per rank, largest\n"
           "over ranks), plan_mb (the memory plan of run.mem_limit_mb), peak_rss_mb and, with a pipeline,\n"
           "stages: per stage its units, busy, span and idle ms per step, bubble = idle / span next to\n"
           "bubble_formula = (P-1)/(M+P-1), slots (micro-batches in flight), slot_bytes and act_bytes.\n");
}

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

int ts_cli_bench_step(int argc, char **argv)
{
    int err = 0, nover = 0, steps = 5, warmup = 2, profile = 0, overhead = 0;
    const char *cfgpath = NULL, *json = NULL, *calib = NULL;
    ts_perf *perf = NULL;
    double *t_on = NULL, *t_off = NULL;
    int n_on = 0, n_off = 0;
    char **over = calloc((size_t)argc + 1, sizeof *over);
    ts_config *cfg = NULL;
    ts_unet *m = NULL;
    ts_coll *coll = NULL;
    ts_grid *grid = NULL;
    ts_spatial *sp = NULL;
    ts_pipeline *pipe = NULL;
    int first[4 * TS_UNET_MAX_LEVELS], M = 1;
    double ucost[4 * TS_UNET_MAX_LEVELS] = {0}, *sv = NULL;
    ts_stepper *stepper = NULL;
    ts_tensor image = {0}, label = {0};
    cJSON *o = NULL;
    if (!over) TS_FAIL(TS_ERR_NOMEM, "arguments");
    if (ts_cli_wants_help(argc, argv)) {
        if (ts_cli_rank() == 0) help();
        goto cleanup;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "--steps") || !strcmp(a, "--warmup")) && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < (a[2] == 's' ? 1 : 0)) TS_FAIL(TS_ERR_ARG, "bench step: %s '%s' is not a valid count", a, argv[i]);
            if (a[2] == 's') steps = (int)v;
            else warmup = (int)v;
        } else if (!strcmp(a, "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(a, "--profile")) profile = 1;
        else if (!strcmp(a, "--calibrate") && i + 1 < argc) calib = argv[++i];
        else if (!strcmp(a, "--perf-overhead")) overhead = 1;
        else if (strchr(a, '=') && a[0] != '-') over[nover++] = argv[i];
        else if (!cfgpath && a[0] != '-') cfgpath = a;
        else TS_FAIL(TS_ERR_ARG, "bench step: unexpected argument '%s' (see --help)", a);
    }
    if (!cfgpath) TS_FAIL(TS_ERR_ARG, "bench step: no CONFIG given");
    const double rss0 = ts_train_rss_mb();
    TS_CHECK(ts_cli_load_config(cfgpath, nover, over, MPI_COMM_WORLD, &cfg));
    const int nranks = ts_cli_size(), rank = ts_cli_rank();
    ts_unet_cfg u;
    ts_optim opt = {0};
    int64_t batch, seed, dp, pp, spn, memlim;
    int dims[3];
    int64_t box_lo[3], box[3];
    const char *spdims;
    ts_mem_plan plan;
    TS_CHECK(ts_unet_cfg_from_config(cfg, &u));
    TS_CHECK(ts_optim_cfg_from_config(cfg, &opt.cfg));
    TS_CHECK(ts_config_get_int(cfg, "train.batch", &batch));
    TS_CHECK(ts_config_get_int(cfg, "train.seed", &seed));
    /* the grid of `tessera train` */
    TS_CHECK(ts_config_get_int(cfg, "parallel.dp", &dp));
    TS_CHECK(ts_config_get_int(cfg, "parallel.pp", &pp));
    TS_CHECK(ts_config_get_int(cfg, "parallel.sp", &spn));
    TS_CHECK(ts_config_get_str(cfg, "parallel.sp_dims", &spdims));
    TS_CHECK(ts_config_get_int(cfg, "run.mem_limit_mb", &memlim));
    TS_CHECK(ts_grid_create(MPI_COMM_WORLD, (int)dp, (int)pp, (int)spn, &grid));
    ts_pipe_kind kind = TS_PIPE_1F1B;
    if (pp > 1) {
        const char *sched;
        int64_t mb;
        TS_CHECK(ts_config_get_int(cfg, "parallel.microbatches", &mb));
        TS_CHECK(ts_config_get_str(cfg, "parallel.schedule", &sched));
        TS_CHECK(ts_pipe_kind_parse(sched, &kind));
        M = (int)mb;
        if (kind == TS_PIPE_1F1B && M < pp)
            TS_FAIL(TS_ERR_CONFIG, "parallel.schedule = 1f1b needs parallel.microbatches >= parallel.pp, but %d < %lld "
                    "(use more micro-batches, or parallel.schedule = gpipe)", M, (long long)pp);
        if (pp > 4 * u.levels - 1)
            TS_FAIL(TS_ERR_CONFIG, "parallel.pp = %lld stages, but the model has only %d layer units to cut between",
                    (long long)pp, 4 * u.levels - 1);
    }
    TS_CHECK(ts_spatial_plan((int)spn, spdims, u.patch, u.levels, dims));
    TS_CHECK(ts_spatial_create(grid->sp_comm, dims, &sp));
    TS_CHECK(ts_spatial_box(sp, u.patch, box_lo, box));
    int64_t zero;
    TS_CHECK(ts_config_get_int(cfg, "parallel.zero", &zero));
    TS_CHECK(ts_unet_create(&u, zero ? 0 : ts_optim_state_count(&opt.cfg), &m));
    {
        ts_coll_opts co;
        double bmb;
        int sync;
        TS_CHECK(ts_coll_opts_from_config(cfg, &co));
        TS_CHECK(ts_coll_create(grid->stage_comm, &co, &coll));
        TS_CHECK(ts_config_get_float(cfg, "parallel.bucket_mb", &bmb));
        TS_CHECK(ts_config_get_bool(cfg, "model.sync_bn", &sync));
        TS_CHECK(ts_stepper_create(m, &opt, coll, bmb, sync, sp, &stepper));
    }
    if (overhead) { /* the trainer's per-phase machinery, switched on every other step */
        const char *ev = "perf::TASK-CLOCK,perf::PAGE-FAULTS,perf::CONTEXT-SWITCHES";
        if (ts_config_isset(cfg, "perf.papi_events")) TS_CHECK(ts_config_get_str(cfg, "perf.papi_events", &ev));
        TS_CHECK(ts_perf_create(MPI_COMM_WORLD, TS_PH_COUNT, ts_phase_names, ev, 1, &perf));
        t_on = calloc((size_t)steps, sizeof *t_on);
        t_off = calloc((size_t)steps, sizeof *t_off);
        if (!t_on || !t_off) TS_FAIL(TS_ERR_NOMEM, "bench step");
    }
    TS_CHECK(ts_unet_init(m, (uint64_t)seed));
    if (pp > 1) { /* the cut of `tessera train` */
        const char *cut;
        TS_CHECK(ts_config_get_str(cfg, "parallel.pp_cut", &cut));
        TS_CHECK(ts_pipeline_plan(m, MPI_COMM_WORLD, (int)pp, cut, (int)batch, box, first, ucost));
        TS_CHECK(ts_pipeline_create(m, grid->pp_comm, first, kind, M, &pipe));
        TS_CHECK(ts_stepper_set_pipeline(stepper, pipe, grid->pp_comm));
    }
    if (zero) TS_CHECK(ts_err_agree(MPI_COMM_WORLD, ts_stepper_set_zero(stepper))); /* the sharded optimizer */
    {
        /* every rank's plan against the limit: the largest decides, so that all stop together */
        ts_unet_split own;
        memset(&own, 0, sizeof own);
        ts_spatial_split_dims(sp, own.on);
        for (int d = 0; d < 3; d++)
            for (int side = 0; side < 2; side++) own.nbr[d][side] = ts_spatial_neighbor(sp, d, side);
        TS_CHECK(ts_train_memory_plan(m, spn > 1 ? &own : NULL, &u, (int)batch, u.in_channels, 0, box, dims, rss0, &plan));
        double most = plan.total_mb;
        TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
        if (memlim > 0 && most > (double)memlim)
            TS_FAIL(TS_ERR_CONFIG, "run.mem_limit_mb = %lld: this configuration needs about %.0f MiB on some rank "
                    "(this rank: activations and gradients %.0f MiB for a box of %lldx%lldx%lld); `tessera train` "
                    "names a parallel.sp that fits", (long long)memlim, most, plan.activations_mb, (long long)box[0],
                    (long long)box[1], (long long)box[2]);
    }
    TS_CHECK(ts_tensor_alloc(&image, TS_FLOAT32, 5, (const int64_t[]){batch, u.in_channels, box[0], box[1], box[2]}));
    TS_CHECK(ts_tensor_alloc(&label, TS_UINT8, 4, (const int64_t[]){batch, box[0], box[1], box[2]}));
    ts_synthetic_batch((uint64_t)seed, grid->d, 0, (int)batch, u.in_channels, u.classes, u.patch, box_lo, box,
                       image.data, label.data);
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, ts_unet_setup(m, (int)batch, (int)box[0], (int)box[1], (int)box[2])));
    ts_timer tf, tb, to, ts;
    ts_timer_reset(&tf);
    ts_timer_reset(&tb);
    ts_timer_reset(&to);
    ts_timer_reset(&ts);
    double loss = 0, best = 1e30, cpu = 0, ce = 0, ct = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    ts_spatial_stats halo0 = {0};
    struct batch_pair bb = {&image, &label};
    ts_pipeline_stats pst0 = {0};
    for (int s = 0; s < warmup + steps; s++) {
        const int timed = s >= warmup;
        if (s == warmup) {
            ts_unet_profile_reset(m);
            ts_spatial_set_stats(sp, &halo0);
            if (pipe) pst0 = *ts_pipeline_get_stats(pipe);
        }
        const int with_perf = overhead && (s % 2 == 0);
        ts_stepper_set_perf(stepper, with_perf ? perf : NULL);
        if (overhead) MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = ts_time_now(), c0 = cpu_now();
        if (with_perf) ts_perf_begin(perf, TS_PH_STEP);
        const ts_step_times *pt = ts_stepper_times(stepper);
        const double f0 = pt->forward, b0 = pt->backward, e0 = pt->comm_exposed, g0 = pt->comm_total, o0 = pt->optimizer;
        if (pipe) {
            TS_CHECK(ts_stepper_pipe_step(stepper, same_batch, &bb, &loss));
            TS_CHECK(ts_stepper_update(stepper, M));
        } else {
            TS_CHECK(ts_stepper_micro(stepper, &image, &label, 1, 1, &loss));
            TS_CHECK(ts_stepper_update(stepper, 1));
        }
        if (with_perf) ts_perf_end(perf, TS_PH_STEP);
        const double t3 = ts_time_now();
        if (overhead && timed) {
            double dt = t3 - t0;
            MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (with_perf) t_on[n_on++] = dt;
            else t_off[n_off++] = dt;
        }
        /* phases: forward+loss, backward, optimizer (the exposed communication is reported apart) */
        const double t1 = t0 + (pt->forward - f0), t2 = t1 + (pt->backward - b0), t2o = t3 - (pt->optimizer - o0);
        if (timed) {
            ce += pt->comm_exposed - e0;
            ct += pt->comm_total - g0;
        }
        if (timed) {
            cpu += cpu_now() - c0;
            tf.total += t1 - t0;
            tb.total += t2 - t1;
            to.total += t3 - t2o;
            ts.total += t3 - t0;
            if (t3 - t0 < best) best = t3 - t0;
        }
    }
    if (pipe) TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, grid->pp_comm)); /* the last stage's */
    /* all replicas' samples over the slowest rank's time (a spatial group shares its samples) */
    double slowest = ts.total;
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    const double step_s = slowest / steps, sps = (double)batch * M * grid->dp / step_s;
    /* per stage (the largest over its ranks): busy, span, in-flight activations */
    enum { NV = 6 };
    sv = TS_CALLOC((size_t)grid->pp * NV, sizeof *sv);
    if (!sv) TS_FAIL(TS_ERR_NOMEM, "stage figures");
    if (pipe) {
        const ts_pipeline_stats *ps = ts_pipeline_get_stats(pipe);
        int u0, u1, slots;
        ts_unet_stage(m, &u0, &u1, &slots);
        double *v = sv + grid->p * NV;
        v[0] = (ps->busy_s - pst0.busy_s) / steps;
        v[1] = (ps->span_s - pst0.span_s) / steps;
        v[2] = (ps->wait_s - pst0.wait_s) / steps;
        v[3] = slots;
        v[4] = (double)ts_unet_slot_bytes(m);
        v[5] = (double)ts_unet_activation_bytes(m);
        TS_MPI(MPI_Allreduce(MPI_IN_PLACE, sv, grid->pp * NV, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    }
    double rss_all = peak_rss_mb();
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &rss_all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    const ts_spatial_stats *hs = ts_spatial_get_stats(sp);
    double hv[4] = {hs->exposed_s, hs->hidden_s, hs->sum_s, (double)ts_unet_activation_bytes(m)};
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, hv, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    if (rank != 0) goto cleanup;
    const double vox = (double)u.patch[0] * u.patch[1] * u.patch[2];
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const double rss = rss_all; /* the largest over ranks */
    printf("bench step: %s, %d rank%s = dp %d x pp %d x sp %d (sp_dims %dx%dx%d, box %lldx%lldx%lld), batch %lld x %d "
           "micro-batch%s per replica, patch %lldx%lldx%lld, %d thread%s per rank, %d steps after %d warm-up\n",
           cfgpath, nranks, nranks > 1 ? "s" : "", grid->dp, grid->pp, grid->sp, dims[0], dims[1], dims[2], (long long)box[0],
           (long long)box[1], (long long)box[2], (long long)batch, M, M > 1 ? "es" : "", (long long)u.patch[0], (long long)u.patch[1],
           (long long)u.patch[2], threads, threads > 1 ? "s" : "", steps, warmup);
    printf("  samples/s %.3f   voxels/s %.4g   step %.1f ms (best %.1f)   forward+loss %.1f  backward %.1f  "
           "optimizer %.1f ms\n",
           sps, sps * vox, step_s * 1e3, best * 1e3, tf.total / steps * 1e3, tb.total / steps * 1e3,
           to.total / steps * 1e3);
    printf("  process CPU time %.1f ms per step (%.2f cores busy)\n", cpu / steps * 1e3, cpu / ts.total);
    if (pipe) {
        char units[1024], name[32];
        printf("  pipeline: %d stages, %d micro-batches, %s; bubble formula (P-1)/(M+P-1) = %.3f\n", grid->pp, M,
               kind == TS_PIPE_GPIPE ? "gpipe" : "1f1b", ts_pipe_bubble(grid->pp, M));
        for (int k = 0; k < grid->pp; k++) {
            const double *v = sv + k * NV, idle = v[1] - v[0];
            size_t l = 0;
            for (int x = first[k]; x < first[k + 1] && l < sizeof units; x++)
                l += (size_t)snprintf(units + l, sizeof units - l, "%s%s", x > first[k] ? "," : "",
                                      ts_unet_unit_name(m, x, name, sizeof name));
            printf("  stage %d (%s): busy %.1f ms, span %.1f ms, idle %.1f ms, bubble %.3f; %d slot%s x %.1f MiB in "
                   "flight, activations %.1f MiB\n", k, units, v[0] * 1e3, v[1] * 1e3, idle * 1e3, v[1] > 0 ? idle / v[1] : 0,
                   (int)v[3], v[3] > 1 ? "s" : "", v[4] / 1048576.0, v[5] / 1048576.0);
        }
    }
    if (grid->sp > 1)
        printf("  halo exchange per step: %.1f ms exposed, %.1f ms hidden by compute; spatial sums %.1f ms (largest "
               "over ranks)\n", hv[0] / steps * 1e3, hv[1] / steps * 1e3, hv[2] / steps * 1e3);
    if (nranks > 1)
        printf("  gradient communication per step: %.1f ms on the progress thread, %.1f ms not hidden by backward "
               "(rank 0, %d bucket%s)\n",
               ct / steps * 1e3, ce / steps * 1e3, ts_stepper_buckets(stepper), ts_stepper_buckets(stepper) > 1 ? "s" : "");
    if (overhead && n_on && n_off) {
        qsort(t_on, (size_t)n_on, sizeof *t_on, cmp_d);
        qsort(t_off, (size_t)n_off, sizeof *t_off, cmp_d);
        double mon = n_on % 2 ? t_on[n_on / 2] : 0.5 * (t_on[n_on / 2 - 1] + t_on[n_on / 2]);
        double moff = n_off % 2 ? t_off[n_off / 2] : 0.5 * (t_off[n_off / 2 - 1] + t_off[n_off / 2]);
        char line[1024];
        ts_perf_describe(perf, line, sizeof line);
        /* the machinery's own cost: one begin/end pair, timed in a loop */
        int64_t pairs = 0;
        for (int ph = 0; ph < TS_PH_COUNT; ph++) pairs += ts_perf_calls(perf, ph);
        const double tb = ts_time_now();
        for (int k = 0; k < 10000; k++) {
            ts_perf_begin(perf, TS_PH_EVAL);
            ts_perf_end(perf, TS_PH_EVAL);
        }
        const double pair_s = (ts_time_now() - tb) / 10000;
        const double per_step = (double)pairs / n_on;
        printf("  perf overhead: median step %.2f ms with timers and counters (%d steps), %.2f ms without (%d steps): "
               "ratio %.4f\n  %.1f phase brackets per step x %.2f us each = %.3f ms per step, %.3f%% of the step (%s)\n",
               mon * 1e3, n_on, moff * 1e3, n_off, mon / moff, per_step, pair_s * 1e6, per_step * pair_s * 1e3,
               100 * per_step * pair_s / moff, line);
        if (json) {
            o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "perf_on_step_ms", mon * 1e3);
            cJSON_AddNumberToObject(o, "perf_off_step_ms", moff * 1e3);
            cJSON_AddNumberToObject(o, "perf_ratio", mon / moff);
            cJSON_AddNumberToObject(o, "perf_pair_us", pair_s * 1e6);
            cJSON_AddNumberToObject(o, "perf_brackets_per_step", per_step);
            cJSON_AddNumberToObject(o, "perf_direct_fraction", per_step * pair_s / moff);
        }
    }
    if (calib) {
        const double *p = ts_unet_profile(m);
        double prof[TS_PROF_COUNT];
        for (int k = 0; k < TS_PROF_COUNT; k++) prof[k] = p[k] / steps;
        ts_plan_calib pc;
        const char *th = getenv("OMP_NUM_THREADS");
        TS_CHECK(ts_plan_calib_from_profile(&u, (int)batch, box, prof, to.total / steps, step_s, hv[3],
                                            (double)ts_unet_arena(m)->nparam, plan.process_mb, th ? atoi(th) : threads, &pc));
        TS_CHECK(ts_plan_calib_write(calib, &pc));
        printf("  calibration for tessera plan written to %s%s\n", calib,
               nranks > 1 ? " (measured with other ranks sharing the node: calibrate on one rank for plan)" : "");
    }
    if (profile) {
        const double *p = ts_unet_profile(m);
        printf("  per step:");
        for (int k = 0; k < TS_PROF_COUNT; k++) printf("%s %s %.1f ms", k ? "," : "", ts_unet_prof_name(k), p[k] / steps * 1e3);
        printf("\n");
    }
    printf("  peak RSS %.1f MiB (activations and gradients %.1f MiB per rank at most, arena %.1f MiB; memory plan "
           "%.0f MiB), loss %.4f\n", rss, hv[3] / 1048576.0,
           (double)(ts_unet_arena(m)->nparam * 2 + ts_unet_arena(m)->nstate_floats * (size_t)ts_unet_arena(m)->nstate +
                    ts_unet_arena(m)->nbuf) * 4 / 1048576.0, /* the state: a shard with parallel.zero = 1 */
           plan.total_mb, loss);
    if (json) {
        if (!o) o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "samples_per_s", sps);
        cJSON_AddNumberToObject(o, "voxels_per_s", sps * vox);
        cJSON_AddNumberToObject(o, "step_ms", step_s * 1e3);
        cJSON_AddNumberToObject(o, "best_step_ms", best * 1e3);
        cJSON_AddNumberToObject(o, "forward_ms", tf.total / steps * 1e3);
        cJSON_AddNumberToObject(o, "backward_ms", tb.total / steps * 1e3);
        cJSON_AddNumberToObject(o, "optimizer_ms", to.total / steps * 1e3);
        cJSON_AddNumberToObject(o, "cpu_ms", cpu / steps * 1e3);
        cJSON_AddNumberToObject(o, "comm_total_ms", ct / steps * 1e3);
        cJSON_AddNumberToObject(o, "comm_exposed_ms", ce / steps * 1e3);
        cJSON_AddNumberToObject(o, "ranks", ts_cli_size());
        cJSON *gr = cJSON_AddObjectToObject(o, "grid");
        cJSON_AddNumberToObject(gr, "dp", grid->dp);
        cJSON_AddNumberToObject(gr, "pp", grid->pp);
        cJSON_AddNumberToObject(gr, "sp", grid->sp);
        cJSON *sd = cJSON_AddArrayToObject(o, "sp_dims"), *bx = cJSON_AddArrayToObject(o, "box");
        for (int i = 0; i < 3; i++) {
            cJSON_AddItemToArray(sd, cJSON_CreateNumber(dims[i]));
            cJSON_AddItemToArray(bx, cJSON_CreateNumber((double)box[i]));
        }
        cJSON_AddNumberToObject(o, "act_bytes", hv[3]);
        cJSON_AddNumberToObject(o, "plan_mb", plan.total_mb);
        cJSON_AddNumberToObject(o, "halo_exposed_ms", hv[0] / steps * 1e3);
        cJSON_AddNumberToObject(o, "halo_hidden_ms", hv[1] / steps * 1e3);
        cJSON_AddNumberToObject(o, "spatial_sums_ms", hv[2] / steps * 1e3);
        cJSON_AddNumberToObject(o, "microbatches", M);
        if (pipe) {
            char units[1024], name[32];
            cJSON_AddNumberToObject(o, "bubble_formula", ts_pipe_bubble(grid->pp, M));
            cJSON_AddStringToObject(o, "schedule", kind == TS_PIPE_GPIPE ? "gpipe" : "1f1b");
            cJSON *st = cJSON_AddArrayToObject(o, "stages");
            for (int k = 0; k < grid->pp; k++) {
                const double *v = sv + k * NV;
                size_t l = 0;
                for (int x = first[k]; x < first[k + 1] && l < sizeof units; x++)
                    l += (size_t)snprintf(units + l, sizeof units - l, "%s%s", x > first[k] ? "," : "",
                                          ts_unet_unit_name(m, x, name, sizeof name));
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "units", units);
                double est = 0;
                for (int x = first[k]; x < first[k + 1]; x++) est += ucost[x];
                cJSON_AddNumberToObject(e, "estimated_ms", est * 1e3); /* 0 with parallel.pp_cut given */
                cJSON_AddNumberToObject(e, "busy_ms", v[0] * 1e3);
                cJSON_AddNumberToObject(e, "span_ms", v[1] * 1e3);
                cJSON_AddNumberToObject(e, "idle_ms", (v[1] - v[0]) * 1e3);
                cJSON_AddNumberToObject(e, "wait_ms", v[2] * 1e3);
                cJSON_AddNumberToObject(e, "bubble", v[1] > 0 ? (v[1] - v[0]) / v[1] : 0);
                cJSON_AddNumberToObject(e, "slots", v[3]);
                cJSON_AddNumberToObject(e, "slot_bytes", v[4]);
                cJSON_AddNumberToObject(e, "act_bytes", v[5]);
                cJSON_AddItemToArray(st, e);
            }
        }
        cJSON_AddNumberToObject(o, "threads", threads);
        cJSON_AddStringToObject(o, "config", cfgpath);
        cJSON_AddNumberToObject(o, "batch", (double)batch);
        cJSON *p = cJSON_AddArrayToObject(o, "patch");
        for (int i = 0; i < 3; i++) cJSON_AddItemToArray(p, cJSON_CreateNumber((double)u.patch[i]));
        cJSON_AddNumberToObject(o, "steps", steps);
        cJSON_AddNumberToObject(o, "peak_rss_mb", rss);
        cJSON_AddNumberToObject(o, "loss", loss);
        char *txt = cJSON_Print(o);
        FILE *f = txt ? fopen(json, "w") : NULL;
        if (!f) {
            free(txt);
            TS_FAIL(TS_ERR_IO, "%s: cannot write", json);
        }
        fprintf(f, "%s\n", txt);
        free(txt);
        if (fclose(f)) TS_FAIL(TS_ERR_IO, "%s: write failed", json);
    }
cleanup:
    free(sv);
    cJSON_Delete(o);
    ts_stepper_destroy(&stepper);
    ts_pipeline_destroy(&pipe);
    ts_perf_destroy(&perf);
    free(t_on);
    free(t_off);
    ts_coll_destroy(&coll);
    ts_spatial_destroy(&sp);
    ts_grid_destroy(&grid);
    ts_tensor_free(&image);
    ts_tensor_free(&label);
    ts_unet_destroy(&m);
    ts_config_destroy(&cfg);
    free(over);
    return err;
}
