/* Distributed sampling. Training reads one global stream of sample indices:
 * epoch e is a permutation of the samples drawn from (seed, e) alone, and the
 * stream is epoch 0, then epoch 1, ... Step s of a job with P ranks and
 * micro-batch B consumes stream positions [s*P*B, (s+1)*P*B); rank r takes
 * slot b at position s*P*B + b*P + r. So the global order does not depend on
 * the number of ranks, every rank takes the same number of steps whatever
 * the dataset size (5 samples on 2 ranks: steps simply run into the next
 * epoch), and the position (one integer: the next stream position) resumes a
 * run on any number of ranks.
 * Evaluation visits every sample exactly once, in order, with no padding
 * that would skew metrics: step s, rank r, slot b gets sample s*P*B + b*P + r
 * if that is below N, otherwise an empty slot (-1); every rank still takes
 * ceil(N / (P*B)) steps. */
#ifndef TS_IO_SAMPLER_H
#define TS_IO_SAMPLER_H

#include <stdint.h>

typedef enum { TS_SAMPLER_TRAIN = 0, TS_SAMPLER_EVAL } ts_sampler_mode;

typedef struct ts_sampler ts_sampler;

/* Local (no communication: rank and size are the caller's data-parallel
 * rank and group size). n samples; subset (n entries, or NULL = 0..n-1)
 * maps sampler positions to dataset indices (for train/validation splits;
 * copied). */
int ts_sampler_create(int64_t n, const int64_t *subset, int rank, int size, int batch, uint64_t seed,
                      ts_sampler_mode mode, ts_sampler **out);
void ts_sampler_destroy(ts_sampler **s);

/* Local. The next step: idx[batch] dataset indices (-1 = empty slot, eval
 * only) and pos[batch] their global stream positions (unique per sample
 * draw: key per-sample randomness on them). Returns 0; in eval mode returns
 * 1 (and fills nothing) once the pass is over. */
int ts_sampler_next(ts_sampler *s, int64_t *idx, int64_t *pos);

/* Local. Steps in one epoch (train: ceil(N / (P*B)), the stream having no
 * epoch boundary at step granularity; eval: the whole pass). */
int64_t ts_sampler_steps_per_epoch(const ts_sampler *s);
/* Local. The epoch the next step starts in (train: position / N). */
int64_t ts_sampler_epoch(const ts_sampler *s);

/* Local. Save and restore: the position is the next global stream position
 * (train) or the next step (eval); restoring on another number of ranks
 * continues the same global stream. */
int64_t ts_sampler_position(const ts_sampler *s);
int ts_sampler_seek(ts_sampler *s, int64_t position);

/* Local. Sample at global stream position p (train mode order). */
int64_t ts_sampler_at(ts_sampler *s, int64_t p);

/* Local. A seeded split of 0..n-1 into n_val validation and n - n_val
 * training indices (both ascending); the caller owns nothing (fills arrays
 * of n - n_val and n_val entries). */
void ts_sampler_split(int64_t n, int64_t n_val, uint64_t seed, int64_t *train, int64_t *val);

/* Local. Cross-validation by subject (data.folds, data.fold): the subject
 * of sample i is names[i] up to the first occurrence of delim (the whole
 * name when delim is NULL, empty or absent from it); the distinct subjects,
 * sorted by name, are shuffled with seed and the subject at position p
 * belongs to fold p % folds. Samples of fold `fold`'s subjects go to val,
 * the others to train (both ascending; arrays of n entries each), so every
 * scan of a subject lands on the same side and the folds do not depend on
 * the sample order of the file. Errors: TS_ERR_CONFIG (fewer subjects than
 * folds, fold out of range), TS_ERR_NOMEM. */
int ts_sampler_folds(const char *const *names, int64_t n, int folds, int fold, uint64_t seed, const char *delim,
                     int64_t *train, int64_t *ntrain, int64_t *val, int64_t *nval);

#endif
