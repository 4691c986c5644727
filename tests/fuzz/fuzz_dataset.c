/* Fuzz target: the dataset reader (io/dataset.c, io/dataset_read.c) on MPI_COMM_SELF.
 * Structure-aware: raw HDF5 bytes would mostly exercise libhdf5's own
 * parser (not ours, see docs/testing.md), so the input instead chooses one
 * of three valid base datasets written by ts_synth_write at start (one
 * file; two shards plus a manifest; two channels with a chunk edge that does
 * not divide the volume) and a list of edits made through the HDF5 API:
 * root attributes (format, version, counts, shard names) set to other
 * values, types or lengths; /index rows (shard, shape, foreground count,
 * an unterminated name) changed; /stats tables, sample volumes and
 * foreground tables replaced by ones of another type, rank, extent, chunking
 * or filter, or filled with NaN; links deleted; bytes inside stored chunks
 * flipped; files truncated. The result is opened (MPI-IO or POSIX, with or
 * without the check of every sample) and boxes of random samples, positions
 * and sizes (partly or wholly outside the volume) are read. Properties: no
 * crash; errors carry a message; what opens is consistent (counts, shapes);
 * a box read returns finite image voxels inside the volume and the padding
 * outside, label 0 outside; the collective read gives the same box; a
 * foreground coordinate lies inside its volume. */
#include "tsbuild.h"
#include "io/dataset.h"
#include "io/h5.h"
#include "io/synth.h"
#include "io/writer.h"
#include "tests/fuzz/fuzz_common.h"

#include <fcntl.h>
#include <math.h>

#define NBASE 3
#define MAXF 3 /* files per base: manifest or single file, shards */

typedef struct {
    int nfiles;
    char names[MAXF][128]; /* file names; [0] is the one to open */
    uint8_t *bytes[MAXF];
    size_t len[MAXF];
    int64_t count;
} base_ds;

static base_ds bases[NBASE];
static char work[1024];

typedef struct {
    char name[TS_IO_NAME_MAX];
    int32_t shard;
    int64_t shape[4];
    int64_t foreground;
} idx_row;

static hid_t index_type(void)
{
    hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(idx_row)), s = H5Tcopy(H5T_C_S1);
    hsize_t four = 4;
    H5Tset_size(s, TS_IO_NAME_MAX);
    H5Tset_strpad(s, H5T_STR_NULLTERM);
    hid_t a = H5Tarray_create2(H5T_NATIVE_INT64, 1, &four);
    H5Tinsert(t, "name", HOFFSET(idx_row, name), s);
    H5Tinsert(t, "shard", HOFFSET(idx_row, shard), H5T_NATIVE_INT32);
    H5Tinsert(t, "shape", HOFFSET(idx_row, shape), a);
    H5Tinsert(t, "foreground", HOFFSET(idx_row, foreground), H5T_NATIVE_INT64);
    H5Tclose(s);
    H5Tclose(a);
    return t;
}

static uint8_t *slurp(const char *p, size_t *len)
{
    FILE *f = fopen(p, "rb");
    FUZZ_REQUIRE(f, "open %s", p);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n);
    FUZZ_REQUIRE(b && fread(b, 1, (size_t)n, f) == (size_t)n, "read %s", p);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void make_base(int k, int64_t count, int shards, int chunk, int64_t d, int64_t h, int64_t w, int C, int K)
{
    char dir[1100], path[1200];
    snprintf(dir, sizeof dir, "%s/base%d", fuzz_dir(), k);
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/d.h5", dir);
    ts_synth_opts o = {.size = {d, h, w}, .channels = C, .classes = K, .seed = (uint64_t)k + 1, .noise = 0.05};
    if (ts_synth_write(MPI_COMM_SELF, path, &o, count, shards, chunk)) {
        fprintf(stderr, "fuzz_dataset: %s\n", ts_err_message());
        abort();
    }
    base_ds *b = &bases[k];
    b->count = count;
    b->nfiles = shards > 1 ? shards + 1 : 1;
    snprintf(b->names[0], sizeof b->names[0], "d.h5");
    for (int s = 0; shards > 1 && s < shards; s++) {
        char full[1300];
        ts_io_shard_name(path, s, shards, full, sizeof full);
        const char *slash = strrchr(full, '/');
        snprintf(b->names[s + 1], sizeof b->names[s + 1], "%s", slash ? slash + 1 : full);
    }
    for (int f = 0; f < b->nfiles; f++) {
        char full[1300];
        snprintf(full, sizeof full, "%s/%s", dir, b->names[f]);
        b->bytes[f] = slurp(full, &b->len[f]);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_mpi_init();
    ts_h5_init();
    /* keep HDF5's freed blocks for reuse: under ASan every fresh large block
     * is a new mapping to fault in, which made this target 30x slower */
    H5set_free_list_limits(-1, -1, -1, -1, -1, -1);
    make_base(0, 2, 1, 4, 6, 5, 7, 1, 3);
    make_base(1, 3, 2, 8, 5, 5, 5, 2, 2);
    make_base(2, 1, 1, 3, 9, 4, 4, 2, 4);
    snprintf(work, sizeof work, "%s/work", fuzz_dir());
    mkdir(work, 0777);
    return 0;
}

/* ---------------- edits ---------------- */

static const char *const strs[] = {"tessera-dataset", "tessera-dataset-shard", "", "d.h5",
                                   "d-shard-00000-of-00002.h5", "d-shard-00001-of-00002.h5", "../d.h5", "/etc/passwd",
                                   "missing.h5", "image0", "background",
                                   "a-very-long-name-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                                   "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
#define NSTRS ((int)(sizeof strs / sizeof strs[0]))

static void del_attr(hid_t o, const char *name)
{
    if (H5Aexists(o, name) > 0) H5Adelete(o, name);
    H5Eclear2(H5E_DEFAULT);
}

static void edit_attr(fuzz_bytes *b, hid_t f)
{
    static const char *const names[] = {"format",  "format_version", "num_samples", "channels",   "classes", "shards",
                                        "chunk",   "class_names",    "channel_names", "shard_files", "mean",   "std",
                                        "shard"};
    const char *name = names[fuzz_u8(b) % (sizeof names / sizeof names[0])];
    del_attr(f, name);
    unsigned kind = fuzz_u8(b) % 5;
    if (kind == 0) {          /* int64 scalar or array */
        int n = (int)fuzz_range(b, 0, 3);
        int64_t v[3] = {fuzz_i64(b), fuzz_i64(b), fuzz_i64(b)};
        hsize_t d = (hsize_t)n;
        ts_h5_write_attr_i64(f, name, n ? 1 : 0, n ? &d : NULL, v);
    } else if (kind == 1) {   /* float64 array */
        int n = (int)fuzz_range(b, 0, 3);
        double v[3] = {(double)fuzz_i64(b), NAN, -INFINITY};
        hsize_t d = (hsize_t)n;
        ts_h5_write_attr_f64(f, name, n ? 1 : 0, n ? &d : NULL, v);
    } else if (kind == 2) {   /* one string */
        ts_h5_write_attr_str(f, name, strs[fuzz_u8(b) % NSTRS]);
    } else if (kind == 3) {   /* string array */
        int n = (int)fuzz_range(b, 0, 5);
        const char *s[5];
        for (int i = 0; i < n; i++) s[i] = strs[fuzz_u8(b) % NSTRS];
        ts_h5_write_attr_strs(f, name, n, s);
    } /* kind 4: deleted */
    H5Eclear2(H5E_DEFAULT);
}

static void edit_index(fuzz_bytes *b, hid_t f)
{
    if (H5Lexists(f, "/index", H5P_DEFAULT) <= 0) return;
    hid_t d = H5Dopen2(f, "/index", H5P_DEFAULT), sp = H5Dget_space(d), t = index_type();
    hsize_t n = 0;
    if (H5Sget_simple_extent_ndims(sp) == 1) H5Sget_simple_extent_dims(sp, &n, NULL);
    if (n > 0 && n < 64) {
        idx_row rows[64];
        if (H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) >= 0) {
            idx_row *r = &rows[fuzz_u8(b) % n];
            switch (fuzz_u8(b) % 4) {
            case 0: r->shard = (int32_t)fuzz_i64(b); break;
            case 1: r->shape[fuzz_u8(b) % 4] = fuzz_i64(b); break;
            case 2: r->foreground = fuzz_i64(b); break;
            default: memset(r->name, 'x', sizeof r->name); break; /* no terminator */
            }
            H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows);
        }
    }
    H5Tclose(t);
    H5Sclose(sp);
    H5Dclose(d);
    H5Eclear2(H5E_DEFAULT);
}

/* a new dataset at `name` of a fuzzed type, rank, extent, layout and filter */
static void replace_dataset(fuzz_bytes *b, hid_t f, const char *name, const hsize_t *like, int like_rank)
{
    if (H5Lexists(f, name, H5P_DEFAULT) > 0) H5Ldelete(f, name, H5P_DEFAULT);
    H5Eclear2(H5E_DEFAULT);
    hid_t type;
    switch (fuzz_u8(b) % 8) {
    case 0: type = H5T_IEEE_F32LE; break;
    case 1: type = H5T_IEEE_F32BE; break;
    case 2: type = H5T_IEEE_F64LE; break;
    case 3: type = H5T_STD_U8LE; break;
    case 4: type = H5T_STD_I16LE; break;
    case 5: type = H5T_STD_I8LE; break;
    case 6: type = H5T_STD_I32LE; break;
    default: type = H5T_STD_I64BE; break;
    }
    int rank = fuzz_u8(b) % 4 ? like_rank : (int)fuzz_range(b, 1, 5);
    hsize_t dims[5], chunk[5], n = 1;
    for (int k = 0; k < rank; k++) {
        hsize_t base = k < like_rank ? like[k] : 2;
        int64_t delta = fuzz_u8(b) % 3 ? 0 : fuzz_range(b, -2, 2);
        dims[k] = (int64_t)base + delta < 0 ? 0 : (hsize_t)((int64_t)base + delta);
        chunk[k] = dims[k] ? (hsize_t)fuzz_range(b, 1, (int64_t)dims[k]) : 1;
        n *= dims[k];
    }
    if (n > 65536) return;
    hid_t sp = H5Screate_simple(rank, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    unsigned layout = fuzz_u8(b) % 4, filt = fuzz_u8(b) % 4;
    int zero = 0;
    for (int k = 0; k < rank; k++) zero |= dims[k] == 0;
    if (layout && !zero) {
        H5Pset_chunk(dcpl, rank, chunk);
        if (filt == 1) H5Pset_fletcher32(dcpl);
        if (filt == 2) H5Pset_deflate(dcpl, 1);
        if (filt == 3) {
            H5Pset_shuffle(dcpl);
            H5Pset_fletcher32(dcpl);
        }
    }
    hid_t d = H5Dcreate2(f, name, type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (d >= 0 && n) {
        /* contents: a pattern, with NaN and huge values sometimes */
        double *v = malloc(n * sizeof *v);
        unsigned pat = fuzz_u8(b);
        for (hsize_t i = 0; i < n; i++) v[i] = (double)((i * (pat | 1)) % 7);
        if (pat & 0x80) v[fuzz_range(b, 0, (int64_t)n - 1)] = NAN;
        if (pat & 0x40) v[fuzz_range(b, 0, (int64_t)n - 1)] = 1e300;
        H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
        free(v);
    }
    if (d >= 0) H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(sp);
    H5Eclear2(H5E_DEFAULT);
}

static int64_t pick_sample(fuzz_bytes *b, const base_ds *bs) { return fuzz_range(b, 0, bs->count - 1); }

static void sample_dims(hid_t f, const char *name, hsize_t *dims, int *rank)
{
    *rank = 0;
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return;
    }
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    if (d < 0) return;
    hid_t sp = H5Dget_space(d);
    int r = H5Sget_simple_extent_ndims(sp);
    if (r > 0 && r <= 5) {
        H5Sget_simple_extent_dims(sp, dims, NULL);
        *rank = r;
    }
    H5Sclose(sp);
    H5Dclose(d);
    H5Eclear2(H5E_DEFAULT);
}

static void sample_path(char *buf, size_t n, int64_t i, const char *what)
{
    snprintf(buf, n, "/samples/%06lld%s%s", (long long)i, what ? "/" : "", what ? what : "");
}

/* NaN or Inf written into a stored volume (checksums stay valid) */
static void poison_volume(fuzz_bytes *b, hid_t f, const char *name)
{
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0) return;
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT), sp = H5Dget_space(d);
    hsize_t dims[5] = {0};
    int r = H5Sget_simple_extent_ndims(sp);
    if (r >= 1 && r <= 5) {
        H5Sget_simple_extent_dims(sp, dims, NULL);
        hsize_t n = 1;
        for (int k = 0; k < r; k++) n *= dims[k];
        if (n && n <= 65536) {
            float *v = malloc(n * sizeof *v);
            if (H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0) {
                v[fuzz_range(b, 0, (int64_t)n - 1)] = fuzz_u8(b) & 1 ? NAN : -INFINITY;
                H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
            }
            free(v);
        }
    }
    H5Sclose(sp);
    H5Dclose(d);
    H5Eclear2(H5E_DEFAULT);
}

/* where a stored chunk of `name` lies in the file (address, size), or 0 */
static int chunk_place(fuzz_bytes *b, hid_t f, const char *name, haddr_t *addr, hsize_t *size)
{
    int ok = 0;
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0) return 0;
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT), sp = H5Dget_space(d);
    hsize_t nch = 0;
    if (d >= 0 && H5Dget_num_chunks(d, sp, &nch) >= 0 && nch > 0) {
        hsize_t off[8];
        unsigned mask;
        ok = H5Dget_chunk_info(d, sp, (hsize_t)fuzz_range(b, 0, (int64_t)nch - 1), off, &mask, addr, size) >= 0 &&
             *size > 0 && *addr != HADDR_UNDEF;
    }
    H5Sclose(sp);
    H5Dclose(d);
    H5Eclear2(H5E_DEFAULT);
    return ok;
}

typedef struct {
    int file;
    off_t at;
    int64_t truncate_to; /* -1: none */
    uint8_t x;
} raw_edit;

static void edit_files(fuzz_bytes *b, const base_ds *bs, raw_edit *raw, int *nraw)
{
    int nedit = (int)fuzz_range(b, 0, 6);
    hid_t files[MAXF];
    for (int fi = 0; fi < MAXF; fi++) files[fi] = -1; /* each file opened once, at its first edit */
    for (int e = 0; e < nedit; e++) {
        int fi = (int)fuzz_range(b, 0, bs->nfiles - 1);
        if (files[fi] < 0) {
            char p[1300];
            snprintf(p, sizeof p, "%s/%s", work, bs->names[fi]);
            files[fi] = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
            H5Eclear2(H5E_DEFAULT);
        }
        hid_t f = files[fi];
        if (f < 0) continue;
        char name[96];
        int64_t i = pick_sample(b, bs);
        hsize_t dims[5];
        int rank;
        unsigned op = fuzz_u8(b) % 10;
        switch (op) {
        case 0:
        case 1: edit_attr(b, f); break;
        case 2: edit_index(b, f); break;
        case 3: {
            static const char *const st[] = {"/stats/mean", "/stats/std", "/stats/percentiles", "/stats/class_voxels",
                                             "/index"};
            const char *s = st[fuzz_u8(b) % 5];
            sample_dims(f, s, dims, &rank);
            if (rank) replace_dataset(b, f, s, dims, rank);
            break;
        }
        case 4:
        case 5: {
            const char *what = fuzz_u8(b) & 1 ? "label" : "image";
            sample_path(name, sizeof name, i, what);
            sample_dims(f, name, dims, &rank);
            if (rank) replace_dataset(b, f, name, dims, rank);
            break;
        }
        case 6: {
            static const char *const what[] = {"image", "label", "foreground", NULL};
            unsigned k = fuzz_u8(b) % 6;
            if (k < 4) sample_path(name, sizeof name, i, what[k]);
            else snprintf(name, sizeof name, "%s", k == 4 ? "/index" : "/stats/mean");
            if (H5Lexists(f, name, H5P_DEFAULT) > 0) H5Ldelete(f, name, H5P_DEFAULT);
            H5Eclear2(H5E_DEFAULT);
            break;
        }
        case 7: {
            sample_path(name, sizeof name, i, "foreground");
            hsize_t like[2] = {(hsize_t)fuzz_range(b, 0, 6), (hsize_t)fuzz_range(b, 2, 4)};
            replace_dataset(b, f, name, like, 2);
            break;
        }
        case 8: {
            sample_path(name, sizeof name, i, fuzz_u8(b) & 1 ? "label" : "image");
            haddr_t addr;
            hsize_t size;
            if (*nraw < 8 && chunk_place(b, f, name, &addr, &size)) {
                raw[*nraw].file = fi;
                raw[*nraw].at = (off_t)(addr + (haddr_t)fuzz_range(b, 0, (int64_t)size - 1));
                raw[*nraw].truncate_to = -1;
                raw[*nraw].x = (uint8_t)(fuzz_u8(b) | 1);
                (*nraw)++;
            }
            break;
        }
        default:
            sample_path(name, sizeof name, i, "image");
            poison_volume(b, f, name);
            break;
        }
    }
    for (int fi = 0; fi < MAXF; fi++)
        if (files[fi] >= 0) H5Fclose(files[fi]);
    H5Eclear2(H5E_DEFAULT);
    if (fuzz_u8(b) % 16 == 15 && *nraw < 8) { /* a truncated file (rarely: 0 is what an exhausted input gives) */
        raw[*nraw].file = (int)fuzz_range(b, 0, bs->nfiles - 1);
        raw[*nraw].truncate_to = fuzz_range(b, 0, 65535);
        (*nraw)++;
    }
}

static void apply_raw(const base_ds *bs, const raw_edit *raw, int nraw)
{
    for (int k = 0; k < nraw; k++) {
        char p[1300];
        snprintf(p, sizeof p, "%s/%s", work, bs->names[raw[k].file]);
        int fd = open(p, O_RDWR);
        if (fd < 0) continue;
        if (raw[k].truncate_to >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && raw[k].truncate_to < st.st_size) {
                if (ftruncate(fd, raw[k].truncate_to)) { /* nothing to do */
                }
            }
        } else {
            uint8_t c;
            if (pread(fd, &c, 1, raw[k].at) == 1) {
                c ^= raw[k].x;
                if (pwrite(fd, &c, 1, raw[k].at) != 1) { /* ignore */
                }
            }
        }
        close(fd);
    }
}

/* ---------------- reads ---------------- */

static void check_opened(ts_dataset *ds)
{
    const int64_t n = ts_dataset_count(ds);
    const int C = ts_dataset_channels(ds), K = ts_dataset_classes(ds);
    FUZZ_REQUIRE(n >= 1 && C >= 1 && C <= TS_IO_MAX_CHANNELS && K >= 1 && K <= TS_IO_MAX_CLASSES, "n %lld C %d K %d",
                 (long long)n, C, K);
    for (int64_t i = 0; i < n; i++) {
        ts_sample_info in;
        FUZZ_REQUIRE(ts_dataset_info(ds, i, &in) == 0, "info %lld", (long long)i);
        FUZZ_REQUIRE(in.shape[0] == C && in.shape[1] >= 1 && in.shape[2] >= 1 && in.shape[3] >= 1, "shape of %lld",
                     (long long)i);
        FUZZ_REQUIRE(in.name && strlen(in.name) < TS_IO_NAME_MAX, "name of %lld", (long long)i);
        FUZZ_REQUIRE(in.nfg >= 0, "nfg");
    }
    (void)ts_dataset_class_name(ds, K - 1);
    (void)ts_dataset_channel_name(ds, C - 1);
}

static void read_boxes(fuzz_bytes *b, ts_dataset *ds)
{
    const int64_t n = ts_dataset_count(ds);
    const int C = ts_dataset_channels(ds);
    int nread = (int)fuzz_range(b, 1, 4);
    for (int r = 0; r < nread; r++) {
        int64_t i = fuzz_range(b, -1, n), lo[3], sz[3], shape[4] = {C, 1, 1, 1};
        ts_sample_info in;
        if (i >= 0 && i < n && ts_dataset_info(ds, i, &in) == 0) memcpy(shape, in.shape, sizeof shape);
        for (int k = 0; k < 3; k++) {
            lo[k] = fuzz_range(b, -6, 12);
            sz[k] = fuzz_range(b, 0, 12);
        }
        const int64_t nv = sz[0] * sz[1] * sz[2];
        float *img = malloc((size_t)(C * nv + 1) * sizeof *img), *img2 = malloc((size_t)(C * nv + 1) * sizeof *img2);
        uint8_t *lab = malloc((size_t)nv + 1), *lab2 = malloc((size_t)nv + 1);
        FUZZ_REQUIRE(img && img2 && lab && lab2, "malloc");
        const unsigned want = fuzz_u8(b) % 4; /* image and label, image only, label only, both */
        float *pi = want != 2 ? img : NULL;
        uint8_t *pl = want != 1 ? lab : NULL;
        ts_err_clear();
        int rc = ts_dataset_read_box(ds, i, lo, sz, pi, pl, NAN);
        FUZZ_ERROR_HAS_MESSAGE(rc);
        if (!rc) {
            FUZZ_REQUIRE(i >= 0 && i < n, "sample %lld read", (long long)i);
            for (int64_t c = 0; c < C && pi; c++)
                for (int64_t z = 0; z < sz[0]; z++)
                    for (int64_t y = 0; y < sz[1]; y++)
                        for (int64_t x = 0; x < sz[2]; x++) {
                            const int64_t v = ((c * sz[0] + z) * sz[1] + y) * sz[2] + x;
                            const int inside = lo[0] + z >= 0 && lo[0] + z < shape[1] && lo[1] + y >= 0 &&
                                               lo[1] + y < shape[2] && lo[2] + x >= 0 && lo[2] + x < shape[3];
                            FUZZ_REQUIRE(inside ? isfinite(img[v]) : isnan(img[v]),
                                         "sample %lld voxel (%lld, %lld, %lld, %lld) is %g (%s the volume)", (long long)i,
                                         (long long)c, (long long)(lo[0] + z), (long long)(lo[1] + y),
                                         (long long)(lo[2] + x), img[v], inside ? "inside" : "outside");
                            if (!inside && pl && c == 0) FUZZ_REQUIRE(lab[v - c * nv] == 0, "label outside the volume");
                        }
            /* the collective read of the same box gives the same voxels */
            ts_err_clear();
            int rc2 = ts_dataset_read_box_all(ds, i, lo, sz, pi ? img2 : NULL, pl ? lab2 : NULL, NAN);
            FUZZ_ERROR_HAS_MESSAGE(rc2);
            if (!rc2) {
                for (int64_t v = 0; pi && v < C * nv; v++)
                    FUZZ_REQUIRE((isnan(img[v]) && isnan(img2[v])) || img[v] == img2[v], "collective read differs at %lld",
                                 (long long)v);
                FUZZ_REQUIRE(!pl || !memcmp(lab, lab2, (size_t)nv), "collective label read differs");
            }
        }
        free(img);
        free(img2);
        free(lab);
        free(lab2);
        if (i >= 0 && i < n) {
            int64_t k = fuzz_range(b, -1, 8), coord[3];
            ts_err_clear();
            int rf = ts_dataset_read_foreground(ds, i, k, coord);
            FUZZ_ERROR_HAS_MESSAGE(rf);
            if (!rf)
                for (int d = 0; d < 3; d++)
                    FUZZ_REQUIRE(coord[d] >= 0 && coord[d] < shape[d + 1], "foreground outside the volume");
            /* whole samples, when small */
            if (shape[0] * shape[1] * shape[2] * shape[3] <= 4096) {
                float *im = malloc((size_t)(shape[0] * shape[1] * shape[2] * shape[3]) * sizeof *im);
                uint8_t *lb = malloc((size_t)(shape[1] * shape[2] * shape[3]));
                ts_err_clear();
                int rs = ts_dataset_read_sample(ds, i, im, lb);
                FUZZ_ERROR_HAS_MESSAGE(rs);
                for (int64_t v = 0; !rs && v < shape[0] * shape[1] * shape[2] * shape[3]; v++)
                    FUZZ_REQUIRE(isfinite(im[v]), "read_sample gave %g", im[v]);
                free(im);
                free(lb);
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_bytes b = {data, size};
    const base_ds *bs = &bases[fuzz_u8(&b) % NBASE];
    for (int k = 0; k < NBASE; k++) /* a fresh copy of the base, nothing else */
        for (int f = 0; f < bases[k].nfiles; f++) {
            char p[1300];
            snprintf(p, sizeof p, "%s/%s", work, bases[k].names[f]);
            unlink(p);
        }
    for (int f = 0; f < bs->nfiles; f++) fuzz_write_at(work, bs->names[f], bs->bytes[f], bs->len[f]);
    raw_edit raw[8];
    int nraw = 0;
    ts_h5_lock();
    edit_files(&b, bs, raw, &nraw);
    ts_h5_unlock();
    apply_raw(bs, raw, nraw);

    ts_dataset_opts o;
    memset(&o, 0, sizeof o);
    unsigned flags = fuzz_u8(&b);
    o.driver = flags & 1 ? TS_IO_DRIVER_POSIX : TS_IO_DRIVER_MPIO;
    o.check = (flags & 6) != 0;
    static const size_t caches[] = {0, 1, 4096, 1 << 20};
    o.cache_bytes = caches[(flags >> 3) & 3];
    for (int k = 0; k < 3; k++) o.box_hint[k] = flags & 0x20 ? fuzz_range(&b, 0, 16) : 0;
    char path[1300];
    snprintf(path, sizeof path, "%s/%s", work, bs->names[0]);
    ts_dataset *ds = NULL;
    ts_err_clear();
    int rc = ts_dataset_open(MPI_COMM_SELF, path, &o, &ds);
    FUZZ_ERROR_HAS_MESSAGE(rc);
    if (!rc) {
        check_opened(ds);
        read_boxes(&b, ds);
        FUZZ_REQUIRE(ts_dataset_bytes_read(ds) < ((uint64_t)1 << 40), "bytes read");
    }
    ts_dataset_close(&ds);
    ts_err_clear();
    return 0;
}
