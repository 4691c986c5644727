/* Intensity augmentations after nnU-Net's defaults; see augment.h. Owns the
 * draws (ts_aug_draw) and the arithmetic of contrast, inverted gamma,
 * brightness, blur and low resolution on a box and its halo; the order of
 * the draws is io/patch.c's. Local: no MPI, no file. */
#include "tsbuild.h"
#include "io/augment.h"
#include "src/core/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the Gaussian kernel is cut at 4 sigma (scipy.ndimage.gaussian_filter's truncate) */
static int blur_radius(double sigma) { return sigma > 0 ? (int)ceil(4 * sigma) : 0; }

/* a low-resolution voxel samples a voxel within 1/zoom + 1 of the output's */
static int lowres_reach(double zoom) { return (int)ceil(1.0 / zoom) + 2; }

int ts_aug_halo(const ts_aug_opts *a)
{
    int r = 0;
    if (a->blur_p > 0) r += blur_radius(a->blur_sigma_max);
    if (a->lowres_p > 0 && a->lowres_zoom < 1) r += lowres_reach(a->lowres_zoom);
    return r;
}

void ts_aug_draw(const ts_aug_opts *a, double gamma, ts_rng *r, int64_t C, ts_aug_pending *p)
{
    for (int64_t c = 0; c < C; c++) {
        p->bright[c] = p->contrast[c] = p->zoom[c] = 1;
        p->ginv[c] = p->sigma[c] = 0;
    }
    /* per channel, in channel order: contrast, inverted gamma, brightness */
    for (int64_t c = 0; c < C; c++) {
        if (a->contrast_p > 0) {
            const int on = ts_rng_uniform(r) < a->contrast_p, below = ts_rng_uniform(r) < 0.5;
            const double u = ts_rng_uniform(r);
            if (on) p->contrast[c] = below ? 1 - a->contrast * u : 1 + a->contrast * u;
        }
        if (a->gamma_inv_p > 0) {
            const int on = ts_rng_uniform(r) < a->gamma_inv_p;
            const double u = ts_rng_uniform(r);
            if (on) p->ginv[c] = exp((2 * u - 1) * log1p(gamma));
        }
        if (a->brightness_p > 0) {
            const int on = ts_rng_uniform(r) < a->brightness_p;
            const double u = ts_rng_uniform(r);
            if (on) p->bright[c] = 1 + a->brightness * (2 * u - 1);
        }
    }
    /* per patch, then per channel with probability 1/2 (nnU-Net's p_per_channel) */
    if (a->blur_p > 0) {
        const int on = ts_rng_uniform(r) < a->blur_p;
        for (int64_t c = 0; c < C; c++) {
            const int ch = ts_rng_uniform(r) < 0.5;
            const double u = ts_rng_uniform(r);
            if (on && ch) p->sigma[c] = a->blur_sigma_min + (a->blur_sigma_max - a->blur_sigma_min) * u;
        }
    }
    if (a->lowres_p > 0 && a->lowres_zoom < 1) {
        const int on = ts_rng_uniform(r) < a->lowres_p;
        for (int64_t c = 0; c < C; c++) {
            const int ch = ts_rng_uniform(r) < 0.5;
            const double u = ts_rng_uniform(r);
            if (on && ch) p->zoom[c] = a->lowres_zoom + (1 - a->lowres_zoom) * u;
        }
    }
}

/* one separable pass of the Gaussian along axis `ax` of x [n0, n1, n2]:
 * each voxel the kernel's sum in a fixed order (neighbours past the array's
 * edge clamped: only the halo's outer layers see them, and they are never
 * used for the box) */
static void blur_axis(float *x, const int64_t n[3], int ax, const float *w, int rad, float *line)
{
    const int64_t len = n[ax], stride = ax == 0 ? n[1] * n[2] : ax == 1 ? n[2] : 1;
    const int64_t nlines = n[0] * n[1] * n[2] / len;
    for (int64_t l = 0; l < nlines; l++) {
        /* the line's first voxel: l runs over (h, w), (d, w) or (d, h) */
        const int64_t off = ax == 0 ? l : ax == 1 ? (l / n[2]) * n[1] * n[2] + l % n[2] : l * n[2];
        float *base = x + off;
        for (int64_t i = 0; i < len; i++) line[i] = base[i * stride];
        for (int64_t i = 0; i < len; i++) {
            float s = 0;
            for (int k = -rad; k <= rad; k++) {
                int64_t j = i + k;
                j = j < 0 ? 0 : j >= len ? len - 1 : j;
                s += w[k + rad] * line[j];
            }
            base[i * stride] = s;
        }
    }
}

/* per axis: the two low-resolution samples (indices into the halo box) and
 * the weight of the second, for each voxel of the box */
typedef struct {
    int64_t *e0, *e1;
    float *w;
} axis_tab;

static void lowres_table(int64_t n, double zoom, int64_t lo, int64_t size, int R, int64_t ext, axis_tab *t)
{
    const int64_t nl = (int64_t)ceil((double)n * zoom) < 1 ? 1 : (int64_t)ceil((double)n * zoom);
    const double zr = (double)nl / (double)n;
    for (int64_t i = 0; i < size; i++) {
        const double u = ((double)(lo + i) + 0.5) * zr - 0.5, f = floor(u);
        int64_t j0 = (int64_t)f, j1 = j0 + 1;
        j0 = j0 < 0 ? 0 : j0 > nl - 1 ? nl - 1 : j0;
        j1 = j1 < 0 ? 0 : j1 > nl - 1 ? nl - 1 : j1;
        int64_t s0 = (int64_t)floor(((double)j0 + 0.5) / zr), s1 = (int64_t)floor(((double)j1 + 0.5) / zr);
        s0 = s0 > n - 1 ? n - 1 : s0;
        s1 = s1 > n - 1 ? n - 1 : s1;
        int64_t e0 = s0 - lo + R, e1 = s1 - lo + R; /* within the halo by lowres_reach; clamped for safety */
        t->e0[i] = e0 < 0 ? 0 : e0 > ext - 1 ? ext - 1 : e0;
        t->e1[i] = e1 < 0 ? 0 : e1 > ext - 1 ? ext - 1 : e1;
        t->w[i] = (float)(u - f);
    }
}

int ts_aug_neighbours(float *ext, int64_t C, int R, const int64_t patch[3], const int64_t sub_lo[3],
                      const int64_t sub_size[3], const ts_aug_pending *p, float *out)
{
    int err = 0;
    const int64_t n[3] = {sub_size[0] + 2 * R, sub_size[1] + 2 * R, sub_size[2] + 2 * R};
    const int64_t xnv = n[0] * n[1] * n[2], nv = sub_size[0] * sub_size[1] * sub_size[2];
    int64_t lmax = n[0] > n[1] ? n[0] : n[1];
    lmax = lmax > n[2] ? lmax : n[2];
    float *line = malloc((size_t)lmax * sizeof(float));
    axis_tab t[3];
    memset(t, 0, sizeof t);
    for (int d = 0; d < 3; d++) {
        t[d].e0 = malloc((size_t)sub_size[d] * sizeof(int64_t));
        t[d].e1 = malloc((size_t)sub_size[d] * sizeof(int64_t));
        t[d].w = malloc((size_t)sub_size[d] * sizeof(float));
        if (!t[d].e0 || !t[d].e1 || !t[d].w) line = (free(line), NULL);
    }
    if (!line) TS_FAIL(TS_ERR_NOMEM, "augmentation: blur and low-resolution tables for a %lldx%lldx%lld box",
                       (long long)n[0], (long long)n[1], (long long)n[2]);
    for (int64_t c = 0; c < C; c++) {
        float *x = ext + c * xnv, *o = out + c * nv;
        if (p->sigma[c] > 0) {
            const int rad = blur_radius(p->sigma[c]);
            float w[2 * 64 + 1];
            double sum = 0, wd[2 * 64 + 1];
            const int rr = rad > 64 ? 64 : rad;
            for (int k = -rr; k <= rr; k++) sum += wd[k + rr] = exp(-0.5 * k * k / (p->sigma[c] * p->sigma[c]));
            for (int k = -rr; k <= rr; k++) w[k + rr] = (float)(wd[k + rr] / sum);
            for (int ax = 0; ax < 3; ax++) blur_axis(x, n, ax, w, rr, line);
        }
        if (p->zoom[c] < 1) {
            for (int d = 0; d < 3; d++) lowres_table(patch[d], p->zoom[c], sub_lo[d], sub_size[d], R, n[d], &t[d]);
            int64_t v = 0;
            for (int64_t z = 0; z < sub_size[0]; z++) {
                const float wz = t[0].w[z];
                const float *p0 = x + t[0].e0[z] * n[1] * n[2], *p1 = x + t[0].e1[z] * n[1] * n[2];
                for (int64_t y = 0; y < sub_size[1]; y++) {
                    const float wy = t[1].w[y];
                    const int64_t y0 = t[1].e0[y] * n[2], y1 = t[1].e1[y] * n[2];
                    for (int64_t q = 0; q < sub_size[2]; q++, v++) {
                        const float wx = t[2].w[q];
                        const int64_t x0 = t[2].e0[q], x1 = t[2].e1[q];
                        const float a00 = p0[y0 + x0] + wx * (p0[y0 + x1] - p0[y0 + x0]);
                        const float a01 = p0[y1 + x0] + wx * (p0[y1 + x1] - p0[y1 + x0]);
                        const float a10 = p1[y0 + x0] + wx * (p1[y0 + x1] - p1[y0 + x0]);
                        const float a11 = p1[y1 + x0] + wx * (p1[y1 + x1] - p1[y1 + x0]);
                        const float b0 = a00 + wy * (a01 - a00), b1 = a10 + wy * (a11 - a10);
                        o[v] = b0 + wz * (b1 - b0);
                    }
                }
            }
        } else {
            for (int64_t z = 0; z < sub_size[0]; z++)
                for (int64_t y = 0; y < sub_size[1]; y++)
                    memcpy(o + (z * sub_size[1] + y) * sub_size[2], x + ((z + R) * n[1] + y + R) * n[2] + R,
                           (size_t)sub_size[2] * sizeof(float));
        }
    }
cleanup:
    free(line);
    for (int d = 0; d < 3; d++) {
        free(t[d].e0);
        free(t[d].e1);
        free(t[d].w);
    }
    return err;
}

void ts_aug_before_gamma(float *x, int64_t nv, const ts_aug_pending *p, int64_t c, float mn, float mx)
{
    if (p->contrast[c] != 1) {
        const float f = (float)p->contrast[c];
        for (int64_t t = 0; t < nv; t++) {
            float v = x[t] * f;
            x[t] = v < mn ? mn : v > mx ? mx : v;
        }
    }
    if (p->ginv[c] > 0 && mx > mn) {
        const float rng_ = mx - mn, g = (float)p->ginv[c];
        for (int64_t t = 0; t < nv; t++) {
            const float u = (mx - x[t]) / rng_, v = mx - rng_ * powf(u < 0 ? 0 : u, g);
            x[t] = v < mn ? mn : v; /* rounding must not leave [mn, mx]: data.gamma's powf would be NaN */
        }
    }
}

void ts_aug_after_gamma(float *x, int64_t nv, const ts_aug_pending *p, int64_t c)
{
    if (p->bright[c] != 1) {
        const float m = (float)p->bright[c];
        for (int64_t t = 0; t < nv; t++) x[t] *= m;
    }
}
