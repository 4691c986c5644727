/* Parallel dataset writer, files and samples (see writer.h and
 * docs/formats-dataset.md). Two modes. Collective: several ranks, one file;
 * every rank creates every sample's group, datasets and attributes
 * (parallel HDF5 needs identical metadata calls) from the metadata gathered
 * each round, and the owner writes the data in a collective H5Dwrite.
 * Sharded (also one rank, one file): each shard file is owned by one rank
 * and written through the POSIX driver with H5Dwrite_chunk, the Fletcher-32
 * checksum computed here. It owns create, put, the index and root
 * attributes, finish and destroy; it must not compute a sample's statistics
 * (io/writer_stats.c; shared state in io/writer_impl.h). */
#include "tsbuild.h"
#include "io/writer_impl.h"
#include "io/fingerprint.h"
#include "io/h5.h"

#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int shard_of(const ts_dswriter *w, int64_t i) { return (int)(i * w->o.shards / w->n); }
static int owner_of(const ts_dswriter *w, int64_t i)
{
    return w->collective ? (int)(i % w->size) : shard_of(w, i) % w->size;
}

void ts_io_shard_name(const char *path, int k, int n, char *buf, size_t len)
{
    size_t pl = strlen(path);
    int ext = pl > 3 && !strcmp(path + pl - 3, ".h5");
    int ext5 = pl > 5 && !strcmp(path + pl - 5, ".hdf5");
    int cut = ext ? 3 : ext5 ? 5 : 0;
    snprintf(buf, len, "%.*s-shard-%05d-of-%05d.h5", (int)(pl - cut), path, k, n);
}

static void partial_name(const char *final, char *buf, size_t len) { snprintf(buf, len, "%s.partial", final); }

static void file_name(const ts_dswriter *w, int shard, char *buf, size_t len)
{
    if (w->o.shards == 1) snprintf(buf, len, "%s", w->path);
    else ts_io_shard_name(w->path, shard, w->o.shards, buf, len);
}

/* Local allocations of the writer (names, per-sample tables, buffers). */
static int setup(ts_dswriter *w, const ts_dswriter_opts *opts)
{
    int C = opts->channels, K = opts->classes;
    w->class_names = TS_CALLOC((size_t)K, sizeof(char *));
    w->channel_names = TS_CALLOC((size_t)C, sizeof(char *));
    if (!w->class_names || !w->channel_names) return TS_ERR(TS_ERR_NOMEM, "writer");
    for (int k = 0; k < K; k++) {
        char def[32];
        snprintf(def, sizeof def, k ? "class%d" : "background", k);
        w->class_names[k] = strdup(opts->class_names && opts->class_names[k] ? opts->class_names[k] : def);
        if (!w->class_names[k]) return TS_ERR(TS_ERR_NOMEM, "writer");
    }
    for (int c = 0; c < C; c++) {
        char def[32];
        snprintf(def, sizeof def, "image%d", c);
        w->channel_names[c] = strdup(opts->channel_names && opts->channel_names[c] ? opts->channel_names[c] : def);
        if (!w->channel_names[c]) return TS_ERR(TS_ERR_NOMEM, "writer");
    }
    w->o.class_names = NULL;
    w->o.channel_names = NULL;
    w->o.source = NULL;
    if (opts->prep) w->prep = *opts->prep;
    w->o.prep = NULL;
    TS_TRY(ts_fp_acc_create(w->n, C, opts->seed, TS_FP_VALUES_MAX, &w->fp));
    size_t n = (size_t)w->n;
    w->rows = TS_CALLOC(n, sizeof *w->rows);
    w->mean = TS_CALLOC(n * C, sizeof(double));
    w->std = TS_CALLOC(n * C, sizeof(double));
    w->min = TS_CALLOC(n * C, sizeof(double));
    w->max = TS_CALLOC(n * C, sizeof(double));
    w->pct = TS_CALLOC(n * C * TS_IO_NPCT, sizeof(double));
    w->fgmean = TS_CALLOC(n * C, sizeof(double));
    w->fgstd = TS_CALLOC(n * C, sizeof(double));
    w->cls = TS_CALLOC(n * K, sizeof(int64_t));
    w->nvox = TS_CALLOC(n, sizeof(int64_t));
    w->have = TS_CALLOC(n, 1);
    w->local = TS_CALLOC(n, sizeof(int64_t));
    w->files = TS_CALLOC((size_t)w->o.shards, sizeof(hid_t));
    w->created = TS_CALLOC((size_t)w->o.shards, sizeof(int));
    w->fg = TS_CALLOC(TS_IO_FG_MAX * 3, sizeof(int32_t));
    if (!w->rows || !w->mean || !w->std || !w->min || !w->max || !w->pct || !w->fgmean || !w->fgstd || !w->cls || !w->nvox || !w->have ||
        !w->local || !w->files || !w->created || !w->fg)
        return TS_ERR(TS_ERR_NOMEM, "writer tables for %lld samples", (long long)w->n);
    return 0;
}

int ts_dswriter_create(MPI_Comm comm, const char *path, const ts_dswriter_opts *opts, ts_dswriter **out)
{
    int err = 0;
    ts_dswriter *w = NULL;
    ts_h5_init();
    *out = NULL;
    w = TS_CALLOC(1, sizeof *w);
    if (!w) return TS_ERR_NOMEM;
    w->comm = MPI_COMM_NULL;
    TS_MPI(MPI_Comm_dup(comm, &w->comm));
    MPI_Comm_rank(w->comm, &w->rank);
    MPI_Comm_size(w->comm, &w->size);
    w->o = *opts;
    if (w->o.chunk <= 0) w->o.chunk = 64;
    if (w->o.shards <= 0) w->o.shards = 1;
    if (strlen(path) >= sizeof w->path - 64) TS_FAIL(TS_ERR_ARG, "output path too long: %s", path);
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->source, sizeof w->source, "%s", opts->source ? opts->source : "tessera");
    w->n = opts->count;
    if (w->n <= 0) TS_FAIL(TS_ERR_ARG, "%s: a dataset needs at least one sample", path);
    if (opts->channels < 1 || opts->channels > TS_IO_MAX_CHANNELS)
        TS_FAIL(TS_ERR_ARG, "%s: %d channels (1..%d)", path, opts->channels, TS_IO_MAX_CHANNELS);
    if (opts->classes < 1 || opts->classes > TS_IO_MAX_CLASSES)
        TS_FAIL(TS_ERR_ARG, "%s: %d classes (1..%d)", path, opts->classes, TS_IO_MAX_CLASSES);
    if (w->o.shards > w->n)
        TS_FAIL(TS_ERR_ARG, "%s: %d shards for %lld samples (at most one shard per sample)", path, w->o.shards,
                (long long)w->n);
    if (w->o.chunk > 4096) TS_FAIL(TS_ERR_ARG, "%s: chunk edge %d too large", path, w->o.chunk);
    w->collective = w->o.shards == 1 && w->size > 1;
    TS_CHECK(ts_err_agree(w->comm, setup(w, opts)));
    for (int s = 0; s < w->o.shards; s++) w->files[s] = -1;
    for (int64_t i = 0; i < w->n; i++)
        if (owner_of(w, i) == w->rank) w->local[w->nlocal++] = i;
    int64_t mine = w->nlocal;
    TS_MPI(MPI_Allreduce(&mine, &w->rounds, 1, MPI_INT64_T, MPI_MAX, w->comm));

    /* create the temporary files now, so a bad output path fails before any work */
    {
        char fin[TS_IO_PATH_MAX], part[TS_IO_PATH_MAX + 16];
        hid_t fcpl = -1, fapl = -1;
        int lerr = 0;
        ts_h5_lock();
        fcpl = H5Pcreate(H5P_FILE_CREATE);
        fapl = H5Pcreate(H5P_FILE_ACCESS);
        if (fcpl < 0 || fapl < 0 || H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0)
            lerr = ts_h5_err(__FILE__, __LINE__, "property lists");
        if (!lerr && w->collective) {
            if (H5Pset_fapl_mpio(fapl, w->comm, MPI_INFO_NULL) < 0 || H5Pset_all_coll_metadata_ops(fapl, 1) < 0 ||
                H5Pset_coll_metadata_write(fapl, 1) < 0)
                lerr = ts_h5_err(__FILE__, __LINE__, "MPI-IO file access");
            file_name(w, 0, fin, sizeof fin);
            partial_name(fin, part, sizeof part);
            if (!lerr) {
                w->files[0] = H5Fcreate(part, H5F_ACC_TRUNC, fcpl, fapl);
                if (w->files[0] < 0) lerr = ts_h5_err(__FILE__, __LINE__, "cannot create %s", part);
                else w->created[0] = 1;
            }
        } else if (!lerr) {
            for (int s = 0; s < w->o.shards && !lerr; s++) {
                if (s % w->size != w->rank) continue;
                file_name(w, s, fin, sizeof fin);
                partial_name(fin, part, sizeof part);
                w->files[s] = H5Fcreate(part, H5F_ACC_TRUNC, fcpl, fapl);
                if (w->files[s] < 0) lerr = ts_h5_err(__FILE__, __LINE__, "cannot create %s", part);
                else w->created[s] = 1;
            }
        }
        for (int s = 0; s < w->o.shards && !lerr; s++) {
            if (w->files[s] < 0) continue;
            file_name(w, s, fin, sizeof fin);
            hid_t g = H5Gcreate2(w->files[s], "/samples", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            if (g < 0) lerr = ts_h5_err(__FILE__, __LINE__, "cannot create /samples in %s", fin);
            else H5Gclose(g);
        }
        if (fcpl >= 0) H5Pclose(fcpl);
        if (fapl >= 0) H5Pclose(fapl);
        ts_h5_unlock();
        TS_CHECK(ts_err_agree(w->comm, lerr));
    }
    *out = w;
    return 0;
cleanup:
    w->failed = 1;
    ts_dswriter_destroy(&w);
    return err;
}

int64_t ts_dswriter_local_count(const ts_dswriter *w) { return w->nlocal; }
int64_t ts_dswriter_local_index(const ts_dswriter *w, int64_t k) { return k >= 0 && k < w->nlocal ? w->local[k] : -1; }
int64_t ts_dswriter_rounds(const ts_dswriter *w) { return w->rounds; }

/* ---------------- writing one sample ---------------- */

static int write_sample_attrs(ts_dswriter *w, hid_t g, const ts_sample_meta *m)
{
    int C = (int)m->shape[0], K = w->o.classes;
    hsize_t d3 = 3, d44[2] = {4, 4}, dc = (hsize_t)C, dcp[2] = {(hsize_t)C, TS_IO_NPCT}, dk = (hsize_t)K;
    int64_t codes[2] = {m->sform_code, m->qform_code};
    double pct[TS_IO_MAX_CHANNELS * TS_IO_NPCT];
    for (int c = 0; c < C; c++) memcpy(pct + c * TS_IO_NPCT, m->pct[c], sizeof m->pct[c]);
    TS_TRY(ts_h5_write_attr_str(g, "name", m->name));
    TS_TRY(ts_h5_write_attr_f64(g, "spacing", 1, &d3, m->spacing));
    TS_TRY(ts_h5_write_attr_f64(g, "sform", 2, d44, m->sform));
    TS_TRY(ts_h5_write_attr_f64(g, "qform", 2, d44, m->qform));
    TS_TRY(ts_h5_write_attr_i64(g, "sform_code", 0, NULL, &codes[0]));
    TS_TRY(ts_h5_write_attr_i64(g, "qform_code", 0, NULL, &codes[1]));
    TS_TRY(ts_h5_write_attr_f64(g, "mean", 1, &dc, m->mean));
    TS_TRY(ts_h5_write_attr_f64(g, "std", 1, &dc, m->std));
    TS_TRY(ts_h5_write_attr_f64(g, "min", 1, &dc, m->min));
    TS_TRY(ts_h5_write_attr_f64(g, "max", 1, &dc, m->max));
    TS_TRY(ts_h5_write_attr_f64(g, "percentiles", 2, dcp, pct));
    TS_TRY(ts_h5_write_attr_f64(g, "fg_mean", 1, &dc, m->fg_mean));
    TS_TRY(ts_h5_write_attr_f64(g, "fg_std", 1, &dc, m->fg_std));
    TS_TRY(ts_h5_write_attr_i64(g, "class_voxels", 1, &dk, m->class_voxels));
    TS_TRY(ts_h5_write_attr_str(g, "source_image", m->source_image));
    TS_TRY(ts_h5_write_attr_str(g, "source_label", m->source_label));
    return ts_fp_write_sample_attrs(g, &m->fp);
}

/* dcpl for a sample volume: chunk edge e, Fletcher-32; no fill writes */
static hid_t volume_dcpl(int rank, const int64_t *dims, int e)
{
    hsize_t ch[4];
    for (int d = 0; d < rank; d++) ch[d] = (hsize_t)(dims[d] < e ? dims[d] : e);
    if (rank == 4) ch[0] = 1;
    hid_t p = H5Pcreate(H5P_DATASET_CREATE);
    if (p < 0) return p;
    if (H5Pset_chunk(p, rank, ch) < 0 || H5Pset_fletcher32(p) < 0 || H5Pset_fill_time(p, H5D_FILL_TIME_NEVER) < 0) {
        H5Pclose(p);
        return -1;
    }
    return p;
}

/* Writes every chunk of a volume with H5Dwrite_chunk: gathers the chunk
 * (edge chunks padded with zeros), appends the Fletcher-32, writes raw. */
static int write_chunks(ts_dswriter *w, hid_t d, int rank, const int64_t *dims, size_t esize, const void *data,
                        const char *what)
{
    int err = 0;
    int64_t ch[4], nch[4];
    for (int k = 0; k < rank; k++) {
        ch[k] = dims[k] < w->o.chunk ? dims[k] : w->o.chunk;
        if (rank == 4 && k == 0) ch[k] = 1;
        nch[k] = (dims[k] + ch[k] - 1) / ch[k];
    }
    /* view as 4-D [A, Z, Y, X] */
    int64_t cd[4] = {1, 1, 1, 1}, dd[4] = {1, 1, 1, 1}, nc[4] = {1, 1, 1, 1};
    for (int k = 0; k < rank; k++) {
        cd[4 - rank + k] = ch[k];
        dd[4 - rank + k] = dims[k];
        nc[4 - rank + k] = nch[k];
    }
    size_t cbytes = (size_t)(cd[0] * cd[1] * cd[2] * cd[3]) * esize;
    if (w->chunkcap < cbytes + 4) {
        free(w->chunkbuf);
        w->chunkbuf = TS_ALIGNED_ALLOC(cbytes + 4);
        if (!w->chunkbuf) {
            w->chunkcap = 0;
            return TS_ERR_NOMEM;
        }
        w->chunkcap = cbytes + 4;
    }
    uint8_t *buf = w->chunkbuf;
    const uint8_t *src = data;
    for (int64_t a = 0; a < nc[0]; a++)
        for (int64_t z = 0; z < nc[1]; z++)
            for (int64_t y = 0; y < nc[2]; y++)
                for (int64_t x = 0; x < nc[3]; x++) {
                    int64_t o[4] = {a * cd[0], z * cd[1], y * cd[2], x * cd[3]}, n[4];
                    int edge = 0;
                    for (int k = 0; k < 4; k++) {
                        n[k] = dd[k] - o[k] < cd[k] ? dd[k] - o[k] : cd[k];
                        edge |= n[k] < cd[k];
                    }
                    if (edge) memset(buf, 0, cbytes);
                    for (int64_t aa = 0; aa < n[0]; aa++)
                        for (int64_t zz = 0; zz < n[1]; zz++)
                            for (int64_t yy = 0; yy < n[2]; yy++) {
                                size_t so = (size_t)((((o[0] + aa) * dd[1] + o[1] + zz) * dd[2] + o[2] + yy) * dd[3] +
                                                     o[3]) * esize;
                                size_t bo = (size_t)(((aa * cd[1] + zz) * cd[2] + yy) * cd[3]) * esize;
                                memcpy(buf + bo, src + so, (size_t)n[3] * esize);
                            }
                    uint32_t ck = ts_h5_fletcher32(buf, cbytes);
                    buf[cbytes] = (uint8_t)ck;
                    buf[cbytes + 1] = (uint8_t)(ck >> 8);
                    buf[cbytes + 2] = (uint8_t)(ck >> 16);
                    buf[cbytes + 3] = (uint8_t)(ck >> 24);
                    hsize_t off[4];
                    for (int k = 0; k < rank; k++) off[k] = (hsize_t)o[4 - rank + k];
                    ts_h5_lock();
                    herr_t r = H5Dwrite_chunk(d, H5P_DEFAULT, 0, off, cbytes + 4, buf);
                    if (r < 0) err = ts_h5_err(__FILE__, __LINE__, "cannot write a chunk of %s", what);
                    ts_h5_unlock();
                    if (err) return err;
                }
    return 0;
}

/* Creates the sample's group, datasets and attributes in file f; writes the
 * data when s is given (direct: raw chunks; collective: one collective
 * H5Dwrite per dataset, with an empty selection on ranks without data). */
static int write_sample(ts_dswriter *w, hid_t f, const ts_sample_meta *m, const ts_sample *s, const int32_t *fg,
                        const char *fname)
{
    int err = 0;
    char gname[64], what[TS_IO_PATH_MAX + 96];
    hid_t g = -1, sp = -1, dcpl = -1, dimg = -1, dlab = -1, dfg = -1, dxpl = -1, ms = -1, fs = -1;
    snprintf(gname, sizeof gname, "/samples/%06lld", (long long)m->index);
    ts_h5_lock();
    TS_H5M(g = H5Gcreate2(f, gname, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "cannot create %s in %s", gname, fname);
    TS_CHECK(write_sample_attrs(w, g, m));
    hsize_t idims[4], ldims[3], fdims[2] = {(hsize_t)m->nfg, 3};
    for (int k = 0; k < 4; k++) idims[k] = (hsize_t)m->shape[k];
    for (int k = 0; k < 3; k++) ldims[k] = (hsize_t)m->shape[k + 1];
    TS_H5(sp = H5Screate_simple(4, idims, NULL));
    TS_H5(dcpl = volume_dcpl(4, m->shape, w->o.chunk));
    TS_H5M(dimg = H5Dcreate2(g, "image", H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT),
           "cannot create %s/image in %s", gname, fname);
    H5Sclose(sp);
    H5Pclose(dcpl);
    sp = dcpl = -1;
    TS_H5(sp = H5Screate_simple(3, ldims, NULL));
    TS_H5(dcpl = volume_dcpl(3, m->shape + 1, w->o.chunk));
    TS_H5M(dlab = H5Dcreate2(g, "label", H5T_STD_U8LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT),
           "cannot create %s/label in %s", gname, fname);
    H5Sclose(sp);
    sp = -1;
    TS_H5(sp = H5Screate_simple(2, fdims, NULL));
    TS_H5M(dfg = H5Dcreate2(g, "foreground", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
           "cannot create %s/foreground in %s", gname, fname);
    {
        int64_t K = w->o.classes;
        TS_CHECK(ts_h5_write_attr_i64(dlab, "classes", 0, NULL, &K));
    }
    if (!w->collective) {
        snprintf(what, sizeof what, "%s/image in %s", gname, fname);
        ts_h5_unlock();
        err = write_chunks(w, dimg, 4, m->shape, sizeof(float), s->image, what);
        if (!err) {
            snprintf(what, sizeof what, "%s/label in %s", gname, fname);
            err = write_chunks(w, dlab, 3, m->shape + 1, 1, s->label, what);
        }
        ts_h5_lock();
        if (err) goto cleanup;
        if (m->nfg)
            TS_H5M(H5Dwrite(dfg, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, fg),
                   "cannot write %s/foreground in %s", gname, fname);
    } else {
        static const float zf = 0;
        static const uint8_t zb = 0;
        TS_H5(dxpl = H5Pcreate(H5P_DATASET_XFER));
        TS_H5(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
        hid_t ds_[2] = {dimg, dlab};
        hid_t mt[2] = {H5T_NATIVE_FLOAT, H5T_NATIVE_UINT8};
        const void *bufs[2] = {s ? (const void *)s->image : &zf, s ? (const void *)s->label : &zb};
        const char *names[2] = {"image", "label"};
        /* filtered datasets need collective writes; the small contiguous
         * foreground table is written by its owner alone */
        if (s && m->nfg)
            TS_H5M(H5Dwrite(dfg, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, fg),
                   "cannot write %s/foreground in %s", gname, fname);
        for (int k = 0; k < 2; k++) {
            TS_H5(fs = H5Dget_space(ds_[k]));
            TS_H5(ms = H5Scopy(fs));
            if (!s) {
                TS_H5(H5Sselect_none(fs));
                TS_H5(H5Sselect_none(ms));
            }
            TS_H5M(H5Dwrite(ds_[k], mt[k], ms, fs, dxpl, bufs[k]), "cannot write %s/%s in %s", gname, names[k],
                   fname);
            H5Sclose(fs);
            H5Sclose(ms);
            fs = ms = -1;
        }
    }
cleanup:
    if (fs >= 0) H5Sclose(fs);
    if (ms >= 0) H5Sclose(ms);
    if (dxpl >= 0) H5Pclose(dxpl);
    if (dfg >= 0) H5Dclose(dfg);
    if (dlab >= 0) H5Dclose(dlab);
    if (dimg >= 0) H5Dclose(dimg);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    if (g >= 0) H5Gclose(g);
    ts_h5_unlock();
    return err;
}

static void record(ts_dswriter *w, const ts_sample_meta *m)
{
    int64_t i = m->index;
    int C = w->o.channels, K = w->o.classes;
    ts_dsw_row *r = &w->rows[i];
    snprintf(r->name, sizeof r->name, "%s", m->name);
    r->shard = m->shard;
    memcpy(r->shape, m->shape, sizeof r->shape);
    r->foreground = m->nfg;
    for (int c = 0; c < C; c++) {
        w->mean[i * C + c] = m->mean[c];
        w->std[i * C + c] = m->std[c];
        w->min[i * C + c] = m->min[c];
        w->max[i * C + c] = m->max[c];
        memcpy(&w->pct[(i * C + c) * TS_IO_NPCT], m->pct[c], sizeof m->pct[c]);
        w->fgmean[i * C + c] = m->fg_mean[c];
        w->fgstd[i * C + c] = m->fg_std[c];
    }
    memcpy(&w->cls[i * K], m->class_voxels, (size_t)K * sizeof(int64_t));
    ts_fp_acc_record(w->fp, i, &m->fp, m->spacing, m->shape + 1);
    w->nvox[i] = m->nvox;
    w->have[i] = 1;
}

/* the sample's part of the fingerprint: the scan before preprocessing
 * (the stored volume when the sample says nothing) and its foreground */
static int fingerprint(ts_dswriter *w, const ts_sample *s, int64_t idx, ts_sample_meta *m)
{
    ts_fp_sample *f = &m->fp;
    const int64_t nv = s->shape[1] * s->shape[2] * s->shape[3];
    if (s->shape_orig[0] > 0) {
        memcpy(f->shape_orig, s->shape_orig, sizeof f->shape_orig);
        memcpy(f->spacing_orig, s->spacing_orig, sizeof f->spacing_orig);
        memcpy(f->crop, s->crop, sizeof f->crop);
    } else {
        for (int d = 0; d < 3; d++) {
            f->shape_orig[d] = f->crop[3 + d] = s->shape[d + 1];
            f->spacing_orig[d] = s->spacing[d];
            f->crop[d] = 0;
        }
    }
    if (s->fp_image && s->fp_label)
        return ts_fp_acc_sample(w->fp, idx, s->fp_image, s->fp_label, s->fp_shape[0] * s->fp_shape[1] * s->fp_shape[2],
                                f);
    return ts_fp_acc_sample(w->fp, idx, s->image, s->label, nv, f);
}

int ts_dswriter_put(ts_dswriter *w, const ts_sample *s, int local_err)
{
    int err = 0;
    ts_sample_meta *mine = NULL, *all = NULL;
    if (w->failed) return TS_ERR(TS_ERR_ARG, "dataset writer for %s already failed", w->path);
    if (w->round >= w->rounds) local_err = local_err ? local_err : TS_ERR(TS_ERR_ARG, "writer: too many rounds");
    int64_t idx = w->round < w->nlocal ? w->local[w->round] : -1;
    if (!local_err && s && idx < 0) local_err = TS_ERR(TS_ERR_INTERNAL, "writer: rank has no sample this round");
    if (!local_err && !s && idx >= 0)
        local_err = TS_ERR(TS_ERR_INTERNAL, "writer: sample %lld was not produced", (long long)idx);
    mine = TS_CALLOC(1, sizeof *mine);
    all = TS_CALLOC((size_t)w->size, sizeof *all);
    if (!mine || !all) local_err = local_err ? local_err : TS_ERR_NOMEM;
    if (!local_err && s) {
        if (s->shape[0] != w->o.channels)
            local_err = TS_ERR(TS_ERR_FORMAT, "sample %s (%s) has %lld channels, the dataset has %d", s->name,
                               s->source_image, (long long)s->shape[0], w->o.channels);
        else local_err = ts_sample_stats(s, w->o.classes, mine);
        if (!local_err) local_err = fingerprint(w, s, idx, mine);
        if (!local_err) {
            mine->index = idx;
            mine->shard = w->collective ? 0 : shard_of(w, idx);
            mine->nfg = ts_dsw_foreground(w, s, mine, w->fg);
        }
    }
    if (!s && mine) mine->index = -1;
    TS_CHECK(ts_err_agree(w->comm, local_err));
    TS_MPI(MPI_Allgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, w->comm));
    int lerr = 0;
    if (w->collective) {
        for (int p = 0; p < w->size && !lerr; p++) {
            if (all[p].index < 0) continue;
            lerr = write_sample(w, w->files[0], &all[p], p == w->rank ? s : NULL, w->fg, w->path);
        }
    } else if (s) {
        char fin[TS_IO_PATH_MAX];
        file_name(w, mine->shard, fin, sizeof fin);
        lerr = write_sample(w, w->files[mine->shard], mine, s, w->fg, fin);
    }
    TS_CHECK(ts_err_agree(w->comm, lerr));
    for (int p = 0; p < w->size; p++)
        if (all[p].index >= 0) record(w, &all[p]);
    w->round++;
cleanup:
    if (err) w->failed = 1;
    free(mine);
    free(all);
    return err;
}

/* ---------------- index, statistics, root attributes ---------------- */

static int write_table(hid_t f, const char *name, hid_t ftype, hid_t mtype, int rank, const hsize_t *dims,
                       const void *buf, hid_t dxpl, int writer)
{
    int err = 0;
    hid_t sp = -1, d = -1, fs = -1;
    TS_H5(sp = H5Screate_simple(rank, dims, NULL));
    TS_H5M(d = H5Dcreate2(f, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "cannot create %s", name);
    TS_H5(fs = H5Scopy(sp));
    if (!writer) {
        TS_H5(H5Sselect_none(fs));
        TS_H5(H5Sselect_none(sp));
    }
    TS_H5M(H5Dwrite(d, mtype, sp, fs, dxpl, buf), "cannot write %s", name);
cleanup:
    if (fs >= 0) H5Sclose(fs);
    if (d >= 0) H5Dclose(d);
    if (sp >= 0) H5Sclose(sp);
    return err;
}

static hid_t index_type(int file)
{
    hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(ts_dsw_row)), s = H5Tcopy(H5T_C_S1), a = -1;
    hsize_t four = 4;
    H5Tset_size(s, TS_IO_NAME_MAX);
    H5Tset_strpad(s, H5T_STR_NULLTERM);
    a = H5Tarray_create2(file ? H5T_STD_I64LE : H5T_NATIVE_INT64, 1, &four);
    H5Tinsert(t, "name", HOFFSET(ts_dsw_row, name), s);
    H5Tinsert(t, "shard", HOFFSET(ts_dsw_row, shard), file ? H5T_STD_I32LE : H5T_NATIVE_INT32);
    H5Tinsert(t, "shape", HOFFSET(ts_dsw_row, shape), a);
    H5Tinsert(t, "foreground", HOFFSET(ts_dsw_row, foreground), file ? H5T_STD_I64LE : H5T_NATIVE_INT64);
    H5Tclose(s);
    H5Tclose(a);
    if (file) H5Tpack(t);
    return t;
}

/* The index, statistics and root attributes into f (the single file or the
 * manifest). Collective mode: every rank calls, rank 0 writes the data. */
static int write_index(ts_dswriter *w, hid_t f, int writer, const char *const *shard_files)
{
    int err = 0;
    hid_t dxpl = -1, mt = -1, ft = -1, g = -1;
    const int C = w->o.channels, K = w->o.classes;
    const hsize_t n = (hsize_t)w->n;
    double dmean[TS_IO_MAX_CHANNELS] = {0}, dstd[TS_IO_MAX_CHANNELS] = {0};
    int64_t *kv = TS_CALLOC((size_t)K, sizeof(int64_t));
    if (!kv) return TS_ERR_NOMEM;
    /* dataset-wide mean and std: pooled over all voxels */
    double tot = 0;
    for (int64_t i = 0; i < w->n; i++) tot += (double)w->nvox[i];
    for (int c = 0; c < C; c++) {
        double s = 0, ss = 0;
        for (int64_t i = 0; i < w->n; i++) s += (double)w->nvox[i] * w->mean[i * C + c];
        dmean[c] = s / tot;
        for (int64_t i = 0; i < w->n; i++) {
            double dm = w->mean[i * C + c] - dmean[c], sd = w->std[i * C + c];
            ss += (double)w->nvox[i] * (sd * sd + dm * dm);
        }
        dstd[c] = sqrt(ss / tot);
    }
    for (int64_t i = 0; i < w->n; i++)
        for (int k = 0; k < K; k++) kv[k] += w->cls[i * K + k];
    ts_h5_lock();
    TS_H5(dxpl = H5Pcreate(H5P_DATASET_XFER));
    if (w->collective) TS_H5(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
    TS_H5(mt = index_type(0));
    TS_H5(ft = index_type(1));
    TS_CHECK(write_table(f, "/index", ft, mt, 1, &n, w->rows, dxpl, writer));
    TS_H5(g = H5Gcreate2(f, "/stats", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    {
        hsize_t nc[2] = {n, (hsize_t)C}, ncp[3] = {n, (hsize_t)C, TS_IO_NPCT}, nk[2] = {n, (hsize_t)K};
        TS_CHECK(write_table(g, "mean", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 2, nc, w->mean, dxpl, writer));
        TS_CHECK(write_table(g, "std", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 2, nc, w->std, dxpl, writer));
        TS_CHECK(write_table(g, "min", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 2, nc, w->min, dxpl, writer));
        TS_CHECK(write_table(g, "max", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 2, nc, w->max, dxpl, writer));
        TS_CHECK(write_table(g, "percentiles", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 3, ncp, w->pct, dxpl, writer));
        TS_CHECK(write_table(g, "fg_mean", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 2, nc, w->fgmean, dxpl, writer));
        TS_CHECK(write_table(g, "fg_std", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 2, nc, w->fgstd, dxpl, writer));
        TS_CHECK(write_table(g, "class_voxels", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, nk, w->cls, dxpl, writer));
    }
    TS_CHECK(ts_fp_write(f, w->fp, &w->fi, &w->prep, dxpl, writer));
    {
        int64_t v;
        hsize_t dc = (hsize_t)C, dk = (hsize_t)K, dp = TS_IO_NPCT;
        TS_CHECK(ts_h5_write_attr_str(f, "format", TS_IO_FORMAT));
        v = TS_IO_FORMAT_VERSION;
        TS_CHECK(ts_h5_write_attr_i64(f, "format_version", 0, NULL, &v));
        TS_CHECK(ts_h5_write_attr_i64(f, "num_samples", 0, NULL, &w->n));
        v = C;
        TS_CHECK(ts_h5_write_attr_i64(f, "channels", 0, NULL, &v));
        v = K;
        TS_CHECK(ts_h5_write_attr_i64(f, "classes", 0, NULL, &v));
        TS_CHECK(ts_h5_write_attr_strs(f, "class_names", K, (const char *const *)w->class_names));
        TS_CHECK(ts_h5_write_attr_strs(f, "channel_names", C, (const char *const *)w->channel_names));
        TS_CHECK(ts_h5_write_attr_f64(f, "mean", 1, &dc, dmean));
        TS_CHECK(ts_h5_write_attr_f64(f, "std", 1, &dc, dstd));
        TS_CHECK(ts_h5_write_attr_i64(f, "class_voxels", 1, &dk, kv));
        TS_CHECK(ts_h5_write_attr_f64(f, "percentile_levels", 1, &dp, ts_io_pct_levels));
        v = w->o.shards;
        TS_CHECK(ts_h5_write_attr_i64(f, "shards", 0, NULL, &v));
        v = w->o.chunk;
        TS_CHECK(ts_h5_write_attr_i64(f, "chunk", 0, NULL, &v));
        if (shard_files) TS_CHECK(ts_h5_write_attr_strs(f, "shard_files", w->o.shards, shard_files));
        TS_CHECK(ts_h5_write_attr_str(f, "source", w->source));
        TS_CHECK(ts_h5_write_attr_str(f, "created_by", "tessera " PACKAGE_VERSION));
    }
cleanup:
    if (g >= 0) H5Gclose(g);
    if (ft >= 0) H5Tclose(ft);
    if (mt >= 0) H5Tclose(mt);
    if (dxpl >= 0) H5Pclose(dxpl);
    ts_h5_unlock();
    free(kv);
    return err;
}

static int write_shard_attrs(ts_dswriter *w, hid_t f, int s, const char *manifest)
{
    int64_t v;
    TS_TRY(ts_h5_write_attr_str(f, "format", TS_IO_FORMAT "-shard"));
    v = TS_IO_FORMAT_VERSION;
    TS_TRY(ts_h5_write_attr_i64(f, "format_version", 0, NULL, &v));
    v = s;
    TS_TRY(ts_h5_write_attr_i64(f, "shard", 0, NULL, &v));
    v = w->o.shards;
    TS_TRY(ts_h5_write_attr_i64(f, "shards", 0, NULL, &v));
    TS_TRY(ts_h5_write_attr_str(f, "manifest", manifest));
    return 0;
}

static int close_file(hid_t *f, const char *name)
{
    int err = 0;
    if (*f < 0) return 0;
    ts_h5_lock();
    herr_t r = H5Fclose(*f);
    *f = -1;
    if (r < 0) err = ts_h5_err(__FILE__, __LINE__, "cannot close %s", name);
    ts_h5_unlock();
    return err;
}

static int rename_into_place(const char *final)
{
    char part[TS_IO_PATH_MAX + 16];
    partial_name(final, part, sizeof part);
    if (rename(part, final) != 0) return TS_ERR(TS_ERR_IO, "cannot rename %s to %s: %s", part, final, strerror(errno));
    return 0;
}

int ts_dswriter_finish(ts_dswriter *w)
{
    int err = 0, lerr = 0;
    char fin[TS_IO_PATH_MAX], part[TS_IO_PATH_MAX + 16];
    char **names = NULL;
    hid_t mf = -1, fapl = -1;
    if (w->failed) return TS_ERR(TS_ERR_ARG, "dataset writer for %s already failed", w->path);
    for (int64_t i = 0; i < w->n && !lerr; i++)
        if (!w->have[i]) lerr = TS_ERR(TS_ERR_INTERNAL, "writer: sample %lld never written", (long long)i);
    TS_CHECK(ts_err_agree(w->comm, lerr));
    TS_CHECK(ts_err_agree(w->comm, ts_fp_acc_finish(w->fp, w->comm, &w->fi)));
    if (w->collective) {
        lerr = write_index(w, w->files[0], w->rank == 0, NULL);
        int cerr = close_file(&w->files[0], w->path);
        TS_CHECK(ts_err_agree(w->comm, lerr ? lerr : cerr));
        if (w->rank == 0) lerr = rename_into_place(w->path);
        TS_CHECK(ts_err_agree(w->comm, lerr));
    } else if (w->o.shards == 1) {
        if (w->rank == 0) {
            lerr = write_index(w, w->files[0], 1, NULL);
            int cerr = close_file(&w->files[0], w->path);
            lerr = lerr ? lerr : cerr;
            if (!lerr) lerr = rename_into_place(w->path);
        }
        TS_CHECK(ts_err_agree(w->comm, lerr));
    } else {
        char *base = strdup(w->path);
        if (!base) TS_FAIL(TS_ERR_NOMEM, "writer");
        const char *manifest = basename(base);
        for (int s = 0; s < w->o.shards && !lerr; s++) {
            if (w->files[s] < 0) continue;
            file_name(w, s, fin, sizeof fin);
            lerr = write_shard_attrs(w, w->files[s], s, manifest);
            int cerr = close_file(&w->files[s], fin);
            lerr = lerr ? lerr : cerr;
        }
        free(base);
        TS_CHECK(ts_err_agree(w->comm, lerr));
        if (w->rank == 0) {
            /* the manifest: index, statistics, shard names (relative to it), external links */
            names = TS_CALLOC((size_t)w->o.shards, sizeof(char *));
            if (!names) lerr = TS_ERR_NOMEM;
            for (int s = 0; s < w->o.shards && !lerr; s++) {
                file_name(w, s, fin, sizeof fin);
                char *b = strdup(fin);
                names[s] = b ? strdup(basename(b)) : NULL;
                free(b);
                if (!names[s]) lerr = TS_ERR_NOMEM;
            }
            partial_name(w->path, part, sizeof part);
            ts_h5_lock();
            if (!lerr) {
                fapl = H5Pcreate(H5P_FILE_ACCESS);
                if (fapl < 0 || H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0)
                    lerr = ts_h5_err(__FILE__, __LINE__, "file access properties");
            }
            if (!lerr) {
                mf = H5Fcreate(part, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
                if (mf < 0) lerr = ts_h5_err(__FILE__, __LINE__, "cannot create %s", part);
                else w->created[0] |= 2;
            }
            if (!lerr) lerr = write_index(w, mf, 1, (const char *const *)names);
            if (!lerr) {
                hid_t g = H5Gcreate2(mf, "/samples", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
                if (g < 0) lerr = ts_h5_err(__FILE__, __LINE__, "cannot create /samples in %s", part);
                for (int64_t i = 0; i < w->n && !lerr; i++) {
                    char ln[64];
                    snprintf(ln, sizeof ln, "/samples/%06lld", (long long)i);
                    if (H5Lcreate_external(names[w->rows[i].shard], ln, g, ln + 9, H5P_DEFAULT, H5P_DEFAULT) < 0)
                        lerr = ts_h5_err(__FILE__, __LINE__, "cannot link %s in %s", ln, part);
                }
                if (g >= 0) H5Gclose(g);
            }
            ts_h5_unlock();
            int cerr = close_file(&mf, part);
            lerr = lerr ? lerr : cerr;
        }
        TS_CHECK(ts_err_agree(w->comm, lerr));
        for (int s = 0; s < w->o.shards && !lerr; s++) {
            if (!w->created[s] || s % w->size != w->rank) continue;
            file_name(w, s, fin, sizeof fin);
            lerr = rename_into_place(fin);
        }
        TS_CHECK(ts_err_agree(w->comm, lerr));
        if (w->rank == 0) lerr = rename_into_place(w->path);
        TS_CHECK(ts_err_agree(w->comm, lerr));
    }
    w->finished = 1;
cleanup:
    if (fapl >= 0) {
        ts_h5_lock();
        H5Pclose(fapl);
        ts_h5_unlock();
    }
    if (names) ts_h5_free_strs(w->o.shards, names);
    if (err) w->failed = 1;
    return err;
}

void ts_dswriter_destroy(ts_dswriter **wp)
{
    if (!wp || !*wp) return;
    ts_dswriter *w = *wp;
    char fin[TS_IO_PATH_MAX], part[TS_IO_PATH_MAX + 16];
    for (int s = 0; s < w->o.shards && w->files; s++) {
        if (w->files[s] < 0) continue;
        ts_h5_lock();
        H5Fclose(w->files[s]); /* collective in collective mode: every rank gets here */
        ts_h5_unlock();
        w->files[s] = -1;
    }
    if (!w->finished && w->created) {
        /* remove every temporary this rank created (collective mode: rank 0) */
        for (int s = 0; s < w->o.shards; s++) {
            if (!(w->created[s] & 1)) continue;
            if (w->collective && w->rank != 0) continue;
            file_name(w, s, fin, sizeof fin);
            partial_name(fin, part, sizeof part);
            unlink(part);
        }
        if (w->created[0] & 2) {
            partial_name(w->path, part, sizeof part);
            unlink(part);
        }
    }
    if (w->class_names)
        for (int k = 0; k < w->o.classes; k++) free(w->class_names[k]);
    if (w->channel_names)
        for (int c = 0; c < w->o.channels; c++) free(w->channel_names[c]);
    free(w->class_names);
    free(w->channel_names);
    free(w->rows);
    free(w->mean);
    free(w->std);
    free(w->min);
    free(w->max);
    free(w->pct);
    free(w->fgmean);
    free(w->fgstd);
    free(w->cls);
    free(w->nvox);
    free(w->have);
    free(w->local);
    free(w->files);
    free(w->created);
    free(w->fg);
    ts_fp_acc_destroy(&w->fp);
    free(w->chunkbuf);
    if (w->comm != MPI_COMM_NULL) MPI_Comm_free(&w->comm);
    free(w);
    *wp = NULL;
}
