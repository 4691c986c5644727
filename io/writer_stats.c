/* Dataset writer, statistics of one sample (see writer.h): mean, std,
 * min, max, the percentile levels (quickselect, numpy's linear
 * interpolation), the statistics over the foreground (voxels above the
 * mean), class voxel counts (ts_sample_stats), and the foreground
 * coordinates stored per sample. Computation on one sample in memory: it
 * must not call HDF5 or MPI, open a file or change the writer's state. */
#include "tsbuild.h"
#include "io/writer_impl.h"
#include "src/core/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double ts_io_pct_levels[TS_IO_NPCT] = {0.5, 1.0, 5.0, 95.0, 99.0, 99.5};

/* ---------------- statistics ---------------- */

/* Hoare quickselect: puts the k-th smallest of v[lo..hi] at v[k] with
 * smaller-or-equal values before it and greater-or-equal after. */
static void select_kth(float *v, int64_t lo, int64_t hi, int64_t k)
{
    while (hi > lo) {
        int64_t mid = lo + (hi - lo) / 2;
        /* median of three as pivot */
        float a = v[lo], b = v[mid], c = v[hi];
        float p = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        int64_t i = lo - 1, j = hi + 1;
        for (;;) {
            do i++; while (v[i] < p);
            do j--; while (v[j] > p);
            if (i >= j) break;
            float t = v[i];
            v[i] = v[j];
            v[j] = t;
        }
        if (k <= j) hi = j;
        else lo = j + 1;
    }
}

/* numpy.percentile (linear) of n values in v (reordered). */
static void percentiles(float *v, int64_t n, double *out)
{
    int64_t lo = 0;
    for (int q = 0; q < TS_IO_NPCT; q++) {
        double pos = ts_io_pct_levels[q] / 100.0 * (double)(n - 1);
        int64_t a = (int64_t)floor(pos), b = a + 1 < n ? a + 1 : a;
        /* levels ascend, so v[lo..] holds everything >= previous picks */
        select_kth(v, lo, n - 1, a);
        double va = v[a];
        double vb = va;
        if (b != a) {
            /* the smallest element of v[a+1..n-1] */
            float m = v[a + 1];
            for (int64_t t = a + 2; t < n; t++)
                if (v[t] < m) m = v[t];
            vb = m;
        }
        out[q] = va + (vb - va) * (pos - (double)a);
        lo = a;
    }
}

/* Mean and std over the voxels above the channel's mean (two passes, as
 * over all voxels); a constant channel (no voxel above) keeps the mean and
 * std over all voxels. */
static void fg_stats(const float *x, int64_t nv, double mean, double std, double *fmean, double *fstd)
{
    double sum = 0, ss = 0;
    int64_t n = 0;
    for (int64_t v = 0; v < nv; v++)
        if (x[v] > mean) {
            sum += x[v];
            n++;
        }
    if (!n) {
        *fmean = mean;
        *fstd = std;
        return;
    }
    const double m = sum / (double)n;
    for (int64_t v = 0; v < nv; v++)
        if (x[v] > mean) {
            double d = x[v] - m;
            ss += d * d;
        }
    *fmean = m;
    *fstd = sqrt(ss / (double)n);
}

int ts_sample_stats(const ts_sample *s, int classes, ts_sample_meta *m)
{
    int err = 0;
    float *tmp = NULL;
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", s->name);
    const int64_t C = s->shape[0], D = s->shape[1], H = s->shape[2], W = s->shape[3];
    if (C < 1 || C > TS_IO_MAX_CHANNELS || D < 1 || H < 1 || W < 1)
        return TS_ERR(TS_ERR_FORMAT, "sample %s: bad shape [%lld, %lld, %lld, %lld]", s->name, (long long)C,
                      (long long)D, (long long)H, (long long)W);
    const int64_t nv = D * H * W;
    memcpy(m->shape, s->shape, sizeof m->shape);
    memcpy(m->spacing, s->spacing, sizeof m->spacing);
    memcpy(m->sform, s->sform, sizeof m->sform);
    memcpy(m->qform, s->qform, sizeof m->qform);
    m->sform_code = s->sform_code;
    m->qform_code = s->qform_code;
    m->nvox = nv;
    snprintf(m->source_image, sizeof m->source_image, "%s", s->source_image);
    snprintf(m->source_label, sizeof m->source_label, "%s", s->source_label);
    tmp = TS_ALIGNED_ALLOC((size_t)nv * sizeof(float));
    if (!tmp) return TS_ERR_NOMEM;
    for (int64_t c = 0; c < C; c++) {
        const float *x = s->image + c * nv;
        double sum = 0, mn = INFINITY, mx = -INFINITY;
        for (int64_t v = 0; v < nv; v++) {
            float f = x[v];
            if (!isfinite(f))
                TS_FAIL(TS_ERR_NUMERIC, "sample %s (%s): image channel %lld has a non-finite value (%g) at voxel "
                        "(d=%lld, h=%lld, w=%lld)", s->name, s->source_image, (long long)c, (double)f,
                        (long long)(v / (H * W)), (long long)(v / W % H), (long long)(v % W));
            sum += f;
            if (f < mn) mn = f;
            if (f > mx) mx = f;
        }
        double mean = sum / (double)nv, ss = 0;
        for (int64_t v = 0; v < nv; v++) {
            double d = x[v] - mean;
            ss += d * d;
        }
        m->mean[c] = mean;
        m->std[c] = sqrt(ss / (double)nv);
        fg_stats(x, nv, mean, m->std[c], &m->fg_mean[c], &m->fg_std[c]);
        m->min[c] = mn;
        m->max[c] = mx;
        memcpy(tmp, x, (size_t)nv * sizeof(float));
        percentiles(tmp, nv, m->pct[c]);
    }
    for (int64_t v = 0; v < nv; v++) {
        unsigned l = s->label[v];
        if ((int)l >= classes)
            TS_FAIL(TS_ERR_FORMAT, "sample %s (%s): label value %u at voxel (d=%lld, h=%lld, w=%lld) is not below "
                    "the number of classes (%d)", s->name, s->source_label, l, (long long)(v / (H * W)),
                    (long long)(v / W % H), (long long)(v % W), classes);
        m->class_voxels[l]++;
    }
cleanup:
    free(tmp);
    return err;
}

/* Up to TS_IO_FG_MAX foreground coordinates, shared equally among the
 * classes present (selection sampling, one pass, seeded per sample). */
int64_t ts_dsw_foreground(const ts_dswriter *w, const ts_sample *s, const ts_sample_meta *m, int32_t *out)
{
    const int K = w->o.classes;
    int present = 0;
    for (int k = 1; k < K; k++) present += m->class_voxels[k] > 0;
    if (!present) return 0;
    int64_t quota = TS_IO_FG_MAX / present, need[TS_IO_MAX_CLASSES], left[TS_IO_MAX_CLASSES];
    for (int k = 0; k < K; k++) {
        left[k] = m->class_voxels[k];
        need[k] = k && left[k] ? (left[k] < quota ? left[k] : quota) : 0;
    }
    ts_rng r;
    ts_rng_init(&r, w->o.seed, (uint32_t)m->index, 0x46470000u + (uint32_t)(m->index >> 32));
    const int64_t H = s->shape[2], W = s->shape[3], nv = m->nvox;
    int64_t n = 0;
    for (int64_t v = 0; v < nv; v++) {
        unsigned l = s->label[v];
        if (!l) continue;
        if (need[l] && ts_rng_below(&r, (uint64_t)left[l]) < (uint64_t)need[l]) {
            out[3 * n] = (int32_t)(v / (H * W));
            out[3 * n + 1] = (int32_t)(v / W % H);
            out[3 * n + 2] = (int32_t)(v % W);
            n++;
            need[l]--;
        }
        left[l]--;
    }
    return n;
}
