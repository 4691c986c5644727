/* The performance model behind `tessera plan`: the step time, exposed
 * communication, memory per rank and parallel efficiency of a dp x pp x sp
 * layout of the config's UNet3D on N nodes of R ranks, from
 *   - the analytic work of every layer kind (src/model/cost.h) divided by
 *     rates calibrated on this machine (`tessera bench step --calibrate`,
 *     or a short in-process calibration), scaled by the share of a core a
 *     rank gets (or by a GPU rate);
 *   - the α-β models of the collectives (collectives/cost_model.h, fitted by
 *     `tessera bench coll --tune`) inside a node, and a network of given
 *     bandwidth and latency between nodes (hierarchical allreduce);
 *   - the pipeline schedule's bubble, (m + pp - 1) / m for m micro-batches
 *     of train.batch samples per replica, and the halo
 *     exchange's hidden share measured here (docs/scaling.md states every
 *     assumption).
 * All calls are local. */
#ifndef TS_PLAN_PLAN_H
#define TS_PLAN_PLAN_H

#include <stdint.h>

#include "collectives/cost_model.h"
#include "src/core/config.h"
#include "src/model/unet.h"

/* Rates at one box size (voxels per sample); a calibration holds the
 * config's patch and the smaller boxes of sp = 2, 4, 8 (bench step
 * --calibrate on one rank), since small layers run below the rate of large
 * ones and strong scaling makes the boxes small. */
#define TS_PLAN_MAX_BOXES 6
typedef struct ts_plan_box_rates {
    int64_t box[3];
    double rate[TS_PROF_COUNT];
    double other_s_per_elem;
} ts_plan_box_rates;

/* Rates measured on one rank. */
typedef struct ts_plan_calib {
    double rate[TS_PROF_COUNT]; /* work units (src/model/cost.h) per second, per kind; 0: unmeasured */
    double opt_s_per_param;     /* optimizer step, seconds per parameter */
    double other_s_per_elem;    /* step time outside the profiled layers, per activation element */
    double act_bytes_per_elem;  /* bytes the model holds per activation element (values and gradients) */
    double process_mb;          /* resident memory of a rank before activations */
    double step_s;              /* the calibration's step time */
    int threads;                /* threads per rank it ran with */
    char what[256];             /* config, patch and batch it ran */
    int nbox;                   /* rates per box size (0: only the rates above, the patch's) */
    ts_plan_box_rates boxes[TS_PLAN_MAX_BOXES];
} ts_plan_calib;

typedef struct ts_plan_machine {
    int nodes, ranks_per_node, threads;
    double cores_per_node;     /* may be a fraction: nodes sharing cores (jobs/cluster on one machine) */
    int gpus_per_node;         /* > 0: a rank per GPU, compute at gpu_tflops */
    double gpu_tflops;         /* convolution throughput of one GPU, TFLOP/s */
    double gpu_mem_gb;         /* memory of one GPU */
    double link_GBps;          /* intra-node GPU links (NVLink), GB/s */
    double net_GBps, net_latency_us; /* between nodes, per node */
    char net_from[160];        /* where those came from: --net, the default, or the tuning table's 2-node fit */
    double mem_per_rank_mb;    /* limit; 0: none (GPU: gpu_mem_gb) */
    double bucket_mb;          /* gradient bucket size */
    double halo_hidden;        /* share of halo transfer time hidden behind compute */
    const ts_coll_fit *fits;   /* intra-node collective models (may be NULL) */
    int nfits;
} ts_plan_machine;

/* What to run: the model and its batch. */
typedef struct ts_plan_job {
    ts_unet_cfg u;
    int nstate;        /* optimizer state regions */
    int global_batch;  /* samples per step over all replicas */
    int micro_batch;   /* samples per pipeline micro-batch (train.batch) */
    int prefetch;      /* loader batches ahead (memory) */
} ts_plan_job;

typedef struct ts_plan_layout {
    int dp, pp, sp, dims[3];
    int64_t box[3];
    int batch, micro;        /* samples per replica per step; pipeline micro-batches */
    double step_s;           /* predicted step time */
    double compute_s;        /* layers, optimizer and overhead on one rank (pipeline: with the bubble) */
    double bubble_s, grad_s, grad_exposed_s, halo_s, sums_s, p2p_s, opt_s;
    double comm_s;           /* exposed communication: gradients, halos, spatial sums, pipeline transfers */
    double mem_mb;           /* per rank */
    double efficiency;       /* ideal time (one rank's work / ranks) over step_s */
    double samples_per_s;
    int feasible, runnable;  /* runnable: this version of tessera can train it */
    char why[200];           /* why not feasible */
    char bottleneck[200];    /* the largest part of the step and its share */
} ts_plan_layout;

/* Local. Rates from a calibration file (bench step --calibrate). */
int ts_plan_calib_load(const char *path, ts_plan_calib *c);
/* Local. Adds (or replaces, same box) the rates of `box`'s calibration to
 * c->boxes; c's own rates stay those of its patch. */
void ts_plan_calib_add_box(ts_plan_calib *c, const ts_plan_calib *box_cal, const int64_t box[3]);
/* Local. The rates (and overhead per element) for a box: measured boxes
 * interpolated in log voxels, the nearest outside the measured range. */
void ts_plan_calib_rates(const ts_plan_calib *c, const int64_t box[3], double rate[TS_PROF_COUNT], double *other);
/* Local. Writes c as JSON. */
int ts_plan_calib_write(const char *path, const ts_plan_calib *c);
/* Local. Derives rates from a measured step of u on n samples of a box:
 * prof = seconds per kind (ts_unet_profile over steps), opt_s and step_s
 * per step, act_bytes held by the model. */
int ts_plan_calib_from_profile(const ts_unet_cfg *u, int n, const int64_t box[3], const double *prof_per_step,
                               double opt_s, double step_s, double act_bytes, double params, double process_mb,
                               int threads, ts_plan_calib *c);
/* Local. Runs `steps` training steps of the config's model on one rank
 * (random data, the config's patch and train.batch) and calibrates. */
int ts_plan_calibrate(const ts_config *cfg, int steps, ts_plan_calib *c);

/* Local. The prediction for one layout (infeasible ones say why). */
void ts_plan_predict(const ts_plan_job *j, const ts_plan_calib *c, const ts_plan_machine *m, int dp, int pp, int sp,
                     ts_plan_layout *out);
/* Local. Every dp x pp x sp factorisation of nodes x ranks_per_node
 * (pp up to 2 x levels), feasible ones first by step time. *out malloc'ed. */
int ts_plan_layouts(const ts_plan_job *j, const ts_plan_calib *c, const ts_plan_machine *m, ts_plan_layout **out,
                    int *n);

/* `tessera plan` as calls: the job and machine from a config and a request,
 * the layouts ranked, the scaling curve, the JSON report. All local. */
typedef struct ts_plan_request {
    int nodes, ranks_per_node;  /* required (ranks_per_node may be 0 with gpus_per_node) */
    int gpus_per_node;          /* > 0: a rank per GPU */
    int threads;                /* 0: OMP_NUM_THREADS or 1 */
    double cores_per_node;      /* 0: this machine's with one node (no GPUs), else ranks x threads */
    int net_given;              /* --net given; else the tuning table's 2-node fits when it has them */
    int global_batch;           /* 0: train.batch x train.accum x all ranks */
    double net_GBps, net_latency_us, gpu_tflops, gpu_mem_gb, link_GBps, mem_per_rank_mb;
    const char *calib;          /* calibration file; NULL: calibrate here (2 steps) */
    const char *tuning;         /* tuning table with fits; NULL: coll.tuning or TESSERA_COLL_TUNING */
    int layout[3];              /* all > 0: predict this dp,pp,sp only */
    int curve;                  /* also the best layout at 1, 2, 4, ... nodes */
} ts_plan_request;

typedef struct ts_plan_curve_point {
    int nodes, ranks, global_batch;
    ts_plan_layout best;        /* the best runnable layout */
} ts_plan_curve_point;

typedef struct ts_plan_report {
    ts_plan_job job;
    ts_plan_machine machine;    /* machine.fits points into fits */
    ts_plan_calib cal;
    int calibrate;              /* no calibration file: ts_plan_report_run measures */
    char tuning[1024];          /* the tuning table used, "" for none */
    ts_coll_fit *fits;          /* owned */
    int nfits;
    ts_plan_layout *layouts;    /* owned; best first (feasible before infeasible) */
    int nlayouts, nfeasible;
    const ts_plan_layout *best; /* the fastest feasible layout this version can train, or NULL */
    ts_plan_curve_point *curve; /* owned */
    int ncurve;
    int64_t batch, accum;       /* train.batch, train.accum */
} ts_plan_report;

/* Local. Defaults of a request: 12.5 GB/s and 2 us between nodes, GPUs of
 * 50 TFLOP/s and 80 GB with 200 GB/s links; the rest 0/NULL. */
void ts_plan_request_default(ts_plan_request *q);
/* Local. The job and the machine from cfg and q, the tuning table's fits,
 * the calibration file (r->calibrate = 1 without one). Errors: bad
 * request, unreadable files (named). Free r with ts_plan_report_free. */
int ts_plan_report_setup(const ts_config *cfg, const ts_plan_request *q, ts_plan_report *r);
/* Local. Calibrates when r->calibrate (runs steps of the config here), then
 * predicts the layouts and (q->curve) the curve. */
int ts_plan_report_run(const ts_config *cfg, const ts_plan_request *q, ts_plan_report *r);
/* Local. Writes {"layouts", "best", "curve", "machine", "assumptions"} to path. */
int ts_plan_report_write_json(const char *path, const ts_plan_request *q, const ts_plan_report *r);
void ts_plan_report_free(ts_plan_report *r);

#endif
