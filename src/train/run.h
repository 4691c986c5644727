/* The run directory and what people and scripts see of a run: the resolved
 * config.ini, metrics.jsonl (one JSON object per logged step), perf.json
 * (time per phase and counters, min/mean/max over ranks), and progress on
 * rank 0: a one-line bar on a terminal, a line every N seconds in a batch
 * log. Only rank 0 writes files and prints. */
#ifndef TS_TRAIN_RUN_H
#define TS_TRAIN_RUN_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#include "src/core/config.h"

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

/* Collective on comm. Creates dir (and dir/ckpt), writes config.ini from
 * cfg (rank 0), opens metrics.jsonl for appending. Errors agreed. */
int ts_run_open(ts_run *r, MPI_Comm comm, const char *dir, const ts_config *cfg, double log_seconds);
void ts_run_close(ts_run *r);
/* Local (rank 0 writes). One metrics line: step, epoch, loss, lr,
 * samples_per_s; dice (K values) when not NULL. */
int ts_run_metrics(ts_run *r, int64_t step, int64_t epoch, double loss, double lr, double samples_per_s,
                   const double *dice, int K, const char *const *class_names);
/* Local (rank 0 prints). Progress for step (1-based count done). */
void ts_run_progress(ts_run *r, int64_t step, double loss, double samples_per_s, int force);
/* Local (rank 0 prints). A message line that does not break the bar. */
void ts_run_say(ts_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Phases timed per step; perf.json reports each as min/mean/max over ranks. */
typedef enum {
    TS_PH_DATA = 0,  /* waiting for the loader */
    TS_PH_FORWARD,   /* forward and loss */
    TS_PH_BACKWARD,  /* backward (buckets queued inside) */
    TS_PH_COMM_EXPOSED, /* waiting for gradient buckets after backward */
    TS_PH_COMM_TOTAL,   /* time the progress thread spent reducing buckets */
    TS_PH_OPTIM,
    TS_PH_EVAL,
    TS_PH_CKPT,
    TS_PH_STEP,      /* whole training steps */
    TS_PH_COUNT
} ts_phase;
const char *ts_phase_name(int p);

/* Collective on comm: gathers per-rank phase seconds and counter values and
 * writes perf.json (rank 0). counters may be NULL. */
int ts_run_perf(ts_run *r, MPI_Comm comm, const double *phase_s, int64_t steps, double samples_per_s,
                const char *const *counter_names, const long long *counters, int ncounters, const char *extra_json);

#endif
