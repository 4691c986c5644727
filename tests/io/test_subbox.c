/* Spatial parallelism in the loader (2 or 4 ranks): every rank of a group
 * loads its own box of every patch, and that box must be bit for bit the
 * same box of the patch a whole-patch loader produces with the same seed
 * (flips, rotations, padding, foreground boxes, rotation, zoom and elastic
 * deformation sampled from the volume, gamma over the whole patch's range,
 * scale, shift, Gaussian noise keyed to patch voxels, contrast, inverted gamma, brightness,
 * blur and low resolution from a halo), while reading exactly the chunks its box's
 * voxels come from; errors on one rank of a group (a corrupt chunk, bad
 * boxes, other options) reach every rank without a hang. Also, on each rank alone: the
 * box transform against crops of the whole transform, and ts_patch_draw_box
 * + ts_patch_finish against ts_patch_draw.
 * usage: test_subbox DIR (a scratch directory shared by the ranks) */
#include "tsbuild.h"
#include "io/dataset.h"
#include "io/h5.h"
#include "io/loader.h"
#include "io/synth.h"
#include "io/writer.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "tests/tap.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size;

static int all_ok(int ok)
{
    int r = 0;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

/* dst [A, sz] = src [A, full] restricted to [lo, lo + sz) (element size es) */
static void crop(const void *src, int64_t A, const int64_t full[3], const int64_t lo[3], const int64_t sz[3], size_t es,
                 void *dst)
{
    const char *s = src;
    char *d = dst;
    for (int64_t a = 0; a < A; a++)
        for (int64_t z = 0; z < sz[0]; z++)
            for (int64_t y = 0; y < sz[1]; y++) {
                size_t so = (size_t)(((a * full[0] + lo[0] + z) * full[1] + lo[1] + y) * full[2] + lo[2]) * es;
                size_t dof = (size_t)(((a * sz[0] + z) * sz[1] + y) * sz[2]) * es;
                memcpy(d + dof, s + so, (size_t)sz[2] * es);
            }
}

/* one part of [0, E) cut into n uneven pieces (sizes differ by design) */
static void cut(int64_t E, int n, int i, int64_t *lo, int64_t *sz)
{
    int64_t a = i == 0 ? 0 : (i * E) / n - 1, b = i == n - 1 ? E : ((i + 1) * E) / n - 1;
    *lo = a;
    *sz = b - a;
}

enum { T_D, T_H, T_W, T_DH, T_HW, T_DW, T_MIXED, T_NONE };
static const char *tiling_name[] = {"D", "H", "W", "D and H", "H and W", "D and W", "D, H and W (not a grid)", "-"};

/* box g of G of the patch p under tiling t */
static void box_of(int t, int G, int g, const int64_t p[3], int64_t lo[3], int64_t sz[3])
{
    int parts[3] = {1, 1, 1};
    switch (t) {
    case T_D: parts[0] = G; break;
    case T_H: parts[1] = G; break;
    case T_W: parts[2] = G; break;
    case T_DH: parts[0] = 2; parts[1] = G / 2; break;
    case T_HW: parts[1] = 2; parts[2] = G / 2; break;
    case T_DW: parts[0] = 2; parts[2] = G / 2; break;
    case T_MIXED: /* D in two; the lower half cut along H, the upper along W */
        cut(p[0], 2, g / 2, &lo[0], &sz[0]);
        lo[1] = 0;
        sz[1] = p[1];
        lo[2] = 0;
        sz[2] = p[2];
        if (g < 2) cut(p[1], 2, g % 2, &lo[1], &sz[1]);
        else cut(p[2], 2, g % 2, &lo[2], &sz[2]);
        return;
    default: break;
    }
    int c[3] = {g / (parts[1] * parts[2]), (g / parts[2]) % parts[1], g % parts[2]};
    for (int k = 0; k < 3; k++) cut(p[k], parts[k], c[k], &lo[k], &sz[k]);
}

/* ts_patch_transform_box and ts_patch_preimage against crops of ts_patch_transform */
static void test_transform_box(void)
{
    const int64_t sizes[][3] = {{5, 6, 7}, {4, 4, 4}, {3, 5, 2}, {6, 3, 8}};
    const int64_t C = 2;
    int ok = 1, cases = 0;
    ts_rng r;
    ts_rng_init(&r, 99, 0, 1);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int64_t *P = sizes[si], nv = P[0] * P[1] * P[2];
        float *in = malloc((size_t)(C * nv) * 4), *out = malloc((size_t)(C * nv) * 4), *isub = malloc((size_t)(C * nv) * 4),
              *osub = malloc((size_t)(C * nv) * 4), *want = malloc((size_t)(C * nv) * 4);
        uint8_t *lin = malloc((size_t)nv), *lout = malloc((size_t)nv), *lisub = malloc((size_t)nv),
                *losub = malloc((size_t)nv), *lwant = malloc((size_t)nv);
        for (int64_t t = 0; t < C * nv; t++) in[t] = (float)t + 0.25f;
        for (int64_t t = 0; t < nv; t++) lin[t] = (uint8_t)(t * 7);
        for (int k = 0; k < 4; k++)
            for (int fl = 0; fl < 8; fl++) {
                const int64_t R[3] = {P[0], (k & 1) ? P[2] : P[1], (k & 1) ? P[1] : P[2]};
                ts_patch_transform(in, lin, C, P, k, fl, out, lout);
                for (int rep = 0; rep < 6; rep++) {
                    int64_t lo[3], sz[3], plo[3], psz[3];
                    for (int d = 0; d < 3; d++) {
                        lo[d] = (int64_t)ts_rng_below(&r, (uint64_t)P[d]);
                        sz[d] = 1 + (int64_t)ts_rng_below(&r, (uint64_t)(P[d] - lo[d]));
                    }
                    if (rep == 0)
                        for (int d = 0; d < 3; d++) lo[d] = 0, sz[d] = P[d];
                    ts_patch_preimage(P, lo, sz, k, fl, plo, psz);
                    int inside = 1;
                    for (int d = 0; d < 3; d++) inside &= plo[d] >= 0 && psz[d] >= 1 && plo[d] + psz[d] <= R[d];
                    if (!inside || psz[0] * psz[1] * psz[2] != sz[0] * sz[1] * sz[2]) {
                        ok = 0;
                        continue;
                    }
                    crop(in, C, R, plo, psz, 4, isub);
                    crop(lin, 1, R, plo, psz, 1, lisub);
                    ts_patch_transform_box(isub, lisub, C, P, lo, sz, k, fl, osub, losub);
                    crop(out, C, P, lo, sz, 4, want);
                    crop(lout, 1, P, lo, sz, 1, lwant);
                    const int64_t n = sz[0] * sz[1] * sz[2];
                    ok &= !memcmp(osub, want, (size_t)(C * n) * 4) && !memcmp(losub, lwant, (size_t)n);
                    cases++;
                }
            }
        free(in);
        free(out);
        free(isub);
        free(osub);
        free(want);
        free(lin);
        free(lout);
        free(lisub);
        free(losub);
        free(lwant);
    }
    ts_ok(all_ok(ok), "box transform: %d boxes (4 patch shapes x 4 rotations x 8 flip sets) equal crops of the whole "
          "transform, reading exactly their preimage", cases);
}

static ts_patch_opts aug_opts(const int64_t p[3])
{
    ts_patch_opts o;
    memset(&o, 0, sizeof o);
    memcpy(o.patch, p, sizeof o.patch);
    o.fg_fraction = 0.5;
    o.augment = o.flip = o.rot90 = 1;
    o.gamma = 0.5;
    o.scale = 0.2;
    o.shift = 0.2;
    o.noise_p = 0.5;
    o.noise_std = 0.3;
    /* rotation, zoom and elastic deformation on half the patches each */
    o.spatial = (ts_spatial_aug_opts){.rot_p = 0.5, .rot_deg = 30, .zoom_p = 0.5, .zoom_min = 0.7, .zoom_max = 1.4,
                                      .elastic_p = 0.5, .elastic_points = 5, .elastic_disp = 2};
    o.aug = (ts_aug_opts){.brightness_p = 0.5, .brightness = 0.25, .contrast_p = 0.5, .contrast = 0.25,
                          .gamma_inv_p = 0.3, .blur_p = 0.5, .blur_sigma_min = 0.5, .blur_sigma_max = 1,
                          .lowres_p = 0.5, .lowres_zoom = 0.5};
    o.norm = TS_NORM_IMAGE;
    o.clip_lo = o.clip_hi = -1;
    return o;
}

/* sum over channels and voxels of squared differences of face neighbours */
static double roughness(const float *x, int64_t C, const int64_t P[3])
{
    double e = 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t z = 0; z < P[0]; z++)
            for (int64_t y = 0; y < P[1]; y++)
                for (int64_t w = 0; w < P[2]; w++) {
                    const float *v = x + ((c * P[0] + z) * P[1] + y) * P[2] + w;
                    if (z + 1 < P[0]) e += (double)(v[P[1] * P[2]] - v[0]) * (v[P[1] * P[2]] - v[0]);
                    if (y + 1 < P[1]) e += (double)(v[P[2]] - v[0]) * (v[P[2]] - v[0]);
                    if (w + 1 < P[2]) e += (double)(v[1] - v[0]) * (v[1] - v[0]);
                }
    return e;
}

/* blur and low resolution happened: with probability 1 each (alone), every
 * patch is smoother than the same draw without them (the same box, flips,
 * rotation and the same labels); the point-wise ones change the values and
 * keep the labels */
static void test_neighbour_aug(ts_dataset *ds)
{
    const int64_t P[3] = {16, 12, 8}, nv = 16 * 12 * 8, C = ts_dataset_channels(ds);
    float *a = malloc((size_t)(C * nv) * 4), *b = malloc((size_t)(C * nv) * 4);
    uint8_t *la = malloc((size_t)nv), *lb = malloc((size_t)nv);
    ts_patch_opts base = aug_opts(P);
    base.gamma = base.scale = base.shift = base.noise_p = 0;
    base.aug = (ts_aug_opts){.blur_sigma_min = 0.5, .blur_sigma_max = 1, .lowres_zoom = 0.5};
    float *sc = malloc(ts_patch_scratch_floats(ds, &base) * 4);
    static const char *what[] = {"blur", "low resolution", "contrast, inverted gamma, brightness"};
    for (int kind = 0; kind < 3; kind++) {
        ts_patch_opts on = base;
        if (kind == 0) on.aug.blur_p = 1;
        if (kind == 1) on.aug.lowres_p = 1;
        if (kind == 2) on.aug.contrast_p = on.aug.gamma_inv_p = on.aug.brightness_p = 1;
        int ok = 1, smoother = 0, changed = 0, n = 0;
        for (int t = 0; t < 24; t++) {
            ts_rng ra, rb;
            ts_rng_init(&ra, 9, (uint32_t)t, 3);
            ts_rng_init(&rb, 9, (uint32_t)t, 3);
            if (ts_patch_draw(ds, t % 5, &on, &ra, 1, a, la, sc) || ts_patch_draw(ds, t % 5, &base, &rb, 1, b, lb, sc)) {
                ok = 0;
                break;
            }
            ok &= !memcmp(la, lb, (size_t)nv);
            changed += memcmp(a, b, (size_t)(C * nv) * 4) != 0;
            smoother += roughness(a, C, P) < roughness(b, C, P);
            n++;
        }
        /* blur and low resolution: each channel with probability 1/2, so
         * most patches (3/4 with 2 channels) are smoother */
        if (kind < 2) ok &= smoother >= n / 2 && changed >= n / 2;
        else ok &= changed == n;
        ts_ok(all_ok(ok), "%s alone: %d of %d patches changed, %d smoother; labels, boxes, flips as without", what[kind],
              changed, n, smoother);
    }
    free(a);
    free(b);
    free(la);
    free(lb);
    free(sc);
}

/* boxes drawn one by one and finished with the whole patch's range are
 * ts_patch_draw's patch; finished with their own range they are not */
static void test_draw_box(ts_dataset *ds)
{
    const int64_t P[3] = {16, 12, 8}, nv = 16 * 12 * 8, C = ts_dataset_channels(ds);
    ts_patch_opts o = aug_opts(P);
    float *whole = malloc((size_t)(C * nv) * 4), *box = malloc((size_t)(C * nv) * 4), *want = malloc((size_t)(C * nv) * 4),
          *sc = malloc(ts_patch_scratch_floats(ds, &o) * 4);
    uint8_t *lw = malloc((size_t)nv), *lb = malloc((size_t)nv), *lwant = malloc((size_t)nv);
    int ok = 1, local_differs = 0, draws = 0, finite = 1;
    for (int t = 0; t < 40; t++) {
        ts_rng r0;
        ts_rng_init(&r0, 17, (uint32_t)t, 3);
        if (ts_patch_draw(ds, t % 5, &o, &r0, 1, whole, lw, sc)) {
            ok = 0;
            break;
        }
        uint32_t after = ts_rng_u32(&r0);
        for (int64_t v = 0; v < C * nv; v++) finite &= isfinite(whole[v]) != 0;
        ts_patch_pending pend[4];
        int64_t lo[4][3], sz[4][3];
        float *bx[4];
        uint8_t *lbx[4];
        for (int g = 0; g < 4; g++) {
            box_of(T_MIXED, 4, g, P, lo[g], sz[g]);
            const int64_t n = sz[g][0] * sz[g][1] * sz[g][2];
            bx[g] = malloc((size_t)(C * n) * 4);
            lbx[g] = malloc((size_t)n);
            ts_rng r;
            ts_rng_init(&r, 17, (uint32_t)t, 3);
            if (ts_patch_draw_box(ds, t % 5, &o, &r, 1, lo[g], sz[g], bx[g], lbx[g], sc, &pend[g])) ok = 0;
            ok &= ts_rng_u32(&r) == after; /* the same number of draws */
        }
        for (int g = 0; g < 4; g++) {
            const int64_t n = sz[g][0] * sz[g][1] * sz[g][2];
            /* with its own range */
            memcpy(box, bx[g], (size_t)(C * n) * 4);
            ts_patch_finish(box, n, &pend[g]);
            crop(whole, C, P, lo[g], sz[g], 4, want);
            local_differs |= memcmp(box, want, (size_t)(C * n) * 4) != 0;
            /* with the whole patch's */
            ts_patch_pending p = pend[g];
            for (int64_t c = 0; c < C; c++)
                for (int h = 0; h < 4; h++) {
                    p.mn[c] = pend[h].mn[c] < p.mn[c] ? pend[h].mn[c] : p.mn[c];
                    p.mx[c] = pend[h].mx[c] > p.mx[c] ? pend[h].mx[c] : p.mx[c];
                }
            ts_patch_finish(bx[g], n, &p);
            crop(lw, 1, P, lo[g], sz[g], 1, lwant);
            ok &= !memcmp(bx[g], want, (size_t)(C * n) * 4) && !memcmp(lbx[g], lwant, (size_t)n);
            draws++;
            free(bx[g]);
            free(lbx[g]);
        }
    }
    ts_ok(all_ok(ok), "draw_box: %d boxes (40 augmented 16x12x8 patches in 4 boxes) finished with the whole patch's "
          "range equal the boxes of ts_patch_draw, with the same number of random draws", draws);
    ts_ok(all_ok(finite), "draw_box: every augmented patch is finite (inverted gamma then gamma stay in range)");
    ts_ok(all_ok(local_differs), "draw_box: finished with only their own range some boxes differ (gamma needs the "
          "reduction)");
    /* noise alone: the same stream with noise_std 0 makes every other choice
     * the same, so the difference is the noise: mean ~0, std ~ its sigma */
    int noise_ok = 1;
    double worst = 0;
    for (int t = 0; t < 6; t++) {
        ts_patch_opts on = o, off = o;
        on.noise_p = off.noise_p = 1;
        on.noise_std = 1, off.noise_std = 0;
        ts_patch_pending pn, pf;
        ts_rng ra, rb;
        ts_rng_init(&ra, 5, (uint32_t)t, 3);
        ts_rng_init(&rb, 5, (uint32_t)t, 3);
        static const int64_t z3[3] = {0, 0, 0};
        if (ts_patch_draw_box(ds, t % 5, &on, &ra, 1, z3, P, whole, lw, sc, &pn) ||
            ts_patch_draw_box(ds, t % 5, &off, &rb, 1, z3, P, box, lb, sc, &pf)) {
            noise_ok = 0;
            continue;
        }
        ts_patch_finish(whole, nv, &pn);
        ts_patch_finish(box, nv, &pf);
        for (int64_t c = 0; c < C; c++) {
            double m = 0, q = 0, sg = pn.noise_sigma[c];
            for (int64_t v = 0; v < nv; v++) {
                double d = whole[c * nv + v] - box[c * nv + v];
                m += d, q += d * d;
            }
            m /= (double)nv;
            double sd = sqrt(q / (double)nv - m * m);
            if (sg > 0.05) {
                worst = fmax(worst, fabs(sd / sg - 1));
                noise_ok &= fabs(sd / sg - 1) < 0.08 && fabs(m) < 0.1 * sg;
            }
        }
        noise_ok &= !memcmp(lw, lb, (size_t)nv);
    }
    ts_ok(all_ok(noise_ok), "noise: the same draws otherwise; the difference has mean ~0 and the drawn sigma (worst "
          "std/sigma - 1: %.3f)", worst);
    free(whole);
    free(box);
    free(want);
    free(sc);
    free(lw);
    free(lb);
    free(lwant);
}

typedef struct {
    const char *what;
    int64_t patch[3];
    int tiling[2];   /* on 2 ranks, on 4 */
    int prefetch;    /* -1: rank % 3, different on every rank */
    int eval;
    int dp;          /* data-parallel replicas (on 4 ranks: 2 = two groups of 2) */
    int norm_clip;   /* 1: dataset z-score and 1-99 clipping instead of the image's z-score; 2: foreground z-score */
    int interp;      /* 1: cubic image, one-hot linear label (data.aug_image, aug_label); 2: also in the H-W plane */
} config;

static const config configs[] = {
    {"16x12x8", {16, 12, 8}, {T_D, T_D}, 0, 0, 1, 0},
    {"16x12x8", {16, 12, 8}, {T_H, T_DH}, 2, 0, 1, 0},
    {"12x16x20 (padding along H)", {12, 16, 20}, {T_W, T_HW}, 0, 0, 1, 0},
    {"12x16x20 (padding along H)", {12, 16, 20}, {T_H, T_DW}, 2, 0, 1, 0},
    {"24x10x6 (padding along D)", {24, 10, 6}, {T_D, T_MIXED}, 0, 0, 1, 0},
    {"24x10x6 (padding along D)", {24, 10, 6}, {T_W, T_MIXED}, -1, 0, 1, 0},
    {"16x12x8, dataset z-score, 1-99 clipping", {16, 12, 8}, {T_H, T_HW}, -1, 0, 1, 1},
    {"16x12x8, foreground z-score", {16, 12, 8}, {T_W, T_DW}, 2, 0, 1, 2},
    {"16x12x8, 2 replicas x 2 ranks", {16, 12, 8}, {T_NONE, T_W}, 2, 0, 2, 0},
    {"16x12x8, evaluation (centred, an empty slot)", {16, 12, 8}, {T_H, T_DH}, 2, 1, 1, 0},
    {"16x12x8, evaluation (centred, an empty slot)", {16, 12, 8}, {T_D, T_MIXED}, 0, 1, 1, 0},
    {"16x12x8, cubic image, one-hot linear label", {16, 12, 8}, {T_H, T_MIXED}, 2, 0, 1, 0, 1},
    {"24x10x6, cubic, one-hot linear, in the H-W plane", {24, 10, 6}, {T_D, T_DW}, 0, 0, 1, 0, 2},
};

/* runs one configuration: whole-patch loader vs this rank's box loader */
static void run_config(const config *cf, const char *path)
{
    const int t = cf->tiling[size == 4];
    if (t == T_NONE) return;
    const int dp = cf->dp, G = size / dp, dprank = rank / G, g = rank % G;
    MPI_Comm group;
    MPI_Comm_split(MPI_COMM_WORLD, dprank, g, &group);
    ts_dataset_opts dopt = {.driver = TS_IO_DRIVER_POSIX, .cache_bytes = 1, .check = 1};
    ts_dataset *dw = NULL, *dsub = NULL;
    int err = ts_dataset_open(MPI_COMM_SELF, path, &dopt, &dw);
    if (!err) err = ts_dataset_open(MPI_COMM_SELF, path, &dopt, &dsub);
    ts_loader_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.patch = aug_opts(cf->patch);
    lo.patch.spatial.cubic = lo.patch.spatial.label_linear = cf->interp > 0;
    lo.patch.spatial.plane = cf->interp == 2;
    lo.patch.spatial.rot_deg_plane = 180;
    if (cf->norm_clip == 2) lo.patch.norm = TS_NORM_FOREGROUND;
    else if (cf->norm_clip) {
        lo.patch.norm = TS_NORM_DATASET;
        lo.patch.clip_lo = 1;
        lo.patch.clip_hi = 4;
    }
    lo.batch = 2;
    lo.prefetch = cf->prefetch >= 0 ? cf->prefetch : rank % 3;
    lo.seed = 1234;
    lo.mode = cf->eval ? TS_SAMPLER_EVAL : TS_SAMPLER_TRAIN;
    lo.group = MPI_COMM_NULL;
    ts_loader *lw = NULL, *ls = NULL;
    if (!err) err = ts_loader_create(dw, dprank, dp, &lo, &lw);
    int64_t blo[3], bsz[3];
    box_of(t, G, g, cf->patch, blo, bsz);
    memcpy(lo.sub_lo, blo, sizeof blo);
    memcpy(lo.sub_size, bsz, sizeof bsz);
    lo.group = group;
    /* collective on the group even if this rank failed above: it fails there too */
    int cerr = ts_loader_create(dsub, dprank, dp, &lo, &ls);
    err = err ? err : cerr;
    char what[256];
    snprintf(what, sizeof what, "%s%s, %s split over %d ranks%s, prefetch %s", cf->eval ? "" : "train ", cf->what,
             tiling_name[t], G, dp > 1 ? " (2 groups)" : "",
             cf->prefetch >= 0 ? (cf->prefetch ? "2" : "0") : "0/1/2 by rank");
    if (!ts_ok(all_ok(!err), "%s: create (%s)", what, err ? ts_err_message() : "ok")) {
        ts_loader_destroy(&lw);
        ts_loader_destroy(&ls);
        ts_dataset_close(&dw);
        ts_dataset_close(&dsub);
        MPI_Comm_free(&group);
        return;
    }
    const int64_t C = ts_dataset_channels(dw), P[3] = {cf->patch[0], cf->patch[1], cf->patch[2]};
    const int64_t nvp = P[0] * P[1] * P[2], nvs = bsz[0] * bsz[1] * bsz[2];
    float *want = malloc((size_t)(C * nvs) * 4);
    uint8_t *lwant = malloc((size_t)nvs);
    int same = 1, meta = 1, steps = 0, ends = 0;
    const int nsteps = cf->eval ? 5 : 6;
    for (int st = 0; st < nsteps; st++) {
        const ts_batch *a = NULL, *b = NULL;
        int ra = ts_loader_next(lw, &a), rb = ts_loader_next(ls, &b);
        if (ra != rb) {
            ts_diag("rank %d step %d: whole %d (%s), box %d", rank, st, ra, ts_err_message(), rb);
            same = 0;
            break;
        }
        if (ra == 1) {
            ends++;
            continue;
        }
        if (ra) {
            ts_diag("rank %d step %d: %s", rank, st, ts_err_message());
            same = 0;
            break;
        }
        steps++;
        meta &= a->step == b->step && a->position == b->position && a->next_position == b->next_position &&
                b->image.shape[0] == 2 && b->image.shape[1] == C && b->image.shape[2] == bsz[0] &&
                b->image.shape[3] == bsz[1] && b->image.shape[4] == bsz[2] && b->label.shape[1] == bsz[0] &&
                b->label.shape[2] == bsz[1] && b->label.shape[3] == bsz[2];
        for (int s = 0; s < 2; s++) {
            meta &= a->sample[s] == b->sample[s];
            crop((const float *)a->image.data + s * C * nvp, C, P, blo, bsz, 4, want);
            crop((const uint8_t *)a->label.data + s * nvp, 1, P, blo, bsz, 1, lwant);
            same &= !memcmp(want, (const float *)b->image.data + s * C * nvs, (size_t)(C * nvs) * 4) &&
                    !memcmp(lwant, (const uint8_t *)b->label.data + s * nvs, (size_t)nvs);
        }
    }
    if (cf->eval)
        ts_ok(all_ok(same && meta && steps == 3 && ends == 2), "%s: 3 batches then the end on every rank, each box "
              "bit for bit the whole patch's (steps %d, ends %d)", what, steps, ends);
    else
        ts_ok(all_ok(same && meta && steps == nsteps), "%s: %d steps, every box bit for bit the whole patch's box "
              "(images and labels), same samples and positions", what, nsteps);
    ts_loader_destroy(&lw);
    ts_loader_destroy(&ls);
    free(want);
    free(lwant);
    ts_dataset_close(&dw);
    ts_dataset_close(&dsub);
    MPI_Comm_free(&group);
}

/* a dataset whose image holds each voxel's linear index + 1 (both
 * channels), chunks of 4^3: a patch then tells which voxels it came from */
static const int64_t VOL[3] = {20, 14, 26};
static int write_coords(const char *path)
{
    ts_dswriter_opts wo = {.count = 5, .channels = 2, .classes = 3, .shards = 1, .chunk = 4, .seed = 1};
    ts_dswriter *w = NULL;
    TS_TRY(ts_dswriter_create(MPI_COMM_WORLD, path, &wo, &w));
    int err = 0;
    for (int64_t r = 0; r < ts_dswriter_rounds(w) && !err; r++) {
        ts_synth_opts so = {.size = {VOL[0], VOL[1], VOL[2]}, .channels = 2, .classes = 3, .seed = 9};
        ts_sample s;
        memset(&s, 0, sizeof s);
        int have = r < ts_dswriter_local_count(w), e = have ? ts_synth_sample(&so, ts_dswriter_local_index(w, r), &s) : 0;
        if (have && !e) {
            int64_t nv = VOL[0] * VOL[1] * VOL[2];
            for (int64_t t = 0; t < 2 * nv; t++) s.image[t] = (float)(t % nv + 1);
        }
        err = ts_dswriter_put(w, have && !e ? &s : NULL, e);
        ts_sample_release(&s);
    }
    if (!err) err = ts_dswriter_finish(w);
    ts_dswriter_destroy(&w);
    return err;
}

/* distinct 4^3 chunks of the volume that the voxels x[n] (index + 1, 0 = padding) come from */
static int64_t chunks_of(const float *x, int64_t n)
{
    enum { CZ = 5, CY = 4, CX = 7 }; /* ceil(VOL / 4) */
    uint8_t seen[CZ * CY * CX];
    memset(seen, 0, sizeof seen);
    int64_t cnt = 0;
    for (int64_t t = 0; t < n; t++) {
        if (x[t] == 0) continue;
        int64_t v = (int64_t)x[t] - 1, z = v / (VOL[1] * VOL[2]), y = v / VOL[2] % VOL[1], xx = v % VOL[2];
        int64_t c = ((z / 4) * CY + y / 4) * CX + xx / 4;
        cnt += !seen[c];
        seen[c] = 1;
    }
    return cnt;
}

/* exactly the bytes of the chunks holding the rank's box of every patch:
 * the whole-patch loader's bytes fix the bytes per chunk (image channels,
 * label, checksums; no chunk cache), and the box loader must have read that
 * many times the number of distinct chunks its boxes' voxels come from */
static void test_bytes(const char *path, const int64_t P[3], int t)
{
    ts_dataset_opts dopt = {.driver = TS_IO_DRIVER_POSIX, .cache_bytes = 1, .check = 1};
    ts_dataset *dw = NULL, *dsub = NULL;
    int err = ts_dataset_open(MPI_COMM_SELF, path, &dopt, &dw);
    if (!err) err = ts_dataset_open(MPI_COMM_SELF, path, &dopt, &dsub);
    ts_loader_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.patch = aug_opts(P);
    lo.patch.gamma = lo.patch.scale = lo.patch.shift = lo.patch.noise_p = 0; /* values stay voxel indices */
    memset(&lo.patch.spatial, 0, sizeof lo.patch.spatial); /* (no interpolation) */
    memset(&lo.patch.aug, 0, sizeof lo.patch.aug);         /* and no halo is read */
    lo.patch.norm = TS_NORM_NONE;
    lo.batch = 2;
    lo.seed = 77;
    lo.mode = TS_SAMPLER_TRAIN;
    ts_loader *lw = NULL, *ls = NULL;
    if (!err) err = ts_loader_create(dw, 0, 1, &lo, &lw);
    int64_t blo[3], bsz[3];
    box_of(t, size, rank, P, blo, bsz);
    memcpy(lo.sub_lo, blo, sizeof blo);
    memcpy(lo.sub_size, bsz, sizeof bsz);
    lo.group = MPI_COMM_WORLD;
    int cerr = ts_loader_create(dsub, 0, 1, &lo, &ls);
    err = err ? err : cerr;
    const int64_t nvp = P[0] * P[1] * P[2], nvs = bsz[0] * bsz[1] * bsz[2];
    const uint64_t bw0 = err ? 0 : ts_dataset_bytes_read(dw), bs0 = err ? 0 : ts_dataset_bytes_read(dsub);
    int64_t nw = 0, ns = 0;
    int same = !err;
    float *want = malloc((size_t)(2 * nvs) * 4);
    for (int st = 0; st < 6 && same; st++) {
        const ts_batch *a = NULL, *b = NULL;
        int ra = ts_loader_next(lw, &a), rb = ts_loader_next(ls, &b);
        if (ra || rb) {
            same = 0;
            break;
        }
        for (int s = 0; s < 2; s++) {
            const float *wa = (const float *)a->image.data + s * 2 * nvp, *sb = (const float *)b->image.data + s * 2 * nvs;
            crop(wa, 2, P, blo, bsz, 4, want);
            same &= !memcmp(want, sb, (size_t)(2 * nvs) * 4);
            nw += chunks_of(wa, nvp);
            ns += chunks_of(sb, nvs);
        }
    }
    uint64_t bw = err ? 0 : ts_dataset_bytes_read(dw) - bw0, bs = err ? 0 : ts_dataset_bytes_read(dsub) - bs0;
    uint64_t per = nw ? bw / (uint64_t)nw : 0;
    int ok = same && nw > 0 && bw % (uint64_t)nw == 0 && bs == per * (uint64_t)ns && bs < bw;
    double mine[3] = {(double)nvs / (double)nvp, bw ? (double)bs / (double)bw : 0, (double)ns}, every[12];
    MPI_Gather(mine, 3, MPI_DOUBLE, every, 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++)
        ts_diag("rank %d: its box holds %.3f of the patch's voxels, read %.3f of the whole patch's bytes (%.0f chunks)",
                r, every[3 * r], every[3 * r + 1], every[3 * r + 2]);
    if (!ok)
        ts_diag("rank %d: %s whole %llu bytes / %lld chunks, box %llu bytes / %lld chunks", rank,
                err ? ts_err_message() : "", (unsigned long long)bw, (long long)nw, (unsigned long long)bs,
                (long long)ns);
    ts_ok(all_ok(ok), "bytes, %lldx%lldx%lld split along %s over %d ranks: each rank read exactly the chunks its box's "
          "voxels come from (%llu bytes each), fewer bytes than the whole patch", (long long)P[0], (long long)P[1],
          (long long)P[2], tiling_name[t], size, (unsigned long long)per);
    free(want);
    ts_loader_destroy(&lw);
    ts_loader_destroy(&ls);
    ts_dataset_close(&dw);
    ts_dataset_close(&dsub);
}

/* corrupts the first chunk of /samples/000001/image of path (rank 0 only) */
static int corrupt(const char *path)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return 1;
    hid_t d = H5Dopen2(f, "/samples/000001/image", H5P_DEFAULT);
    hsize_t off[4], sz;
    unsigned mask;
    haddr_t addr = 0;
    hid_t sp = H5Dget_space(d);
    herr_t r = H5Dget_chunk_info(d, sp, 0, off, &mask, &addr, &sz);
    H5Sclose(sp);
    H5Dclose(d);
    H5Fclose(f);
    if (r < 0) return 1;
    int fd = open(path, O_RDWR), e = fd < 0;
    unsigned char x = 0;
    if (!e && pread(fd, &x, 1, (off_t)(addr + 100)) == 1) {
        x ^= 0x5a;
        e = pwrite(fd, &x, 1, (off_t)(addr + 100)) != 1;
    } else {
        e = 1;
    }
    if (fd >= 0) close(fd);
    return e;
}

/* the last rank's dataset has a corrupt chunk in sample 1: batch 1 fails on every rank */
static void test_error(const char *good, const char *bad, int prefetch)
{
    const int last = size - 1;
    ts_dataset *ds = NULL;
    int err = ts_dataset_open(MPI_COMM_SELF, rank == last ? bad : good, NULL, &ds);
    ts_loader_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.patch = aug_opts((const int64_t[]){16, 12, 8});
    lo.batch = 1;
    lo.prefetch = prefetch;
    lo.mode = TS_SAMPLER_EVAL;
    lo.seed = 5;
    lo.group = MPI_COMM_WORLD;
    box_of(T_D, size, rank, lo.patch.patch, lo.sub_lo, lo.sub_size);
    ts_loader *l = NULL;
    int cerr = ts_loader_create(ds, 0, 1, &lo, &l); /* collective: called even if the open failed */
    if (!ts_ok(all_ok(!err && !cerr), "corrupt chunk on rank %d, prefetch %d: create (%s)", last, prefetch,
               err || cerr ? ts_err_message() : "ok")) {
        ts_loader_destroy(&l);
        ts_dataset_close(&ds);
        return;
    }
    const ts_batch *b = NULL;
    int r0 = ts_loader_next(l, &b);
    int r1 = ts_loader_next(l, &b);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", ts_err_message());
    int r2 = ts_loader_next(l, &b);
    char want[256];
    snprintf(want, sizeof want, "rank %d of the spatial group failed to prepare its part of batch 1", last);
    int ok = r0 == 0 && r1 != 0 && r1 != 1 && r2 == r1 && b == NULL;
    if (rank == last) ok &= r1 == TS_ERR_FORMAT && strstr(msg, "Fletcher-32") && strstr(msg, "bad.h5");
    else ok &= r1 == TS_ERR_REMOTE && strstr(msg, want);
    if (!ok) ts_diag("rank %d: %d %d %d: %s", rank, r0, r1, r2, msg);
    if (rank == 0) ts_diag("rank 0 said: %s", msg);
    ts_ok(all_ok(ok), "corrupt chunk on rank %d, prefetch %d: batch 0 fine, batch 1 an error on every rank (its own "
          "message there, 'rank %d of the spatial group failed...' elsewhere), again on the next call, no hang",
          last, prefetch, last);
    /* seek (on every rank) clears the error: batch 0 again, together */
    int rs = ts_loader_seek(l, 0);
    int r3 = rs ? rs : ts_loader_next(l, &b);
    ts_ok(all_ok(!rs && r3 == 0 && b && b->sample[0] == 0), "corrupt chunk, prefetch %d: after seek(0) on every rank "
          "batch 0 loads again (%s)", prefetch, r3 ? ts_err_message() : "ok");
    ts_loader_destroy(&l);
    ts_dataset_close(&ds);
}

/* create: errors agreed over the group */
static void test_create_errors(const char *path)
{
    ts_dataset *ds = NULL;
    int err = ts_dataset_open(MPI_COMM_SELF, path, NULL, &ds);
    if (!ts_ok(all_ok(!err), "open %s", path)) return;
    ts_loader_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.patch = aug_opts((const int64_t[]){16, 12, 8});
    lo.batch = 2;
    lo.prefetch = 2;
    lo.seed = 5;
    lo.group = MPI_COMM_WORLD;
    const int last = size - 1;
    struct {
        const char *what, *text;
        int code_last, code_other;
    } cases[] = {
        {"the last rank's box overlaps another", "overlap", TS_ERR_ARG, TS_ERR_ARG},
        {"the last rank's box leaves a gap", "tile", TS_ERR_ARG, TS_ERR_ARG},
        {"the last rank's box lies outside the patch", "does not lie inside", TS_ERR_ARG, TS_ERR_REMOTE},
        {"the last rank uses another seed", "seed", TS_ERR_MISMATCH, TS_ERR_MISMATCH},
        {"the last rank passes no box (the whole patch)", "overlap", TS_ERR_ARG, TS_ERR_ARG},
    };
    for (int c = 0; c < 5; c++) {
        box_of(T_H, size, rank, lo.patch.patch, lo.sub_lo, lo.sub_size);
        lo.seed = 5;
        if (rank == last) {
            if (c == 0) lo.sub_lo[1] -= 1, lo.sub_size[1] += 1;
            if (c == 1) lo.sub_size[1] -= 1;
            if (c == 2) lo.sub_size[1] += 5;
            if (c == 3) lo.seed = 6;
            if (c == 4) memset(lo.sub_size, 0, sizeof lo.sub_size);
        }
        ts_loader *l = NULL;
        int e = ts_loader_create(ds, 0, 1, &lo, &l);
        int ok = l == NULL && e == (rank == last ? cases[c].code_last : cases[c].code_other) &&
                 strstr(ts_err_message(), cases[c].text) != NULL;
        if (!ok) ts_diag("rank %d: %d %s", rank, e, ts_err_message());
        ts_ok(all_ok(ok), "create fails on every rank when %s: %s", cases[c].what, ts_err_message());
        ts_loader_destroy(&l);
    }
    /* a box smaller than the patch without a group is refused; a group of one with the whole patch is fine */
    lo.group = MPI_COMM_NULL;
    lo.prefetch = 0;
    box_of(T_H, size, rank, lo.patch.patch, lo.sub_lo, lo.sub_size);
    ts_loader *l = NULL;
    int e = ts_loader_create(ds, 0, 1, &lo, &l);
    ts_ok(all_ok(e == TS_ERR_ARG && !l && strstr(ts_err_message(), "needs the group")),
          "a box smaller than the patch without a group: %s", ts_err_message());
    ts_loader *ref = NULL;
    lo.group = MPI_COMM_SELF;
    lo.sub_lo[0] = lo.sub_lo[1] = lo.sub_lo[2] = 0;
    memcpy(lo.sub_size, lo.patch.patch, sizeof lo.sub_size);
    ts_dataset *ds2 = NULL;
    e = ts_dataset_open(MPI_COMM_SELF, path, NULL, &ds2);
    if (!e) e = ts_loader_create(ds, 0, 1, &lo, &l);
    memset(lo.sub_size, 0, sizeof lo.sub_size);
    memset(&lo.group, 0, sizeof lo.group); /* a zero handle counts as MPI_COMM_NULL */
    if (!e) e = ts_loader_create(ds2, 0, 1, &lo, &ref);
    int same = !e;
    for (int st = 0; st < 3 && same; st++) {
        const ts_batch *a = NULL, *b = NULL;
        same = !ts_loader_next(l, &a) && !ts_loader_next(ref, &b) &&
               !memcmp(a->image.data, b->image.data, ts_tensor_bytes(&a->image)) &&
               !memcmp(a->label.data, b->label.data, ts_tensor_bytes(&a->label));
    }
    ts_ok(all_ok(same), "a group of one rank holding the whole patch loads what a loader without a group does");
    ts_loader_destroy(&l);
    ts_loader_destroy(&ref);
    ts_dataset_close(&ds2);
    ts_dataset_close(&ds);
}

int main(int argc, char **argv)
{
    int prov;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ts_err_set_rank(rank);
    ts_tap_quiet = rank != 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    if (prov < MPI_THREAD_MULTIPLE) {
        ts_skip_all("MPI without MPI_THREAD_MULTIPLE");
        MPI_Finalize();
        return 0;
    }
    char path[512], good[512], bad[512], coords[512];
    snprintf(path, sizeof path, "%s/phantoms.h5", argv[1]);
    snprintf(coords, sizeof coords, "%s/coords.h5", argv[1]);
    snprintf(good, sizeof good, "%s/good.h5", argv[1]);
    snprintf(bad, sizeof bad, "%s/bad.h5", argv[1]);
    test_transform_box();

    /* 5 samples of 20x14x26, 2 channels, chunks of 4^3 (many chunks per patch) */
    ts_synth_opts so = {.size = {20, 14, 26}, .channels = 2, .classes = 3, .seed = 11};
    int err = ts_synth_write(MPI_COMM_WORLD, path, &so, 5, 1, 4);
    if (!err) err = ts_synth_write(MPI_COMM_WORLD, good, &so, 3, 1, 32);
    if (!err) err = ts_synth_write(MPI_COMM_WORLD, bad, &so, 3, 1, 32);
    if (!err) err = write_coords(coords);
    int cerr = 0;
    if (!err && rank == 0) cerr = corrupt(bad);
    MPI_Barrier(MPI_COMM_WORLD);
    if (!ts_ok(all_ok(!err && !cerr), "write the datasets (%s)", err ? ts_err_message() : "ok")) {
        MPI_Finalize();
        return ts_done();
    }
    {
        ts_dataset *ds = NULL;
        err = ts_dataset_open(MPI_COMM_SELF, path, NULL, &ds);
        if (ts_ok(all_ok(!err), "open %s", path)) {
            test_draw_box(ds);
            test_neighbour_aug(ds);
        }
        ts_dataset_close(&ds);
    }
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) run_config(&configs[c], path);
    test_bytes(coords, (const int64_t[]){16, 12, 8}, T_D);
    test_bytes(coords, (const int64_t[]){12, 16, 20}, size == 4 ? T_HW : T_H);
    test_bytes(coords, (const int64_t[]){24, 10, 6}, size == 4 ? T_MIXED : T_W);
    test_error(good, bad, 0);
    test_error(good, bad, 2);
    test_create_errors(path);
    int rc = ts_done();
    MPI_Finalize();
    return rc;
}
