/* Sliding-window geometry and accumulation; see window.h. Owns the
 * windows' positions and their Gaussian-weighted sum into a volume; local,
 * no model and no communication. */
#include "tsbuild.h"
#include "src/infer/window.h"
#include "src/core/error.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

int ts_window_plan_make(const int64_t vol[3], const int64_t win[3], double overlap, ts_window_plan *p)
{
    if (!(overlap >= 0 && overlap < 1)) return TS_ERR(TS_ERR_ARG, "window overlap %g is not in [0, 1)", overlap);
    p->count = 1;
    for (int a = 0; a < 3; a++) {
        if (vol[a] < 1 || win[a] < 1)
            return TS_ERR(TS_ERR_ARG, "window %lld over volume %lld along axis %d", (long long)win[a],
                          (long long)vol[a], a);
        p->vol[a] = vol[a];
        p->win[a] = win[a];
        if (vol[a] <= win[a]) {
            p->n[a] = 1;
        } else {
            double stride = (double)win[a] * (1 - overlap);
            if (stride < 1) stride = 1;
            p->n[a] = (int64_t)ceil((double)(vol[a] - win[a]) / stride) + 1;
        }
        p->count *= p->n[a];
    }
    return 0;
}

void ts_window_origin(const ts_window_plan *p, int64_t idx, int64_t origin[3])
{
    int64_t k[3];
    k[2] = idx % p->n[2];
    k[1] = (idx / p->n[2]) % p->n[1];
    k[0] = idx / (p->n[2] * p->n[1]);
    for (int a = 0; a < 3; a++) {
        int64_t span = p->vol[a] - p->win[a];
        origin[a] = p->n[a] == 1 || span <= 0 ? 0 : (int64_t)llround((double)span * (double)k[a] / (double)(p->n[a] - 1));
    }
}

void ts_window_gaussian(const int64_t win[3], float *w)
{
    double g[3][1024];
    for (int a = 0; a < 3; a++) {
        double c = (win[a] - 1) / 2.0, s = win[a] / 8.0, mx = 0;
        for (int64_t i = 0; i < win[a] && i < 1024; i++) {
            g[a][i] = exp(-0.5 * (i - c) * (i - c) / (s * s));
            mx = g[a][i] > mx ? g[a][i] : mx;
        }
        for (int64_t i = 0; i < win[a] && i < 1024; i++) g[a][i] /= mx; /* peak 1 also for even edges */
    }
    for (int64_t z = 0; z < win[0]; z++)
        for (int64_t y = 0; y < win[1]; y++)
            for (int64_t x = 0; x < win[2]; x++) {
                double v = g[0][z] * g[1][y] * g[2][x];
                w[(z * win[1] + y) * win[2] + x] = (float)(v < 1e-3 ? 1e-3 : v);
            }
}

void ts_window_extract(const ts_window_plan *p, const int64_t o[3], const float *vol, int C, float *out)
{
    const int64_t lo[3] = {0, 0, 0};
    ts_window_extract_box(p, o, lo, p->win, vol, C, out);
}

void ts_window_extract_box(const ts_window_plan *p, const int64_t o[3], const int64_t lo[3], const int64_t size[3],
                           const float *vol, int C, float *out)
{
    const int64_t *v = p->vol;
    for (int c = 0; c < C; c++)
        for (int64_t z = 0; z < size[0]; z++)
            for (int64_t y = 0; y < size[1]; y++) {
                float *dst = out + (((int64_t)c * size[0] + z) * size[1] + y) * size[2];
                const int64_t vz = o[0] + lo[0] + z, vy = o[1] + lo[1] + y, vx = o[2] + lo[2];
                if (vz >= v[0] || vy >= v[1] || vx >= v[2]) {
                    memset(dst, 0, sizeof *dst * (size_t)size[2]);
                    continue;
                }
                const int64_t nx = v[2] - vx < size[2] ? v[2] - vx : size[2];
                memcpy(dst, vol + (((int64_t)c * v[0] + vz) * v[1] + vy) * v[2] + vx, sizeof *dst * (size_t)nx);
                if (nx < size[2]) memset(dst + nx, 0, sizeof *dst * (size_t)(size[2] - nx));
            }
}

void ts_window_accumulate(const ts_window_plan *p, const int64_t o[3], const float *logits, int K, const float *wt,
                          float *acc, float *wsum)
{
    const int64_t lo[3] = {0, 0, 0};
    ts_window_accumulate_box(p, o, lo, p->win, logits, K, wt, acc, wsum);
}

/* exp(x) for x <= 0 (softmax after subtracting the maximum) without a
 * library call, so that the loops below vectorise: x = n ln 2 + r, |r| <=
 * ln 2 / 2, exp(r) by Cephes' expf polynomial (within 2 ulp of expf), 2^n
 * built in the exponent bits; below -87 the result is 0 (as good as expf's
 * denormals for a probability summed with exp(0) = 1). */
static inline float exp_nonpos(float x)
{
    const int big = x < -87.0f;
    x = x < -87.0f ? -87.0f : x;
    /* n = x log2(e) rounded to the nearest integer (adding and taking away
     * 1.5 * 2^23 rounds; floorf would keep the loop from vectorising) */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return big ? 0.0f : p * two_n;
}

#define ACC_RUN 16 /* voxels of a row per step: each class's exponentials in a vector */

void ts_window_accumulate_box(const ts_window_plan *p, const int64_t o[3], const int64_t lo[3], const int64_t size[3],
                              const float *logits, int K, const float *wt, float *acc, float *wsum)
{
    const int64_t *v = p->vol, *w = p->win;
    const int64_t nvox = v[0] * v[1] * v[2];
    const int64_t nz = v[0] - o[0] - lo[0] < size[0] ? v[0] - o[0] - lo[0] : size[0];
    const int64_t ny = v[1] - o[1] - lo[1] < size[1] ? v[1] - o[1] - lo[1] : size[1];
    const int64_t nx = v[2] - o[2] - lo[2] < size[2] ? v[2] - o[2] - lo[2] : size[2];
    /* planes over the threads: each voxel's sums are its own, so the
     * results do not depend on the threads */
#pragma omp parallel for schedule(static) if (nz * ny * nx >= 32768)
    for (int64_t z = 0; z < nz; z++) {
        const int64_t vz = o[0] + lo[0] + z;
        float e[TS_WINDOW_MAX_CLASSES * ACC_RUN], m[ACC_RUN], f[ACC_RUN];
        for (int64_t y = 0; y < ny; y++) {
            const int64_t vy = o[1] + lo[1] + y;
            for (int64_t x0 = 0; x0 < nx; x0 += ACC_RUN) {
                const int n = nx - x0 < ACC_RUN ? (int)(nx - x0) : ACC_RUN;
                const int64_t wi = ((lo[0] + z) * w[1] + lo[1] + y) * w[2] + lo[2] + x0;
                const int64_t vi = (vz * v[1] + vy) * v[2] + o[2] + lo[2] + x0;
                const float *l = logits + ((z * size[1] + y) * size[2] + x0) * K;
                /* [n][K] -> [K][ACC_RUN], a tail of zeros: the loops below
                 * run ACC_RUN voxels (a fixed count vectorises), the sums
                 * take the first n */
                for (int k = 0; k < K; k++)
                    for (int i = 0; i < ACC_RUN; i++) e[k * ACC_RUN + i] = i < n ? l[(int64_t)i * K + k] : 0.0f;
                for (int i = 0; i < ACC_RUN; i++) {
                    m[i] = e[i];
                    f[i] = 0;
                }
                for (int k = 1; k < K; k++)
                    for (int i = 0; i < ACC_RUN; i++) m[i] = e[k * ACC_RUN + i] > m[i] ? e[k * ACC_RUN + i] : m[i];
                for (int k = 0; k < K; k++) {
                    float *ek = e + k * ACC_RUN;
                    for (int i = 0; i < ACC_RUN; i++) {
                        ek[i] = exp_nonpos(ek[i] - m[i]);
                        f[i] += ek[i];
                    }
                }
                for (int i = 0; i < n; i++) f[i] = wt[wi + i] / f[i];
                if (wsum)
                    for (int i = 0; i < n; i++) wsum[vi + i] += wt[wi + i];
                for (int k = 0; k < K; k++) {
                    float *ak = acc + k * nvox + vi;
                    const float *ek = e + k * ACC_RUN;
                    for (int i = 0; i < n; i++) ak[i] += f[i] * ek[i];
                }
            }
        }
    }
}
