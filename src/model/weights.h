/* Weights files (docs/formats-weights.md): HDF5
 * with one dataset per parameter or buffer under /params/<dotted name>,
 * float32 (int64 for num_batches_tracked), PyTorch layout; plus the
 * helpers `tessera model` uses for /image, /label, /logits and /loss.
 * Serial HDF5 on one rank; errors name the file and the dataset. */
#ifndef TS_MODEL_WEIGHTS_H
#define TS_MODEL_WEIGHTS_H

#include <hdf5.h>

#include "src/core/tensor.h"
#include "src/model/arena.h"

/* Local. Writes every parameter and buffer of the arena under /params of
 * an open file (the group is created). */
int ts_weights_put(hid_t file, const char *path, const ts_arena *a);
/* Local. Creates (truncates) path and writes the arena's /params. */
int ts_weights_save(const ts_arena *a, const char *path);
/* Local. Loads every parameter and buffer of the arena from path. A missing
 * or mis-shaped dataset, a non-numeric one, or a dataset under /params that
 * the model does not have is an error naming it; num_batches_tracked may be
 * absent (then 0). */
int ts_weights_load(ts_arena *a, const char *path);

/* Local. Writes one dataset (ndim 0 = scalar) of dtype float32, int64 or
 * uint8 at name (absolute, parent groups must exist). */
int ts_weights_write_dataset(hid_t file, const char *path, const char *name, const ts_tensor *t);
/* Local. Reads dataset name into a newly allocated tensor of dtype want
 * (HDF5 converts numeric types); ndim = -1 accepts any rank, otherwise the
 * rank must match. The message names path and name. */
int ts_weights_read_dataset(hid_t file, const char *path, const char *name, ts_dtype want, int ndim, ts_tensor *out);
/* Local. 1 if the link exists in the file. */
int ts_weights_exists(hid_t file, const char *name);

/* Local. Opens path read-only / creates it (truncating), with HDF5's error
 * printing silenced; errors name the file. */
int ts_weights_open(const char *path, hid_t *file);
int ts_weights_create(const char *path, hid_t *file);

#endif
