/* Dataset reader; see dataset.h and docs/formats-dataset.md. The file (and
 * its shards) are opened collectively with the MPI-IO driver and collective
 * metadata reads; the index and statistics are read collectively; sample
 * datasets are opened lazily with independent metadata access and read
 * independently. Chunks filtered by Fletcher-32 alone are fetched raw with
 * H5Dread_chunk, verified here and copied into the box; a small LRU of
 * verified chunks serves overlapping boxes. */
#include "tsbuild.h"
#include "io/dataset.h"
#include "io/fingerprint.h"
#include "io/h5.h"
#include "src/core/path.h"

#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OPEN 256 /* sample dataset handles kept open per rank */

typedef struct {
    char name[TS_IO_NAME_MAX];
    int32_t shard;
    int64_t shape[4];
    int64_t foreground;
} idx_row;

typedef struct {
    hid_t d;
    int fast;            /* 1: Fletcher-32 is the only filter; 2: no filter; 0: H5Dread */
    int rank;
    hsize_t chunk[4];
} vol_h;

typedef struct {
    vol_h v[2];          /* image, label */
    hid_t fg;
    uint64_t used;
} sample_h;

typedef struct {
    int64_t sample;
    int kind;
    hsize_t off[4];
    uint8_t *data;
    size_t bytes;
    uint64_t used;
} cache_ent;

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
    idx_row *rows;
    double *smean, *sstd, *spct;
    double *sfgmean, *sfgstd; /* NULL: a dataset written before the foreground statistics */
    ts_fg_intensity fi;       /* the fingerprint's foreground intensities (have_fi: present) */
    int have_fi;
    int64_t *scls;
    sample_h *h;
    int nopen;
    uint64_t tick;
    cache_ent *cache;
    int ncache, cache_cap_ent;
    size_t cache_bytes, cache_used;
    uint8_t *scratch;
    size_t scratch_cap;
    uint64_t bytes;
};

static const char *kind_name(int kind) { return kind ? "label" : "image"; }

/* ---------------- opening ---------------- */

static int read_table(ts_dataset *ds, hid_t f, const char *fname, const char *name, hid_t mtype, int rank,
                      const hsize_t *dims, void *buf)
{
    int err = 0;
    hid_t d = -1, sp = -1;
    ts_h5_lock();
    htri_t ex = H5Lexists(f, name, H5P_DEFAULT);
    if (ex <= 0) {
        H5Eclear2(H5E_DEFAULT);
        TS_FAIL(TS_ERR_FORMAT, "%s: dataset %s is missing", fname, name);
    }
    TS_H5M(d = H5Dopen2(f, name, H5P_DEFAULT), "%s: cannot open %s", fname, name);
    TS_H5M(sp = H5Dget_space(d), "%s: %s", fname, name);
    int r = H5Sget_simple_extent_ndims(sp);
    hsize_t got[8] = {0};
    if (r != rank) TS_FAIL(TS_ERR_FORMAT, "%s: %s has %d dimensions, expected %d", fname, name, r, rank);
    H5Sget_simple_extent_dims(sp, got, NULL);
    for (int k = 0; k < rank; k++)
        if (got[k] != dims[k])
            TS_FAIL(TS_ERR_FORMAT, "%s: %s has extent %llu in dimension %d, expected %llu", fname, name,
                    (unsigned long long)got[k], k, (unsigned long long)dims[k]);
    TS_H5M(H5Dread(d, mtype, H5S_ALL, H5S_ALL, ds->dxpl_coll, buf), "%s: cannot read %s", fname, name);
cleanup:
    if (sp >= 0) H5Sclose(sp);
    if (d >= 0) H5Dclose(d);
    ts_h5_unlock();
    return err;
}

static hid_t index_mtype(void)
{
    hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(idx_row)), s = H5Tcopy(H5T_C_S1), a = -1;
    hsize_t four = 4;
    H5Tset_size(s, TS_IO_NAME_MAX);
    H5Tset_strpad(s, H5T_STR_NULLTERM);
    a = H5Tarray_create2(H5T_NATIVE_INT64, 1, &four);
    H5Tinsert(t, "name", HOFFSET(idx_row, name), s);
    H5Tinsert(t, "shard", HOFFSET(idx_row, shard), H5T_NATIVE_INT32);
    H5Tinsert(t, "shape", HOFFSET(idx_row, shape), a);
    H5Tinsert(t, "foreground", HOFFSET(idx_row, foreground), H5T_NATIVE_INT64);
    H5Tclose(s);
    H5Tclose(a);
    return t;
}

/* Opens one file of the dataset (collective with MPI-IO); on failure
 * records the error (with HDF5's stack, taken before any other HDF5 call)
 * and returns a negative id. HDF5 lock held by the caller. */
static hid_t open_file(ts_dataset *ds, const char *name, const char *what)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), f = -1;
    if (fapl < 0) {
        ts_h5_err(__FILE__, __LINE__, "file access properties");
        return -1;
    }
    if (ds->o.driver == TS_IO_DRIVER_MPIO &&
        (H5Pset_fapl_mpio(fapl, ds->comm, MPI_INFO_NULL) < 0 || H5Pset_all_coll_metadata_ops(fapl, 1) < 0)) {
        ts_h5_err(__FILE__, __LINE__, "MPI-IO file access for %s", name);
        H5Pclose(fapl);
        return -1;
    }
    f = H5Fopen(name, H5F_ACC_RDONLY, fapl);
    if (f < 0) {
        ts_h5_err(__FILE__, __LINE__, "cannot open %s %s", what, name);
        /* a clearer message for a missing file or one that is not HDF5 at all */
        FILE *t = fopen(name, "rb");
        if (!t) {
            TS_ERR(TS_ERR_IO, "cannot open %s %s: %s", what, name, strerror(errno));
        } else {
            char sig[8] = {0};
            size_t got = fread(sig, 1, 8, t);
            fclose(t);
            if (got < 8 || memcmp(sig, "\211HDF\r\n\032\n", 8))
                TS_ERR(TS_ERR_FORMAT, "%s is not an HDF5 file (no HDF5 signature at its start)", name);
        }
    }
    H5Pclose(fapl);
    return f;
}

/* checks one sample's datasets (dtype, shape, layout); local */
static int check_sample(ts_dataset *ds, int64_t i);
static void close_handles(ts_dataset *ds, int64_t i);

/* ts_dataset_open's steps, in order. Each is collective on ds->comm and
 * returns an error agreed on every rank, except where it says local. */

/* Local (the open is collective with MPI-IO). Property lists, the chunk
 * cache and the main file (the dataset or its manifest). */
static int open_main(ts_dataset *ds, const char *path)
{
    int lerr = 0;
    ts_h5_lock();
    ds->dapl = H5Pcreate(H5P_DATASET_ACCESS);
    ds->dxpl_ind = H5Pcreate(H5P_DATASET_XFER);
    ds->dxpl_coll = H5Pcreate(H5P_DATASET_XFER);
    if (ds->dapl < 0 || ds->dxpl_ind < 0 || ds->dxpl_coll < 0) lerr = ts_h5_err(__FILE__, __LINE__, "property lists");
    if (!lerr && ds->o.driver == TS_IO_DRIVER_MPIO &&
        (H5Pset_all_coll_metadata_ops(ds->dapl, 0) < 0 || H5Pset_dxpl_mpio(ds->dxpl_ind, H5FD_MPIO_INDEPENDENT) < 0 ||
         H5Pset_dxpl_mpio(ds->dxpl_coll, H5FD_MPIO_COLLECTIVE) < 0))
        lerr = ts_h5_err(__FILE__, __LINE__, "MPI-IO transfer properties");
    /* the chunk cache of the H5Dread path: about one box's chunks */
    size_t cb = ds->o.cache_bytes;
    if (!cb && ds->o.box_hint[0] > 0) {
        cb = 4;
        for (int k = 0; k < 3; k++) cb *= (size_t)(ds->o.box_hint[k] + 64);
    }
    ds->cache_bytes = cb;
    if (!lerr && H5Pset_chunk_cache(ds->dapl, 12421, cb ? cb : (1 << 20), 1.0) < 0)
        lerr = ts_h5_err(__FILE__, __LINE__, "chunk cache");
    if (!lerr) {
        ds->main = open_file(ds, path, "dataset");
        if (ds->main < 0) lerr = ts_err_last();
    }
    ts_h5_unlock();
    return lerr;
}

/* Local, but every rank makes the same HDF5 calls (collective metadata
 * reads). The root attributes: format and version, counts, names,
 * statistics, shards (their file names into *shard_files). */
static int read_root(ts_dataset *ds, const char *path, int *nshard_files, char ***shard_files)
{
    int lerr = 0;
    char fmt[64] = "";
    int64_t v = 0;
    if (!ts_h5_attr_exists(ds->main, "format"))
        lerr = TS_ERR(TS_ERR_FORMAT, "%s is not a tessera dataset (no root attribute 'format')", path);
    if (!lerr) lerr = ts_h5_read_attr_str(ds->main, "format", fmt, sizeof fmt, path);
    if (!lerr && !strcmp(fmt, TS_IO_FORMAT "-shard"))
        lerr = TS_ERR(TS_ERR_ARG, "%s is one shard of a dataset: open its manifest instead", path);
    if (!lerr && strcmp(fmt, TS_IO_FORMAT))
        lerr = TS_ERR(TS_ERR_FORMAT, "%s: format is '%s', expected '%s'", path, fmt, TS_IO_FORMAT);
    if (!lerr) lerr = ts_h5_read_attr_i64(ds->main, "format_version", 1, &v, path);
    if (!lerr && (v < 1 || v > TS_IO_FORMAT_VERSION))
        lerr = TS_ERR(TS_ERR_FORMAT, "%s: format_version %lld is not supported (this tessera reads 1..%d)", path,
                      (long long)v, TS_IO_FORMAT_VERSION);
    if (!lerr) lerr = ts_h5_read_attr_i64(ds->main, "num_samples", 1, &ds->n, path);
    if (!lerr && ds->n < 1) lerr = TS_ERR(TS_ERR_FORMAT, "%s: num_samples is %lld", path, (long long)ds->n);
    if (!lerr) lerr = ts_h5_read_attr_i64(ds->main, "channels", 1, &v, path);
    if (!lerr && (v < 1 || v > TS_IO_MAX_CHANNELS))
        lerr = TS_ERR(TS_ERR_FORMAT, "%s: channels is %lld (1..%d)", path, (long long)v, TS_IO_MAX_CHANNELS);
    ds->C = (int)v;
    if (!lerr) lerr = ts_h5_read_attr_i64(ds->main, "classes", 1, &v, path);
    if (!lerr && (v < 1 || v > TS_IO_MAX_CLASSES))
        lerr = TS_ERR(TS_ERR_FORMAT, "%s: classes is %lld (1..%d)", path, (long long)v, TS_IO_MAX_CLASSES);
    ds->K = (int)v;
    if (!lerr) lerr = ts_h5_read_attr_strs(ds->main, "class_names", &ds->ncn, &ds->class_names, path);
    if (!lerr && ds->ncn != ds->K)
        lerr = TS_ERR(TS_ERR_FORMAT, "%s: %d class_names for %d classes", path, ds->ncn, ds->K);
    if (!lerr) lerr = ts_h5_read_attr_strs(ds->main, "channel_names", &ds->nchn, &ds->channel_names, path);
    if (!lerr && ds->nchn != ds->C)
        lerr = TS_ERR(TS_ERR_FORMAT, "%s: %d channel_names for %d channels", path, ds->nchn, ds->C);
    if (!lerr) lerr = ts_h5_read_attr_f64(ds->main, "mean", ds->C, ds->mean, path);
    if (!lerr) lerr = ts_h5_read_attr_f64(ds->main, "std", ds->C, ds->std, path);
    if (!lerr) lerr = ts_h5_read_attr_i64(ds->main, "shards", 1, &v, path);
    if (!lerr && (v < 1 || v > ds->n))
        lerr = TS_ERR(TS_ERR_FORMAT, "%s: shards is %lld for %lld samples", path, (long long)v, (long long)ds->n);
    ds->nfiles = (int)v;
    if (!lerr && ds->nfiles > 1) {
        lerr = ts_h5_read_attr_strs(ds->main, "shard_files", nshard_files, shard_files, path);
        if (!lerr && *nshard_files != ds->nfiles)
            lerr = TS_ERR(TS_ERR_FORMAT, "%s: %d shard_files for %d shards", path, *nshard_files, ds->nfiles);
    }
    return lerr;
}

/* The index and the per-sample statistics: small tables read collectively,
 * then checked. */
static int read_index(ts_dataset *ds, const char *path)
{
    int err = 0, lerr = 0;
    hid_t mt = -1;
    /* the index must hold num_samples rows before tables of that size are
     * allocated (a wrong count is an error, not a huge allocation) */
    {
        hsize_t rows = 0;
        int nd = -1;
        ts_h5_lock();
        if (H5Lexists(ds->main, "/index", H5P_DEFAULT) > 0) {
            hid_t d = H5Dopen2(ds->main, "/index", H5P_DEFAULT), sp = d >= 0 ? H5Dget_space(d) : -1;
            nd = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
            if (nd == 1) H5Sget_simple_extent_dims(sp, &rows, NULL);
            if (sp >= 0) H5Sclose(sp);
            if (d >= 0) H5Dclose(d);
        }
        H5Eclear2(H5E_DEFAULT);
        ts_h5_unlock();
        if (nd != 1)
            lerr = TS_ERR(TS_ERR_FORMAT, "%s: dataset /index is missing or not one-dimensional", path);
        else if ((int64_t)rows != ds->n || ds->n > TS_IO_SAMPLES_MAX)
            lerr = TS_ERR(TS_ERR_FORMAT, "%s: num_samples is %lld but /index has %llu rows (at most %lld samples)", path,
                          (long long)ds->n, (unsigned long long)rows, (long long)TS_IO_SAMPLES_MAX);
    }
    TS_CHECK(ts_err_agree(ds->comm, lerr));
    size_t n = (size_t)ds->n, C = (size_t)ds->C, K = (size_t)ds->K;
    ds->rows = TS_CALLOC(n, sizeof *ds->rows);
    ds->smean = TS_CALLOC(n * C, sizeof(double));
    ds->sstd = TS_CALLOC(n * C, sizeof(double));
    ds->spct = TS_CALLOC(n * C * TS_IO_NPCT, sizeof(double));
    ds->scls = TS_CALLOC(n * K, sizeof(int64_t));
    ds->h = TS_CALLOC(n, sizeof *ds->h);
    if (!ds->rows || !ds->smean || !ds->sstd || !ds->spct || !ds->scls || !ds->h)
        lerr = TS_ERR(TS_ERR_NOMEM, "%s: index of %lld samples", path, (long long)ds->n);
    TS_CHECK(ts_err_agree(ds->comm, lerr)); /* the reads below are collective */
    for (size_t i = 0; i < n; i++) {
        ds->h[i].v[0].d = ds->h[i].v[1].d = ds->h[i].fg = -1;
    }
    hsize_t d1 = n, dc[2] = {n, C}, dp[3] = {n, C, TS_IO_NPCT}, dk[2] = {n, K};
    ts_h5_lock();
    mt = index_mtype();
    ts_h5_unlock();
    lerr = read_table(ds, ds->main, path, "/index", mt, 1, &d1, ds->rows);
    if (!lerr) lerr = read_table(ds, ds->main, path, "/stats/mean", H5T_NATIVE_DOUBLE, 2, dc, ds->smean);
    if (!lerr) lerr = read_table(ds, ds->main, path, "/stats/std", H5T_NATIVE_DOUBLE, 2, dc, ds->sstd);
    if (!lerr) lerr = read_table(ds, ds->main, path, "/stats/percentiles", H5T_NATIVE_DOUBLE, 3, dp, ds->spct);
    if (!lerr) lerr = read_table(ds, ds->main, path, "/stats/class_voxels", H5T_NATIVE_INT64, 2, dk, ds->scls);
    /* optional (added after format_version 1 without changing it): every
     * rank sees the same file, so all make the same collective reads */
    if (!lerr) {
        ts_h5_lock();
        htri_t ex = H5Lexists(ds->main, "/stats/fg_mean", H5P_DEFAULT);
        if (ex <= 0) H5Eclear2(H5E_DEFAULT);
        ts_h5_unlock();
        if (ex > 0) {
            ds->sfgmean = TS_CALLOC(n * C, sizeof(double));
            ds->sfgstd = TS_CALLOC(n * C, sizeof(double));
            if (!ds->sfgmean || !ds->sfgstd) lerr = TS_ERR(TS_ERR_NOMEM, "%s: foreground statistics", path);
            if (!lerr) lerr = read_table(ds, ds->main, path, "/stats/fg_mean", H5T_NATIVE_DOUBLE, 2, dc, ds->sfgmean);
            if (!lerr) lerr = read_table(ds, ds->main, path, "/stats/fg_std", H5T_NATIVE_DOUBLE, 2, dc, ds->sfgstd);
        }
    }
    if (!lerr) lerr = ts_fp_read_intensity(ds->main, path, ds->C, &ds->fi, &ds->have_fi);
    for (size_t i = 0; i < n && !lerr; i++) {
        idx_row *r = &ds->rows[i];
        r->name[TS_IO_NAME_MAX - 1] = '\0';
        if (r->shard < 0 || r->shard >= ds->nfiles)
            lerr = TS_ERR(TS_ERR_FORMAT, "%s: /index[%zu] names shard %d of %d", path, i, r->shard, ds->nfiles);
        else if (r->shape[0] != ds->C || r->shape[1] < 1 || r->shape[2] < 1 || r->shape[3] < 1 ||
                 r->shape[1] > TS_IO_EDGE_MAX || r->shape[2] > TS_IO_EDGE_MAX || r->shape[3] > TS_IO_EDGE_MAX ||
                 (double)r->shape[0] * (double)r->shape[1] * (double)r->shape[2] * (double)r->shape[3] >
                     (double)TS_IO_VOXELS_MAX)
            lerr = TS_ERR(TS_ERR_FORMAT, "%s: /index[%zu] has shape [%lld, %lld, %lld, %lld] (channels %d; edges "
                          "1..%lld, at most %lld voxels)", path, i, (long long)r->shape[0], (long long)r->shape[1],
                          (long long)r->shape[2], (long long)r->shape[3], ds->C, (long long)TS_IO_EDGE_MAX,
                          (long long)TS_IO_VOXELS_MAX);
        else if (r->foreground < 0 || r->foreground > r->shape[1] * r->shape[2] * r->shape[3])
            lerr = TS_ERR(TS_ERR_FORMAT, "%s: /index[%zu] has %lld foreground coordinates", path, i,
                          (long long)r->foreground);
    }
    TS_CHECK(ts_err_agree(ds->comm, lerr));
cleanup:
    if (mt >= 0) {
        ts_h5_lock();
        H5Tclose(mt);
        ts_h5_unlock();
    }
    return err;
}

/* The files holding the samples: the dataset itself, or the shards named
 * by the manifest (plain names next to it), each checked to be the shard
 * the manifest expects there. */
static int open_shards(ts_dataset *ds, const char *path, char **shard_files)
{
    int err = 0, lerr = 0;
    char fmt[64] = "";
    ds->files = TS_CALLOC((size_t)ds->nfiles, sizeof(hid_t));
    ds->fnames = TS_CALLOC((size_t)ds->nfiles, sizeof(char *));
    if (!ds->files || !ds->fnames) lerr = TS_ERR(TS_ERR_NOMEM, "dataset files");
    TS_CHECK(ts_err_agree(ds->comm, lerr));
    for (int s = 0; s < ds->nfiles; s++) ds->files[s] = -1;
    if (ds->nfiles == 1) {
        ds->files[0] = ds->main;
        ds->fnames[0] = strdup(path);
        if (!ds->fnames[0]) lerr = TS_ERR(TS_ERR_NOMEM, "dataset files");
        TS_CHECK(ts_err_agree(ds->comm, lerr));
    } else {
        char *tmp = strdup(path);
        if (!tmp) lerr = TS_ERR(TS_ERR_NOMEM, "dataset files");
        TS_CHECK(ts_err_agree(ds->comm, lerr));
        const char *dir = dirname(tmp);
        for (int s = 0; s < ds->nfiles && !lerr; s++) {
            size_t len = strlen(dir) + strlen(shard_files[s]) + 2;
            ds->fnames[s] = malloc(len);
            if (!ds->fnames[s]) {
                lerr = TS_ERR_NOMEM;
                break;
            }
            if (shard_files[s][0] == '/' || strchr(shard_files[s], '/'))
                lerr = TS_ERR(TS_ERR_FORMAT, "%s: shard file name '%s' must be a plain name next to the manifest",
                              path, shard_files[s]);
            snprintf(ds->fnames[s], len, "%s/%s", dir, shard_files[s]);
        }
        free(tmp);
        TS_CHECK(ts_err_agree(ds->comm, lerr));
        for (int s = 0; s < ds->nfiles; s++) {
            ts_h5_lock();
            ds->files[s] = open_file(ds, ds->fnames[s], "shard");
            if (ds->files[s] < 0) lerr = ts_err_last();
            ts_h5_unlock();
            TS_CHECK(ts_err_agree(ds->comm, lerr));
            int64_t v = -1;
            lerr = ts_h5_read_attr_str(ds->files[s], "format", fmt, sizeof fmt, ds->fnames[s]);
            if (!lerr && strcmp(fmt, TS_IO_FORMAT "-shard"))
                lerr = TS_ERR(TS_ERR_FORMAT, "%s: format is '%s', expected a shard of %s", ds->fnames[s], fmt, path);
            if (!lerr) lerr = ts_h5_read_attr_i64(ds->files[s], "shard", 1, &v, ds->fnames[s]);
            if (!lerr && v != s)
                lerr = TS_ERR(TS_ERR_FORMAT, "%s: holds shard %lld, the manifest %s expects shard %d there",
                              ds->fnames[s], (long long)v, path, s);
            TS_CHECK(ts_err_agree(ds->comm, lerr));
        }
    }
cleanup:
    return err;
}

/* Every sample's datasets, spread over the ranks (ds->o.check). */
static int check_samples(ts_dataset *ds)
{
    int err = 0, lerr = 0;
    for (int64_t i = ds->rank; i < ds->n && !lerr; i += ds->size) {
        lerr = check_sample(ds, i);
        /* keep the handles of the first samples checked, up to half the limit */
        if (ds->nopen > MAX_OPEN / 2) {
            ts_h5_lock();
            close_handles(ds, i);
            ts_h5_unlock();
        }
    }
    TS_CHECK(ts_err_agree(ds->comm, lerr));
cleanup:
    return err;
}

int ts_dataset_open(MPI_Comm comm, const char *path, const ts_dataset_opts *opts, ts_dataset **out)
{
    int err = 0;
    ts_dataset *ds = NULL;
    char **shard_files = NULL;
    int nshard_files = 0;
    *out = NULL;
    ts_h5_init();
    ds = TS_CALLOC(1, sizeof *ds);
    if (!ds) return TS_ERR_NOMEM;
    ds->comm = MPI_COMM_NULL;
    ds->main = ds->dapl = ds->dxpl_ind = ds->dxpl_coll = -1;
    TS_MPI(MPI_Comm_dup(comm, &ds->comm));
    MPI_Comm_rank(ds->comm, &ds->rank);
    MPI_Comm_size(ds->comm, &ds->size);
    if (opts) ds->o = *opts;
    else ds->o.check = 1;
    TS_CHECK(ts_path_check(path, sizeof ds->path, "the dataset path (data.path)"));
    snprintf(ds->path, sizeof ds->path, "%s", path);
    TS_CHECK(ts_err_agree(ds->comm, open_main(ds, path)));
    TS_CHECK(ts_err_agree(ds->comm, read_root(ds, path, &nshard_files, &shard_files)));
    TS_CHECK(read_index(ds, path));
    TS_CHECK(open_shards(ds, path, shard_files));
    if (ds->o.check) TS_CHECK(check_samples(ds));
    *out = ds;
    ds = NULL;
cleanup:
    ts_h5_free_strs(nshard_files, shard_files);
    if (ds) ts_dataset_close(&ds);
    return err;
}

static void close_handles(ts_dataset *ds, int64_t i)
{
    sample_h *h = &ds->h[i];
    int was = h->v[0].d >= 0 || h->v[1].d >= 0 || h->fg >= 0;
    for (int k = 0; k < 2; k++)
        if (h->v[k].d >= 0) {
            H5Dclose(h->v[k].d);
            h->v[k].d = -1;
        }
    if (h->fg >= 0) {
        H5Dclose(h->fg);
        h->fg = -1;
    }
    if (was) ds->nopen--;
}

void ts_dataset_close(ts_dataset **dsp)
{
    if (!dsp || !*dsp) return;
    ts_dataset *ds = *dsp;
    ts_h5_lock();
    if (ds->h)
        for (int64_t i = 0; i < ds->n; i++) close_handles(ds, i);
    for (int s = 0; ds->files && s < ds->nfiles; s++)
        if (ds->files[s] >= 0 && ds->files[s] != ds->main) H5Fclose(ds->files[s]);
    if (ds->main >= 0) H5Fclose(ds->main);
    if (ds->dapl >= 0) H5Pclose(ds->dapl);
    if (ds->dxpl_ind >= 0) H5Pclose(ds->dxpl_ind);
    if (ds->dxpl_coll >= 0) H5Pclose(ds->dxpl_coll);
    ts_h5_unlock();
    for (int s = 0; ds->fnames && s < ds->nfiles; s++) free(ds->fnames[s]);
    for (int c = 0; c < ds->ncache; c++) free(ds->cache[c].data);
    free(ds->cache);
    free(ds->fnames);
    free(ds->files);
    ts_h5_free_strs(ds->ncn, ds->class_names);
    ts_h5_free_strs(ds->nchn, ds->channel_names);
    free(ds->rows);
    free(ds->smean);
    free(ds->sstd);
    free(ds->sfgmean);
    free(ds->sfgstd);
    free(ds->spct);
    free(ds->scls);
    free(ds->h);
    free(ds->scratch);
    if (ds->comm != MPI_COMM_NULL) MPI_Comm_free(&ds->comm);
    free(ds);
    *dsp = NULL;
}

/* ---------------- accessors ---------------- */

int64_t ts_dataset_count(const ts_dataset *ds) { return ds->n; }
int ts_dataset_channels(const ts_dataset *ds) { return ds->C; }
int ts_dataset_classes(const ts_dataset *ds) { return ds->K; }
const char *ts_dataset_class_name(const ts_dataset *ds, int k) { return k >= 0 && k < ds->K ? ds->class_names[k] : ""; }
const char *ts_dataset_channel_name(const ts_dataset *ds, int c)
{
    return c >= 0 && c < ds->C ? ds->channel_names[c] : "";
}
const char *ts_dataset_path(const ts_dataset *ds) { return ds->path; }
const double *ts_dataset_mean(const ts_dataset *ds) { return ds->mean; }
const double *ts_dataset_std(const ts_dataset *ds) { return ds->std; }
int ts_dataset_has_fg_stats(const ts_dataset *ds) { return ds->sfgmean != NULL; }
const ts_fg_intensity *ts_dataset_fg_intensity(const ts_dataset *ds) { return ds->have_fi ? &ds->fi : NULL; }
uint64_t ts_dataset_bytes_read(const ts_dataset *ds) { return ds->bytes; }

int ts_dataset_spacing(ts_dataset *ds, int64_t i, double spacing[3])
{
    if (i < 0 || i >= ds->n)
        return TS_ERR(TS_ERR_ARG, "%s: sample %lld out of range (0..%lld)", ds->path, (long long)i,
                      (long long)ds->n - 1);
    const idx_row *r = &ds->rows[i];
    const char *fname = ds->fnames[r->shard];
    char gn[48], where[TS_IO_PATH_MAX + 64];
    snprintf(gn, sizeof gn, "/samples/%06lld", (long long)i);
    snprintf(where, sizeof where, "%s: %s (sample '%s')", fname, gn, r->name);
    ts_h5_lock();
    htri_t ex = H5Lexists(ds->files[r->shard], "/samples", H5P_DEFAULT);
    if (ex > 0) ex = H5Lexists(ds->files[r->shard], gn, H5P_DEFAULT);
    hid_t g = ex > 0 ? H5Gopen2(ds->files[r->shard], gn, H5P_DEFAULT) : -1;
    if (g < 0) H5Eclear2(H5E_DEFAULT);
    ts_h5_unlock();
    if (g < 0) return TS_ERR(TS_ERR_FORMAT, "%s is missing", where);
    int err = ts_h5_read_attr_f64(g, "spacing", 3, spacing, where);
    ts_h5_lock();
    H5Gclose(g);
    ts_h5_unlock();
    for (int d = 0; d < 3 && !err; d++)
        if (!(spacing[d] > 0) || !isfinite(spacing[d]))
            err = TS_ERR(TS_ERR_FORMAT, "%s: spacing[%d] is %g, not a positive voxel size", where, d, spacing[d]);
    return err;
}

int ts_dataset_info(const ts_dataset *ds, int64_t i, ts_sample_info *o)
{
    if (i < 0 || i >= ds->n)
        return TS_ERR(TS_ERR_ARG, "%s: sample %lld out of range (0..%lld)", ds->path, (long long)i,
                      (long long)ds->n - 1);
    const idx_row *r = &ds->rows[i];
    o->name = r->name;
    memcpy(o->shape, r->shape, sizeof o->shape);
    o->shard = r->shard;
    o->nfg = r->foreground;
    o->mean = ds->smean + i * ds->C;
    o->std = ds->sstd + i * ds->C;
    o->pct = ds->spct + i * ds->C * TS_IO_NPCT;
    o->fg_mean = ds->sfgmean ? ds->sfgmean + i * ds->C : NULL;
    o->fg_std = ds->sfgstd ? ds->sfgstd + i * ds->C : NULL;
    o->class_voxels = ds->scls + i * ds->K;
    return 0;
}

/* ---------------- sample handles ---------------- */

static void evict_one(ts_dataset *ds)
{
    int64_t best = -1;
    uint64_t t = UINT64_MAX;
    for (int64_t i = 0; i < ds->n; i++) {
        const sample_h *h = &ds->h[i];
        if ((h->v[0].d >= 0 || h->v[1].d >= 0 || h->fg >= 0) && h->used < t) {
            t = h->used;
            best = i;
        }
    }
    if (best >= 0) close_handles(ds, best);
}

/* Opens and checks the image and label datasets of sample i (HDF5 lock held). */
static int open_sample(ts_dataset *ds, int64_t i)
{
    int err = 0;
    sample_h *h = &ds->h[i];
    h->used = ++ds->tick;
    if (h->v[0].d >= 0 && h->v[1].d >= 0) return 0;
    if (ds->nopen >= MAX_OPEN) evict_one(ds);
    const idx_row *r = &ds->rows[i];
    const char *fname = ds->fnames[r->shard];
    hid_t f = ds->files[r->shard], t = -1, sp = -1, dcpl = -1;
    int was_open = h->v[0].d >= 0 || h->v[1].d >= 0 || h->fg >= 0;
    for (int k = 0; k < 2; k++) {
        if (h->v[k].d >= 0) continue;
        char dn[64];
        snprintf(dn, sizeof dn, "/samples/%06lld/%s", (long long)i, kind_name(k));
        htri_t ex = H5Lexists(f, "/samples", H5P_DEFAULT);
        if (ex > 0) {
            char gn[48];
            snprintf(gn, sizeof gn, "/samples/%06lld", (long long)i);
            ex = H5Lexists(f, gn, H5P_DEFAULT);
            if (ex > 0) ex = H5Lexists(f, dn, H5P_DEFAULT);
        }
        if (ex <= 0) {
            H5Eclear2(H5E_DEFAULT);
            TS_FAIL(TS_ERR_FORMAT, "%s: dataset %s (sample '%s') is missing", fname, dn, r->name);
        }
        vol_h *v = &h->v[k];
        TS_H5M(v->d = H5Dopen2(f, dn, ds->dapl), "%s: cannot open %s", fname, dn);
        if (!was_open) {
            ds->nopen++;
            was_open = 1;
        }
        TS_H5M(t = H5Dget_type(v->d), "%s: %s", fname, dn);
        if (k == 0) {
            if (H5Tget_class(t) != H5T_FLOAT || H5Tget_size(t) != 4)
                TS_FAIL(TS_ERR_FORMAT, "%s: %s must be float32 (it is %s, %zu bytes)", fname, dn,
                        H5Tget_class(t) == H5T_INTEGER ? "an integer type" : "not float", H5Tget_size(t));
        } else {
            if (H5Tget_class(t) != H5T_INTEGER || H5Tget_size(t) != 1 || H5Tget_sign(t) != H5T_SGN_NONE)
                TS_FAIL(TS_ERR_FORMAT, "%s: %s must be uint8 (it is %s, %zu bytes)", fname, dn,
                        H5Tget_class(t) == H5T_FLOAT ? "a float type" : "another type", H5Tget_size(t));
        }
        int native = H5Tequal(t, k ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT) > 0;
        H5Tclose(t);
        t = -1;
        TS_H5M(sp = H5Dget_space(v->d), "%s: %s", fname, dn);
        int rank = H5Sget_simple_extent_ndims(sp);
        hsize_t dims[8] = {0};
        int want = k ? 3 : 4;
        const int64_t *shape = k ? r->shape + 1 : r->shape;
        if (rank != want)
            TS_FAIL(TS_ERR_FORMAT, "%s: %s has %d dimensions, expected %d ([%s])", fname, dn, rank, want,
                    k ? "D, H, W" : "C, D, H, W");
        H5Sget_simple_extent_dims(sp, dims, NULL);
        for (int d = 0; d < rank; d++)
            if ((int64_t)dims[d] != shape[d])
                TS_FAIL(TS_ERR_FORMAT, "%s: %s has extent %llu in dimension %d, the index says %lld", fname, dn,
                        (unsigned long long)dims[d], d, (long long)shape[d]);
        H5Sclose(sp);
        sp = -1;
        v->rank = rank;
        v->fast = 0;
        TS_H5M(dcpl = H5Dget_create_plist(v->d), "%s: %s", fname, dn);
        if (H5Pget_layout(dcpl) == H5D_CHUNKED && native) {
            H5Pget_chunk(dcpl, rank, v->chunk);
            int nf = H5Pget_nfilters(dcpl);
            if (nf == 0) v->fast = 2;
            else if (nf == 1) {
                unsigned flags = 0, cd[8];
                size_t ncd = 8;
                char nm[64];
                H5Z_filter_t fid = H5Pget_filter2(dcpl, 0, &flags, &ncd, cd, sizeof nm, nm, NULL);
                if (fid == H5Z_FILTER_FLETCHER32) v->fast = 1;
            }
            if (rank == 4 && v->chunk[0] != 1) v->fast = 0;
        }
        H5Pclose(dcpl);
        dcpl = -1;
    }
cleanup:
    if (t >= 0) H5Tclose(t);
    if (sp >= 0) H5Sclose(sp);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (err) close_handles(ds, i); /* a sample that failed its checks is not kept open */
    return err;
}

static int check_sample(ts_dataset *ds, int64_t i)
{
    int err = 0;
    ts_h5_lock();
    err = open_sample(ds, i);
    if (!err && ds->rows[i].foreground > 0) {
        /* the foreground coordinates: int32 [nfg, 3] */
        const idx_row *r = &ds->rows[i];
        const char *fname = ds->fnames[r->shard];
        char dn[64];
        hid_t d = -1, sp = -1, t = -1;
        hsize_t dims[2] = {0, 0};
        snprintf(dn, sizeof dn, "/samples/%06lld/foreground", (long long)i);
        htri_t ex = H5Lexists(ds->files[r->shard], dn, H5P_DEFAULT);
        if (ex <= 0) {
            H5Eclear2(H5E_DEFAULT);
            err = TS_ERR(TS_ERR_FORMAT, "%s: dataset %s is missing", fname, dn);
        } else if ((d = H5Dopen2(ds->files[r->shard], dn, ds->dapl)) < 0) {
            err = ts_h5_err(__FILE__, __LINE__, "%s: cannot open %s", fname, dn);
        } else {
            sp = H5Dget_space(d);
            t = H5Dget_type(d);
            if (H5Sget_simple_extent_ndims(sp) != 2 || H5Sget_simple_extent_dims(sp, dims, NULL) < 0 ||
                (int64_t)dims[0] != r->foreground || dims[1] != 3 || H5Tget_class(t) != H5T_INTEGER)
                err = TS_ERR(TS_ERR_FORMAT, "%s: %s must be integer [%lld, 3]", fname, dn, (long long)r->foreground);
        }
        if (t >= 0) H5Tclose(t);
        if (sp >= 0) H5Sclose(sp);
        if (d >= 0) H5Dclose(d);
    }
    ts_h5_unlock();
    return err;
}

/* ---------------- reading ---------------- */

static int grow_scratch(ts_dataset *ds, size_t bytes)
{
    if (ds->scratch_cap >= bytes) return 0;
    free(ds->scratch);
    ds->scratch = TS_ALIGNED_ALLOC(bytes);
    ds->scratch_cap = ds->scratch ? bytes : 0;
    return ds->scratch ? 0 : TS_ERR_NOMEM;
}

/* Fetches one raw chunk of sample i's volume `kind` at logical offset off,
 * verifies its checksum, and returns a pointer to the decoded bytes (in the
 * cache when cacheable, else in the scratch buffer). */
static int get_chunk(ts_dataset *ds, int64_t i, int kind, const hsize_t *off, size_t cbytes, int cacheable,
                     const uint8_t **out)
{
    int err = 0;
    vol_h *v = &ds->h[i].v[kind];
    const char *fname = ds->fnames[ds->rows[i].shard];
    if (cacheable) {
        for (int c = 0; c < ds->ncache; c++) {
            cache_ent *e = &ds->cache[c];
            if (e->sample == i && e->kind == kind && !memcmp(e->off, off, sizeof e->off)) {
                e->used = ++ds->tick;
                *out = e->data;
                return 0;
            }
        }
    }
    size_t want = cbytes + (v->fast == 1 ? 4 : 0);
    hsize_t stored = 0;
    ts_h5_lock();
    herr_t r = H5Dget_chunk_storage_size(v->d, off, &stored);
    if (r < 0) err = ts_h5_err(__FILE__, __LINE__, "%s: /samples/%06lld/%s: cannot locate chunk at (%llu, %llu, %llu, %llu)",
                               fname, (long long)i, kind_name(kind), (unsigned long long)off[0],
                               (unsigned long long)off[1], (unsigned long long)off[2],
                               (unsigned long long)(v->rank == 4 ? off[3] : 0));
    ts_h5_unlock();
    if (err) return err;
    if (stored != want)
        return TS_ERR(TS_ERR_FORMAT, "%s: /samples/%06lld/%s: chunk at offset (%llu, %llu, %llu%s) holds %llu bytes, "
                      "expected %zu (file corrupt or truncated)", fname, (long long)i, kind_name(kind),
                      (unsigned long long)off[0], (unsigned long long)off[1], (unsigned long long)off[2],
                      v->rank == 4 ? ", ..." : "", (unsigned long long)stored, want);
    uint8_t *dst = NULL;
    cache_ent *slot = NULL;
    if (cacheable) {
        /* evict least recently used entries until the chunk fits */
        while (ds->ncache && ds->cache_used + want > ds->cache_bytes) {
            int lru = 0;
            for (int c = 1; c < ds->ncache; c++)
                if (ds->cache[c].used < ds->cache[lru].used) lru = c;
            ds->cache_used -= ds->cache[lru].bytes;
            free(ds->cache[lru].data);
            ds->cache[lru] = ds->cache[--ds->ncache];
        }
        if (ds->ncache == ds->cache_cap_ent) {
            int nc = ds->cache_cap_ent ? 2 * ds->cache_cap_ent : 16;
            cache_ent *ne = realloc(ds->cache, (size_t)nc * sizeof *ne);
            if (!ne) return TS_ERR(TS_ERR_NOMEM, "chunk cache");
            ds->cache = ne;
            ds->cache_cap_ent = nc;
        }
        slot = &ds->cache[ds->ncache];
        memset(slot, 0, sizeof *slot);
        slot->data = TS_ALIGNED_ALLOC(want);
        if (!slot->data) return TS_ERR_NOMEM;
        dst = slot->data;
    } else {
        TS_TRY(grow_scratch(ds, want));
        dst = ds->scratch;
    }
    uint32_t mask = 0;
    ts_h5_lock();
    r = H5Dread_chunk(v->d, ds->dxpl_ind, off, &mask, dst);
    if (r < 0) err = ts_h5_err(__FILE__, __LINE__, "%s: cannot read a chunk of /samples/%06lld/%s", fname, (long long)i,
                               kind_name(kind));
    ts_h5_unlock();
    if (!err && v->fast == 1) {
        if (mask & 1)
            err = TS_ERR(TS_ERR_FORMAT, "%s: /samples/%06lld/%s: a chunk was stored without its Fletcher-32 checksum",
                         fname, (long long)i, kind_name(kind));
        uint32_t stored_ck = (uint32_t)dst[cbytes] | (uint32_t)dst[cbytes + 1] << 8 | (uint32_t)dst[cbytes + 2] << 16 |
                             (uint32_t)dst[cbytes + 3] << 24;
        uint32_t ck = ts_h5_fletcher32(dst, cbytes);
        /* HDF5 also accepts the byte-reversed sum written by 1.6.0-1.6.2 */
        uint32_t rev = ((ck & 0xffu) << 24) | ((ck & 0xff00u) << 8) | ((ck >> 8) & 0xff00u) | (ck >> 24);
        if (!err && stored_ck != ck && stored_ck != rev)
            err = TS_ERR(TS_ERR_FORMAT, "%s: /samples/%06lld/%s: Fletcher-32 checksum mismatch in the chunk at "
                         "(%llu, %llu, %llu%s) (stored %08x, computed %08x): the file is corrupt", fname, (long long)i,
                         kind_name(kind), (unsigned long long)off[0], (unsigned long long)off[1],
                         (unsigned long long)off[2], v->rank == 4 ? ", ..." : "", stored_ck, ck);
    }
    if (err) {
        if (slot) free(slot->data);
        return err;
    }
    ds->bytes += want;
    if (slot) {
        slot->sample = i;
        slot->kind = kind;
        memcpy(slot->off, off, sizeof slot->off);
        slot->bytes = want;
        slot->used = ++ds->tick;
        ds->ncache++;
        ds->cache_used += want;
    }
    *out = dst;
    return 0;
}

/* Reads the part of box [lo, lo+sz) inside volume `kind` of sample i into
 * dst (layout [A, sz0, sz1, sz2], A = channels or 1); the rest is untouched.
 * a, b: the intersection. Collective when coll (H5Dread path only). */
static int read_volume(ts_dataset *ds, int64_t i, int kind, const int64_t *lo, const int64_t *sz, const int64_t *a,
                       const int64_t *b, void *dst, int coll, int empty)
{
    int err = 0;
    vol_h *v = &ds->h[i].v[kind];
    const idx_row *r = &ds->rows[i];
    const int64_t A = kind ? 1 : r->shape[0];
    const size_t es = kind ? 1 : 4;
    const char *fname = ds->fnames[r->shard];
    if (!coll && v->fast) {
        if (empty) return 0;
        const int64_t cz = (int64_t)v->chunk[v->rank - 3], cy = (int64_t)v->chunk[v->rank - 2],
                      cx = (int64_t)v->chunk[v->rank - 1];
        const size_t cbytes = (size_t)(cz * cy * cx) * es;
        /* a whole-volume read does not reuse chunks: skip the cache */
        int whole = 1;
        for (int k = 0; k < 3; k++) whole &= a[k] == 0 && b[k] == r->shape[k + 1];
        const int cacheable = ds->cache_bytes >= cbytes && !whole;
        uint8_t *out = dst;
        for (int64_t c = 0; c < A; c++)
            for (int64_t kz = a[0] / cz; kz * cz < b[0]; kz++)
                for (int64_t ky = a[1] / cy; ky * cy < b[1]; ky++)
                    for (int64_t kx = a[2] / cx; kx * cx < b[2]; kx++) {
                        hsize_t off[4];
                        int64_t o[3] = {kz * cz, ky * cy, kx * cx};
                        if (v->rank == 4) {
                            off[0] = (hsize_t)c;
                            off[1] = (hsize_t)o[0];
                            off[2] = (hsize_t)o[1];
                            off[3] = (hsize_t)o[2];
                        } else {
                            off[0] = (hsize_t)o[0];
                            off[1] = (hsize_t)o[1];
                            off[2] = (hsize_t)o[2];
                            off[3] = 0;
                        }
                        const uint8_t *ch = NULL;
                        TS_TRY(get_chunk(ds, i, kind, off, cbytes, cacheable, &ch));
                        int64_t z0 = o[0] > a[0] ? o[0] : a[0], z1 = o[0] + cz < b[0] ? o[0] + cz : b[0];
                        int64_t y0 = o[1] > a[1] ? o[1] : a[1], y1 = o[1] + cy < b[1] ? o[1] + cy : b[1];
                        int64_t x0 = o[2] > a[2] ? o[2] : a[2], x1 = o[2] + cx < b[2] ? o[2] + cx : b[2];
                        size_t run = (size_t)(x1 - x0) * es;
                        for (int64_t z = z0; z < z1; z++)
                            for (int64_t y = y0; y < y1; y++) {
                                size_t so = (size_t)(((z - o[0]) * cy + (y - o[1])) * cx + (x0 - o[2])) * es;
                                size_t dof =
                                    (size_t)(((c * sz[0] + (z - lo[0])) * sz[1] + (y - lo[1])) * sz[2] + (x0 - lo[2])) *
                                    es;
                                memcpy(out + dof, ch + so, run);
                            }
                    }
        return 0;
    }
    /* H5Dread path: hyperslab of the file into a hyperslab of the box */
    hid_t fs = -1, ms = -1;
    ts_h5_lock();
    TS_H5(fs = H5Dget_space(v->d));
    hsize_t mdims[4] = {(hsize_t)A, (hsize_t)sz[0], (hsize_t)sz[1], (hsize_t)sz[2]};
    for (int k = 0; k < 4; k++)
        if (!mdims[k]) mdims[k] = 1;
    TS_H5(ms = H5Screate_simple(4, mdims, NULL));
    if (empty) {
        TS_H5(H5Sselect_none(fs));
        TS_H5(H5Sselect_none(ms));
    } else {
        hsize_t fo[4], mo[4], cnt[4];
        fo[0] = 0;
        mo[0] = 0;
        cnt[0] = (hsize_t)A;
        for (int k = 0; k < 3; k++) {
            fo[k + 1] = (hsize_t)a[k];
            mo[k + 1] = (hsize_t)(a[k] - lo[k]);
            cnt[k + 1] = (hsize_t)(b[k] - a[k]);
        }
        TS_H5(H5Sselect_hyperslab(fs, H5S_SELECT_SET, kind ? fo + 1 : fo, NULL, kind ? cnt + 1 : cnt, NULL));
        TS_H5(H5Sselect_hyperslab(ms, H5S_SELECT_SET, mo, NULL, cnt, NULL));
        ds->bytes += (uint64_t)(cnt[0] * cnt[1] * cnt[2] * cnt[3]) * es;
    }
    TS_H5M(H5Dread(v->d, kind ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT, ms, fs, coll ? ds->dxpl_coll : ds->dxpl_ind, dst),
           "%s: cannot read /samples/%06lld/%s", fname, (long long)i, kind_name(kind));
cleanup:
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    ts_h5_unlock();
    return err;
}

static void fill_pad(float *image, uint8_t *label, int64_t C, const int64_t *sz, float pad)
{
    int64_t nv = sz[0] * sz[1] * sz[2];
    if (image)
        for (int64_t t = 0; t < C * nv; t++) image[t] = pad;
    if (label) memset(label, 0, (size_t)nv);
}

/* The voxels of the volume inside the box [a, b) (box origin lo, size sz)
 * must be finite: the loader pads with NaN and turns NaN into 0, so a NaN
 * stored in the file would otherwise vanish without a word. */
static int check_finite(const ts_dataset *ds, int64_t i, const int64_t *lo, const int64_t *sz, const int64_t *a,
                        const int64_t *b, const float *image)
{
    const idx_row *r = &ds->rows[i];
    int64_t bad = 0, at[4] = {0, 0, 0, 0};
    for (int64_t c = 0; c < r->shape[0]; c++)
        for (int64_t z = a[0]; z < b[0]; z++)
            for (int64_t y = a[1]; y < b[1]; y++) {
                const float *row = image + ((c * sz[0] + (z - lo[0])) * sz[1] + (y - lo[1])) * sz[2] - lo[2];
                for (int64_t x = a[2]; x < b[2]; x++)
                    if (!isfinite(row[x]) && !bad++) {
                        at[0] = c;
                        at[1] = z;
                        at[2] = y;
                        at[3] = x;
                    }
            }
    if (!bad) return 0;
    return TS_ERR(TS_ERR_NUMERIC, "%s: /samples/%06lld/image (sample '%s'): %lld non-finite voxel%s (NaN or Inf) in "
                  "the box read, the first at (c=%lld, d=%lld, h=%lld, w=%lld): a dataset's images must be finite "
                  "(tessera convert refuses them, or replaces them with --nan-to)", ds->fnames[r->shard], (long long)i,
                  r->name, (long long)bad, bad > 1 ? "s" : "", (long long)at[0], (long long)at[1], (long long)at[2],
                  (long long)at[3]);
}

static int read_box(ts_dataset *ds, int64_t i, const int64_t lo[3], const int64_t sz[3], float *image, uint8_t *label,
                    float pad, int coll)
{
    int err = 0;
    if (i < 0 || i >= ds->n)
        return TS_ERR(TS_ERR_ARG, "%s: sample %lld out of range (0..%lld)", ds->path, (long long)i,
                      (long long)ds->n - 1);
    const idx_row *r = &ds->rows[i];
    int64_t a[3], b[3];
    int inside = 1, empty = 0;
    for (int k = 0; k < 3; k++) {
        if (sz[k] < 0) return TS_ERR(TS_ERR_ARG, "box size %lld < 0", (long long)sz[k]);
        a[k] = lo[k] > 0 ? lo[k] : 0;
        b[k] = lo[k] + sz[k] < r->shape[k + 1] ? lo[k] + sz[k] : r->shape[k + 1];
        if (a[k] != lo[k] || b[k] != lo[k] + sz[k]) inside = 0;
        if (b[k] <= a[k]) empty = 1;
    }
    ts_h5_lock();
    err = open_sample(ds, i);
    ts_h5_unlock();
    if (err) return err;
    if (!inside && !empty) fill_pad(image, label, r->shape[0], sz, pad);
    if (empty) fill_pad(image, label, r->shape[0], sz, pad);
    if (image) TS_TRY(read_volume(ds, i, 0, lo, sz, a, b, image, coll, empty));
    if (image && !empty) TS_TRY(check_finite(ds, i, lo, sz, a, b, image));
    if (label) TS_TRY(read_volume(ds, i, 1, lo, sz, a, b, label, coll, empty));
    return 0;
}

int ts_dataset_read_box(ts_dataset *ds, int64_t i, const int64_t lo[3], const int64_t size[3], float *image,
                        uint8_t *label, float image_pad)
{
    return read_box(ds, i, lo, size, image, label, image_pad, 0);
}

int ts_dataset_read_sample(ts_dataset *ds, int64_t i, float *image, uint8_t *label)
{
    if (i < 0 || i >= ds->n)
        return TS_ERR(TS_ERR_ARG, "%s: sample %lld out of range (0..%lld)", ds->path, (long long)i,
                      (long long)ds->n - 1);
    int64_t lo[3] = {0, 0, 0};
    return read_box(ds, i, lo, ds->rows[i].shape + 1, image, label, 0.0f, 0);
}

int ts_dataset_read_box_all(ts_dataset *ds, int64_t i, const int64_t lo[3], const int64_t size[3], float *image,
                            uint8_t *label, float image_pad)
{
    int err = 0;
    int64_t mm[2] = {-i, i}, g[2];
    TS_MPI_TRY(MPI_Allreduce(mm, g, 2, MPI_INT64_T, MPI_MAX, ds->comm));
    if (-g[0] != g[1])
        return ts_err_agree(ds->comm, TS_ERR(TS_ERR_ARG, "read_box_all: ranks asked for different samples (%lld..%lld)",
                                              (long long)-g[0], (long long)g[1]));
    /* which volumes: every rank must make the same collective calls */
    int want[2] = {image != NULL, label != NULL}, all[2];
    TS_MPI_TRY(MPI_Allreduce(want, all, 2, MPI_INT, MPI_MAX, ds->comm));
    int lerr = 0;
    if (i < 0 || i >= ds->n)
        lerr = TS_ERR(TS_ERR_ARG, "%s: sample %lld out of range", ds->path, (long long)i);
    const idx_row *r = lerr ? NULL : &ds->rows[i];
    int64_t a[3] = {0}, b[3] = {0};
    int inside = 1, empty = 0;
    for (int k = 0; k < 3 && r; k++) {
        a[k] = lo[k] > 0 ? lo[k] : 0;
        b[k] = lo[k] + size[k] < r->shape[k + 1] ? lo[k] + size[k] : r->shape[k + 1];
        if (a[k] != lo[k] || b[k] != lo[k] + size[k]) inside = 0;
        if (b[k] <= a[k]) empty = 1;
    }
    if (!lerr) {
        ts_h5_lock();
        lerr = open_sample(ds, i);
        ts_h5_unlock();
    }
    TS_CHECK(ts_err_agree(ds->comm, lerr));
    if (!inside || empty) fill_pad(image, label, r->shape[0], size, image_pad);
    for (int k = 0; k < 2 && !lerr; k++)
        if (all[k]) {
            static float dummyf;
            static uint8_t dummyb;
            void *dst = k ? (void *)label : (void *)image;
            int e = empty || !dst;
            lerr = read_volume(ds, i, k, lo, size, a, b, dst ? dst : (k ? (void *)&dummyb : (void *)&dummyf), 1, e);
            if (!lerr && !k && !e) lerr = check_finite(ds, i, lo, size, a, b, image);
        }
    TS_CHECK(ts_err_agree(ds->comm, lerr));
cleanup:
    return err;
}

int ts_dataset_read_foreground(ts_dataset *ds, int64_t i, int64_t k, int64_t coord[3])
{
    int err = 0;
    if (i < 0 || i >= ds->n || k < 0 || k >= ds->rows[i].foreground)
        return TS_ERR(TS_ERR_ARG, "%s: foreground coordinate %lld of sample %lld out of range", ds->path,
                      (long long)k, (long long)i);
    const idx_row *r = &ds->rows[i];
    const char *fname = ds->fnames[r->shard];
    hid_t fs = -1, ms = -1;
    int32_t c3[3];
    ts_h5_lock();
    TS_CHECK(open_sample(ds, i));
    sample_h *h = &ds->h[i];
    if (h->fg < 0) {
        char dn[64];
        snprintf(dn, sizeof dn, "/samples/%06lld/foreground", (long long)i);
        TS_H5M(h->fg = H5Dopen2(ds->files[r->shard], dn, ds->dapl), "%s: cannot open %s", fname, dn);
    }
    hsize_t off[2] = {(hsize_t)k, 0}, cnt[2] = {1, 3}, three = 3;
    TS_H5(fs = H5Dget_space(h->fg));
    TS_H5(H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL));
    TS_H5(ms = H5Screate_simple(1, &three, NULL));
    TS_H5M(H5Dread(h->fg, H5T_NATIVE_INT32, ms, fs, ds->dxpl_ind, c3), "%s: cannot read /samples/%06lld/foreground",
           fname, (long long)i);
    for (int d = 0; d < 3; d++) {
        if (c3[d] < 0 || c3[d] >= r->shape[d + 1])
            TS_FAIL(TS_ERR_FORMAT, "%s: /samples/%06lld/foreground[%lld] = (%d, %d, %d) lies outside the volume", fname,
                    (long long)i, (long long)k, c3[0], c3[1], c3[2]);
        coord[d] = c3[d];
    }
cleanup:
    if (fs >= 0) H5Sclose(fs);
    if (ms >= 0) H5Sclose(ms);
    ts_h5_unlock();
    return err;
}
