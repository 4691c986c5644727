/* Crash-safe checkpoint directories; see checkpoint.h. Owns the directory
 * protocol (temporary directory, fsync, rename, keep) and the layout of
 * state.h5 and manifest.json; rank 0 writes, every rank agrees on the outcome.
 * Knows no model or optimizer: it takes named tensor views. */
#define _GNU_SOURCE
#include "tsbuild.h"
#include "io/checkpoint.h"
#include "io/h5.h"
#include "src/core/fault.h"
#include "src/core/path.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* CRC-32 of n bytes (zlib), in pieces below its 4 GiB argument limit */
static uint32_t crc_of(const void *p, size_t n)
{
    uLong c = crc32(0L, Z_NULL, 0);
    const unsigned char *b = p;
    while (n > 0) {
        const uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, b, k);
        b += k;
        n -= k;
    }
    return (uint32_t)c;
}

static int fsync_path(const char *path, int dir)
{
    int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0) return TS_ERR(TS_ERR_IO, "%s: cannot open to sync: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && !(dir && (e == EINVAL || e == EROFS)))
        return TS_ERR(TS_ERR_IO, "%s: fsync failed: %s", path, strerror(e));
    return 0;
}

static int mkdirs(const char *path)
{
    char buf[4096];
    TS_TRY(ts_path_fmt(buf, sizeof buf, "the checkpoint directory", "%s", path));
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return TS_ERR(TS_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
            *p = '/';
        }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return TS_ERR(TS_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
    return 0;
}

static void rmtree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[4096];
            if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) continue;
            struct stat st;
            if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode)) rmtree(sub);
            else unlink(sub);
        }
        closedir(d);
    }
    rmdir(path);
}

static hid_t h5type(ts_dtype t)
{
    return t == TS_INT64 ? H5T_NATIVE_INT64 : t == TS_UINT8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT;
}

/* creates the groups of an absolute path "/a/b/name" */
static int make_groups(hid_t f, const char *name)
{
    int err = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", name);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            htri_t ex = H5Lexists(f, buf, H5P_DEFAULT);
            if (ex == 0) {
                hid_t g = H5Gcreate2(f, buf, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
                TS_H5M(g, "cannot create group %s", buf);
                H5Gclose(g);
            }
            TS_H5M(ex, "cannot look up %s", buf);
            *p = '/';
        }
cleanup:
    return err;
}

/* writes all of buf to path and fsyncs it; errors name the file and errno */
static int write_file(const char *path, const void *buf, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0) return TS_ERR(TS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    const char *p = buf;
    if (ts_fault_at(TS_FAULT_ENOSPC, ts_fault_step(), NULL)) { /* an injected full disk */
        close(fd);
        return TS_ERR(TS_ERR_IO, "%s: write failed: %s (injected: TESSERA_FAULT)", path, strerror(ENOSPC));
    }
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            close(fd);
            return TS_ERR(TS_ERR_IO, "%s: write failed: %s", path, strerror(e));
        }
        p += w;
        n -= (size_t)w;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return TS_ERR(TS_ERR_IO, "%s: fsync failed: %s", path, strerror(e));
    }
    if (close(fd) != 0) return TS_ERR(TS_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    return 0;
}

/* The file is built in memory (HDF5's core driver, no backing store) and
 * written out here: HDF5 never writes to the disk, so a full disk is one
 * write() error, and no half-flushed HDF5 file stays open behind it. */
static int write_state(const char *file, const ts_ckpt_item *items, int n, const ts_ckpt_meta *m, uint32_t *crc)
{
    int err = 0;
    hid_t f = H5I_INVALID_HID, sp = H5I_INVALID_HID, ds = H5I_INVALID_HID, fapl = H5I_INVALID_HID;
    void *image = NULL;
    ssize_t size = 0;
    fapl = H5Pcreate(H5P_FILE_ACCESS);
    TS_H5M(fapl, "%s: file access properties", file);
    TS_H5M(H5Pset_fapl_core(fapl, (size_t)1 << 24, 0), "%s: in-memory file driver", file);
    f = H5Fcreate(file, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    TS_H5M(f, "%s: cannot create", file);
    for (int i = 0; i < n; i++) {
        hsize_t dims[TS_MAX_DIMS];
        for (int k = 0; k < items[i].t.ndim; k++) dims[k] = (hsize_t)items[i].t.shape[k];
        TS_CHECK(make_groups(f, items[i].name));
        sp = items[i].t.ndim ? H5Screate_simple(items[i].t.ndim, dims, NULL) : H5Screate(H5S_SCALAR);
        TS_H5M(sp, "%s: dataspace of %s", file, items[i].name);
        ds = H5Dcreate2(f, items[i].name, h5type(items[i].t.dtype), sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        TS_H5M(ds, "%s: cannot create %s", file, items[i].name);
        TS_H5M(H5Dwrite(ds, h5type(items[i].t.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, items[i].t.data),
               "%s: cannot write %s", file, items[i].name);
        if (i == 0) ts_fault_point("ckpt"); /* an injected kill at=ckpt: the file half written */
        H5Dclose(ds);
        ds = H5I_INVALID_HID;
        H5Sclose(sp);
        sp = H5I_INVALID_HID;
    }
    hid_t g = H5Gcreate2(f, "/meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    TS_H5M(g, "%s: cannot create /meta", file);
    int64_t v[5] = {m->step, m->epoch, m->sampler_position, (int64_t)m->seed, m->ranks};
    static const char *const names[5] = {"step", "epoch", "sampler_position", "seed", "ranks"};
    for (int i = 0; i < 5 && !err; i++) err = ts_h5_write_attr_i64(g, names[i], 0, NULL, &v[i]);
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)m->config_hash);
    if (!err) err = ts_h5_write_attr_str(g, "config_hash", hash);
    if (!err && m->config) err = ts_h5_write_attr_str(g, "config", m->config);
    if (!err && m->loss_scale > 0) err = ts_h5_write_attr_f64(g, "loss_scale", 0, NULL, &m->loss_scale);
    if (!err && m->loss_scale > 0) err = ts_h5_write_attr_i64(g, "loss_scale_good_steps", 0, NULL, &m->loss_scale_good);
    H5Gclose(g);
    if (err) goto cleanup;
    TS_H5M(H5Fflush(f, H5F_SCOPE_GLOBAL), "%s: flush", file);
    size = H5Fget_file_image(f, NULL, 0);
    TS_H5M(size, "%s: image size", file);
    image = malloc((size_t)size);
    if (!image) TS_FAIL(TS_ERR_NOMEM, "%s: %zd bytes", file, size);
    TS_H5M(H5Fget_file_image(f, image, (size_t)size), "%s: image", file);
cleanup:
    if (ds != H5I_INVALID_HID) H5Dclose(ds);
    if (sp != H5I_INVALID_HID) H5Sclose(sp);
    if (f != H5I_INVALID_HID) H5Fclose(f); /* in memory: nothing to write */
    if (fapl != H5I_INVALID_HID) H5Pclose(fapl);
    if (!err) {
        *crc = crc_of(image, (size_t)size);
        err = write_file(file, image, (size_t)size);
    }
    if (!err && ts_fault_at(TS_FAULT_CORRUPT, ts_fault_step(), NULL)) { /* injected: a byte flipped on disk */
        FILE *c = fopen(file, "r+b");
        if (c) {
            fseek(c, (long)(size / 2), SEEK_SET);
            int b = fgetc(c);
            fseek(c, (long)(size / 2), SEEK_SET);
            fputc(b ^ 0x5a, c);
            fclose(c);
        }
    }
    free(image);
    return err;
}

static int write_manifest(const char *path, const char *state, const ts_ckpt_meta *m, int n, uint32_t crc)
{
    struct stat st;
    if (stat(state, &st) != 0) return TS_ERR(TS_ERR_IO, "%s: %s", state, strerror(errno));
    FILE *f = fopen(path, "w");
    if (!f) return TS_ERR(TS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int bad = fprintf(f,
                      "{\n  \"format\": \"tessera-checkpoint\",\n  \"version\": 1,\n  \"step\": %lld,\n  \"epoch\": %lld,\n"
                      "  \"sampler_position\": %lld,\n  \"ranks\": %d,\n  \"tensors\": %d,\n"
                      "  \"files\": {\"state.h5\": %lld},\n  \"crc32\": {\"state.h5\": \"%08x\"}\n}\n",
                      (long long)m->step, (long long)m->epoch, (long long)m->sampler_position, m->ranks, n,
                      (long long)st.st_size, crc) < 0;
    bad |= fflush(f) != 0;
    bad |= fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    return bad ? TS_ERR(TS_ERR_IO, "%s: write failed: %s (disk full?)", path, strerror(errno)) : 0;
}

/* step-<N> directories of dir, newest first; returns how many (max cap) */
static int list_steps(const char *dir, int64_t *steps, int cap)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        char tail;
        if (sscanf(e->d_name, "step-%lld%c", &s, &tail) != 1 || s < 0) continue;
        if (n < cap) steps[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort, descending */
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return n;
}

int ts_ckpt_is_complete(const char *path)
{
    char man[4096], state[4096];
    if (snprintf(man, sizeof man, "%s/manifest.json", path) >= (int)sizeof man) return 0;
    snprintf(state, sizeof state, "%s/state.h5", path);
    FILE *f = fopen(man, "r");
    if (!f) return 0;
    char buf[2048];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    const char *p = strstr(buf, "\"state.h5\":");
    struct stat st;
    if (!p || stat(state, &st) != 0) return 0;
    return atoll(p + 11) == (long long)st.st_size;
}

int ts_ckpt_save(MPI_Comm comm, const char *dir, const ts_ckpt_item *items, int n, const ts_ckpt_meta *meta, int keep,
                 char *out, size_t outlen)
{
    int rank, err = 0;
    char tmp[4096], fin[4096], old[4096], state[4096], man[4096];
    MPI_Comm_rank(comm, &rank);
    /* the same on every rank: a path that does not fit fails everywhere */
    err = ts_path_fmt(tmp, sizeof tmp, "the checkpoint directory", "%s/.tmp-step-%lld", dir, (long long)meta->step);
    if (!err) err = ts_path_fmt(fin, sizeof fin, "the checkpoint directory", "%s/step-%lld", dir, (long long)meta->step);
    if (!err)
        err = ts_path_fmt(old, sizeof old, "the checkpoint directory", "%s/.old-step-%lld", dir, (long long)meta->step);
    if (!err) err = ts_path_fmt(state, sizeof state, "the checkpoint directory", "%s/state.h5", tmp);
    if (!err) err = ts_path_fmt(man, sizeof man, "the checkpoint directory", "%s/manifest.json", tmp);
    if (err) return ts_err_agree(comm, err);
    if (rank != 0) ts_fault_point("ckpt"); /* an injected kill at=ckpt (rank 0's is inside the file) */
    if (rank == 0) {
        ts_h5_init();
        ts_h5_lock();
        rmtree(tmp); /* a crashed earlier attempt */
        err = mkdirs(tmp);
        uint32_t crc = 0;
        if (!err) err = write_state(state, items, n, meta, &crc);
        if (!err) err = fsync_path(state, 0);
        if (!err) err = write_manifest(man, state, meta, n, crc);
        if (!err) err = fsync_path(tmp, 1);
        if (!err) {
            struct stat st;
            if (stat(fin, &st) == 0 && rename(fin, old) != 0)
                err = TS_ERR(TS_ERR_IO, "%s: cannot move aside: %s", fin, strerror(errno));
            if (!err && rename(tmp, fin) != 0) err = TS_ERR(TS_ERR_IO, "cannot rename %s to %s: %s", tmp, fin, strerror(errno));
            if (!err) err = fsync_path(dir, 1);
            rmtree(old);
        }
        if (err) rmtree(tmp);
        ts_h5_unlock();
        if (!err && keep > 0) {
            int64_t steps[4096];
            int k = list_steps(dir, steps, 4096);
            for (int i = keep; i < k; i++) {
                char p[4096];
                snprintf(p, sizeof p, "%s/step-%lld", dir, (long long)steps[i]);
                rmtree(p);
            }
        }
    }
    err = ts_err_agree(comm, err);
    if (!err && out) snprintf(out, outlen, "%s", fin);
    return err;
}

int ts_ckpt_latest(const char *dir, char *path, size_t n, int64_t *step)
{
    return ts_ckpt_before(dir, INT64_MAX, path, n, step);
}

int ts_ckpt_before(const char *dir, int64_t before, char *path, size_t n, int64_t *step)
{
    int64_t steps[4096];
    int k = list_steps(dir, steps, 4096);
    for (int i = 0; i < k; i++) {
        if (steps[i] >= before) continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/step-%lld", dir, (long long)steps[i]);
        if (ts_ckpt_is_complete(p)) {
            snprintf(path, n, "%s", p);
            *step = steps[i];
            return 0;
        }
    }
    return 1;
}

/* the manifest's CRC-32 of state.h5 against the file's (manifests without one: nothing to check) */
static int verify_crc(const char *dir, const char *state)
{
    char man[4096], buf[4096];
    TS_TRY(ts_path_fmt(man, sizeof man, "the checkpoint path", "%s/manifest.json", dir));
    FILE *f = fopen(man, "r");
    if (!f) return TS_ERR(TS_ERR_IO, "%s: cannot open: %s", man, strerror(errno));
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    const char *p = strstr(buf, "\"crc32\": {\"state.h5\": \"");
    if (!p) return 0;
    const uint32_t want = (uint32_t)strtoul(p + strlen("\"crc32\": {\"state.h5\": \""), NULL, 16);
    FILE *s = fopen(state, "rb");
    if (!s) return TS_ERR(TS_ERR_IO, "%s: cannot open: %s", state, strerror(errno));
    uLong c = crc32(0L, Z_NULL, 0);
    unsigned char chunk[1 << 16];
    size_t r;
    while ((r = fread(chunk, 1, sizeof chunk, s)) > 0) c = crc32(c, chunk, (uInt)r);
    const int bad = ferror(s);
    fclose(s);
    if (bad) return TS_ERR(TS_ERR_IO, "%s: read error", state);
    if ((uint32_t)c != want)
        return TS_ERR(TS_ERR_FORMAT, "%s: checksum mismatch (CRC-32 %08x, the manifest says %08x): the checkpoint is "
                      "corrupt", state, (unsigned)c, (unsigned)want);
    return 0;
}

int ts_ckpt_load(const char *path, ts_ckpt_item *items, int n, ts_ckpt_meta *meta)
{
    int err = 0;
    char state[4096];
    hid_t f = H5I_INVALID_HID, ds = H5I_INVALID_HID, sp = H5I_INVALID_HID, g = H5I_INVALID_HID;
    TS_TRY(ts_path_check(path, sizeof state - 16, "the checkpoint path"));
    if (!ts_ckpt_is_complete(path))
        return TS_ERR(TS_ERR_FORMAT, "%s is not a complete checkpoint (no manifest.json, or state.h5 has the wrong size)",
                      path);
    TS_TRY(ts_path_fmt(state, sizeof state, "the checkpoint path", "%s/state.h5", path));
    TS_TRY(verify_crc(path, state));
    ts_h5_init();
    ts_h5_lock();
    f = H5Fopen(state, H5F_ACC_RDONLY, H5P_DEFAULT);
    TS_H5M(f, "%s: cannot open", state);
    for (int i = 0; i < n; i++) {
        htri_t ex = H5Lexists(f, items[i].name, H5P_DEFAULT);
        if (ex <= 0) {
            /* parent groups may be missing too */
            TS_FAIL(TS_ERR_FORMAT, "%s: dataset %s is missing (was it written by another model or optimizer?)", state,
                    items[i].name);
        }
        ds = H5Dopen2(f, items[i].name, H5P_DEFAULT);
        TS_H5M(ds, "%s: cannot open %s", state, items[i].name);
        sp = H5Dget_space(ds);
        int nd = H5Sget_simple_extent_ndims(sp);
        hsize_t dims[TS_MAX_DIMS];
        int same = nd == items[i].t.ndim;
        if (same && nd > 0) H5Sget_simple_extent_dims(sp, dims, NULL);
        for (int k = 0; same && k < nd; k++) same = (int64_t)dims[k] == items[i].t.shape[k];
        if (!same) {
            char want[128];
            TS_FAIL(TS_ERR_FORMAT, "%s: %s has another shape than the model's %s", state, items[i].name,
                    ts_tensor_shape_str(&items[i].t, want, sizeof want));
        }
        TS_H5M(H5Dread(ds, h5type(items[i].t.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, items[i].t.data),
               "%s: cannot read %s", state, items[i].name);
        H5Sclose(sp);
        sp = H5I_INVALID_HID;
        H5Dclose(ds);
        ds = H5I_INVALID_HID;
    }
    if (meta) {
        memset(meta, 0, sizeof *meta);
        g = H5Gopen2(f, "/meta", H5P_DEFAULT);
        TS_H5M(g, "%s: no /meta group", state);
        int64_t v[5];
        static const char *const names[5] = {"step", "epoch", "sampler_position", "seed", "ranks"};
        for (int i = 0; i < 5; i++) TS_CHECK(ts_h5_read_attr_i64(g, names[i], 1, &v[i], state));
        meta->step = v[0];
        meta->epoch = v[1];
        meta->sampler_position = v[2];
        meta->seed = (uint64_t)v[3];
        meta->ranks = (int)v[4];
        char hash[64];
        TS_CHECK(ts_h5_read_attr_str(g, "config_hash", hash, sizeof hash, state));
        meta->config_hash = strtoull(hash, NULL, 16);
        if (ts_h5_attr_exists(g, "loss_scale") > 0) { /* written by fp16 runs only */
            TS_CHECK(ts_h5_read_attr_f64(g, "loss_scale", 1, &meta->loss_scale, state));
            TS_CHECK(ts_h5_read_attr_i64(g, "loss_scale_good_steps", 1, &meta->loss_scale_good, state));
        }
    }
cleanup:
    if (g != H5I_INVALID_HID) H5Gclose(g);
    if (sp != H5I_INVALID_HID) H5Sclose(sp);
    if (ds != H5I_INVALID_HID) H5Dclose(ds);
    if (f != H5I_INVALID_HID) H5Fclose(f);
    ts_h5_unlock();
    return err;
}
