/* Patches for training: a box of a sample chosen at random (or centred on a
 * stored foreground voxel for a configurable fraction of patches), read with
 * a hyperslab of just that box (volumes smaller than the patch are padded),
 * then augmented (random flips, 90-degree rotations in the axial plane (H,
 * W), gamma, intensity scale and shift) and normalised (z-score per image or
 * per dataset, optional percentile clipping). Padding is 0 after
 * normalisation, label 0. All randomness comes from the caller's stream, so
 * a patch depends only on (seed, stream position), never on thread timing or
 * the number of ranks. */
#ifndef TS_IO_PATCH_H
#define TS_IO_PATCH_H

#include <stdint.h>

#include "io/dataset.h"
#include "src/core/rng.h"

typedef enum { TS_NORM_IMAGE = 0, TS_NORM_DATASET, TS_NORM_NONE } ts_norm_mode;

typedef struct ts_patch_opts {
    int64_t patch[3];    /* D, H, W */
    double fg_fraction;  /* probability that a training patch is centred on a foreground voxel */
    int augment;         /* 0: no augmentation at all */
    int flip;            /* flip each axis with probability 1/2 */
    int rot90;           /* rotate by k*90 degrees in the (H, W) plane, k uniform in 0..3 */
    double scale;        /* intensity x*s, s uniform in [1 - scale, 1 + scale] */
    double shift;        /* intensity x + b, b uniform in [-shift, shift] (normalised units) */
    double gamma;        /* gamma g = exp(u), u uniform in [-ln(1+gamma), ln(1+gamma)], on half the patches */
    ts_norm_mode norm;
    int clip_lo, clip_hi; /* indices into ts_io_pct_levels, or -1: no clipping */
} ts_patch_opts;

/* Local. Fills image [C, D, H, W] and label [D, H, W] (the patch size of o)
 * with a patch of sample i. train: random box and augmentation drawn from r;
 * otherwise the centred box, no augmentation. scratch must hold
 * ts_patch_scratch_floats(ds, o) floats (for rotated or flipped reads). */
int ts_patch_draw(ts_dataset *ds, int64_t i, const ts_patch_opts *o, ts_rng *r, int train, float *image,
                  uint8_t *label, float *scratch);
size_t ts_patch_scratch_floats(const ts_dataset *ds, const ts_patch_opts *o);

/* Local. The spatial transform on its own: in [C, D, rh, rw] (rh, rw =
 * (H, W), or (W, H) when k is odd) to out [C, D, H, W]: out(z, y, x) =
 * in(z', y', x') with (z, y, x) first flipped (flips bit 0: D, 1: H, 2: W)
 * and then rotated k times by 90 degrees. C = 0 skips the image; lin/lout
 * (labels) may be NULL. */
void ts_patch_transform(const float *in, const uint8_t *lin, int64_t C, const int64_t size[3], int k, int flips,
                        float *out, uint8_t *lout);

/* Local. Normalises image [C, nv] in place as training patches are: z-score
 * with the image's per-channel mean/std (o->norm = image) or the dataset's
 * dmean/dstd (o->norm = dataset), after clipping to the image's percentiles
 * pct [C * TS_IO_NPCT] when o->clip_* are set; NaN becomes 0. */
void ts_patch_normalize(float *image, int64_t C, int64_t nv, const ts_patch_opts *o, const double *mean,
                        const double *std, const double *pct, const double *dmean, const double *dstd);
/* Local. The whole sample i, normalised like evaluation patches (no
 * augmentation): image [C, D, H, W], label [D, H, W]. */
int ts_patch_read_volume(ts_dataset *ds, int64_t i, const ts_patch_opts *o, float *image, uint8_t *label);

/* Local. Parses "none", "0.5-99.5", "1-99", "5-95" into percentile indices. */
int ts_patch_parse_clip(const char *s, int *lo, int *hi);

#endif
