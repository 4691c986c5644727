/* tessera bench infer CONFIG checkpoint=DIR input=SCAN output=MASK [infer's
 * options] [--repeat R] [--peak] [--json FILE]: `tessera infer` run R
 * times in one process (ts_infer_run, src/infer/infer.h), the whole run and
 * its parts timed, the network's GFLOP/s against the CPU's measured peak. */
#include "tsbuild.h"
#include "src/bench/bench_json.h"
#include "src/bench/bench_peak.h"
#include "src/cli/cli.h"
#include "src/core/error.h"
#include "src/infer/infer.h"
#include "src/nn/layers.h"
#include "src/train/trainer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAX_REPEAT 100

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
           "network's and the whole run's GFLOP/s as fractions of the peak of the arithmetic that ran (bf16\n"
           "where precision=bf16 ran on AVX512-BF16, else fp32), summed over the ranks. Threads:\n"
           "OMP_NUM_THREADS. JSON (--json): total_s, setup_s, read_s, predict_s, network_s, blend_s, reduce_s,\n"
           "write_s, metrics_s (medians), totals (every run), windows, forwards, batch, precision,\n"
           "flop_per_window, network_gflops, total_gflops, peak_kind, peak_gflops, network_fraction_of_peak,\n"
           "total_fraction_of_peak, ranks, threads, peak_rss_mb, conv_isa, config, input.\n"
           "jobs/bench/compare_infer.sh runs it next to a PyTorch sliding window (docs/performance.md).\n");
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
    double s[MAX_REPEAT];
    memcpy(s, v, sizeof *v * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* the parts of a run, in the order of ts_infer_result and the JSON */
enum { P_TOTAL, P_SETUP, P_READ, P_PREDICT, P_NETWORK, P_BLEND, P_REDUCE, P_WRITE, P_METRICS, P_COUNT };
static const char *const part_name[P_COUNT] = {"total_s",   "setup_s", "read_s",  "predict_s", "network_s",
                                               "blend_s",   "reduce_s", "write_s", "metrics_s"};

static void parts_of(const ts_infer_result *r, double *p)
{
    p[P_TOTAL] = r->total_s;
    p[P_SETUP] = r->setup_s;
    p[P_READ] = r->read_s;
    p[P_PREDICT] = r->predict_s;
    p[P_NETWORK] = r->network_s;
    p[P_BLEND] = r->blend_s;
    p[P_REDUCE] = r->reduce_s;
    p[P_WRITE] = r->write_s;
    p[P_METRICS] = r->metrics_s;
}

typedef struct figures {
    double med[P_COUNT], totals[MAX_REPEAT];
    int runs, ranks, threads;
    double flop, net_gflops, total_gflops, peak_gflops, rss_mb;
    const char *peak_kind;
} figures;

static int write_json(const char *path, const figures *f, const ts_infer_result *r, const char *cfgpath,
                      const char *input)
{
    cJSON *o = cJSON_CreateObject(), *t = o ? cJSON_AddArrayToObject(o, "totals") : NULL;
    if (!t) {
        cJSON_Delete(o);
        return TS_ERR(TS_ERR_NOMEM, "bench infer: --json %s", path);
    }
    cJSON_AddStringToObject(o, "config", cfgpath);
    cJSON_AddStringToObject(o, "input", input);
    for (int k = 0; k < P_COUNT; k++) cJSON_AddNumberToObject(o, part_name[k], f->med[k]);
    for (int i = 0; i < f->runs; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(f->totals[i]));
    cJSON_AddNumberToObject(o, "windows", (double)r->windows);
    cJSON_AddNumberToObject(o, "forwards", (double)r->forwards);
    cJSON_AddNumberToObject(o, "batch", r->batch);
    cJSON_AddStringToObject(o, "precision", r->precision);
    cJSON_AddStringToObject(o, "conv_isa", !strcmp(r->precision, "bf16") ? ts_nn_bf16_isa() : "fp32");
    cJSON_AddNumberToObject(o, "flop_per_window", r->flop_per_window);
    cJSON_AddNumberToObject(o, "network_gflops", f->net_gflops);
    cJSON_AddNumberToObject(o, "total_gflops", f->total_gflops);
    if (f->peak_gflops > 0) {
        cJSON_AddStringToObject(o, "peak_kind", f->peak_kind);
        cJSON_AddNumberToObject(o, "peak_gflops", f->peak_gflops);
        cJSON_AddNumberToObject(o, "network_fraction_of_peak", f->net_gflops / f->peak_gflops);
        cJSON_AddNumberToObject(o, "total_fraction_of_peak", f->total_gflops / f->peak_gflops);
    }
    cJSON_AddNumberToObject(o, "ranks", f->ranks);
    cJSON_AddNumberToObject(o, "threads", f->threads);
    cJSON_AddNumberToObject(o, "peak_rss_mb", f->rss_mb);
    return ts_bench_json_write(o, path, "bench infer");
}

int ts_cli_bench_infer(int argc, char **argv)
{
    int err = 0, lerr = 0, nover = 0, repeat = 3, peak = 0;
    const char *cfgpath = NULL, *json = NULL;
    char **over = NULL;
    ts_config *cfg = NULL;
    ts_infer_opts o = {.downsample = 1, .nsd_tol = -1};
    ts_infer_result *r = NULL;
    figures f;
    memset(&f, 0, sizeof f);
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
            if (*end || end == argv[i] || v < 1 || v > MAX_REPEAT)
                lerr = TS_ERR(TS_ERR_ARG, "bench infer: --repeat %s must be 1..%d", argv[i], MAX_REPEAT);
            repeat = (int)v;
        } else if (!strcmp(a, "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(a, "--peak")) peak = 1;
        else if (!ts_cli_infer_opt(a, &o, &lerr)) continue;
        else if (a[0] != '-' && strchr(a, '=')) over[nover++] = argv[i];
        else if (!cfgpath && a[0] != '-') cfgpath = a;
        else lerr = TS_ERR(TS_ERR_ARG, "bench infer: unexpected argument '%s' (see tessera bench infer --help)", a);
    }
    if (!lerr && (!cfgpath || !o.checkpoint || !o.input || !o.output))
        lerr = TS_ERR(TS_ERR_ARG, "bench infer: CONFIG, checkpoint=, input= and output= are required (see --help)");
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    TS_CHECK(ts_cli_load_config(cfgpath, nover, over, MPI_COMM_WORLD, &cfg));
    f.ranks = ts_cli_size();
#ifdef _OPENMP
    f.threads = omp_get_max_threads();
#else
    f.threads = 1;
#endif
    ts_bench_peak_result pr;
    memset(&pr, 0, sizeof pr);
    if (peak) TS_CHECK(ts_bench_peak_run(MPI_COMM_WORLD, f.threads, 2.0, &pr));
    double parts[MAX_REPEAT][P_COUNT], col[MAX_REPEAT];
    for (int i = 0; i < repeat; i++) {
        TS_CHECK(ts_infer_run(cfg, MPI_COMM_WORLD, &o, r));
        parts_of(r, parts[i]);
        f.totals[i] = parts[i][P_TOTAL];
        if (ts_cli_rank() == 0)
            printf("bench infer: run %d/%d: %.3f s (network %.3f s, %lld windows in %lld forwards of %d, %s)\n", i + 1,
                   repeat, r->total_s, r->network_s, (long long)r->windows, (long long)r->forwards, r->batch,
                   r->precision);
    }
    f.runs = repeat;
    for (int k = 0; k < P_COUNT; k++) {
        for (int i = 0; i < repeat; i++) col[i] = parts[i][k];
        f.med[k] = median(col, repeat);
    }
    f.flop = r->flop_per_window * (double)r->windows;
    f.net_gflops = f.med[P_NETWORK] > 0 ? f.flop / f.med[P_NETWORK] / 1e9 : 0;
    f.total_gflops = f.med[P_TOTAL] > 0 ? f.flop / f.med[P_TOTAL] / 1e9 : 0;
    f.rss_mb = ts_train_peak_rss_mb();
    if (peak) {
        const int bf16 = !strcmp(r->precision, "bf16") && !strcmp(ts_nn_bf16_isa(), "avx512bf16");
        f.peak_gflops = bf16 ? pr.sum_bf16_gflops : pr.sum_fp32_gflops;
        f.peak_kind = bf16 ? "bf16" : "fp32";
    }
    if (ts_cli_rank() == 0) {
        printf("bench infer: %s, %s, %d rank%s x %d threads, %d runs (medians)\n", cfgpath, o.input, f.ranks,
               f.ranks == 1 ? "" : "s", f.threads, repeat);
        printf("  whole run %.3f s: set-up %.3f, reading %.3f, prediction %.3f (network %.3f, blending %.3f, sums "
               "%.3f), writing %.3f, metrics %.3f\n",
               f.med[P_TOTAL], f.med[P_SETUP], f.med[P_READ], f.med[P_PREDICT], f.med[P_NETWORK], f.med[P_BLEND],
               f.med[P_REDUCE], f.med[P_WRITE], f.med[P_METRICS]);
        printf("  %lld windows, %d per forward, %s; %.4g FLOP per window (convolutions, forward), %.4g in all\n",
               (long long)r->windows, r->batch, r->precision, r->flop_per_window, f.flop);
        printf("  network %.1f GFLOP/s, whole run %.1f GFLOP/s", f.net_gflops, f.total_gflops);
        if (f.peak_gflops > 0)
            printf("; %.3f and %.3f of the measured %s peak (%.1f GFLOP/s over the ranks)", f.net_gflops / f.peak_gflops,
                   f.total_gflops / f.peak_gflops, f.peak_kind, f.peak_gflops);
        printf("\n  peak RSS %.1f MiB\n", f.rss_mb);
        if (json) lerr = write_json(json, &f, r, cfgpath, o.input);
    }
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
cleanup:
    ts_config_destroy(&cfg);
    free(r);
    free(over);
    return err;
}
