/* The gradient path (docs/architecture.md, "The gradient path"): how one
 * step's gradients become every replica's update. One interface with four
 * implementations in an ops table (src/train/gradpath.c, as
 * collectives/registry.c holds the collective algorithms):
 *   plain     bucketed allreduce (average) over the gradient group, the
 *             optimizer over the whole stage;
 *   compress  the same buckets compressed with error feedback
 *             (parallel.compress);
 *   zero      buckets reduce-scattered, each rank steps its shard and holds
 *             its shard's optimizer state, parameters all-gathered
 *             (parallel.zero = 1, ZeRO stage 1);
 *   local     local SGD: gradients averaged only within a replica (global)
 *             or a node (node), parameters, optimizer state and batch-norm
 *             buffers averaged over the replicas every parallel.local_steps
 *             (parallel.local_steps > 1).
 * ts_gradpath_choose holds every rule on which of them combine, with its
 * refusal; the layout (src/parallel/layout.h) makes the groups a path asks
 * for. Training and `bench step` step the optimizer through
 * ts_gradpath_update only. */
#ifndef TS_TRAIN_GRADPATH_H
#define TS_TRAIN_GRADPATH_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "src/core/config.h"
#include "src/parallel/layout.h"
#include "src/train/step.h"

typedef enum {
    TS_GRAD_PLAIN = 0,
    TS_GRAD_COMPRESS,
    TS_GRAD_ZERO,
    TS_GRAD_LOCAL,
    TS_GRAD_KINDS
} ts_grad_kind;

typedef struct ts_gradpath ts_gradpath;

typedef struct ts_gradpath_stats {
    int64_t updates;          /* ts_gradpath_update calls (steps, skipped ones included) */
    int64_t crossed;          /* of them, steps whose gradients were reduced across replicas */
    int64_t param_averages;   /* local SGD: parameter averages over the replicas */
    double param_average_s;   /* time in them */
} ts_gradpath_stats;

/* Local, the same answer on every rank (sizes and keys only): the path L's
 * spec asks for, or TS_ERR_CONFIG naming the keys, where they were set
 * (cfg may be NULL) and why they do not combine. Every such rule is here;
 * the compression keys' own values are checked by
 * ts_dp_compress_from_config. */
int ts_gradpath_choose(const ts_layout *L, const ts_config *cfg, ts_grad_kind *kind);
/* Collective on L's world. Chooses the path (a refusal fails every rank
 * before any communication) and has the layout make the groups it needs.
 * L (role train) is borrowed and must outlive the path. */
int ts_gradpath_create(ts_layout *L, const ts_config *cfg, ts_gradpath **out);
/* Local. NULL-safe; *g = NULL. */
void ts_gradpath_destroy(ts_gradpath **g);
/* Local. */
ts_grad_kind ts_gradpath_kind(const ts_gradpath *g);
/* Local. "plain", "compress", "zero", "local". */
const char *ts_gradpath_name(ts_grad_kind k);
/* Local. The group the stepper's buckets are averaged over every step
 * (ts_stepper_create's coll). */
ts_coll *ts_gradpath_reduce_group(const ts_gradpath *g);
/* Local. Optimizer state regions the model's arena is created with: nstate,
 * or 0 when the path allocates its own (zero: the shard's size). */
int ts_gradpath_arena_states(const ts_gradpath *g, int nstate);
/* Collective on L's world, once, after ts_stepper_set_pipeline if any:
 * sets the stepper up for the path (compression with the layout's groups,
 * the sharded optimizer). s is borrowed. Errors agreed. */
int ts_gradpath_attach(ts_gradpath *g, ts_stepper *s);
/* Collective on L's world: the optimizer's one entry point, after
 * ts_stepper_reduce. apply = 1: the optimizer steps on this rank's reduced
 * gradients (the whole stage, or the shard); 0: a skipped step (non-finite
 * gradients) leaves them. Then what the path does between steps (local
 * SGD: the parameter average after every local_steps-th step). step: the
 * steps done once this one is (1, 2, ...; a resumed run goes on counting).
 * Marks the emergency state as changing (ts_emergency_begin_update) before
 * anything changes. */
int ts_gradpath_update(ts_gradpath *g, int64_t step, int apply);
/* Collective on L's world: every replica holds one model after step
 * (before a checkpoint or an evaluation): local SGD averages unless it
 * already did after that step; the other paths are always in sync. */
int ts_gradpath_sync(ts_gradpath *g, int64_t step);
/* Local. The replicas hold one model after step (a resumed checkpoint). */
void ts_gradpath_mark_synced(ts_gradpath *g, int64_t step);
/* Local. */
void ts_gradpath_get_stats(const ts_gradpath *g, ts_gradpath_stats *st);
/* Local. Clears the counters (bench step: after the warm-up). */
void ts_gradpath_reset_stats(ts_gradpath *g);
/* Local. One line for people: the path and its groups. */
void ts_gradpath_describe(const ts_gradpath *g, char *buf, size_t n);

#endif
