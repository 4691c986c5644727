/* Surface distances (HD95, NSD) and largest-component post-processing of
 * label maps: see surface.h for the definitions. The distance transform is
 * the separable lower envelope of parabolas (Felzenszwalb and Huttenlocher,
 * 2012), exact for anisotropic spacing, run on the box that holds both
 * surfaces (distances between points of the box need no seed outside it).
 * Owns the metrics on label maps; local, no model and no communication. */
#include "src/infer/surface.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/error.h"

#define FAR 1e300

static int64_t idx3(const int64_t dhw[3], int64_t z, int64_t y, int64_t x)
{
    return (z * dhw[1] + y) * dhw[2] + x;
}

/* Voxel (z, y, x) of class cls lies on the surface: a face neighbour is of
 * another class or outside the volume. */
static int on_surface(const uint8_t *l, const int64_t dhw[3], int cls, int64_t z, int64_t y, int64_t x)
{
    int64_t i = idx3(dhw, z, y, x);
    if (l[i] != cls) return 0;
    if (z == 0 || z == dhw[0] - 1 || y == 0 || y == dhw[1] - 1 || x == 0 || x == dhw[2] - 1) return 1;
    int64_t sz = dhw[1] * dhw[2], sy = dhw[2];
    return l[i - sz] != cls || l[i + sz] != cls || l[i - sy] != cls || l[i + sy] != cls || l[i - 1] != cls ||
           l[i + 1] != cls;
}

/* One line of the squared distance transform: f[k * stride], k < n, at
 * positions k * s; v, zz and g scratch of n, n + 1 and n entries. */
static void edt_line(double *f, int64_t n, int64_t stride, double s, int64_t *v, double *zz, double *g)
{
    int64_t k = -1;
    for (int64_t q = 0; q < n; q++) {
        double fq = f[q * stride];
        g[q] = fq;
        if (fq >= FAR) continue;
        double xq = q * s;
        while (k >= 0) {
            double xv = v[k] * s;
            double sep = ((fq + xq * xq) - (g[v[k]] + xv * xv)) / (2 * (xq - xv));
            if (sep > zz[k]) {
                k++;
                v[k] = q;
                zz[k] = sep;
                zz[k + 1] = INFINITY;
                break;
            }
            k--;
        }
        if (k < 0) {
            k = 0;
            v[0] = q;
            zz[0] = -INFINITY;
            zz[1] = INFINITY;
        }
    }
    if (k < 0) return; /* no seed on this line: stays FAR */
    int64_t j = 0;
    for (int64_t q = 0; q < n; q++) {
        double xq = q * s;
        while (zz[j + 1] < xq) j++;
        double d = (double)(q - v[j]) * s; /* exact 0 at a seed, whatever the contraction */
        f[q * stride] = d * d + g[v[j]];
    }
}

/* Squared distances (mm^2) from every voxel of the box to the nearest seed
 * (f == 0; others FAR), in place. */
static int edt3(double *f, const int64_t n[3], const double sp[3])
{
    int64_t m = n[0] > n[1] ? n[0] : n[1];
    if (n[2] > m) m = n[2];
    int64_t *v = TS_MALLOC(sizeof(int64_t) * (size_t)m);
    double *zz = TS_MALLOC(sizeof(double) * (size_t)(m + 1));
    double *g = TS_MALLOC(sizeof(double) * (size_t)m);
    if (!v || !zz || !g) {
        free(v), free(zz), free(g);
        return TS_ERR_NOMEM;
    }
    int64_t sz = n[1] * n[2], sy = n[2];
    for (int64_t z = 0; z < n[0]; z++)
        for (int64_t y = 0; y < n[1]; y++) edt_line(f + z * sz + y * sy, n[2], 1, sp[2], v, zz, g);
    for (int64_t z = 0; z < n[0]; z++)
        for (int64_t x = 0; x < n[2]; x++) edt_line(f + z * sz + x, n[1], sy, sp[1], v, zz, g);
    for (int64_t y = 0; y < n[1]; y++)
        for (int64_t x = 0; x < n[2]; x++) edt_line(f + y * sy + x, n[0], sz, sp[0], v, zz, g);
    free(v), free(zz), free(g);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy.percentile's default (linear) of n values, sorted in place. */
static double percentile(double *d, int64_t n, double q)
{
    qsort(d, (size_t)n, sizeof(double), cmp_double);
    double pos = q / 100.0 * (double)(n - 1);
    int64_t lo = (int64_t)floor(pos);
    if (lo >= n - 1) return d[n - 1];
    return d[lo] + (pos - (double)lo) * (d[lo + 1] - d[lo]);
}

int ts_surface_metrics_class(const uint8_t *pred, const uint8_t *ref, const int64_t dhw[3], const double spacing[3],
                             int cls, double tol_mm, ts_surface_metrics *out)
{
    for (int a = 0; a < 3; a++)
        if (!(spacing[a] > 0) || !isfinite(spacing[a]))
            return TS_ERR(TS_ERR_ARG, "surface metrics: voxel spacing %g along axis %d is not positive", spacing[a], a);
    if (!(tol_mm >= 0)) return TS_ERR(TS_ERR_ARG, "surface metrics: tolerance %g mm is negative", tol_mm);
    /* the box that holds both surfaces */
    int64_t lo[3] = {dhw[0], dhw[1], dhw[2]}, hi[3] = {-1, -1, -1};
    int64_t np = 0, nr = 0;
    for (int64_t z = 0; z < dhw[0]; z++)
        for (int64_t y = 0; y < dhw[1]; y++)
            for (int64_t x = 0; x < dhw[2]; x++) {
                int64_t i = idx3(dhw, z, y, x);
                if (pred[i] != cls && ref[i] != cls) continue;
                int sp = on_surface(pred, dhw, cls, z, y, x), sr = on_surface(ref, dhw, cls, z, y, x);
                np += sp, nr += sr;
                if (!sp && !sr) continue;
                int64_t c[3] = {z, y, x};
                for (int a = 0; a < 3; a++) {
                    if (c[a] < lo[a]) lo[a] = c[a];
                    if (c[a] > hi[a]) hi[a] = c[a];
                }
            }
    out->n_pred = np, out->n_ref = nr;
    if (!np || !nr) {
        out->hd95 = !np && !nr ? NAN : INFINITY;
        out->nsd = !np && !nr ? NAN : 0.0;
        return 0;
    }
    int64_t n[3] = {hi[0] - lo[0] + 1, hi[1] - lo[1] + 1, hi[2] - lo[2] + 1}, nv = n[0] * n[1] * n[2];
    double *dp = TS_MALLOC(sizeof(double) * (size_t)nv), *dr = TS_MALLOC(sizeof(double) * (size_t)nv);
    double *ap = TS_MALLOC(sizeof(double) * (size_t)np), *ar = TS_MALLOC(sizeof(double) * (size_t)nr);
    uint8_t *on = TS_MALLOC((size_t)nv); /* bit 0: prediction surface, bit 1: reference surface */
    int e = TS_ERR_NOMEM;
    if (!dp || !dr || !ap || !ar || !on) goto done;
    for (int64_t z = 0; z < n[0]; z++)
        for (int64_t y = 0; y < n[1]; y++)
            for (int64_t x = 0; x < n[2]; x++) {
                int64_t b = (z * n[1] + y) * n[2] + x;
                on[b] = (uint8_t)(on_surface(pred, dhw, cls, lo[0] + z, lo[1] + y, lo[2] + x) |
                                  on_surface(ref, dhw, cls, lo[0] + z, lo[1] + y, lo[2] + x) << 1);
                dp[b] = on[b] & 1 ? 0 : FAR;
                dr[b] = on[b] & 2 ? 0 : FAR;
            }
    if ((e = edt3(dp, n, spacing)) || (e = edt3(dr, n, spacing))) goto done;
    int64_t kp = 0, kr = 0, within = 0;
    for (int64_t b = 0; b < nv; b++) {
        if (on[b] & 1) { /* a prediction surface voxel: its distance to the reference's */
            ap[kp] = sqrt(dr[b]);
            within += ap[kp++] <= tol_mm;
        }
        if (on[b] & 2) {
            ar[kr] = sqrt(dp[b]);
            within += ar[kr++] <= tol_mm;
        }
    }
    double hp = percentile(ap, kp, 95), hr = percentile(ar, kr, 95);
    out->hd95 = hp > hr ? hp : hr;
    out->nsd = (double)within / (double)(kp + kr);
    e = 0;
done:
    free(dp), free(dr), free(ap), free(ar), free(on);
    return e;
}

/* voxel of the region: class cls, or any foreground class (cls < 0) */
static inline int in_region(uint8_t v, int cls) { return cls < 0 ? v != 0 : v == cls; }

int ts_keep_largest_component(uint8_t *label, const int64_t dhw[3], int cls, int64_t *removed)
{
    int64_t nv = dhw[0] * dhw[1] * dhw[2];
    if (removed) *removed = 0;
    int32_t *comp = TS_MALLOC(sizeof(int32_t) * (size_t)nv);
    int64_t *queue = TS_MALLOC(sizeof(int64_t) * (size_t)nv);
    if (!comp || !queue) {
        free(comp), free(queue);
        return TS_ERR_NOMEM;
    }
    memset(comp, 0, sizeof(int32_t) * (size_t)nv);
    int32_t ncomp = 0, best = 0;
    int64_t best_size = 0;
    for (int64_t s = 0; s < nv; s++) {
        if (!in_region(label[s], cls) || comp[s]) continue;
        int32_t id = ++ncomp;
        int64_t head = 0, tail = 0;
        queue[tail++] = s;
        comp[s] = id;
        while (head < tail) {
            int64_t i = queue[head++];
            int64_t z = i / (dhw[1] * dhw[2]), y = i / dhw[2] % dhw[1], x = i % dhw[2];
            for (int dz = -1; dz <= 1; dz++)
                for (int dy = -1; dy <= 1; dy++)
                    for (int dx = -1; dx <= 1; dx++) {
                        int64_t zz = z + dz, yy = y + dy, xx = x + dx;
                        if (zz < 0 || zz >= dhw[0] || yy < 0 || yy >= dhw[1] || xx < 0 || xx >= dhw[2]) continue;
                        int64_t j = idx3(dhw, zz, yy, xx);
                        if (!in_region(label[j], cls) || comp[j]) continue;
                        comp[j] = id;
                        queue[tail++] = j;
                    }
        }
        if (tail > best_size) best_size = tail, best = id;
    }
    int64_t n = 0;
    for (int64_t i = 0; i < nv; i++)
        if (comp[i] && comp[i] != best) label[i] = 0, n++;
    if (removed) *removed = n;
    free(comp), free(queue);
    return 0;
}
