/* Inference, the engine behind `tessera infer`: sliding-window prediction
 * of NIfTI scans with a trained model (windows split over the replicas,
 * each window over a spatial group or through pipeline stages, as in
 * training), optionally on a coarser grid and resampled back, optionally
 * with test-time mirroring and largest-component post-processing, each
 * mask written as NIfTI with its scan's grid and affine; with reference
 * labels, per-class Dice, HD95 and NSD per scan, their mean and spread,
 * a JSON metrics file, and the post-processing decided on them.
 * Evaluation during training is src/infer/evaluate.h. */
#ifndef TS_INFER_INFER_H
#define TS_INFER_INFER_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "io/dataset.h"
#include "src/core/config.h"

/* test-time mirroring axes (ts_infer_opts.mirror), NIfTI's i, j, k */
#define TS_INFER_MIRROR_X 4 /* i: W, the fastest axis */
#define TS_INFER_MIRROR_Y 2 /* j: H */
#define TS_INFER_MIRROR_Z 1 /* k: D */

/* ts_infer_opts.preprocess: replay the preprocessing that data.path's
 * dataset records (its /fingerprint: crop, target spacing), or not */
#define TS_INFER_PREP_DATASET 0
#define TS_INFER_PREP_NONE 1

/* the NSD tolerance when none is given (mm): see docs/medical.md */
#define TS_INFER_NSD_TOL_MM 1.0

typedef struct ts_infer_scan ts_infer_scan;

typedef struct ts_infer_opts {
    const char *checkpoint;    /* a checkpoint (ckpt/step-<N>), a checkpoint folder or a run directory */
    /* input: a NIfTI scan (channels along the 4th dimension); a folder (its
     * *.nii and *.nii.gz, sorted by name); names separated by commas; or a
     * list file (any other regular file: a path a line, # comments) */
    const char *input;
    const char *output;        /* the label volume (uint8 NIfTI); a folder with several scans */
    const char *label;         /* a reference label volume, a folder of them matched by file name, or NULL */
    const char *label_map;     /* maps the reference's values to classes, or NULL */
    const char *probabilities; /* also write the class probabilities (float32, 4-D), a folder with several scans, or NULL */
    const char *metrics;       /* the JSON metrics file (with label), NULL: next to the output (docs/training.md) */
    int downsample;            /* 1: the scan's grid; F = 2..8: predict on a grid F times coarser */
    int mirror;                /* test-time mirroring: a mask of TS_INFER_MIRROR_*, 0 none */
    int preprocess;            /* TS_INFER_PREP_DATASET (default) or TS_INFER_PREP_NONE */
    double nsd_tol;            /* NSD tolerance in mm; < 0: TS_INFER_NSD_TOL_MM */
    const char *keep_largest;  /* "all" or classes "1,3": keep each one's largest component; NULL none */
    const char *postprocess;   /* a decision file (decide below) to apply, or NULL */
    const char *decide;        /* with label: write the post-processing decision here, or NULL */
    /* called on every rank after each scan (may be NULL): for printing */
    void (*on_scan)(const ts_infer_scan *s, void *ctx);
    void *on_scan_ctx;
    const char *precision;     /* the convolutions' precision (fp32, bf16, fp16), NULL: CONFIG's train.precision */
    const char *conv;          /* "winograd" (NULL: the default) or "direct": ts_unet_set_winograd in fp32 */
    int batch;                 /* windows per forward, 0: CONFIG's train.batch */
    int streams;               /* forwards at once per rank (ts_eval_predict's nm), 0: a stream a thread
                                * where the threads divide train.batch and batch is 0, else 1 */
} ts_infer_opts;

/* One scan's outcome. Metrics are NaN where a class is absent from both
 * prediction and reference; HD95 is +inf where it is in one of them only. */
struct ts_infer_scan {
    int index, count;          /* this scan's place among count */
    const char *input, *output, *label; /* label NULL without metrics */
    int64_t dim[3];            /* nx, ny, nz */
    double spacing[3];         /* mm along x, y, z (the header's pixdim) */
    int64_t prep_dim[3];       /* nx, ny, nz predicted on after the dataset's preprocessing (0: none) */
    int have_metrics;
    int classes;
    double dice[TS_IO_MAX_CLASSES], hd95[TS_IO_MAX_CLASSES], nsd[TS_IO_MAX_CLASSES];
    double fg_dice;            /* the mean Dice of the foreground classes present (NaN: none) */
    double dice_pp[TS_IO_MAX_CLASSES]; /* with decide: the Dice of the class with its largest component kept */
    double dice_fg[TS_IO_MAX_CLASSES]; /* with decide: each class's Dice after keeping the largest component of
                                        * the whole foreground (nnU-Net's first step) */
    double dice_fg_pp[TS_IO_MAX_CLASSES]; /* with decide: after that step and the class's largest component */
    int64_t removed[TS_IO_MAX_CLASSES]; /* voxels the post-processing set to background: [0] by the
                                         * whole-foreground step, [k] by class k's */
};

typedef struct ts_infer_stat {
    double mean, std; /* over the scans where the metric is finite; std the sample std (0 for one scan) */
    int n;            /* those scans */
} ts_infer_stat;

typedef struct ts_infer_result {
    char checkpoint[4096];     /* the checkpoint used */
    int64_t dim[3];            /* the last scan's nx, ny, nz */
    int classes, nscans;
    int have_dice;             /* 1 when opts->label was given */
    double dice[TS_IO_MAX_CLASSES]; /* per class, of the last scan */
    ts_infer_stat mean_dice[TS_IO_MAX_CLASSES], mean_hd95[TS_IO_MAX_CLASSES], mean_nsd[TS_IO_MAX_CLASSES];
    ts_infer_stat fg_dice;     /* the scans' foreground mean Dice (classes 1..K-1 present) */
    double nsd_tol;            /* the NSD tolerance used, mm */
    int keep[TS_IO_MAX_CLASSES]; /* 1: the largest component of the class was kept (post-processing applied);
                                  * keep[0]: of the whole foreground, first */
    int decided;               /* opts->decide was written */
    int decision[TS_IO_MAX_CLASSES]; /* the decision: 1 keep the largest component ([0]: the whole foreground's) */
    char metrics[4096];        /* the metrics file written ("" without labels) */
    char class_names[TS_IO_MAX_CLASSES][64]; /* from the label map ("" without one) */
    /* the preprocessing replayed on each scan, from data.path's /fingerprint */
    int prep_on, prep_crop;    /* prep_on 0: none (prep_from "") */
    double prep_spacing[3];    /* target spacing, mm along D, H, W; 0: not resampled */
    char prep_from[4096];      /* the dataset */
    /* where the time went on rank 0, seconds summed over the scans (wall
     * clock; docs/performance.md, bench infer) */
    double setup_s;            /* checkpoint found, model built and loaded, layout set up */
    double read_s;             /* scans read, preprocessed and normalised */
    double network_s, blend_s, reduce_s; /* the prediction: src/infer/evaluate.h ts_eval_stats */
    double predict_s;          /* the whole prediction (network_s + blend_s + reduce_s + mirroring, resampling back) */
    double write_s;            /* post-processing and the NIfTI outputs */
    double metrics_s;          /* the metrics against label= and the metrics file */
    double total_s;            /* ts_infer_run from start to end */
    int64_t windows, forwards; /* windows of all ranks (each mirrored copy counts); forwards of rank 0 */
    int batch;                 /* windows per forward */
    int streams;               /* forwards at once per rank */
    int64_t stream_min, stream_max; /* streams > 1: the fewest and most forwards one stream of rank 0 ran */
    const char *precision;     /* the convolutions' precision ("fp32", "bf16", "fp16") */
    const char *conv;          /* the 3x3x3 convolutions: "winograd" (fp32, 16 channels and more; the
                                * others direct), "direct", or "cudnn" (train.engine: on the GPU) */
    double flop_per_window;    /* the forward's convolution FLOP per window (src/model/cost.h) */
} ts_infer_result;

/* Local. The complete checkpoint that arg names: arg itself, the newest
 * complete one in it, or the newest in arg/ckpt. Errors name arg
 * (TS_ERR_IO: it does not exist; TS_ERR_FORMAT: no complete checkpoint). */
int ts_infer_find_checkpoint(const char *arg, char *path, size_t n);

/* Collective on world. Loads the model of cfg (model.*, data.norm/clip,
 * data.patch, eval.overlap, train.batch, parallel.sp/pp) and the
 * checkpoint's parameters once, then predicts each scan of o->input and
 * writes its mask (and probabilities) on rank 0; with o->label, its
 * metrics, the metrics file and (o->decide) the post-processing decision.
 * With o->preprocess = TS_INFER_PREP_DATASET and data.path naming a
 * dataset whose /fingerprint records a crop or a target spacing, each scan
 * is cropped and resampled as convert did before normalising, and the
 * labels go back onto the scan's grid (io/preprocess.h).
 * Fills r on every rank. cfg and o are borrowed. Errors name the file, the
 * key or the checkpoint and are agreed on every rank; a list whose labels
 * or outputs cannot be matched fails before any prediction. */
int ts_infer_run(const ts_config *cfg, MPI_Comm world, const ts_infer_opts *o, ts_infer_result *r);

#endif
