/* The check pattern of `bench coll --check` and the collective tests:
 * small integers whose sums, maxima and minima are exact in every dtype, so
 * any algorithm must reproduce the reference bit for bit. Plain macros so
 * the CUDA kernels use the same formula. */
#ifndef TS_COLLECTIVES_CHECK_H
#define TS_COLLECTIVES_CHECK_H

/* value of element i on rank r: in [-8, 8], or [-1, 1] for half types
 * (exact sums up to 256 ranks in bfloat16) */
#define TS_CHECK_VALUE(i, r, seed, half)                                             \
    ((half) ? (int)((((unsigned long long)(i) * 7u + (unsigned)(r) * 13u + (unsigned)(seed) * 5u) % 3u)) - 1 \
            : (int)((((unsigned long long)(i) * 7u + (unsigned)(r) * 13u + (unsigned)(seed) * 5u) % 17u)) - 8)

#ifndef __CUDACC__
#include "src/core/dtype.h"

/* Element i of a buffer of dt, as a double (exact for the pattern). */
static inline double ts_check_get(const void *b, size_t i, ts_dtype dt)
{
    switch (dt) {
    case TS_FLOAT32: return ((const float *)b)[i];
    case TS_FLOAT64: return ((const double *)b)[i];
    case TS_BFLOAT16: return ts_bf16_to_f32(((const uint16_t *)b)[i]);
    case TS_FLOAT16: return ts_f16_to_f32(((const uint16_t *)b)[i]);
    case TS_INT32: return ((const int32_t *)b)[i];
    case TS_INT64: return (double)((const int64_t *)b)[i];
    default: return ((const uint8_t *)b)[i];
    }
}

/* Stores v (exactly representable for the pattern) as element i. */
static inline void ts_check_set(void *b, size_t i, ts_dtype dt, double v)
{
    switch (dt) {
    case TS_FLOAT32: ((float *)b)[i] = (float)v; break;
    case TS_FLOAT64: ((double *)b)[i] = v; break;
    case TS_BFLOAT16: ((uint16_t *)b)[i] = ts_f32_to_bf16((float)v); break;
    case TS_FLOAT16: ((uint16_t *)b)[i] = ts_f32_to_f16((float)v); break;
    case TS_INT32: ((int32_t *)b)[i] = (int32_t)v; break;
    case TS_INT64: ((int64_t *)b)[i] = (int64_t)v; break;
    default: ((uint8_t *)b)[i] = (uint8_t)v; break;
    }
}
#endif

#endif
