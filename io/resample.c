/* Integer-factor resampling; see resample.h. */
#include "tsbuild.h"
#include "io/resample.h"

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
