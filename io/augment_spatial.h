/* Spatial augmentation of training patches: random rotation about each
 * axis, isotropic zoom and elastic deformation, applied to the image
 * (trilinear) and the label (nearest) with one transform. It works by
 * sampling: every output voxel of the patch computes where it comes from in
 * the volume and interpolates there, from a box read from the dataset that
 * covers the transformed patch (parts outside the volume are padding: 0
 * after normalisation, label 0). The transform is a function of the whole
 * patch's parameters and of the voxel's place in the patch only, so a box
 * of the patch held by one rank of a spatial group is bit for bit that box
 * of the unsplit patch. All parameters are drawn from the sample stream
 * (ts_spatial_aug_draw); options that are off draw nothing. Defaults and
 * where they come from: docs/medical.md, "Spatial augmentation". */
#ifndef TS_IO_AUGMENT_SPATIAL_H
#define TS_IO_AUGMENT_SPATIAL_H

#include <stdint.h>

#include "io/dataset.h"
#include "src/core/rng.h"

#define TS_ELASTIC_MAX_POINTS 16

typedef struct ts_spatial_aug_opts {
    double rot_p;       /* probability of a rotation (then about all three axes); 0: off, no draws */
    double rot_deg;     /* each angle uniform in [-rot_deg, rot_deg] degrees */
    double zoom_p;      /* probability of an isotropic zoom; 0: off */
    double zoom_min, zoom_max; /* the factor s, uniform in [zoom_min, zoom_max]; the patch samples the volume
                                * at s times its voxel spacing (s < 1 magnifies) */
    double elastic_p;   /* probability of an elastic deformation; 0: off */
    int elastic_points; /* control points per axis over the patch (cubic B-spline), 4..TS_ELASTIC_MAX_POINTS */
    double elastic_disp; /* each control point's displacement uniform in [-disp, disp] voxels per axis */
    int plane;          /* 1: in the H-W plane only (nnU-Net's "dummy 2D" augmentation of anisotropic patches):
                         * the rotation about D only, by rot_deg_plane; the zoom of H and W only; the elastic
                         * displacement along H and W only */
    double rot_deg_plane; /* with plane: the angle uniform in [-rot_deg_plane, rot_deg_plane] degrees */
    int cubic;          /* the image by cubic convolution (Keys, a = -0.5: 4 taps per axis), else trilinear */
    int label_linear;   /* the label one-hot linear (each class's indicator trilinear, the largest; ties to the
                         * lower class), else the nearest voxel */
} ts_spatial_aug_opts;

/* Local. The most voxels the box read for one transformed patch (or a
 * rank's box of it) of size box can hold: per axis, the extent of the box
 * rotated and zoomed (zoom_max times its diagonal with a rotation, the H-W
 * plane's diagonal with o->plane, zoom_max times its edge with a zoom
 * alone), plus the elastic displacement on both sides and the
 * interpolation's margin, at most the volume's edge vol[d] (vol NULL: no
 * bound), the larger of box and box with H and W swapped (a 90-degree
 * rotation about D); 0 when no spatial transform can be drawn (the plain
 * crop reads a patch). */
double ts_spatial_aug_read_voxels(const ts_spatial_aug_opts *o, const int64_t box[3], const int64_t vol[3]);

/* Local. nnU-Net's rule for the in-plane mode: the patch's largest edge is
 * more than 3 times its D edge (ANISO_THRESHOLD). */
int ts_spatial_aug_plane_auto(const int64_t patch[3]);
/* Local. data.aug_2d's mode ("on", "off", "auto": the rule above) for a
 * patch: 1 when the augmentation is in the H-W plane. */
int ts_spatial_aug_plane_of(const char *mode, const int64_t patch[3]);

/* The drawn transform of one patch. A patch voxel whose read-box
 * coordinate (after flips and 90-degree rotations) is s comes from volume
 * coordinate lo + c + a (s - c) + e(s): c the read box's centre, e the
 * elastic displacement (0 without). on = 0: the identity (the patch is a
 * plain crop). */
typedef struct ts_spatial_xform {
    int on;
    double a[3][3];
    double angle[3]; /* degrees about D, H, W (0 when no rotation was drawn) */
    double zoom;     /* 1 when no zoom was drawn */
    int elastic;
    int plane;       /* the elastic displacement has no D component (opts.plane) */
    int cubic, label_linear; /* the interpolation (opts) */
    uint64_t elastic_key;
    int elastic_points;
    double elastic_disp;
    int halo; /* set by the caller: the patch given to ts_spatial_aug_box is the
               * real patch grown by halo voxels on each side (a blur's reach);
               * the elastic field stays the real patch's */
} ts_spatial_xform;

/* Local. Checks the options: 0, or TS_ERR_CONFIG naming the data.* key. */
int ts_spatial_aug_check(const ts_spatial_aug_opts *o);

/* Local. Draws one patch's transform from r: rotation (a coin, then three
 * angles), zoom (a coin, then the factor), elastic (a coin, then a 64-bit
 * key for the control points); each group only when its probability is > 0,
 * always the same number of draws for given options. */
void ts_spatial_aug_draw(const ts_spatial_aug_opts *o, ts_rng *r, ts_spatial_xform *x);

/* Local. The box [rlo, rlo + rsz) of a volume of extent dim that
 * ts_spatial_aug_box reads for the same arguments (the transformed
 * sub-box's place, its elastic reach and a voxel of margin, clipped). */
void ts_spatial_aug_read_box(const ts_spatial_xform *x, const int64_t patch[3], int k, int flips, const int64_t lo[3],
                             const int64_t sub_lo[3], const int64_t sub_size[3], const int64_t dim[3], int64_t rlo[3],
                             int64_t rsz[3]);

/* Local. Fills image [C, sub_size] and label [sub_size] with voxels
 * [sub_lo, sub_lo + sub_size) of the transformed patch of sample i: patch
 * size `patch`, flips and k 90-degree rotations as in ts_patch_transform,
 * read box [lo, lo + box) in the volume (box = patch with H, W swapped for
 * an odd k). normalize(ctx, buf, C, nv) normalises the read image box in
 * place (NaN padding to 0) before the interpolation. mn/mx receive the
 * per-channel min and max of the output box. 0, or an error (reading, or
 * TS_ERR_NOMEM). */
typedef void (*ts_spatial_norm_fn)(void *ctx, float *image, int64_t C, int64_t nv);
int ts_spatial_aug_box(ts_dataset *ds, int64_t i, const ts_spatial_xform *x, const int64_t patch[3], int k,
                       int flips, const int64_t lo[3], const int64_t sub_lo[3], const int64_t sub_size[3],
                       ts_spatial_norm_fn normalize, void *ctx, float *image, uint8_t *label, float *mn, float *mx);

#endif
