/* Patch selection, augmentation and normalisation; see patch.h. Random
 * draws happen in a fixed order (foreground voxel, flips, 90-degree
 * rotation, the spatial transform of io/augment_spatial.c, box corner,
 * then per channel gamma, scale, shift, noise, then io/augment.c's:
 * contrast, inverted gamma, brightness, blur, low resolution) so a stream position always gives the same
 * patch; options that are off draw nothing (so turning noise on leaves
 * every other choice as it was).
 * A box of a patch (spatial parallelism) makes the same draws, reads only
 * its preimage (or, with a spatial transform, the volume box its voxels are
 * sampled from) and leaves the intensity augmentation for ts_patch_finish. */
#include "tsbuild.h"
#include "io/patch.h"
#include "src/core/error.h"
#include "src/core/rng.h"

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

size_t ts_patch_scratch_floats_box(const ts_dataset *ds, const int64_t sub_size[3])
{
    size_t nv = (size_t)(sub_size[0] * sub_size[1] * sub_size[2]);
    /* image box, plus the label box stored as bytes at the end */
    return nv * (size_t)ts_dataset_channels(ds) + (nv + sizeof(float) - 1) / sizeof(float);
}

size_t ts_patch_scratch_floats(const ts_dataset *ds, const ts_patch_opts *o)
{
    return ts_patch_scratch_floats_box(ds, o->patch);
}

void ts_patch_preimage(const int64_t patch[3], const int64_t sub_lo[3], const int64_t sub_size[3], int k, int flips,
                       int64_t pre_lo[3], int64_t pre_size[3])
{
    const int64_t D = patch[0], H = patch[1], W = patch[2], ys = sub_size[1], xs = sub_size[2];
    /* flipped extents, still in patch orientation */
    const int64_t fylo = (flips & 2) ? H - sub_lo[1] - ys : sub_lo[1], fxlo = (flips & 4) ? W - sub_lo[2] - xs : sub_lo[2];
    pre_lo[0] = (flips & 1) ? D - sub_lo[0] - sub_size[0] : sub_lo[0];
    pre_size[0] = sub_size[0];
    /* then the rotation as in ts_patch_transform: (fy, fx) -> (sy, sx) */
    switch (k & 3) {
    case 0: pre_lo[1] = fylo; pre_lo[2] = fxlo; break;               /* sy = fy, sx = fx */
    case 1: pre_lo[1] = fxlo; pre_lo[2] = H - fylo - ys; break;      /* sy = fx, sx = H-1-fy */
    case 2: pre_lo[1] = H - fylo - ys; pre_lo[2] = W - fxlo - xs; break;
    default: pre_lo[1] = W - fxlo - xs; pre_lo[2] = fylo; break;     /* sy = W-1-fx, sx = fy */
    }
    pre_size[1] = (k & 1) ? xs : ys;
    pre_size[2] = (k & 1) ? ys : xs;
}

int ts_patch_transform_box(const float *in, const uint8_t *lin, int64_t C, const int64_t patch[3],
                           const int64_t sub_lo[3], const int64_t sub_size[3], int k, int flips, float *out,
                           uint8_t *lout)
{
    const int64_t D = patch[0], H = patch[1], W = patch[2];
    const int64_t sd = sub_size[0], sh = sub_size[1], sw = sub_size[2];
    int64_t pre_lo[3], pre_size[3];
    ts_patch_preimage(patch, sub_lo, sub_size, k, flips, pre_lo, pre_size);
    const int64_t rh = pre_size[1], rw = pre_size[2];
    int64_t *tab = malloc((size_t)(sh * sw) * sizeof(int64_t));
    int64_t zmap[4096], *zm = sd <= 4096 ? zmap : malloc((size_t)sd * sizeof(int64_t));
    if (!tab || !zm) {
        free(tab);
        if (zm != zmap) free(zm);
        return TS_ERR(TS_ERR_NOMEM, "patch: out of memory for the augmentation's index table (%lld x %lld voxels)",
                      (long long)sh, (long long)sw);
    }
    for (int64_t z = 0; z < sd; z++) {
        const int64_t gz = sub_lo[0] + z;
        zm[z] = (((flips & 1) ? D - 1 - gz : gz) - pre_lo[0]) * rh * rw;
    }
    for (int64_t y = 0; y < sh; y++)
        for (int64_t x = 0; x < sw; x++) {
            const int64_t gy = sub_lo[1] + y, gx = sub_lo[2] + x;
            int64_t fy = (flips & 2) ? H - 1 - gy : gy, fx = (flips & 4) ? W - 1 - gx : gx, sy, sx;
            switch (k & 3) {
            case 0: sy = fy; sx = fx; break;
            case 1: sy = fx; sx = H - 1 - fy; break;
            case 2: sy = H - 1 - fy; sx = W - 1 - fx; break;
            default: sy = W - 1 - fx; sx = fy; break;
            }
            tab[y * sw + x] = (sy - pre_lo[1]) * rw + (sx - pre_lo[2]);
        }
    const int64_t plane = sh * sw, nv = sd * plane, nin = pre_size[0] * rh * rw;
    for (int64_t c = 0; c < C; c++) {
        const float *src = in + c * nin;
        float *dst = out + c * nv;
        for (int64_t z = 0; z < sd; z++) {
            const float *s = src + zm[z];
            float *d = dst + z * plane;
            for (int64_t t = 0; t < plane; t++) d[t] = s[tab[t]];
        }
    }
    if (lin && lout)
        for (int64_t z = 0; z < sd; z++) {
            const uint8_t *s = lin + zm[z];
            uint8_t *d = lout + z * plane;
            for (int64_t t = 0; t < plane; t++) d[t] = s[tab[t]];
        }
    free(tab);
    if (zm != zmap) free(zm);
    return 0;
}

int ts_patch_transform(const float *in, const uint8_t *lin, int64_t C, const int64_t size[3], int k, int flips,
                       float *out, uint8_t *lout)
{
    static const int64_t zero[3] = {0, 0, 0};
    return ts_patch_transform_box(in, lin, C, size, zero, size, k, flips, out, lout);
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

ts_norm_mode ts_patch_norm_of(const ts_patch_opts *o, int64_t c)
{
    return o->norm_nch > 0 && c >= 0 && c < o->norm_nch ? o->norm_ch[c] : o->norm;
}

static int norm_word(const char *w, size_t n, ts_norm_mode *m)
{
    static const struct {
        const char *name;
        ts_norm_mode mode;
    } t[] = {{"image", TS_NORM_IMAGE}, {"dataset", TS_NORM_DATASET}, {"none", TS_NORM_NONE},
             {"foreground", TS_NORM_FOREGROUND}, {"ct", TS_NORM_CT}};
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++)
        if (strlen(t[k].name) == n && !strncmp(w, t[k].name, n)) {
            *m = t[k].mode;
            return 0;
        }
    return -1;
}

int ts_patch_parse_norm(const char *s, const char *source, ts_patch_opts *o)
{
    int n = 0;
    ts_norm_mode m[TS_IO_MAX_CHANNELS];
    for (const char *p = s;; p++) {
        const size_t l = strcspn(p, ",");
        const char *w = p;
        size_t wl = l;
        while (wl && *w == ' ') w++, wl--;
        while (wl && w[wl - 1] == ' ') wl--;
        if (n == TS_IO_MAX_CHANNELS)
            return TS_ERR(TS_ERR_CONFIG, "data.norm (%s): '%s' lists more than %d modes (one per channel)", source,
                          s, TS_IO_MAX_CHANNELS);
        if (norm_word(w, wl, &m[n])) /* the config checked the words (TS_CFG_ENUMLIST); a caller may not have */
            return TS_ERR(TS_ERR_CONFIG, "data.norm (%s): '%.*s' is not one of image|dataset|none|foreground|ct",
                          source, (int)wl, w);
        n++;
        p += l;
        if (!*p) break;
    }
    o->norm = m[0];
    o->norm_nch = 0;
    if (n == 1) return 0;
    for (int c = 0; c < n; c++) {
        if (m[c] == TS_NORM_DATASET)
            return TS_ERR(TS_ERR_CONFIG, "data.norm (%s): '%s': dataset applies to every channel, not in a list of "
                          "modes per channel", source, s);
        o->norm_ch[c] = m[c];
    }
    o->norm_nch = n;
    return 0;
}

/* z-score by the channel's mode (image, foreground, dataset, ct, none)
 * after optional percentile clipping; NaN (padding) becomes 0. Returns the
 * channel's min and max. */
static void normalize_channel(float *x, int64_t nv, const ts_patch_opts *o, const ts_norm_stats *st, int64_t c,
                              float *mn_out, float *mx_out)
{
    const ts_norm_mode mode = ts_patch_norm_of(o, c);
    double m = 0, s = 1, clo = -INFINITY, chi = INFINITY;
    if (mode == TS_NORM_CT) { /* the dataset's foreground: clip to 0.5/99.5 %, z-score */
        if (st->ct) {
            m = st->ct->mean[c];
            s = st->ct->std[c];
            clo = st->ct->pct[c][0];
            chi = st->ct->pct[c][TS_FP_NPCT - 1];
        }
    } else if (mode == TS_NORM_IMAGE) {
        m = st->mean[c];
        s = st->std[c];
    } else if (mode == TS_NORM_FOREGROUND) {
        m = st->fg_mean ? st->fg_mean[c] : st->mean[c];
        s = st->fg_std ? st->fg_std[c] : st->std[c];
    } else if (mode == TS_NORM_DATASET) {
        m = st->dmean ? st->dmean[c] : 0;
        s = st->dstd ? st->dstd[c] : 1;
    }
    if (!(s > 1e-8)) s = 1;
    if (o->clip_lo >= 0 && mode != TS_NORM_CT) {
        clo = st->pct[c * TS_IO_NPCT + o->clip_lo];
        chi = st->pct[c * TS_IO_NPCT + o->clip_hi];
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

void ts_patch_normalize(float *image, int64_t C, int64_t nv, const ts_patch_opts *o, const ts_norm_stats *st)
{
    float mn, mx;
    for (int64_t c = 0; c < C; c++) normalize_channel(image + c * nv, nv, o, st, c, &mn, &mx);
}

static int any_channel(const ts_patch_opts *o, int64_t C, ts_norm_mode mode)
{
    for (int64_t c = 0; c < C; c++)
        if (ts_patch_norm_of(o, c) == mode) return 1;
    return 0;
}

int ts_patch_normalize_scan(MPI_Comm comm, const char *dataset, const ts_patch_opts *o, float *image, int64_t C,
                            int64_t nv)
{
    int err = 0, lerr = 0;
    ts_dataset *ds = NULL;
    ts_dataset_opts dso = {.check = 0};
    if (!any_channel(o, C, TS_NORM_CT)) return 0;
    if (!dataset || !*dataset)
        return TS_ERR(TS_ERR_CONFIG, "data.norm = ct needs data.path: the training dataset whose fingerprint holds the "
                      "CT statistics");
    TS_CHECK(ts_dataset_open(comm, dataset, &dso, &ds));
    lerr = ts_patch_check_norm(ds, o);
    if (!lerr && ts_dataset_channels(ds) != C)
        lerr = TS_ERR(TS_ERR_FORMAT, "data.norm = ct: %s has %d channel(s), the scan %lld", dataset,
                      ts_dataset_channels(ds), (long long)C);
    TS_CHECK(ts_err_agree(comm, lerr));
    ts_patch_opts co = *o; /* the ct channels only; no image statistics needed */
    co.clip_lo = co.clip_hi = -1;
    ts_norm_stats st = {.ct = ts_dataset_fg_intensity(ds)};
    float mn, mx;
    for (int64_t c = 0; c < C; c++)
        if (ts_patch_norm_of(o, c) == TS_NORM_CT) normalize_channel(image + c * nv, nv, &co, &st, c, &mn, &mx);
cleanup:
    ts_dataset_close(&ds);
    return err;
}

int ts_patch_check_norm(const ts_dataset *ds, const ts_patch_opts *o)
{
    const int64_t C = ts_dataset_channels(ds);
    if (o->norm_nch > 0 && o->norm_nch != C)
        return TS_ERR(TS_ERR_CONFIG, "data.norm lists %d modes (one per channel) but %s has %lld channel(s)",
                      o->norm_nch, ts_dataset_path(ds), (long long)C);
    if (any_channel(o, C, TS_NORM_CT) && !ts_dataset_fg_intensity(ds))
        return TS_ERR(TS_ERR_FORMAT, "%s has no foreground intensity statistics (/fingerprint intensity_*, written by "
                      "tessera convert since data.norm = ct, from voxels with label > 0): data.norm = ct needs them; "
                      "convert it again (with labels that hold foreground)", ts_dataset_path(ds));
    if (any_channel(o, C, TS_NORM_FOREGROUND) && !ts_dataset_has_fg_stats(ds))
        return TS_ERR(TS_ERR_FORMAT, "%s has no foreground statistics (/stats/fg_mean, written by tessera convert "
                      "since data.norm = foreground): convert it again, or set data.norm = image",
                      ts_dataset_path(ds));
    return 0;
}

/* the statistics of sample `in` of ds */
static ts_norm_stats sample_stats(const ts_dataset *ds, const ts_sample_info *in)
{
    ts_norm_stats st = {in->mean, in->std, in->fg_mean, in->fg_std, in->pct, ts_dataset_mean(ds),
                        ts_dataset_std(ds), ts_dataset_fg_intensity(ds)};
    return st;
}

int ts_patch_read_volume(ts_dataset *ds, int64_t i, const ts_patch_opts *o, float *image, uint8_t *label)
{
    ts_sample_info in;
    TS_TRY(ts_dataset_info(ds, i, &in));
    TS_TRY(ts_patch_check_norm(ds, o));
    TS_TRY(ts_dataset_read_sample(ds, i, image, label));
    const int64_t nv = in.shape[1] * in.shape[2] * in.shape[3];
    const ts_norm_stats st = sample_stats(ds, &in);
    ts_patch_normalize(image, in.shape[0], nv, o, &st);
    return 0;
}

/* normalisation of a box read for the spatial augmentation */
typedef struct {
    const ts_patch_opts *o;
    ts_norm_stats st;
} norm_ctx;

static void norm_cb(void *ctx, float *image, int64_t C, int64_t nv)
{
    const norm_ctx *n = ctx;
    ts_patch_normalize(image, C, nv, n->o, &n->st);
}

/* the patch's place: foreground coin and voxel, flips, 90-degree
 * rotation, the spatial transform, the read box's corner lo (rotated by
 * an odd k, (H, W) are read swapped); draws in this order */
static int draw_place(ts_dataset *ds, int64_t i, const ts_sample_info *in, const ts_patch_opts *o, ts_rng *r,
                      int train, int aug, int *k_out, int *flips_out, ts_spatial_xform *xf, int64_t lo[3])
{
    int fg = 0, k = 0, flips = 0;
    int64_t fgc[3] = {0, 0, 0};
    if (train) {
        fg = in->nfg > 0 && ts_rng_uniform(r) < o->fg_fraction;
        if (fg) TS_TRY(ts_dataset_read_foreground(ds, i, (int64_t)ts_rng_below(r, (uint64_t)in->nfg), fgc));
    }
    if (aug) {
        if (o->flip) flips = (int)(ts_rng_u32(r) & 7);
        if (o->rot90) k = (int)(ts_rng_u32(r) & 3);
    }
    if (aug) ts_spatial_aug_draw(&o->spatial, r, xf); /* rotation, zoom, elastic: nothing drawn when off */
    int64_t box[3] = {o->patch[0], (k & 1) ? o->patch[2] : o->patch[1], (k & 1) ? o->patch[1] : o->patch[2]};
    for (int d = 0; d < 3; d++) {
        const int64_t dim = in->shape[d + 1];
        if (!train) lo[d] = (dim - box[d]) / 2;
        else if (fg) lo[d] = clamp_lo(fgc[d] - box[d] / 2, dim, box[d]);
        else lo[d] = uniform_lo(r, dim, box[d]);
    }
    *k_out = k;
    *flips_out = flips;
    return 0;
}

/* per channel min and max of a box into pend->mn, mx */
static void box_range(const float *image, int64_t C, int64_t nv, ts_patch_pending *pend)
{
    for (int64_t c = 0; c < C; c++) {
        float mn = INFINITY, mx = -INFINITY;
        for (int64_t t = 0; t < nv; t++) {
            const float v = image[c * nv + t];
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        pend->mn[c] = mn;
        pend->mx[c] = mx;
    }
}

int ts_patch_draw_box(ts_dataset *ds, int64_t i, const ts_patch_opts *o, ts_rng *r, int train,
                      const int64_t sub_lo[3], const int64_t sub_size[3], float *image, uint8_t *label,
                      float *scratch, ts_patch_pending *pend)
{
    ts_sample_info in;
    TS_TRY(ts_dataset_info(ds, i, &in));
    const int64_t C = in.shape[0], nv = sub_size[0] * sub_size[1] * sub_size[2];
    TS_TRY(ts_patch_check_norm(ds, o));
    if (C > TS_IO_MAX_CHANNELS) return TS_ERR(TS_ERR_ARG, "patch: %lld channels (at most %d)", (long long)C, TS_IO_MAX_CHANNELS);
    for (int d = 0; d < 3; d++)
        if (sub_lo[d] < 0 || sub_size[d] < 1 || sub_lo[d] + sub_size[d] > o->patch[d])
            return TS_ERR(TS_ERR_ARG, "patch: box [%lld, %lld) along axis %d lies outside the patch (0..%lld)",
                          (long long)sub_lo[d], (long long)(sub_lo[d] + sub_size[d]), d, (long long)o->patch[d]);
    const int aug = train && o->augment;
    int k = 0, flips = 0;
    ts_spatial_xform xf = {0};
    int64_t lo[3];
    TS_TRY(draw_place(ds, i, &in, o, r, train, aug, &k, &flips, &xf, lo));
    /* read only the preimage of our box inside the read box; with blur or
     * low resolution, of the box grown by a halo of R voxels (the patch
     * grown by R on each side, transformed alike); with the spatial
     * transform, sampled through it (the grown patch has the same centre,
     * so the same transform) and normalised before the interpolation */
    const int R = aug ? ts_aug_halo(&o->aug) : 0;
    int64_t pre_lo[3], pre_size[3], rlo[3], xp[3], xs[3], xlo[3], xnv = 1;
    for (int d = 0; d < 3; d++) {
        xp[d] = o->patch[d] + 2 * R;
        xs[d] = sub_size[d] + 2 * R;
        xlo[d] = lo[d] - R;
        xnv *= xs[d];
    }
    ts_patch_preimage(xp, sub_lo, xs, k, flips, pre_lo, pre_size);
    for (int d = 0; d < 3; d++) rlo[d] = lo[d] - R + pre_lo[d];
    const int direct = !k && !flips && !R && !xf.on;
    float *ext = NULL, *work = image;
    if (R) {
        ext = malloc(((size_t)(2 * C + 1) * (size_t)xnv + 2 * (size_t)xnv) * sizeof(float));
        if (!ext) return TS_ERR(TS_ERR_NOMEM, "patch: a %lldx%lldx%lld box with its halo", (long long)xs[0],
                                (long long)xs[1], (long long)xs[2]);
        work = ext;
    }
    float *bimg = direct ? image : R ? ext + C * xnv : scratch;
    uint8_t *blab = direct ? label : R ? (uint8_t *)(ext + 2 * C * xnv) : (uint8_t *)(scratch + nv * C);
    uint8_t *xlab = R ? (uint8_t *)(ext + (2 * C + 1) * xnv) : label;
    norm_ctx nc = {o, sample_stats(ds, &in)};
    int rc;
    if (xf.on) {
        xf.halo = R;
        rc = ts_spatial_aug_box(ds, i, &xf, xp, k, flips, xlo, sub_lo, xs, norm_cb, &nc, work, xlab, pend->mn,
                                pend->mx);
    } else {
        rc = ts_dataset_read_box(ds, i, rlo, pre_size, bimg, blab, NAN);
        if (!rc && !direct) rc = ts_patch_transform_box(bimg, blab, C, xp, sub_lo, xs, k, flips, work, xlab);
    }
    if (rc) {
        free(ext);
        return rc;
    }
    const int64_t wnv = R ? xnv : nv;

    /* normalisation (padding, NaN here, becomes 0); the intensity
     * augmentation's numbers are drawn per channel (gamma, scale, shift) */
    pend->augment = aug;
    pend->channels = C;
    for (int d = 0; d < 3; d++) {
        pend->patch[d] = o->patch[d];
        pend->sub_lo[d] = sub_lo[d];
        pend->sub_size[d] = sub_size[d];
    }
    for (int64_t c = 0; c < C; c++) {
        if (!xf.on)
            normalize_channel(work + c * wnv, wnv, o, &nc.st, c, &pend->mn[c], &pend->mx[c]);
        double g = 1, sc = 1, sh = 0;
        int do_gamma = 0;
        if (aug) {
            do_gamma = o->gamma > 0 && ts_rng_uniform(r) < 0.5;
            double u = ts_rng_uniform(r);
            if (do_gamma) g = exp((2 * u - 1) * log1p(o->gamma));
            u = ts_rng_uniform(r);
            if (o->scale > 0) sc = 1 + o->scale * (2 * u - 1);
            u = ts_rng_uniform(r);
            if (o->shift > 0) sh = o->shift * (2 * u - 1);
        }
        pend->do_gamma[c] = do_gamma;
        pend->g[c] = g;
        pend->scale[c] = sc;
        pend->shift[c] = sh;
    }
    /* noise last, after every channel's other draws */
    pend->noise_key = 0;
    for (int64_t c = 0; c < C; c++) {
        double sigma = 0;
        if (aug && o->noise_p > 0) {
            int on = ts_rng_uniform(r) < o->noise_p;
            double u = ts_rng_uniform(r);
            if (on) sigma = o->noise_std * u;
        }
        pend->noise_sigma[c] = sigma;
    }
    if (aug && o->noise_p > 0) pend->noise_key = ts_rng_u64(r);
    /* io/augment.c's draws last; blur and low resolution from the halo */
    ts_aug_draw(aug ? &o->aug : &(ts_aug_opts){0}, o->gamma, r, C, &pend->aug);
    if (R) {
        rc = ts_aug_neighbours(ext, C, R, o->patch, sub_lo, sub_size, &pend->aug, image);
        for (int64_t z = 0; z < sub_size[0]; z++)
            for (int64_t y = 0; y < sub_size[1]; y++)
                memcpy(label + (z * sub_size[1] + y) * sub_size[2], xlab + ((z + R) * xs[1] + y + R) * xs[2] + R,
                       (size_t)sub_size[2]);
        free(ext);
        TS_TRY(rc);
        box_range(image, C, nv, pend); /* the box's range after them */
    }
    return 0;
}

/* Gaussian noise on channel c of a box: voxel (z, y, x) of the patch gets
 * sigma times the Box-Muller normal of the Philox block (patch index, c,
 * "NO") under noise_key, whatever box holds it. */
static void add_noise(float *x, const ts_patch_pending *p, int64_t c)
{
    const uint32_t key[2] = {(uint32_t)p->noise_key, (uint32_t)(p->noise_key >> 32)};
    const float sigma = (float)p->noise_sigma[c];
    int64_t t = 0;
    for (int64_t z = 0; z < p->sub_size[0]; z++)
        for (int64_t y = 0; y < p->sub_size[1]; y++) {
            const int64_t row = ((p->sub_lo[0] + z) * p->patch[1] + p->sub_lo[1] + y) * p->patch[2] + p->sub_lo[2];
            for (int64_t w = 0; w < p->sub_size[2]; w++, t++) {
                const uint64_t g = (uint64_t)(row + w);
                const uint32_t ctr[4] = {(uint32_t)g, (uint32_t)(g >> 32), (uint32_t)c, 0x4e4f0000u};
                uint32_t o[4];
                ts_philox4x32(ctr, key, o);
                const double u1 = ((double)(o[0] >> 8) + 0.5) / 16777216.0, u2 = (double)(o[1] >> 8) / 16777216.0;
                x[t] += sigma * (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
            }
        }
}

void ts_patch_finish(float *image, int64_t nv, const ts_patch_pending *p)
{
    if (!p->augment) return;
    for (int64_t c = 0; c < p->channels; c++) {
        float *x = image + c * nv;
        const float mn = p->mn[c], mx = p->mx[c];
        const double g = p->g[c], sc = p->scale[c], sh = p->shift[c];
        ts_aug_before_gamma(x, nv, &p->aug, c, mn, mx);
        if (p->do_gamma[c] && mx > mn) {
            const float fmn = mn, rng_ = mx - mn, fg_ = (float)g;
            for (int64_t t = 0; t < nv; t++) x[t] = fmn + rng_ * powf((x[t] - fmn) / rng_, fg_);
        }
        ts_aug_after_gamma(x, nv, &p->aug, c);
        if (sc != 1 || sh != 0) {
            const float a = (float)sc, b = (float)sh;
            for (int64_t t = 0; t < nv; t++) x[t] = x[t] * a + b;
        }
        if (p->noise_sigma[c] > 0) add_noise(x, p, c);
    }
}

int ts_patch_draw(ts_dataset *ds, int64_t i, const ts_patch_opts *o, ts_rng *r, int train, float *image,
                  uint8_t *label, float *scratch)
{
    static const int64_t zero[3] = {0, 0, 0};
    ts_patch_pending p;
    TS_TRY(ts_patch_draw_box(ds, i, o, r, train, zero, o->patch, image, label, scratch, &p));
    ts_patch_finish(image, o->patch[0] * o->patch[1] * o->patch[2], &p);
    return 0;
}

double ts_patch_read_bytes(const ts_patch_opts *o, const int64_t box[3], int64_t C, const int64_t vol[3])
{
    if (!o->augment) return 0;
    const int R = ts_aug_halo(&o->aug);
    const int64_t g[3] = {box[0] + 2 * R, box[1] + 2 * R, box[2] + 2 * R};
    const double gv = (double)g[0] * (double)g[1] * (double)g[2];
    double b = ts_spatial_aug_read_voxels(&o->spatial, g, vol) * (4.0 * (double)C + 1);
    if (R) b += (2.0 * (double)C + 3) * gv * 4;
    return b;
}
