/* The prefetching loader: a background thread draws the next batches
 * (sampler -> patch reads -> augmentation -> normalisation) into a ring of
 * prefetch + 1 batch buffers while the caller computes on the current one,
 * so reading overlaps compute; memory is bounded by the ring. Batches are
 * identical whatever the prefetch depth, thread timing or number of ranks
 * (each sample's randomness is keyed by its global stream position). The
 * data.* config keys live here (ts_io_config_keys, docs/config-data.md). */
#ifndef TS_IO_LOADER_H
#define TS_IO_LOADER_H

#include <stdint.h>

#include "io/dataset.h"
#include "io/patch.h"
#include "io/sampler.h"
#include "src/core/config.h"
#include "src/core/tensor.h"

#define TS_LOADER_MAX_BATCH 1024

/* The data.* keys (io owns them all; the engine reads data.patch from here). */
extern const ts_cfg_key ts_io_config_keys[];

typedef struct ts_loader_opts {
    ts_patch_opts patch;
    int batch;                 /* micro-batch per rank */
    int prefetch;              /* batches prepared ahead; 0 = in the caller's thread */
    uint64_t seed;             /* sampler and augmentation seed */
    ts_sampler_mode mode;      /* train: random patches, augmentation; eval: centred patches, each sample once */
    const int64_t *subset;     /* dataset indices to draw from (copied), or NULL = all */
    int64_t nsubset;
} ts_loader_opts;

typedef struct ts_batch {
    ts_tensor image;           /* [B, C, D, H, W] float32 */
    ts_tensor label;           /* [B, D, H, W] uint8 */
    int64_t sample[TS_LOADER_MAX_BATCH]; /* dataset index per slot; -1 = empty slot (eval only, zero-filled) */
    int64_t step;              /* 0, 1, ... since create or seek */
    int64_t position;          /* sampler position before this batch */
    int64_t next_position;     /* sampler position after it: save this to resume after the batch */
} ts_batch;

typedef struct ts_loader ts_loader;

/* Local. Fills the patch, prefetch and normalisation options from the data.*
 * keys of cfg (batch, seed and mode are the caller's). */
int ts_loader_opts_from_config(const ts_config *cfg, ts_loader_opts *o);
/* Local. Dataset open options from data.driver, data.cache_mb, data.patch. */
int ts_dataset_opts_from_config(const ts_config *cfg, ts_dataset_opts *o);

/* Local. Starts a loader on ds (borrowed: while the loader lives, only the
 * loader's thread uses ds) for data-parallel rank `rank` of `size`. */
int ts_loader_create(ts_dataset *ds, int rank, int size, const ts_loader_opts *o, ts_loader **out);
/* Local. Waits for the next batch; the previous batch is handed back to the
 * loader. Returns 0 and *b, or 1 when an eval pass is over, or an error
 * (raised on the loader's thread, with its message). Callers in a
 * data-parallel job agree on errors (ts_err_agree) before their collectives. */
int ts_loader_next(ts_loader *l, const ts_batch **b);
/* Local. Position to save after the last batch returned (the sampler's). */
int64_t ts_loader_position(const ts_loader *l);
/* Local. Restarts from a saved position (drops prefetched batches). */
int ts_loader_seek(ts_loader *l, int64_t position);
/* Local. Seconds the caller waited in ts_loader_next (time compute was stalled on data). */
double ts_loader_wait_seconds(const ts_loader *l);
/* Local. Stops the thread and frees the buffers; accepts NULL. */
void ts_loader_destroy(ts_loader **l);

#endif
