/* `tessera bench step --layouts`: the layouts of this job's ranks run side
 * by side in one invocation with the global batch held, each measured as
 * `bench step` measures one, next to the planner's prediction and rank
 * (src/plan/plan_auto.h), and which one parallel.layout = auto would
 * choose. Internal (not installed). */
#ifndef TS_BENCH_BENCH_LAYOUTS_H
#define TS_BENCH_BENCH_LAYOUTS_H

#include <mpi.h>

#include "src/bench/bench_step.h"
#include "src/core/config.h"
#include "src/plan/plan_auto.h"

typedef struct ts_bench_layout_row {
    ts_plan_layout plan;     /* the planner's layout and prediction */
    int predicted_rank;      /* 1 = predicted fastest among the rows */
    int measured_rank;       /* 1 = measured fastest */
    double step_s, samples_per_s; /* measured (bench step's figures) */
} ts_bench_layout_row;

typedef struct ts_bench_layouts_result {
    ts_plan_choice choice;   /* every feasible layout, ranked */
    ts_bench_layout_row *rows; /* the layouts measured (owned) */
    int n;
    int tied;                /* rows predicted within parallel.layout_tie of the fastest prediction */
    int chosen;              /* the row parallel.layout = auto's rule takes: the fastest measured of the tied */
    int fastest;             /* the row measured fastest */
    double chosen_over_best; /* the chosen row's step time over the fastest's */
} ts_bench_layouts_result;

/* Collective on comm. list: NULL or "all" for every layout the planner
 * finds feasible, else "D,P,S:D,P,S..." (each must be among them; a layout
 * the planner refuses is an error with its reason). calib: a calibration
 * file (bench step --calibrate) or NULL for a timing pass. cfg is changed
 * (ts_plan_apply) and left at the last layout. Errors agreed. */
int ts_bench_step_layouts(MPI_Comm comm, ts_config *cfg, const ts_bench_step_opts *o, const char *list,
                          const char *calib, ts_bench_layouts_result *r);
void ts_bench_layouts_free(ts_bench_layouts_result *r);
/* Collective on comm. A ts_plan_measure_fn for parallel.layout = auto:
 * bench step's mean step time of cfg's layout, 1 warm-up and 2 timed steps
 * (ctx: NULL). */
int ts_bench_step_measure(void *ctx, MPI_Comm comm, ts_config *cfg, double *step_s);
/* Local. r as JSON to path. */
int ts_bench_layouts_write_json(const char *path, const ts_bench_layouts_result *r, const char *config);

#endif
