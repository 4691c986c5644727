/* Distributed sampler; see sampler.h. The permutation of epoch e is a
 * Fisher-Yates shuffle driven by the Philox stream (seed, 0, STREAM + e);
 * the two most recent epochs are cached because a step may straddle an
 * epoch boundary. Owns which sample a rank takes at each position, the
 * validation split and the folds; no MPI: every rank computes the same. */
#include "tsbuild.h"
#include "io/sampler.h"
#include "src/core/error.h"
#include "src/core/rng.h"

#include <stdlib.h>
#include <string.h>

#define STREAM_EPOCH 0x45500000u /* "EP" */
#define STREAM_SPLIT 0x53500000u /* "SP" */
#define STREAM_FOLDS 0x464f0000u /* "FO" */

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

/* A subject's name: names[i] up to delim, in a buffer of its own. */
static char *subject_of(const char *name, const char *delim)
{
    size_t len = strlen(name);
    const char *cut = delim && *delim ? strstr(name, delim) : NULL;
    if (cut && cut != name) len = (size_t)(cut - name);
    char *s = malloc(len + 1);
    if (s) memcpy(s, name, len), s[len] = 0;
    return s;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int ts_sampler_folds(const char *const *names, int64_t n, int folds, int fold, uint64_t seed, const char *delim,
                     int64_t *train, int64_t *ntrain, int64_t *val, int64_t *nval)
{
    if (folds < 2 || fold < 0 || fold >= folds)
        return TS_ERR(TS_ERR_CONFIG, "data.fold = %d with data.folds = %d: folds >= 2 and 0 <= fold < folds", fold,
                      folds);
    int err = 0;
    char **subj = calloc((size_t)(n > 0 ? n : 1), sizeof(char *)), **uniq = NULL;
    int64_t *perm = NULL;
    if (!subj) return TS_ERR(TS_ERR_NOMEM, "folds: %lld subject names", (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (!(subj[i] = subject_of(names[i], delim))) TS_FAIL(TS_ERR_NOMEM, "folds: subject names");
    uniq = malloc(sizeof(char *) * (size_t)(n > 0 ? n : 1));
    perm = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (!uniq || !perm) TS_FAIL(TS_ERR_NOMEM, "folds: %lld subjects", (long long)n);
    memcpy(uniq, subj, sizeof(char *) * (size_t)n);
    qsort(uniq, (size_t)n, sizeof(char *), cmp_str);
    int64_t ns = 0;
    for (int64_t i = 0; i < n; i++)
        if (!ns || strcmp(uniq[ns - 1], uniq[i])) uniq[ns++] = uniq[i];
    if (ns < folds)
        TS_FAIL(TS_ERR_CONFIG, "data.folds = %d, but the dataset has only %lld subjects%s%s%s", folds, (long long)ns,
                delim && *delim ? " (names cut at data.subject_delim '" : "", delim && *delim ? delim : "",
                delim && *delim ? "')" : "");
    for (int64_t i = 0; i < ns; i++) perm[i] = i;
    ts_rng r;
    ts_rng_init(&r, seed, 0, STREAM_FOLDS);
    ts_rng_shuffle(&r, perm, ns);
    /* perm[p] = the subject (sorted index) at position p: fold of a subject = its position % folds */
    int64_t *fold_of = malloc(sizeof(int64_t) * (size_t)ns);
    if (!fold_of) TS_FAIL(TS_ERR_NOMEM, "folds");
    for (int64_t p = 0; p < ns; p++) fold_of[perm[p]] = p % folds;
    *ntrain = *nval = 0;
    for (int64_t i = 0; i < n; i++) {
        char **hit = bsearch(&subj[i], uniq, (size_t)ns, sizeof(char *), cmp_str);
        if (hit && fold_of[hit - uniq] == fold) val[(*nval)++] = i;
        else train[(*ntrain)++] = i;
    }
    free(fold_of);
cleanup:
    if (subj)
        for (int64_t i = 0; i < n; i++) free(subj[i]);
    free(subj), free(uniq), free(perm);
    return err;
}
