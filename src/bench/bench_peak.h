/* The peak benchmark behind `tessera bench peak`: the CPU's measured limits
 * (src/nn/peak.h) on every rank at once, their sums over the job, and its
 * JSON. Internal to the library (not installed); the command prints. */
#ifndef TS_BENCH_BENCH_PEAK_H
#define TS_BENCH_BENCH_PEAK_H

#include <mpi.h>

#include "src/nn/peak.h"

typedef struct ts_bench_peak_result {
    ts_cpu_peak p;           /* this rank's */
    int ranks;
    double sum_fp32_gflops, sum_bf16_gflops, sum_triad_GBps, sum_amx_gflops; /* over the ranks */
} ts_bench_peak_result;

/* Collective on comm. Every rank measures (threads, seconds as
 * ts_cpu_peak_measure) at the same time; errors agreed. */
int ts_bench_peak_run(MPI_Comm comm, int threads, double seconds, ts_bench_peak_result *r);
/* Local. Writes r as JSON to path (the keys `tessera bench peak --help` lists). */
int ts_bench_peak_write_json(const char *path, const ts_bench_peak_result *r);

#endif
