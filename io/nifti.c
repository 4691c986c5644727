/* NIfTI reading and writing; see nifti.h. niftilib parses the header (both
 * versions, byte order, qform/sform); the voxels are read here with zlib so
 * that every byte is accounted for. */
#include "tsbuild.h"
#include "io/nifti.h"
#include "src/core/error.h"
#include "src/core/path.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <nifti2_io.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

_Static_assert(TS_NIFTI_UINT8 == NIFTI_TYPE_UINT8 && TS_NIFTI_INT16 == NIFTI_TYPE_INT16 &&
                   TS_NIFTI_FLOAT32 == NIFTI_TYPE_FLOAT32,
               "io/nifti.h: TS_NIFTI_* are NIfTI's datatype codes");

static uint32_t bswap32(uint32_t x) { return __builtin_bswap32(x); }

static int supported(int dt)
{
    switch (dt) {
    case NIFTI_TYPE_UINT8: case NIFTI_TYPE_INT8: case NIFTI_TYPE_INT16: case NIFTI_TYPE_UINT16:
    case NIFTI_TYPE_INT32: case NIFTI_TYPE_UINT32: case NIFTI_TYPE_INT64: case NIFTI_TYPE_UINT64:
    case NIFTI_TYPE_FLOAT32: case NIFTI_TYPE_FLOAT64:
        return 1;
    default:
        return 0;
    }
}

/* Recognises a NIfTI header before niftilib sees it: its own error for a
 * garbage header is a line on stderr. Reads the first bytes through zlib
 * (plain files pass through unchanged). */
static int precheck(const char *path, int *version, double *vox_offset)
{
    unsigned char h[544];
    gzFile f = gzopen(path, "rb");
    if (!f) return TS_ERR(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
    int got = gzread(f, h, sizeof h);
    int zerr = 0;
    const char *zmsg = gzerror(f, &zerr);
    char zm[256];
    snprintf(zm, sizeof zm, "%s", zmsg ? zmsg : "");
    gzclose(f);
    if (got < 0 || (zerr != Z_OK && zerr != Z_BUF_ERROR))
        return TS_ERR(TS_ERR_FORMAT, "%s: cannot read the header (%s)", path, zm);
    if (got < 4) return TS_ERR(TS_ERR_FORMAT, "%s: not a NIfTI file: only %d bytes", path, got);
    uint32_t sz;
    memcpy(&sz, h, 4);
    if (sz != 348 && bswap32(sz) != 348 && sz != 540 && bswap32(sz) != 540)
        return TS_ERR(TS_ERR_FORMAT, "%s: not a NIfTI file (header size field is %u, expected 348 or 540)", path,
                      (unsigned)sz);
    int v = (sz == 348 || bswap32(sz) == 348) ? 1 : 2;
    int need = v == 1 ? 348 : 540;
    if (got < need) return TS_ERR(TS_ERR_FORMAT, "%s: truncated header (%d of %d bytes)", path, got, need);
    const char *magic = v == 1 ? (const char *)h + 344 : (const char *)h + 4;
    if (v == 1 && strcmp(magic, "n+1") && strcmp(magic, "ni1"))
        return TS_ERR(TS_ERR_FORMAT, "%s: NIfTI-1 magic is not 'n+1' or 'ni1' (ANALYZE 7.5 is not supported)", path);
    if (v == 2 && strncmp(magic, "n+2", 3) && strncmp(magic, "ni2", 3))
        return TS_ERR(TS_ERR_FORMAT, "%s: NIfTI-2 magic is not 'n+2' or 'ni2'", path);
    const int swap = v == 1 ? sz != 348 : sz != 540;
    /* dim[0] must be 1..7 before niftilib sees it: libnifti2 3.0.1 loops
     * up to dim[0] over the 8-element dim array (a crash on dim[0] = 2^40) */
    int64_t dim0;
    if (v == 1) {
        uint16_t u;
        memcpy(&u, h + 40, 2);
        dim0 = (int16_t)(swap ? __builtin_bswap16(u) : u);
    } else {
        uint64_t u;
        memcpy(&u, h + 16, 8);
        dim0 = (int64_t)(swap ? __builtin_bswap64(u) : u);
    }
    if (dim0 < 1 || dim0 > 7)
        return TS_ERR(TS_ERR_FORMAT, "%s: dim[0] (the number of dimensions) is %lld, not 1..7", path, (long long)dim0);
    /* every used dimension >= 1 (niftilib turns 0 and negative sizes into 1) */
    for (int64_t k = 1; k <= dim0; k++) {
        int64_t dk;
        if (v == 1) {
            uint16_t u;
            memcpy(&u, h + 40 + 2 * k, 2);
            dk = (int16_t)(swap ? __builtin_bswap16(u) : u);
        } else {
            uint64_t u;
            memcpy(&u, h + 16 + 8 * k, 8);
            dk = (int64_t)(swap ? __builtin_bswap64(u) : u);
        }
        if (dk < 1)
            return TS_ERR(TS_ERR_FORMAT, "%s: dim[%lld] is %lld: every dimension up to dim[0] = %lld must be >= 1", path,
                          (long long)k, (long long)dk, (long long)dim0);
    }
    /* the voxel type, before niftilib prints its own complaint */
    uint16_t dtu;
    memcpy(&dtu, h + (v == 1 ? 70 : 12), 2);
    const int dt = (int16_t)(swap ? __builtin_bswap16(dtu) : dtu);
    if (!supported(dt))
        return TS_ERR(TS_ERR_FORMAT, "%s: voxel type %s (%d) is not supported (integer or float scalars only)", path,
                      nifti_datatype_string(dt), dt);
    /* vox_offset as the header holds it (niftilib replaces an offset inside
     * the header, a huge one and NaN by 348 without a word) */
    if (v == 1) {
        uint32_t u;
        memcpy(&u, h + 108, 4);
        if (swap) u = bswap32(u);
        float fo;
        memcpy(&fo, &u, 4);
        *vox_offset = fo;
    } else {
        uint64_t u;
        memcpy(&u, h + 168, 8);
        if (swap) u = __builtin_bswap64(u);
        *vox_offset = (double)(int64_t)u;
    }
    *version = v;
    return 0;
}

/* Bytes in a file as zlib reads it (decompressed for gzip), or -1. */
static int64_t data_length(const char *path)
{
    gzFile f = gzopen(path, "rb");
    if (!f) return -1;
    char buf[1 << 16];
    int64_t n = 0;
    int got;
    while ((got = gzread(f, buf, sizeof buf)) > 0) n += got;
    gzclose(f);
    return got < 0 ? -1 : n;
}

/* the header's fields into n: type, dimensions, spacing, scaling, transforms; *bytes = the voxel bytes */
static int header_fields(const char *path, const nifti_image *nim, int version, ts_nifti *n, int64_t *bytes_out)
{
    int err = 0;
    n->version = version;
    n->datatype = nim->datatype;
    if (!supported(nim->datatype))
        TS_FAIL(TS_ERR_FORMAT, "%s: voxel type %s (%d) is not supported (integer or float scalars only)", path,
                nifti_datatype_string(nim->datatype), nim->datatype);
    /* dims beyond ndim are 1 whatever the header holds (often 0) */
    const int64_t ndim = nim->dim[0];
    const int64_t nx = nim->nx, ny = ndim >= 2 ? nim->ny : 1, nz = ndim >= 3 ? nim->nz : 1,
                  nt = ndim >= 4 ? nim->nt : 1;
    if (ndim < 2 || ndim > 7 || nx < 1 || ny < 1 || nz < 1 || nt < 1)
        TS_FAIL(TS_ERR_FORMAT, "%s: bad dimensions (ndim %lld: %lld x %lld x %lld x %lld)", path, (long long)ndim,
                (long long)nx, (long long)ny, (long long)nz, (long long)nt);
    if ((ndim >= 5 && nim->nu > 1) || (ndim >= 6 && nim->nv > 1) || (ndim >= 7 && nim->nw > 1))
        TS_FAIL(TS_ERR_FORMAT, "%s: %lld-D image (dims 5-7 are %lld, %lld, %lld): only 3-D volumes and 4-D volumes "
                "with channels along t are supported", path, (long long)nim->ndim, (long long)nim->nu,
                (long long)nim->nv, (long long)nim->nw);
    n->dim[0] = nx;
    n->dim[1] = ny;
    n->dim[2] = nz;
    n->dim[3] = nt;
    n->pixdim[0] = fabs(nim->dx);
    n->pixdim[1] = fabs(nim->dy);
    n->pixdim[2] = fabs(nim->dz);
    n->pixdim[3] = fabs(nim->dt);
    for (int k = 0; k < 3; k++)
        if (!(n->pixdim[k] > 0) || !isfinite(n->pixdim[k])) n->pixdim[k] = 1.0;
    n->scl_slope = nim->scl_slope;
    n->scl_inter = nim->scl_inter;
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) {
            n->sform[4 * r + c] = nim->sto_xyz.m[r][c];
            n->qform[4 * r + c] = nim->qto_xyz.m[r][c];
        }
    n->sform_code = nim->sform_code;
    n->qform_code = nim->qform_code;
    n->nbyper = nim->nbyper;
    int64_t bytes = 0;
    if (__builtin_mul_overflow(nx, ny, &n->nvox) || __builtin_mul_overflow(n->nvox, nz, &n->nvox) ||
        __builtin_mul_overflow(n->nvox, nt, &n->nvox) || n->nbyper < 1 ||
        __builtin_mul_overflow(n->nvox, (int64_t)n->nbyper, &bytes) || bytes > ((int64_t)1 << 40))
        TS_FAIL(TS_ERR_FORMAT, "%s: %lld x %lld x %lld x %lld voxels of %d bytes is too large (at most 1 TiB)", path,
                (long long)nx, (long long)ny, (long long)nz, (long long)nt, n->nbyper);
    if (n->nvox != nim->nvox)
        TS_FAIL(TS_ERR_FORMAT, "%s: voxel count %lld does not match the dimensions", path, (long long)nim->nvox);
    *bytes_out = bytes;
cleanup:
    return err;
}

/* read on to the end of a gzip stream so that its CRC and length are checked; bytes after the voxels mean the
 * header's size or offset does not describe this file */
static int check_tail(gzFile f, const char *iname, const ts_nifti *n, int64_t off, int64_t bytes)
{
    int err = 0;
    /* read on to the end of a gzip stream so that its CRC and length
     * are checked; bytes after the voxels mean the header's size or
     * offset does not describe this file */
    char tail[4096];
    int got;
    int64_t extra = 0;
    while ((got = gzread(f, tail, sizeof tail)) > 0) extra += got;
    int ze = Z_OK;
    const char *zm = gzerror(f, &ze);
    if (got < 0 || (ze != Z_OK && ze != Z_STREAM_END))
        TS_FAIL(TS_ERR_FORMAT, "%s: the compressed stream is damaged or truncated (%s)", iname, zm);
    if (extra > 0)
        TS_FAIL(TS_ERR_FORMAT, "%s: %lld bytes follow the voxel data (vox_offset %lld + %lld x %lld x %lld x %lld "
                "voxels of %d bytes = %lld bytes, the file holds %lld): the header does not match the file", iname,
                (long long)extra, (long long)off, (long long)n->dim[0], (long long)n->dim[1], (long long)n->dim[2],
                (long long)n->dim[3], n->nbyper, (long long)(off + bytes), (long long)(off + bytes + extra));
cleanup:
    return err;
}

/* the voxels: count them ourselves (niftilib zero-fills a short file); the buffer grows with the bytes actually
 * read, so that a header alone cannot make the reader allocate what the file does not hold */
static int read_voxels(const char *path, const nifti_image *nim, int version, double hoff, int64_t bytes, ts_nifti *n,
                       gzFile *fp)
{
    int err = 0;
    gzFile f = NULL;
    /* the buffer grows with the bytes actually read: a header alone cannot
     * make the reader allocate what the file does not hold */
    int64_t cap = bytes < ((int64_t)64 << 20) ? bytes : ((int64_t)64 << 20);
    n->data = malloc((size_t)(cap ? cap : 1));
    if (!n->data) TS_FAIL(TS_ERR_NOMEM, "%s: %lld bytes of voxels", path, (long long)cap);

    /* the voxels: count them ourselves (niftilib zero-fills a short file) */
    const char *iname = nim->iname ? nim->iname : path;
    errno = 0;
    f = *fp = gzopen(iname, "rb");
    if (!f) TS_FAIL(TS_ERR_IO, "%s: cannot open %s: %s", path, iname, strerror(errno ? errno : ENOENT));
    gzbuffer(f, 1 << 18);
    /* the header's vox_offset, exactly: inside the file, after the header
     * (and the 4-byte extension flag) of a single file, a whole number */
    const int single = strcmp(iname, path) == 0;
    const double minoff = single ? (version == 1 ? 352 : 544) : 0;
    if (!isfinite(hoff) || hoff != floor(hoff) || hoff < minoff || hoff > 9.0e15)
        TS_FAIL(TS_ERR_FORMAT, "%s: the header's vox_offset %g is not a byte offset %s%.0f", path, hoff,
                single ? "after the header: at least " : ">= ", minoff);
    int64_t off = nim->iname_offset;
    if (off != (int64_t)hoff)
        TS_FAIL(TS_ERR_FORMAT, "%s: the header's vox_offset %.0f is not where niftilib would read the voxels (%lld)", path,
                hoff, (long long)off);
    if (off > 0 && gzseek(f, (z_off_t)off, SEEK_SET) != (z_off_t)off)
        TS_FAIL(TS_ERR_FORMAT, "%s: truncated: the voxel data should start at byte %lld (vox_offset)", iname,
                (long long)off);
    int64_t done = 0;
    while (done < bytes) {
        if (done == cap) {
            int64_t ncap = cap > bytes / 2 ? bytes : 2 * cap;
            void *grown = realloc(n->data, (size_t)ncap);
            if (!grown) TS_FAIL(TS_ERR_NOMEM, "%s: %lld bytes of voxels", path, (long long)ncap);
            n->data = grown;
            cap = ncap;
        }
        int64_t want = cap - done > (1 << 30) ? (1 << 30) : cap - done;
        int got = gzread(f, (char *)n->data + done, (unsigned)want);
        if (got < 0) {
            int ze;
            const char *zm = gzerror(f, &ze);
            TS_FAIL(TS_ERR_FORMAT, "%s: corrupt compressed data after %lld of %lld voxel bytes (%s)", iname,
                    (long long)done, (long long)bytes, zm);
        }
        if (got == 0) break;
        done += got;
    }
    if (done < bytes) {
        const int64_t len = data_length(iname);
        if (len >= 0 && len <= off)
            TS_FAIL(TS_ERR_FORMAT, "%s: vox_offset %lld lies beyond the end of the file (%lld bytes%s): the header does "
                    "not match the file", iname, (long long)off, (long long)len, len == off ? ", no voxel data" : "");
        TS_FAIL(TS_ERR_FORMAT, "%s: truncated: %lld x %lld x %lld x %lld voxels of %d bytes need %lld bytes after "
                "offset %lld, the file holds %lld", iname, (long long)n->dim[0], (long long)n->dim[1],
                (long long)n->dim[2], (long long)n->dim[3], n->nbyper, (long long)bytes, (long long)off,
                (long long)done);
    }
    TS_CHECK(check_tail(f, iname, n, off, bytes));
cleanup:
    return err;
}

int ts_nifti_read(const char *path, ts_nifti **out)
{
    int err = 0, version = 0;
    double hoff = 0;
    nifti_image *nim = NULL;
    ts_nifti *n = NULL;
    gzFile f = NULL;
    int64_t bytes = 0;
    *out = NULL;
    TS_TRY(precheck(path, &version, &hoff));
    nifti_set_debug_level(0);
    nim = nifti_image_read(path, 0);
    if (!nim) return TS_ERR(TS_ERR_FORMAT, "%s: niftilib cannot read this NIfTI-%d header", path, version);
    n = TS_CALLOC(1, sizeof *n);
    if (!n) TS_FAIL(TS_ERR_NOMEM, "nifti");
    n->path = strdup(path);
    if (!n->path) TS_FAIL(TS_ERR_NOMEM, "%s", path);
    TS_CHECK(header_fields(path, nim, version, n, &bytes));
    TS_CHECK(read_voxels(path, nim, version, hoff, bytes, n, &f));
    if (nim->byteorder != nifti_short_order() && nim->swapsize > 1)
        nifti_swap_Nbytes(n->nvox, nim->swapsize, n->data);
    *out = n;
    n = NULL;
cleanup:
    if (f) gzclose(f);
    if (nim) nifti_image_free(nim);
    ts_nifti_free(&n);
    return err;
}

void ts_nifti_free(ts_nifti **n)
{
    if (!n || !*n) return;
    free((*n)->data);
    free((*n)->path);
    free(*n);
    *n = NULL;
}

static inline double raw(const ts_nifti *n, int64_t v)
{
    const void *d = n->data;
    switch (n->datatype) {
    case NIFTI_TYPE_UINT8: return ((const uint8_t *)d)[v];
    case NIFTI_TYPE_INT8: return ((const int8_t *)d)[v];
    case NIFTI_TYPE_INT16: return ((const int16_t *)d)[v];
    case NIFTI_TYPE_UINT16: return ((const uint16_t *)d)[v];
    case NIFTI_TYPE_INT32: return ((const int32_t *)d)[v];
    case NIFTI_TYPE_UINT32: return ((const uint32_t *)d)[v];
    case NIFTI_TYPE_INT64: return (double)((const int64_t *)d)[v];
    case NIFTI_TYPE_UINT64: return (double)((const uint64_t *)d)[v];
    case NIFTI_TYPE_FLOAT32: return ((const float *)d)[v];
    case NIFTI_TYPE_FLOAT64: return ((const double *)d)[v];
    default: return NAN;
    }
}

static int scaled(const ts_nifti *n) { return isfinite(n->scl_slope) && n->scl_slope != 0.0; }

double ts_nifti_get(const ts_nifti *n, int64_t v)
{
    double x = raw(n, v);
    if (scaled(n)) x = x * n->scl_slope + (isfinite(n->scl_inter) ? n->scl_inter : 0.0);
    return x;
}

int ts_nifti_to_float(const ts_nifti *n, float *out) { return ts_nifti_to_float_replace(n, out, NULL, NULL); }

int ts_nifti_to_float_replace(const ts_nifti *n, float *out, const float *replace, int64_t *replaced)
{
    const int sc = scaled(n);
    if (replaced) *replaced = 0;
    const double a = sc ? n->scl_slope : 1.0, b = sc && isfinite(n->scl_inter) ? n->scl_inter : 0.0;
    if (n->datatype == NIFTI_TYPE_UINT8 && !sc) {
        const uint8_t *d = n->data;
        for (int64_t v = 0; v < n->nvox; v++) out[v] = d[v];
        return 0;
    }
    if (n->datatype == NIFTI_TYPE_INT16 && !sc) {
        const int16_t *d = n->data;
        for (int64_t v = 0; v < n->nvox; v++) out[v] = d[v];
        return 0;
    }
    int64_t bad = 0, first = -1;
    double first_x = 0;
    for (int64_t v = 0; v < n->nvox; v++) {
        double x = raw(n, v) * a + b;
        /* |x| beyond float's range is Inf after the conversion: test before it */
        if (!isfinite(x) || fabs(x) > FLT_MAX) {
            if (!bad++) {
                first = v;
                first_x = x;
            }
            out[v] = replace ? *replace : 0.0f;
            continue;
        }
        out[v] = (float)x;
    }
    if (replaced) *replaced = bad;
    if (bad && !replace) {
        const int64_t nx = n->dim[0], ny = n->dim[1], nz = n->dim[2], v = first;
        return TS_ERR(TS_ERR_NUMERIC, "%s: %lld non-finite voxel%s (NaN or Inf), the first is voxel (i=%lld, j=%lld, "
                      "k=%lld, t=%lld) = %g: images must be finite (tessera convert --nan-to V replaces them)", n->path,
                      (long long)bad, bad > 1 ? "s" : "", (long long)(v % nx), (long long)(v / nx % ny),
                      (long long)(v / (nx * ny) % nz), (long long)(v / (nx * ny * nz)), first_x);
    }
    return 0;
}

int ts_nifti_write(const char *path, const ts_nifti_geom *g, int datatype, int version, const void *data)
{
    int err = 0;
    nifti_image *nim = NULL;
    ts_nifti *back = NULL;
    char tmp[1100];
    if (datatype != NIFTI_TYPE_UINT8 && datatype != NIFTI_TYPE_INT16 && datatype != NIFTI_TYPE_FLOAT32)
        return TS_ERR(TS_ERR_ARG, "%s: cannot write datatype %d", path, datatype);
    size_t pl = strlen(path);
    const char *ext = pl > 7 && !strcmp(path + pl - 7, ".nii.gz") ? ".nii.gz" : pl > 4 && !strcmp(path + pl - 4, ".nii") ? ".nii" : NULL;
    if (!ext) return TS_ERR(TS_ERR_ARG, "%s: NIfTI output names end in .nii or .nii.gz", path);
    TS_TRY(ts_path_fmt(tmp, sizeof tmp, "NIfTI output", "%.*s.partial%d%s", (int)(pl - strlen(ext)), path, (int)getpid(),
                       ext));
    int64_t dims[8] = {g->dim[3] > 1 ? 4 : 3, g->dim[0], g->dim[1], g->dim[2], g->dim[3] > 1 ? g->dim[3] : 1, 1, 1, 1};
    nim = nifti_make_new_nim(dims, datatype, 0);
    if (!nim) return TS_ERR(TS_ERR_NOMEM, "%s: niftilib cannot make an image", path);
    nim->nifti_type = version == 2 ? NIFTI_FTYPE_NIFTI2_1 : NIFTI_FTYPE_NIFTI1_1;
    nim->dx = nim->pixdim[1] = g->pixdim[0];
    nim->dy = nim->pixdim[2] = g->pixdim[1];
    nim->dz = nim->pixdim[3] = g->pixdim[2];
    nim->xyz_units = NIFTI_UNITS_MM;
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) {
            nim->sto_xyz.m[r][c] = g->sform[4 * r + c];
            nim->qto_xyz.m[r][c] = g->qform[4 * r + c];
        }
    nim->sform_code = g->sform_code;
    nim->qform_code = g->qform_code;
    nim->sto_ijk = nifti_dmat44_inverse(nim->sto_xyz);
    if (g->qform_code > 0) {
        double dx, dy, dz;
        nifti_dmat44_to_quatern(nim->qto_xyz, &nim->quatern_b, &nim->quatern_c, &nim->quatern_d, &nim->qoffset_x,
                                &nim->qoffset_y, &nim->qoffset_z, &dx, &dy, &dz, &nim->qfac);
    }
    /* The header comes from niftilib (nifti_convert_nim2n{1,2}hdr); the
     * file is written here (header, the 4-byte extension flag, voxels), since
     * nifti_image_write reports no errors and mis-writes single-file NIfTI-2
     * in libnifti2 3.0.1. */
    {
        nifti_1_header h1;
        nifti_2_header h2;
        const void *hdr;
        size_t hsz;
        if (version == 2) {
            if (nifti_convert_nim2n2hdr(nim, &h2)) TS_FAIL(TS_ERR_ARG, "%s: niftilib cannot make a NIfTI-2 header", path);
            h2.sizeof_hdr = 540;
            memcpy(h2.magic, "n+2\0\r\n\032\n", 8);
            h2.vox_offset = 544;
            hdr = &h2;
            hsz = sizeof h2;
        } else {
            if (nifti_convert_nim2n1hdr(nim, &h1)) TS_FAIL(TS_ERR_ARG, "%s: niftilib cannot make a NIfTI-1 header", path);
            h1.sizeof_hdr = 348;
            memcpy(h1.magic, "n+1\0", 4);
            h1.vox_offset = 352.0f;
            hdr = &h1;
            hsz = sizeof h1;
        }
        const int gz = !strcmp(ext, ".nii.gz");
        size_t bytes = (size_t)nim->nvox * (size_t)nim->nbyper;
        const char zero4[4] = {0, 0, 0, 0};
        errno = 0;
        gzFile f = gzopen(tmp, gz ? "wb6" : "wbT");
        if (!f) TS_FAIL(TS_ERR_IO, "cannot create %s: %s", tmp, strerror(errno ? errno : EIO));
        int ok = gzwrite(f, hdr, (unsigned)hsz) == (int)hsz && gzwrite(f, zero4, 4) == 4;
        for (size_t done = 0; ok && done < bytes;) {
            size_t n = bytes - done > (1u << 30) ? (1u << 30) : bytes - done;
            ok = gzwrite(f, (const char *)data + done, (unsigned)n) == (int)n;
            done += n;
        }
        int ze = Z_OK;
        if (!ok) gzerror(f, &ze);
        int cr = gzclose(f);
        if (!ok || cr != Z_OK) {
            int e = errno;
            unlink(tmp);
            TS_FAIL(TS_ERR_IO, "cannot write %s: %s", tmp, ze == Z_ERRNO || cr == Z_ERRNO ? strerror(e) : "zlib error");
        }
    }
    err = ts_nifti_read(tmp, &back);
    if (err) {
        unlink(tmp);
        TS_FAIL(TS_ERR_IO, "%s: writing failed (%s)", path, ts_err_message());
    }
    if (back->dim[0] != g->dim[0] || back->dim[1] != g->dim[1] || back->dim[2] != g->dim[2] ||
        memcmp(back->data, data, (size_t)back->nvox * (size_t)back->nbyper)) {
        unlink(tmp);
        TS_FAIL(TS_ERR_IO, "%s: the file written does not read back identically", path);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        TS_FAIL(TS_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
cleanup:
    if (nim) nifti_image_free(nim);
    ts_nifti_free(&back);
    return err;
}
