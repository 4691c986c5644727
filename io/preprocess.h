/* Preprocessing of a scan at conversion, as nnU-Net's: cropping to the box
 * of non-zero image voxels, then resampling to a target spacing by any
 * factor (io/resample.h: images cubic or trilinear, labels one-hot linear
 * or nearest, an anisotropic scan's coarse axis apart by nearest voxel). Each step adjusts the sample's geometry (shape, spacing, sform
 * and qform) so the stored volume sits where the scan's voxels were, and
 * records what was done (ts_sample.shape_orig, spacing_orig, crop) so that
 * inference can undo it. Local, no MPI. */
#ifndef TS_IO_PREPROCESS_H
#define TS_IO_PREPROCESS_H

#include <stdint.h>

#include "io/writer.h"

/* Local. The box [lo, hi) (lo D, H, W, hi D, H, W) of the voxels of img
 * [C, D, H, W] that are non-zero in any channel; the whole volume when
 * every voxel is zero. */
void ts_prep_nonzero_box(const float *img, int64_t C, const int64_t dhw[3], int64_t box[6]);

/* Local. Records the scan's shape and spacing in s->shape_orig and
 * s->spacing_orig, and the whole volume as the crop box; called once on the
 * scan as read, before any step below. */
void ts_prep_begin(ts_sample *s);

/* Local. Crops s (image, label, shape, sform and qform) to box, which must
 * lie in the volume, and records it (in the scan's voxels). *lost gets the
 * label > 0 voxels outside the box. Errors: out of memory (naming the
 * sample). */
int ts_prep_crop(ts_sample *s, const int64_t box[6], int64_t *lost);

/* Local. Resamples s to prep->spacing (D, H, W, mm): sizes round(n sp /
 * target) (ts_resample_size_to), image cubic (prep->image_cubic) or
 * trilinear, labels of K classes one-hot linear or (prep->label_nearest)
 * nearest; with prep->separate, the coarse axis of an anisotropic scan
 * (ts_resample_separate_axis of the scan's and the target spacing) by the
 * nearest voxel, image and labels. The stored spacing is the exact one of
 * the grid (spacing_in x n_in / n_out, within half a voxel of the target).
 * Errors: a spacing that is not positive, out of memory. */
int ts_prep_resample(ts_sample *s, const ts_fp_prep *prep, int K);

/* Local. Shifts a 4x4 row-major (i, j, k, 1) -> world transform to the
 * grid that starts at voxel (d, h, w) = lo of the old one. */
void ts_prep_affine_shift(const double m[16], const int64_t lo[3], double out[16]);

/* ---- at inference: the same steps on a new scan, and back ---- */

/* Local. Preprocesses a scan as a dataset recorded in prep (its
 * /fingerprint attributes): crop to the scan's own non-zero box when
 * prep->crop, then resample to prep->spacing when set, as conversion did
 * (prep->image_cubic, prep->separate). s holds
 * the scan as read (image; label may be zeros) and is changed in place as
 * at conversion: shape, spacing, affines, and shape_orig / crop record what
 * to undo. Errors as ts_prep_crop and ts_prep_resample. */
int ts_prep_scan(const ts_fp_prep *prep, ts_sample *s);

/* Local. Labels predicted on the preprocessed grid lab [dhw] (K classes)
 * back onto the scan's grid out [shape_orig]: resampled to the crop box's
 * shape (one-hot linear, or nearest with prep->label_nearest; with
 * prep->separate an anisotropic axis by the nearest voxel), placed at the
 * box, 0 outside. The inverse of ts_prep_scan for s as it returned. */
int ts_prep_undo_labels(const ts_sample *s, const ts_fp_prep *prep, const uint8_t *lab, int K, uint8_t *out);

/* Local. Class probabilities predicted on the preprocessed grid prob [K,
 * dhw] back onto the scan's grid out [K, shape_orig], as nnU-Net exports
 * them: each class resampled trilinearly to the crop box's shape (with
 * prep->separate an anisotropic axis by the nearest voxel: order 1,
 * order_z 0), which keeps every voxel's sum, placed at the box; outside it
 * the background (class 0) has probability 1. Errors: out of memory. */
int ts_prep_undo_probs(const ts_sample *s, const ts_fp_prep *prep, const float *prob, int K, float *out);

#endif
