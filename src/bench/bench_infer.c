/* The inference benchmark; see bench_infer.h. Owns the repetition, the
 * medians and the figures; the runs are ts_infer_run's. */
#include "tsbuild.h"
#include "src/bench/bench_infer.h"
#include "src/bench/bench_json.h"
#include "src/bench/bench_peak.h"
#include "src/core/error.h"
#include "src/nn/layers.h"
#include "src/train/trainer.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

const char *const ts_bench_infer_part_name[TS_BI_PARTS] = {"total_s",  "setup_s",  "read_s",  "predict_s", "network_s",
                                                           "blend_s",  "reduce_s", "write_s", "metrics_s"};

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
    double s[TS_BENCH_INFER_MAX_REPEAT];
    memcpy(s, v, sizeof *v * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static void parts_of(const ts_infer_result *r, double *p)
{
    p[TS_BI_TOTAL] = r->total_s;
    p[TS_BI_SETUP] = r->setup_s;
    p[TS_BI_READ] = r->read_s;
    p[TS_BI_PREDICT] = r->predict_s;
    p[TS_BI_NETWORK] = r->network_s;
    p[TS_BI_BLEND] = r->blend_s;
    p[TS_BI_REDUCE] = r->reduce_s;
    p[TS_BI_WRITE] = r->write_s;
    p[TS_BI_METRICS] = r->metrics_s;
}

int ts_bench_infer_run(const ts_config *cfg, MPI_Comm comm, const ts_bench_infer_opts *o, ts_bench_infer_result *r)
{
    int rank = 0;
    memset(r, 0, sizeof *r);
    if (o->repeat < 1 || o->repeat > TS_BENCH_INFER_MAX_REPEAT)
        return TS_ERR(TS_ERR_ARG, "bench infer: --repeat %d must be 1..%d", o->repeat, TS_BENCH_INFER_MAX_REPEAT);
    TS_MPI_TRY(MPI_Comm_rank(comm, &rank));
    TS_MPI_TRY(MPI_Comm_size(comm, &r->ranks));
#ifdef _OPENMP
    r->threads = omp_get_max_threads();
#else
    r->threads = 1;
#endif
    ts_bench_peak_result pr;
    memset(&pr, 0, sizeof pr);
    if (o->peak) TS_TRY(ts_bench_peak_run(comm, r->threads, 2.0, &pr));
    double parts[TS_BENCH_INFER_MAX_REPEAT][TS_BI_PARTS], col[TS_BENCH_INFER_MAX_REPEAT];
    for (int i = 0; i < o->repeat; i++) {
        TS_TRY(ts_infer_run(cfg, comm, o->infer, &r->last));
        parts_of(&r->last, parts[i]);
        r->totals[i] = parts[i][TS_BI_TOTAL];
        if (rank == 0 && o->on_run) o->on_run(i, o->repeat, &r->last, o->ctx);
    }
    r->runs = o->repeat;
    for (int k = 0; k < TS_BI_PARTS; k++) {
        for (int i = 0; i < o->repeat; i++) col[i] = parts[i][k];
        r->med[k] = median(col, o->repeat);
    }
    const ts_infer_result *l = &r->last;
    r->flop = l->flop_per_window * (double)l->windows;
    r->network_gflops = r->med[TS_BI_NETWORK] > 0 ? r->flop / r->med[TS_BI_NETWORK] / 1e9 : 0;
    r->total_gflops = r->med[TS_BI_TOTAL] > 0 ? r->flop / r->med[TS_BI_TOTAL] / 1e9 : 0;
    r->peak_rss_mb = ts_train_peak_rss_mb();
    const int bf16 = !strcmp(l->precision, "bf16");
    r->conv_isa = bf16 ? ts_nn_bf16_isa() : "fp32";
    if (o->peak) {
        /* the peak of the instructions the gathers ran: AMX tiles, VDPBF16PS, or FMA (emulated bf16, fp32) */
        const char *isa = ts_nn_bf16_isa();
        const int amx = bf16 && !strcmp(isa, "amx"), native = bf16 && !strcmp(isa, "avx512bf16");
        r->peak_gflops = amx ? pr.sum_amx_gflops : native ? pr.sum_bf16_gflops : pr.sum_fp32_gflops;
        r->peak_kind = amx ? "amx" : native ? "bf16" : "fp32";
    }
    return 0;
}

int ts_bench_infer_write_json(const char *path, const ts_bench_infer_result *r, const char *config, const char *input)
{
    cJSON *o = cJSON_CreateObject(), *t = o ? cJSON_AddArrayToObject(o, "totals") : NULL;
    if (!t) {
        cJSON_Delete(o);
        return TS_ERR(TS_ERR_NOMEM, "bench infer: --json %s", path);
    }
    const ts_infer_result *l = &r->last;
    cJSON_AddStringToObject(o, "config", config);
    cJSON_AddStringToObject(o, "input", input);
    for (int k = 0; k < TS_BI_PARTS; k++) cJSON_AddNumberToObject(o, ts_bench_infer_part_name[k], r->med[k]);
    for (int i = 0; i < r->runs; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(r->totals[i]));
    cJSON_AddNumberToObject(o, "windows", (double)l->windows);
    cJSON_AddNumberToObject(o, "forwards", (double)l->forwards);
    cJSON_AddNumberToObject(o, "batch", l->batch);
    cJSON_AddNumberToObject(o, "streams", l->streams);
    cJSON_AddNumberToObject(o, "stream_forwards_min", (double)l->stream_min); /* the last run's, rank 0 */
    cJSON_AddNumberToObject(o, "stream_forwards_max", (double)l->stream_max);
    cJSON_AddStringToObject(o, "precision", l->precision);
    cJSON_AddStringToObject(o, "conv_isa", r->conv_isa);
    cJSON_AddStringToObject(o, "conv", l->conv);
    cJSON_AddNumberToObject(o, "flop_per_window", l->flop_per_window);
    cJSON_AddNumberToObject(o, "network_gflops", r->network_gflops);
    cJSON_AddNumberToObject(o, "total_gflops", r->total_gflops);
    if (r->peak_gflops > 0) {
        cJSON_AddStringToObject(o, "peak_kind", r->peak_kind);
        cJSON_AddNumberToObject(o, "peak_gflops", r->peak_gflops);
        cJSON_AddNumberToObject(o, "network_fraction_of_peak", r->network_gflops / r->peak_gflops);
        cJSON_AddNumberToObject(o, "total_fraction_of_peak", r->total_gflops / r->peak_gflops);
    }
    cJSON_AddNumberToObject(o, "ranks", r->ranks);
    cJSON_AddNumberToObject(o, "threads", r->threads);
    cJSON_AddNumberToObject(o, "peak_rss_mb", r->peak_rss_mb);
    return ts_bench_json_write(o, path, "bench infer");
}
