/* Integer-factor resampling of volumes, for training at a coarser grid than
 * the scans (a common choice for whole-organ segmentation): images by block
 * means, labels by block majority (ties to the lower class), geometry
 * (spacing and voxel-to-world transforms) adjusted so that a coarse voxel
 * sits at the centre of its block; and the way back for predicted labels
 * (each coarse voxel fills its block); and any-factor resampling to a
 * target spacing (ts_resample_image, _labels). All local; the integer-factor
 * functions allocate nothing, ts_resample_image allocates its scratch
 * (errors: TS_ERR_NOMEM). */
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

/* Any-factor resampling (to a target spacing, as nnU-Net's preprocessing).
 * Voxel centres stay aligned: output voxel o along an axis samples the input
 * at (o + 0.5) r - 0.5 with r = n_in / n_out (PyTorch's align_corners=False,
 * scikit-image's resize), clamped to the volume; so the output spacing is
 * spacing_in * r exactly and the extent is kept. */

/* Output size along an axis for spacing sp_in -> sp_out: round(n sp_in /
 * sp_out), at least 1. */
int64_t ts_resample_size_to(int64_t n, double sp_in, double sp_out);
/* img [C, D, H, W] -> out [C, D', H', W'] by trilinear interpolation. */
void ts_resample_linear(int64_t C, const int64_t in[3], const float *img, const int64_t out[3], float *res);

/* The axis (0 D, 1 H, 2 W) that nnU-Net resamples apart, by nearest voxel,
 * on an anisotropic scan: when the largest spacing is more than
 * TS_RESAMPLE_ANISO times the smallest, judged on sp_in first, else on
 * sp_out, the one axis of the largest spacing; -1 when neither is
 * anisotropic or two axes share the largest spacing (nnU-Net's rule). */
#define TS_RESAMPLE_ANISO 3.0
int ts_resample_separate_axis(const double sp_in[3], const double sp_out[3]);

/* How images are interpolated. */
typedef enum { TS_INTERP_LINEAR = 0, TS_INTERP_CUBIC = 1 } ts_interp;

/* img [C, D, H, W] -> res [C, D', H', W'], separably: interp on every axis
 * but sep (0..2; -1: none), which takes the nearest voxel. Cubic is the
 * interpolating cubic B-spline (scipy.ndimage's order 3: coefficients by
 * the recursive prefilter with mirror boundaries, positions clamped to the
 * volume as above), so it reproduces the samples and is smoother than
 * trilinear between them. A cubic output voxel whose trilinear taps are all
 * 0 in its channel is 0: the spline's ringing does not fill an empty
 * background, so a non-zero mask (data.norm = nonzero) stays the one of
 * trilinear resampling. Local, allocates two buffers of the intermediate
 * sizes; errors: out of memory. */
int ts_resample_image(int64_t C, const int64_t in[3], const float *img, const int64_t out[3], ts_interp interp,
                      int sep, float *res);

/* lab [D, H, W] (classes < K) -> out [D', H', W']: each class's indicator
 * interpolated trilinearly and the largest taken (ties to the lower class;
 * nnU-Net's "one-hot linear"), or the nearest voxel when nearest is set;
 * along axis sep (0..2; -1: none) always the nearest voxel. */
void ts_resample_labels(const uint8_t *lab, const int64_t in[3], int K, const int64_t out[3], int nearest, int sep,
                        uint8_t *res);
/* The voxel -> world transform of the resampled grid (in[3] -> out[3]). */
void ts_resample_affine_to(const double m[16], const int64_t in[3], const int64_t out[3], double res[16]);

#endif
