/* Patch selection, augmentation and normalisation; see patch.h. Random
 * draws happen in a fixed order (box, flips, rotation, then per channel
 * gamma, scale, shift) so a stream position always gives the same patch. */
#include "tsbuild.h"
#include "io/patch.h"
#include "src/core/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int ts_patch_parse_clip(const char *s, int *lo, int *hi)
{
    static const struct {
        const char *name;
        int lo, hi;
    } t[] = {{"none", -1, -1}, {"0.5-99.5", 0, 5}, {"1-99", 1, 4}, {"5-95", 2, 3}};
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++)
        if (!strcmp(s, t[k].name)) {
            *lo = t[k].lo;
            *hi = t[k].hi;
            return 0;
        }
    return 1;
}

size_t ts_patch_scratch_floats(const ts_dataset *ds, const ts_patch_opts *o)
{
    size_t nv = (size_t)(o->patch[0] * o->patch[1] * o->patch[2]);
    /* image box, plus the label box stored as bytes at the end */
    return nv * (size_t)ts_dataset_channels(ds) + (nv + sizeof(float) - 1) / sizeof(float);
}

void ts_patch_transform(const float *in, const uint8_t *lin, int64_t C, const int64_t size[3], int k, int flips,
                        float *out, uint8_t *lout)
{
    const int64_t D = size[0], H = size[1], W = size[2];
    const int64_t rh = (k & 1) ? W : H, rw = (k & 1) ? H : W;
    int64_t *tab = malloc((size_t)(H * W) * sizeof(int64_t));
    int64_t zmap[4096], *zm = D <= 4096 ? zmap : malloc((size_t)D * sizeof(int64_t));
    for (int64_t z = 0; z < D; z++) zm[z] = ((flips & 1) ? D - 1 - z : z) * rh * rw;
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++) {
            int64_t fy = (flips & 2) ? H - 1 - y : y, fx = (flips & 4) ? W - 1 - x : x, sy, sx;
            switch (k & 3) {
            case 0: sy = fy; sx = fx; break;
            case 1: sy = fx; sx = H - 1 - fy; break;
            case 2: sy = H - 1 - fy; sx = W - 1 - fx; break;
            default: sy = W - 1 - fx; sx = fy; break;
            }
            tab[y * W + x] = sy * rw + sx;
        }
    const int64_t plane = H * W, nv = D * plane;
    for (int64_t c = 0; c < C; c++) {
        const float *src = in + c * nv;
        float *dst = out + c * nv;
        for (int64_t z = 0; z < D; z++) {
            const float *s = src + zm[z];
            float *d = dst + z * plane;
            for (int64_t t = 0; t < plane; t++) d[t] = s[tab[t]];
        }
    }
    if (lin && lout)
        for (int64_t z = 0; z < D; z++) {
            const uint8_t *s = lin + zm[z];
            uint8_t *d = lout + z * plane;
            for (int64_t t = 0; t < plane; t++) d[t] = s[tab[t]];
        }
    free(tab);
    if (zm != zmap) free(zm);
}

/* lower corner along one axis: uniform so that the box lies inside the
 * volume when it fits, and the volume inside the box when it does not */
static int64_t uniform_lo(ts_rng *r, int64_t dim, int64_t box)
{
    int64_t a = dim - box < 0 ? dim - box : 0, b = dim - box > 0 ? dim - box : 0;
    return a + (int64_t)ts_rng_below(r, (uint64_t)(b - a + 1));
}

static int64_t clamp_lo(int64_t lo, int64_t dim, int64_t box)
{
    int64_t a = dim - box < 0 ? dim - box : 0, b = dim - box > 0 ? dim - box : 0;
    return lo < a ? a : lo > b ? b : lo;
}

/* z-score (per image or dataset, or none) after optional percentile
 * clipping; NaN (padding) becomes 0. Returns the channel's min and max. */
static void normalize_channel(float *x, int64_t nv, const ts_patch_opts *o, double imean, double istd,
                              const double *ipct, double dmean, double dstd, float *mn_out, float *mx_out)
{
    double m = 0, s = 1, clo = -INFINITY, chi = INFINITY;
    if (o->norm == TS_NORM_IMAGE) {
        m = imean;
        s = istd;
    } else if (o->norm == TS_NORM_DATASET) {
        m = dmean;
        s = dstd;
    }
    if (!(s > 1e-8)) s = 1;
    if (o->clip_lo >= 0) {
        clo = ipct[o->clip_lo];
        chi = ipct[o->clip_hi];
    }
    const float fm = (float)m, fis = (float)(1.0 / s), flo = (float)clo, fhi = (float)chi;
    float mn = INFINITY, mx = -INFINITY;
    for (int64_t t = 0; t < nv; t++) {
        float v = x[t];
        if (v != v) { /* padding */
            x[t] = 0.0f;
            mn = 0.0f < mn ? 0.0f : mn;
            mx = 0.0f > mx ? 0.0f : mx;
            continue;
        }
        v = v < flo ? flo : v > fhi ? fhi : v;
        v = (v - fm) * fis;
        x[t] = v;
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    *mn_out = mn;
    *mx_out = mx;
}

void ts_patch_normalize(float *image, int64_t C, int64_t nv, const ts_patch_opts *o, const double *mean,
                        const double *std, const double *pct, const double *dmean, const double *dstd)
{
    float mn, mx;
    for (int64_t c = 0; c < C; c++)
        normalize_channel(image + c * nv, nv, o, mean[c], std[c], pct + c * TS_IO_NPCT, dmean ? dmean[c] : 0,
                          dstd ? dstd[c] : 1, &mn, &mx);
}

int ts_patch_read_volume(ts_dataset *ds, int64_t i, const ts_patch_opts *o, float *image, uint8_t *label)
{
    ts_sample_info in;
    TS_TRY(ts_dataset_info(ds, i, &in));
    TS_TRY(ts_dataset_read_sample(ds, i, image, label));
    ts_patch_normalize(image, in.shape[0], in.shape[1] * in.shape[2] * in.shape[3], o, in.mean, in.std, in.pct,
                       ts_dataset_mean(ds), ts_dataset_std(ds));
    return 0;
}

int ts_patch_draw(ts_dataset *ds, int64_t i, const ts_patch_opts *o, ts_rng *r, int train, float *image,
                  uint8_t *label, float *scratch)
{
    ts_sample_info in;
    TS_TRY(ts_dataset_info(ds, i, &in));
    const int64_t C = in.shape[0], nv = o->patch[0] * o->patch[1] * o->patch[2];
    const int aug = train && o->augment;
    /* the box: rotated by an odd k, (H, W) are read swapped */
    int fg = 0, k = 0, flips = 0;
    int64_t fgc[3] = {0, 0, 0};
    if (train) {
        fg = in.nfg > 0 && ts_rng_uniform(r) < o->fg_fraction;
        if (fg) TS_TRY(ts_dataset_read_foreground(ds, i, (int64_t)ts_rng_below(r, (uint64_t)in.nfg), fgc));
    }
    if (aug) {
        if (o->flip) flips = (int)(ts_rng_u32(r) & 7);
        if (o->rot90) k = (int)(ts_rng_u32(r) & 3);
    }
    int64_t box[3] = {o->patch[0], (k & 1) ? o->patch[2] : o->patch[1], (k & 1) ? o->patch[1] : o->patch[2]};
    int64_t lo[3];
    for (int d = 0; d < 3; d++) {
        const int64_t dim = in.shape[d + 1];
        if (!train) lo[d] = (dim - box[d]) / 2;
        else if (fg) lo[d] = clamp_lo(fgc[d] - box[d] / 2, dim, box[d]);
        else lo[d] = uniform_lo(r, dim, box[d]);
    }
    const int direct = !k && !flips;
    float *bimg = direct ? image : scratch;
    uint8_t *blab = direct ? label : (uint8_t *)(scratch + nv * C);
    TS_TRY(ts_dataset_read_box(ds, i, lo, box, bimg, blab, NAN));
    if (!direct) ts_patch_transform(bimg, blab, C, o->patch, k, flips, image, label);

    /* normalisation (padding, NaN here, becomes 0), then intensity augmentation */
    for (int64_t c = 0; c < C; c++) {
        float *x = image + c * nv;
        float mn, mx;
        normalize_channel(x, nv, o, in.mean[c], in.std[c], in.pct + c * TS_IO_NPCT, ts_dataset_mean(ds)[c],
                          ts_dataset_std(ds)[c], &mn, &mx);
        if (!aug) continue;
        double g = 1, sc = 1, sh = 0;
        int do_gamma = o->gamma > 0 && ts_rng_uniform(r) < 0.5;
        double u = ts_rng_uniform(r);
        if (do_gamma) g = exp((2 * u - 1) * log1p(o->gamma));
        u = ts_rng_uniform(r);
        if (o->scale > 0) sc = 1 + o->scale * (2 * u - 1);
        u = ts_rng_uniform(r);
        if (o->shift > 0) sh = o->shift * (2 * u - 1);
        if (do_gamma && mx > mn) {
            const float fmn = mn, rng_ = mx - mn, fg_ = (float)g;
            for (int64_t t = 0; t < nv; t++) x[t] = fmn + rng_ * powf((x[t] - fmn) / rng_, fg_);
        }
        if (sc != 1 || sh != 0) {
            const float a = (float)sc, b = (float)sh;
            for (int64_t t = 0; t < nv; t++) x[t] = x[t] * a + b;
        }
    }
    return 0;
}
