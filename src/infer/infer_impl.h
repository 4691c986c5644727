/* The pieces of `tessera infer` beside the prediction (src/infer/infer.c):
 * the list of scans with their output, label and probability files
 * (infer_list.c), and per-scan metrics, their summary, the
 * post-processing classes and decision, and the JSON files
 * (infer_metrics.c). Internal: not installed. */
#ifndef TS_INFER_INFER_IMPL_H
#define TS_INFER_INFER_IMPL_H

#include "io/nifti.h"
#include "io/writer.h"
#include "src/infer/infer.h"

typedef struct ts_infer_item {
    char input[4096], output[4096];
    char label[4096], prob[4096]; /* "" when not asked for */
} ts_infer_item;

typedef struct ts_infer_list {
    int n;
    int multi; /* input named several scans (a folder, a comma list or a list file): outputs are folders */
    ts_infer_item *item;
} ts_infer_list;

/* Local. The scans of o->input and, for each, its output, label and
 * probability paths (docs/training.md, "Inference"). With several scans,
 * output (and probabilities) are folders, created when create is 1 (rank
 * 0); the files are named as the inputs, labels are found in the label
 * folder by the same name (.nii and .nii.gz interchangeable). Errors name
 * the argument and the file: no scan, a missing label, two inputs with one
 * name, an output folder that is an input's folder, TS_ERR_IO. Free with
 * ts_infer_list_free. */
int ts_infer_list_make(const ts_infer_opts *o, int create, ts_infer_list *l);
void ts_infer_list_free(ts_infer_list *l);

/* Local. The metrics file's path: o->metrics, or next to the output
 * (OUTPUT without .nii/.nii.gz + ".metrics.json"; OUTDIR/metrics.json
 * with several scans). */
int ts_infer_metrics_path(const ts_infer_opts *o, const ts_infer_list *l, char *path, size_t n);

/* Local. keep[k] = 1 for the classes of spec: "all" (1..K-1) or a comma
 * list of foreground classes and "foreground" (keep[0]: the whole
 * foreground's largest component, applied first). Errors: TS_ERR_ARG naming
 * spec (class 0, a class >= K, not a number). */
int ts_infer_parse_keep(const char *spec, int K, int *keep);

/* Local. keep[k] from a decision file written by ts_infer_write_decision.
 * Errors name the file: TS_ERR_IO, TS_ERR_FORMAT (not a decision, another
 * number of classes). */
int ts_infer_read_decision(const char *path, int K, int *keep);

/* Local. Dice, HD95 and NSD (tolerance tol mm) per class of pred against
 * ref, extent dhw, spacing mm along D, H, W, into s; with pp also
 * s->dice_pp (each class's Dice with only its largest component kept),
 * s->dice_fg (each class's Dice with only the whole foreground's largest
 * component kept) and s->dice_fg_pp (after that, the class's too).
 * Errors: TS_ERR_ARG (spacing), TS_ERR_NOMEM. */
int ts_infer_scan_metrics(const uint8_t *pred, const uint8_t *ref, const int64_t dhw[3], const double spacing[3],
                          int K, double tol, int pp, ts_infer_scan *s);

/* Local. r's per-class mean and sample std over the n scans (each over the
 * scans where the value is finite) and of the foreground mean Dice. */
void ts_infer_summarise(const ts_infer_scan *s, int n, int K, ts_infer_result *r);

/* Local. nnU-Net's determine_postprocessing: first the whole foreground as
 * one region, decision[0] = 1 when keeping its largest component raises the
 * mean over the foreground classes of their mean Dice over the scans
 * (strictly; fg[0] without, fg[1] with); then per foreground class, on the
 * prediction that step leaves, keep the largest component when it raises
 * the class's mean Dice (strictly); without[k] and with[k] receive those
 * two means. Means are over the scans where the Dice is finite (NaN: the
 * class is in no scan, not applied). As nnU-Net's foreground_mean, the
 * average over the classes is NaN when one class has no Dice in any scan,
 * and the whole-foreground step is then not taken. */
void ts_infer_decide(const ts_infer_scan *s, int n, int K, int *decision, double *without, double *with,
                     double fg[2]);

/* Local. Writes the metrics file (per scan and summary, JSON; docs/training.md). */
int ts_infer_write_metrics(const char *path, const ts_infer_opts *o, const ts_infer_result *r,
                           const ts_infer_scan *s, int n);
/* Local. Writes the decision file (JSON: keep_largest_foreground,
 * keep_largest and the means). */
int ts_infer_write_decision(const char *path, const ts_infer_result *r, int n, const double *without,
                            const double *with, const double fg[2]);

/* ---- the dataset's preprocessing replayed on each scan (infer_prep.c) ---- */

/* Local. What infer replays: nothing (*on = 0) with o->preprocess =
 * TS_INFER_PREP_NONE, without data.path, or when its dataset has no
 * /fingerprint or records neither a crop nor a target spacing; else *on =
 * 1, *prep from the fingerprint and r->prep_* filled. Checks the options
 * against it: probabilities= is refused, downsample= must be the one the
 * dataset was converted with. Errors name data.path's file. */
int ts_infer_prep_load(const ts_config *cfg, const ts_infer_opts *o, ts_fp_prep *prep, int *on, ts_infer_result *r);

/* Local. The scan img, read into *vol [C, dhw] (malloc'd), cropped and
 * resampled as prep says: *vol replaced, dhw the new grid; s keeps what
 * ts_prep_undo_labels needs (its image and label are NULL). Errors name
 * the scan (name). */
int ts_infer_prep_apply(const ts_fp_prep *prep, const char *name, const ts_nifti *img, float **vol, int64_t dhw[3],
                        ts_sample *s);

#endif
