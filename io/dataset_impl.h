/* Private to io/dataset.c and io/dataset_read.c: the reader's state (struct
 * ts_dataset) and the sample handles both sides touch. dataset.c opens and
 * closes; dataset_read.c opens sample datasets lazily and reads boxes. Not
 * installed; nothing outside these two files includes it. */
#ifndef TS_IO_DATASET_IMPL_H
#define TS_IO_DATASET_IMPL_H

#include <stdint.h>

#include "io/dataset.h"
#include "io/h5.h"

#define TS_DS_MAX_OPEN 256 /* sample dataset handles kept open per rank */

/* one row of /index, as read (the file's compound type, dataset.c) */
typedef struct ts_ds_row {
    char name[TS_IO_NAME_MAX];
    int32_t shard;
    int64_t shape[4];
    int64_t foreground;
} ts_ds_row;

/* an open image or label dataset and how its chunks are read */
typedef struct ts_ds_vol {
    hid_t d;
    int fast;            /* 1: Fletcher-32 is the only filter; 2: no filter; 0: H5Dread */
    int rank;
    hsize_t chunk[4];
} ts_ds_vol;

/* a sample's open handles (-1: closed) and when it was last used */
typedef struct ts_ds_sample {
    ts_ds_vol v[2];      /* image, label */
    hid_t fg;
    uint64_t used;
} ts_ds_sample;

/* one verified chunk in the LRU chunk cache (dataset_read.c) */
typedef struct ts_ds_chunk {
    int64_t sample;
    int kind;
    hsize_t off[4];
    uint8_t *data;
    size_t bytes;
    uint64_t used;
} ts_ds_chunk;

/* the reader (io/dataset.h): opened and closed by dataset.c, read by dataset_read.c */
struct ts_dataset {
    MPI_Comm comm;
    int rank, size;
    char path[TS_IO_PATH_MAX];
    ts_dataset_opts o;
    int nfiles;
    hid_t main, *files;
    char **fnames;
    hid_t dapl, dxpl_ind, dxpl_coll;
    int64_t n;
    int C, K;
    int ncn, nchn;
    char **class_names, **channel_names;
    double mean[TS_IO_MAX_CHANNELS], std[TS_IO_MAX_CHANNELS];
    ts_ds_row *rows;
    double *smean, *sstd, *spct;
    double *sfgmean, *sfgstd; /* NULL: a dataset written before the foreground statistics */
    ts_fg_intensity fi;       /* the fingerprint's foreground intensities (have_fi: present) */
    int have_fi;
    int64_t *scls;
    ts_ds_sample *h;
    int nopen;
    uint64_t tick;
    ts_ds_chunk *cache;
    int ncache, cache_cap_ent;
    size_t cache_bytes, cache_used;
    uint8_t *scratch;
    size_t scratch_cap;
    uint64_t bytes;
};

/* Local; takes the HDF5 lock. Opens sample i's image and label datasets and
 * checks their type, shape and layout, and the shape of its foreground
 * coordinates; the image and label handles stay open (at most
 * TS_DS_MAX_OPEN samples' handles, the least recently used closed first).
 * Errors: TS_ERR_FORMAT for a missing or malformed dataset, HDF5's. */
int ts_ds_check_sample(ts_dataset *ds, int64_t i);

/* Local; the HDF5 lock held by the caller. Closes sample i's open handles
 * (if any) and counts them off ds->nopen. */
void ts_ds_close_handles(ts_dataset *ds, int64_t i);

#endif
