/* The prefetching loader: a background thread draws the next batches
 * (sampler -> patch reads -> augmentation -> normalisation) into a ring of
 * prefetch + 1 batch buffers while the caller computes on the current one,
 * so reading overlaps compute; memory is bounded by the ring. Batches are
 * identical whatever the prefetch depth, thread timing or number of ranks
 * (each sample's randomness is keyed by its global stream position). With
 * spatial parallelism a group of ranks holds one box each of every patch:
 * each reads only its box, and the boxes are bit for bit those of the
 * whole patch (docs/config-data.md, "Spatial parallelism"). The data.*
 * config keys live here (ts_io_config_keys, docs/config-data.md). */
#ifndef TS_IO_LOADER_H
#define TS_IO_LOADER_H

#include <mpi.h>
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
    int64_t sub_lo[3], sub_size[3]; /* the box of every patch this rank holds (spatial parallelism), in patch
                                     * coordinates (D, H, W); sub_size all 0 = the whole patch (as today) */
    MPI_Comm group;            /* the ranks holding the other boxes of the same patches (they use the same
                                * data-parallel rank/size, seed, sampler and patch options; their boxes tile the
                                * patch, so in a group of > 1 no rank may leave sub_size all 0); MPI_COMM_NULL
                                * (or a zero handle, as in memset opts) or a group of 1: no communication, and
                                * the box must be the whole patch. ts_loader_opts_from_config sets MPI_COMM_NULL. */
} ts_loader_opts;

typedef struct ts_batch {
    ts_tensor image;           /* [B, C, D, H, W] float32; [B, C, sub_size...] with a box */
    ts_tensor label;           /* [B, D, H, W] uint8; [B, sub_size...] with a box */
    int64_t sample[TS_LOADER_MAX_BATCH]; /* dataset index per slot; -1 = empty slot (eval only, zero-filled) */
    int64_t step;              /* 0, 1, ... since create or seek */
    int64_t position;          /* sampler position before this batch */
    int64_t next_position;     /* sampler position after it: save this to resume after the batch */
} ts_batch;

typedef struct ts_loader ts_loader;

/* Local. Fills the patch, prefetch and normalisation options from the data.*
 * keys of cfg (batch, seed and mode are the caller's; no box, group
 * MPI_COMM_NULL). */
int ts_loader_opts_from_config(const ts_config *cfg, ts_loader_opts *o);
/* Local. Dataset open options from data.driver, data.cache_mb, data.patch. */
int ts_dataset_opts_from_config(const ts_config *cfg, ts_dataset_opts *o);

/* Starts a loader on ds (borrowed: while the loader lives, only the
 * loader's thread uses ds) for data-parallel rank `rank` of `size`.
 * Local without a group (o->group MPI_COMM_NULL or of size 1). With a group
 * of size > 1: collective on o->group, which it duplicates; every rank of
 * the group passes the same rank, size, batch, seed, mode, subset and patch
 * options and its own box (o->sub_lo, o->sub_size), the boxes tiling the
 * patch (any tiling, not only grids); errors (bad arguments, a
 * disagreement, boxes that overlap or leave gaps) are agreed: every rank of
 * the group fails, and *out stays NULL. */
int ts_loader_create(ts_dataset *ds, int rank, int size, const ts_loader_opts *o, ts_loader **out);
/* Waits for the next batch; the previous batch is handed back to the
 * loader. Returns 0 and *b, or 1 when an eval pass is over, or an error
 * (raised on the loader's thread, with its message).
 * Without a group: local; callers in a data-parallel job agree on errors
 * (ts_err_agree) before their collectives.
 * With a group: collective on the group (every rank calls it once per batch,
 * in the same order as the others; it never blocks in MPI on the loader's
 * thread). One MPI_Allreduce carries the error flags and the per-channel
 * min/max of every sample's box, then the intensity augmentation (gamma
 * over the whole patch's range, scale, shift) is applied here, on the
 * caller's thread. Its result is agreed: all ranks return 0 with their box,
 * or all return 1, or all return an error: a rank whose own part failed its
 * own message, the others TS_ERR_REMOTE "rank R of the spatial group failed
 * to prepare its part of batch S" (R: rank in the group, S: the batch's
 * step). After an error every later call returns the same error at once,
 * without communication, until ts_loader_seek. */
int ts_loader_next(ts_loader *l, const ts_batch **b);
/* Local. Position to save after the last batch returned (the sampler's). */
int64_t ts_loader_position(const ts_loader *l);
/* Local. Restarts from a saved position (drops prefetched batches, clears
 * an error). With a group, every rank of the group seeks to the same
 * position before its next ts_loader_next. */
int ts_loader_seek(ts_loader *l, int64_t position);
/* Local. Seconds the caller waited in ts_loader_next (time compute was
 * stalled on data; with a group this includes the reduction and the
 * intensity augmentation done there). */
double ts_loader_wait_seconds(const ts_loader *l);
/* Stops the thread and frees the buffers; accepts NULL. With a group it
 * also frees the duplicated communicator (MPI_Comm_free: collective in the
 * standard, without synchronisation in MPICH), so call it on every rank of
 * the group, before MPI_Finalize. */
void ts_loader_destroy(ts_loader **l);

#endif
