/* Spatial augmentation by sampling; see augment_spatial.h. Every output
 * voxel's source coordinate is computed in double precision from its place
 * in the whole patch and the patch's drawn parameters only, then the image
 * is interpolated trilinearly (taps outside the volume are 0, the
 * normalised padding) and the label taken from the nearest voxel (0
 * outside). The box read from the file is the bounding box of the source
 * coordinates of this rank's voxels, with one voxel of margin, clipped to
 * the volume: any tap inside the volume lies in it, so what a voxel gets
 * does not depend on which box of the patch it is computed in. */
#include "tsbuild.h"
#include "io/augment_spatial.h"
#include "io/patch.h"
#include "src/core/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int ts_spatial_aug_check(const ts_spatial_aug_opts *o)
{
    if (!(o->rot_p >= 0 && o->rot_p <= 1) || !(o->rot_deg >= 0 && o->rot_deg <= 180))
        return TS_ERR(TS_ERR_CONFIG, "data.rot_p (%g) must lie in 0..1 and data.rot_deg (%g) in 0..180", o->rot_p,
                      o->rot_deg);
    if (!(o->zoom_p >= 0 && o->zoom_p <= 1)) return TS_ERR(TS_ERR_CONFIG, "data.zoom_p (%g) must lie in 0..1", o->zoom_p);
    if (o->zoom_p > 0 && (!(o->zoom_min > 0) || !(o->zoom_max >= o->zoom_min) ||
        !(o->zoom_max <= 10)))
        return TS_ERR(TS_ERR_CONFIG, "data.zoom_min (%g) and data.zoom_max (%g): 0 < data.zoom_min <= data.zoom_max "
                      "<= 10", o->zoom_min, o->zoom_max);
    if (!(o->elastic_p >= 0 && o->elastic_p <= 1))
        return TS_ERR(TS_ERR_CONFIG, "data.elastic_p (%g) must lie in 0..1", o->elastic_p);
    if (o->plane && !(o->rot_deg_plane >= 0 && o->rot_deg_plane <= 180))
        return TS_ERR(TS_ERR_CONFIG, "data.rot_deg_2d (%g) must lie in 0..180", o->rot_deg_plane);
    if (o->elastic_p > 0 && (o->elastic_points < 4 || o->elastic_points > TS_ELASTIC_MAX_POINTS ||
                             !(o->elastic_disp >= 0 && o->elastic_disp <= 1000)))
        return TS_ERR(TS_ERR_CONFIG, "data.elastic_points (%d) must lie in 4..%d and data.elastic_disp (%g) in 0..1000",
                      o->elastic_points, TS_ELASTIC_MAX_POINTS, o->elastic_disp);
    return 0;
}

double ts_spatial_aug_read_voxels(const ts_spatial_aug_opts *o, const int64_t box[3], const int64_t vol[3])
{
    if (!(o->rot_p > 0) && !(o->zoom_p > 0) && !(o->elastic_p > 0 && o->elastic_disp > 0)) return 0;
    const double z = o->zoom_p > 0 && o->zoom_max > 1 ? o->zoom_max : 1;
    const double m = 2 * (o->elastic_p > 0 ? o->elastic_disp : 0) + 4 + (o->cubic ? 1 : 0); /* the read box's margins */
    double most = 0;
    for (int k = 0; k < 2; k++) { /* a 90-degree rotation about D (data.rot90) swaps the read box's H and W */
        const double b[3] = {(double)box[0], (double)box[k ? 2 : 1], (double)box[k ? 1 : 2]};
        const double diag = sqrt(b[0] * b[0] + b[1] * b[1] + b[2] * b[2]), hw = sqrt(b[1] * b[1] + b[2] * b[2]);
        double n = 1;
        for (int d = 0; d < 3; d++) {
            double e = !(o->rot_p > 0) ? z * b[d] : o->plane ? (d ? z * hw : b[d]) : z * diag;
            e = ceil(e + m);
            if (vol && e > (double)vol[d]) e = (double)vol[d];
            n *= e;
        }
        most = n > most ? n : most;
    }
    return most;
}

int ts_spatial_aug_plane_auto(const int64_t patch[3])
{
    const int64_t m = patch[0] > patch[1] ? (patch[0] > patch[2] ? patch[0] : patch[2]) : (patch[1] > patch[2] ? patch[1] : patch[2]);
    return (double)m / (double)patch[0] > 3.0;
}

int ts_spatial_aug_plane_of(const char *mode, const int64_t patch[3])
{
    return !strcmp(mode, "on") || (!strcmp(mode, "auto") && ts_spatial_aug_plane_auto(patch));
}

void ts_spatial_aug_draw(const ts_spatial_aug_opts *o, ts_rng *r, ts_spatial_xform *x)
{
    memset(x, 0, sizeof *x);
    x->zoom = 1;
    x->plane = o->plane;
    x->cubic = o->cubic;
    x->label_linear = o->label_linear;
    int rot = 0, zoom = 0;
    if (o->rot_p > 0) {
        rot = ts_rng_uniform(r) < o->rot_p;
        for (int d = 0; d < 3; d++) { /* three draws either way: in the plane only the first is used */
            double u = ts_rng_uniform(r);
            x->angle[d] = !rot || (o->plane && d) ? 0 : (o->plane ? o->rot_deg_plane : o->rot_deg) * (2 * u - 1);
        }
    }
    if (o->zoom_p > 0) {
        zoom = ts_rng_uniform(r) < o->zoom_p;
        double u = ts_rng_uniform(r);
        if (zoom) x->zoom = o->zoom_min + (o->zoom_max - o->zoom_min) * u;
    }
    if (o->elastic_p > 0) {
        x->elastic = ts_rng_uniform(r) < o->elastic_p;
        uint64_t key = ts_rng_u64(r);
        if (x->elastic) {
            x->elastic_key = key;
            x->elastic_points = o->elastic_points;
            x->elastic_disp = o->elastic_disp;
        }
        if (!(x->elastic_disp > 0)) x->elastic = 0;
    }
    x->on = rot || zoom || x->elastic;
    /* a = zoom * R_D(angle 0) R_H(angle 1) R_W(angle 2), axes (D, H, W) */
    const double pi = 3.14159265358979323846;
    double c[3], s[3];
    for (int d = 0; d < 3; d++) {
        c[d] = cos(x->angle[d] * pi / 180);
        s[d] = sin(x->angle[d] * pi / 180);
    }
    const double rd[3][3] = {{1, 0, 0}, {0, c[0], -s[0]}, {0, s[0], c[0]}};
    const double rh[3][3] = {{c[1], 0, s[1]}, {0, 1, 0}, {-s[1], 0, c[1]}};
    const double rw[3][3] = {{c[2], -s[2], 0}, {s[2], c[2], 0}, {0, 0, 1}};
    double t[3][3];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) t[i][j] = rd[i][0] * rh[0][j] + rd[i][1] * rh[1][j] + rd[i][2] * rh[2][j];
    for (int i = 0; i < 3; i++) /* in the plane the zoom scales H and W only */
        for (int j = 0; j < 3; j++)
            x->a[i][j] = (o->plane && j == 0 ? 1 : x->zoom) * (t[i][0] * rw[0][j] + t[i][1] * rw[1][j] + t[i][2] * rw[2][j]);
}

/* the control points' displacements [3][n^3], uniform in [-disp, disp]:
 * point (j0, j1, j2), axis a is Philox block (index, a, "EL") under the key */
static void control_points(const ts_spatial_xform *x, double *coef)
{
    const int n = x->elastic_points, n3 = n * n * n;
    const uint32_t key[2] = {(uint32_t)x->elastic_key, (uint32_t)(x->elastic_key >> 32)};
    for (int a = 0; a < 3; a++)
        for (int j = 0; j < n3; j++) {
            const uint32_t ctr[4] = {(uint32_t)j, (uint32_t)a, 0x454c0000u, 0};
            uint32_t o[4];
            ts_philox4x32(ctr, key, o);
            coef[a * n3 + j] = a == 0 && x->plane ? 0 : x->elastic_disp * (2 * ((double)(o[0] >> 8) / 16777216.0) - 1);
        }
}

/* cubic B-spline weights and first control index of coordinate s along an
 * axis of `len` voxels spanned by n points */
static void bspline(double s, int64_t len, int n, double w[4], int idx[4])
{
    const double u = len > 1 ? s * (double)(n - 1) / (double)(len - 1) : 0;
    double fi = floor(u);
    const double f = u - fi, f2 = f * f, f3 = f2 * f;
    w[0] = (1 - f) * (1 - f) * (1 - f) / 6;
    w[1] = (3 * f3 - 6 * f2 + 4) / 6;
    w[2] = (-3 * f3 + 3 * f2 + 3 * f + 1) / 6;
    w[3] = f3 / 6;
    for (int t = 0; t < 4; t++) {
        int j = (int)fi - 1 + t;
        idx[t] = j < 0 ? 0 : j > n - 1 ? n - 1 : j;
    }
}

/* adds the elastic displacement at patch position s (the B-spline of the
 * n^3 control points coef, box the patch's extent) to v */
static void elastic_add(const double *coef, int n, const int64_t box[3], const double s[3], double v[3])
{
    const int n3 = n * n * n;
    double w[3][4];
    int id[3][4];
    for (int d = 0; d < 3; d++) bspline(s[d], box[d], n, w[d], id[d]);
    double e[3] = {0, 0, 0};
    for (int p = 0; p < 4; p++)
        for (int q = 0; q < 4; q++) {
            const double wpq = w[0][p] * w[1][q];
            const int row = (id[0][p] * n + id[1][q]) * n;
            for (int u = 0; u < 4; u++) {
                const double ww = wpq * w[2][u];
                const int j = row + id[2][u];
                e[0] += ww * coef[j];
                e[1] += ww * coef[n3 + j];
                e[2] += ww * coef[2 * n3 + j];
            }
        }
    for (int d = 0; d < 3; d++) v[d] += e[d];
}

/* Keys' cubic convolution kernel (a = -0.5) at distance t */
static double keys(double t)
{
    t = fabs(t);
    if (t < 1) return (1.5 * t - 2.5) * t * t + 1;
    if (t < 2) return ((-0.5 * t + 2.5) * t - 4) * t + 2;
    return 0;
}

/* The image at a sampling place by cubic convolution: 4 taps per axis from b0 - 1 to b0 + 2 (relative to the
 * read box of rsz voxels, taps outside it 0), fractions f; into image[c * nv + t], min and max kept. */
static void cubic_sample(const float *buf, int64_t C, int64_t nr, const int64_t rsz[3], const int64_t b0[3],
                         const double f[3], float *image, int64_t nv, int64_t t, float *mn, float *mx)
{
    double w[3][4];
    for (int d = 0; d < 3; d++)
        for (int j = 0; j < 4; j++) w[d][j] = keys(f[d] - (double)(j - 1));
    for (int64_t c = 0; c < C; c++) {
        const float *src = buf + c * nr;
        double acc = 0;
        for (int i = 0; i < 4; i++) {
            const int64_t p0 = b0[0] - 1 + i;
            if (p0 < 0 || p0 >= rsz[0] || w[0][i] == 0) continue;
            for (int j = 0; j < 4; j++) {
                const int64_t p1 = b0[1] - 1 + j;
                if (p1 < 0 || p1 >= rsz[1] || w[1][j] == 0) continue;
                const float *row = src + (p0 * rsz[1] + p1) * rsz[2];
                double r = 0;
                for (int q = 0; q < 4; q++) {
                    const int64_t p2 = b0[2] - 1 + q;
                    if (p2 >= 0 && p2 < rsz[2]) r += w[2][q] * (double)row[p2];
                }
                acc += w[0][i] * w[1][j] * r;
            }
        }
        const float val = (float)acc;
        image[c * nv + t] = val;
        mn[c] = val < mn[c] ? val : mn[c];
        mx[c] = val > mx[c] ? val : mx[c];
    }
}

void ts_spatial_aug_read_box(const ts_spatial_xform *x, const int64_t patch[3], int k, int flips, const int64_t lo[3],
                             const int64_t sub_lo[3], const int64_t sub_size[3], const int64_t dim[3], int64_t rlo[3],
                             int64_t rsz[3])
{
    const int64_t box[3] = {patch[0], (k & 1) ? patch[2] : patch[1], (k & 1) ? patch[1] : patch[2]};
    double ctr[3];
    for (int d = 0; d < 3; d++) ctr[d] = (double)(box[d] - 1) / 2;
    /* the read-box coordinates of our voxels span the preimage box; its
     * corners bound the affine image, the elastic part adds at most disp */
    int64_t pre_lo[3], pre_size[3];
    ts_patch_preimage(patch, sub_lo, sub_size, k, flips, pre_lo, pre_size);
    double vmin[3] = {INFINITY, INFINITY, INFINITY}, vmax[3] = {-INFINITY, -INFINITY, -INFINITY};
    for (int corner = 0; corner < 8; corner++) {
        double s[3];
        for (int d = 0; d < 3; d++) s[d] = (double)(pre_lo[d] + ((corner >> d) & 1) * (pre_size[d] - 1)) - ctr[d];
        for (int d = 0; d < 3; d++) {
            double v = (double)lo[d] + ctr[d] + x->a[d][0] * s[0] + x->a[d][1] * s[1] + x->a[d][2] * s[2];
            vmin[d] = fmin(vmin[d], v);
            vmax[d] = fmax(vmax[d], v);
        }
    }
    const double margin = x->elastic ? x->elastic_disp : 0;
    for (int d = 0; d < 3; d++) { /* the taps: floor(v) and the next (trilinear), from floor(v) - 1 to + 2 (cubic) */
        int64_t a = (int64_t)floor(vmin[d] - margin) - 1, b = (int64_t)floor(vmax[d] + margin) + 2 + (x->cubic ? 1 : 0);
        a = a < 0 ? 0 : a;
        b = b > dim[d] ? dim[d] : b;
        rlo[d] = a;
        rsz[d] = b > a ? b - a : 0;
    }
}

int ts_spatial_aug_box(ts_dataset *ds, int64_t i, const ts_spatial_xform *x, const int64_t patch[3], int k,
                       int flips, const int64_t lo[3], const int64_t sub_lo[3], const int64_t sub_size[3],
                       ts_spatial_norm_fn normalize, void *ctx, float *image, uint8_t *label, float *mn, float *mx)
{
    ts_sample_info in;
    TS_TRY(ts_dataset_info(ds, i, &in));
    const int64_t C = in.shape[0], dim[3] = {in.shape[1], in.shape[2], in.shape[3]};
    const int64_t D = patch[0], H = patch[1], W = patch[2];
    const int64_t box[3] = {D, (k & 1) ? W : H, (k & 1) ? H : W};
    double ctr[3];
    for (int d = 0; d < 3; d++) ctr[d] = (double)(box[d] - 1) / 2;
    int64_t rlo[3], rsz[3];
    ts_spatial_aug_read_box(x, patch, k, flips, lo, sub_lo, sub_size, dim, rlo, rsz);
    const int64_t nr = rsz[0] * rsz[1] * rsz[2];
    const int n = x->elastic ? x->elastic_points : 0, n3 = n * n * n; /* control points */
    int err = 0;
    float *buf = nr ? malloc((size_t)(nr * C) * sizeof(float)) : NULL;
    uint8_t *lbuf = nr ? malloc((size_t)nr) : NULL;
    double *coef = n ? malloc((size_t)(3 * n3) * sizeof(double)) : NULL;
    if ((nr && (!buf || !lbuf)) || (n && !coef))
        TS_FAIL(TS_ERR_NOMEM, "augment: out of memory for the %lldx%lldx%lld box the transformed patch of sample "
                "%lld is read from", (long long)rsz[0], (long long)rsz[1], (long long)rsz[2], (long long)i);
    if (nr) {
        TS_CHECK(ts_dataset_read_box(ds, i, rlo, rsz, buf, lbuf, NAN));
        normalize(ctx, buf, C, nr);
    }
    if (n) control_points(x, coef);
    const int64_t nv = sub_size[0] * sub_size[1] * sub_size[2], sy_ = rsz[1] * rsz[2];
    for (int64_t c = 0; c < C; c++) {
        mn[c] = INFINITY;
        mx[c] = -INFINITY;
    }
    int64_t t = 0;
    for (int64_t z = 0; z < sub_size[0]; z++) {
        const int64_t gz = sub_lo[0] + z, sz = (flips & 1) ? D - 1 - gz : gz;
        for (int64_t y = 0; y < sub_size[1]; y++)
            for (int64_t xx = 0; xx < sub_size[2]; xx++, t++) {
                /* the read-box voxel, as in ts_patch_transform_box */
                const int64_t gy = sub_lo[1] + y, gx = sub_lo[2] + xx;
                const int64_t fy = (flips & 2) ? H - 1 - gy : gy, fx = (flips & 4) ? W - 1 - gx : gx;
                int64_t sy, sx;
                switch (k & 3) {
                case 0: sy = fy; sx = fx; break;
                case 1: sy = fx; sx = H - 1 - fy; break;
                case 2: sy = H - 1 - fy; sx = W - 1 - fx; break;
                default: sy = W - 1 - fx; sx = fy; break;
                }
                const double s[3] = {(double)sz - ctr[0], (double)sy - ctr[1], (double)sx - ctr[2]};
                double v[3];
                for (int d = 0; d < 3; d++)
                    v[d] = (double)lo[d] + ctr[d] + x->a[d][0] * s[0] + x->a[d][1] * s[1] + x->a[d][2] * s[2];
                if (n) {
                    const int64_t h = x->halo, rbox[3] = {box[0] - 2 * h, box[1] - 2 * h, box[2] - 2 * h};
                    elastic_add(coef, n, rbox, (double[3]){(double)(sz - h), (double)(sy - h), (double)(sx - h)}, v);
                }
                /* trilinear taps relative to the read box; outside it: 0 */
                double fl[3], f[3];
                int64_t b0[3];
                for (int d = 0; d < 3; d++) {
                    fl[d] = floor(v[d]);
                    f[d] = v[d] - fl[d];
                    b0[d] = (int64_t)fl[d] - rlo[d];
                }
                int64_t off[8];
                double wt[8];
                for (int corner = 0; corner < 8; corner++) {
                    const int64_t p0 = b0[0] + (corner >> 2), p1 = b0[1] + ((corner >> 1) & 1), p2 = b0[2] + (corner & 1);
                    const int in_box = p0 >= 0 && p0 < rsz[0] && p1 >= 0 && p1 < rsz[1] && p2 >= 0 && p2 < rsz[2];
                    off[corner] = in_box ? (p0 * rsz[1] + p1) * rsz[2] + p2 : -1;
                    wt[corner] = ((corner >> 2) ? f[0] : 1 - f[0]) * (((corner >> 1) & 1) ? f[1] : 1 - f[1]) *
                                 ((corner & 1) ? f[2] : 1 - f[2]);
                }
                if (x->cubic) {
                    cubic_sample(buf, C, nr, rsz, b0, f, image, nv, t, mn, mx);
                } else {
                    for (int64_t c = 0; c < C; c++) {
                        const float *src = buf + c * nr;
                        double acc = 0;
                        for (int corner = 0; corner < 8; corner++)
                            if (off[corner] >= 0) acc += wt[corner] * (double)src[off[corner]];
                        const float val = (float)acc;
                        image[c * nv + t] = val;
                        mn[c] = val < mn[c] ? val : mn[c];
                        mx[c] = val > mx[c] ? val : mx[c];
                    }
                }
                if (x->label_linear) { /* one-hot linear: the class with the largest summed weight (0 outside) */
                    uint8_t cls[8];
                    double cw[8];
                    int nc = 0, best = 0;
                    for (int corner = 0; corner < 8; corner++) {
                        const uint8_t kk = off[corner] >= 0 ? lbuf[off[corner]] : 0;
                        int j = 0;
                        while (j < nc && cls[j] != kk) j++;
                        if (j == nc) cls[nc] = kk, cw[nc++] = 0;
                        cw[j] += wt[corner];
                    }
                    for (int j = 1; j < nc; j++)
                        if (cw[j] > cw[best] || (cw[j] == cw[best] && cls[j] < cls[best])) best = j;
                    label[t] = cls[best];
                    continue;
                }
                /* nearest voxel for the label */
                const int64_t q0 = (int64_t)floor(v[0] + 0.5) - rlo[0], q1 = (int64_t)floor(v[1] + 0.5) - rlo[1],
                              q2 = (int64_t)floor(v[2] + 0.5) - rlo[2];
                label[t] = q0 >= 0 && q0 < rsz[0] && q1 >= 0 && q1 < rsz[1] && q2 >= 0 && q2 < rsz[2]
                               ? lbuf[q0 * sy_ + q1 * rsz[2] + q2]
                               : 0;
            }
    }
cleanup:
    free(buf);
    free(lbuf);
    free(coef);
    return err;
}
