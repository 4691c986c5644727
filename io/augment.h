/* Intensity augmentations after nnU-Net's (batchgenerators) defaults, on top
 * of the flips, rotations, gamma, scale, shift and noise of io/patch.c:
 * multiplicative brightness, contrast, inverted gamma, Gaussian blur and
 * simulated low resolution. Their random numbers are drawn from the
 * patch's stream after every draw of io/patch.c, only for options that are
 * on, so turning them on leaves every other choice as it was.
 *
 * Point-wise ones (contrast, inverted gamma, brightness) are applied by
 * ts_patch_finish with the whole patch's min and max (as gamma). Blur and
 * low resolution need neighbours: ts_patch_draw_box reads its box with a
 * halo of ts_aug_halo voxels (the real volume around the box, padding 0
 * outside it, whether the neighbours lie in another rank's box or outside
 * the patch) and ts_aug_neighbours computes the box from it, so a box of a
 * patch split over a spatial group is bit for bit the unsplit patch's box
 * (every voxel's value comes from the same voxels by the same float
 * operations). The low-resolution grid is the patch's own: a box's voxels
 * are resampled exactly as in the whole patch. */
#ifndef TS_IO_AUGMENT_H
#define TS_IO_AUGMENT_H

#include <stdint.h>

#include "io/dataset.h"
#include "src/core/rng.h"

typedef struct ts_aug_opts {
    double brightness_p, brightness; /* per channel: x*m, m uniform in [1-b, 1+b] */
    double contrast_p, contrast;     /* per channel: x*f about 0 (the normalisation's centre), clipped to the
                                      * patch's [min, max]; f uniform in [1-c, 1] or [1, 1+c], half each */
    double gamma_inv_p;              /* per channel: gamma of the inverted image, g as data.gamma's */
    double blur_p;                   /* per patch; then each channel with probability 1/2 */
    double blur_sigma_min, blur_sigma_max; /* sigma (voxels) uniform in [min, max], per channel */
    double lowres_p;                 /* per patch; then each channel with probability 1/2 */
    double lowres_zoom;              /* zoom uniform in [lowres_zoom, 1], per channel (0.25..1) */
} ts_aug_opts;

/* What was drawn for one patch (identity where an option is off). */
typedef struct ts_aug_pending {
    double bright[TS_IO_MAX_CHANNELS];   /* 1: none */
    double contrast[TS_IO_MAX_CHANNELS]; /* 1: none */
    double ginv[TS_IO_MAX_CHANNELS];     /* 0: none, else the inverted gamma's exponent */
    double sigma[TS_IO_MAX_CHANNELS];    /* 0: no blur */
    double zoom[TS_IO_MAX_CHANNELS];     /* 1: no low resolution */
} ts_aug_pending;

/* Local. The halo (voxels on each side of a box) blur and low resolution
 * need with these options; 0 when both are off. */
int ts_aug_halo(const ts_aug_opts *a);

/* Local. Draws this patch's parameters from r for C channels (nothing for
 * options that are off); gamma is data.gamma (the inverted gamma's range). */
void ts_aug_draw(const ts_aug_opts *a, double gamma, ts_rng *r, int64_t C, ts_aug_pending *p);

/* Local. ext [C, ext] holds a box of the patch with a halo of R voxels on
 * each side (ext = sub_size + 2R per axis), normalised; blurs it in place
 * where p says so, then writes the box itself into out [C, sub_size], at
 * low resolution where p says so (the patch's low-resolution grid: patch
 * [D, H, W], box at sub_lo). R must be at least ts_aug_halo of the options
 * p was drawn with. 0 or TS_ERR_NOMEM. */
int ts_aug_neighbours(float *ext, int64_t C, int R, const int64_t patch[3], const int64_t sub_lo[3],
                      const int64_t sub_size[3], const ts_aug_pending *p, float *out);

/* Local. Point-wise augmentation of channel c of a box (x [nv]) with the
 * whole patch's min and max: ts_aug_before_gamma (contrast, inverted gamma;
 * the values stay in [mn, mx]) runs before data.gamma, ts_aug_after_gamma
 * (brightness) after it. */
void ts_aug_before_gamma(float *x, int64_t nv, const ts_aug_pending *p, int64_t c, float mn, float mx);
void ts_aug_after_gamma(float *x, int64_t nv, const ts_aug_pending *p, int64_t c);

#endif
