/* HDF5 glue: error stack capture, the process-wide HDF5 lock, attribute
 * helpers and a block-wise Fletcher-32 identical to HDF5's; see h5.h. */
#define _GNU_SOURCE /* PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP */
#include "tsbuild.h"
#include "io/h5.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_mutex_t h5_mutex = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static pthread_once_t h5_once = PTHREAD_ONCE_INIT;

void ts_h5_lock(void) { pthread_mutex_lock(&h5_mutex); }
void ts_h5_unlock(void) { pthread_mutex_unlock(&h5_mutex); }

static void init_once(void)
{
    ts_h5_lock();
    H5open();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    ts_h5_unlock();
    const char *e = getenv("TESSERA_NO_MALLOC_TUNE");
    if (!e || !*e || !strcmp(e, "0")) {
        /* Chunk I/O allocates and frees buffers of a few MiB; above the default
         * mmap threshold each one is a fresh mapping whose pages fault in
         * again on every call, which on some VMs costs more than the I/O. */
        mallopt(M_MMAP_THRESHOLD, 64 << 20);
        mallopt(M_TRIM_THRESHOLD, 512 << 20);
    }
}

void ts_h5_init(void) { pthread_once(&h5_once, init_once); }

typedef struct {
    char *buf;
    size_t n, len;
    int count;
} walk_ctx;

static herr_t walk_cb(unsigned n, const H5E_error2_t *e, void *data)
{
    walk_ctx *w = data;
    if (w->count >= 4 || !e->desc || !*e->desc) return 0;
    /* skip a description identical to the previous one */
    if (w->len && strstr(w->buf, e->desc)) return 0;
    int k = snprintf(w->buf + w->len, w->n - w->len, "%s%s", w->len ? "; " : "", e->desc);
    if (k > 0) w->len += (size_t)k < w->n - w->len ? (size_t)k : w->n - w->len - 1;
    w->count++;
    return 0;
}

int ts_h5_err(const char *file, int line, const char *fmt, ...)
{
    char what[1024], stack[1024] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    walk_ctx w = {stack, sizeof stack, 0, 0};
    ts_h5_lock();
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_cb, &w);
    H5Eclear2(H5E_DEFAULT);
    ts_h5_unlock();
    if (stack[0]) return ts_err(TS_ERR_HDF5, file, line, "%s (HDF5: %s)", what, stack);
    return ts_err(TS_ERR_HDF5, file, line, "%s", what);
}

/* HDF5 folds the two sums every 360 words (so that sum2 cannot overflow).
 * Within a block, sum1 += S and sum2 += n*sum1 + T with S = sum of words and
 * T = sum of (n - i) * w_i: exact integer identities, so the result is
 * bit-identical while the inner loop vectorises. */
__attribute__((optimize("O3"))) static void fl_block(const uint8_t *p, uint32_t *s_out, uint32_t *t_out)
{
    uint32_t s = 0, t = 0;
    for (int i = 0; i < 360; i++) {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        uint32_t w = __builtin_bswap16(v);
        s += w;
        t += (uint32_t)(360 - i) * w;
    }
    *s_out = s;
    *t_out = t;
}

uint32_t ts_h5_fletcher32(const void *data_, size_t nbytes)
{
    const uint8_t *data = data_;
    size_t len = nbytes / 2;
    uint32_t sum1 = 0, sum2 = 0;
    while (len >= 360) {
        uint32_t s, t;
        fl_block(data, &s, &t);
        sum2 += 360u * sum1 + t;
        sum1 += s;
        data += 720;
        len -= 360;
        sum1 = (sum1 & 0xffff) + (sum1 >> 16);
        sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    }
    if (len) {
        for (size_t i = 0; i < len; i++) {
            sum1 += ((uint32_t)data[0] << 8) | data[1];
            data += 2;
            sum2 += sum1;
        }
        sum1 = (sum1 & 0xffff) + (sum1 >> 16);
        sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    }
    if (nbytes % 2) {
        sum1 += (uint32_t)data[0] << 8;
        sum2 += sum1;
        sum1 = (sum1 & 0xffff) + (sum1 >> 16);
        sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    }
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    return (sum2 << 16) | sum1;
}

/* ---- attributes ---- */

int ts_h5_attr_exists(hid_t obj, const char *name)
{
    ts_h5_lock();
    htri_t r = H5Aexists(obj, name);
    if (r < 0) H5Eclear2(H5E_DEFAULT);
    ts_h5_unlock();
    return r > 0;
}

static int write_attr(hid_t obj, const char *name, hid_t ftype, hid_t mtype, hid_t space, const void *buf)
{
    int err = 0;
    hid_t a = -1;
    ts_h5_lock();
    htri_t ex = H5Aexists(obj, name);
    if (ex > 0) TS_H5M(H5Adelete(obj, name), "cannot replace attribute %s", name);
    TS_H5M(a = H5Acreate2(obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT), "cannot create attribute %s", name);
    TS_H5M(H5Awrite(a, mtype, buf), "cannot write attribute %s", name);
cleanup:
    if (a >= 0) H5Aclose(a);
    ts_h5_unlock();
    return err;
}

static hid_t make_space(int ndim, const hsize_t *dims)
{
    return ndim == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(ndim, dims, NULL);
}

int ts_h5_write_attr_f64(hid_t obj, const char *name, int ndim, const hsize_t *dims, const double *v)
{
    int err = 0;
    ts_h5_lock();
    hid_t s = make_space(ndim, dims);
    if (s < 0) {
        err = ts_h5_err(__FILE__, __LINE__, "dataspace for attribute %s", name);
    } else {
        err = write_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, s, v);
        H5Sclose(s);
    }
    ts_h5_unlock();
    return err;
}

int ts_h5_write_attr_i64(hid_t obj, const char *name, int ndim, const hsize_t *dims, const int64_t *v)
{
    int err = 0;
    ts_h5_lock();
    hid_t s = make_space(ndim, dims);
    if (s < 0) {
        err = ts_h5_err(__FILE__, __LINE__, "dataspace for attribute %s", name);
    } else {
        err = write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, s, v);
        H5Sclose(s);
    }
    ts_h5_unlock();
    return err;
}

static hid_t vlen_str_type(void)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0) return t;
    if (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

/* ---- Guard for variable-length strings read from untrusted files ----
 * A variable-length string is stored as {length, global heap collection
 * address, object index}; reading it makes libhdf5 (1.10) copy the heap
 * object's recorded size into a buffer sized by the stored length, without
 * checking either against the collection: a corrupt file crashes the
 * process inside H5HG_read (found by tests/fuzz/fuzz_dataset). Before the
 * real H5Aread, the raw references are fetched through a conversion that
 * never touches the heap (vlen string -> RAW_REF, registered below), and
 * each referenced collection is read with pread and walked the way libhdf5
 * walks it; any inconsistency is a format error naming the file. */
#define RAW_REF 32 /* bytes per raw reference: 4 + sizeof_addr (<= 16) + 4 */

static int is_raw_ref_type(hid_t t)
{
    return H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) == 0 && H5Tget_size(t) == RAW_REF &&
           H5Tget_cset(t) == H5T_CSET_UTF8 && H5Tget_strpad(t) == H5T_STR_SPACEPAD;
}

/* H5T_conv_t: vlen string (disk form) -> RAW_REF bytes, heap untouched */
static herr_t conv_raw_ref(hid_t src, hid_t dst, H5T_cdata_t *cdata, size_t n, size_t buf_stride,
                           size_t bkg_stride, void *buf, void *bkg, hid_t dxpl)
{
    (void)bkg_stride, (void)bkg, (void)dxpl;
    if (cdata->command == H5T_CONV_INIT)
        return H5Tis_variable_str(src) > 0 && is_raw_ref_type(dst) ? 0 : -1;
    if (cdata->command != H5T_CONV_CONV) return 0;
    size_t ss = H5Tget_size(src);
    if (ss == 0 || ss > RAW_REF) return -1;
    size_t sst = buf_stride ? buf_stride : ss, dst_stride = buf_stride ? buf_stride : RAW_REF;
    uint8_t *b = buf;
    for (size_t i = n; i-- > 0;) { /* back to front: the elements grow in place */
        memmove(b + i * dst_stride, b + i * sst, ss);
        memset(b + i * dst_stride + ss, 0, RAW_REF - ss);
    }
    return 0;
}

static pthread_once_t raw_ref_once = PTHREAD_ONCE_INIT;
static int raw_ref_ok;

static void register_raw_ref(void)
{
    hid_t v = vlen_str_type(), r = H5Tcopy(H5T_C_S1);
    if (v >= 0 && r >= 0 && H5Tset_size(r, RAW_REF) >= 0 && H5Tset_cset(r, H5T_CSET_UTF8) >= 0 &&
        H5Tset_strpad(r, H5T_STR_SPACEPAD) >= 0 &&
        H5Tregister(H5T_PERS_SOFT, "tessera_vlen_raw_ref", v, r, conv_raw_ref) >= 0)
        raw_ref_ok = 1;
    if (v >= 0) H5Tclose(v);
    if (r >= 0) H5Tclose(r);
    H5Eclear2(H5E_DEFAULT);
}

static uint64_t get_le(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | p[i];
    return v;
}

/* Checks the global heap object `idx` of the collection at file offset
 * `off` holds exactly `len` bytes, walking the collection as libhdf5 does
 * (every object header inside it, no zero-length step). */
static int check_heap_object(int fd, uint64_t off, uint64_t eof, size_t ss, uint64_t idx, uint64_t len,
                             const char *fname, const char *name)
{
    int err = 0;
    uint8_t *c = NULL, hdr[24];
    size_t hs = 8 + ss, oh = 8 + ss; /* collection header; object header */
    if (off > eof || eof - off < hs || pread(fd, hdr, hs, (off_t)off) != (ssize_t)hs || memcmp(hdr, "GCOL", 4) ||
        hdr[4] != 1)
        TS_FAIL(TS_ERR_FORMAT, "%s: attribute '%s' points to no global heap collection (corrupt file)", fname,
                name);
    uint64_t size = get_le(hdr + 8, ss);
    if (size < hs || size > eof - off || size > (uint64_t)1 << 30)
        TS_FAIL(TS_ERR_FORMAT, "%s: attribute '%s': global heap collection of %llu bytes at %llu does not fit the "
                "file (corrupt file)", fname, name, (unsigned long long)size, (unsigned long long)off);
    c = malloc(size);
    if (!c) TS_FAIL(TS_ERR_NOMEM, "%s: global heap collection of %llu bytes", fname, (unsigned long long)size);
    if (pread(fd, c, size, (off_t)off) != (ssize_t)size)
        TS_FAIL(TS_ERR_IO, "%s: cannot read the global heap collection at %llu", fname, (unsigned long long)off);
    int found = 0;
    for (uint64_t p = hs; p < size;) {
        if (size - p < oh) break; /* trailing free space */
        uint64_t id = get_le(c + p, 2), osz = get_le(c + p + 8, ss), need;
        if (osz > size) goto bad;
        need = id ? oh + ((osz + 7) & ~(uint64_t)7) : osz;
        if (need < oh || need > size - p) goto bad;
        if (id == idx) {
            if (found || osz != len) goto bad;
            found = 1;
        }
        p += need;
    }
    if (!found) goto bad;
    goto cleanup;
bad:
    err = TS_ERR(TS_ERR_FORMAT, "%s: attribute '%s': object %llu of the global heap collection at %llu is "
                 "missing or inconsistent (corrupt file)", fname, name, (unsigned long long)idx,
                 (unsigned long long)off);
cleanup:
    free(c);
    return err;
}

/* Validates every heap reference of the vlen string attribute `a` (space
 * sp, n elements) of a file opened read-only. Files open for writing were
 * written by this process, and their heap may not be on disk yet. */
static int check_vlen_attr(hid_t obj, hid_t a, int n, const char *name)
{
    int err = 0, fd = -1;
    hid_t mt = -1, fcpl = -1, fid = -1;
    uint8_t *raw = NULL;
    char fname[4096] = "";
    unsigned intent = 0;
    pthread_once(&raw_ref_once, register_raw_ref);
    TS_H5(fid = H5Iget_file_id(obj));
    if (H5Fget_name(fid, fname, sizeof fname) < 0) snprintf(fname, sizeof fname, "(HDF5 file)");
    if (H5Fget_intent(fid, &intent) < 0 || intent != H5F_ACC_RDONLY || n == 0) goto cleanup;
    if (!raw_ref_ok) TS_FAIL(TS_ERR_FORMAT, "%s: attribute '%s': cannot validate a variable-length string", fname, name);
    size_t sa = 0, ss = 0;
    hsize_t ub = 0;
    TS_H5(fcpl = H5Fget_create_plist(fid));
    TS_H5(H5Pget_sizes(fcpl, &sa, &ss));
    TS_H5(H5Pget_userblock(fcpl, &ub));
    if (sa < 2 || sa > 8 || ss < 2 || ss > 8)
        TS_FAIL(TS_ERR_FORMAT, "%s: file addresses of %zu bytes and sizes of %zu are not supported", fname, sa, ss);
    TS_H5(mt = H5Tcopy(H5T_C_S1));
    TS_H5(H5Tset_size(mt, RAW_REF));
    TS_H5(H5Tset_cset(mt, H5T_CSET_UTF8));
    TS_H5(H5Tset_strpad(mt, H5T_STR_SPACEPAD));
    raw = calloc((size_t)n, RAW_REF);
    if (!raw) TS_FAIL(TS_ERR_NOMEM, "attribute %s", name);
    TS_H5M(H5Aread(a, mt, raw), "%s: cannot read attribute '%s'", fname, name);
    fd = open(fname, O_RDONLY);
    if (fd < 0) TS_FAIL(TS_ERR_IO, "%s: cannot open to validate attribute '%s': %s", fname, name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) TS_FAIL(TS_ERR_IO, "%s: %s", fname, strerror(errno));
    for (int i = 0; i < n && !err; i++) {
        const uint8_t *r = raw + (size_t)i * RAW_REF;
        uint64_t len = get_le(r, 4), addr = get_le(r + 4, sa), idx = get_le(r + 4 + sa, 4);
        if (len == 0) continue; /* empty string: no heap object */
        if (addr > UINT64_MAX - ub)
            TS_FAIL(TS_ERR_FORMAT, "%s: attribute '%s': bad heap address (corrupt file)", fname, name);
        err = check_heap_object(fd, addr + ub, (uint64_t)st.st_size, ss, idx, len, fname, name);
    }
cleanup:
    if (fd >= 0) close(fd);
    free(raw);
    if (mt >= 0) H5Tclose(mt);
    if (fcpl >= 0) H5Pclose(fcpl);
    if (fid >= 0) H5Fclose(fid);
    return err;
}

int ts_h5_write_attr_str(hid_t obj, const char *name, const char *s)
{
    return ts_h5_write_attr_strs(obj, name, -1, &s);
}

/* n < 0: one scalar string; otherwise a 1-D array of n strings */
int ts_h5_write_attr_strs(hid_t obj, const char *name, int n, const char *const *s)
{
    int err = 0;
    hid_t t = -1, sp = -1;
    ts_h5_lock();
    hsize_t d = n < 0 ? 1 : (hsize_t)n;
    TS_H5(t = vlen_str_type());
    TS_H5(sp = n < 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &d, NULL));
    err = write_attr(obj, name, t, t, sp, s);
cleanup:
    if (t >= 0) H5Tclose(t);
    if (sp >= 0) H5Sclose(sp);
    ts_h5_unlock();
    return err;
}

static int read_attr_num(hid_t obj, const char *name, int64_t n, hid_t mtype, void *v, const char *where)
{
    int err = 0;
    hid_t a = -1, sp = -1, t = -1;
    ts_h5_lock();
    htri_t ex = H5Aexists(obj, name);
    if (ex <= 0) {
        H5Eclear2(H5E_DEFAULT);
        TS_FAIL(TS_ERR_FORMAT, "%s: attribute '%s' is missing", where, name);
    }
    TS_H5M(a = H5Aopen(obj, name, H5P_DEFAULT), "%s: cannot open attribute '%s'", where, name);
    TS_H5M(sp = H5Aget_space(a), "%s: attribute '%s'", where, name);
    TS_H5M(t = H5Aget_type(a), "%s: attribute '%s'", where, name);
    H5T_class_t cls = H5Tget_class(t);
    if (cls != H5T_INTEGER && cls != H5T_FLOAT)
        TS_FAIL(TS_ERR_FORMAT, "%s: attribute '%s' is not numeric", where, name);
    hssize_t np = H5Sget_simple_extent_npoints(sp);
    if (np != n)
        TS_FAIL(TS_ERR_FORMAT, "%s: attribute '%s' holds %lld values, expected %lld", where, name, (long long)np,
                (long long)n);
    TS_H5M(H5Aread(a, mtype, v), "%s: cannot read attribute '%s'", where, name);
cleanup:
    if (t >= 0) H5Tclose(t);
    if (sp >= 0) H5Sclose(sp);
    if (a >= 0) H5Aclose(a);
    ts_h5_unlock();
    return err;
}

int ts_h5_read_attr_f64(hid_t obj, const char *name, int64_t n, double *v, const char *where)
{
    return read_attr_num(obj, name, n, H5T_NATIVE_DOUBLE, v, where);
}

int ts_h5_read_attr_i64(hid_t obj, const char *name, int64_t n, int64_t *v, const char *where)
{
    return read_attr_num(obj, name, n, H5T_NATIVE_INT64, v, where);
}

void ts_h5_free_strs(int n, char **s)
{
    if (!s) return;
    for (int i = 0; i < n; i++) free(s[i]);
    free(s);
}

int ts_h5_read_attr_strs(hid_t obj, const char *name, int *n_out, char ***out, const char *where)
{
    int err = 0, n = 0;
    hid_t a = -1, sp = -1, t = -1, mt = -1;
    char **res = NULL, **raw = NULL;
    char *fixed = NULL;
    ts_h5_lock();
    htri_t ex = H5Aexists(obj, name);
    if (ex <= 0) {
        H5Eclear2(H5E_DEFAULT);
        TS_FAIL(TS_ERR_FORMAT, "%s: attribute '%s' is missing", where, name);
    }
    TS_H5M(a = H5Aopen(obj, name, H5P_DEFAULT), "%s: cannot open attribute '%s'", where, name);
    TS_H5M(sp = H5Aget_space(a), "%s: attribute '%s'", where, name);
    TS_H5M(t = H5Aget_type(a), "%s: attribute '%s'", where, name);
    if (H5Tget_class(t) != H5T_STRING) TS_FAIL(TS_ERR_FORMAT, "%s: attribute '%s' is not a string", where, name);
    hssize_t np = H5Sget_simple_extent_npoints(sp);
    if (np < 0 || np > 1 << 20) TS_FAIL(TS_ERR_FORMAT, "%s: attribute '%s' has a bad size", where, name);
    n = (int)np;
    res = TS_CALLOC((size_t)n + 1, sizeof *res);
    if (!res) TS_FAIL(TS_ERR_NOMEM, "attribute %s", name);
    htri_t var = H5Tis_variable_str(t);
    if (var > 0) {
        TS_CHECK(check_vlen_attr(obj, a, n, name));
        TS_H5(mt = vlen_str_type());
        raw = TS_CALLOC((size_t)n + 1, sizeof *raw);
        if (!raw) TS_FAIL(TS_ERR_NOMEM, "attribute %s", name);
        TS_H5M(H5Aread(a, mt, raw), "%s: cannot read attribute '%s'", where, name);
        for (int i = 0; i < n; i++) {
            res[i] = strdup(raw[i] ? raw[i] : "");
            if (!res[i]) TS_FAIL(TS_ERR_NOMEM, "attribute %s", name);
        }
        H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, raw);
    } else {
        size_t sz = H5Tget_size(t);
        TS_H5(mt = H5Tcopy(H5T_C_S1));
        TS_H5(H5Tset_size(mt, sz));
        fixed = TS_CALLOC((size_t)n + 1, sz + 1);
        if (!fixed) TS_FAIL(TS_ERR_NOMEM, "attribute %s", name);
        TS_H5M(H5Aread(a, mt, fixed), "%s: cannot read attribute '%s'", where, name);
        for (int i = 0; i < n; i++) {
            res[i] = TS_CALLOC(1, sz + 1);
            if (!res[i]) TS_FAIL(TS_ERR_NOMEM, "attribute %s", name);
            memcpy(res[i], fixed + (size_t)i * sz, sz);
        }
    }
    *n_out = n;
    *out = res;
    res = NULL;
cleanup:
    ts_h5_free_strs(n, res);
    free(raw);
    free(fixed);
    if (mt >= 0) H5Tclose(mt);
    if (t >= 0) H5Tclose(t);
    if (sp >= 0) H5Sclose(sp);
    if (a >= 0) H5Aclose(a);
    ts_h5_unlock();
    return err;
}

int ts_h5_read_attr_str(hid_t obj, const char *name, char *buf, size_t n, const char *where)
{
    int cnt = 0;
    char **s = NULL;
    int err = ts_h5_read_attr_strs(obj, name, &cnt, &s, where);
    if (err) return err;
    if (cnt != 1) {
        ts_h5_free_strs(cnt, s);
        return TS_ERR(TS_ERR_FORMAT, "%s: attribute '%s' holds %d strings, expected one", where, name, cnt);
    }
    snprintf(buf, n, "%s", s[0]);
    ts_h5_free_strs(cnt, s);
    return 0;
}
