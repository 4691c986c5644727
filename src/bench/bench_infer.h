/* The inference benchmark behind `tessera bench infer`: ts_infer_run
 * (src/infer/infer.h) repeated in one process, each run whole and its parts
 * (rank 0's, ts_infer_result) timed, the medians, the network's and the
 * whole run's GFLOP/s by the cost model and, optionally, their fraction of
 * the CPU's measured peak (src/bench/bench_peak.h) of the arithmetic that
 * ran. Internal to the library (not installed); the command prints. */
#ifndef TS_BENCH_BENCH_INFER_H
#define TS_BENCH_BENCH_INFER_H

#include <mpi.h>

#include "src/core/config.h"
#include "src/infer/infer.h"

#define TS_BENCH_INFER_MAX_REPEAT 100

/* the parts of a run, in the order of bench_infer's JSON keys */
enum {
    TS_BI_TOTAL, TS_BI_SETUP, TS_BI_READ, TS_BI_PREDICT, TS_BI_NETWORK, TS_BI_BLEND, TS_BI_REDUCE, TS_BI_WRITE,
    TS_BI_METRICS, TS_BI_PARTS
};
/* their JSON keys ("total_s", ...) */
extern const char *const ts_bench_infer_part_name[TS_BI_PARTS];

typedef struct ts_bench_infer_opts {
    const ts_infer_opts *infer; /* the command's options (borrowed) */
    int repeat;                 /* runs, 1 .. TS_BENCH_INFER_MAX_REPEAT */
    int peak;                   /* measure the peaks first (2 s) */
    /* called on rank 0 after each run (may be NULL): for printing */
    void (*on_run)(int run, int repeat, const ts_infer_result *r, void *ctx);
    void *ctx;
} ts_bench_infer_opts;

typedef struct ts_bench_infer_result {
    ts_infer_result last;                      /* the last run's result */
    double med[TS_BI_PARTS];                   /* medians over the runs, seconds */
    double totals[TS_BENCH_INFER_MAX_REPEAT];  /* each run's total */
    int runs, ranks, threads;
    double flop;                               /* the forward's convolution FLOP of all windows of a run */
    double network_gflops, total_gflops;       /* flop over the median network / whole-run time */
    double peak_gflops;                        /* 0 without opts.peak: the peak over the ranks */
    const char *peak_kind;                     /* "fp32"; "bf16" where bf16 ran on AVX512-BF16; "amx" on AMX tiles */
    const char *conv_isa;                      /* "fp32", or the bf16 variant that ran */
    double peak_rss_mb;
} ts_bench_infer_result;

/* Collective on comm (the world ts_infer_run takes). Errors: as
 * ts_infer_run, agreed on every rank. */
int ts_bench_infer_run(const ts_config *cfg, MPI_Comm comm, const ts_bench_infer_opts *o, ts_bench_infer_result *r);

/* Local. Writes r as JSON to path (the keys `tessera bench infer --help`
 * lists); config and input name the run. */
int ts_bench_infer_write_json(const char *path, const ts_bench_infer_result *r, const char *config, const char *input);

#endif
