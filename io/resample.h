/* Integer-factor resampling of volumes, for training at a coarser grid than
 * the scans (a common choice for whole-organ segmentation): images by block
 * means, labels by block majority (ties to the lower class), geometry
 * (spacing and voxel-to-world transforms) adjusted so that a coarse voxel
 * sits at the centre of its block; and the way back for predicted labels
 * (each coarse voxel fills its block). Local, no allocation. */
#ifndef TS_IO_RESAMPLE_H
#define TS_IO_RESAMPLE_H

#include <stdint.h>

/* Coarse size along an axis: ceil(n / f). */
static inline int64_t ts_resample_size(int64_t n, int f) { return (n + f - 1) / f; }

/* img [C, D, H, W] -> out [C, D', H', W'] (block means over the voxels
 * present at the borders); either image pointer may be NULL. lab [D, H, W]
 * -> olab (majority of K classes); either label pointer may be NULL. */
void ts_resample_down(int64_t C, const int64_t dhw[3], int f, const float *img, float *out, const uint8_t *lab, int K,
                      uint8_t *olab);
/* Coarse labels [D', H', W'] back onto the fine grid [D, H, W]. */
void ts_resample_up_labels(const uint8_t *coarse, const int64_t dhw[3], int f, uint8_t *fine);
/* A 4x4 row-major voxel (i, j, k) -> world transform for the coarse grid:
 * coarse voxel c sits at fine voxel f*c + (f-1)/2 along each axis. */
void ts_resample_affine(const double in[16], int f, double out[16]);

#endif
