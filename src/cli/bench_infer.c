/* tessera bench infer CONFIG checkpoint=DIR input=SCAN output=MASK [infer's
 * options] [--repeat R] [--peak] [--json FILE]: the arguments and the report
 * of the inference benchmark; the runs, medians and figures are
 * src/bench/bench_infer.c. */
#include "tsbuild.h"
#include "src/bench/bench_infer.h"
#include "src/cli/cli.h"
#include "src/core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(void)
{
    printf("usage: [mpiexec.mpich -n N] tessera bench infer CONFIG checkpoint=DIR input=SCAN output=MASK.nii.gz\n"
           "                                        [infer's KEY=VALUE options] [section.key=value ...]\n"
           "                                        [--repeat R] [--peak] [--json FILE]\n\n"
           "Runs `tessera infer` (the same arguments: see tessera infer --help) R times (default 3) in one\n"
           "process and times each run whole (from finding the checkpoint to the last file written: the\n"
           "command without the process start and MPI_Init) and in parts on rank 0: set-up (model and\n"
           "checkpoint), reading and normalising the scans, the network's forwards, cutting the windows out\n"
           "and blending their Gaussian-weighted probabilities, the sums over the ranks and the argmax,\n"
           "writing, metrics. Prints each run and the medians; the network's GFLOP/s count the forward's\n"
           "convolution FLOP per window by the cost model (src/model/cost.h) times the windows. --peak first\n"
           "measures the CPU's peaks on every rank at once (`tessera bench peak`, 2 s) and states the\n"
           "network's and the whole run's GFLOP/s as fractions of the peak of the arithmetic that ran (AMX\n"
           "tiles where precision=bf16 ran on AMX, bf16 where on AVX512-BF16, else fp32), summed over the\n"
           "ranks. Threads:\n"
           "OMP_NUM_THREADS. JSON (--json): total_s, setup_s, read_s, predict_s, network_s, blend_s, reduce_s,\n"
           "write_s, metrics_s (medians), totals (every run), windows, forwards, batch, streams,\n"
           "stream_forwards_min and _max (the fewest and most forwards of one stream, last run), precision,\n"
           "flop_per_window, network_gflops, total_gflops, peak_kind, peak_gflops, network_fraction_of_peak,\n"
           "total_fraction_of_peak, ranks, threads, peak_rss_mb, conv_isa, conv, config, input.\n"
           "jobs/bench/compare_infer.sh runs it next to a PyTorch sliding window (docs/performance.md).\n");
}

static void on_run(int i, int repeat, const ts_infer_result *r, void *ctx)
{
    (void)ctx;
    printf("bench infer: run %d/%d: %.3f s (network %.3f s, %lld windows in %lld forwards of %d, %s %s)\n", i + 1,
           repeat, r->total_s, r->network_s, (long long)r->windows, (long long)r->forwards, r->batch, r->precision,
           r->conv);
}

static void report(const char *cfgpath, const char *input, const ts_bench_infer_result *b)
{
    const double *m = b->med;
    const ts_infer_result *r = &b->last;
    printf("bench infer: %s, %s, %d rank%s x %d threads, %d runs (medians)\n", cfgpath, input, b->ranks,
           b->ranks == 1 ? "" : "s", b->threads, b->runs);
    printf("  whole run %.3f s: set-up %.3f, reading %.3f, prediction %.3f (network %.3f, blending %.3f, sums "
           "%.3f), writing %.3f, metrics %.3f\n",
           m[TS_BI_TOTAL], m[TS_BI_SETUP], m[TS_BI_READ], m[TS_BI_PREDICT], m[TS_BI_NETWORK], m[TS_BI_BLEND],
           m[TS_BI_REDUCE], m[TS_BI_WRITE], m[TS_BI_METRICS]);
    printf("  %lld windows, %d per forward, %d stream%s, %s (%s, %s convolutions); %.4g FLOP per window (convolutions, "
           "forward, counted as direct ones), %.4g in all\n",
           (long long)r->windows, r->batch, r->streams, r->streams == 1 ? "" : "s", r->precision, b->conv_isa, r->conv, r->flop_per_window, b->flop);
    printf("  network %.1f GFLOP/s, whole run %.1f GFLOP/s", b->network_gflops, b->total_gflops);
    if (b->peak_gflops > 0)
        printf("; %.3f and %.3f of the measured %s peak (%.1f GFLOP/s over the ranks)", b->network_gflops / b->peak_gflops,
               b->total_gflops / b->peak_gflops, b->peak_kind, b->peak_gflops);
    printf("\n  peak RSS %.1f MiB\n", b->peak_rss_mb);
}

int ts_cli_bench_infer(int argc, char **argv)
{
    int err = 0, lerr = 0, nover = 0;
    const char *cfgpath = NULL, *json = NULL;
    char **over = NULL;
    ts_config *cfg = NULL;
    ts_infer_opts o = {.downsample = 1, .nsd_tol = -1};
    ts_bench_infer_opts bo = {.infer = &o, .repeat = 3, .on_run = on_run};
    ts_bench_infer_result *r = NULL;
    if (ts_cli_wants_help(argc, argv)) {
        if (ts_cli_rank() == 0) help();
        return 0;
    }
    over = calloc((size_t)argc, sizeof *over);
    r = malloc(sizeof *r);
    if (!over || !r) {
        free(over);
        free(r);
        return TS_ERR(TS_ERR_NOMEM, "arguments");
    }
    for (int i = 1; i < argc && !lerr; i++) {
        const char *a = argv[i];
        char *end;
        if (!strcmp(a, "--repeat") && i + 1 < argc) {
            long v = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || v < 1 || v > TS_BENCH_INFER_MAX_REPEAT)
                lerr = TS_ERR(TS_ERR_ARG, "bench infer: --repeat %s must be 1..%d", argv[i], TS_BENCH_INFER_MAX_REPEAT);
            bo.repeat = (int)v;
        } else if (!strcmp(a, "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(a, "--peak")) bo.peak = 1;
        else if (!ts_cli_infer_opt(a, &o, &lerr)) continue;
        else if (a[0] != '-' && strchr(a, '=')) over[nover++] = argv[i];
        else if (!cfgpath && a[0] != '-') cfgpath = a;
        else lerr = TS_ERR(TS_ERR_ARG, "bench infer: unexpected argument '%s' (see tessera bench infer --help)", a);
    }
    if (!lerr && (!cfgpath || !o.checkpoint || !o.input || !o.output))
        lerr = TS_ERR(TS_ERR_ARG, "bench infer: CONFIG, checkpoint=, input= and output= are required (see --help)");
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    TS_CHECK(ts_cli_load_config(cfgpath, nover, over, MPI_COMM_WORLD, &cfg));
    TS_CHECK(ts_bench_infer_run(cfg, MPI_COMM_WORLD, &bo, r));
    if (ts_cli_rank() == 0) {
        report(cfgpath, o.input, r);
        if (json) lerr = ts_bench_infer_write_json(json, r, cfgpath, o.input);
    }
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
cleanup:
    ts_config_destroy(&cfg);
    free(r);
    free(over);
    return err;
}
