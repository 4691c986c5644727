/* Distributed sampler; see sampler.h. The permutation of epoch e is a
 * Fisher-Yates shuffle driven by the Philox stream (seed, 0, STREAM + e);
 * the two most recent epochs are cached because a step may straddle an
 * epoch boundary. */
#include "tsbuild.h"
#include "io/sampler.h"
#include "src/core/error.h"
#include "src/core/rng.h"

#include <stdlib.h>
#include <string.h>

#define STREAM_EPOCH 0x45500000u /* "EP" */
#define STREAM_SPLIT 0x53500000u /* "SP" */

struct ts_sampler {
    int64_t n, *subset;
    int rank, size, batch;
    uint64_t seed;
    ts_sampler_mode mode;
    int64_t pos;       /* train: next global stream position; eval: next step */
    int64_t *perm[2];  /* cached permutations */
    int64_t perm_epoch[2];
    int next_slot;
};

int ts_sampler_create(int64_t n, const int64_t *subset, int rank, int size, int batch, uint64_t seed,
                      ts_sampler_mode mode, ts_sampler **out)
{
    *out = NULL;
    if (n < 1) return TS_ERR(TS_ERR_ARG, "sampler: no samples");
    if (size < 1 || rank < 0 || rank >= size) return TS_ERR(TS_ERR_ARG, "sampler: rank %d of %d", rank, size);
    if (batch < 1) return TS_ERR(TS_ERR_ARG, "sampler: batch %d", batch);
    ts_sampler *s = TS_CALLOC(1, sizeof *s);
    if (!s) return TS_ERR_NOMEM;
    s->n = n;
    s->rank = rank;
    s->size = size;
    s->batch = batch;
    s->seed = seed;
    s->mode = mode;
    s->perm_epoch[0] = s->perm_epoch[1] = -1;
    if (subset) {
        s->subset = TS_ALIGNED_ALLOC((size_t)n * sizeof(int64_t));
        if (!s->subset) {
            free(s);
            return TS_ERR_NOMEM;
        }
        memcpy(s->subset, subset, (size_t)n * sizeof(int64_t));
    }
    *out = s;
    return 0;
}

void ts_sampler_destroy(ts_sampler **sp)
{
    if (!sp || !*sp) return;
    free((*sp)->perm[0]);
    free((*sp)->perm[1]);
    free((*sp)->subset);
    free(*sp);
    *sp = NULL;
}

static const int64_t *epoch_perm(ts_sampler *s, int64_t e)
{
    for (int k = 0; k < 2; k++)
        if (s->perm_epoch[k] == e) return s->perm[k];
    int k = s->next_slot;
    s->next_slot ^= 1;
    if (!s->perm[k]) {
        s->perm[k] = malloc((size_t)s->n * sizeof(int64_t));
        if (!s->perm[k]) return NULL;
    }
    for (int64_t i = 0; i < s->n; i++) s->perm[k][i] = i;
    ts_rng r;
    ts_rng_init(&r, s->seed, 0, STREAM_EPOCH + (uint32_t)e);
    r.ctr[1] = (uint32_t)((uint64_t)e >> 32); /* epochs beyond 2^32 stay distinct */
    ts_rng_shuffle(&r, s->perm[k], s->n);
    s->perm_epoch[k] = e;
    return s->perm[k];
}

int64_t ts_sampler_at(ts_sampler *s, int64_t p)
{
    const int64_t *perm = epoch_perm(s, p / s->n);
    if (!perm) return -1;
    int64_t i = perm[p % s->n];
    return s->subset ? s->subset[i] : i;
}

int ts_sampler_next(ts_sampler *s, int64_t *idx, int64_t *pos)
{
    const int64_t P = s->size, B = s->batch;
    if (s->mode == TS_SAMPLER_TRAIN) {
        for (int b = 0; b < B; b++) {
            int64_t p = s->pos + b * P + s->rank;
            int64_t i = ts_sampler_at(s, p);
            if (i < 0) return TS_ERR(TS_ERR_NOMEM, "sampler permutation of %lld samples", (long long)s->n);
            idx[b] = i;
            if (pos) pos[b] = p;
        }
        s->pos += P * B;
        return 0;
    }
    if (s->pos >= ts_sampler_steps_per_epoch(s)) return 1;
    for (int b = 0; b < B; b++) {
        int64_t j = s->pos * P * B + b * P + s->rank;
        idx[b] = j < s->n ? (s->subset ? s->subset[j] : j) : -1;
        if (pos) pos[b] = j;
    }
    s->pos++;
    return 0;
}

int64_t ts_sampler_steps_per_epoch(const ts_sampler *s)
{
    int64_t per = (int64_t)s->size * s->batch;
    return (s->n + per - 1) / per;
}

int64_t ts_sampler_epoch(const ts_sampler *s) { return s->mode == TS_SAMPLER_TRAIN ? s->pos / s->n : 0; }
int64_t ts_sampler_position(const ts_sampler *s) { return s->pos; }

int ts_sampler_seek(ts_sampler *s, int64_t position)
{
    if (position < 0) return TS_ERR(TS_ERR_ARG, "sampler: negative position %lld", (long long)position);
    s->pos = position;
    return 0;
}

void ts_sampler_split(int64_t n, int64_t n_val, uint64_t seed, int64_t *train, int64_t *val)
{
    /* mark n_val positions of a seeded permutation as validation */
    int64_t *perm = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    uint8_t *is_val = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!perm || !is_val) {
        /* deterministic fallback without memory: the last n_val samples */
        for (int64_t i = 0, t = 0, v = 0; i < n; i++) {
            if (i >= n - n_val) val[v++] = i;
            else train[t++] = i;
        }
        free(perm);
        free(is_val);
        return;
    }
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    ts_rng r;
    ts_rng_init(&r, seed, 0, STREAM_SPLIT);
    ts_rng_shuffle(&r, perm, n);
    for (int64_t i = 0; i < n_val && i < n; i++) is_val[perm[i]] = 1;
    for (int64_t i = 0, t = 0, v = 0; i < n; i++) {
        if (is_val[i]) val[v++] = i;
        else train[t++] = i;
    }
    free(perm);
    free(is_val);
}
