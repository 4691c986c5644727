/* The planner choosing a run's layout (parallel.layout = auto, `tessera
 * bench step --layouts`): the layouts of this job's ranks ranked by the
 * model of src/plan/plan.h, and a configuration set to run one of them
 * with the global batch held (train.batch x train.accum x ranks, as
 * `tessera plan` holds it). */
#ifndef TS_PLAN_PLAN_AUTO_H
#define TS_PLAN_PLAN_AUTO_H

#include <mpi.h>

#include "src/core/config.h"
#include "src/plan/plan.h"

typedef struct ts_plan_choice {
    ts_plan_layout *layouts; /* feasible layouts this version can train, fastest predicted first (owned) */
    int n;
    int global_batch;        /* samples per step over all replicas */
    int micro_batch;         /* samples per micro-batch of a pipeline (the config's train.batch) */
    int nodes, ranks_per_node;
    char calib[300];         /* where the rates came from: a calibration file, or a timing pass here */
    double tie;              /* parallel.layout_tie: predictions within this share of the fastest are a tie */
    double *measured_s;      /* per layout, auto's timing of the tied ones at start (0: not timed; owned) */
} ts_plan_choice;

/* Collective on comm: the step time of the layout cfg is set to (auto's
 * tie-break; src/bench/bench_layouts.h has one that runs bench step). */
typedef int (*ts_plan_measure_fn)(void *ctx, MPI_Comm comm, ts_config *cfg, double *step_s);

/* Collective on comm. Rank 0 ranks the layouts of comm's ranks (its nodes
 * and ranks per node, unequal nodes refused) with the calibration file
 * calib, or without one a 2-step timing pass of the config's model on rank
 * 0; every rank receives the same list. Errors agreed. Free with
 * ts_plan_choice_free. */
int ts_plan_choose(const ts_config *cfg, MPI_Comm comm, const char *calib, ts_plan_choice *out);
void ts_plan_choice_free(ts_plan_choice *c);
/* Local. Sets cfg to run layout l with c's global batch: parallel.dp, pp,
 * sp (sp_dims and pp_cut auto); without a pipeline train.batch = the
 * replica's samples (accum 1); with one parallel.microbatches of
 * c->micro_batch samples each, 1F1B when there are at least pp of them,
 * else GPipe. where names the setting in messages. */
int ts_plan_apply(ts_config *cfg, const ts_plan_choice *c, const ts_plan_layout *l, const char *where);

/* Local. How many of c's first layouts auto treats as tied: those
 * predicted within tie (a share) of the fastest prediction (>= 1). */
int ts_plan_tied(const ts_plan_choice *c, double tie);
/* Collective on comm. parallel.layout: given leaves cfg as it is
 * (*chosen = -1); auto ranks the layouts (ts_plan_choose, rates from
 * parallel.layout_calib), times the tied ones with measure (when more than
 * one and measure is not NULL) and applies the fastest measured, else the
 * fastest predicted; dp, sp, pp
 * (every rank in that dimension) or D,P,S apply that one if the planner
 * finds it feasible. *chosen is its index in c->layouts. Refused, on every
 * rank: parallel.dp, pp, sp, sp_dims, pp_cut or microbatches also given
 * (the layout sets them), a malformed value, an infeasible forced layout.
 * Free c with ts_plan_choice_free (also when given). */
int ts_plan_layout_resolve(ts_config *cfg, MPI_Comm comm, ts_plan_measure_fn measure, void *ctx, ts_plan_choice *c,
                           int *chosen);

#endif
