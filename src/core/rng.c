/* Philox4x32-10 streams; see rng.h. Owns the counter-based generator and
 * the draws over it (uniform, normal, below, skip, shuffle); the caller keys
 * each stream (seed, rank, stream). No global state, no allocation. */
#include "tsbuild.h"
#include "src/core/rng.h"

#include <math.h>

void ts_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int i = 0; i < 10; i++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

void ts_rng_init(ts_rng *r, uint64_t seed, uint32_t rank, uint32_t stream)
{
    r->key[0] = (uint32_t)seed;
    r->key[1] = (uint32_t)(seed >> 32);
    r->ctr[0] = r->ctr[1] = 0;
    r->ctr[2] = rank;
    r->ctr[3] = stream;
    r->pos = 4;
}

static void next_block(ts_rng *r)
{
    ts_philox4x32(r->ctr, r->key, r->out);
    if (++r->ctr[0] == 0) r->ctr[1]++;
    r->pos = 0;
}

uint32_t ts_rng_u32(ts_rng *r)
{
    if (r->pos >= 4) next_block(r);
    return r->out[r->pos++];
}

uint64_t ts_rng_u64(ts_rng *r)
{
    uint64_t hi = ts_rng_u32(r);
    return (hi << 32) | ts_rng_u32(r);
}

double ts_rng_uniform(ts_rng *r) { return (double)(ts_rng_u64(r) >> 11) * 0x1.0p-53; }
float ts_rng_uniformf(ts_rng *r) { return (float)(ts_rng_u32(r) >> 8) * 0x1.0p-24f; }

double ts_rng_normal(ts_rng *r)
{
    double u1 = 1.0 - ts_rng_uniform(r), u2 = ts_rng_uniform(r); /* u1 in (0, 1] */
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t ts_rng_below(ts_rng *r, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n, x;
    do x = ts_rng_u64(r);
    while (x >= limit);
    return x % n;
}

void ts_rng_skip(ts_rng *r, uint64_t blocks)
{
    uint64_t c = ((uint64_t)r->ctr[1] << 32 | r->ctr[0]) + blocks;
    r->ctr[0] = (uint32_t)c;
    r->ctr[1] = (uint32_t)(c >> 32);
    r->pos = 4;
}

void ts_rng_shuffle(ts_rng *r, int64_t *idx, int64_t n)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)ts_rng_below(r, (uint64_t)i + 1), t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}
