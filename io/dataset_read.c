/* Dataset reader, reading side (see dataset.h): sample datasets opened
 * lazily (independent metadata access, checked on first use, an LRU of open
 * handles), chunks whose only filter is Fletcher-32 fetched raw with
 * H5Dread_chunk, verified here and copied into the box (a small LRU of
 * verified chunks serves overlapping boxes), other layouts read through
 * H5Dread; box, sample and foreground-coordinate reads. It must not open or
 * close the dataset's files, read the index or make a collective call
 * outside ts_dataset_read_box_all (io/dataset.c owns the opening). */
#include "tsbuild.h"
#include "io/dataset_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *kind_name(int kind) { return kind ? "label" : "image"; }

/* ---------------- sample handles ---------------- */

void ts_ds_close_handles(ts_dataset *ds, int64_t i)
{
    ts_ds_sample *h = &ds->h[i];
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

static void evict_one(ts_dataset *ds)
{
    int64_t best = -1;
    uint64_t t = UINT64_MAX;
    for (int64_t i = 0; i < ds->n; i++) {
        const ts_ds_sample *h = &ds->h[i];
        if ((h->v[0].d >= 0 || h->v[1].d >= 0 || h->fg >= 0) && h->used < t) {
            t = h->used;
            best = i;
        }
    }
    if (best >= 0) ts_ds_close_handles(ds, best);
}

/* Opens and checks the image and label datasets of sample i (HDF5 lock held). */
static int open_sample(ts_dataset *ds, int64_t i)
{
    int err = 0;
    ts_ds_sample *h = &ds->h[i];
    h->used = ++ds->tick;
    if (h->v[0].d >= 0 && h->v[1].d >= 0) return 0;
    if (ds->nopen >= TS_DS_MAX_OPEN) evict_one(ds);
    const ts_ds_row *r = &ds->rows[i];
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
        ts_ds_vol *v = &h->v[k];
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
    if (err) ts_ds_close_handles(ds, i); /* a sample that failed its checks is not kept open */
    return err;
}

int ts_ds_check_sample(ts_dataset *ds, int64_t i)
{
    int err = 0;
    ts_h5_lock();
    err = open_sample(ds, i);
    if (!err && ds->rows[i].foreground > 0) {
        /* the foreground coordinates: int32 [nfg, 3] */
        const ts_ds_row *r = &ds->rows[i];
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
    ts_ds_vol *v = &ds->h[i].v[kind];
    const char *fname = ds->fnames[ds->rows[i].shard];
    if (cacheable) {
        for (int c = 0; c < ds->ncache; c++) {
            ts_ds_chunk *e = &ds->cache[c];
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
    ts_ds_chunk *slot = NULL;
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
            ts_ds_chunk *ne = realloc(ds->cache, (size_t)nc * sizeof *ne);
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
    ts_ds_vol *v = &ds->h[i].v[kind];
    const ts_ds_row *r = &ds->rows[i];
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
    const ts_ds_row *r = &ds->rows[i];
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
    const ts_ds_row *r = &ds->rows[i];
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
    const ts_ds_row *r = lerr ? NULL : &ds->rows[i];
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
    const ts_ds_row *r = &ds->rows[i];
    const char *fname = ds->fnames[r->shard];
    hid_t fs = -1, ms = -1;
    int32_t c3[3];
    ts_h5_lock();
    TS_CHECK(open_sample(ds, i));
    ts_ds_sample *h = &ds->h[i];
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
