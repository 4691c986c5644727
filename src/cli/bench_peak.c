/* tessera bench peak: the arguments and the report of the CPU's measured
 * limits; the measurement and the JSON are src/bench/bench_peak.c. */
#include "tsbuild.h"
#include "src/bench/bench_peak.h"
#include "src/cli/cli.h"
#include "src/core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(void)
{
    printf("usage: tessera bench peak [--seconds S] [--threads T] [--json FILE]\n\n"
           "Measures what this CPU can do, as the convolution kernels see it, on every rank at the same time:\n"
           "  fp32  FMA chains in registers (AVX-512F where the CPU has it, else AVX2+FMA, else scalar):\n"
           "        GFLOP/s, an FMA counted as 2 FLOP\n"
           "  bf16  VDPBF16PS chains (CPUs with AVX512-BF16 only): GFLOP/s, 64 FLOP per instruction\n"
           "  triad a[i] = b[i] + s c[i] over arrays several times the last-level cache: GB/s (12 bytes\n"
           "        per element, STREAM's count)\n"
           "each on one thread and on T threads (default OMP_NUM_THREADS), the best of 3 (triad 5)\n"
           "repetitions; the whole takes about S seconds (default 2) plus the filling of the triad's\n"
           "arrays. Rank 0 prints its own figures and the sums over the ranks (ranks sharing a node share\n"
           "its cores and memory: their sum is the node's). These are the denominators of the fractions\n"
           "of peak in docs/performance.md and of `bench step --peak`.\n"
           "JSON (--json): threads, fp32_isa, bf16_isa, fp32_gflops_1, fp32_gflops, bf16_gflops_1,\n"
           "bf16_gflops, amx_gflops_1, amx_gflops (0 without AMX), triad_GBps_1, triad_GBps, triad_mb,\n"
           "seconds (rank 0), ranks, and sum_fp32_gflops, sum_bf16_gflops, sum_amx_gflops, sum_triad_GBps\n"
           "over the ranks.\n");
}

int ts_cli_bench_peak(int argc, char **argv)
{
    int err = 0, threads = 0;
    double seconds = 2.0;
    const char *json = NULL;
    if (ts_cli_wants_help(argc, argv)) {
        if (ts_cli_rank() == 0) help();
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *end = NULL;
        if (!strcmp(a, "--seconds") && i + 1 < argc) {
            seconds = strtod(argv[++i], &end);
            if (*end || !(seconds > 0) || seconds > 3600)
                return TS_ERR(TS_ERR_ARG, "bench peak: --seconds %s (a number of seconds, 0 < S <= 3600)", argv[i]);
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            const long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 4096) return TS_ERR(TS_ERR_ARG, "bench peak: --threads %s (1..4096)", argv[i]);
            threads = (int)v;
        } else if (!strcmp(a, "--json") && i + 1 < argc) {
            json = argv[++i];
        } else {
            return TS_ERR(TS_ERR_ARG, "bench peak: unexpected argument '%s' (see --help)", a);
        }
    }
    ts_bench_peak_result r;
    TS_TRY(ts_bench_peak_run(MPI_COMM_WORLD, threads, seconds, &r));
    const ts_cpu_peak *p = &r.p;
    if (ts_cli_rank() == 0) {
        printf("bench peak: %d thread%s per rank, %d rank%s, %.1f s\n", p->threads, p->threads == 1 ? "" : "s", r.ranks,
               r.ranks == 1 ? "" : "s", p->seconds);
        printf("  fp32 FMA (%s)       %9.1f GFLOP/s on 1 thread, %9.1f on %d\n", p->fp32_isa, p->fp32_gflops_1,
               p->fp32_gflops, p->threads);
        if (p->bf16_gflops > 0)
            printf("  bf16 VDPBF16PS (%s) %9.1f GFLOP/s on 1 thread, %9.1f on %d\n", p->bf16_isa, p->bf16_gflops_1,
                   p->bf16_gflops, p->threads);
        else printf("  bf16 dot products: none (this CPU has no AVX512-BF16)\n");
        if (p->amx_gflops > 0)
            printf("  bf16 AMX TDPBF16PS      %9.1f GFLOP/s on 1 thread, %9.1f on %d\n", p->amx_gflops_1, p->amx_gflops,
                   p->threads);
        else printf("  bf16 AMX tiles: none (this CPU, or the kernel, has no AMX-BF16)\n");
        printf("  triad (%.0f MB)       %9.1f GB/s on 1 thread, %9.1f on %d\n", p->triad_mb, p->triad_GBps_1,
               p->triad_GBps, p->threads);
        if (r.ranks > 1)
            printf("  sum over the ranks: fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s, AMX %.1f GFLOP/s, triad %.1f GB/s\n",
                   r.sum_fp32_gflops, r.sum_bf16_gflops, r.sum_amx_gflops, r.sum_triad_GBps);
    }
    if (json && ts_cli_rank() == 0) err = ts_bench_peak_write_json(json, &r);
    return ts_err_agree(MPI_COMM_WORLD, err);
}
