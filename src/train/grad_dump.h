/* train.dump_grads: the gradients of one training step, whole, in one file,
 * for the gradient-equivalence harness (docs/parallelism.md, "Equal to one
 * rank"). Any layout writes the same file as one rank would. */
#ifndef TS_TRAIN_GRAD_DUMP_H
#define TS_TRAIN_GRAD_DUMP_H

#include <stddef.h>
#include <stdint.h>

#include "src/model/arena.h"
#include "src/parallel/grid.h"

/* What one rank holds of the step's gradients: the arena entries [e0, e1)
 * (its pipeline stage's; all without a pipeline), and with a sharded
 * optimizer (npieces > 0) only the floats [plo[k], plo[k] + plen[k]) of the
 * parameter region are reduced here (the rest are this rank's unreduced
 * share). */
typedef struct ts_grad_share {
    int e0, e1;
    int npieces;
    const size_t *plo, *plen;
} ts_grad_share;

/* Collective on g->world. Writes path (HDF5, truncated) on world rank 0: a
 * weights file (docs/formats-weights.md) whose /params/<name> holds each
 * parameter's gradient as the optimizer receives it (reduced over the
 * replicas and the spatial pieces, divided by the micro-batches and the
 * loss scale, before clipping) and each buffer's value after the step's
 * forward (batch norm's running statistics), plus /loss (float64 scalar) and
 * /step (int64). Each value is taken from exactly one rank that holds it
 * (replica 0, spatial piece 0, its pipeline stage; with ZeRO its shard's
 * owner) and gathered over world by a bitwise OR. Errors are agreed. */
int ts_grad_dump(const char *path, const ts_arena *a, const ts_grid *g, const ts_grad_share *sh, double loss,
                 int64_t step);

#endif
