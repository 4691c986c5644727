/* One data-parallel training step, shared by `tessera train` and
 * `tessera bench step`: forward and loss per micro-batch, backward with
 * gradient buckets queued on the collectives' progress thread as backward
 * finishes them (ts_dp), then the wait and the optimizer. Optional
 * synchronised batch norm over the same group. Times each phase. */
#ifndef TS_TRAIN_STEP_H
#define TS_TRAIN_STEP_H

#include "collectives/coll.h"
#include "src/model/unet.h"
#include "src/optim/optim.h"
#include "src/parallel/dp.h"

typedef struct ts_stepper ts_stepper;

typedef struct ts_step_times {
    double forward, backward, comm_exposed, comm_total, optimizer; /* seconds, accumulated */
} ts_step_times;

/* Local (the hooks it installs are collective when used). coll: the
 * data-parallel group (size 1 is fine); borrowed, like m and opt. */
int ts_stepper_create(ts_unet *m, ts_optim *opt, ts_coll *coll, double bucket_mb, int sync_bn, ts_stepper **out);
void ts_stepper_destroy(ts_stepper **s);
/* Collective on coll. Zeroes the gradients when first; forward, loss and
 * backward of one micro-batch; when last, the gradient buckets go out during
 * backward. *loss: this rank's loss. */
int ts_stepper_micro(ts_stepper *s, const ts_tensor *image, const ts_tensor *label, int first, int last, double *loss);
/* Collective. Waits for the buckets (gradients averaged over the group),
 * divides by accum micro-batches, steps the optimizer. */
int ts_stepper_update(ts_stepper *s, int accum);
/* Local. Accumulated phase times; number of buckets. */
const ts_step_times *ts_stepper_times(const ts_stepper *s);
int ts_stepper_buckets(const ts_stepper *s);

#endif
