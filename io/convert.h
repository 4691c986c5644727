/* Converters from NIfTI to tessera datasets, run in parallel: every rank
 * reads and checks its share of the volumes and hands them to the dataset
 * writer (collective writes into one file, or its own shards). Any bad input
 * on any rank stops every rank with that rank's message, and no output file
 * is left behind (see writer.h). */
#ifndef TS_IO_CONVERT_H
#define TS_IO_CONVERT_H

#include <mpi.h>
#include <stdint.h>

typedef struct ts_convert_opts {
    const char *label_map;  /* a label map file (labelmap.h), or NULL: label values are classes */
    int classes;            /* without a map: the number of classes (0 = largest label + 1, one more pass) */
    int shards;             /* 1 = one file (default) */
    int chunk;              /* chunk edge (default 64) */
    uint64_t seed;          /* foreground coordinate subsample */
    int downsample;         /* > 1: store the volumes at a grid this many times coarser (io/resample.h) */
    int nan_to_set;         /* 1: non-finite image voxels (NaN, Inf) become nan_to, with a warning per file;
                             * 0 (default): they are an error naming the file and their count */
    float nan_to;           /* finite */
    /* preprocessing (io/preprocess.h), in this order: crop, then resample */
    int crop_nonzero;       /* 1: crop each scan to the box of its non-zero image voxels (any channel) */
    double spacing[3];      /* > 0: resample to this spacing, D, H, W in mm (NIfTI pixdim[3], [2], [1]) */
    int spacing_median;     /* 1: resample to the planner's target spacing of these scans (a first pass reads
                             * every image: ts_fp_target_spacing over their spacings and cropped shapes) */
    int label_nearest;      /* labels resampled by nearest voxel (default 0: one-hot linear) */
    int image_linear;       /* images resampled trilinearly (default 0: cubic B-spline, nnU-Net's order 3) */
    int no_separate;        /* 1: an anisotropic scan's coarse axis like the others (default 0: apart, by
                             * nearest voxel, nnU-Net's "separate z": ts_resample_separate_axis) */
    const char *modality;   /* comma list, one per channel: CT, MR, other; NULL: a channel named CT (or MR,
                             * MRI; any case) is that, others are "other" */
} ts_convert_opts;

/* Collective. Converts n (image, label) pairs of NIfTI files to out.
 * Errors name the file: bad headers (io/nifti.h), grid mismatches, labels
 * that are not classes, non-finite image voxels (unless nan_to_set), an
 * unknown modality, --downsample together with a spacing. */
int ts_convert_nifti(MPI_Comm comm, int n, const char *const *images, const char *const *labels,
                     const ts_convert_opts *o, const char *out);

/* Collective. Converts a Medical Segmentation Decathlon task folder (its
 * dataset.json: `modality` gives the channels, `labels` the classes,
 * `training` the image/label pairs; 4-D images hold the modalities along t). */
int ts_convert_msd(MPI_Comm comm, const char *dir, const ts_convert_opts *o, const char *out);

#endif
