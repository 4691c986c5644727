/* Local reduction kernels for every (dtype, op), declared in coll_impl.h:
 * pairwise in place, k-way into an output (half types accumulate in float32
 * and round once), and the final division for AVG. Plain loops the compiler
 * vectorises over host memory. No MPI and no communication here: algorithm
 * files call them on data already received (device buffers go to NCCL). */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#include <string.h>

#define OP_SUM(a, b) ((a) + (b))
#define OP_MAX(a, b) ((a) > (b) ? (a) : (b))
#define OP_MIN(a, b) ((a) < (b) ? (a) : (b))

#define PAIR(T, OPF)                                                            \
    do {                                                                        \
        T *restrict x = inout;                                                  \
        const T *restrict y = in;                                               \
        for (size_t i = 0; i < n; i++) x[i] = OPF(x[i], y[i]);                  \
    } while (0)

#define PAIR_HALF(TOF, FROMF, OPF)                                              \
    do {                                                                        \
        uint16_t *restrict x = inout;                                           \
        const uint16_t *restrict y = in;                                        \
        for (size_t i = 0; i < n; i++) x[i] = FROMF(OPF(TOF(x[i]), TOF(y[i]))); \
    } while (0)

#define BY_OP(MAC, ...)                                                         \
    switch (op) {                                                               \
    case TS_OP_MAX: MAC(__VA_ARGS__, OP_MAX); break;                            \
    case TS_OP_MIN: MAC(__VA_ARGS__, OP_MIN); break;                            \
    default: MAC(__VA_ARGS__, OP_SUM); break;                                   \
    }

void ts_reduce_local(void *inout, const void *in, size_t n, ts_dtype dt, ts_op op)
{
    switch (dt) {
    case TS_FLOAT32: BY_OP(PAIR, float); break;
    case TS_FLOAT64: BY_OP(PAIR, double); break;
    case TS_INT32: BY_OP(PAIR, int32_t); break;
    case TS_INT64: BY_OP(PAIR, int64_t); break;
    case TS_UINT8: BY_OP(PAIR, uint8_t); break;
    case TS_BFLOAT16: BY_OP(PAIR_HALF, ts_bf16_to_f32, ts_f32_to_bf16); break;
    case TS_FLOAT16: BY_OP(PAIR_HALF, ts_f16_to_f32, ts_f32_to_f16); break;
    default: break;
    }
}

/* k-way: blocks of B elements accumulate in a local array of the
 * accumulation type, then are stored (and rounded) once. */
#define RBLOCK 1024
#define MULTI(T, ACC, LOAD, STORE, OPF)                                         \
    do {                                                                        \
        ACC acc[RBLOCK];                                                        \
        for (size_t b = 0; b < n; b += RBLOCK) {                                \
            size_t m = n - b < RBLOCK ? n - b : RBLOCK;                         \
            const T *restrict s0 = (const T *)ins[0] + b;                       \
            for (size_t i = 0; i < m; i++) acc[i] = LOAD(s0[i]);                \
            for (int j = 1; j < k; j++) {                                       \
                const T *restrict sj = (const T *)ins[j] + b;                   \
                for (size_t i = 0; i < m; i++) acc[i] = OPF(acc[i], LOAD(sj[i])); \
            }                                                                   \
            T *restrict o = (T *)out + b;                                       \
            for (size_t i = 0; i < m; i++) o[i] = STORE(acc[i]);                \
        }                                                                       \
    } while (0)
#define ID(x) (x)

void ts_reduce_multi(void *out, const void *const *ins, int k, size_t n, ts_dtype dt, ts_op op)
{
    if (k == 1) {
        if (out != ins[0]) memmove(out, ins[0], n * ts_dtype_size(dt));
        return;
    }
    switch (dt) {
    case TS_FLOAT32: BY_OP(MULTI, float, float, ID, ID); break;
    case TS_FLOAT64: BY_OP(MULTI, double, double, ID, ID); break;
    case TS_INT32: BY_OP(MULTI, int32_t, int32_t, ID, ID); break;
    case TS_INT64: BY_OP(MULTI, int64_t, int64_t, ID, ID); break;
    case TS_UINT8: BY_OP(MULTI, uint8_t, uint8_t, ID, ID); break;
    case TS_BFLOAT16: BY_OP(MULTI, uint16_t, float, ts_bf16_to_f32, ts_f32_to_bf16); break;
    case TS_FLOAT16: BY_OP(MULTI, uint16_t, float, ts_f16_to_f32, ts_f32_to_f16); break;
    default: break;
    }
}

void ts_reduce_finish(void *buf, size_t n, ts_dtype dt, ts_op op, int p)
{
    if (op != TS_OP_AVG || p == 1) return;
    switch (dt) {
    case TS_FLOAT32: { float *x = buf; for (size_t i = 0; i < n; i++) x[i] /= (float)p; } break;
    case TS_FLOAT64: { double *x = buf; for (size_t i = 0; i < n; i++) x[i] /= (double)p; } break;
    case TS_INT32: { int32_t *x = buf; for (size_t i = 0; i < n; i++) x[i] /= p; } break;
    case TS_INT64: { int64_t *x = buf; for (size_t i = 0; i < n; i++) x[i] /= p; } break;
    case TS_UINT8: { uint8_t *x = buf; for (size_t i = 0; i < n; i++) x[i] = (uint8_t)(x[i] / p); } break;
    case TS_BFLOAT16: {
        uint16_t *x = buf;
        for (size_t i = 0; i < n; i++) x[i] = ts_f32_to_bf16(ts_bf16_to_f32(x[i]) / (float)p);
    } break;
    case TS_FLOAT16: {
        uint16_t *x = buf;
        for (size_t i = 0; i < n; i++) x[i] = ts_f32_to_f16(ts_f16_to_f32(x[i]) / (float)p);
    } break;
    default: break;
    }
}

void ts_coll_copy(void *dst, const void *src, size_t bytes)
{
    if (dst != src && bytes) memcpy(dst, src, bytes);
}
