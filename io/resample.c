/* Integer-factor resampling; see resample.h. Also resampling to any size
 * (images and labels) and the voxel-to-world updates. Owns the
 * interpolation; what is resampled and when is io/preprocess.c's. Local: no
 * MPI, no file. */
#include "tsbuild.h"
#include "io/resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/error.h"

void ts_resample_down(int64_t C, const int64_t dhw[3], int f, const float *img, float *out, const uint8_t *lab, int K,
                      uint8_t *olab)
{
    const int64_t D = dhw[0], H = dhw[1], W = dhw[2];
    const int64_t d2 = ts_resample_size(D, f), h2 = ts_resample_size(H, f), w2 = ts_resample_size(W, f);
    for (int64_t z = 0; z < d2; z++)
        for (int64_t y = 0; y < h2; y++)
            for (int64_t x = 0; x < w2; x++) {
                const int64_t z0 = z * f, y0 = y * f, x0 = x * f;
                const int64_t z1 = z0 + f < D ? z0 + f : D, y1 = y0 + f < H ? y0 + f : H, x1 = x0 + f < W ? x0 + f : W;
                const int64_t o = (z * h2 + y) * w2 + x;
                if (img && out)
                    for (int64_t c = 0; c < C; c++) {
                        double s = 0;
                        for (int64_t a = z0; a < z1; a++)
                            for (int64_t b = y0; b < y1; b++)
                                for (int64_t e = x0; e < x1; e++) s += img[((c * D + a) * H + b) * W + e];
                        out[c * d2 * h2 * w2 + o] = (float)(s / (double)((z1 - z0) * (y1 - y0) * (x1 - x0)));
                    }
                if (lab && olab) {
                    int counts[256];
                    memset(counts, 0, sizeof(int) * (size_t)(K > 0 && K <= 256 ? K : 256));
                    for (int64_t a = z0; a < z1; a++)
                        for (int64_t b = y0; b < y1; b++)
                            for (int64_t e = x0; e < x1; e++) counts[lab[(a * H + b) * W + e]]++;
                    int best = 0;
                    for (int k = 1; k < (K > 0 && K <= 256 ? K : 256); k++)
                        if (counts[k] > counts[best]) best = k;
                    olab[o] = (uint8_t)best;
                }
            }
}

void ts_resample_up_labels(const uint8_t *coarse, const int64_t dhw[3], int f, uint8_t *fine)
{
    const int64_t D = dhw[0], H = dhw[1], W = dhw[2];
    const int64_t h2 = ts_resample_size(H, f), w2 = ts_resample_size(W, f);
    for (int64_t z = 0; z < D; z++)
        for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++) fine[(z * H + y) * W + x] = coarse[((z / f) * h2 + y / f) * w2 + x / f];
}

void ts_resample_affine(const double in[16], int f, double out[16])
{
    const double off = (f - 1) / 2.0;
    double m[16];
    memcpy(m, in, sizeof m);
    for (int r = 0; r < 3; r++) {
        /* new column j = f * old column j; translation moves by off along each old column */
        double t = m[r * 4 + 3];
        for (int j = 0; j < 3; j++) {
            t += m[r * 4 + j] * off;
            out[r * 4 + j] = m[r * 4 + j] * f;
        }
        out[r * 4 + 3] = t;
    }
    for (int j = 0; j < 4; j++) out[12 + j] = m[12 + j];
}

int64_t ts_resample_size_to(int64_t n, double sp_in, double sp_out)
{
    int64_t m = (int64_t)llround((double)n * sp_in / sp_out);
    return m < 1 ? 1 : m;
}

/* The two input indices and the weight of the upper one for output voxel o. */
static void taps(int64_t o, int64_t n_in, int64_t n_out, int64_t *i0, int64_t *i1, float *w)
{
    double x = ((double)o + 0.5) * (double)n_in / (double)n_out - 0.5;
    if (x < 0) x = 0;
    if (x > (double)(n_in - 1)) x = (double)(n_in - 1);
    int64_t a = (int64_t)floor(x);
    *i0 = a;
    *i1 = a + 1 < n_in ? a + 1 : a;
    *w = (float)(x - (double)a);
}

void ts_resample_linear(int64_t C, const int64_t in[3], const float *img, const int64_t out[3], float *res)
{
    const int64_t H = in[1], W = in[2], nin = in[0] * H * W, nout = out[0] * out[1] * out[2];
    for (int64_t z = 0; z < out[0]; z++) {
        int64_t z0, z1;
        float wz;
        taps(z, in[0], out[0], &z0, &z1, &wz);
        for (int64_t y = 0; y < out[1]; y++) {
            int64_t y0, y1;
            float wy;
            taps(y, H, out[1], &y0, &y1, &wy);
            for (int64_t x = 0; x < out[2]; x++) {
                int64_t x0, x1;
                float wx;
                taps(x, W, out[2], &x0, &x1, &wx);
                for (int64_t c = 0; c < C; c++) {
                    const float *v = img + c * nin;
#define AT(a, b, e) v[((a) * H + (b)) * W + (e)]
                    float c00 = AT(z0, y0, x0) + wx * (AT(z0, y0, x1) - AT(z0, y0, x0));
                    float c01 = AT(z0, y1, x0) + wx * (AT(z0, y1, x1) - AT(z0, y1, x0));
                    float c10 = AT(z1, y0, x0) + wx * (AT(z1, y0, x1) - AT(z1, y0, x0));
                    float c11 = AT(z1, y1, x0) + wx * (AT(z1, y1, x1) - AT(z1, y1, x0));
#undef AT
                    float c0 = c00 + wy * (c01 - c00), c1 = c10 + wy * (c11 - c10);
                    res[c * nout + (z * out[1] + y) * out[2] + x] = c0 + wz * (c1 - c0);
                }
            }
        }
    }
}

/* taps() with the weight snapped to 0 or 1 (the nearest voxel) when snap is set */
static void taps_s(int64_t o, int64_t n_in, int64_t n_out, int snap, int64_t *i0, int64_t *i1, float *w)
{
    taps(o, n_in, n_out, i0, i1, w);
    if (snap) *w = *w >= 0.5f ? 1.0f : 0.0f;
}

void ts_resample_labels(const uint8_t *lab, const int64_t in[3], int K, const int64_t out[3], int nearest, int sep,
                        uint8_t *res)
{
    const int64_t H = in[1], W = in[2];
    for (int64_t z = 0; z < out[0]; z++) {
        int64_t zi[2];
        float wz;
        taps_s(z, in[0], out[0], sep == 0, &zi[0], &zi[1], &wz);
        for (int64_t y = 0; y < out[1]; y++) {
            int64_t yi[2];
            float wy;
            taps_s(y, H, out[1], sep == 1, &yi[0], &yi[1], &wy);
            for (int64_t x = 0; x < out[2]; x++) {
                int64_t xi[2];
                float wx;
                taps_s(x, W, out[2], sep == 2, &xi[0], &xi[1], &wx);
                uint8_t *o = res + (z * out[1] + y) * out[2] + x;
                if (nearest) {
                    *o = lab[(zi[wz >= 0.5f] * H + yi[wy >= 0.5f]) * W + xi[wx >= 0.5f]];
                    continue;
                }
                /* the eight corners' classes with their weights, summed per class */
                uint8_t cls[8];
                float wt[8];
                int n = 0;
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 2; b++)
                        for (int e = 0; e < 2; e++) {
                            float w = (a ? wz : 1 - wz) * (b ? wy : 1 - wy) * (e ? wx : 1 - wx);
                            uint8_t k = lab[(zi[a] * H + yi[b]) * W + xi[e]];
                            int j = 0;
                            while (j < n && cls[j] != k) j++;
                            if (j == n) cls[n] = k, wt[n++] = 0;
                            wt[j] += w;
                        }
                int best = 0;
                for (int j = 1; j < n; j++)
                    if (wt[j] > wt[best] || (wt[j] == wt[best] && cls[j] < cls[best])) best = j;
                *o = cls[best] < K ? cls[best] : 0;
            }
        }
    }
}

void ts_resample_affine_to(const double m[16], const int64_t in[3], const int64_t out[3], double res[16])
{
    /* voxel index axes (i, j, k) are (W, H, D): column j scales by r of its axis */
    double r[3] = {(double)in[2] / (double)out[2], (double)in[1] / (double)out[1], (double)in[0] / (double)out[0]};
    for (int row = 0; row < 3; row++) {
        double t = m[row * 4 + 3];
        for (int j = 0; j < 3; j++) {
            t += m[row * 4 + j] * (r[j] - 1) / 2;
            res[row * 4 + j] = m[row * 4 + j] * r[j];
        }
        res[row * 4 + 3] = t;
    }
    for (int j = 0; j < 4; j++) res[12 + j] = m[12 + j];
}

int ts_resample_separate_axis(const double sp_in[3], const double sp_out[3])
{
    const double *sp[2] = {sp_in, sp_out};
    for (int k = 0; k < 2; k++) {
        const double *s = sp[k];
        double lo = s[0], hi = s[0];
        for (int d = 1; d < 3; d++) {
            if (s[d] < lo) lo = s[d];
            if (s[d] > hi) hi = s[d];
        }
        if (!(lo > 0) || !(hi / lo > TS_RESAMPLE_ANISO)) continue;
        int axis = -1, n = 0;
        for (int d = 0; d < 3; d++)
            if (s[d] == hi) axis = d, n++;
        return n == 1 ? axis : -1;
    }
    return -1;
}

/* The cubic B-spline's coefficients of a line of n samples in place
 * (scipy.ndimage's spline_filter1d, order 3, mode mirror). */
static void bspline_prefilter(double *c, int64_t n)
{
    if (n < 2) return;
    const double z = sqrt(3.0) - 2.0;
    for (int64_t i = 0; i < n; i++) c[i] *= 6.0; /* (1 - z)(1 - 1/z) */
    /* causal initialisation for a mirrored (whole-sample symmetric) line */
    const double zn1 = pow(z, (double)(n - 1));
    double zi = z, c0 = c[0] + zn1 * c[n - 1];
    for (int64_t i = 1; i < n - 1; i++) {
        c0 += zi * (c[i] + zn1 * c[n - 1 - i]);
        zi *= z;
    }
    c[0] = c0 / (1.0 - zn1 * zn1);
    for (int64_t i = 1; i < n; i++) c[i] += z * c[i - 1];
    c[n - 1] = z / (z * z - 1.0) * (c[n - 1] + z * c[n - 2]);
    for (int64_t i = n - 2; i >= 0; i--) c[i] = z * (c[i + 1] - c[i]);
}

/* mirror index j into [0, n) (whole-sample symmetric, as the prefilter) */
static int64_t mirror(int64_t j, int64_t n)
{
    if (n == 1) return 0;
    const int64_t p = 2 * (n - 1);
    j %= p;
    if (j < 0) j += p;
    return j < n ? j : p - j;
}

/* One axis of a separable resampling: src holds `outer` blocks of n_in x
 * inner floats (the axis is the middle one), dst outer blocks of n_out x
 * inner. kind: 0 linear, 1 cubic, 2 nearest. */
static int resample_axis(const float *src, float *dst, int64_t outer, int64_t n_in, int64_t inner, int64_t n_out,
                         int kind)
{
    int err = 0;
#pragma omp parallel
    {
        double *line = malloc((size_t)n_in * sizeof *line);
        if (!line) {
#pragma omp atomic write
            err = 1;
        }
#pragma omp for schedule(static)
        for (int64_t l = 0; l < outer * inner; l++) {
            if (!line) continue;
            const int64_t b = l / inner, e = l % inner;
            const float *s = src + b * n_in * inner + e;
            float *o = dst + b * n_out * inner + e;
            for (int64_t i = 0; i < n_in; i++) line[i] = s[i * inner];
            if (kind == 1) bspline_prefilter(line, n_in);
            for (int64_t k = 0; k < n_out; k++) {
                double x = ((double)k + 0.5) * (double)n_in / (double)n_out - 0.5;
                if (x < 0) x = 0;
                if (x > (double)(n_in - 1)) x = (double)(n_in - 1);
                const int64_t a = (int64_t)floor(x);
                const double t = x - (double)a;
                double v;
                if (kind == 2) {
                    v = line[t >= 0.5 && a + 1 < n_in ? a + 1 : a];
                } else if (kind == 0) {
                    v = a + 1 < n_in ? line[a] + t * (line[a + 1] - line[a]) : line[a];
                } else {
                    const double u = 1.0 - t, t2 = t * t, t3 = t2 * t;
                    const double w[4] = {u * u * u / 6.0, (3.0 * t3 - 6.0 * t2 + 4.0) / 6.0,
                                         (-3.0 * t3 + 3.0 * t2 + 3.0 * t + 1.0) / 6.0, t3 / 6.0};
                    v = 0;
                    for (int j = 0; j < 4; j++) v += w[j] * line[mirror(a - 1 + j, n_in)];
                }
                o[k * inner] = (float)v;
            }
        }
        free(line);
    }
    return err ? TS_ERR(TS_ERR_NOMEM, "resampling a line of %lld voxels", (long long)n_in) : 0;
}

int ts_resample_image(int64_t C, const int64_t in[3], const float *img, const int64_t out[3], ts_interp interp,
                      int sep, float *res)
{
    if (interp == TS_INTERP_LINEAR && sep < 0) {
        ts_resample_linear(C, in, img, out, res);
        return 0;
    }
    const int k = interp == TS_INTERP_CUBIC ? 1 : 0;
    /* W, then H, then D: [C D H W] -> [C D H W'] -> [C D H' W'] -> res [C D' H' W'] */
    float *a = malloc((size_t)(C * in[0] * in[1] * out[2]) * sizeof *a);
    float *b = malloc((size_t)(C * in[0] * out[1] * out[2]) * sizeof *b);
    int err = a && b ? 0 : TS_ERR(TS_ERR_NOMEM, "resampling to %lldx%lldx%lld", (long long)out[0], (long long)out[1],
                                  (long long)out[2]);
    if (!err) err = resample_axis(img, a, C * in[0] * in[1], in[2], 1, out[2], sep == 2 ? 2 : k);
    if (!err) err = resample_axis(a, b, C * in[0], in[1], out[2], out[1], sep == 1 ? 2 : k);
    if (!err) err = resample_axis(b, res, C, in[0], out[1] * out[2], out[0], sep == 0 ? 2 : k);
    free(a);
    free(b);
    if (err || !k) return err;
    /* 0 where every trilinear tap of the input is 0 (no ringing into an empty background) */
    const int64_t H = in[1], W = in[2], nin = in[0] * H * W, nout = out[0] * out[1] * out[2];
#pragma omp parallel for schedule(static)
    for (int64_t z = 0; z < out[0]; z++) {
        int64_t zi[2], yi[2], xi[2];
        float w;
        taps_s(z, in[0], out[0], sep == 0, &zi[0], &zi[1], &w);
        if (sep == 0) zi[0] = zi[1] = zi[w >= 0.5f];
        for (int64_t y = 0; y < out[1]; y++) {
            taps_s(y, H, out[1], sep == 1, &yi[0], &yi[1], &w);
            if (sep == 1) yi[0] = yi[1] = yi[w >= 0.5f];
            for (int64_t x = 0; x < out[2]; x++) {
                taps_s(x, W, out[2], sep == 2, &xi[0], &xi[1], &w);
                if (sep == 2) xi[0] = xi[1] = xi[w >= 0.5f];
                for (int64_t c = 0; c < C; c++) {
                    const float *v = img + c * nin;
                    int any = 0;
                    for (int q = 0; q < 8 && !any; q++) any = v[(zi[q >> 2] * H + yi[(q >> 1) & 1]) * W + xi[q & 1]] != 0.0f;
                    if (!any) res[c * nout + (z * out[1] + y) * out[2] + x] = 0.0f;
                }
            }
        }
    }
    return 0;
}
