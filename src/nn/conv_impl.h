/* Private to src/nn: the three CPU kernels that all convolutions are built
 * from, on channels-last float32 data, with weights packed as
 * wp[tap][c][ocp] (tap = (kd*k + kh)*k + kw, ocp = output channels rounded
 * up to 16, padding lanes zero):
 *   gather  y[o]  = b + sum_t sum_c x[o*s - p + t][c] wp[t][c][:]
 *           (conv forward; conv backward-data at stride 1 with flipped taps;
 *            transposed-conv backward-data)
 *   tgather y[o]  = b + sum_t sum_c x[(o + p - t)/s][c] wp[t][c][:]  (where
 *           divisible and inside; transposed-conv forward; conv backward-data
 *           at stride > 1)
 *   wgrad   dw[t][c][:] = sum_o x[o*s - p + t][c] g[o][:]
 * Each runs OpenMP threads over output rows with static schedules (the
 * results do not depend on timing). Register-blocked micro-kernels: a tile
 * of output voxels x 16-lane channel vectors stays in registers over all
 * taps and input channels; inputs are staged per row block in a zero-padded
 * slab, so that the inner loops have no bounds checks. */
#ifndef TS_NN_CONV_IMPL_H
#define TS_NN_CONV_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "src/nn/layers.h"

/* AVX512-BF16 kernels compiled where the compiler knows the instructions
 * (conv_bf16.c, winograd_bf16.c: chosen at run time by ts_nn_bf16_native) */
/* 1 where a 16-float vector is one register and 32 of them exist (the
 * build targets AVX-512): the generated tiles' widest shapes; 0 elsewhere
 * (an AVX2 build: two 256-bit registers a vector, 16 in all), where the
 * runners take narrower tiles (gen_tiles.py, GC_N ...) */
#ifdef __AVX512F__
#define TS_NN_WIDE_REGS 1
#else
#define TS_NN_WIDE_REGS 0
#endif

/* clang refuses a 64-byte vector passed between a function built for
 * AVX-512 and one built without it, even where inlined: a clang build
 * without AVX-512 (the fuzz targets on an AVX2 machine) has no native bf16
 * kernels (the emulated ones run) */
#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 9 && defined(__AVX512F__) : __GNUC__ >= 10)
#define TS_BF16_X86 1
#include <immintrin.h>
#define TS_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define TS_BF16_X86 0
#endif

/* AMX tiles (conv_amx.c): x86-64 Linux, a compiler whose assembler knows
 * the tile instructions (written as asm) and that builds the AVX-512 code
 * around them (TS_BF16_X86: AMX runs only beside AVX512-BF16) */
#if TS_BF16_X86 && defined(__linux__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define TS_AMX_X86 1
#else
#define TS_AMX_X86 0
#endif

typedef struct ts_conv_geom {
    int N;
    int D, H, W, C;     /* input dims and channels (gather, wgrad: the large side) */
    int OD, OH, OW, OC; /* output dims and channels */
    int k, s, p;        /* cubic kernel, stride, padding */
} ts_conv_geom;

static inline int ts_nn_pad16(int c) { return (c + 15) & ~15; }

/* Partial tiles (the generated kernels, conv_tiles*.h): the first n lanes
 * of a 16-float vector (n <= 0: none, n >= 16: all) stored to p, and n
 * floats loaded from p with zeros after them. One masked instruction where
 * the build targets AVX-512; otherwise through a buffer. Neither touches
 * memory past the n floats. */
typedef float ts_v16 __attribute__((vector_size(64)));
/* Always inlined: the bf16 kernels are compiled for AVX-512 by a target
 * attribute (conv_bf16.c) while these helpers follow the build's flags; a
 * copy left out of line by the compiler (GCC did, in a build without
 * -march=native) takes its 64-byte vector in memory while its AVX-512
 * callers pass it in a register, so it stored garbage. Inlined, no call
 * and no calling convention is left between the two. */
#define TS_NN_VINLINE static inline __attribute__((always_inline))
#ifdef __AVX512F__
#include <immintrin.h>
TS_NN_VINLINE __mmask16 ts_nn_lanes(int n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }
TS_NN_VINLINE void ts_nn_vst_part(float *p, ts_v16 v, int n) { _mm512_mask_storeu_ps(p, ts_nn_lanes(n), (__m512)v); }
TS_NN_VINLINE ts_v16 ts_nn_vld_part(const float *p, int n) { return (ts_v16)_mm512_maskz_loadu_ps(ts_nn_lanes(n), p); }
#else
/* GCC warns that a 64-byte vector argument's ABI differs without AVX-512:
 * no call is left to differ (always inlined) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
TS_NN_VINLINE void ts_nn_vst_part(float *p, ts_v16 v, int n)
{
    float t[16];
    memcpy(t, &v, sizeof t);
    if (n > 0) memcpy(p, t, (size_t)(n < 16 ? n : 16) * sizeof(float));
}
TS_NN_VINLINE ts_v16 ts_nn_vld_part(const float *p, int n)
{
    float t[16] = {0};
    if (n > 0) memcpy(t, p, (size_t)(n < 16 ? n : 16) * sizeof(float));
    ts_v16 v;
    memcpy(&v, t, sizeof v);
    return v;
}
#pragma GCC diagnostic pop
#endif

/* The voxel-pair tiles' remainder: CALL(n) for a constant n = np (1 .. 15),
 * so that a tile's accumulators stay in registers */
#define TS_NP_SWITCH(np, CALL)                                                                                       \
    switch (np) {                                                                                                    \
    case 15: CALL(15); break;                                                                                        \
    case 14: CALL(14); break;                                                                                        \
    case 13: CALL(13); break;                                                                                        \
    case 12: CALL(12); break;                                                                                        \
    case 11: CALL(11); break;                                                                                        \
    case 10: CALL(10); break;                                                                                        \
    case 9: CALL(9); break;                                                                                          \
    case 8: CALL(8); break;                                                                                          \
    case 7: CALL(7); break;                                                                                          \
    case 6: CALL(6); break;                                                                                          \
    case 5: CALL(5); break;                                                                                          \
    case 4: CALL(4); break;                                                                                          \
    case 3: CALL(3); break;                                                                                          \
    case 2: CALL(2); break;                                                                                          \
    case 1: CALL(1); break;                                                                                          \
    default: break;                                                                                                  \
    }

/* The voxel-pair tiles' accumulator (lane 2o + v: channel o of voxel v) to
 * the OC (<= 8) channels of voxel 0 at y0 and, if both, of voxel 1 at
 * y0 + ldy (one store when the two are adjacent). */
TS_NN_VINLINE void ts_nn_pair_store(float *y0, int ldy, ts_v16 acc, int OC, int both)
{
    const ts_v16 t = __builtin_shufflevector(acc, acc, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    if (both && OC == 8 && ldy == 8) {
        memcpy(y0, &t, sizeof t);
        return;
    }
    ts_nn_vst_part(y0, t, OC);
    if (both) ts_nn_vst_part(y0 + ldy, __builtin_shufflevector(t, t, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7), OC);
}

/* Scratch memory cached per calling thread, one buffer per slot (0: the
 * kernels' slabs and partial sums, 1: packed weights, 2: unpacked weight
 * gradients, 3: the bf16 or fp16 transposed gather's converted input): reused
 * across calls, so that large scratch is not mapped and faulted in again on
 * every call. Not zeroed; NULL on failure.
 * The buffers live until ts_nn_scratch_release() on that thread. */
void *ts_nn_scratch(int slot, size_t bytes);
/* the bytes ts_nn_scratch allocates for a request of `bytes` (a quarter more, whole pages) */
size_t ts_nn_scratch_alloc_size(size_t bytes);
void ts_nn_scratch_release(void);

/* An input that is the channel concatenation [a, b] of two channels-last
 * tensors (ca channels, then C - ca), or one tensor (b NULL), read without
 * forming the concatenation; and an output split the same way.
 * halo (NULL: zero padding): the one-voxel halo of a box of a split volume
 * (layouts in layers.h; a face voxel holds all C channels), read by the
 * slab fill where a position lies outside the box. Only for k = 3, s = 1,
 * p = 1 geometries (the callers check). */
typedef struct ts_conv_src {
    const float *a, *b;
    int ca;
    const ts_halo *halo;
} ts_conv_src;
typedef struct ts_conv_dst {
    float *a, *b;
    int ca;
    const ts_conv_ep *ep; /* gather only: applied to each output row (layers.h); NULL: none */
} ts_conv_dst;

/* How a gather or wgrad call runs (NULL: everything, no hooks). part (gather
 * only): the work items (sample, output plane, block of rows) computed:
 * TS_CONV_BORDER those that read a non-NULL face of x.halo, INTERIOR the
 * others, ALL both. progress[i] (NULL: none) is called with ctx[i] by one
 * thread (OpenMP thread 0 of the kernel's team, i.e. the calling thread;
 * never two at once) on entering the parallel loop and after each work
 * item it completes. */
typedef struct ts_conv_sched {
    ts_conv_part part;
    void (*progress[2])(void *ctx);
    void *ctx[2];
} ts_conv_sched;

/* sch's progress hooks (NULL: none), called by the kernels' thread 0 */
static inline void ts_nn_run_hooks(const ts_conv_sched *sch)
{
    if (!sch) return;
    for (int i = 0; i < 2; i++)
        if (sch->progress[i]) sch->progress[i](sch->ctx[i]);
}

/* the kernels' OpenMP team: its size ahead of a parallel region, and this
 * thread's number inside one (1 and 0 without OpenMP) */
static inline int ts_nn_nthreads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
static inline int ts_nn_thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* bias: NULL or [OC]. Return 0 or TS_ERR_NOMEM. */
int ts_nn_gather(const ts_conv_geom *g, const float *x, const float *wp, const float *bias, float *y);
int ts_nn_gather2(const ts_conv_geom *g, ts_conv_src x, const float *wp, const float *bias, ts_conv_dst y,
                  const ts_conv_sched *sch);
int ts_nn_tgather(const ts_conv_geom *g, const float *x, const float *wp, const float *bias, float *y);
/* gy [N, OD, OH, OW, OC]; dwp [k^3][C][OC] is overwritten (not padded).
 * sch->part is ignored (all items). db (NULL: none): db[oc] += the sum of
 * gy's channel oc, taken from each work item's rows as the item is staged
 * (no pass of its own over gy); in a fixed order (float sums per item,
 * added per chunk in double, the chunks in order) that is the same in
 * every precision and for any thread count, not ts_nn_bias_grad's. */
int ts_nn_wgrad(const ts_conv_geom *g, const float *x, const float *gy, float *dwp);
int ts_nn_wgrad2(const ts_conv_geom *g, ts_conv_src x, const float *gy, float *dwp, float *db, const ts_conv_sched *sch);
/* db[oc] += sum over all voxels of gy[.., oc] (deterministic per thread count). */
int ts_nn_bias_grad(const float *gy, size_t voxels, int OC, float *db);
/* ps[0 .. OC) += the sums over the nv voxels at gr (float sums of blocks of
 * up to 256 channels, each channel in voxel order, added in double); acc:
 * 256 floats of scratch. The weight-gradient driver's bias gradient, one
 * work item at a time (src/nn/conv_bias.c). */
void ts_nn_item_bias(const float *gr, size_t nv, int OC, float *acc, double *ps);

/* Pointwise convolutions (src/nn/conv_pointwise.c): k = 1, s = 1, p = 0,
 * at most 16 output channels, a multiple of 8 input channels, one input
 * tensor without a halo, fp32 (bf 0)
 * or bf16 operands (bf 1); w unpacked [OC][C]. ts_nn_pw_fits: g is such a
 * geometry and the path is on (ts_nn_set_pointwise: off sends these layers
 * through the gather and wgrad drivers, for the tests that compare them).
 * forward y = b + x w^T (bias NULL: none), dgrad dx = dy w (overwritten),
 * wgrad dwp [C][OC] overwritten, as ts_nn_wgrad's. Return 0 or
 * TS_ERR_NOMEM. */
int ts_nn_set_pointwise(int on);
int ts_nn_pointwise_on(void);
long ts_nn_pw_calls(void); /* calls of the three so far (the tests check that they ran) */
int ts_nn_pw_fits(const ts_conv_geom *g);
int ts_nn_pw_forward(int bf, const ts_conv_geom *g, const float *x, const float *w, const float *bias, float *y);
int ts_nn_pw_dgrad(int bf, const ts_conv_geom *g, const float *dy, const float *w, float *dx);
int ts_nn_pw_wgrad(int bf, const ts_conv_geom *g, const float *x, const float *dy, float *dwp);

/* Winograd F(2x2x2, 3x3x3) (src/nn/winograd.c): g a 3x3x3, stride 1,
 * padding 1 geometry; x without a halo; w as given (not packed):
 * [OC][C][3][3][3], or with flip [C][OC][3][3][3] used with its taps
 * reversed (the input gradient of a convolution with those weights, g then
 * its transposed geometry); bias NULL or [OC]; y as ts_conv_dst (one tensor
 * or split at ca, with its epilogue). Return 0, TS_ERR_NOMEM or TS_ERR_ARG
 * (more than 2048 output channels). */
int ts_nn_winograd(const ts_conv_geom *g, ts_conv_src x, const float *w, int flip, const float *bias, ts_conv_dst y);
/* The channel counts ts_nn_winograd takes (16+ in and out, at most 2048 out) */
int ts_nn_winograd_fits(const ts_conv_geom *g);
/* The same for at most 8 output channels and 16 or more input channels
 * (winograd_narrow.c: tile pairs in a vector), fp32, y one tensor without
 * the epilogue's maxima (else TS_ERR_ARG); the same bits as
 * ts_nn_winograd's. _fits: the channel counts it takes; _scratch: its
 * bytes of scratch slot 0 on nthreads threads, and of slot 1 in *slot1. */
int ts_nn_winograd_narrow(const ts_conv_geom *g, ts_conv_src x, const float *w, int flip, const float *bias,
                          ts_conv_dst y);
int ts_nn_winograd_narrow_fits(const ts_conv_geom *g);
long ts_nn_winograd_narrow_calls(void); /* its calls so far (the tests check that it ran) */
size_t ts_nn_winograd_narrow_scratch(const ts_conv_geom *g, int nthreads, size_t *slot1);
/* The weight gradient of that convolution (x as there, gy [N, D, H, W, OC])
 * into dwp [27][C][OC] (overwritten), the same layout as ts_nn_wgrad2's:
 * dU = sum over tiles of (B^T x B) (A gy A^T), dw = G^T dU G; the same
 * bits for any thread count; sch's progress hooks run between items. */
int ts_nn_winograd_wgrad(const ts_conv_geom *g, ts_conv_src x, const float *gy, float *dwp, const ts_conv_sched *sch);
/* The Winograd micro-kernels' output block (winograd.c, winograd_bf16.c):
 * for `left` 16-lane output vectors still to do, the vectors one call
 * takes (nv: 4, 2 or 1), its row of the kernel tables (idx: 2, 1, 0) and
 * the rows one call keeps in registers (accumulators rows x nv <= 24) */
typedef struct ts_wino_blk {
    int nv, idx, rows;
} ts_wino_blk;
static inline ts_wino_blk ts_nn_wino_blk(int left)
{
    return left >= 4 ? (ts_wino_blk){4, 2, 6} : left >= 2 ? (ts_wino_blk){2, 1, 12} : (ts_wino_blk){1, 0, 16};
}
/* The bf16 products of ts_nn_winograd (winograd_bf16.c): M[xi] = V[xi] U[xi]
 * for the 64 points, V [64][T][cp] bf16 (points vs half-words apart), U
 * [64][K][op] words of two bf16 input channels (K pairs), M [64][T][op]
 * floats (points ms apart); VDPBF16PS or its emulation, the same bits. */
void ts_nn_wino_bf16_gemm(const uint16_t *V, int T, int cp, size_t vs, const uint32_t *U, int K, int op, float *M,
                          size_t ms);
/* The weight gradient's: dU[xi][c][:] += sum over tile pairs tp < KP of
 * V[xi][tp][c] Y[xi][tp][:], V [64][KP][cp] and Y [64][KP][op] words of
 * bf16 pairs (tiles 2 tp, 2 tp + 1; points vs and ys words apart), dU fp32
 * [64][C][op]; c < C. */
void ts_nn_wino_bf16_wgrad(const uint32_t *V, size_t vs, const uint32_t *Y, size_t ys, int C, int cp, int op, int KP,
                           float *du);
/* frees the calling thread's cached transformed weights (ts_nn_scratch_release calls it) */
void ts_nn_winograd_release(void);
/* the bytes of the calling thread's cache of transformed weights (weights
 * seen twice unchanged; weights that change between calls are not cached) */
size_t ts_nn_winograd_cache_bytes(void);
/* the scratch bytes (ts_nn_scratch, slots 0 and 1) the Winograd forward
 * and input gradient of geometry g on nthreads threads take (each through
 * the driver that takes its channel counts, winograd.c or
 * winograd_narrow.c; 0 where neither does), and with wgrad its weight
 * gradient too: for the memory plan */
size_t ts_nn_winograd_scratch_bytes(const ts_conv_geom *g, int nthreads, int wgrad);

/* ---- fp16 (ts_nn_set_conv_precision(TS_PREC_FP16)) ----
 * The fp32 kernels and drivers with every operand rounded through IEEE half
 * as it is staged: input slabs and halo faces as they are filled, the packed
 * weights, the weight gradient's output-gradient rows, the transposed
 * gather's input (a rounded copy in scratch slot 3). Products and sums stay
 * fp32, in the fp32 order. */

/* f rounded to the nearest IEEE half (ties to even) and back to fp32:
 * |f| >= 65520 becomes inf (65504 is half's largest), NaN stays NaN,
 * |f| < 2^-14 rounds to a multiple of 2^-24 (half's subnormals). */
static inline float ts_nn_fp16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t a = u & 0x7fffffffu, sign = u & 0x80000000u;
    if (a >= 0x477ff000u) { /* 65520 and up, inf, NaN */
        if (a > 0x7f800000u) return f;
        u = sign | 0x7f800000u;
    } else if (a < 0x38800000u) { /* below 2^-14: 0.5 + |f| rounds |f| to the ulp of 0.5, 2^-24 (IEEE
                                     * arithmetic without -ffast-math: the compiler keeps both operations) */
        float x;
        memcpy(&x, &a, sizeof x);
        x = (0.5f + x) - 0.5f;
        memcpy(&u, &x, sizeof u);
        u |= sign;
    } else { /* keep 10 of fp32's 23 mantissa bits, ties to even (a carry moves the exponent) */
        u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    }
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Drivers as ts_nn_gather2, ts_nn_tgather, ts_nn_wgrad2 (same arguments;
 * wp packed from fp16-rounded weights by the caller) that round the staged
 * inputs through fp16. Return 0 or TS_ERR_NOMEM. */
int ts_nn_gather2_fp16(const ts_conv_geom *g, ts_conv_src x, const float *wp, const float *bias, ts_conv_dst y,
                       const ts_conv_sched *sch);
int ts_nn_tgather_fp16(const ts_conv_geom *g, const float *x, const float *wp, const float *bias, float *y);
int ts_nn_wgrad2_fp16(const ts_conv_geom *g, ts_conv_src x, const float *gy, float *dwp, float *db,
                      const ts_conv_sched *sch);

/* ---- bf16 (ts_nn_set_conv_precision(TS_PREC_BF16)) ----
 * The same three kernels and drivers (conv_kernels.c), with both operands
 * rounded to bf16 (round to nearest even; as VCVTNE2PS2BF16: fp32
 * denormals become signed zeros, NaNs stay NaN) and products accumulated in
 * fp32 by bf16 dot products of pairs: acc += a[1] b[1], then acc += a[0] b[0]
 * (VDPBF16PS, whose two products are exact in fp32 and rounded in that
 * order). A pair is one 32-bit word: bf16 a[0] in the low half.
 * Weights are packed as pairs of consecutive gather input channels:
 * wp[tap][ceil(C/2)][ocp] (ts_nn_bf16_pack), a missing odd channel zero.
 * The input slabs are converted as they are staged; inputs, outputs, bias
 * and weight gradients stay fp32 in memory. The gather takes its items in
 * runs along D and the weight gradient its items in D order (k > s), so
 * that a ring of slab planes stages each input plane about once. Summation
 * does not depend on the thread count. Two variants run the same
 * drivers: native (AVX512-BF16, chosen at run time) and emulated (portable
 * C, two fp32 FMAs per pair in the same order): their results are
 * bitwise equal for finite data whose partial sums stay normal (the
 * instruction flushes denormal sums to zero). */

/* fp32 -> bf16 bits as VCVTNE2PS2BF16 does it. */
static inline uint16_t ts_nn_bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u); /* zero, denormal */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN: quiet */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float ts_nn_bf16_float(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* 2: AMX tiles for the gathers (conv_amx.c), VDPBF16PS for the other bf16
 * kernels; 1: the native AVX512-BF16 variant runs; 0: the emulated one.
 * The choice: the CPU (amx-tile and amx-bf16 with the kernel's permission,
 * else avx512f, bw, vl, bf16), overridden by TESSERA_BF16_ISA=emulated,
 * =avx512bf16 (no AMX), =amx or =auto, read on first use, or by
 * ts_nn_bf16_select_isa. Every caller treats a nonzero value as native. */
int ts_nn_bf16_native(void);
/* 1: the CPU and the OS have AMX-TILE and AMX-BF16 and Linux granted this
 * process the tile data state (asked once, on the first call) */
int ts_nn_cpu_amx(void);
/* The peak probe's AMX kernel (conv_amx.c; only where ts_nn_cpu_amx()):
 * n rounds of 4 independent TDPBF16PS, 65536 FLOP a round. */
float ts_nn_amx_chains(long n);
/* Slack past the end of a slab (32-bit words) that the AMX gather may read
 * (a partial tile's rows past the output row; their results are dropped):
 * 32 s C for stride s and C pairs a voxel (the voxel-pair tiles' rows are
 * two voxels apart). */
#define TS_NN_AMX_MARGIN(s, C) ((size_t)32 * (size_t)(s) * (size_t)(C))
/* 1: the CPU and the OS support AVX512 F, BW, VL and BF16 (whatever
 * TESSERA_BF16_ISA says): the hardware question, for the peak probe. */
int ts_nn_cpu_bf16(void);
/* Local, for tests: "emulated", "avx512bf16", "amx" or "auto"; returns 0, or
 * TS_ERR_UNSUPPORTED (avx512bf16 or amx on a CPU without it; nothing changes) or
 * TS_ERR_ARG. Not to be called while convolutions run in other threads. */
int ts_nn_bf16_select_isa(const char *name);

/* Stages n voxels as columns col0 .. col0+n-1 of a bf16 row dst: voxel v's
 * channels [0, ca) from a + v ca, [ca, C) from b + v (C - ca) (b NULL:
 * ca = C). vpair 0: pairs of channels (voxel j at pair j ceil(C/2), an odd
 * channel's partner set to zero); vpair 1: pairs of columns with stride s
 * (column j = 2sb + es + r into half e of pairs (bs + r) ld + c; the other
 * halves are left as they are). Little-endian: half 0 is the low half. */
void ts_nn_bf16_put(int nat, int vpair, int s, int C, int ld, void *dst, int col0, int n, const float *a, int ca,
                    const float *b);
/* The pair-packed weights of ts_nn_gather*_bf16 / ts_nn_tgather_bf16 from
 * a w laid out [rows][cols][taps] or [cols][rows][taps] (by_row: 1 when
 * w is [rows]...; rows are the gather's input channels, cols its output
 * channels): wp[t][ceil(rows/2)][pad16(cols)], tap t read as w's tap
 * flip ? taps-1-t : t. In scratch slot 1; NULL on failure. */
uint32_t *ts_nn_bf16_pack(const float *w, int rows, int cols, int taps, int flip, int by_row);

/* gather arguments (see gc_args in conv_kernels.c): slab planes of bf16
 * pairs of consecutive channels, voxel = C pairs (C = ceil(channels/2)) */
typedef struct ts_bf16_gc_args {
    const uint32_t *const *plane; /* slab plane kd (input plane od s - p + kd) */
    size_t rstride;               /* pairs between slab rows */
    int k, s, C, ocp;
    const uint32_t *wp;     /* [k^3][C][ocp] */
    const float *bias;      /* padded to ocp, 64-byte aligned, or NULL */
    /* 3x3x3 stride 1 with at most 8 output channels: two output voxels per
     * vector, as the fp32 tiles do (conv_kernels.c, gq_tile): the slab
     * planes as column pairs (pair j of a row: the C pairs of column j and
     * of column j + 1 interleaved), the weights [27][C][16] with channel o
     * in lanes 2o and 2o + 1, the bias likewise; ppl NULL: not this path */
    const uint32_t *const *ppl;
    const uint32_t *wq;
    const float *bq;
    size_t prs;             /* 32-bit words between pair-slab rows */
} ts_bf16_gc_args;

/* Weight-gradient arguments. The reduction runs over output voxels, so the
 * pairs are pairs of output voxels: g[q][m][oc] = (g[2m], g[2m+1]) (zero
 * outside 0 .. OW-1; q = plane * nr + row of the item; nm entries per row,
 * entry -1 of every row readable and zero; ocp lanes); the tiles make the
 * pairs (g[2m-1], g[2m]) from entries m - 1 and m. The slab holds pairs of
 * input columns: slab column j = 2sb + es + r (b a block, e = 0, 1, r < s)
 * is half e of pair [b][r][c]. Tap kw = 2s·blk + e·s + r then pairs
 * block m + blk, offset r, with (g[2m], g[2m+1]) for e = 0 (m < nm0 =
 * ceil(OW/2)) or (g[2m-1], g[2m]) for e = 1 (m < nm1 = OW/2 + 1). */
typedef struct ts_bf16_wg_args {
    const uint32_t *const *plane; /* slab plane i of the item (input plane od s - p + i) */
    size_t rstride;               /* pairs between slab rows */
    int k, s, C;                  /* C: input channels */
    const uint32_t *g;
    int nm, nm0, nm1, nx; /* nx: blocks of a slab row (k = 3, s = 1 tiles) */
    int nr, np;
    float *dw; /* [k^3][C][ocp] */
    int ocp;
} ts_bf16_wg_args;

/* The per-row work of the drivers (conv_bf16.c), nat selecting the variant:
 * one output row of the gather (as gather_row in conv_kernels.c); one tap of
 * the transposed gather over output-channel tiles; all kw taps and channel
 * tiles of the weight gradient for (kd, kh) (k3s1: 3x3x3, stride 1,
 * padding 1; ocp 16 and 32 then take the three kw taps together). */
/* The AMX gather row (conv_amx.c; ts_nn_bf16_gather_row with nat 2 and
 * no voxel-pair planes): any k, s; the slabs keep TS_NN_AMX_MARGIN. */
void ts_nn_amx_gather_row(const ts_bf16_gc_args *a, int r, int OW, int oc0, int oc1, int OC, float *yr, int yo0, int ldy);
/* At most 8 output channels, 3x3x3 stride 1, on AMX: two output voxels a
 * tile row, a->wq the weights ts_nn_amx_pair_weights made from the packed
 * wp ([9][4 C][16] words), every channel of the row */
void ts_nn_amx_gather_pairs(const ts_bf16_gc_args *a, int r, int OW, int OC, float *yr, int yo0, int ldy);
void ts_nn_amx_pair_weights(const uint32_t *wp, int C, int ocp, int OC, uint32_t *wq);
/* The AMX weight gradient of one work item (conv_amx.c; the bf16 driver's
 * arguments, ts_bf16_wg_args, with C the input channels): every kw tap of
 * the (kd, kh) pairs p0 .. p0+pairs-1 added to a->dw, the sums along each
 * row's voxel pairs in TDPBF16PS tiles (16 output x 16 input channels),
 * the output-gradient pairs first transposed into gt: at least
 * ts_nn_amx_wgrad_scratch(np nr, ocp, OW) words. The slab keeps 16 words
 * past its end (a channel tile's columns past C are read, not stored). */
void ts_nn_amx_wgrad_item(const ts_bf16_wg_args *a, int p0, int pairs, uint32_t *gt);
size_t ts_nn_amx_wgrad_scratch(int rows, int ocp, int OW);
void ts_nn_bf16_gather_row(int nat, const ts_bf16_gc_args *a, int k3s1, int r, int OW, int oc0, int oc1, int OC, float *yr,
                           int yo0, int ldy);
void ts_nn_bf16_tgather_tap(int nat, const uint32_t *xr, const uint32_t *wr, int C, int ocp, int s, int off, int lo, int hi,
                            int OC, float *yr);
/* k = s = 2, padding 0: output row yr (2 W voxels) from input row xr (W
 * voxels of C pairs) and the taps (kd, kh, 0), (kd, kh, 1) at wr, starting
 * from b (ocp floats: the bias, zeros past OC) */
void ts_nn_bf16_tgather_k2_row(int nat, const uint32_t *xr, const uint32_t *wr, const float *b, int C, int ocp, int W,
                               int OC, float *yr);
void ts_nn_bf16_wgrad_pair(int nat, const ts_bf16_wg_args *a, int kd, int kh, int k3s1);
/* one input channel, 3x3x3 stride 1, ocp 16: every (kd, kh) at once, the
 * same bits as ts_nn_bf16_wgrad_pair over them */
void ts_nn_bf16_wgrad_c1(int nat, const ts_bf16_wg_args *a);

/* The k = s = 2 transposed convolution's weight gradient over one work
 * item (convt3d.c): for taps t < 8, dw[t][c][0 .. ocp) (floats, added to)
 * += sum over rows i < nr, voxel pairs m < nm of the bf16 pairs
 * xq[(i nm + m) C + c] (x voxels 2m, 2m + 1 of row i) times the ocp pairs at
 * gq[t] + i gri + m gm (the output-gradient voxels 4m + kw, 4m + 2 + kw of
 * the tap's row), in the order (i, m) */
void ts_nn_bf16_tk2_wgrad(int nat, const uint32_t *xq, int C, const uint32_t *const *gq, size_t gri, size_t gm, int nr,
                          int nm, int ocp, float *dw);

/* convt3d.c's one-pass bf16 backward of k = s = 2 transposed convolutions:
 * on by default; off sends them to the separate gather and weight-gradient
 * drivers (the tests compare the two); calls so far */
int ts_nn_set_convt_fused(int on);
long ts_nn_convt_fused_calls(void);

/* The bf16 drivers: as ts_nn_gather2, ts_nn_tgather, ts_nn_wgrad2 (same
 * arguments, parts, progress hooks and halos, results independent of the
 * thread count) with pair-packed weights (ts_nn_bf16_pack). Return 0 or
 * TS_ERR_NOMEM. */
int ts_nn_gather2_bf16(const ts_conv_geom *g, ts_conv_src x, const uint32_t *wp, const float *bias, ts_conv_dst y,
                       const ts_conv_sched *sch);
int ts_nn_tgather_bf16(const ts_conv_geom *g, const float *x, const uint32_t *wp, const float *bias, float *y);
int ts_nn_wgrad2_bf16(const ts_conv_geom *g, ts_conv_src x, const float *gy, float *dwp, float *db,
                      const ts_conv_sched *sch);

#endif
