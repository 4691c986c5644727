/* The dataset fingerprint; see fingerprint.h and docs/formats-dataset.md.
 * Per-sample statistics are exact (mean and sum of squared deviations over
 * the sample's foreground, pooled with Chan's formula); percentiles are over
 * the sampled values, gathered on rank 0 at the end. */
#include "tsbuild.h"
#include "io/fingerprint.h"
#include "io/h5.h"
#include "src/core/error.h"
#include "src/core/rng.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double ts_fp_pct_levels[TS_FP_NPCT] = {0.5, 50.0, 99.5};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

double ts_fp_percentile(double *v, int64_t n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double pos = q / 100.0 * (double)(n - 1);
    int64_t a = (int64_t)floor(pos), b = a + 1 < n ? a + 1 : a;
    return v[a] + (v[b] - v[a]) * (pos - (double)a);
}

int ts_fp_target_spacing(int64_t n, const double *sp, const int64_t *sh, double out[3], int *aniso_axis)
{
    *aniso_axis = -1;
    if (n < 1) return TS_ERR(TS_ERR_ARG, "target spacing: no samples");
    for (int64_t i = 0; i < 3 * n; i++)
        if (!(sp[i] > 0) || !isfinite(sp[i]))
            return TS_ERR(TS_ERR_FORMAT, "target spacing: sample %lld has spacing %g along axis %d (must be > 0)",
                          (long long)(i / 3), sp[i], (int)(i % 3));
    double *v = malloc(sizeof *v * (size_t)n), size[3];
    if (!v) return TS_ERR(TS_ERR_NOMEM, "target spacing of %lld samples", (long long)n);
    for (int d = 0; d < 3; d++) {
        for (int64_t i = 0; i < n; i++) v[i] = sp[3 * i + d];
        out[d] = ts_fp_percentile(v, n, 50);
        for (int64_t i = 0; i < n; i++) v[i] = (double)sh[3 * i + d];
        size[d] = ts_fp_percentile(v, n, 50);
    }
    int worst = 0;
    for (int d = 1; d < 3; d++)
        if (out[d] > out[worst]) worst = d;
    double other_sp = 0, other_sz = INFINITY;
    for (int d = 0; d < 3; d++)
        if (d != worst) {
            if (out[d] > other_sp) other_sp = out[d];
            if (size[d] < other_sz) other_sz = size[d];
        }
    if (out[worst] > TS_FP_ANISO * other_sp && size[worst] * TS_FP_ANISO < other_sz) {
        for (int64_t i = 0; i < n; i++) v[i] = sp[3 * i + worst];
        double t = ts_fp_percentile(v, n, 10);
        if (t < other_sp) t = other_sp + 1e-5;
        out[worst] = t;
        *aniso_axis = worst;
    }
    free(v);
    return 0;
}

int ts_fp_parse_modality(const char *s, char out[16])
{
    char l[16];
    size_t n = strlen(s);
    if (n >= sizeof l) n = sizeof l - 1;
    for (size_t k = 0; k < n; k++) l[k] = (char)tolower((unsigned char)s[k]);
    l[n] = '\0';
    const char *c = !strcmp(l, "ct") ? "CT" : !strcmp(l, "mr") || !strcmp(l, "mri") ? "MR" : !strcmp(l, "other") ? "other" : NULL;
    if (!c || strlen(s) >= sizeof l)
        return TS_ERR(TS_ERR_ARG, "modality '%s' is not known (CT, MR or other)", s);
    snprintf(out, 16, "%s", c);
    return 0;
}

/* ---------------- accumulation ---------------- */

struct ts_fp_acc {
    int64_t n, cap;            /* samples; values kept per sample at most */
    int C;
    uint64_t seed;
    float *v[TS_IO_MAX_CHANNELS]; /* this rank's sampled foreground values per channel */
    int64_t nv, vcap;
    ts_fp_sample *rec;         /* [n] every sample's contribution */
    double *sp;                /* [n][3] stored spacing */
    int64_t *sh;               /* [n][3] stored shape */
};

int ts_fp_acc_create(int64_t n, int C, uint64_t seed, int64_t values_max, ts_fp_acc **out)
{
    *out = NULL;
    ts_fp_acc *a = TS_CALLOC(1, sizeof *a);
    if (!a) return TS_ERR_NOMEM;
    a->n = n;
    a->C = C;
    a->seed = seed;
    a->cap = (values_max + n - 1) / n;
    if (a->cap < 1) a->cap = 1;
    a->rec = TS_CALLOC((size_t)n, sizeof *a->rec);
    a->sp = TS_CALLOC((size_t)n * 3, sizeof(double));
    a->sh = TS_CALLOC((size_t)n * 3, sizeof(int64_t));
    if (!a->rec || !a->sp || !a->sh) {
        ts_fp_acc_destroy(&a);
        return TS_ERR(TS_ERR_NOMEM, "fingerprint of %lld samples", (long long)n);
    }
    *out = a;
    return 0;
}

void ts_fp_acc_destroy(ts_fp_acc **ap)
{
    if (!ap || !*ap) return;
    ts_fp_acc *a = *ap;
    for (int c = 0; c < TS_IO_MAX_CHANNELS; c++) free(a->v[c]);
    free(a->rec);
    free(a->sp);
    free(a->sh);
    free(a);
    *ap = NULL;
}

static int grow(ts_fp_acc *a, int64_t more)
{
    if (a->nv + more <= a->vcap) return 0;
    int64_t nc = a->vcap ? a->vcap : 4096;
    while (nc < a->nv + more) nc *= 2;
    for (int c = 0; c < a->C; c++) {
        float *p = realloc(a->v[c], sizeof(float) * (size_t)nc);
        if (!p) return TS_ERR(TS_ERR_NOMEM, "fingerprint: %lld foreground values", (long long)nc);
        a->v[c] = p;
    }
    a->vcap = nc;
    return 0;
}

int ts_fp_acc_sample(ts_fp_acc *a, int64_t index, const float *image, const uint8_t *label, int64_t nv,
                     ts_fp_sample *fs)
{
    int64_t fg = 0;
    for (int64_t v = 0; v < nv; v++) fg += label[v] != 0;
    fs->fg = fg;
    for (int c = 0; c < a->C; c++) {
        const float *x = image + c * nv;
        double s = 0, ss = 0, mn = INFINITY, mx = -INFINITY;
        for (int64_t v = 0; v < nv; v++)
            if (label[v]) {
                s += x[v];
                mn = x[v] < mn ? x[v] : mn;
                mx = x[v] > mx ? x[v] : mx;
            }
        const double m = fg ? s / (double)fg : 0;
        for (int64_t v = 0; v < nv; v++)
            if (label[v]) ss += (x[v] - m) * (x[v] - m);
        fs->mean[c] = m;
        fs->m2[c] = ss;
        fs->min[c] = fg ? mn : 0;
        fs->max[c] = fg ? mx : 0;
    }
    int64_t need = fg < a->cap ? fg : a->cap, left = fg;
    TS_TRY(grow(a, need));
    ts_rng r;
    ts_rng_init(&r, a->seed, (uint32_t)index, 0x46500000u + (uint32_t)(index >> 32));
    for (int64_t v = 0; v < nv && need; v++) {
        if (!label[v]) continue;
        if (need == left || ts_rng_below(&r, (uint64_t)left) < (uint64_t)need) {
            for (int c = 0; c < a->C; c++) a->v[c][a->nv] = image[c * nv + v];
            a->nv++;
            need--;
        }
        left--;
    }
    return 0;
}

void ts_fp_acc_record(ts_fp_acc *a, int64_t index, const ts_fp_sample *fs, const double spacing[3],
                      const int64_t shape[3])
{
    a->rec[index] = *fs;
    memcpy(a->sp + 3 * index, spacing, 3 * sizeof(double));
    memcpy(a->sh + 3 * index, shape, 3 * sizeof(int64_t));
}

/* rank 0: the percentiles of every channel over the gathered values */
static int gathered_percentiles(ts_fp_acc *a, MPI_Comm comm, int rank, int size, double *pct)
{
    int err = 0, lerr = 0;
    int n = (int)a->nv, *cnt = NULL, *off = NULL;
    float *all = NULL;
    int64_t tot = 0;
    if (rank == 0) {
        cnt = TS_CALLOC((size_t)size, sizeof(int));
        off = TS_CALLOC((size_t)size, sizeof(int));
        if (!cnt || !off) lerr = TS_ERR(TS_ERR_NOMEM, "fingerprint");
    }
    TS_CHECK(ts_err_agree(comm, lerr));
    TS_MPI(MPI_Gather(&n, 1, MPI_INT, cnt, 1, MPI_INT, 0, comm));
    if (rank == 0) {
        for (int p = 0; p < size; p++) {
            off[p] = (int)tot;
            tot += cnt[p];
        }
        all = malloc(sizeof(float) * (size_t)(tot ? tot : 1));
        if (!all) lerr = TS_ERR(TS_ERR_NOMEM, "fingerprint: %lld foreground values on rank 0", (long long)tot);
    }
    TS_CHECK(ts_err_agree(comm, lerr));
    for (int c = 0; c < a->C; c++) {
        static float none;
        TS_MPI(MPI_Gatherv(a->v[c] ? a->v[c] : &none, n, MPI_FLOAT, all, cnt, off, MPI_FLOAT, 0, comm));
        if (rank != 0 || !tot) continue;
        qsort(all, (size_t)tot, sizeof(float), cmp_float);
        for (int q = 0; q < TS_FP_NPCT; q++) {
            double pos = ts_fp_pct_levels[q] / 100.0 * (double)(tot - 1);
            int64_t i0 = (int64_t)floor(pos), i1 = i0 + 1 < tot ? i0 + 1 : i0;
            pct[c * TS_FP_NPCT + q] = all[i0] + ((double)all[i1] - all[i0]) * (pos - (double)i0);
        }
    }
    if (rank == 0) pct[TS_IO_MAX_CHANNELS * TS_FP_NPCT] = (double)tot;
cleanup:
    free(cnt);
    free(off);
    free(all);
    return err;
}

int ts_fp_acc_finish(ts_fp_acc *a, MPI_Comm comm, ts_fg_intensity *fi)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    memset(fi, 0, sizeof *fi);
    fi->channels = a->C;
    int64_t tot = 0;
    for (int64_t i = 0; i < a->n; i++) tot += a->rec[i].fg;
    fi->voxels = tot;
    for (int c = 0; c < a->C; c++) {
        double s = 0, m2 = 0, mn = INFINITY, mx = -INFINITY;
        for (int64_t i = 0; i < a->n; i++) s += (double)a->rec[i].fg * a->rec[i].mean[c];
        const double m = tot ? s / (double)tot : 0;
        for (int64_t i = 0; i < a->n; i++) {
            const ts_fp_sample *r = &a->rec[i];
            if (!r->fg) continue;
            m2 += r->m2[c] + (double)r->fg * (r->mean[c] - m) * (r->mean[c] - m);
            mn = r->min[c] < mn ? r->min[c] : mn;
            mx = r->max[c] > mx ? r->max[c] : mx;
        }
        fi->mean[c] = m;
        fi->std[c] = tot ? sqrt(m2 / (double)tot) : 0;
        fi->min[c] = tot ? mn : 0;
        fi->max[c] = tot ? mx : 0;
    }
    double pct[TS_IO_MAX_CHANNELS * TS_FP_NPCT + 1] = {0};
    TS_TRY(gathered_percentiles(a, comm, rank, size, pct));
    TS_MPI_TRY(MPI_Bcast(pct, TS_IO_MAX_CHANNELS * TS_FP_NPCT + 1, MPI_DOUBLE, 0, comm));
    for (int c = 0; c < a->C; c++) memcpy(fi->pct[c], pct + c * TS_FP_NPCT, sizeof fi->pct[c]);
    fi->sampled = (int64_t)pct[TS_IO_MAX_CHANNELS * TS_FP_NPCT];
    return 0;
}

/* ---------------- writing ---------------- */

static int table(hid_t g, const char *name, hid_t ftype, hid_t mtype, hsize_t n, hsize_t m, const void *buf,
                 hid_t dxpl, int writer)
{
    int err = 0;
    hsize_t dims[2] = {n, m};
    hid_t sp = -1, d = -1;
    TS_H5(sp = H5Screate_simple(2, dims, NULL));
    TS_H5M(d = H5Dcreate2(g, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "cannot create /fingerprint/%s",
           name);
    if (!writer) TS_H5(H5Sselect_none(sp));
    TS_H5M(H5Dwrite(d, mtype, sp, sp, dxpl, buf), "cannot write /fingerprint/%s", name);
cleanup:
    if (d >= 0) H5Dclose(d);
    if (sp >= 0) H5Sclose(sp);
    return err;
}

static int write_attrs(hid_t g, const ts_fg_intensity *fi, const ts_fp_prep *prep, int C)
{
    hsize_t dc = (hsize_t)C, dcp[2] = {(hsize_t)C, TS_FP_NPCT}, dp = TS_FP_NPCT, d3 = 3;
    int64_t v = fi->voxels, ds = prep->downsample, crop = prep->crop;
    const char *mods[TS_IO_MAX_CHANNELS];
    for (int c = 0; c < C; c++) mods[c] = prep->modality[c][0] ? prep->modality[c] : "other";
    TS_TRY(ts_h5_write_attr_i64(g, "foreground_voxels", 0, NULL, &v));
    if (fi->voxels > 0) {
        double pct[TS_IO_MAX_CHANNELS * TS_FP_NPCT];
        for (int c = 0; c < C; c++) memcpy(pct + c * TS_FP_NPCT, fi->pct[c], sizeof fi->pct[c]);
        v = fi->sampled;
        TS_TRY(ts_h5_write_attr_i64(g, "intensity_sampled", 0, NULL, &v));
        TS_TRY(ts_h5_write_attr_f64(g, "intensity_mean", 1, &dc, fi->mean));
        TS_TRY(ts_h5_write_attr_f64(g, "intensity_std", 1, &dc, fi->std));
        TS_TRY(ts_h5_write_attr_f64(g, "intensity_min", 1, &dc, fi->min));
        TS_TRY(ts_h5_write_attr_f64(g, "intensity_max", 1, &dc, fi->max));
        TS_TRY(ts_h5_write_attr_f64(g, "intensity_percentiles", 2, dcp, pct));
        TS_TRY(ts_h5_write_attr_f64(g, "intensity_percentile_levels", 1, &dp, ts_fp_pct_levels));
    }
    TS_TRY(ts_h5_write_attr_strs(g, "modalities", C, mods));
    TS_TRY(ts_h5_write_attr_f64(g, "target_spacing", 1, &d3, prep->spacing));
    TS_TRY(ts_h5_write_attr_i64(g, "crop_nonzero", 0, NULL, &crop));
    TS_TRY(ts_h5_write_attr_str(g, "label_resampling", prep->spacing[0] > 0 ? (prep->label_nearest ? "nearest" : "linear")
                                                                            : ds > 1 ? "majority" : "none"));
    TS_TRY(ts_h5_write_attr_i64(g, "downsample", 0, NULL, &ds));
    TS_TRY(ts_h5_write_attr_str(g, "image_resampling", prep->spacing[0] > 0 ? (prep->image_cubic ? "cubic" : "linear")
                                                                            : ds > 1 ? "mean" : "none"));
    const int64_t sep = prep->spacing[0] > 0 && prep->separate;
    TS_TRY(ts_h5_write_attr_i64(g, "separate_anisotropic_axis", 0, NULL, &sep));
    return 0;
}

int ts_fp_write(hid_t f, const ts_fp_acc *a, const ts_fg_intensity *fi, const ts_fp_prep *prep, hid_t dxpl,
                int writer)
{
    int err = 0;
    hid_t g = -1;
    const hsize_t n = (hsize_t)a->n;
    double *spo = TS_CALLOC(n * 3, sizeof(double));
    int64_t *sho = TS_CALLOC(n * 3, sizeof(int64_t)), *shc = TS_CALLOC(n * 3, sizeof(int64_t));
    int64_t *crop = TS_CALLOC(n * 6, sizeof(int64_t));
    if (!spo || !sho || !shc || !crop) TS_FAIL(TS_ERR_NOMEM, "fingerprint tables");
    for (hsize_t i = 0; i < n; i++) {
        const ts_fp_sample *r = &a->rec[i];
        for (int d = 0; d < 3; d++) {
            spo[3 * i + d] = r->spacing_orig[d];
            sho[3 * i + d] = r->shape_orig[d];
            shc[3 * i + d] = r->crop[3 + d] - r->crop[d];
        }
        memcpy(crop + 6 * i, r->crop, sizeof r->crop);
    }
    TS_H5M(g = H5Gcreate2(f, "/fingerprint", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "cannot create /fingerprint");
    TS_CHECK(table(g, "spacing_original", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, n, 3, spo, dxpl, writer));
    TS_CHECK(table(g, "shape_original", H5T_STD_I64LE, H5T_NATIVE_INT64, n, 3, sho, dxpl, writer));
    TS_CHECK(table(g, "crop_box", H5T_STD_I64LE, H5T_NATIVE_INT64, n, 6, crop, dxpl, writer));
    TS_CHECK(table(g, "shape_cropped", H5T_STD_I64LE, H5T_NATIVE_INT64, n, 3, shc, dxpl, writer));
    TS_CHECK(table(g, "spacing", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, n, 3, a->sp, dxpl, writer));
    TS_CHECK(table(g, "shape", H5T_STD_I64LE, H5T_NATIVE_INT64, n, 3, a->sh, dxpl, writer));
    TS_CHECK(write_attrs(g, fi, prep, a->C));
cleanup:
    if (g >= 0) H5Gclose(g);
    free(spo);
    free(sho);
    free(shc);
    free(crop);
    return err;
}

int ts_fp_write_sample_attrs(hid_t g, const ts_fp_sample *fs)
{
    hsize_t d3 = 3, d6 = 6;
    TS_TRY(ts_h5_write_attr_f64(g, "spacing_original", 1, &d3, fs->spacing_orig));
    TS_TRY(ts_h5_write_attr_i64(g, "shape_original", 1, &d3, fs->shape_orig));
    TS_TRY(ts_h5_write_attr_i64(g, "crop_box", 1, &d6, fs->crop));
    return 0;
}

/* ---------------- reading ---------------- */

int ts_fp_read_intensity(hid_t f, const char *path, int C, ts_fg_intensity *fi, int *have)
{
    int err = 0;
    hid_t g = -1;
    memset(fi, 0, sizeof *fi);
    *have = 0;
    fi->channels = C;
    ts_h5_lock();
    htri_t ex = H5Lexists(f, "/fingerprint", H5P_DEFAULT);
    if (ex <= 0) H5Eclear2(H5E_DEFAULT);
    if (ex > 0) g = H5Gopen2(f, "/fingerprint", H5P_DEFAULT);
    ts_h5_unlock();
    if (ex > 0 && g < 0) return ts_h5_err(__FILE__, __LINE__, "%s: cannot open /fingerprint", path);
    if (g < 0 || !ts_h5_attr_exists(g, "intensity_mean")) goto cleanup;
    double pct[TS_IO_MAX_CHANNELS * TS_FP_NPCT];
    char where[TS_IO_PATH_MAX + 16];
    snprintf(where, sizeof where, "%s /fingerprint", path);
    TS_CHECK(ts_h5_read_attr_i64(g, "foreground_voxels", 1, &fi->voxels, where));
    TS_CHECK(ts_h5_read_attr_i64(g, "intensity_sampled", 1, &fi->sampled, where));
    TS_CHECK(ts_h5_read_attr_f64(g, "intensity_mean", C, fi->mean, where));
    TS_CHECK(ts_h5_read_attr_f64(g, "intensity_std", C, fi->std, where));
    TS_CHECK(ts_h5_read_attr_f64(g, "intensity_min", C, fi->min, where));
    TS_CHECK(ts_h5_read_attr_f64(g, "intensity_max", C, fi->max, where));
    TS_CHECK(ts_h5_read_attr_f64(g, "intensity_percentiles", C * TS_FP_NPCT, pct, where));
    for (int c = 0; c < C; c++) memcpy(fi->pct[c], pct + c * TS_FP_NPCT, sizeof fi->pct[c]);
    *have = fi->voxels > 0;
cleanup:
    if (g >= 0) {
        ts_h5_lock();
        H5Gclose(g);
        ts_h5_unlock();
    }
    return err;
}

static int read_tab(hid_t g, const char *path, const char *name, hid_t mtype, hsize_t n, hsize_t m, void *buf)
{
    int err = 0;
    hid_t d = -1, sp = -1;
    hsize_t got[2] = {0, 0};
    TS_H5M(d = H5Dopen2(g, name, H5P_DEFAULT), "%s: no /fingerprint/%s", path, name);
    TS_H5(sp = H5Dget_space(d));
    if (H5Sget_simple_extent_ndims(sp) != 2 || (H5Sget_simple_extent_dims(sp, got, NULL), got[0] != n || got[1] != m))
        TS_FAIL(TS_ERR_FORMAT, "%s: /fingerprint/%s is not [%llu, %llu]", path, name, (unsigned long long)n,
                (unsigned long long)m);
    TS_H5M(H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), "%s: cannot read /fingerprint/%s", path, name);
cleanup:
    if (sp >= 0) H5Sclose(sp);
    if (d >= 0) H5Dclose(d);
    return err;
}

static int read_prep(hid_t g, const char *path, int C, ts_fp_prep *p)
{
    int n = 0;
    char **mods = NULL, lr[32] = "";
    int64_t v = 0;
    char where[TS_IO_PATH_MAX + 16];
    snprintf(where, sizeof where, "%s /fingerprint", path);
    TS_TRY(ts_h5_read_attr_f64(g, "target_spacing", 3, p->spacing, where));
    TS_TRY(ts_h5_read_attr_i64(g, "crop_nonzero", 1, &v, where));
    p->crop = (int)v;
    TS_TRY(ts_h5_read_attr_i64(g, "downsample", 1, &v, where));
    p->downsample = (int)v;
    TS_TRY(ts_h5_read_attr_str(g, "label_resampling", lr, sizeof lr, where));
    p->label_nearest = !strcmp(lr, "nearest");
    /* datasets converted before these attributes were resampled trilinearly, all axes alike */
    p->image_cubic = p->separate = 0;
    if (ts_h5_attr_exists(g, "image_resampling") > 0) {
        TS_TRY(ts_h5_read_attr_str(g, "image_resampling", lr, sizeof lr, where));
        p->image_cubic = !strcmp(lr, "cubic");
    }
    if (ts_h5_attr_exists(g, "separate_anisotropic_axis") > 0) {
        TS_TRY(ts_h5_read_attr_i64(g, "separate_anisotropic_axis", 1, &v, where));
        p->separate = v != 0;
    }
    TS_TRY(ts_h5_read_attr_strs(g, "modalities", &n, &mods, where));
    int bad = n != C;
    for (int c = 0; c < C && !bad; c++) snprintf(p->modality[c], sizeof p->modality[c], "%s", mods[c]);
    ts_h5_free_strs(n, mods);
    if (bad) return TS_ERR(TS_ERR_FORMAT, "%s: %d modalities for %d channels", where, n, C);
    return 0;
}

int ts_fingerprint_read(const char *path, ts_fingerprint *fp)
{
    int err = 0, nn = 0;
    hid_t f = -1, g = -1;
    int64_t v = 0;
    char **names = NULL;
    memset(fp, 0, sizeof *fp);
    ts_h5_init();
    ts_h5_lock();
    f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        err = ts_h5_err(__FILE__, __LINE__, "cannot open %s", path);
        goto cleanup;
    }
    if (!ts_h5_attr_exists(f, "num_samples") || !ts_h5_attr_exists(f, "channels"))
        TS_FAIL(TS_ERR_FORMAT, "%s is not a tessera dataset (no root attribute num_samples)", path);
    TS_CHECK(ts_h5_read_attr_i64(f, "num_samples", 1, &fp->n, path));
    TS_CHECK(ts_h5_read_attr_i64(f, "channels", 1, &v, path));
    if (v < 1 || v > TS_IO_MAX_CHANNELS) TS_FAIL(TS_ERR_FORMAT, "%s: channels is %lld", path, (long long)v);
    fp->C = (int)v;
    TS_CHECK(ts_h5_read_attr_i64(f, "classes", 1, &v, path));
    if (v < 1 || v > TS_IO_MAX_CLASSES) TS_FAIL(TS_ERR_FORMAT, "%s: classes is %lld", path, (long long)v);
    fp->K = (int)v;
    if (fp->n < 1 || fp->n > TS_IO_SAMPLES_MAX) TS_FAIL(TS_ERR_FORMAT, "%s: num_samples is %lld", path, (long long)fp->n);
    TS_CHECK(ts_h5_read_attr_strs(f, "channel_names", &nn, &names, path));
    for (int c = 0; c < fp->C && c < nn; c++) snprintf(fp->channel_names[c], sizeof fp->channel_names[c], "%s", names[c]);
    if (H5Lexists(f, "/fingerprint", H5P_DEFAULT) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        TS_FAIL(TS_ERR_FORMAT, "%s has no fingerprint (/fingerprint, written by tessera convert since plan-data): "
                "convert it again", path);
    }
    const size_t n = (size_t)fp->n;
    fp->spacing_orig = TS_CALLOC(n * 3, sizeof(double));
    fp->spacing = TS_CALLOC(n * 3, sizeof(double));
    fp->shape_orig = TS_CALLOC(n * 3, sizeof(int64_t));
    fp->shape_crop = TS_CALLOC(n * 3, sizeof(int64_t));
    fp->shape = TS_CALLOC(n * 3, sizeof(int64_t));
    fp->crop = TS_CALLOC(n * 6, sizeof(int64_t));
    fp->class_voxels = TS_CALLOC((size_t)fp->K, sizeof(int64_t));
    if (!fp->spacing_orig || !fp->spacing || !fp->shape_orig || !fp->shape_crop || !fp->shape || !fp->crop ||
        !fp->class_voxels)
        TS_FAIL(TS_ERR_NOMEM, "%s: fingerprint of %lld samples", path, (long long)fp->n);
    TS_CHECK(ts_h5_read_attr_i64(f, "class_voxels", fp->K, fp->class_voxels, path));
    TS_H5M(g = H5Gopen2(f, "/fingerprint", H5P_DEFAULT), "%s: cannot open /fingerprint", path);
    TS_CHECK(read_tab(g, path, "spacing_original", H5T_NATIVE_DOUBLE, n, 3, fp->spacing_orig));
    TS_CHECK(read_tab(g, path, "spacing", H5T_NATIVE_DOUBLE, n, 3, fp->spacing));
    TS_CHECK(read_tab(g, path, "shape_original", H5T_NATIVE_INT64, n, 3, fp->shape_orig));
    TS_CHECK(read_tab(g, path, "shape_cropped", H5T_NATIVE_INT64, n, 3, fp->shape_crop));
    TS_CHECK(read_tab(g, path, "shape", H5T_NATIVE_INT64, n, 3, fp->shape));
    TS_CHECK(read_tab(g, path, "crop_box", H5T_NATIVE_INT64, n, 6, fp->crop));
    TS_CHECK(read_prep(g, path, fp->C, &fp->prep));
    {
        int have;
        TS_CHECK(ts_fp_read_intensity(f, path, fp->C, &fp->fi, &have));
    }
cleanup:
    if (names) ts_h5_free_strs(nn, names);
    if (g >= 0) H5Gclose(g);
    if (f >= 0) H5Fclose(f);
    ts_h5_unlock();
    if (err) ts_fingerprint_free(fp);
    return err;
}

int ts_fingerprint_present(const char *path, int *have)
{
    int err = 0;
    hid_t f = -1;
    *have = 0;
    ts_h5_init();
    ts_h5_lock();
    f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        err = ts_h5_err(__FILE__, __LINE__, "cannot open %s", path);
        goto cleanup;
    }
    *have = H5Lexists(f, "/fingerprint", H5P_DEFAULT) > 0;
    H5Eclear2(H5E_DEFAULT);
cleanup:
    if (f >= 0) H5Fclose(f);
    ts_h5_unlock();
    return err;
}

void ts_fingerprint_free(ts_fingerprint *fp)
{
    free(fp->spacing_orig);
    free(fp->spacing);
    free(fp->shape_orig);
    free(fp->shape_crop);
    free(fp->shape);
    free(fp->crop);
    free(fp->class_voxels);
    memset(fp, 0, sizeof *fp);
}
