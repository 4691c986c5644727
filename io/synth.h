/* Synthetic 3D phantoms for tests and scaling runs of any size: per sample a
 * few ellipsoids and blobs (one or more per foreground class, later shapes
 * drawn over earlier ones) whose voxels form the label; the image is a
 * per-class, per-channel intensity times a smooth multiplicative field, plus
 * Gaussian noise. Sample i depends only on (seed, i), so a dataset is the
 * same whatever the number of ranks that wrote it. */
#ifndef TS_IO_SYNTH_H
#define TS_IO_SYNTH_H

#include <mpi.h>
#include <stdint.h>

#include "io/writer.h"

typedef struct ts_synth_opts {
    int64_t size[3];  /* D, H, W */
    int channels;     /* default 1 */
    int classes;      /* K >= 2, default 3 (background + 2 shape classes) */
    uint64_t seed;
    double noise;     /* noise std relative to the intensity range (default 0.05) */
} ts_synth_opts;

/* Local. Fills s with sample `index` (allocates s->image and s->label; free
 * them with ts_sample_release). */
int ts_synth_sample(const ts_synth_opts *o, int64_t index, ts_sample *s);
void ts_sample_release(ts_sample *s);

/* Collective on comm. Writes count phantoms to path (shards > 1: shard files
 * plus a manifest), each rank synthesising its share. */
int ts_synth_write(MPI_Comm comm, const char *path, const ts_synth_opts *o, int64_t count, int shards, int chunk);

#endif
