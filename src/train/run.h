/* The run directory and what people and scripts see of a run: the resolved
 * config.ini, metrics.jsonl (one JSON object per logged step), perf.json
 * (time and counters per phase and per rank), launches.jsonl (one line per
 * start: job ID, requeues), and progress on
 * rank 0: a one-line bar on a terminal, a line every N seconds in a batch
 * log. Only rank 0 writes files and prints. */
#ifndef TS_TRAIN_RUN_H
#define TS_TRAIN_RUN_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#include "src/core/config.h"
#include "src/core/perf.h"

typedef struct ts_run {
    char dir[1024];
    int rank;
    FILE *metrics;      /* rank 0: metrics.jsonl, appended */
    int tty;            /* progress as a bar */
    double log_seconds; /* batch-log interval */
    double t_start, t_last_print;
    int64_t first_step, total_steps;
    int bar_open;       /* a bar line is on screen */
} ts_run;

/* Collective on comm. Creates dir (and dir/ckpt, checked writable by a
 * test file), writes config.ini from cfg (rank 0), opens metrics.jsonl for
 * appending. Errors agreed. */
int ts_run_open(ts_run *r, MPI_Comm comm, const char *dir, const ts_config *cfg, double log_seconds);
void ts_run_close(ts_run *r);
/* Local (rank 0 rewrites). Drops the metrics.jsonl lines of steps after
 * `step` (a resumed run repeats them otherwise). */
int ts_run_truncate_metrics(ts_run *r, int64_t step);
/* Local (rank 0 writes). One metrics line: step, epoch, loss, lr,
 * samples_per_s; dice (K values) when not NULL, and with it hd95 and nsd
 * (K values each, null where not finite) when not NULL. */
int ts_run_metrics(ts_run *r, int64_t step, int64_t epoch, double loss, double lr, double samples_per_s,
                   const double *dice, const double *hd95, const double *nsd, int K, const char *const *class_names);
/* Local (rank 0 prints). Progress for step (1-based count done). */
void ts_run_progress(ts_run *r, int64_t step, double loss, double samples_per_s, int force);
/* Local (rank 0 prints). A message line that does not break the bar. */
void ts_run_say(ts_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Phases timed per step, one line each: the enum id, the name in perf.json,
 * the kind (how the report adds them up), what it is. Kinds: "step" = an
 * exclusive part of a training step on the main thread (these, plus
 * "other", make up "step"); "nested" = inside one of those (halo waits in
 * forward/backward); "concurrent" = on another thread, overlapping the
 * others (the gradient reductions of the progress thread, halo transfers
 * hidden behind compute); "outside" = between steps; "total" = whole
 * steps. Adding a phase is one line here. perf.json reports each as
 * seconds on every rank (per_rank) and min/mean/max/imbalance over ranks,
 * with the counters of perf.papi_events (src/core/perf.h). */
#define TS_PHASE_LIST(X)                                                                          \
    X(DATA, "data_wait", "step", "waiting for the loader")                                       \
    X(FORWARD, "forward", "step", "forward and loss")                                            \
    X(BACKWARD, "backward", "step", "backward (gradient buckets queued inside)")                 \
    X(COMM_EXPOSED, "comm_exposed", "step", "waiting for gradient buckets after backward")       \
    X(OPTIM, "optimizer", "step", "optimizer step")                                              \
    X(COMM_TOTAL, "comm_total", "concurrent", "the progress thread reducing gradient buckets")   \
    X(HALO_EXPOSED, "halo_exposed", "nested", "halo exchange not hidden by compute (spatial)")   \
    X(HALO_HIDDEN, "halo_hidden", "concurrent", "halo exchange in flight while compute ran")     \
    X(SPATIAL_SUMS, "spatial_sums", "nested", "norm and loss sums over the spatial group")       \
    X(PP_WAIT, "pp_wait", "step", "pipeline: waiting for a neighbour stage's data (the bubble)")   \
    X(PP_P2P, "pp_p2p", "nested", "pipeline: stage-to-stage messages, posting and waiting")      \
    X(PARAM_AVG, "param_average", "step", "local SGD: averaging parameters over the replicas")    \
    X(EVAL, "eval", "outside", "sliding-window evaluation")                                      \
    X(CKPT, "checkpoint", "outside", "writing checkpoints")                                      \
    X(STEP, "step", "total", "whole training steps")

typedef enum {
#define TS_PH_ENUM_(id, name, kind, what) TS_PH_##id,
    TS_PHASE_LIST(TS_PH_ENUM_)
#undef TS_PH_ENUM_
    TS_PH_COUNT
} ts_phase;
/* The names of TS_PHASE_LIST, indexed by ts_phase. */
extern const char *const ts_phase_names[TS_PH_COUNT];
const char *ts_phase_name(int p);
const char *ts_phase_kind(int p);

/* Figures perf.json derives from the model and the run (zeros: not known). */
typedef struct ts_run_derived {
    double flops_forward, flops_backward; /* analytic FLOPs per step on one rank (convolutions) */
    double grad_bytes;                    /* gradient bytes allreduced per step (payload) */
    int grad_ranks;                       /* ranks of that allreduce */
    double halo_bytes;                    /* halo bytes sent per step per rank */
    int64_t spatial_sums;                 /* spatial-group allreduces per step */
} ts_run_derived;

/* Collective on comm: gathers every rank's phase seconds and counters from
 * perf and writes perf.json (rank 0): per phase the per-rank values and
 * min/mean/max/imbalance (max/mean), the counters' status, derived figures
 * (IPC, GFLOP/s from d and from counters, CPU use, bytes moved by
 * collectives) and the launch (job ID, ranks per node). d and extra_json
 * (more members, without braces) may be NULL. Errors agreed. */
int ts_run_perf(ts_run *r, MPI_Comm comm, const ts_perf *perf, int64_t steps, double samples_per_s,
                const ts_run_derived *d, const char *extra_json);
/* Local (rank 0 writes). Appends one line to launches.jsonl in the run
 * directory: time, the launch (job ID, requeues, ranks, nodes) and the step
 * this start begins at, so a requeued job's history is on record. */
int ts_run_record_launch(ts_run *r, int64_t first_step, int64_t total_steps);
/* Local (rank 0 writes). Marks the run as stopped on request at step of
 * total: the file `stopped` in the run directory (ts_run_open removes it),
 * which the job scripts check besides the exit status (a launcher may lose
 * the status of a signalled job). */
int ts_run_mark_stopped(ts_run *r, int64_t step, int64_t total_steps);

#endif
