/* The CPU's limits measured (peak.h): FMA and VDPBF16PS chains in registers
 * and a stream triad, each on one thread and on the threads in use. The
 * kernels are chosen at run time (the binary may be built without
 * -march=native): AVX-512F where the CPU has it, else AVX2 + FMA, else
 * scalar; bf16 only where the CPU has AVX512-BF16. Owns no layer. */
#pragma GCC optimize("O2")
#include "tsbuild.h"
#include "src/nn/peak.h"
#include "src/nn/conv_impl.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10)
#define PEAK_X86 1
#include <immintrin.h>
#else
#define PEAK_X86 0
#endif

/* The chains' constants, read through volatile: every chain is a fixed
 * point in float (a m + c rounds back to a), and clang, seeing the
 * constants, folded the whole AVX2 loop into its result (`bench peak`
 * then never finished calibrating) */
static volatile float peak_m = 0.999999f, peak_c = 1e-6f, peak_x = 1e-3f;

/* a kernel: n iterations, returns a value that depends on every chain (so
 * that nothing is optimised away); FLOP per iteration in flops[] below */
typedef float (*kernel_fn)(long n);

/* 16 independent chains: enough to cover the FMA latency (4-6 cycles) on
 * two or more pipes; written out so that each stays in a register */
#define CH16(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(14) OP(15)
#define CH12(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)

#if PEAK_X86
__attribute__((target("avx512f"))) static float fma_avx512(long n)
{
    const __m512 m = _mm512_set1_ps(peak_m), c = _mm512_set1_ps(peak_c);
#define DECL(k) __m512 a##k = _mm512_set1_ps(1.0f + (float)(k) * 1e-3f);
#define STEP(k) a##k = _mm512_fmadd_ps(a##k, m, c);
#define SUM(k) s = _mm512_add_ps(s, a##k);
    CH16(DECL)
    for (long i = 0; i < n; i++) {
        CH16(STEP)
    }
    __m512 s = _mm512_setzero_ps();
    CH16(SUM)
    return _mm512_reduce_add_ps(s);
#undef DECL
#undef STEP
#undef SUM
}

/* 12 chains: AVX2 has 16 ymm registers, two hold the constants */
__attribute__((target("avx2,fma"))) static float fma_avx2(long n)
{
    const __m256 m = _mm256_set1_ps(peak_m), c = _mm256_set1_ps(peak_c);
#define DECL(k) __m256 a##k = _mm256_set1_ps(1.0f + (float)(k) * 1e-3f);
#define STEP(k) a##k = _mm256_fmadd_ps(a##k, m, c);
#define SUM(k) s = _mm256_add_ps(s, a##k);
    CH12(DECL)
    for (long i = 0; i < n; i++) {
        CH12(STEP)
    }
    __m256 s = _mm256_setzero_ps();
    CH12(SUM)
    float v[8];
    _mm256_storeu_ps(v, s);
    return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
#undef DECL
#undef STEP
#undef SUM
}

/* VDPBF16PS: per lane, the sum of two bf16 products added to an fp32 accumulator */
__attribute__((target("avx512f,avx512bf16"))) static float dp_avx512bf16(long n)
{
    const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(peak_x), _mm512_set1_ps(peak_x));
#define DECL(k) __m512 a##k = _mm512_set1_ps((float)(k));
#define STEP(k) a##k = _mm512_dpbf16_ps(a##k, x, x);
#define SUM(k) s = _mm512_add_ps(s, a##k);
    CH16(DECL)
    for (long i = 0; i < n; i++) {
        CH16(STEP)
    }
    __m512 s = _mm512_setzero_ps();
    CH16(SUM)
    return _mm512_reduce_add_ps(s);
#undef DECL
#undef STEP
#undef SUM
}
#endif

static float fma_scalar(long n)
{
    float a[8];
    const float m = peak_m, c = peak_c;
    for (int k = 0; k < 8; k++) a[k] = 1.0f + (float)k * 1e-3f;
    for (long i = 0; i < n; i++)
        for (int k = 0; k < 8; k++) a[k] = a[k] * m + c;
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

static int max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static volatile float sink; /* keeps the kernels' results alive */

/* seconds that n iterations take on each of nt threads at once (the parallel region's wall time) */
static double time_kernel(kernel_fn f, long n, int nt)
{
    float s = 0;
    const double t0 = ts_time_now();
#pragma omp parallel num_threads(nt) reduction(+ : s)
    s += f(n);
    const double t = ts_time_now() - t0;
    sink += s;
    return t;
}

/* FLOP/s of kernel f (flop per iteration) on nt threads: best of reps runs of about each_s seconds */
static double rate(kernel_fn f, double flop, int nt, double each_s, int reps)
{
    long n = 1 << 16;
    double t = time_kernel(f, n, 1);
    while (t < 0.01) { /* calibrate on one thread */
        n *= 4;
        t = time_kernel(f, n, 1);
    }
    n = (long)((double)n * each_s / t) + 1;
    double best = 0;
    for (int r = 0; r < reps; r++) {
        t = time_kernel(f, n, nt);
        if (t > 0 && (double)n * nt * flop / t > best) best = (double)n * nt * flop / t;
    }
    return best;
}

/* bytes/s of a[i] = b[i] + 3 c[i] over n floats on nt threads: best of reps */
static double triad(float *a, const float *b, const float *c, long n, int nt, int reps)
{
    double best = 0;
    for (int r = 0; r < reps; r++) {
        const double t0 = ts_time_now();
#pragma omp parallel for num_threads(nt) schedule(static)
        for (long i = 0; i < n; i++) a[i] = b[i] + 3.0f * c[i];
        const double t = ts_time_now() - t0;
        if (t > 0 && 12.0 * (double)n / t > best) best = 12.0 * (double)n / t;
    }
    sink += a[n / 2];
    return best;
}

int ts_cpu_peak_measure(int threads, double seconds, ts_cpu_peak *out)
{
    memset(out, 0, sizeof *out);
    const int nt = threads > 0 ? threads : max_threads();
    const double total = seconds > 0 ? seconds : 2.0, each = total / 20.0;
    const int reps = 3;
    const double t0 = ts_time_now();
    out->threads = nt;
    kernel_fn f = fma_scalar;
    double flop = 8 * 2;
    out->fp32_isa = "scalar";
    out->bf16_isa = "none";
#if PEAK_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        f = fma_avx512;
        flop = 16 * 16 * 2;
        out->fp32_isa = "avx512f";
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        f = fma_avx2;
        flop = 12 * 8 * 2;
        out->fp32_isa = "avx2+fma";
    }
#endif
    out->fp32_gflops_1 = rate(f, flop, 1, each, reps) / 1e9;
    out->fp32_gflops = rate(f, flop, nt, each, reps) / 1e9;
#if PEAK_X86
    if (ts_nn_cpu_bf16()) {
        out->bf16_isa = "avx512bf16";
        out->bf16_gflops_1 = rate(dp_avx512bf16, 16 * 64, 1, each, reps) / 1e9;
        out->bf16_gflops = rate(dp_avx512bf16, 16 * 64, nt, each, reps) / 1e9;
    }
#endif
#if TS_AMX_X86
    if (ts_nn_cpu_amx()) {
        out->amx_gflops_1 = rate(ts_nn_amx_chains, 4.0 * 16 * 16 * 32 * 2, 1, each, reps) / 1e9;
        out->amx_gflops = rate(ts_nn_amx_chains, 4.0 * 16 * 16 * 32 * 2, nt, each, reps) / 1e9;
    }
#endif
    /* the triad: each array twice the last-level cache, within 64 .. 256 MiB (a VM may report the whole
     * socket's cache, or none) */
    long llc = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
    llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    size_t bytes = llc > 0 ? 2 * (size_t)llc : 0;
    if (bytes < ((size_t)64 << 20)) bytes = (size_t)64 << 20;
    if (bytes > ((size_t)256 << 20)) bytes = (size_t)256 << 20;
    const long n = (long)(bytes / sizeof(float));
    float *a = TS_ALIGNED_ALLOC(3 * bytes);
    if (!a) return TS_ERR(TS_ERR_NOMEM, "peak probe: the triad's %zu MB", 3 * bytes >> 20);
    float *b = a + n, *c = b + n;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (long i = 0; i < n; i++) { /* first touch by the threads that use them */
        a[i] = 0.0f;
        b[i] = 1.0f;
        c[i] = 0.5f;
    }
    out->triad_mb = 3.0 * (double)bytes / 1e6;
    out->triad_GBps_1 = triad(a, b, c, n, 1, reps + 2) / 1e9;
    out->triad_GBps = triad(a, b, c, n, nt, reps + 2) / 1e9;
    free(a);
    out->seconds = ts_time_now() - t0;
    return 0;
}
