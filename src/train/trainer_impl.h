/* What the parts of `tessera train` share (src/train/trainer.c, the loop;
 * trainer_ckpt.c, checkpoints and the emergency state; trainer_eval.c,
 * evaluation; trainer_setup.c, setup, the memory plan and teardown): the
 * trainer's state and the functions one part calls in another. Private to
 * those four files. */
#ifndef TS_TRAIN_TRAINER_IMPL_H
#define TS_TRAIN_TRAINER_IMPL_H

#include "src/train/trainer.h"
#include "collectives/coll.h"
#include "io/checkpoint.h"
#include "src/train/emergency.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/core/launch.h"
#include "src/core/log.h"
#include "src/core/path.h"
#include "src/core/perf.h"
#include "src/core/rng.h"
#include "src/core/timer.h"
#include "src/core/watchdog.h"
#include "src/model/cost.h"
#include "src/model/unet.h"
#include "src/optim/loss_scale.h"
#include "src/optim/optim.h"
#include "src/parallel/buckets.h"
#include "src/parallel/grid.h"
#include "src/parallel/layout.h"
#include "src/parallel/spatial.h"
#include "src/parallel/split_model.h"
#include "src/infer/evaluate.h"
#include "src/train/run.h"
#include "src/model/weights.h"
#include "src/train/grad_dump.h"
#include "src/parallel/pipeline.h"
#include "src/train/step.h"
#include "src/infer/surface.h"
#include "src/train/synthetic.h"
#include "src/train/gradpath.h"

#include <math.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>


typedef struct trainer {
    const ts_config *cfg;
    ts_layout *L;    /* the grid, every group's collectives, the spatial split, the gradient path (src/parallel/layout.h) */
    ts_gradpath *gp; /* how the gradients become the update: plain, compress, zero, local (src/train/gradpath.h) */
    double state_bytes_max;   /* optimizer state bytes on the rank holding the most */
    ts_pipeline *pipe; /* pp > 1 */
    int stage_first[TS_UNET_MAX_LEVELS * 4];
    double unit_cost[TS_UNET_MAX_LEVELS * 4];
    int64_t mem_limit_mb;
    ts_unet *model;
    ts_arena *arena;
    ts_optim opt;
    ts_loss_scaler ls; /* train.precision = fp16: dynamic loss scale */
    ts_dataset *ds;      /* used by the loader's thread only */
    ts_dataset *eval_ds; /* a second handle for evaluation */
    ts_loader *loader;
    ts_stepper *stepper;
    ts_run run;
    ts_unet_cfg ucfg;
    int batch, accum, sync_bn, have_data;
    int64_t total_steps, step, epoch_steps;
    int64_t *val, nval, *trn, ntrn, syn_step;
    /* synthetic data when data.path is unset */
    float *syn_img;
    uint8_t *syn_lab;
    ts_perf *perf;      /* per-phase timers and counters (perf.json) */
    double step_s;      /* wall time of the training steps, with or without perf.timers */
    ts_pipeline_stats pp0; /* the pipeline's figures when perf.warmup_steps ended */
    int64_t early0;        /* the gradient buckets queued in backward by then */
    ts_mem_plan mem_plan;
    double rss0_mb; /* resident memory before the model */
    int64_t samples_done;
    const ts_batch *cur; /* the loader's batch being trained on (error context) */
    int grads_dumped;    /* train.dump_grads written (or not asked for) */
    char edir[1100];     /* ckpt.emergency_dir, resolved ("" when off) */
    double lost_at;      /* resumed from an emergency state: when the peer was lost (epoch seconds), else 0 */
    char lost[256];      /* ... and what was lost */
} trainer;

/* Collective on the gradient group. Averages the float buffers (batch-norm statistics) so every replica holds one model. */
int ts_trainer_sync_buffers(trainer *t);
/* Collective on world. After the gradient path is attached: says how much optimizer state each rank holds. */
int ts_trainer_report_state(trainer *t);
/* Collective on world. Writes a checkpoint of this step (whole state on rank 0). */
int ts_trainer_save_ckpt(trainer *t);
/* Collective on world. Arms the emergency state (ckpt.emergency) for this run. */
int ts_trainer_emergency_arm(trainer *t);
/* Collective on world. Resumes from ckpt.resume or the newest emergency state, if any. */
int ts_trainer_resume(trainer *t);
/* Local. The mirror axes of eval.mirror. */
int ts_trainer_eval_mirror_axes(const ts_config *cfg, int *axes);
/* Collective on world. Dice (and with eval.surface HD95 and NSD) over the validation volumes. */
int ts_trainer_evaluate(trainer *t, double *dice_out, double *hd95_out, double *nsd_out, int *surface_out);
/* Local. Prints and logs an evaluation. */
void ts_trainer_report_dice(trainer *t, const double *dice, const double *hd95, const double *nsd);
/* Collective on world. Everything a run needs, checked before any work. */
int ts_trainer_setup(trainer *t, const ts_config *cfg, MPI_Comm world, const char *name);
/* Collective on world. Frees what setup made. */
void ts_trainer_teardown(trainer *t);

#endif
