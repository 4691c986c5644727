/* Evaluation: sliding-window prediction of whole volumes with the model
 * (windows split over the data-parallel replicas, each window's volume
 * over a spatial group, Gaussian-weighted probabilities summed over ranks)
 * and per-class Dice from confusion counts. */
#ifndef TS_INFER_EVALUATE_H
#define TS_INFER_EVALUATE_H

#include <stdint.h>

#include "collectives/coll.h"
#include "src/model/unet.h"

/* Spatial and pipeline parallelism: this rank predicts the box [box_lo,
 * box_lo + box_size) of every window (the model split accordingly, see
 * ts_unet_set_split; the whole window without a split), through the
 * pipeline's stages when forward is set; the ranks of all replicas, spatial
 * groups and stages add their predictions over `all`. */
typedef struct ts_eval_split {
    int64_t box_lo[3], box_size[3];
    ts_coll *all;
    /* pipeline stages: the forward of a batch through every stage (NULL:
     * the model's own forward); *logits the head's output on the last
     * stage, NULL on the others (which then add nothing) */
    int (*forward)(void *ctx, const ts_tensor *x, const ts_tensor **logits);
    void *forward_ctx;
} ts_eval_split;

/* What a prediction did and how long its parts took on this rank (added
 * to, so that mirrored predictions and several scans sum up). */
typedef struct ts_eval_stats {
    double network_s;  /* the model's forwards (with sp/pp: this rank's part and its waits) */
    double blend_s;    /* cutting the windows out and adding their Gaussian-weighted probabilities */
    double reduce_s;   /* the sums over the ranks, the argmax and the normalised probabilities */
    int64_t windows;   /* windows predicted by all ranks together (each mirrored copy counts) */
    int64_t forwards;  /* forwards this rank ran (each of up to `batch` windows) */
    int64_t stream_min, stream_max; /* with several models (nm > 1): the fewest and the most forwards
                                     * one of them ran, summed over the calls; else 0 */
} ts_eval_stats;

/* Collective on coll (the replicas, which share the windows; with sp only
 * its rank and size are used) or, with sp, on sp->all and the model's split
 * hooks. image [C, D, H, W] normalised, identical on every rank; the
 * window is data.patch (the model's config); batch windows per forward.
 * ms[0 .. nm-1]: the model, and with nm > 1 (only without sp) nm - 1 clones
 * of it (ts_unet_clone): this rank's batches then run nm at a time, each
 * model on its own batches with 1/nm of the OpenMP threads for its layers,
 * their probabilities added in the order of one model (the same sums); the
 * stats' network_s is then the models' mean time in forwards and blend_s
 * the rest of the loop's wall time.
 * pred [D, H, W] receives the class with the highest summed probability
 * (the same on every rank); prob (may be NULL) receives the normalised
 * probabilities [K, D, H, W]. sp NULL: no spatial split. st (may be
 * NULL) is added to. */
int ts_eval_predict(ts_unet *const *ms, int nm, ts_coll *coll, const ts_eval_split *sp, const float *image, const int64_t dhw[3],
                    double overlap, int batch, uint8_t *pred, float *prob, ts_eval_stats *st);

/* Flips along D, H and W (bits of ts_eval_flip's and
 * ts_eval_predict_mirror's masks). */
#define TS_EVAL_FLIP_D 1
#define TS_EVAL_FLIP_H 2
#define TS_EVAL_FLIP_W 4
#define TS_EVAL_FLIP_ALL 7

/* Local. out [C, D, H, W] = in flipped along the axes of flip (a mask of
 * TS_EVAL_FLIP_*); in and out do not overlap. A flip is its own inverse. */
void ts_eval_flip(const float *in, float *out, int C, const int64_t dhw[3], int flip);

/* Local. Mirroring axes as letters x, y, z (NIfTI i, j, k = W, H, D; each
 * at most once, e.g. "xyz") or "none", into a TS_EVAL_FLIP_* mask. Returns
 * 0, or -1 for anything else (the caller names the option). */
int ts_eval_parse_axes(const char *s, int *mask);

/* Collective as ts_eval_predict. Test-time mirroring: image is predicted
 * once per subset of the axes in `axes` (TS_EVAL_FLIP_* mask; 7: all 8
 * combinations, as nnU-Net), each prediction's normalised probabilities
 * flipped back and the mean taken; pred is its argmax and prob (may be
 * NULL) the mean. axes 0 is ts_eval_predict. Errors: as ts_eval_predict;
 * TS_ERR_NOMEM (agreed on every rank) for the flipped volume and the
 * probability sums (nv x (C + 2K) floats, besides ts_eval_predict's). */
int ts_eval_predict_mirror(ts_unet *const *ms, int nm, ts_coll *coll, const ts_eval_split *sp, const float *image,
                           const int64_t dhw[3], double overlap, int batch, int axes, uint8_t *pred, float *prob,
                           ts_eval_stats *st);

/* Local. Adds true positives, false positives and false negatives per class. */
void ts_eval_confusion(const uint8_t *pred, const uint8_t *label, int64_t n, int K, int64_t *tp, int64_t *fp,
                       int64_t *fn);
/* Local. Dice = 2 tp / (2 tp + fp + fn); NaN where the class is absent
 * from both prediction and reference. */
double ts_eval_dice(int64_t tp, int64_t fp, int64_t fn);

#endif
