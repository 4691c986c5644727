/* tessera bench step: the arguments and the report of the step benchmark;
 * the measurement, the calibration file and the JSON are
 * src/bench/bench_step.c. */
#include "tsbuild.h"
#include "src/cli/cli.h"
#include "src/bench/bench_layouts.h"
#include "src/bench/bench_step.h"
#include "src/cli/engine.h"
#include "src/core/error.h"
#include "src/model/unet.h"
#include "src/parallel/spatial.h"
#include "src/train/trainer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(void)
{
    printf("usage: tessera bench step CONFIG [section.key=value ...] [--steps N] [--warmup W] [--json FILE]\n"
           "                          [--profile] [--peak] [--calibrate FILE] [--perf-overhead]\n"
           "                          [--compare-checkpoint LEVELS [--rounds R]]\n\n"
           "Times N (default 5) full training steps - forward, loss, backward, optimizer step - after W\n"
           "(default 2) warm-up steps, on random data (normal images, uniform labels) of data.patch and\n"
           "train.batch, with the config's model, loss and optimizer. Threads: OMP_NUM_THREADS (default: all\n"
           "cores). Prints samples/s, voxels/s, the mean step time and its phases, and the peak resident\n"
           "memory of the process; --json writes samples_per_s, voxels_per_s, step_ms, ranks, threads,\n"
           "config, peak_rss_mb, forward_ms, backward_ms, optimizer_ms, cpu_ms (process CPU time per step),\n"
           "precision, engine, conv_kernels (train.precision, train.engine and the convolution kernels that\n"
           "ran), state (cpu; host: the GPU engine with the host's master copy; gpu: parameters, gradients\n"
           "and optimizer state on the GPU, TESSERA_CUDA_STATE=device, docs/gpu.md), flop_per_step and gflops (the model's convolution FLOP per step over all replicas, by the\n"
           "analytic cost model src/model/cost.h; a checkpointed level's recomputation not counted), batch,\n"
           "patch. --peak first measures the CPU's peaks on every rank at once (`tessera bench peak`, 2 s)\n"
           "and adds peak_kind (fp32; bf16 where bf16 ran on AVX512-BF16; amx on AMX tiles), peak_gflops (summed over the\n"
           "ranks), fraction_of_peak and peak_triad_GBps. --profile adds a table per kind of layer (rank 0;\n"
           "on the GPU engine each layer call then waits for the GPU, so the times are the device's):\n"
           "ms per step, GFLOP and MB by the cost model (recomputation included), GFLOP/s, GB/s and, with\n"
           "--peak, the bound (compute where a convolution's FLOP per byte exceed the peak FLOP/s over the\n"
           "triad GB/s, else memory) and the fraction of that roof; the optimizer and the sum against the\n"
           "step time (JSON: profile [kind, ms, flop, bytes, gflops, GBps, bound, fraction_of_roof],\n"
           "profile_optimizer_ms, profile_sum_ms, profile_sum_over_step). --calibrate FILE writes the rates of\n"
           "every layer kind (work from the model's analytic cost over the measured time), the optimizer's\n"
           "time per parameter and the activation bytes per element, for `tessera plan --calib FILE`\n"
           "(measure on one rank, with the threads per rank the plan assumes; there it also runs the boxes\n"
           "of parallel.sp = 2, 4 and 8 as patches, N steps each, and writes their rates as \"boxes\"). --perf-overhead alternates\n"
           "steps with the per-phase timers and counters of `tessera train` (perf.papi_events, default the\n"
           "software counters) and steps without, and reports both medians and their ratio.\n"
           "On N ranks (mpiexec -n N) the steps run on the grid `tessera train` would use: parallel.dp\n"
           "replicas x parallel.pp pipeline stages x parallel.sp spatial pieces (parallel.sp_dims,\n"
           "parallel.microbatches, parallel.schedule, parallel.pp_cut). Each replica trains its own batch\n"
           "(parallel.microbatches micro-batches of train.batch through the pipeline, train.accum without\n"
           "one), each spatial group splits every sample's volume (halo exchange); gradient buckets are\n"
           "reduced while backward runs on the gradient path train takes (parallel.bucket_mb, model.sync_bn;\n"
           "compressed with parallel.compress; reduce-scattered, the shards stepped and the parameters\n"
           "all-gathered with parallel.zero = 1; with parallel.local_steps = H the parameters averaged over\n"
           "the replicas every H steps, inside the timed step), with train's refusals. The JSON's grad_path\n"
           "has kind (plain, compress, zero, local), local_steps, local_sgd, parameter_averages and\n"
           "param_average_ms (per timed step), compress, reduced_steps, compressed_steps, bytes_per_step and\n"
           "bytes_per_step_fp32 (one rank's gradient messages, as run and as float32). samples/s counts all replicas' samples over the slowest\n"
           "rank's time; comm_exposed_ms / comm_total_ms give the gradient communication not hidden / in\n"
           "total, halo_exposed_ms / halo_hidden_ms the halo exchange. The JSON also has grid {dp, pp, sp},\n"
           "sp_dims, box, act_bytes (the model's activations, gradients and halo faces per rank, largest\n"
           "over ranks), plan_mb (the memory plan of run.mem_limit_mb), arena_mb (parameters, gradients and\n"
           "this rank's optimizer state), peak_rss_mb and, with a pipeline,\n"
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

static void report_compare(const char *cfgpath, const ts_bench_step_result *r)
{
    const ts_bench_step_compare *c = &r->cmp;
    printf("bench step --compare-checkpoint: %s, %d rank%s = dp %d x pp %d x sp %d (box %lldx%lldx%lld), batch %lld, "
           "patch %lldx%lldx%lld; model.checkpoint_levels A = %s, B = %s; %d rounds of B then A, %d timed steps each "
           "after %d warm-up\n",
           cfgpath, r->ranks, r->ranks > 1 ? "s" : "", r->dp, r->pp, r->sp, (long long)r->box[0], (long long)r->box[1],
           (long long)r->box[2], (long long)r->batch, (long long)r->patch[0], (long long)r->patch[1],
           (long long)r->patch[2], c->levels[0], c->levels[1], c->rounds, r->steps, r->warmup);
    for (int k = 0; k < 2; k++)
        printf("  %s levels %-8s median step %.1f ms, CPU %.1f ms (%d steps)   activations %.1f MiB (recompute scratch %.1f MiB; "
               "memory plan %.1f MiB)   peak RSS %.1f MiB\n", k ? "B" : "A", c->levels[k], c->step_s[k] * 1e3,
               c->cpu_s[k] * 1e3, c->nt[k], c->act[k] / 1048576.0, c->scratch[k] / 1048576.0, c->plan[k] / 1048576.0,
               c->rss_mb[k]);
    const double tr = c->step_ratio, cr = c->cpu_ratio;
    printf("  B/A: step time x%.3f (%+.1f%%), CPU time x%.3f (%+.1f%%), activations %+.1f%%, peak RSS %+.1f%%; "
           "gradients of one step from the same weights %s (%.0f non-zero)\n", tr, 100 * (tr - 1), cr,
           100 * (cr - 1), -100 * c->act_reduction, -100 * c->rss_reduction,
           c->identical ? "bit-identical" : "DIFFER", c->nonzero);
    printf("  per round B/A, wall/CPU:");
    for (int k = 0; k < c->rounds; k++) printf(" %.3f/%.3f", c->round_step_ratio[k], c->round_cpu_ratio[k]);
    printf("; their medians x%.3f wall, x%.3f CPU\n", c->round_step_median, c->round_cpu_median);
}

static void report_pipeline(const ts_bench_step_result *r)
{
    printf("  pipeline: %d stages, %d micro-batches, %s; bubble formula (P-1)/(M+P-1) = %.3f\n", r->pp, r->micro,
           r->schedule, r->bubble_formula);
    for (int k = 0; k < r->pp; k++) {
        const ts_bench_step_stage *v = &r->stages[k];
        const double idle = v->span_s - v->busy_s;
        printf("  stage %d (%s): busy %.1f ms, span %.1f ms, idle %.1f ms, bubble %.3f; %d slot%s x %.1f MiB in "
               "flight, activations %.1f MiB\n", k, v->units, v->busy_s * 1e3, v->span_s * 1e3, idle * 1e3,
               v->span_s > 0 ? idle / v->span_s : 0, (int)v->slots, v->slots > 1 ? "s" : "", v->slot_bytes / 1048576.0,
               v->act_bytes / 1048576.0);
    }
}

/* --profile: the roofline table of this rank (rank 0) */
static void report_profile(const ts_bench_step_result *r)
{
    printf("  per step on rank 0, by kind of layer (FLOP and bytes: the cost model, src/model/cost.h)%s:\n"
           "    %-17s %9s %10s %9s %9s %8s %-8s %s\n", r->peak_gflops > 0 ? "" : " (--peak for the bounds)", "kind",
           "ms", "GFLOP", "MB", "GFLOP/s", "GB/s", "bound", "of its roof");
    double sum = r->optimizer_s;
    for (int k = 0; k < TS_PROF_COUNT; k++) {
        double gf, gb, fr;
        const char *bound;
        ts_bench_step_roof(r, k, &gf, &gb, &bound, &fr);
        printf("    %-17s %9.1f %10.2f %9.1f %9.1f %8.1f %-8s %.3f\n", ts_unet_prof_name(k), r->prof[k] * 1e3,
               r->prof_flop[k] / 1e9, r->prof_bytes[k] / 1e6, gf, gb, bound, fr);
        sum += r->prof[k];
    }
    printf("    %-17s %9.1f\n    %-17s %9.1f ms = %.3f of the step (%.1f ms; the rest is untimed: batch set-up, "
           "gradient hooks)\n", "optimizer", r->optimizer_s * 1e3, "sum", sum * 1e3, sum / r->step_s, r->step_s * 1e3);
    if (strstr(r->kernels, "winograd"))
        printf("    (train.conv = winograd: the conv kinds count the direct convolutions' FLOP; their Winograd layers "
               "multiply 64/216 of that, so their fraction of the roof can pass 1)\n");
}

static void report(const char *cfgpath, const ts_bench_step_opts *o, const ts_bench_step_result *r)
{
    const int steps = r->steps;
    printf("bench step: %s, %d rank%s = dp %d x pp %d x sp %d (sp_dims %dx%dx%d, box %lldx%lldx%lld), batch %lld x %d "
           "micro-batch%s per replica, patch %lldx%lldx%lld, %d thread%s per rank, %d steps after %d warm-up\n",
           cfgpath, r->ranks, r->ranks > 1 ? "s" : "", r->dp, r->pp, r->sp, r->dims[0], r->dims[1], r->dims[2],
           (long long)r->box[0], (long long)r->box[1], (long long)r->box[2], (long long)r->batch, r->micro,
           r->micro > 1 ? "es" : "", (long long)r->patch[0], (long long)r->patch[1], (long long)r->patch[2], r->threads,
           r->threads > 1 ? "s" : "", steps, r->warmup);
    printf("  samples/s %.3f   voxels/s %.4g   step %.1f ms (best %.1f)   forward+loss %.1f  backward %.1f  "
           "optimizer %.1f ms\n", r->samples_per_s, r->voxels_per_s, r->step_s * 1e3, r->best_s * 1e3,
           r->forward_s * 1e3, r->backward_s * 1e3, r->optimizer_s * 1e3);
    printf("  process CPU time %.1f ms per step (%.2f cores busy)\n", r->cpu_s * 1e3, r->cores_busy);
    printf("  precision %s, engine %s (convolution kernels: %s)%s\n", r->precision, r->engine, r->kernels,
           !strcmp(r->state, "gpu") ? "; parameters, gradients and optimizer state on the GPU" : "");
    printf("  %.1f GFLOP/s (the model's %.4g FLOP per step: convolutions, forward and backward)", r->gflops, r->flops);
    if (r->peak_gflops > 0)
        printf(", %.3f of the measured %s peak (%.1f GFLOP/s over the ranks; triad %.1f GB/s)", r->gflops / r->peak_gflops,
               r->peak_kind, r->peak_gflops, r->peak_triad_GBps);
    printf("\n");
    if (r->peak_gflops > 0 && r->gflops > r->peak_gflops && !strcmp(r->engine, "cpu") && !strstr(r->kernels, "winograd"))
        printf("  note: direct convolutions faster than the measured peak: the probe ran while something else held a "
               "CPU (another process, or the hypervisor); rerun for a fraction\n");
    if (r->stages) report_pipeline(r);
    if (r->sp > 1)
        printf("  halo exchange per step: %.1f ms exposed, %.1f ms hidden by compute; spatial sums %.1f ms (largest "
               "over ranks)\n", r->halo_exposed_s * 1e3, r->halo_hidden_s * 1e3, r->spatial_sums_s * 1e3);
    if (r->ranks > 1)
        printf("  gradient communication per step: %.1f ms on the progress thread, %.1f ms not hidden by backward "
               "(rank 0, %d bucket%s)\n", r->comm_total_s * 1e3, r->comm_exposed_s * 1e3, r->buckets,
               r->buckets > 1 ? "s" : "");
    if (r->ranks > 1 && !strcmp(r->grad_path, "local"))
        printf("  gradient path: local SGD (parallel.local_steps = %d, parallel.local_sgd = %s): %lld parameter "
               "average%s in the timed steps, %.1f ms per step\n", r->local_steps, r->local_sgd,
               (long long)r->param_averages, r->param_averages == 1 ? "" : "s", r->param_average_s * 1e3);
    else if (r->ranks > 1)
        printf("  gradient path: %s%s%s%s, %lld of %lld steps compressed; %.3f MB sent per rank and step (%.3f MB as "
               "float32)\n", r->grad_path, strcmp(r->compress, "none") ? " (" : "", strcmp(r->compress, "none") ?
               r->compress : "", strcmp(r->compress, "none") ? ")" : "", (long long)r->compressed_steps,
               (long long)r->reduced_steps, r->grad_bytes / 1e6, r->grad_bytes_fp32 / 1e6);
    if (r->overhead)
        printf("  perf overhead: median step %.2f ms with timers and counters (%d steps), %.2f ms without (%d steps): "
               "ratio %.4f\n  %.1f phase brackets per step x %.2f us each = %.3f ms per step, %.3f%% of the step (%s)\n",
               r->perf_on_s * 1e3, r->perf_on_n, r->perf_off_s * 1e3, r->perf_off_n, r->perf_ratio, r->brackets_per_step,
               r->pair_s * 1e6, r->brackets_per_step * r->pair_s * 1e3, 100 * r->brackets_per_step * r->pair_s / r->perf_off_s,
               r->perf_what);
    if (o->calibrate)
        printf("  calibration for tessera plan written to %s%s\n", o->calibrate,
               r->ranks > 1 ? " (measured with other ranks sharing the node: calibrate on one rank for plan)" : "");
    if (o->profile) report_profile(r);
    printf("  peak RSS %.1f MiB (activations and gradients %.1f MiB per rank at most, arena %.1f MiB; memory plan "
           "%.0f MiB), loss %.4f\n", r->rss_mb, r->act_bytes / 1048576.0, r->arena_mb, r->plan_mb, r->loss);
}

typedef struct layouts_arg {
    const char *list;  /* --layouts */
    const char *calib; /* --calib */
} layouts_arg;

static void report_layouts(const char *cfgpath, const ts_bench_layouts_result *r)
{
    printf("bench step --layouts: %s, %d node(s) x %d rank(s), global batch %d held; predictions from %s\n", cfgpath,
           r->choice.nodes, r->choice.ranks_per_node, r->choice.global_batch, r->choice.calib);
    printf("  %-18s %9s %6s %12s %12s %6s\n", "layout", "batch/rep", "micro", "predicted ms", "measured ms", "rank");
    for (int i = 0; i < r->n; i++) {
        const ts_bench_layout_row *w = &r->rows[i];
        char name[64];
        snprintf(name, sizeof name, "dp %d x pp %d x sp %d", w->plan.dp, w->plan.pp, w->plan.sp);
        printf("  %-18s %9d %6d %8.1f (%d) %12.1f %6d%s\n", name, w->plan.batch, w->plan.micro, w->plan.step_s * 1e3,
               w->predicted_rank, w->step_s * 1e3, w->measured_rank,
               i == r->chosen ? "   <- parallel.layout = auto" : "");
    }
    const ts_plan_layout *c = &r->rows[r->chosen].plan, *f = &r->rows[r->fastest].plan;
    printf("  %d layout(s) predicted within parallel.layout_tie = %g of the fastest prediction; auto's choice among them "
           "(the fastest measured) dp %d x pp %d x sp %d measured %.3fx the fastest (dp %d x pp %d x sp %d)\n", r->tied,
           r->choice.tie, c->dp, c->pp, c->sp, r->chosen_over_best, f->dp, f->pp, f->sp);
}

static int parse(int argc, char **argv, ts_bench_step_opts *o, const char **cfgpath, char **over, int *nover,
                 const char **json, layouts_arg *la)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "--steps") || !strcmp(a, "--warmup")) && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < (a[2] == 's' ? 1 : 0))
                return TS_ERR(TS_ERR_ARG, "bench step: %s '%s' is not a valid count", a, argv[i]);
            if (a[2] == 's') o->steps = (int)v;
            else o->warmup = (int)v;
        } else if (!strcmp(a, "--json") && i + 1 < argc) *json = argv[++i];
        else if (!strcmp(a, "--profile")) o->profile = 1;
        else if (!strcmp(a, "--peak")) o->peak = 1;
        else if (!strcmp(a, "--calibrate") && i + 1 < argc) o->calibrate = argv[++i];
        else if (!strcmp(a, "--perf-overhead")) o->overhead = 1;
        else if (!strcmp(a, "--compare-checkpoint") && i + 1 < argc) o->compare = argv[++i];
        else if (!strcmp(a, "--layouts") && i + 1 < argc) la->list = argv[++i];
        else if (!strcmp(a, "--calib") && i + 1 < argc) la->calib = argv[++i];
        else if (!strcmp(a, "--rounds") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1) return TS_ERR(TS_ERR_ARG, "bench step: --rounds '%s' is not a valid count", argv[i]);
            o->rounds = (int)v;
        }
        else if (strchr(a, '=') && a[0] != '-') over[(*nover)++] = argv[i];
        else if (!*cfgpath && a[0] != '-') *cfgpath = a;
        else return TS_ERR(TS_ERR_ARG, "bench step: unexpected argument '%s' (see --help)", a);
    }
    if (!*cfgpath) return TS_ERR(TS_ERR_ARG, "bench step: no CONFIG given");
    return 0;
}

/* --calibrate on one rank: the config's patch (done), then the boxes of
 * sp = 2, 4 and 8 (parallel.sp_dims = auto) as patches of their own, so that
 * plan has the rates of the small boxes strong scaling makes; rank 0
 * writes them all. On more ranks: the run's box only. */
static int calibrate_boxes(ts_config *cfg, const ts_bench_step_opts *o, ts_bench_step_result *r)
{
    int err = 0, size;
    ts_unet_cfg u;
    ts_plan_calib cal = r->cal;
    ts_bench_step_result rb;
    memset(&rb, 0, sizeof rb);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    TS_CHECK(ts_unet_cfg_from_config(cfg, &u));
    if (size == 1) {
        ts_plan_calib_add_box(&cal, &r->cal, u.patch);
        for (int sp = 2; sp <= 8; sp *= 2) {
            int dims[3];
            if (ts_spatial_plan(sp, "auto", u.patch, u.levels, dims)) {
                ts_err_clear(); /* the patch cannot be split that far: the boxes stop here */
                break;
            }
            int64_t box[3];
            char v[96];
            for (int d = 0; d < 3; d++) box[d] = u.patch[d] / dims[d];
            snprintf(v, sizeof v, "%lld,%lld,%lld", (long long)box[0], (long long)box[1], (long long)box[2]);
            TS_CHECK(ts_config_set(cfg, "data.patch", v, "bench step --calibrate"));
            ts_bench_step_opts ob = *o;
            ob.overhead = 0;
            TS_CHECK(ts_bench_step_run(MPI_COMM_WORLD, cfg, &ob, &rb));
            ts_plan_calib_add_box(&cal, &rb.cal, box);
            printf("  calibration: box %s (the box of sp %d) step %.1f ms, conv forward %.3g work/s (patch: %.3g)\n", v,
                   sp, rb.step_s * 1e3, rb.cal.rate[TS_PROF_CONV_FWD], r->cal.rate[TS_PROF_CONV_FWD]);
            ts_bench_step_result_free(&rb);
        }
    }
    TS_CHECK(ts_plan_calib_write(o->calibrate, &cal));
cleanup:
    ts_bench_step_result_free(&rb);
    return err;
}

int ts_cli_bench_step(int argc, char **argv)
{
    int err = 0, nover = 0, lerr = 0;
    const char *cfgpath = NULL, *json = NULL;
    ts_bench_step_opts o = {.steps = 5, .warmup = 2, .rounds = 3};
    layouts_arg la = {NULL, NULL};
    ts_bench_step_result r;
    char **over = calloc((size_t)argc + 1, sizeof *over);
    ts_config *cfg = NULL;
    memset(&r, 0, sizeof r);
    if (!over) TS_FAIL(TS_ERR_NOMEM, "arguments");
    if (ts_cli_wants_help(argc, argv)) {
        if (ts_cli_rank() == 0) help();
        goto cleanup;
    }
    TS_CHECK(parse(argc, argv, &o, &cfgpath, over, &nover, &json, &la));
    o.rss0_mb = ts_train_rss_mb();
    TS_CHECK(ts_cli_load_config(cfgpath, nover, over, MPI_COMM_WORLD, &cfg));
    if (la.list) {
        if (o.compare || o.calibrate)
            TS_FAIL(TS_ERR_ARG, "bench step: --layouts measures layouts side by side; it does not combine with "
                    "--compare-checkpoint or --calibrate");
        ts_bench_layouts_result lr;
        err = ts_bench_step_layouts(MPI_COMM_WORLD, cfg, &o, la.list, la.calib, &lr);
        if (!err && ts_cli_rank() == 0) {
            report_layouts(cfgpath, &lr);
            if (json) lerr = ts_bench_layouts_write_json(json, &lr, cfgpath);
        }
        ts_bench_layouts_free(&lr);
        TS_CHECK(err);
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
        goto cleanup;
    }
    TS_CHECK(ts_bench_step_run(MPI_COMM_WORLD, cfg, &o, &r));
    if (ts_cli_rank() == 0) {
        if (r.compared) report_compare(cfgpath, &r);
        else report(cfgpath, &o, &r);
        if (json) lerr = ts_bench_step_write_json(json, &r, cfgpath);
        if (!lerr && o.calibrate && !r.compared) lerr = calibrate_boxes(cfg, &o, &r);
    }
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    TS_CHECK(ts_bench_step_verdict(&r));
cleanup:
    ts_bench_step_result_free(&r);
    ts_config_destroy(&cfg);
    free(over);
    return err;
}
