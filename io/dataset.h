/* The tessera dataset: HDF5, one file or shards plus a manifest (schema in
 * docs/formats-dataset.md). Per sample an image [C, D, H, W] float32 and a
 * label [D, H, W] uint8 under /samples/<index>/, chunked, Fletcher-32 on.
 * This header holds the schema constants and the reader: a dataset opened
 * collectively on a communicator (MPI-IO driver, collective metadata, the
 * index read collectively), whose samples are then read independently, a box
 * (patch) at a time, without reading whole volumes. Chunks whose only filter
 * is Fletcher-32 are read raw (H5Dread_chunk) and verified here; others go
 * through H5Dread with a chunk cache sized to the access pattern. */
#ifndef TS_IO_DATASET_H
#define TS_IO_DATASET_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#define TS_IO_FORMAT "tessera-dataset"
#define TS_IO_FORMAT_VERSION 1
#define TS_IO_MAX_CHANNELS 16
#define TS_IO_MAX_CLASSES 256
#define TS_IO_NAME_MAX 64   /* sample names in the index (longer names are cut there) */
#define TS_IO_PATH_MAX 512
#define TS_IO_FG_MAX 4096   /* foreground coordinates stored per sample */
#define TS_IO_NPCT 6        /* intensity percentiles stored per channel */
#define TS_IO_SAMPLES_MAX ((int64_t)1 << 31) /* most samples in a dataset */
#define TS_IO_EDGE_MAX ((int64_t)1 << 20)    /* longest volume edge the reader accepts */
#define TS_IO_VOXELS_MAX ((int64_t)1 << 40)  /* most voxels (C x D x H x W) in one sample */

/* The percentile levels stored per sample and channel: 0.5 1 5 95 99 99.5. */
extern const double ts_io_pct_levels[TS_IO_NPCT];

/* The dataset fingerprint's foreground intensity statistics per channel
 * (/fingerprint, io/fingerprint.h): over the voxels with label > 0 of every
 * sample, at the percentile levels 0.5 50 99.5 (nnU-Net's). data.norm = ct
 * clips to pct[c][0], pct[c][2] and z-scores with mean[c], std[c]. */
#define TS_FP_NPCT 3
extern const double ts_fp_pct_levels[TS_FP_NPCT];
typedef struct ts_fg_intensity {
    int channels;
    double mean[TS_IO_MAX_CHANNELS], std[TS_IO_MAX_CHANNELS];
    double min[TS_IO_MAX_CHANNELS], max[TS_IO_MAX_CHANNELS];
    double pct[TS_IO_MAX_CHANNELS][TS_FP_NPCT];
    int64_t voxels;   /* foreground voxels of the dataset (mean, std, min, max are over all of them) */
    int64_t sampled;  /* of those, the values the percentiles are computed over */
} ts_fg_intensity;

typedef struct ts_dataset ts_dataset;

typedef enum { TS_IO_DRIVER_MPIO = 0, TS_IO_DRIVER_POSIX } ts_io_driver;

typedef struct ts_dataset_opts {
    ts_io_driver driver;   /* MPI-IO (default) or POSIX (sec2) */
    size_t cache_bytes;    /* chunk cache; 0 = sized for one box of box_hint */
    int64_t box_hint[3];   /* typical box (patch) read; 0 = whole samples */
    int check;             /* 1 (default when opts is NULL): check every sample's datasets at open */
} ts_dataset_opts;

typedef struct ts_sample_info {
    const char *name;     /* source name, e.g. "hippocampus_001" */
    int64_t shape[4];     /* C, D, H, W */
    int shard;            /* file index (0 for a single file) */
    int64_t nfg;          /* stored foreground coordinates */
    const double *mean;   /* [C] intensity mean over all voxels */
    const double *std;    /* [C] */
    const double *pct;    /* [C * TS_IO_NPCT] percentiles (levels above) */
    const double *fg_mean; /* [C] mean over the voxels above the channel's mean; NULL in older datasets */
    const double *fg_std;  /* [C] std over those voxels; NULL with fg_mean */
    const int64_t *class_voxels; /* [K] */
} ts_sample_info;

/* Collective on comm. Opens a dataset file or manifest, reads and checks
 * the root attributes and the index, opens the shards, and (opts->check)
 * checks every sample's datasets (names, dtypes, shapes; spread over the
 * ranks). Errors name the file and dataset and are agreed on all ranks.
 * opts may be NULL (MPI-IO, auto cache, check). */
int ts_dataset_open(MPI_Comm comm, const char *path, const ts_dataset_opts *opts, ts_dataset **out);
/* Collective. Closes all files; accepts NULL; sets *ds to NULL. */
void ts_dataset_close(ts_dataset **ds);

/* Local. Sizes and names. */
int64_t ts_dataset_count(const ts_dataset *ds);
int ts_dataset_channels(const ts_dataset *ds);
int ts_dataset_classes(const ts_dataset *ds);
const char *ts_dataset_class_name(const ts_dataset *ds, int k);
const char *ts_dataset_channel_name(const ts_dataset *ds, int c);
const char *ts_dataset_path(const ts_dataset *ds);
/* Dataset-wide per-channel intensity mean and std (over all voxels of all samples). */
const double *ts_dataset_mean(const ts_dataset *ds);
const double *ts_dataset_std(const ts_dataset *ds);
/* 1 when the dataset stores per-sample foreground statistics
 * (/stats/fg_mean, /stats/fg_std: tessera convert since data.norm =
 * foreground); 0 for datasets written before. */
int ts_dataset_has_fg_stats(const ts_dataset *ds);
/* The fingerprint's foreground intensity statistics (tessera convert since
 * the fingerprint; NULL for datasets written before it or without any
 * foreground voxel). */
const ts_fg_intensity *ts_dataset_fg_intensity(const ts_dataset *ds);
/* Local. Index entry of sample i (0 <= i < count); pointers stay valid until close. */
int ts_dataset_info(const ts_dataset *ds, int64_t i, ts_sample_info *out);
/* Collective on the dataset's communicator with the MPI-IO driver (HDF5's
 * metadata reads are collective there; local with POSIX). The voxel size
 * (mm along D, H, W) of sample i as stored: its group's `spacing`. Errors name the file and sample:
 * out of range, a group or attribute missing or not 3 positive values. */
int ts_dataset_spacing(ts_dataset *ds, int64_t i, double spacing[3]);

/* Local (independent I/O). Reads the box [lo, lo+size) (D, H, W voxels) of
 * sample i into image [C, size0, size1, size2] float32 and label [size0,
 * size1, size2] uint8 (either may be NULL). The box may extend past the
 * volume: voxels outside get image_pad and label 0. Checksums are verified;
 * a corrupt chunk is TS_ERR_FORMAT naming the chunk, dataset and file.
 * Not thread-safe on one ds (one thread at a time); HDF5 calls take the
 * process-wide HDF5 lock. */
int ts_dataset_read_box(ts_dataset *ds, int64_t i, const int64_t lo[3], const int64_t size[3], float *image,
                        uint8_t *label, float image_pad);
/* Local. The whole sample: image [C, D, H, W], label [D, H, W]. */
int ts_dataset_read_sample(ts_dataset *ds, int64_t i, float *image, uint8_t *label);
/* Collective on the dataset's communicator: every rank reads its own box of
 * the same sample i with collective MPI-IO (spatial decomposition: ranks
 * read slabs of one volume together). A rank may pass a zero-size box. */
int ts_dataset_read_box_all(ts_dataset *ds, int64_t i, const int64_t lo[3], const int64_t size[3], float *image,
                            uint8_t *label, float image_pad);
/* Local. Foreground coordinate k (0 <= k < nfg) of sample i as (d, h, w). */
int ts_dataset_read_foreground(ts_dataset *ds, int64_t i, int64_t k, int64_t coord[3]);

/* Local. Bytes read from files by this ds so far (raw chunks and hyperslabs). */
uint64_t ts_dataset_bytes_read(const ts_dataset *ds);

#endif
