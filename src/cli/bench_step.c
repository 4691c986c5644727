/* tessera bench step: times full training steps (forward, loss, backward,
 * optimizer step) of the config's UNet3D on random data of the configured
 * patch and batch, after warm-up; reports samples/s, voxels/s, step time,
 * per-phase times and the peak resident memory of the process.
 * --compare-checkpoint runs two sets of checkpointed levels side by side. */
#include "tsbuild.h"
#include "collectives/coll.h"
#include "src/cli/cli.h"
#include "src/cli/engine.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/core/timer.h"
#include "src/model/unet.h"
#include "src/optim/loss_scale.h"
#include "src/optim/optim.h"
#include "src/parallel/grid.h"
#include "src/parallel/spatial.h"
#include "src/train/step.h"
#include "src/train/synthetic.h"
#include "src/train/plan.h"
#include "src/train/run.h"
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

static void help(void)
{
    printf("usage: tessera bench step CONFIG [section.key=value ...] [--steps N] [--warmup W] [--json FILE]\n"
           "                          [--profile] [--calibrate FILE] [--perf-overhead]\n"
           "                          [--compare-checkpoint LEVELS [--rounds R]]\n\n"
           "Times N (default 5) full training steps - forward, loss, backward, optimizer step - after W\n"
           "(default 2) warm-up steps, on random data (normal images, uniform labels) of data.patch and\n"
           "train.batch, with the config's model, loss and optimizer. Threads: OMP_NUM_THREADS (default: all\n"
           "cores). Prints samples/s, voxels/s, the mean step time and its phases, and the peak resident\n"
           "memory of the process; --json writes samples_per_s, voxels_per_s, step_ms, ranks, threads,\n"
           "config, peak_rss_mb, forward_ms, backward_ms, optimizer_ms, cpu_ms (process CPU time per step),\n"
           "precision, conv_kernels (train.precision and the convolution kernels that ran),\n"
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
           "bubble_formula = (P-1)/(M+P-1), slots (micro-batches in flight), slot_bytes and act_bytes.\n"
           "--compare-checkpoint LEVELS runs the config's model.checkpoint_levels (A, default none) and LEVELS (B,\n"
           "e.g. 0,1) side by side in one process: first one step of each on the same weights, whose gradients\n"
           "must be bit-identical; then R rounds (default 3) of B then A, each W warm-up and N timed steps;\n"
           "reports per variant the median step time and process CPU time (the slowest rank's), the\n"
           "activation bytes allocated (and the memory plan's), the recompute scratch and the peak RSS of\n"
           "its rounds (the high-water mark is reset when the variant starts), the time ratios B/A (of the\n"
           "medians, and the median over rounds of each round's ratio) and the reductions; --json writes\n"
           "them under checkpoint_compare.\n");
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

/* one training step (through the pipeline when there is one); update = 0:
 * the gradients are reduced but not applied */
static int one_step(ts_stepper *st, ts_pipeline *pipe, struct batch_pair *bb, int M, int update, double *loss)
{
    if (pipe) TS_TRY(ts_stepper_pipe_step(st, same_batch, bb, loss));
    else TS_TRY(ts_stepper_micro(st, bb->image, bb->label, 1, 1, loss));
    return update ? ts_stepper_update(st, pipe ? M : 1) : ts_stepper_reduce(st, pipe ? M : 1);
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

typedef struct ck_variant {
    unsigned mask;
    double *t, *c; /* step wall and process CPU times, s (the slowest rank's) */
    double *rt, *rc; /* v[1] only: per round, the ratio of B's median wall / CPU step time to A's */
    int nt;
    double act, scratch, plan, rss; /* bytes, bytes, bytes, MiB: the largest over ranks */
} ck_variant;

/* Collective on world. --compare-checkpoint: variants v[0] (A) and v[1] (B)
 * of the model's checkpointed levels on the same stepper; one step of each
 * from the same weights without an update (gradients compared bit for bit
 * on every rank), then rounds of B then A. Leaves the model at A. */
static int compare_checkpoint(ts_unet *m, ts_stepper *st, ts_pipeline *pipe, struct batch_pair *bb, int M, int batch,
                              const int64_t box[3], const ts_unet_split *split, int warmup, int steps, int rounds,
                              ck_variant v[2], int *identical, double *nonzero)
{
    int err = 0;
    const ts_arena *a = ts_unet_arena(m);
    float *g = TS_MALLOC(a->nparam * sizeof(float) + 1);
    double loss, nz = 0;
    int differ = 0;
    if (!g) return TS_ERR(TS_ERR_NOMEM, "bench step: gradient copy");
    for (int k = 0; k < 2; k++) {
        v[k].t = TS_CALLOC((size_t)(rounds * steps), sizeof(double));
        v[k].c = TS_CALLOC((size_t)(rounds * steps), sizeof(double));
        v[k].rt = k ? TS_CALLOC((size_t)rounds, sizeof(double)) : NULL;
        v[k].rc = k ? TS_CALLOC((size_t)rounds, sizeof(double)) : NULL;
        if (!v[k].t || !v[k].c || (k && (!v[k].rt || !v[k].rc))) TS_FAIL(TS_ERR_NOMEM, "bench step: step times");
    }
    /* the same weights (no update between): A's gradients, then B's */
    for (int k = 0; k < 2; k++) {
        TS_CHECK(ts_unet_set_checkpoint(m, v[k].mask));
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, ts_unet_setup(m, batch, (int)box[0], (int)box[1], (int)box[2])));
        TS_CHECK(one_step(st, pipe, bb, M, 0, &loss));
        if (k == 0) memcpy(g, a->grads, a->nparam * sizeof(float));
        else differ = memcmp(g, a->grads, a->nparam * sizeof(float)) != 0;
    }
    for (size_t i = 0; i < a->nparam; i++) nz += g[i] != 0;
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &differ, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &nz, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    *identical = !differ;
    *nonzero = nz;
    for (int r = 0; r < rounds; r++)
        for (int k = 1; k >= 0; k--) {
            ck_variant *x = &v[k];
            TS_CHECK(ts_unet_set_checkpoint(m, x->mask));
            size_t plan = 0;
            TS_CHECK(ts_unet_plan_bytes_split(m, split, batch, (int)box[0], (int)box[1], (int)box[2], &plan));
            const int hwm_ok = reset_hwm() == 0;
            TS_CHECK(ts_err_agree(MPI_COMM_WORLD, ts_unet_setup(m, batch, (int)box[0], (int)box[1], (int)box[2])));
            for (int s = 0; s < warmup + steps; s++) {
                MPI_Barrier(MPI_COMM_WORLD);
                const double t0 = ts_time_now(), c0 = cpu_now();
                TS_CHECK(one_step(st, pipe, bb, M, 1, &loss));
                double dt[2] = {ts_time_now() - t0, cpu_now() - c0};
                TS_MPI(MPI_Allreduce(MPI_IN_PLACE, dt, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
                if (s >= warmup) {
                    x->t[x->nt] = dt[0];
                    x->c[x->nt++] = dt[1];
                }
            }
            double mv[4] = {(double)ts_unet_activation_bytes(m), (double)ts_unet_recompute_bytes(m), (double)plan,
                            hwm_ok ? hwm_mb() : peak_rss_mb()};
            TS_MPI(MPI_Allreduce(MPI_IN_PLACE, mv, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
            x->act = mv[0];
            x->scratch = mv[1];
            x->plan = mv[2];
            if (mv[3] > x->rss) x->rss = mv[3];
        }
    for (int r = 0; r < rounds; r++) { /* each round's B against the A right after it (sorts within the round only) */
        const double ta = median(v[0].t + r * steps, steps), ca = median(v[0].c + r * steps, steps);
        v[1].rt[r] = ta > 0 ? median(v[1].t + r * steps, steps) / ta : 0;
        v[1].rc[r] = ca > 0 ? median(v[1].c + r * steps, steps) / ca : 0;
    }
cleanup:
    free(g);
    return err;
}

int ts_cli_bench_step(int argc, char **argv)
{
    int err = 0, nover = 0, steps = 5, warmup = 2, profile = 0, overhead = 0, rounds = 3;
    const char *cfgpath = NULL, *json = NULL, *calib = NULL, *cmp = NULL;
    ck_variant ckv[2];
    memset(ckv, 0, sizeof ckv);
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
        else if (!strcmp(a, "--compare-checkpoint") && i + 1 < argc) cmp = argv[++i];
        else if (!strcmp(a, "--rounds") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1) TS_FAIL(TS_ERR_ARG, "bench step: --rounds '%s' is not a valid count", argv[i]);
            rounds = (int)v;
        }
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
        ts_loss_scaler ls; /* fp16: the initial loss scale, fixed (a speed measurement; no overflow handling) */
        TS_CHECK(ts_loss_scaler_from_config(cfg, u.precision, &ls));
        ts_stepper_set_loss_scale(stepper, ls.scale);
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
    if (cmp) {
        ts_unet_split own;
        memset(&own, 0, sizeof own);
        ts_spatial_split_dims(sp, own.on);
        for (int d = 0; d < 3; d++)
            for (int side = 0; side < 2; side++) own.nbr[d][side] = ts_spatial_neighbor(sp, d, side);
        struct batch_pair cb = {&image, &label};
        int identical = 0;
        double nonzero = 0;
        char na[64], nb[64];
        ckv[0].mask = u.ckpt_levels;
        TS_CHECK(ts_unet_parse_checkpoint_levels(cmp, u.levels, "--compare-checkpoint", &ckv[1].mask));
        TS_CHECK(compare_checkpoint(m, stepper, pipe, &cb, M, (int)batch, box, spn > 1 ? &own : NULL, warmup, steps, rounds,
                                    ckv, &identical, &nonzero));
        ts_unet_checkpoint_str(ckv[0].mask, na, sizeof na);
        ts_unet_checkpoint_str(ckv[1].mask, nb, sizeof nb);
        if (rank == 0) { /* the report */
            double med[2], cpu[2];
            for (int k = 0; k < 2; k++) {
                med[k] = median(ckv[k].t, ckv[k].nt);
                cpu[k] = median(ckv[k].c, ckv[k].nt);
            }
            printf("bench step --compare-checkpoint: %s, %d rank%s = dp %d x pp %d x sp %d (box %lldx%lldx%lld), batch %lld, "
                   "patch %lldx%lldx%lld; model.checkpoint_levels A = %s, B = %s; %d rounds of B then A, %d timed steps each "
                   "after %d warm-up\n",
                   cfgpath, nranks, nranks > 1 ? "s" : "", grid->dp, grid->pp, grid->sp, (long long)box[0], (long long)box[1],
                   (long long)box[2], (long long)batch, (long long)u.patch[0], (long long)u.patch[1], (long long)u.patch[2], na,
                   nb, rounds, steps, warmup);
            for (int k = 0; k < 2; k++)
                printf("  %s levels %-8s median step %.1f ms, CPU %.1f ms (%d steps)   activations %.1f MiB (recompute scratch %.1f MiB; "
                       "memory plan %.1f MiB)   peak RSS %.1f MiB\n", k ? "B" : "A", k ? nb : na, med[k] * 1e3, cpu[k] * 1e3,
                       ckv[k].nt,
                       ckv[k].act / 1048576.0, ckv[k].scratch / 1048576.0, ckv[k].plan / 1048576.0, ckv[k].rss);
            const double tr = med[0] > 0 ? med[1] / med[0] : 0, cr = cpu[0] > 0 ? cpu[1] / cpu[0] : 0, ar = ckv[0].act > 0 ? 1 - ckv[1].act / ckv[0].act : 0,
                         rr = ckv[0].rss > 0 ? 1 - ckv[1].rss / ckv[0].rss : 0;
            printf("  B/A: step time x%.3f (%+.1f%%), CPU time x%.3f (%+.1f%%), activations %+.1f%%, peak RSS %+.1f%%; "
                   "gradients of one step from the same weights %s (%.0f non-zero)\n", tr, 100 * (tr - 1), cr,
                   100 * (cr - 1), -100 * ar, -100 * rr,
                   identical ? "bit-identical" : "DIFFER", nonzero);
            printf("  per round B/A, wall/CPU:");
            for (int r = 0; r < rounds; r++) printf(" %.3f/%.3f", ckv[1].rt[r], ckv[1].rc[r]);
            const double rtr = median(ckv[1].rt, rounds), rcr = median(ckv[1].rc, rounds); /* sorts them */
            printf("; their medians x%.3f wall, x%.3f CPU\n", rtr, rcr);
            if (json) {
                o = cJSON_CreateObject();
                cJSON *c = cJSON_AddObjectToObject(o, "checkpoint_compare");
                cJSON_AddStringToObject(c, "levels_a", na);
                cJSON_AddStringToObject(c, "levels_b", nb);
                cJSON_AddNumberToObject(c, "step_ms_a", med[0] * 1e3);
                cJSON_AddNumberToObject(c, "step_ms_b", med[1] * 1e3);
                cJSON_AddNumberToObject(c, "step_ratio", tr);
                cJSON_AddNumberToObject(c, "cpu_ms_a", cpu[0] * 1e3);
                cJSON_AddNumberToObject(c, "cpu_ms_b", cpu[1] * 1e3);
                cJSON_AddNumberToObject(c, "cpu_ratio", cr);
                cJSON_AddNumberToObject(c, "round_step_ratio", rtr);
                cJSON_AddNumberToObject(c, "round_cpu_ratio", rcr);
                cJSON_AddNumberToObject(c, "act_bytes_a", ckv[0].act);
                cJSON_AddNumberToObject(c, "act_bytes_b", ckv[1].act);
                cJSON_AddNumberToObject(c, "act_reduction", ar);
                cJSON_AddNumberToObject(c, "scratch_bytes_b", ckv[1].scratch);
                cJSON_AddNumberToObject(c, "plan_bytes_a", ckv[0].plan);
                cJSON_AddNumberToObject(c, "plan_bytes_b", ckv[1].plan);
                cJSON_AddNumberToObject(c, "peak_rss_mb_a", ckv[0].rss);
                cJSON_AddNumberToObject(c, "peak_rss_mb_b", ckv[1].rss);
                cJSON_AddNumberToObject(c, "rss_reduction", rr);
                cJSON_AddBoolToObject(c, "grads_identical", identical);
                cJSON_AddNumberToObject(c, "rounds", rounds);
                cJSON_AddNumberToObject(c, "steps", steps);
                cJSON_AddNumberToObject(c, "warmup", warmup);
                cJSON_AddNumberToObject(o, "ranks", nranks);
                cJSON_AddNumberToObject(o, "batch", (double)batch);
                cJSON_AddStringToObject(o, "config", cfgpath);
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
        }
        if (!identical) TS_FAIL(TS_ERR_INTERNAL, "bench step: gradients with model.checkpoint_levels = %s differ from %s", nb, na);
        goto cleanup;
    }
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
    const char *prec = u.precision == TS_PREC_BF16 ? "bf16" : u.precision == TS_PREC_FP16 ? "fp16" : "fp32";
    const char *kern = u.precision == TS_PREC_BF16 ? ts_nn_bf16_isa() : u.precision == TS_PREC_FP16 ? "fp32 on fp16-rounded operands" : "fp32";
    printf("  precision %s (convolution kernels: %s)\n", prec, kern);
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
        cJSON_AddStringToObject(o, "precision", prec);
        cJSON_AddStringToObject(o, "conv_kernels", kern);
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
    for (int k = 0; k < 2; k++) {
        free(ckv[k].t);
        free(ckv[k].c);
        free(ckv[k].rt);
        free(ckv[k].rc);
    }
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
