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

#endif
