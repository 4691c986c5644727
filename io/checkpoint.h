/* Checkpoints (docs/formats.md): a directory
 * <ckpt>/step-<N>/ holding state.h5 (named tensors: /params/<dotted name>
 * in PyTorch layout as in a weights file, /optim/<state>/<dotted name>,
 * and /meta) and manifest.json, written last. Everything is written under
 * <ckpt>/.tmp-step-<N>/, fsynced, then renamed into place and the parent
 * directory fsynced, so a crash or a full disk never leaves a checkpoint
 * that looks complete, and older checkpoints are never touched before the
 * new one is in place. The manifest records the size and the CRC-32 of
 * state.h5, checked at load. io takes named tensor views, not models. */
#ifndef TS_IO_CHECKPOINT_H
#define TS_IO_CHECKPOINT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "src/core/tensor.h"

typedef struct ts_ckpt_item {
    char name[192]; /* absolute dataset path, e.g. "/params/enc0.conv1.weight" */
    ts_tensor t;    /* view: float32 or int64, PyTorch layout */
} ts_ckpt_item;

typedef struct ts_ckpt_meta {
    int64_t step;             /* optimizer steps taken */
    int64_t epoch;
    int64_t sampler_position; /* next global stream position of the training sampler */
    uint64_t seed;
    uint64_t config_hash;
    int ranks;                /* world size that wrote it (information only) */
    const char *config;       /* resolved config (INI text), stored in /meta/config; may be NULL */
    double loss_scale;        /* fp16 dynamic loss scale (0: none; /meta attribute only when > 0) */
    int64_t loss_scale_good;  /* good steps since the scale last changed */
} ts_ckpt_meta;

/* Collective on comm (every rank passes the same step and items; with
 * data parallelism the replicas are identical, so rank 0 writes). Writes
 * <dir>/step-<step>, keeps the newest `keep` (0 = all), and on failure leaves
 * the existing checkpoints as they were. Errors agree across ranks. out gets
 * the final path (may be NULL). */
int ts_ckpt_save(MPI_Comm comm, const char *dir, const ts_ckpt_item *items, int n, const ts_ckpt_meta *meta, int keep,
                 char *out, size_t outlen);
/* Local. The newest complete checkpoint under dir: 0 with its path and
 * step, 1 if there is none (an incomplete or temporary one is skipped). */
int ts_ckpt_latest(const char *dir, char *path, size_t n, int64_t *step);
/* Local. The newest complete checkpoint under dir older than step `before`
 * (to fall back when the newest one is corrupt): as ts_ckpt_latest. */
int ts_ckpt_before(const char *dir, int64_t before, char *path, size_t n, int64_t *step);
/* Local. 1 if path is a complete checkpoint directory. */
int ts_ckpt_is_complete(const char *path);
/* Local. Reads a checkpoint directory into the views (shapes must match;
 * a missing dataset is an error naming it) and its meta (strings not kept).
 * The manifest's CRC-32 of state.h5 is checked first: a mismatch is
 * TS_ERR_FORMAT saying the checkpoint is corrupt. */
int ts_ckpt_load(const char *path, ts_ckpt_item *items, int n, ts_ckpt_meta *meta);

#endif
