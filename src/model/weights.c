/* Weights files and the dataset helpers of `tessera model` (see weights.h).
 * Owns the weights file's layout (/params/<name>, PyTorch's shapes), read
 * and written with serial HDF5 by one process; no MPI. Checkpoints are
 * io/checkpoint.c's. */
#include "tsbuild.h"
#include "src/model/weights.h"
#include "src/core/error.h"

#include <stdlib.h>
#include <string.h>

#define H5W_CHECK(call, ...)                                       \
    do {                                                           \
        if ((call) < 0) {                                          \
            err = TS_ERR(TS_ERR_HDF5, __VA_ARGS__);                \
            goto cleanup;                                          \
        }                                                          \
    } while (0)

static void quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

int ts_weights_open(const char *path, hid_t *file)
{
    quiet();
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return TS_ERR(TS_ERR_IO, "%s: cannot open as HDF5", path);
    *file = f;
    return 0;
}

int ts_weights_create(const char *path, hid_t *file)
{
    quiet();
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return TS_ERR(TS_ERR_IO, "%s: cannot create HDF5 file", path);
    *file = f;
    return 0;
}

int ts_weights_exists(hid_t file, const char *name)
{
    /* check each prefix: H5Lexists fails on a missing intermediate group */
    char buf[512];
    snprintf(buf, sizeof buf, "%s", name);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (H5Lexists(file, buf, H5P_DEFAULT) <= 0) return 0;
            if (!c) break;
            *p = c;
        }
    }
    return 1;
}

static hid_t h5type(ts_dtype d)
{
    switch (d) {
    case TS_FLOAT32: return H5T_NATIVE_FLOAT;
    case TS_FLOAT64: return H5T_NATIVE_DOUBLE;
    case TS_INT64: return H5T_NATIVE_INT64;
    case TS_INT32: return H5T_NATIVE_INT32;
    case TS_UINT8: return H5T_NATIVE_UINT8;
    default: return -1;
    }
}

int ts_weights_write_dataset(hid_t file, const char *path, const char *name, const ts_tensor *t)
{
    int err = 0;
    hid_t sp = -1, ds = -1, type = h5type(t->dtype);
    hsize_t dims[TS_MAX_DIMS];
    if (type < 0) return TS_ERR(TS_ERR_ARG, "%s: %s: cannot write %s", path, name, ts_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim; i++) dims[i] = (hsize_t)t->shape[i];
    sp = t->ndim ? H5Screate_simple(t->ndim, dims, NULL) : H5Screate(H5S_SCALAR);
    H5W_CHECK(sp, "%s: %s: dataspace", path, name);
    ds = H5Dcreate2(file, name, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5W_CHECK(ds, "%s: cannot create dataset %s", path, name);
    H5W_CHECK(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data), "%s: cannot write dataset %s", path, name);
cleanup:
    if (ds >= 0) H5Dclose(ds);
    if (sp >= 0) H5Sclose(sp);
    return err;
}

int ts_weights_read_dataset(hid_t file, const char *path, const char *name, ts_dtype want, int ndim, ts_tensor *out)
{
    int err = 0;
    hid_t ds = -1, sp = -1, ty = -1;
    hsize_t dims[TS_MAX_DIMS];
    memset(out, 0, sizeof *out);
    if (!ts_weights_exists(file, name)) return TS_ERR(TS_ERR_FORMAT, "%s: dataset %s is missing", path, name);
    ds = H5Dopen2(file, name, H5P_DEFAULT);
    H5W_CHECK(ds, "%s: %s is not a dataset", path, name);
    ty = H5Dget_type(ds);
    H5W_CHECK(ty, "%s: %s: type", path, name);
    H5T_class_t cl = H5Tget_class(ty);
    if (cl != H5T_FLOAT && cl != H5T_INTEGER)
        TS_FAIL(TS_ERR_FORMAT, "%s: dataset %s is not numeric", path, name);
    sp = H5Dget_space(ds);
    H5W_CHECK(sp, "%s: %s: dataspace", path, name);
    int nd = H5Sget_simple_extent_ndims(sp);
    if (nd < 0 || nd > TS_MAX_DIMS) TS_FAIL(TS_ERR_FORMAT, "%s: dataset %s has %d dims", path, name, nd);
    if (ndim >= 0 && nd != ndim) TS_FAIL(TS_ERR_FORMAT, "%s: dataset %s has %d dims, expected %d", path, name, nd, ndim);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    int64_t shape[TS_MAX_DIMS];
    for (int i = 0; i < nd; i++) shape[i] = (int64_t)dims[i];
    TS_CHECK(ts_tensor_alloc(out, want, nd, shape));
    H5W_CHECK(H5Dread(ds, h5type(want), H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data), "%s: cannot read dataset %s as %s",
              path, name, ts_dtype_name(want));
cleanup:
    if (err) ts_tensor_free(out);
    if (sp >= 0) H5Sclose(sp);
    if (ty >= 0) H5Tclose(ty);
    if (ds >= 0) H5Dclose(ds);
    return err;
}

int ts_weights_put(hid_t file, const char *path, const ts_arena *a)
{
    int err = 0;
    hid_t g = -1;
    if (!ts_weights_exists(file, "/params")) {
        g = H5Gcreate2(file, "/params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5W_CHECK(g, "%s: cannot create group /params", path);
    }
    for (int i = 0; i < a->n; i++) {
        char name[TS_PARAM_NAME_MAX + 16];
        snprintf(name, sizeof name, "/params/%s", a->p[i].name);
        ts_tensor t = ts_arena_value(a, i);
        TS_CHECK(ts_weights_write_dataset(file, path, name, &t));
    }
cleanup:
    if (g >= 0) H5Gclose(g);
    return err;
}

int ts_weights_save(const ts_arena *a, const char *path)
{
    hid_t f;
    TS_TRY(ts_weights_create(path, &f));
    int err = ts_weights_put(f, path, a);
    if (H5Fclose(f) < 0 && !err) err = TS_ERR(TS_ERR_IO, "%s: closing failed", path);
    return err;
}

typedef struct {
    const ts_arena *a;
    char bad[256];
} iter_ctx;

static herr_t find_unknown(hid_t g, const char *name, const H5L_info_t *info, void *data)
{
    iter_ctx *c = data;
    if (ts_arena_find(c->a, name) < 0) {
        snprintf(c->bad, sizeof c->bad, "%s", name);
        return 1;
    }
    return 0;
}

int ts_weights_load(ts_arena *a, const char *path)
{
    int err = 0;
    hid_t f = -1, g = -1;
    ts_tensor t = {0};
    TS_CHECK(ts_weights_open(path, &f));
    if (!ts_weights_exists(f, "/params")) TS_FAIL(TS_ERR_FORMAT, "%s: no group /params (not a weights file)", path);
    for (int i = 0; i < a->n; i++) {
        const ts_param *p = &a->p[i];
        char name[TS_PARAM_NAME_MAX + 16];
        snprintf(name, sizeof name, "/params/%s", p->name);
        if (p->dtype == TS_INT64 && !ts_weights_exists(f, name)) {
            ts_tensor v = ts_arena_value(a, i);
            *(int64_t *)v.data = 0;
            continue;
        }
        TS_CHECK(ts_weights_read_dataset(f, path, name, p->dtype, -1, &t));
        ts_tensor v = ts_arena_value(a, i);
        /* PyTorch may store num_batches_tracked as a scalar or as shape [] / [1] */
        int ok = ts_tensor_same_shape(&t, &v) || (p->ndim == 0 && ts_tensor_numel(&t) == 1);
        if (!ok) {
            char got[96], want[96];
            TS_FAIL(TS_ERR_FORMAT, "%s: dataset %s has shape %s, the model (config) needs %s", path, name,
                    ts_tensor_shape_str(&t, got, sizeof got), ts_tensor_shape_str(&v, want, sizeof want));
        }
        memcpy(v.data, t.data, ts_tensor_bytes(&v));
        ts_tensor_free(&t);
    }
    {
        iter_ctx c = {a, ""};
        g = H5Gopen2(f, "/params", H5P_DEFAULT);
        H5W_CHECK(g, "%s: cannot open /params", path);
        hsize_t idx = 0;
        herr_t r = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, find_unknown, &c);
        if (r > 0)
            TS_FAIL(TS_ERR_FORMAT, "%s: dataset /params/%s is not a parameter of this model (check model.channels and model.norm)",
                    path, c.bad);
        H5W_CHECK(r, "%s: cannot list /params", path);
    }
cleanup:
    ts_tensor_free(&t);
    if (g >= 0) H5Gclose(g);
    if (f >= 0) H5Fclose(f);
    return err;
}
