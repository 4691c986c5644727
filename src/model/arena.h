/* The parameter arena: every parameter, its gradient, the optimizer state
 * and the buffers (batch-norm running statistics) of a model in one
 * contiguous allocation, with named views. Layout, in floats:
 *   [ params | grads | state 0 | state 1 ... | buffers ]
 * params, grads and each state region have the same size and the same
 * offsets, each tensor starting on a 64-byte boundary (padding stays zero),
 * so that optimizers, gradient buckets, checkpoints and sharding are offset
 * arithmetic over flat regions. Names are PyTorch's state_dict keys.
 * A sharded optimizer (parallel.zero = 1, docs/parallelism.md) allocates
 * the arena without state and then shard-sized state regions of their own
 * (ts_arena_alloc_state): which parameter floats they hold is its mapping. */
#ifndef TS_MODEL_ARENA_H
#define TS_MODEL_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/tensor.h"

#define TS_PARAM_NAME_MAX 64
#define TS_ARENA_MAX_STATE 4

typedef enum { TS_PARAM = 0, TS_BUFFER = 1 } ts_param_kind;

typedef struct ts_param {
    char name[TS_PARAM_NAME_MAX]; /* "enc0.conv1.weight" */
    ts_param_kind kind;
    ts_dtype dtype; /* float32; int64 for num_batches_tracked buffers */
    int ndim;
    int64_t shape[5];
    int64_t numel;
    size_t offset; /* in floats from the start of its region */
} ts_param;

typedef struct ts_arena {
    ts_param *p;
    int n, cap;
    size_t nparam;  /* floats per params/grads/state region (padded) */
    size_t nbuf;    /* floats in the buffer region */
    int nstate;     /* optimizer state regions */
    size_t nstate_floats; /* floats per state region: nparam, or a shard's size (ts_arena_alloc_state) */
    float *base;    /* the allocation (NULL until ts_arena_alloc) */
    float *state_base; /* shard-sized state regions (ts_arena_alloc_state), else NULL */
    float *params, *grads, *state[TS_ARENA_MAX_STATE], *buffers;
    /* the GPU mirror (ts_arena_alloc_device), NULL without one: params,
     * grads and buffers at the host regions' offsets, in device memory;
     * with the state on the GPU (ts_arena_device_master) also the
     * optimizer state regions, and dev_master set */
    float *dev_base, *dev_params, *dev_grads, *dev_buffers;
    float *dev_state[TS_ARENA_MAX_STATE];
    float *dev_scratch; /* TS_ARENA_DEV_SCRATCH floats of device scratch (the optimizer's sums) */
    int dev_master;
} ts_arena;

/* floats of device scratch after the mirror's regions */
#define TS_ARENA_DEV_SCRATCH 512

/* Local. Empty arena / frees it (NULL-safe, sets *a = NULL). */
int ts_arena_create(ts_arena **out);
void ts_arena_destroy(ts_arena **a);
/* Local. Declares a tensor before ts_arena_alloc; *index receives its slot.
 * Duplicate names are TS_ERR_INTERNAL. */
int ts_arena_add(ts_arena *a, const char *name, ts_param_kind kind, ts_dtype dtype, int ndim, const int64_t *shape,
                 int *index);
/* Local. Allocates and zeroes the arena with nstate optimizer state regions. */
int ts_arena_alloc(ts_arena *a, int nstate);
/* Local. After ts_arena_alloc(a, 0): nstate state regions of n floats
 * each, zeroed, in an allocation of their own (a shard of the state: the
 * named state views of ts_arena_state are then empty). Calling it again
 * replaces them. */
int ts_arena_alloc_state(ts_arena *a, int nstate, size_t n);
/* Local. Index of a name, or -1. */
int ts_arena_find(const ts_arena *a, const char *name);
/* Local. Views (not owning) of tensor i: value, gradient (params only),
 * optimizer state s (params only; no data when the state is sharded). */
ts_tensor ts_arena_value(const ts_arena *a, int i);
ts_tensor ts_arena_grad(const ts_arena *a, int i);
ts_tensor ts_arena_state(const ts_arena *a, int s, int i);
/* Local. Zeroes all gradients (the mirror's too, where there is one). */
void ts_arena_zero_grad(ts_arena *a);

/* ---- the GPU mirror (train.engine = cuda, docs/gpu.md) ----
 * The host regions stay the master copy: optimizers, gradient buckets,
 * clipping, checkpoints and sharding work on them unchanged. The layers
 * read the mirror's params and buffers and write its grads; the model
 * copies params and buffers up before a forward (ts_arena_to_device), the
 * float buffers (batch-norm running statistics) back after a training
 * forward (ts_arena_buffers_to_host) and the gradients back when backward
 * ends (ts_arena_grads_to_host). int64 buffers (the batch-norm
 * counters) live on the host only. All local; copies complete before the
 * calls return. */
/* Local. After ts_arena_alloc: device storage for params, grads and
 * buffers (the device must be open); TS_ERR_UNSUPPORTED without CUDA. */
int ts_arena_alloc_device(ts_arena *a);
/* Local. Device views of entry i's value and gradient (host views where
 * there is no mirror, and for int64 buffers, which stay on the host). */
ts_tensor ts_arena_dev_value(const ts_arena *a, int i);
ts_tensor ts_arena_dev_grad(const ts_arena *a, int i);
/* Local. Host params and buffers to the mirror. */
int ts_arena_to_device(ts_arena *a);
/* Local. The mirror's float buffers to the host. */
int ts_arena_buffers_to_host(ts_arena *a);
/* Local. Every gradient from the mirror to the host (a no-op without a
 * mirror): one copy. */
int ts_arena_grads_to_host(ts_arena *a);

/* ---- the state on the GPU (TESSERA_CUDA_STATE=device, docs/gpu.md) ----
 * The device regions become the master copy of the parameters and the
 * optimizer state: the optimizer steps them there (src/optim), the
 * gradients are reduced there (src/train/step.c), nothing goes up before a
 * forward but the buffers (which stay host-mastered: the running
 * statistics come down after a training forward as before). Whoever reads
 * or writes the host's params or state brackets it: ts_arena_pull before
 * reading (checkpoints, the emergency state), ts_arena_push after writing
 * (a resume). A sharded state (ts_arena_alloc_state) stays on the host. */
/* Local. After ts_arena_alloc_device: device state regions (the arena's
 * nstate), params, state and buffers copied up; idempotent. Errors: no
 * mirror, a sharded state, no device memory. */
int ts_arena_device_master(ts_arena *a);
/* Local. The device's params and state, floats [lo, hi) of their regions
 * (a pipeline stage's own: ts_stepper_param_range), to the host (a no-op
 * unless the state is on the GPU). */
int ts_arena_pull(ts_arena *a, size_t lo, size_t hi);
/* Local. The host's params, state (when on the GPU) and buffers to the
 * mirror (a no-op without one). */
int ts_arena_push(ts_arena *a);
/* Local. Number of trainable scalars (without padding). */
int64_t ts_arena_count(const ts_arena *a);

#endif
