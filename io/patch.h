/* Patches for training: a box of a sample chosen at random (or centred on a
 * stored foreground voxel for a configurable fraction of patches), read with
 * a hyperslab of just that box (volumes smaller than the patch are padded),
 * then augmented (random flips, 90-degree rotations in the axial plane (H,
 * W), rotation, zoom and elastic deformation sampled from the volume
 * (io/augment_spatial.h), gamma, intensity scale and shift, and io/augment.h's
 * nnU-Net intensity augmentations) and normalised (z-score per image, over the
 * image's foreground or per dataset, optional percentile clipping). Padding is 0 after
 * normalisation, label 0. All randomness comes from the caller's stream, so
 * a patch depends only on (seed, stream position), never on thread timing or
 * the number of ranks. A patch split over ranks (spatial parallelism) is
 * drawn box by box (ts_patch_draw_box, ts_patch_finish), each rank reading
 * only the file region that lands in its box. */
#ifndef TS_IO_PATCH_H
#define TS_IO_PATCH_H

#include <mpi.h>
#include <stdint.h>

#include "io/augment_spatial.h"
#include "io/augment.h"
#include "io/dataset.h"
#include "src/core/rng.h"

/* image: z-score with the sample's mean/std over all voxels; dataset: with
 * the dataset's; none; foreground: with the sample's mean/std over its
 * voxels above the mean (ts_sample_info.fg_mean/fg_std); ct: clipped to
 * the dataset's foreground 0.5 and 99.5 percentiles, z-score with its
 * foreground mean/std (ts_dataset_fg_intensity; nnU-Net's CT scheme) */
typedef enum { TS_NORM_IMAGE = 0, TS_NORM_DATASET, TS_NORM_NONE, TS_NORM_FOREGROUND, TS_NORM_CT } ts_norm_mode;

typedef struct ts_patch_opts {
    int64_t patch[3];    /* D, H, W */
    double fg_fraction;  /* probability that a training patch is centred on a foreground voxel */
    int augment;         /* 0: no augmentation at all */
    int flip;            /* flip each axis with probability 1/2 */
    int rot90;           /* rotate by k*90 degrees in the (H, W) plane, k uniform in 0..3 */
    double scale;        /* intensity x*s, s uniform in [1 - scale, 1 + scale] */
    double shift;        /* intensity x + b, b uniform in [-shift, shift] (normalised units) */
    double gamma;        /* gamma g = exp(u), u uniform in [-ln(1+gamma), ln(1+gamma)], on half the patches */
    double noise_p;      /* probability (per channel) of additive Gaussian noise; 0: no draws at all */
    double noise_std;    /* its sigma, uniform in [0, noise_std] (normalised units) */
    ts_spatial_aug_opts spatial; /* rotation, zoom, elastic (io/augment_spatial.h); all 0: off */
    ts_norm_mode norm;    /* every channel's, unless norm_nch > 0 */
    /* data.norm as a list, one mode per channel (nnU-Net's normalisation
     * per modality: ct for a CT channel, foreground for an MR one); 0: norm
     * for all. dataset is not allowed in a list (ts_patch_parse_norm) */
    int norm_nch;
    ts_norm_mode norm_ch[TS_IO_MAX_CHANNELS];
    int clip_lo, clip_hi; /* indices into ts_io_pct_levels, or -1: no clipping */
    ts_aug_opts aug;      /* brightness, contrast, inverted gamma, blur, low resolution (io/augment.h) */
} ts_patch_opts;

/* Local. Fills image [C, D, H, W] and label [D, H, W] (the patch size of o)
 * with a patch of sample i. train: random box and augmentation drawn from r;
 * otherwise the centred box, no augmentation. scratch must hold
 * ts_patch_scratch_floats(ds, o) floats (for rotated or flipped reads).
 * Equals ts_patch_draw_box on the whole patch followed by ts_patch_finish
 * with the box's own min and max (it is written that way). */
int ts_patch_draw(ts_dataset *ds, int64_t i, const ts_patch_opts *o, ts_rng *r, int train, float *image,
                  uint8_t *label, float *scratch);
size_t ts_patch_scratch_floats(const ts_dataset *ds, const ts_patch_opts *o);
/* Local. The most bytes the loader allocates for one augmented patch (or a
 * rank's box of it) of size box with C channels, beyond the batch slots:
 * the box a spatially transformed patch is read from, grown by the blur and
 * low-resolution halo (ts_spatial_aug_read_voxels; C floats and a label
 * byte per voxel), plus that halo's work buffer ((2C + 3) floats per voxel
 * of the grown box); 0 when o->augment is off. vol: the largest volume
 * (NULL: no bound). */
double ts_patch_read_bytes(const ts_patch_opts *o, const int64_t box[3], int64_t C, const int64_t vol[3]);
/* Local. Scratch floats ts_patch_draw_box needs for a sub-box of this size. */
size_t ts_patch_scratch_floats_box(const ts_dataset *ds, const int64_t sub_size[3]);

/* The intensity augmentation of one patch still to be applied after
 * ts_patch_draw_box: the parameters drawn for it and, per channel, the min
 * and max of the normalised box (padding, 0, included). Gamma needs the min
 * and max of the whole patch: a caller holding one box of a patch split
 * over ranks replaces mn/mx by the reduction over all boxes (MIN, MAX)
 * before ts_patch_finish. */
typedef struct ts_patch_pending {
    int augment;                                  /* 0: nothing to apply (eval, or augmentation off) */
    int64_t channels;
    float mn[TS_IO_MAX_CHANNELS], mx[TS_IO_MAX_CHANNELS];
    int do_gamma[TS_IO_MAX_CHANNELS];
    double g[TS_IO_MAX_CHANNELS], scale[TS_IO_MAX_CHANNELS], shift[TS_IO_MAX_CHANNELS];
    /* Gaussian noise: sigma per channel (0: none), drawn per patch voxel
     * from a counter-based stream keyed by noise_key and the voxel's index
     * in the patch, so a box gets its own voxels' noise: the box's place */
    double noise_sigma[TS_IO_MAX_CHANNELS];
    uint64_t noise_key;
    int64_t patch[3], sub_lo[3], sub_size[3];
    ts_aug_pending aug; /* the point-wise ones of io/augment.h (blur and low resolution are applied already) */
} ts_patch_pending;

/* Local. One box of the patch ts_patch_draw would return for the same
 * (ds, i, o, r state, train): image [C, sub_size] and label [sub_size]
 * receive patch voxels [sub_lo, sub_lo + sub_size) (patch coordinates D, H,
 * W; the box must lie inside the patch), bit for bit those of the whole
 * patch before its intensity augmentation, which is recorded in *pend
 * instead of applied. Every random number ts_patch_draw draws is drawn here,
 * in the same order, whatever the box, so ranks holding different boxes of
 * one patch with equal streams agree on every choice. Only the preimage of
 * the box (after flips and rotation) is read from the file; with a
 * rotation, zoom or elastic deformation drawn, the box of the volume its
 * voxels are sampled from (ts_spatial_aug_box). scratch: at
 * least ts_patch_scratch_floats_box(ds, sub_size) floats. */
int ts_patch_draw_box(ts_dataset *ds, int64_t i, const ts_patch_opts *o, ts_rng *r, int train,
                      const int64_t sub_lo[3], const int64_t sub_size[3], float *image, uint8_t *label,
                      float *scratch, ts_patch_pending *pend);
/* Local. Applies the intensity augmentation recorded in p (gamma with p's
 * mn/mx per channel, then scale and shift, then Gaussian noise) to image [p->channels, nv] in
 * place; the float operations are those of ts_patch_draw, so boxes finished
 * with the whole patch's mn/mx are bit for bit boxes of ts_patch_draw's
 * output. Nothing to do when p->augment is 0. */
void ts_patch_finish(float *image, int64_t nv, const ts_patch_pending *p);

/* Local. The spatial transform on its own: in [C, D, rh, rw] (rh, rw =
 * (H, W), or (W, H) when k is odd) to out [C, D, H, W]: out(z, y, x) =
 * in(z', y', x') with (z, y, x) first flipped (flips bit 0: D, 1: H, 2: W)
 * and then rotated k times by 90 degrees. C = 0 skips the image; lin/lout
 * (labels) may be NULL. 0, or TS_ERR_NOMEM (its index tables). */
int ts_patch_transform(const float *in, const uint8_t *lin, int64_t C, const int64_t size[3], int k, int flips,
                       float *out, uint8_t *lout);
/* Local. Where a box of the transformed patch comes from: the box
 * [pre_lo, pre_lo + pre_size) of the untransformed box [D, rh, rw] (read
 * orientation: (H, W) swapped when k is odd) that ts_patch_transform maps
 * onto patch voxels [sub_lo, sub_lo + sub_size) of a patch of size
 * `patch`. A flip maps [a, b) to [n - b, n - a); an odd k swaps the extents. */
void ts_patch_preimage(const int64_t patch[3], const int64_t sub_lo[3], const int64_t sub_size[3], int k, int flips,
                       int64_t pre_lo[3], int64_t pre_size[3]);
/* Local. ts_patch_transform restricted to one box: in holds the preimage
 * box (ts_patch_preimage) as [C, pre_size], out receives [C, sub_size] =
 * patch voxels [sub_lo, sub_lo + sub_size) of the transformed patch. With
 * sub_lo 0 and sub_size = patch it is ts_patch_transform. 0, or
 * TS_ERR_NOMEM. */
int ts_patch_transform_box(const float *in, const uint8_t *lin, int64_t C, const int64_t patch[3],
                           const int64_t sub_lo[3], const int64_t sub_size[3], int k, int flips, float *out,
                           uint8_t *lout);

/* The mode of channel c: o->norm_ch[c] when data.norm is a list, else o->norm. */
ts_norm_mode ts_patch_norm_of(const ts_patch_opts *o, int64_t c);
/* Local. Parses data.norm: one of image|dataset|none|foreground|ct for
 * every channel, or a comma list of image|none|foreground|ct, one per
 * channel (at most TS_IO_MAX_CHANNELS), into o->norm / o->norm_nch,
 * o->norm_ch. TS_ERR_CONFIG naming the word and `source` (the key's place
 * in the configuration) when a word is not a mode. */
int ts_patch_parse_norm(const char *s, const char *source, ts_patch_opts *o);

/* The statistics normalisation takes them from, per channel: the image's
 * over all voxels (mean, std) and over its foreground (fg_mean, fg_std;
 * NULL: mean, std), its percentiles pct [C * TS_IO_NPCT] (data.clip), the
 * dataset's dmean/dstd (data.norm = dataset; NULL: 0 and 1) and its
 * fingerprint's foreground intensities ct (data.norm = ct; NULL: a ct
 * channel is left as it is, for ts_patch_normalize_scan to finish). */
typedef struct ts_norm_stats {
    const double *mean, *std, *fg_mean, *fg_std, *pct, *dmean, *dstd;
    const ts_fg_intensity *ct;
} ts_norm_stats;

/* Local. Normalises image [C, nv] in place as training patches are, each
 * channel by its mode (ts_patch_norm_of): image: z-score with the image's
 * mean/std; foreground: with those over its foreground mask; dataset: the
 * dataset's; ct: clipped to the dataset's foreground 0.5/99.5 percentiles
 * and z-scored with its foreground mean/std; none. Clipping to the image's
 * percentiles when o->clip_* are set (not for ct); NaN becomes 0. */
void ts_patch_normalize(float *image, int64_t C, int64_t nv, const ts_patch_opts *o, const ts_norm_stats *st);
/* Collective on comm. The ct channels of a scan at inference (the others
 * are left as they are): opens the training dataset (data.path), checks
 * it has the statistics and C channels (an error naming it on every rank
 * if not) and normalises every channel whose mode is ct with them. Nothing
 * to do (and no dataset needed) when no channel is ct. */
int ts_patch_normalize_scan(MPI_Comm comm, const char *dataset, const ts_patch_opts *o, float *image, int64_t C,
                            int64_t nv);
/* Local. 0, or an error naming the dataset when a channel's mode is
 * foreground and the dataset has no foreground statistics (written before
 * them), or ct and it has no fingerprint intensity statistics, or
 * data.norm lists a number of modes other than its channels. */
int ts_patch_check_norm(const ts_dataset *ds, const ts_patch_opts *o);
/* Local. The whole sample i, normalised like evaluation patches (no
 * augmentation): image [C, D, H, W], label [D, H, W]. */
int ts_patch_read_volume(ts_dataset *ds, int64_t i, const ts_patch_opts *o, float *image, uint8_t *label);

/* Local. Parses "none", "0.5-99.5", "1-99", "5-95" into percentile indices. */
int ts_patch_parse_clip(const char *s, int *lo, int *hi);

#endif
