/* Writing tessera datasets in parallel. Samples are produced by the ranks
 * (converted from NIfTI, or synthesised) and written in rounds: each round
 * every rank hands over at most one sample. One output file written by
 * several ranks is written collectively (parallel HDF5); with shards, each
 * shard belongs to one rank, which writes its raw chunks directly with the
 * checksum computed here. Everything goes to temporary names that are renamed
 * only when all ranks succeeded, so a failed run never leaves a file that
 * looks complete and never replaces an existing one. */
#ifndef TS_IO_WRITER_H
#define TS_IO_WRITER_H

#include <mpi.h>
#include <stdint.h>

#include "io/dataset.h"

/* What one sample contributes to the dataset fingerprint (io/fingerprint.h;
 * fixed size: gathered with the sample's meta). */
typedef struct ts_fp_sample {
    int64_t shape_orig[3];      /* D, H, W of the scan as read */
    double spacing_orig[3];
    int64_t crop[6];            /* lo D, H, W, hi D, H, W (exclusive) in the scan's grid */
    int64_t fg;                 /* voxels with label > 0 (stored volume) */
    double mean[TS_IO_MAX_CHANNELS], m2[TS_IO_MAX_CHANNELS]; /* over them: mean, sum of squared deviations */
    double min[TS_IO_MAX_CHANNELS], max[TS_IO_MAX_CHANNELS];
} ts_fp_sample;

/* How a dataset was preprocessed (attributes of /fingerprint). */
typedef struct ts_fp_prep {
    double spacing[3];          /* the target spacing resampled to; 0: not resampled */
    int crop;                   /* 1: cropped to the non-zero box */
    int label_nearest;          /* labels resampled by nearest (else one-hot linear) */
    int image_cubic;            /* images resampled by cubic B-spline (else trilinear) */
    int separate;               /* an anisotropic scan's coarse axis resampled apart by nearest voxel
                                 * (ts_resample_separate_axis; nnU-Net's "separate z") */
    int downsample;             /* > 1: integer block downsampling instead */
    char modality[TS_IO_MAX_CHANNELS][16]; /* per channel: CT, MR or other ("" = other) */
} ts_fp_prep;

/* One sample in memory (borrowed by the writer for one call). */
typedef struct ts_sample {
    char name[TS_IO_PATH_MAX];       /* e.g. "hippocampus_001" */
    int64_t shape[4];                /* C, D, H, W */
    float *image;                    /* [C, D, H, W], finite */
    uint8_t *label;                  /* [D, H, W], values < classes */
    double spacing[3];               /* voxel size along D, H, W (NIfTI pixdim[3], [2], [1]) */
    double sform[16], qform[16];     /* NIfTI (i, j, k, 1) -> (x, y, z, 1), row-major 4x4 */
    int sform_code, qform_code;
    char source_image[TS_IO_PATH_MAX], source_label[TS_IO_PATH_MAX];
    /* the scan before preprocessing (io/preprocess.h); shape_orig all 0:
     * the stored volume is the scan (no crop, no resampling) */
    int64_t shape_orig[3];           /* D, H, W */
    double spacing_orig[3];
    int64_t crop[6];                 /* the box kept: lo D, H, W, hi D, H, W (exclusive), scan voxels */
    /* the volume the fingerprint's foreground intensity statistics are over, as nnU-Net's: the scan
     * cropped, before resampling or downsampling ([C, fp_shape], [fp_shape]); NULL: the stored volume.
     * Owned like image and label. */
    float *fp_image;
    uint8_t *fp_label;
    int64_t fp_shape[3];
} ts_sample;

/* What the writer computes per sample and stores in attributes and the index. */
typedef struct ts_sample_meta {
    char name[TS_IO_PATH_MAX];
    int64_t index;                   /* global sample index */
    int64_t shape[4];
    double spacing[3];
    double sform[16], qform[16];
    int32_t sform_code, qform_code;
    int32_t shard;
    int64_t nfg;                     /* foreground coordinates stored */
    int64_t nvox;                    /* D*H*W */
    double mean[TS_IO_MAX_CHANNELS], std[TS_IO_MAX_CHANNELS];
    double min[TS_IO_MAX_CHANNELS], max[TS_IO_MAX_CHANNELS];
    double pct[TS_IO_MAX_CHANNELS][TS_IO_NPCT];
    /* mean and std over the channel's foreground mask: its voxels above the
     * channel's mean (data.norm = foreground; docs/medical.md) */
    double fg_mean[TS_IO_MAX_CHANNELS], fg_std[TS_IO_MAX_CHANNELS];
    int64_t class_voxels[TS_IO_MAX_CLASSES];
    char source_image[TS_IO_PATH_MAX], source_label[TS_IO_PATH_MAX];
    ts_fp_sample fp;                 /* the fingerprint's part (filled by the writer, not ts_sample_stats) */
} ts_sample_meta;

typedef struct ts_dswriter_opts {
    int64_t count;                   /* number of samples (> 0) */
    int channels;                    /* C (1..TS_IO_MAX_CHANNELS) */
    int classes;                     /* K (2..TS_IO_MAX_CLASSES) */
    const char *const *class_names;  /* K names or NULL ("background", "class1", ...) */
    const char *const *channel_names;/* C names or NULL ("image0", ...) */
    int shards;                      /* 1 = one file; N > 1 = N shard files plus the manifest at path */
    int chunk;                       /* chunk edge in voxels (default 64) */
    const char *source;              /* provenance text stored in the root attribute `source` */
    uint64_t seed;                   /* for the foreground coordinate subsample */
    const ts_fp_prep *prep;          /* recorded in /fingerprint; NULL: no preprocessing, modalities "other" */
} ts_dswriter_opts;

typedef struct ts_dswriter ts_dswriter;

/* Collective on comm. Prepares writing opts->count samples to path. */
int ts_dswriter_create(MPI_Comm comm, const char *path, const ts_dswriter_opts *opts, ts_dswriter **out);
/* Local. The samples this rank must produce, in order: count and k-th index. */
int64_t ts_dswriter_local_count(const ts_dswriter *w);
int64_t ts_dswriter_local_index(const ts_dswriter *w, int64_t k);
/* Local. Number of rounds (the same on every rank). */
int64_t ts_dswriter_rounds(const ts_dswriter *w);
/* Collective. One round: s is this rank's next sample (NULL when it has no
 * more, or when local_err != 0). local_err is this rank's status producing
 * it; if any rank failed, every rank returns an error (the failing rank's
 * message) and nothing more is written. Checks s (shape, finite image,
 * labels < classes) and fails on every rank naming the sample if not. */
int ts_dswriter_put(ts_dswriter *w, const ts_sample *s, int local_err);
/* Collective. Writes the index and statistics, closes the files and renames
 * them into place (shards first, the manifest or single file last). */
int ts_dswriter_finish(ts_dswriter *w);
/* Collective. Frees the writer; if finish did not succeed, removes every
 * temporary file. Accepts NULL; sets *w to NULL. */
void ts_dswriter_destroy(ts_dswriter **w);

/* Local. Computes a sample's statistics (channel mean/std/min/max and
 * percentiles with numpy's linear interpolation, class voxel counts) and
 * checks it (finite image, labels < classes). Errors name the sample. */
int ts_sample_stats(const ts_sample *s, int classes, ts_sample_meta *m);

/* Local. The shard file name for shard k of n next to path ("DATA.h5" ->
 * "DATA-shard-00001-of-00004.h5"), into buf. */
void ts_io_shard_name(const char *path, int k, int n, char *buf, size_t len);

#endif
