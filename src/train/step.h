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
#include "src/parallel/buckets.h"
#include "src/parallel/spatial.h"
#include "src/core/perf.h"
#include "src/parallel/pipeline.h"

typedef struct ts_stepper ts_stepper;

typedef struct ts_step_times {
    double forward, backward, comm_exposed, comm_total, optimizer; /* seconds, accumulated */
    int64_t buckets_early; /* gradient buckets queued while backward ran, accumulated */
} ts_step_times;

/* Local (the hooks it installs are collective when used). coll: the ranks
 * over which gradients are averaged (data-parallel replicas x spatial
 * pieces; size 1 is fine); sp: the spatial group (NULL: no split), whose
 * halo exchange and sums the model's split hooks use (installed by
 * ts_spatial_split_model, src/parallel/split_model.h), and whose size
 * scales the loss gradient (the pieces of a sample add up, the average
 * over coll divides by dp x sp). sync_bn: batch norm over all of coll
 * (else over sp). All borrowed, like m and opt. The model's activations are freed (set up
 * again for the box shape by the next forward). */
int ts_stepper_create(ts_unet *m, ts_optim *opt, ts_coll *coll, double bucket_mb, int sync_bn, ts_spatial *sp,
                      ts_stepper **out);
void ts_stepper_destroy(ts_stepper **s);
/* Collective on coll. Zeroes the gradients when first; forward, loss and
 * backward of one micro-batch; when last, the gradient buckets go out during
 * backward. *loss: this rank's loss. */
int ts_stepper_micro(ts_stepper *s, const ts_tensor *image, const ts_tensor *label, int first, int last, double *loss);
/* Collective on pp_comm (duplicated). Makes the stepper a pipeline stage's
 * (pl borrowed; the model is pl's stage): buckets and the optimizer cover
 * the stage's parameters only (coll: the stage's dp x sp group); pp_comm
 * adds the stages' gradient norms for clipping. */
int ts_stepper_set_pipeline(ts_stepper *s, ts_pipeline *pl, MPI_Comm pp_comm);
/* Local; after ts_stepper_set_pipeline if any. Shards the optimizer over
 * coll's ranks (parallel.zero = 1, docs/parallelism.md): the gradient
 * buckets are reduce-scattered, so ts_stepper_reduce leaves this rank the
 * averaged gradients of its shard (its block of every bucket) only;
 * ts_stepper_apply steps the shard and all-gathers the parameters bucket by
 * bucket. The arena must have been allocated without optimizer state
 * (ts_unet_create with nstate 0): it gets state regions of the shard's size
 * (ts_arena_alloc_state). Errors: no memory. */
int ts_stepper_set_zero(ts_stepper *s);
/* Local. Floats of each optimizer state region this rank holds (the whole
 * parameter region without sharding). */
size_t ts_stepper_state_floats(const ts_stepper *s);
/* Collective on comm, in which every float of the parameter region has
 * exactly one owner (world: the shard groups of all pipeline stages).
 * Sharded stepper, for a checkpoint: rank 0 of comm gets the whole optimizer
 * state region st in full[st] (nparam floats each, caller-owned; padding
 * zero); the other ranks send their shards (full unused, may be NULL) and
 * never hold the whole state. Errors (no memory on rank 0) are agreed. */
int ts_stepper_state_gather(ts_stepper *s, MPI_Comm comm, float *const *full);
/* Collective on comm (as above). Sharded stepper, for a resume: each rank
 * gets its shard of rank 0's whole state regions full[st]. */
int ts_stepper_state_scatter(ts_stepper *s, MPI_Comm comm, float *const *full);
/* Collective on the pipeline, spatial and data-parallel groups. One step's
 * micro-batches through the pipeline (ts_pipeline_step), the buckets going
 * out during the last backward; then call ts_stepper_update(s, M). *loss:
 * the mean micro-batch loss on the last stage, 0 elsewhere. */
int ts_stepper_pipe_step(ts_stepper *s, ts_pipeline_next next, void *ctx, double *loss);
/* Collective. Waits for the buckets (gradients averaged over the group),
 * divides by accum micro-batches, steps the optimizer (over the stage's
 * parameters with a pipeline): ts_stepper_reduce then ts_stepper_apply,
 * between which a caller may look at the gradients (ts_stepper_grads_finite)
 * and skip the apply. */
int ts_stepper_update(ts_stepper *s, int accum);
int ts_stepper_reduce(ts_stepper *s, int accum);
int ts_stepper_apply(ts_stepper *s);
/* Local. The floats [*lo, *hi) of the parameter region this rank steps
 * (its pipeline stage's; all without one). */
void ts_stepper_param_range(const ts_stepper *s, size_t *lo, size_t *hi);
/* Local. Sharded (parallel.zero): *n pieces [lo[k], lo[k] + len[k]) of the
 * parameter region whose reduced gradients this rank holds; else *n = 0. */
void ts_stepper_shard(const ts_stepper *s, int *n, const size_t **lo, const size_t **len);
/* Local. 1 if this rank's reduced gradients (its stage's range; its shard
 * when sharded) are all finite. */
int ts_stepper_grads_finite(const ts_stepper *s);
/* Local. Makes this rank's gradients non-finite (fault injection: TESSERA_FAULT=nan). */
void ts_stepper_poison(ts_stepper *s);
/* Local. Loss scaling (train.precision = fp16, src/optim/loss_scale.h): the
 * loss gradient of later micro-batches is multiplied by scale (on top of the
 * spatial factor) and ts_stepper_reduce divides the gradients by it. 1: off. */
void ts_stepper_set_loss_scale(ts_stepper *s, double scale);
/* Local. on 1: the loss gradient of later micro-batches is infinite (the
 * scale times 2^128), so backward's gradients overflow while the loss stays
 * finite (fault injection: TESSERA_FAULT=overflow); on 0: back to the scale. */
void ts_stepper_inject_overflow(ts_stepper *s, int on);
/* Collective on comm (duplicated). The ranks that agree on errors in a step:
 * a forward (or loss) that fails on one rank fails on all before backward
 * starts any bucket; a backward that fails still sends its buckets and the
 * error is agreed in ts_stepper_reduce. Without it errors are local. */
int ts_stepper_set_agree(ts_stepper *s, MPI_Comm comm);
/* Collective on coll (the stepper's group). The parameters, gradients and
 * optimizer state on the GPU (TESSERA_CUDA_STATE=device, docs/gpu.md): the
 * arena's device regions become the master copy (ts_arena_device_master),
 * the buckets reduce the device's gradients as backward finishes them (on
 * the collectives' communication stream, ordered after the layers'
 * kernels), the optimizer, the clipping, the micro-batch and loss-scale
 * division and the finiteness check run on the GPU. Returns 1 when it is
 * set; 0 with the reason in why (n bytes) when this stepper keeps the
 * host's master copy: the model is on the CPU, a sharded state,
 * compression, or a group whose device collectives fail here
 * (NCCL with two ranks on one GPU; agreed, so every rank keeps the host's);
 * < 0 an error. A checkpoint reads the host's copy after ts_arena_pull. */
int ts_stepper_set_device(ts_stepper *s, char *why, size_t n);
/* Collective on world (every rank of the run). The state on the GPU where
 * the environment asks for it and the model is on the GPU: *on = -1 not
 * asked (or the CPU engine), 1 taken (ts_stepper_set_device), 0 not taken,
 * the reason in why (n bytes). Errors (a bad TESSERA_CUDA_STATE, the
 * device's) are agreed over world. */
int ts_stepper_device_asked(ts_stepper *s, MPI_Comm world, int *on, char *why, size_t n);
/* Local. *want = 1 when the environment asks for the state on the GPU
 * (TESSERA_CUDA_STATE=device; host or unset: 0). Errors: another value. */
int ts_stepper_state_wanted(int *want);
/* Local. Phases of every later step also go to p (may be NULL; borrowed):
 * forward, backward, comm_exposed and optimizer bracketed on the calling
 * thread (TS_PH_* of src/train/run.h), comm_total added from the progress
 * thread's figures. */
void ts_stepper_set_perf(ts_stepper *s, ts_perf *p);
/* Local. Gradient compression of the buckets from the next step on
 * (src/parallel/buckets.h; kept across ts_stepper_set_pipeline). */
int ts_stepper_set_compress(ts_stepper *s, const ts_dp_compress *c);
/* Collective on replicas. Local SGD's parameter average: this stage's
 * parameters, the optimizer state and the float buffers (batch-norm
 * statistics) averaged over replicas (the layout's replicas group), timed as
 * TS_PH_PARAM_AVG. A group of one rank does nothing. */
int ts_stepper_average_params(ts_stepper *s, ts_coll *replicas);
/* Local. The bucket reducer (its compression figures). */
const ts_dp *ts_stepper_dp(const ts_stepper *s);
/* Local. Accumulated phase times; number of buckets. */
const ts_step_times *ts_stepper_times(const ts_stepper *s);
int ts_stepper_buckets(const ts_stepper *s);

#endif
