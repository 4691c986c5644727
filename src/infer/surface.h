/* Surface-based segmentation metrics and the connected-component
 * post-processing of predicted label maps (docs/medical.md):
 *
 * - the surface of a class is its voxels with at least one face neighbour
 *   (6-connectivity) of another class or outside the volume;
 * - distances are Euclidean in millimetres (the header's voxel spacing),
 *   from each surface voxel of one map to the nearest surface voxel of the
 *   other, by an exact separable distance transform;
 * - HD95 = the larger of the two directed 95th percentiles (linear
 *   interpolation between order statistics, as numpy.percentile), as
 *   MONAI's compute_hausdorff_distance(percentile=95);
 * - NSD (normalised surface distance, "surface Dice" at tolerance tau) =
 *   surface voxels of either map within tau of the other's surface over
 *   all surface voxels of both, as MONAI's compute_surface_dice. */
#ifndef TS_INFER_SURFACE_H
#define TS_INFER_SURFACE_H

#include <stdint.h>

typedef struct ts_surface_metrics {
    double hd95;    /* mm; NaN when the class is absent from both, +inf from one */
    double nsd;     /* in [0, 1]; NaN when absent from both, 0 when absent from one */
    int64_t n_pred; /* surface voxels of the prediction */
    int64_t n_ref;  /* surface voxels of the reference */
} ts_surface_metrics;

/* Local. HD95 and NSD at tolerance tol_mm of class cls between label maps
 * pred and ref of extent dhw (C order, W fastest) and voxel spacing
 * spacing[3] in mm (along D, H, W). Errors: TS_ERR_ARG (spacing not
 * positive, tol_mm negative), TS_ERR_NOMEM. */
int ts_surface_metrics_class(const uint8_t *pred, const uint8_t *ref, const int64_t dhw[3], const double spacing[3],
                             int cls, double tol_mm, ts_surface_metrics *out);

/* Local. Keeps, of class cls, only its largest 26-connected component: the
 * other components' voxels become background (0). cls = TS_FOREGROUND
 * takes every voxel > 0 as one region (nnU-Net's whole-foreground step):
 * the components of the foreground, whatever their classes, but the
 * largest become background. *removed (may be NULL) receives the number of
 * voxels changed. Errors: TS_ERR_NOMEM. */
#define TS_FOREGROUND (-1)
int ts_keep_largest_component(uint8_t *label, const int64_t dhw[3], int cls, int64_t *removed);

#endif
