/* The trainer: `tessera train CONFIG`. Data-parallel training over all
 * ranks (pipeline and spatial groups are not available yet): gradient
 * buckets reduced while backward runs, optional synchronised batch norm,
 * global batch = train.batch x train.accum x dp with the linear LR scaling
 * rule and warm-up, sliding-window evaluation with per-class Dice,
 * checkpoints with resume, metrics.jsonl, perf.json and progress. */
#ifndef TS_TRAIN_TRAINER_H
#define TS_TRAIN_TRAINER_H

#include <mpi.h>
#include <signal.h>

#include "src/core/config.h"

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

#endif
