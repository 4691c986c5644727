/* The CPU's limits as the kernels see them (issue [17], docs/performance.md,
 * "The machine's limits"): the fp32 FMA and bf16 dot-product rates reached
 * by independent register chains of the instructions the convolution
 * kernels use, and the memory bandwidth of a stream triad, for one thread
 * and for the threads in use. Figures to divide by, measured on the
 * machine at hand, not taken from a data sheet. Every function is local
 * (no MPI); the threads are OpenMP's. */
#ifndef TS_NN_PEAK_H
#define TS_NN_PEAK_H

typedef struct ts_cpu_peak {
    int threads;             /* the threads of the "all" figures */
    const char *fp32_isa;    /* "avx512f", "avx2+fma" or "scalar": the widest FMA the CPU has */
    const char *bf16_isa;    /* "avx512bf16", or "none" (bf16 figures are then 0) */
    double fp32_gflops_1;    /* one thread: FLOP/s / 1e9 (an FMA is 2 FLOP) */
    double fp32_gflops;      /* all threads together */
    double bf16_gflops_1;    /* VDPBF16PS: 64 FLOP per 512-bit instruction (32 products, 32 sums) */
    double bf16_gflops;
    double amx_gflops_1;     /* TDPBF16PS (AMX, where ts_nn_cpu_amx): 16384 FLOP an instruction; 0 without */
    double amx_gflops;
    double triad_GBps_1;     /* a[i] = b[i] + s c[i] over arrays far larger than the caches: 12 bytes
                              * per element (STREAM's count: 2 reads, 1 write) / time / 1e9 */
    double triad_GBps;
    double triad_mb;         /* the three arrays' size, MB */
    double seconds;          /* wall time of the whole probe */
} ts_cpu_peak;

/* Local. Measures for threads threads (<= 0: OpenMP's maximum) and one:
 * each compute rate the best of 3 repetitions of about seconds / 20
 * (seconds <= 0: 2), the triad the best of 5 passes; the whole takes about
 * seconds plus the filling of the triad's arrays. TS_ERR_NOMEM if those
 * arrays (triad_mb: each twice the last-level cache sysconf reports,
 * within 64 .. 256 MiB) cannot be allocated. */
int ts_cpu_peak_measure(int threads, double seconds, ts_cpu_peak *out);

#endif
