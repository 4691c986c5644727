/* Counter-based random streams (Philox4x32-10, Salmon et al., SC'11) keyed
 * by (seed, rank, stream): any stream can be recreated anywhere, nothing is
 * shared between threads, and the state is a small POD that checkpoints copy. */
#ifndef TS_CORE_RNG_H
#define TS_CORE_RNG_H

#include <stdint.h>

typedef struct ts_rng {
    uint32_t key[2];  /* from the seed */
    uint32_t ctr[4];  /* ctr[0..1] block counter, ctr[2] rank, ctr[3] stream */
    uint32_t out[4];  /* the current block */
    uint32_t pos;     /* next word of out (4 = exhausted) */
} ts_rng;

/* Local. Seeds a stream. Streams with different (seed, rank, stream) are
 * independent; the same triple gives the same sequence everywhere. */
void ts_rng_init(ts_rng *r, uint64_t seed, uint32_t rank, uint32_t stream);
uint32_t ts_rng_u32(ts_rng *r);
uint64_t ts_rng_u64(ts_rng *r);
/* Uniform in [0, 1) with 53 (double) or 24 (float) random bits. */
double ts_rng_uniform(ts_rng *r);
float ts_rng_uniformf(ts_rng *r);
/* Standard normal (Box-Muller, one value per call). */
double ts_rng_normal(ts_rng *r);
/* Uniform integer in [0, n) without modulo bias; n > 0. */
uint64_t ts_rng_below(ts_rng *r, uint64_t n);
/* Jumps ahead by n 128-bit blocks (4 words each). */
void ts_rng_skip(ts_rng *r, uint64_t blocks);
/* Fisher-Yates shuffle of idx[0..n). */
void ts_rng_shuffle(ts_rng *r, int64_t *idx, int64_t n);

/* Local. One Philox4x32-10 block: the raw function, for tests. */
void ts_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

#endif
