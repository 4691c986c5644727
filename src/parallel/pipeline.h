/* Pipeline parallelism for the UNet3D: this rank runs one stage (a
 * contiguous range of the model's layer units) of P, with the micro-batches
 * of a step scheduled by GPipe or 1F1B (src/parallel/pipe.h). Activations
 * cross stage borders along the model's edges (ts_unet_edges): a skip
 * tensor goes straight from the encoder stage to the decoder stage that
 * consumes it, not through the stages between (the residual encoder's and
 * deep supervision's edges, the auxiliary heads' logits going to the last
 * stage, which computes every loss term: src/model/unet.h); gradients go
 * back the same way. Messages are nonblocking point-to-point on the pipeline
 * communicator (rank = stage index); the time a stage waits for them is its
 * bubble. Also: the cost-balanced cut from a short timing pass, and a
 * forward through all stages for evaluation. */
#ifndef TS_PARALLEL_PIPELINE_H
#define TS_PARALLEL_PIPELINE_H

#include <mpi.h>

#include "src/core/tensor.h"
#include "src/model/unet.h"
#include "src/parallel/layout.h"
#include "src/parallel/pipe.h"

typedef struct ts_pipeline ts_pipeline;

/* Per-stage figures of the steps run so far (seconds). */
typedef struct ts_pipeline_stats {
    double forward_s, backward_s; /* compute of this stage's units: forward and loss, backward */
    double busy_s;   /* their sum */
    double span_s;   /* the pipelined part of the steps (first forward to last backward) */
    double p2p_s;    /* posting and waiting for stage-to-stage messages */
    double wait_s;   /* of which waiting for a neighbour's data (idle) */
    double bytes;    /* bytes this stage sent */
    int64_t steps;
} ts_pipeline_stats;

/* Collective on comm (the pipeline group, P ranks, rank = stage): this
 * rank runs stage `stage` = units [first[stage], first[stage+1]) of m
 * (first has P + 1 entries) with M micro-batches per step, holding the
 * activations of ts_pipe_in_flight() of them. m is borrowed; its stage and
 * slots are set (activations freed). */
int ts_pipeline_create(ts_unet *m, MPI_Comm comm, const int *first, ts_pipe_kind kind, int M, ts_pipeline **out);
/* Collective on the pipeline group (waits for the messages in flight, frees its communicator). NULL-safe. */
void ts_pipeline_destroy(ts_pipeline **p);
int ts_pipeline_stage(const ts_pipeline *p);
int ts_pipeline_stages(const ts_pipeline *p);
/* Local: 1 if this stage holds the first unit (it takes images) / the head (it takes labels and has the loss). */
int ts_pipeline_first(const ts_pipeline *p);
int ts_pipeline_last(const ts_pipeline *p);

/* Where a step's micro-batches come from: called in micro-batch order, on
 * the stages that need data (first: image, last: labels); the tensors must
 * stay valid until the next call. */
typedef int (*ts_pipeline_next)(void *ctx, ts_tensor *image, ts_tensor *label);

/* Collective on the pipeline group (and, through the model's hooks, on the
 * spatial and data-parallel groups). One step's M micro-batches, forward
 * and backward, in the schedule's order; parameter gradients accumulate in
 * the arena (zeroed first). before_last(hook_ctx) (may be NULL) runs just
 * before the last micro-batch's backward, during which hook (may be NULL)
 * is installed as the model's gradient hook (gradient buckets overlap it).
 * The receives of a forward are posted as soon as its slot is free, and the
 * messages in flight are progressed between units. A stage that fails
 * leaves its neighbours waiting for its messages (the command's exit grace
 * ends the job). *loss: the mean loss of the M micro-batches on the last
 * stage, 0 elsewhere. */
int ts_pipeline_step(ts_pipeline *p, ts_pipeline_next next, void *ctx, void (*hook)(void *, int), void *hook_ctx,
                     void (*before_last)(void *), double *loss);
/* Collective on the pipeline group. Forward of one batch through every
 * stage in eval mode (x: the first stage's input, ignored elsewhere); on the
 * last stage *logits receives the head's output, elsewhere NULL. */
int ts_pipeline_forward(ts_pipeline *p, const ts_tensor *x, const ts_tensor **logits);
/* Local. Figures so far. */
const ts_pipeline_stats *ts_pipeline_get_stats(const ts_pipeline *p);

/* Collective on world (every rank runs it, whatever its stage): times each
 * of m's units (forward, loss at the head, backward) on a batch of `batch`
 * boxes of box voxels, three times, keeping the fastest of the last two
 * (robust to a busy machine); cost[u] = the mean over
 * world's ranks of the time, so every rank gets the same costs. m's stage
 * is left at the whole network with one slot; its parameters, gradients
 * (zero) and batch-norm statistics are as before. */
int ts_pipeline_measure(ts_unet *m, MPI_Comm world, int batch, const int64_t box[3], double *cost);
/* Collective on world. The cut every rank uses: measured and balanced
 * (spec "auto") or given, the same on every rank (rank 0's broadcast);
 * cost[u] the measured times (0 when given); errors agreed. */
int ts_pipeline_plan(ts_unet *m, MPI_Comm world, int P, const char *spec, int batch, const int64_t box[3], int *first,
                     double *cost);
/* Local. The cut: spec "auto" balances the costs (ts_pipe_partition),
 * otherwise a comma list of the units that start stages 1 .. P-1 ("enc2,dec1");
 * errors name parallel.pp_cut and the units. */
int ts_pipeline_cut(const ts_unet *m, int P, const char *spec, const double *cost, int *first);
/* Collective on L's world. The pipeline of a layout with pp > 1 (*out NULL
 * when pp = 1): the cut of parallel.pp_cut planned on L's world for a box of
 * L's (ts_pipeline_plan, the timing pass's halo figures not counted), then
 * the stages on L's pipeline group with its schedule and micro-batches.
 * first (pp + 1 entries) and cost (the model's units) receive the cut and
 * the measured costs. Errors agreed. */
int ts_pipeline_create_on(ts_unet *m, const ts_layout *L, int batch, int *first, double *cost, ts_pipeline **out);

#endif
