/* The data-path benchmark behind `tessera bench io`: a config's dataset and
 * loader timed in two phases of one run: (1) read: every rank reads its
 * share of the samples whole (raw chunks, checksums verified), R
 * repetitions, median -> read_GBps; (2) loader: the configured loader
 * (patches, augmentation, normalisation, prefetch thread) delivers batches
 * as fast as it can -> samples_per_s. It reads the [data] section of a
 * config (and train.batch, train.seed, parallel.sp, parallel.sp_dims);
 * other sections are ignored here (they belong to `tessera train`). With
 * parallel.sp = S the ranks form groups of S consecutive ranks, each rank
 * loading its box of every patch as in training (so it lives in src/bench,
 * above src/parallel). ts_io_bench_dump writes the first batch's augmented
 * patches as NIfTI for inspection (docs/medical.md). Internal to the
 * library (not installed); the command prints. */
#ifndef TS_BENCH_BENCH_IO_H
#define TS_BENCH_BENCH_IO_H

#include <mpi.h>
#include <stdint.h>

#include "src/core/config.h"

/* the settings: the data keys (io config keys), the batch and the seed */
typedef struct ts_io_bench_cfg {
    ts_config *cfg;        /* data.* keys; owned */
    const char *path;      /* the config file (borrowed) */
    int64_t batch, seed;   /* train.batch (default 2), train.seed (default 0) */
    int64_t sp;            /* parallel.sp (default 1) */
    char sp_dims[64];      /* parallel.sp_dims (default auto) */
    int err;
} ts_io_bench_cfg;

typedef struct ts_io_bench_result {
    char path[1024], driver[32]; /* data.path, data.driver */
    int64_t samples;
    int ranks, repeat;
    int replicas;          /* data-parallel replicas: ranks / parallel.sp */
    uint64_t bytes;        /* read by all ranks in one repetition */
    double read_s;         /* median repetition (the slowest rank's) */
    double read_GBps, read_samples_per_s;
    long long steps, batch;
    int64_t patch[3];
    int augment, prefetch;
    double samples_per_s;  /* loader phase; 0 when skipped (steps 0) */
    double load_s, wait_s; /* the slowest rank's loader time; this rank's time waiting for batches */
} ts_io_bench_result;

/* Local. Reads the config file at path (INI): the [data] section and
 * train.batch, train.seed, parallel.sp, parallel.sp_dims; other sections are ignored. Errors name
 * file:line or the key. *c is set up first (free with ts_io_bench_cfg_free
 * even after an error). */
int ts_io_bench_cfg_load(const char *path, ts_io_bench_cfg *c);
/* Local. One key = value (where: for the message, e.g. "command line"):
 * 0, a TS_ERR_* code for a bad value, or -1 when the key is not one of the
 * benchmark's (data.*, train.batch, train.seed, parallel.sp, parallel.sp_dims). */
int ts_io_bench_cfg_set(ts_io_bench_cfg *c, const char *key, const char *value, const char *where);
/* Local. Frees c->cfg. */
void ts_io_bench_cfg_free(ts_io_bench_cfg *c);

/* Collective on comm: both phases (steps = 0 skips the loader; warm
 * warm-up batches first; repeat >= 1 read repetitions). Errors agreed. */
int ts_io_bench_run(MPI_Comm comm, const ts_io_bench_cfg *c, long long steps, long long warm, long long repeat,
                    ts_io_bench_result *r);
/* Collective on comm: instead of timing, writes the first batch's training
 * patches (train.batch per replica, augmented as configured) to
 * dir/patch-P_image.nii (float32, channels along t) and
 * dir/patch-P_label.nii (uint8), P the sample's stream position: the same
 * files whatever the number of ranks and parallel.sp, for a seed. dir must
 * be a writable directory (checked on every rank before any work). *n is the
 * number of patches written. Errors agreed. */
int ts_io_bench_dump(MPI_Comm comm, const ts_io_bench_cfg *c, const char *dir, long long *n);
/* Local. Writes r as JSON (samples_per_s, read_GBps, bytes, ...; config:
 * the config path) to path. */
int ts_io_bench_write_json(const char *path, const ts_io_bench_result *r, const char *config);

#endif
