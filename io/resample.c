/* Integer-factor resampling; see resample.h. */
#include "tsbuild.h"
#include "io/resample.h"

#include <math.h>
#include <string.h>

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

void ts_resample_labels(const uint8_t *lab, const int64_t in[3], int K, const int64_t out[3], int nearest,
                        uint8_t *res)
{
    const int64_t H = in[1], W = in[2];
    for (int64_t z = 0; z < out[0]; z++) {
        int64_t zi[2];
        float wz;
        taps(z, in[0], out[0], &zi[0], &zi[1], &wz);
        for (int64_t y = 0; y < out[1]; y++) {
            int64_t yi[2];
            float wy;
            taps(y, H, out[1], &yi[0], &yi[1], &wy);
            for (int64_t x = 0; x < out[2]; x++) {
                int64_t xi[2];
                float wx;
                taps(x, W, out[2], &xi[0], &xi[1], &wx);
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
