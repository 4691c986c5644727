/* Random batches for runs without a dataset (`tessera train` with data.path
 * unset, `tessera bench step`): normal images and uniform labels. Each
 * plane of each sample slot and step comes from its own Philox stream, so
 * a rank holding one box of the patch (spatial parallelism) generates
 * exactly the voxels a single rank would have at those positions. Streams
 * are keyed (seed, slot | 2^31, (step x D + plane) x (C + 1) + channel),
 * the last taken modulo 2^32 (it repeats after 2^32 / (D (C + 1)) steps). */
#ifndef TS_TRAIN_SYNTHETIC_H
#define TS_TRAIN_SYNTHETIC_H

#include <stdint.h>

/* Local. image [batch, C, size...] and label [batch, size...] receive the
 * box [lo, lo + size) of the patch (patch[3] voxels) of step `step`, for
 * the `batch` sample slots of data-parallel replica `replica`. */
void ts_synthetic_batch(uint64_t seed, int replica, int64_t step, int batch, int C, int classes, const int64_t patch[3],
                        const int64_t lo[3], const int64_t size[3], float *image, uint8_t *label);

#endif
