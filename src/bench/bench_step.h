/* The step benchmark behind `tessera bench step`: times full training steps
 * (forward, loss, backward, optimizer step) of a config's UNet3D on random
 * data of the configured patch and batch, after warm-up, on the grid
 * `tessera train` would use (dp x pp x sp); gathers samples/s, voxels/s, the
 * step time and its phases, the pipeline stages, halo and gradient
 * communication, the peak resident memory, optionally the per-layer
 * profile, the cost of the per-phase timers (perf overhead) and a
 * calibration file for `tessera plan`. The checkpoint comparison runs two
 * sets of checkpointed levels side by side (same weights, bit-identical
 * gradients required, alternated rounds). Internal to the library (not
 * installed); the command prints. */
#ifndef TS_BENCH_BENCH_STEP_H
#define TS_BENCH_BENCH_STEP_H

#include <mpi.h>
#include <stdint.h>

#include "src/core/config.h"
#include "src/model/unet.h"
#include "src/plan/plan.h"

typedef struct ts_bench_step_opts {
    int steps, warmup;       /* timed steps (>= 1) after warm-up steps (>= 0) */
    int profile;             /* the time per kind of layer */
    int overhead;            /* alternate steps with and without the per-phase timers and counters */
    const char *calibrate;   /* measure the rates for `tessera plan` (result.cal; the CLI writes them here), or NULL */
    const char *compare;     /* checkpoint levels B to compare with the config's (A), or NULL */
    int rounds;              /* compare: rounds of B then A (>= 1) */
    double rss0_mb;          /* resident memory before the config was loaded (ts_train_rss_mb) */
    int peak;                /* measure the CPU's peak first (src/nn/peak.h) and report the fraction of it */
} ts_bench_step_opts;

typedef struct ts_bench_step_stage {
    char units[1024];        /* the layer units of the stage */
    double busy_s, span_s, wait_s, slots, slot_bytes, act_bytes; /* per step, the largest over its ranks */
    double forward_s, backward_s; /* per step: the busy time's forward and backward parts, largest over its ranks */
    double estimated_s;      /* the cut's estimate (0 with parallel.pp_cut given) */
} ts_bench_step_stage;

typedef struct ts_bench_step_compare {
    char levels[2][64];      /* A (the config's), B */
    double step_s[2], cpu_s[2]; /* medians of the slowest rank's step wall and process CPU time */
    int nt[2];               /* timed steps */
    double act[2], scratch[2], plan[2], rss_mb[2]; /* bytes, bytes, bytes, MiB: the largest over ranks */
    double step_ratio, cpu_ratio, act_reduction, rss_reduction;
    double *round_step_ratio, *round_cpu_ratio; /* per round B/A (rounds entries; owned) */
    double round_step_median, round_cpu_median;
    int rounds, identical;
    double nonzero;          /* non-zero gradient elements (largest over ranks) */
} ts_bench_step_compare;

typedef struct ts_bench_step_result {
    int ranks, dp, pp, sp, dims[3], micro, threads, steps, warmup;
    int64_t box[3], batch, patch[3];
    const char *schedule, *precision, *kernels, *engine; /* static strings */
    const char *state;       /* where parameters, gradients and optimizer state live: "cpu" (the CPU engine),
                              * "host" (the GPU engine's host master copy) or "gpu" (TESSERA_CUDA_STATE=device) */
    double samples_per_s, voxels_per_s, step_s, best_s, forward_s, backward_s, optimizer_s, cpu_s; /* per step */
    double flops;            /* the model's FLOP per step, all replicas (src/model/cost.h: convolutions forward and
                              * backward; a checkpointed level's recomputation not counted) */
    double gflops;           /* flops / step_s / 1e9 */
    double peak_gflops;      /* --peak: the ranks' summed measured peak of the precision that ran (fp32 FMA, or
                              * bf16 dot products where the CPU has them), else 0 */
    double peak_triad_GBps;  /* --peak: the ranks' summed triad bandwidth */
    const char *peak_kind;   /* "fp32 FMA (avx512f)", ... (static) */
    double cores_busy;       /* process CPU time over wall time */
    double bubble_formula;   /* (P-1)/(M+P-1) */
    ts_bench_step_stage *stages; /* pp entries when pp > 1 (owned) */
    double halo_exposed_s, halo_hidden_s, spatial_sums_s; /* per step, largest over ranks */
    double comm_total_s, comm_exposed_s; /* per step, rank 0 */
    int buckets;
    double act_bytes;        /* activations, gradients and halo faces, largest over ranks */
    double rss_mb, arena_mb, plan_mb, loss;
    int overhead;            /* the perf figures below are set */
    double perf_on_s, perf_off_s, perf_ratio, brackets_per_step, pair_s;
    int perf_on_n, perf_off_n;
    char perf_what[1024];
    double prof[TS_PROF_COUNT]; /* seconds per step per layer kind (profile) */
    int profiled;            /* --profile: the JSON gets the roofline table */
    double prof_flop[TS_PROF_COUNT], prof_bytes[TS_PROF_COUNT]; /* this rank's per step, by the cost model (what
                                                                 * runs: recomputation included; FLOP of the
                                                                 * convolution kinds only) */
    ts_plan_calib cal;          /* with opts.calibrate, rank 0: the rates of this run's box (not written) */
    /* the gradient path, as `tessera train` takes it (src/parallel/layout.h) */
    const char *grad_path;      /* plain, compress, zero or local (static) */
    int local_steps;            /* parallel.local_steps */
    const char *local_sgd;      /* parallel.local_sgd: global or node (static) */
    int64_t param_averages;     /* local SGD: parameter averages in the timed steps */
    double param_average_s;     /* their time per timed step (inside step_s) */
    char compress[64];          /* parallel.compress ("none") */
    int64_t compressed_steps, reduced_steps; /* steps whose buckets went compressed, of the steps reduced */
    double grad_bytes, grad_bytes_fp32; /* bytes one rank sends per step for its gradients: as run, as float32 */
    int compared;            /* compare ran: only cmp and the header fields are set */
    ts_bench_step_compare cmp;
} ts_bench_step_result;

/* Collective on comm (the world of a `tessera train` run: its grid is made
 * from parallel.*). Builds the model, stepper, pipeline and spatial split of
 * cfg (borrowed), runs the steps and fills *r on every rank (the figures that
 * are reduced are the same everywhere; the rest are this rank's), writes the
 * calibration file from rank 0. Errors agreed; free r with
 * ts_bench_step_result_free (also after an error). */
int ts_bench_step_run(MPI_Comm comm, const ts_config *cfg, const ts_bench_step_opts *o, ts_bench_step_result *r);
/* Local. The roofline of profile kind k (0 .. TS_PROF_COUNT-1) for this
 * rank: its GFLOP/s and GB/s from r's times and the cost model, the bound
 * ("compute": a convolution kind whose FLOP per byte exceed the machine's
 * peak FLOP/s over its triad bandwidth; "memory" otherwise; "-" without
 * --peak) and the fraction of that roof reached (the rank's share of the
 * summed peaks; 0 without --peak). */
void ts_bench_step_roof(const ts_bench_step_result *r, int k, double *gflops, double *gbps, const char **bound,
                        double *fraction);
/* Local. A comparison whose gradients differ: TS_ERR_INTERNAL naming both
 * level sets; else 0. */
int ts_bench_step_verdict(const ts_bench_step_result *r);
/* Local. Writes r as JSON (the keys `tessera bench step --help` lists;
 * config: the config path). */
int ts_bench_step_write_json(const char *path, const ts_bench_step_result *r, const char *config);
void ts_bench_step_result_free(ts_bench_step_result *r);

#endif
