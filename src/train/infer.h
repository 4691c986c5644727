/* Inference of one scan, the engine behind `tessera infer`: sliding-window
 * prediction of a NIfTI volume with a trained model (windows split over the
 * replicas, each window over a spatial group or through pipeline stages, as
 * in training), optionally on a coarser grid and resampled back, written as
 * NIfTI with the scan's grid and affine; with a reference label, the
 * per-class Dice. Evaluation during training is src/train/evaluate.h. */
#ifndef TS_TRAIN_INFER_H
#define TS_TRAIN_INFER_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "io/dataset.h"
#include "src/core/config.h"

typedef struct ts_infer_opts {
    const char *checkpoint;    /* a checkpoint (ckpt/step-<N>), a checkpoint folder or a run directory */
    const char *input;         /* the scan, NIfTI (channels along the 4th dimension) */
    const char *output;        /* the label volume written, uint8 NIfTI */
    const char *label;         /* a reference label volume for Dice, or NULL */
    const char *label_map;     /* maps the reference's values to classes, or NULL */
    const char *probabilities; /* also write the class probabilities (float32, 4-D), or NULL */
    int downsample;            /* 1: the scan's grid; F = 2..8: predict on a grid F times coarser */
} ts_infer_opts;

typedef struct ts_infer_result {
    char checkpoint[4096];     /* the checkpoint used */
    int64_t dim[3];            /* the scan's nx, ny, nz */
    int classes;
    int have_dice;             /* 1 when opts->label was given */
    double dice[TS_IO_MAX_CLASSES]; /* per class; NaN where absent from both */
    char class_names[TS_IO_MAX_CLASSES][64]; /* from the label map ("" without one) */
} ts_infer_result;

/* Local. The complete checkpoint that arg names: arg itself, the newest
 * complete one in it, or the newest in arg/ckpt. Errors name arg
 * (TS_ERR_IO: it does not exist; TS_ERR_FORMAT: no complete checkpoint). */
int ts_infer_find_checkpoint(const char *arg, char *path, size_t n);

/* Collective on world. Predicts o->input with the model of cfg (model.*,
 * data.norm/clip, data.patch, eval.overlap, train.batch, parallel.sp/pp)
 * and the checkpoint's parameters, writes o->output (and
 * o->probabilities) on rank 0, and fills r (on every rank). cfg and o are
 * borrowed. Errors name the file, the key or the checkpoint and are agreed
 * on every rank. */
int ts_infer_run(const ts_config *cfg, MPI_Comm world, const ts_infer_opts *o, ts_infer_result *r);

#endif
