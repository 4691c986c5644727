/* The dataset fingerprint (as nnU-Net's): per sample the spacing and shape
 * of the scan before and after cropping, and per channel the intensity
 * statistics over the foreground (label > 0) of the whole dataset. The
 * writer accumulates it sample by sample (io/writer.c) and stores it under
 * /fingerprint (docs/formats-dataset.md); `tessera plan-data` reads it back
 * and plans from it (target spacing with the anisotropy rule here, patch
 * and batch in src/plan/plan_data.c). */
#ifndef TS_IO_FINGERPRINT_H
#define TS_IO_FINGERPRINT_H

#include <hdf5.h>
#include <mpi.h>
#include <stdint.h>

#include "io/dataset.h"
#include "io/writer.h"

/* Values the percentiles of one channel are computed over, at most, for the
 * whole dataset: each sample contributes up to ceil(TS_FP_VALUES_MAX / N)
 * of its foreground voxels (all of them when it has fewer; otherwise a
 * seeded selection sample without replacement). nnU-Net samples 10^8 / N
 * with replacement; 10^7 keeps rank 0's buffer at 40 MB per channel. */
#define TS_FP_VALUES_MAX 10000000

/* anisotropy threshold of the target spacing rule (nnU-Net's ANISO_THRESHOLD) */
#define TS_FP_ANISO 3.0

/* Local. The target spacing of nnU-Net's planner from n samples' spacings
 * sp [n][3] and shapes after cropping sh [n][3] (D, H, W): the median
 * spacing per axis (numpy.percentile 50); when the largest median spacing
 * is more than TS_FP_ANISO times the largest other one and that axis's
 * median size times TS_FP_ANISO is below the smallest other median size,
 * that axis takes the 10th percentile of its spacings instead (raised to
 * just above the largest other spacing, + 1e-5, when below it). *aniso_axis
 * gets that axis or -1. Errors: n < 1, a spacing that is not positive. */
int ts_fp_target_spacing(int64_t n, const double *sp, const int64_t *sh, double out[3], int *aniso_axis);

/* Local. numpy.percentile (linear) of v[0..n) at level q (0..100); v is reordered. */
double ts_fp_percentile(double *v, int64_t n, double q);

/* ---- accumulation (used by the dataset writer) ---- */

typedef struct ts_fp_acc ts_fp_acc;

/* Local. An accumulator for a dataset of n samples and C channels whose
 * percentiles are over at most values_max values per channel (the writer:
 * TS_FP_VALUES_MAX): each sample keeps ceil(values_max / n) of its
 * foreground values, chosen by a selection sample seeded by (seed, index). */
int ts_fp_acc_create(int64_t n, int C, uint64_t seed, int64_t values_max, ts_fp_acc **out);
void ts_fp_acc_destroy(ts_fp_acc **a);
/* Local. Sample `index`'s contribution: its statistics into *fs, its
 * sampled foreground values kept in the accumulator (this rank's).
 * image [C, nv], label [nv]. Errors: out of memory. */
int ts_fp_acc_sample(ts_fp_acc *a, int64_t index, const float *image, const uint8_t *label, int64_t nv,
                     ts_fp_sample *fs);
/* Local. Records a sample's contribution (every rank records every sample). */
void ts_fp_acc_record(ts_fp_acc *a, int64_t index, const ts_fp_sample *fs, const double spacing[3],
                      const int64_t shape[3]);
/* Collective. Gathers the sampled values on rank 0, computes the dataset's
 * statistics and gives them to every rank (*out; out->voxels = 0 when the
 * dataset has no foreground). */
int ts_fp_acc_finish(ts_fp_acc *a, MPI_Comm comm, ts_fg_intensity *out);

/* Local (collective HDF5 calls when the file is: every rank passes the same
 * data). Writes /fingerprint into f: the per-sample tables of a (rank 0 in
 * collective mode writes the data: writer), the intensity statistics fi and
 * the preprocessing prep. */
int ts_fp_write(hid_t f, const ts_fp_acc *a, const ts_fg_intensity *fi, const ts_fp_prep *prep, hid_t dxpl,
                int writer);
/* Local. The per-sample attributes of a sample's group. */
int ts_fp_write_sample_attrs(hid_t g, const ts_fp_sample *fs);

/* The fingerprint read back (for plan-data). */
typedef struct ts_fingerprint {
    int64_t n;
    int C, K;
    double *spacing_orig, *spacing;    /* [n][3] */
    int64_t *shape_orig, *shape_crop, *shape;  /* [n][3] */
    int64_t *crop;                     /* [n][6] */
    int64_t *class_voxels;             /* [K] over the dataset */
    ts_fg_intensity fi;                /* fi.voxels = 0: no foreground statistics */
    ts_fp_prep prep;
    char channel_names[TS_IO_MAX_CHANNELS][64];
} ts_fingerprint;

/* Local. Reads the fingerprint of the dataset at path (file or manifest).
 * Errors name the file: not a dataset, no /fingerprint (written before it:
 * convert it again). */
int ts_fingerprint_read(const char *path, ts_fingerprint *fp);
void ts_fingerprint_free(ts_fingerprint *fp);
/* Local. *have = 1 when the HDF5 file at path has a /fingerprint group
 * (datasets converted before it have none). Errors: the file cannot be
 * opened (naming it). */
int ts_fingerprint_present(const char *path, int *have);

/* Local. Reads the intensity statistics of /fingerprint in f (C channels)
 * if there are any: *have = 1 and *fi filled; *have = 0 when the group or
 * the statistics are absent. Errors: malformed attributes (naming path). */
int ts_fp_read_intensity(hid_t f, const char *path, int C, ts_fg_intensity *fi, int *have);

/* Local. Parses a modality name: CT, MR (also MRI), other (any case) into
 * out (canonical spelling). Errors name the value. */
int ts_fp_parse_modality(const char *s, char out[16]);

#endif
