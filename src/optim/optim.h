/* Optimizers over the parameter arena: SGD (momentum, Nesterov, weight
 * decay; PyTorch semantics with dampening 0), AdamW (decoupled weight decay,
 * PyTorch semantics), learning-rate schedules (constant, linear warm-up then
 * cosine or poly) and clipping by the global gradient norm. Updates run over
 * the flat parameter region (padding stays zero); where the arena's state
 * is on the GPU (ts_arena_device_master) they run there. All calls are
 * local; a data-parallel caller reduces the gradients before ts_optim_step. */
#ifndef TS_OPTIM_OPTIM_H
#define TS_OPTIM_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/config.h"
#include "src/model/arena.h"

typedef enum { TS_OPT_SGD = 0, TS_OPT_ADAMW } ts_optim_kind;
typedef enum { TS_SCHED_CONSTANT = 0, TS_SCHED_COSINE, TS_SCHED_POLY } ts_sched_kind;

typedef struct ts_optim_cfg {
    ts_optim_kind kind;
    double lr, momentum, weight_decay;
    int nesterov;
    double beta1, beta2, eps; /* AdamW */
    ts_sched_kind sched;
    int64_t warmup_steps, total_steps;
    double min_lr, poly_power;
    double clip_norm; /* 0: no clipping */
} ts_optim_cfg;

/* train.optimizer, train.lr, ... (NULL-terminated). */
extern const ts_cfg_key ts_optim_config_keys[];

/* Local. Reads and validates the optimizer keys; errors name the key. */
int ts_optim_cfg_from_config(const ts_config *cfg, ts_optim_cfg *o);
/* Local, cannot fail. Optimizer state regions the arena needs (SGD with momentum 1, without 0; AdamW 2). */
int ts_optim_state_count(const ts_optim_cfg *o);

/* Local, cannot fail. Learning rate for step (0-based count of steps already taken): linear
 * warm-up lr * (step+1) / warmup_steps, then constant; cosine from lr to
 * min_lr over total_steps - warmup_steps; or poly lr * (1 - t)^power. */
double ts_optim_lr(const ts_optim_cfg *o, int64_t step);

typedef struct ts_optim {
    ts_optim_cfg cfg;
    int64_t step; /* steps taken */
} ts_optim;

/* Local. One update of every parameter of the arena from its gradient:
 * clips (if configured), applies the schedule's learning rate. lr_out and
 * norm_out (the gradient norm before clipping) may be NULL. */
int ts_optim_step(ts_optim *opt, ts_arena *a, double *lr_out, double *norm_out);

/* Local. The same on the floats [lo, hi) of the regions only (a pipeline
 * stage's parameters); global_norm >= 0 is the gradient norm to clip with
 * (the stages' sums of squares added), < 0: the range's own norm. */
int ts_optim_step_range(ts_optim *opt, ts_arena *a, size_t lo, size_t hi, double global_norm, double *lr_out,
                        double *norm_out);
/* Local. The same on pieces [lo[k], lo[k] + len[k]) of the regions, k <
 * npieces, whose optimizer state lies packed piece after piece in the
 * arena's shard-sized state regions (a sharded optimizer's shard,
 * ts_arena_alloc_state; docs/parallelism.md). global_norm: the gradient norm
 * to clip with (every shard's sums of squares added), required (>= 0) when
 * clipping is on. Errors: a state region too small for the pieces. */
int ts_optim_step_pieces(ts_optim *opt, ts_arena *a, int npieces, const size_t *lo, const size_t *len,
                         double global_norm, double *lr_out);
/* Local. Sum of squares of the gradients [lo, hi) (fixed order). Host
 * gradients only. */
double ts_optim_sumsq(const ts_arena *a, size_t lo, size_t hi);
/* Local. The same where the gradients are (the GPU's when the arena's
 * state is there, ts_arena_device_master), into *out; errors: CUDA's. */
int ts_optim_grad_sumsq(const ts_arena *a, size_t lo, size_t hi, double *out);
/* Local. Gradients [lo, hi) times f, where they are (as above). */
int ts_optim_scale_grads(ts_arena *a, size_t lo, size_t hi, float f);

/* Local. Global L2 norm of the arena's gradients; scales them by
 * max_norm / (norm + 1e-6) when the norm exceeds max_norm (PyTorch
 * clip_grad_norm_). Returns the norm before clipping in *norm. */
int ts_optim_clip(ts_arena *a, double max_norm, double *norm);

/* Local, cannot fail. Kernels on flat arrays of n floats (exposed for tests
 * and sharded use): update p in place with its gradient g and the state
 * buffers (buf; m and v), all borrowed. */
void ts_sgd_update(float *p, const float *g, float *buf, size_t n, double lr, double momentum, double wd, int nesterov);
void ts_adamw_update(float *p, const float *g, float *m, float *v, size_t n, double lr, double b1, double b2,
                     double eps, double wd, int64_t t);

#endif
