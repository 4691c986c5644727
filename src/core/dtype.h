/* Element types shared by tensors, collectives and files, with the
 * bfloat16/float16 conversions (round to nearest even) used to store and
 * move half-precision data while computing in float32. */
#ifndef TS_CORE_DTYPE_H
#define TS_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    TS_FLOAT32 = 0,
    TS_FLOAT64,
    TS_BFLOAT16,
    TS_FLOAT16,
    TS_INT32,
    TS_INT64,
    TS_UINT8,
    TS_DTYPE_COUNT
} ts_dtype;

/* Local. Size in bytes of one element; 0 for an invalid dtype. */
static inline size_t ts_dtype_size(ts_dtype t)
{
    static const size_t s[TS_DTYPE_COUNT] = {4, 8, 2, 2, 4, 8, 1};
    return (unsigned)t < TS_DTYPE_COUNT ? s[t] : 0;
}

/* Local. Canonical names: float32 float64 bfloat16 float16 int32 int64 uint8. */
const char *ts_dtype_name(ts_dtype t);
/* Local. Parses a name (also f32/fp32, f64/fp64/double, bf16, f16/fp16/half); 0 on success. */
int ts_dtype_parse(const char *s, ts_dtype *out);

/* Local, cannot fail. Conversions between float32 and the 16-bit storage
 * types (round to nearest even; bf16 keeps NaN a NaN). */
static inline float ts_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t ts_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float ts_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t ts_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, man = u & 0x7fffffu;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* subnormal or zero in half */
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - e;
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++; /* may carry into exponent: correct */
    return (uint16_t)half;
}

#endif
