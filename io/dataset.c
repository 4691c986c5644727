/* Dataset reader, opening side (see dataset.h, docs/formats-dataset.md):
 * ts_dataset_open (the file and its shards opened collectively with the
 * MPI-IO driver and collective metadata reads; the root attributes, index
 * and statistics read collectively and checked), ts_dataset_close, the
 * accessors and ts_dataset_info/spacing. It must not read sample data
 * itself: sample handles, the chunk cache and box reads belong to
 * io/dataset_read.c (shared state in io/dataset_impl.h). */
#include "tsbuild.h"
#include "io/dataset_impl.h"
#include "io/fingerprint.h"
#include "io/h5.h"
#include "src/core/path.h"

#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(ts_ds_row)), s = H5Tcopy(H5T_C_S1), a = -1;
    hsize_t four = 4;
    H5Tset_size(s, TS_IO_NAME_MAX);
    H5Tset_strpad(s, H5T_STR_NULLTERM);
    a = H5Tarray_create2(H5T_NATIVE_INT64, 1, &four);
    H5Tinsert(t, "name", HOFFSET(ts_ds_row, name), s);
    H5Tinsert(t, "shard", HOFFSET(ts_ds_row, shard), H5T_NATIVE_INT32);
    H5Tinsert(t, "shape", HOFFSET(ts_ds_row, shape), a);
    H5Tinsert(t, "foreground", HOFFSET(ts_ds_row, foreground), H5T_NATIVE_INT64);
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
        ts_ds_row *r = &ds->rows[i];
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
        lerr = ts_ds_check_sample(ds, i);
        /* keep the handles of the first samples checked, up to half the limit */
        if (ds->nopen > TS_DS_MAX_OPEN / 2) {
            ts_h5_lock();
            ts_ds_close_handles(ds, i);
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

void ts_dataset_close(ts_dataset **dsp)
{
    if (!dsp || !*dsp) return;
    ts_dataset *ds = *dsp;
    ts_h5_lock();
    if (ds->h)
        for (int64_t i = 0; i < ds->n; i++) ts_ds_close_handles(ds, i);
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
    const ts_ds_row *r = &ds->rows[i];
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
    const ts_ds_row *r = &ds->rows[i];
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
