/* The trainer: `tessera train CONFIG` on a dp x pp x sp grid: data-parallel
 * replicas, each a pipeline of stages, each sample split over a spatial
 * group (docs/parallelism.md); gradient buckets reduced while backward
 * runs, optional synchronised batch norm, global batch = train.batch x
 * train.accum x dp with the linear LR scaling rule and warm-up,
 * sliding-window evaluation with per-class Dice,
 * checkpoints with resume, metrics.jsonl, perf.json and progress. */
#ifndef TS_TRAIN_TRAINER_H
#define TS_TRAIN_TRAINER_H

#include <mpi.h>
#include <signal.h>

#include "src/core/config.h"
#include "src/model/unet.h"

/* [train] (the keys the engine does not declare), [parallel], [eval],
 * [run], [ckpt] keys; NULL-terminated. */
extern const ts_cfg_key ts_train_config_keys[];

/* Collective on world. Runs the training the config describes; name is the
 * default run name (config file name without .ini). Errors agreed.
 * stop (may be NULL) is polled once per step (the ranks agree on it): when
 * any rank sees it non-zero (a signal handler set it: SIGTERM from a
 * scheduler before preemption, SIGUSR1 from `#SBATCH --signal`), all ranks
 * write a checkpoint and return TS_ERR_STOPPED; rerunning resumes. */
int ts_train_run(const ts_config *cfg, MPI_Comm world, const char *name, volatile sig_atomic_t *stop);

/* A rank's memory plan, MiB. */
typedef struct ts_mem_plan {
    double activations_mb; /* the model's activations, gradients and halo faces (ts_unet_plan_bytes) */
    double params_mb;      /* parameter arena: values, gradients, optimizer state, buffers */
    double data_mb;        /* batch slots and reading scratch */
    double scratch_mb;     /* kernel scratch (an allowance) */
    double halo_mb;        /* the halo exchange's send and receive buffers */
    double eval_mb;        /* a whole validation volume and its class sums (added when evaluation is on) */
    double process_mb;     /* what the process held before the model (libraries, MPI, HDF5) */
    double total_mb;
} ts_mem_plan;

/* Local. The plan for m with the given split (NULL: none; the model's own
 * buffers are untouched) and batches of `batch` boxes of box voxels with
 * `channels` image channels, prefetch batches ahead, sp_dims the spatial
 * grid (NULL: none); read_bytes what the loader allocates for an augmented
 * patch (ts_patch_read_bytes; 0 or less than a box's: a box's); process_mb
 * what the process held before (the
 * baseline, e.g. ts_train_rss_mb() at start). eval_mb is left 0. */
int ts_train_memory_plan(ts_unet *m, const ts_unet_split *split, const ts_unet_cfg *u, int batch, int channels,
                         int prefetch, const int64_t box[3], const int sp_dims[3], double read_bytes, double process_mb,
                         ts_mem_plan *mp);
/* Local. Resident memory of this process now, MiB. */
double ts_train_rss_mb(void);
/* Local. Peak resident memory of this process so far, MiB. */
double ts_train_peak_rss_mb(void);

#endif
