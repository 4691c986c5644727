/* The spatial augmentation (io/augment_spatial.c) on one rank, against
 * what it must equal: the identity transform is the plain crop (with
 * flips, 90-degree rotations, padding); a 90-degree rotation about D is
 * the rot90 crop; a zoom by 2 on an odd patch picks every other voxel; an
 * elastic deformation moves no voxel's label farther than its largest
 * displacement and is the same for the same key; the draws have the
 * configured probabilities and ranges and always the same count; in the
 * H-W plane (data.aug_2d) the rotation is about D only, the zoom and the
 * elastic displacement leave D.
 * usage: test_augment_spatial DIR */
#include "tsbuild.h"
#include "io/augment_spatial.h"
#include "io/patch.h"
#include "io/synth.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int64_t VOL[3] = {20, 14, 26};

/* no normalisation: padding (NaN) to 0, as the patch code does */
static void nan_to_zero(void *ctx, float *x, int64_t C, int64_t nv)
{
    (void)ctx;
    for (int64_t t = 0; t < C * nv; t++)
        if (x[t] != x[t]) x[t] = 0;
}

static ts_spatial_xform identity(void)
{
    ts_spatial_xform x;
    memset(&x, 0, sizeof x);
    x.on = 1;
    x.zoom = 1;
    for (int d = 0; d < 3; d++) x.a[d][d] = 1;
    return x;
}

/* the plain path: read the preimage box with padding, NaN -> 0, transform */
static int plain(ts_dataset *ds, int64_t i, const int64_t P[3], int k, int fl, const int64_t lo[3], float *img,
                 uint8_t *lab)
{
    static const int64_t z3[3] = {0, 0, 0};
    const int64_t C = ts_dataset_channels(ds), nv = P[0] * P[1] * P[2];
    int64_t plo[3], psz[3], rlo[3];
    ts_patch_preimage(P, z3, P, k, fl, plo, psz);
    for (int d = 0; d < 3; d++) rlo[d] = lo[d] + plo[d];
    float *b = malloc((size_t)(C * nv) * 4);
    uint8_t *lb = malloc((size_t)nv);
    int e = ts_dataset_read_box(ds, i, rlo, psz, b, lb, NAN);
    if (!e) {
        nan_to_zero(NULL, b, C, nv);
        e = ts_patch_transform(b, lb, C, P, k, fl, img, lab);
    }
    free(b);
    free(lb);
    return e;
}

/* The largest box ts_spatial_aug_read_box reads for n draws of o (stream seed), every 90-degree rotation and
 * flip set, patch P at lo in a volume of vol; *within: every one at most bound. */
static double largest_read(const ts_spatial_aug_opts *o, const int64_t P[3], const int64_t lo[3], const int64_t vol[3],
                           int n, uint64_t seed, double bound, int *within)
{
    static const int64_t z3[3] = {0, 0, 0};
    double most = 0;
    *within = 1;
    for (int t = 0; t < n; t++) {
        ts_rng r1;
        ts_rng_init(&r1, seed, (uint32_t)t, 2);
        ts_spatial_xform x;
        ts_spatial_aug_draw(o, &r1, &x);
        int64_t rlo[3], rsz[3];
        ts_spatial_aug_read_box(&x, P, t % 4, t % 8, lo, z3, P, vol, rlo, rsz);
        const double v = (double)rsz[0] * (double)rsz[1] * (double)rsz[2];
        most = fmax(most, v);
        *within &= v <= bound;
    }
    return most;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/phantoms.h5", argv[1]);
    ts_synth_opts so = {.size = {VOL[0], VOL[1], VOL[2]}, .channels = 2, .classes = 3, .seed = 11};
    ts_dataset *ds = NULL;
    int err = ts_synth_write(MPI_COMM_WORLD, path, &so, 3, 1, 4);
    if (!err) err = ts_dataset_open(MPI_COMM_SELF, path, NULL, &ds);
    if (!ts_ok(!err, "write and open a 3-sample phantom dataset (%s)", err ? ts_err_message() : "ok")) {
        MPI_Finalize();
        return ts_done();
    }
    const int64_t C = 2, P[3] = {9, 12, 12}, nv = 9 * 12 * 12, z3[3] = {0, 0, 0};
    float *a = malloc((size_t)(C * nv) * 4), *b = malloc((size_t)(C * nv) * 4);
    uint8_t *la = malloc((size_t)nv), *lb = malloc((size_t)nv);
    float mn[TS_IO_MAX_CHANNELS], mx[TS_IO_MAX_CHANNELS];
    ts_rng r;
    ts_rng_init(&r, 3, 0, 7);

    /* 1. identity = plain crop, every flip set and rotation, boxes partly outside */
    int ok = 1, cases = 0, mm_ok = 1;
    for (int k = 0; k < 4; k++)
        for (int fl = 0; fl < 8; fl++) {
            const int64_t box[3] = {P[0], (k & 1) ? P[2] : P[1], (k & 1) ? P[1] : P[2]};
            int64_t lo[3];
            for (int d = 0; d < 3; d++) lo[d] = -4 + (int64_t)ts_rng_below(&r, (uint64_t)(VOL[d] - box[d] + 9));
            ts_spatial_xform x = identity();
            err = ts_spatial_aug_box(ds, fl % 3, &x, P, k, fl, lo, z3, P, nan_to_zero, NULL, a, la, mn, mx);
            if (!err) err = plain(ds, fl % 3, P, k, fl, lo, b, lb);
            ok &= !err && !memcmp(a, b, (size_t)(C * nv) * 4) && !memcmp(la, lb, (size_t)nv);
            for (int64_t c = 0; c < C; c++) {
                float m0 = INFINITY, m1 = -INFINITY;
                for (int64_t t = 0; t < nv; t++) m0 = fminf(m0, b[c * nv + t]), m1 = fmaxf(m1, b[c * nv + t]);
                mm_ok &= m0 == mn[c] && m1 == mx[c];
            }
            cases++;
        }
    ts_ok(ok, "identity transform: %d patches (4 rotations x 8 flip sets, boxes partly outside the volume) equal "
          "the plain crop bit for bit, image and label", cases);
    ts_ok(mm_ok, "identity transform: the per-channel min and max are the output's");

    /* 2. 90 degrees about D = the rot90 crop with k = 3 (square H, W) */
    {
        const double pi = 3.14159265358979323846;
        ts_spatial_xform x = identity();
        x.a[1][1] = cos(pi / 2), x.a[1][2] = -sin(pi / 2), x.a[2][1] = sin(pi / 2), x.a[2][2] = cos(pi / 2);
        const int64_t lo[3] = {5, 1, 7};
        err = ts_spatial_aug_box(ds, 1, &x, P, 0, 0, lo, z3, P, nan_to_zero, NULL, a, la, mn, mx);
        if (!err) err = plain(ds, 1, P, 3, 0, lo, b, lb);
        double worst = 0;
        for (int64_t t = 0; t < C * nv; t++) worst = fmax(worst, fabs((double)a[t] - b[t]));
        ts_ok(!err && worst < 1e-4 && !memcmp(la, lb, (size_t)nv),
              "rotation by 90 degrees about D equals the 90-degree crop (largest image difference %.2g, labels equal)",
              worst);
    }
    /* 3. zoom 2 on an odd patch: patch voxel s is volume voxel lo + c + 2 (s - c) */
    {
        const int64_t Q[3] = {5, 5, 7}, nq = 5 * 5 * 7;
        ts_spatial_xform x = identity();
        for (int d = 0; d < 3; d++) x.a[d][d] = 2;
        const int64_t lo[3] = {6, 4, 9};
        float *whole = malloc((size_t)(C * VOL[0] * VOL[1] * VOL[2]) * 4);
        uint8_t *lwhole = malloc((size_t)(VOL[0] * VOL[1] * VOL[2]));
        err = ts_dataset_read_sample(ds, 2, whole, lwhole);
        if (!err) err = ts_spatial_aug_box(ds, 2, &x, Q, 0, 0, lo, z3, Q, nan_to_zero, NULL, a, la, mn, mx);
        int same = !err;
        const int64_t nvol = VOL[0] * VOL[1] * VOL[2];
        for (int64_t z = 0; z < Q[0] && same; z++)
            for (int64_t y = 0; y < Q[1]; y++)
                for (int64_t w = 0; w < Q[2]; w++) {
                    const int64_t vz = lo[0] + 2 + 2 * (z - 2), vy = lo[1] + 2 + 2 * (y - 2), vx = lo[2] + 3 + 2 * (w - 3);
                    const int64_t t = (z * Q[1] + y) * Q[2] + w, v = (vz * VOL[1] + vy) * VOL[2] + vx;
                    const int in = vz >= 0 && vz < VOL[0] && vy >= 0 && vy < VOL[1] && vx >= 0 && vx < VOL[2];
                    for (int64_t c = 0; c < C; c++) same &= a[c * nq + t] == (in ? whole[c * nvol + v] : 0);
                    same &= la[t] == (in ? lwhole[v] : 0);
                }
        ts_ok(same, "zoom 2 on a 5x5x7 patch: every patch voxel is the volume voxel lo + c + 2 (s - c), padding 0 "
              "outside (%s)", err ? ts_err_message() : "ok");

        /* 4. elastic: deterministic for its key, moves labels by at most disp (+ rounding) */
        ts_spatial_aug_opts eo = {.elastic_p = 1, .elastic_points = 5, .elastic_disp = 2.5};
        int det = 1, bounded = 1, moved = 0;
        for (int rep = 0; rep < 4; rep++) {
            ts_spatial_xform xe;
            ts_spatial_aug_draw(&eo, &r, &xe);
            const int64_t elo[3] = {3 + rep, 1, 5 + 2 * rep};
            err = ts_spatial_aug_box(ds, 2, &xe, P, 0, 0, elo, z3, P, nan_to_zero, NULL, a, la, mn, mx);
            if (!err) err = ts_spatial_aug_box(ds, 2, &xe, P, 0, 0, elo, z3, P, nan_to_zero, NULL, b, lb, mn, mx);
            det &= !err && xe.on && xe.elastic && !memcmp(a, b, (size_t)(C * nv) * 4) && !memcmp(la, lb, (size_t)nv);
            /* each label is the label of a volume voxel within disp + 0.5 (rounded: 3) along every axis */
            for (int64_t z = 0; z < P[0]; z++)
                for (int64_t y = 0; y < P[1]; y++)
                    for (int64_t w = 0; w < P[2]; w++) {
                        const int64_t t = (z * P[1] + y) * P[2] + w, c0[3] = {elo[0] + z, elo[1] + y, elo[2] + w};
                        int found = 0;
                        for (int64_t dz = -3; dz <= 3 && !found; dz++)
                            for (int64_t dy = -3; dy <= 3 && !found; dy++)
                                for (int64_t dx = -3; dx <= 3 && !found; dx++) {
                                    const int64_t q[3] = {c0[0] + dz, c0[1] + dy, c0[2] + dx};
                                    const int in = q[0] >= 0 && q[0] < VOL[0] && q[1] >= 0 && q[1] < VOL[1] &&
                                                   q[2] >= 0 && q[2] < VOL[2];
                                    found = (in ? lwhole[(q[0] * VOL[1] + q[1]) * VOL[2] + q[2]] : 0) == la[t];
                                }
                        bounded &= found;
                        const int in0 = c0[0] < VOL[0] && c0[1] < VOL[1] && c0[2] < VOL[2];
                        moved += in0 && lwhole[(c0[0] * VOL[1] + c0[1]) * VOL[2] + c0[2]] != la[t];
                    }
        }
        ts_ok(det, "elastic: the same key gives the same patch (4 draws)");
        ts_ok(bounded && moved > 0, "elastic (disp 2.5): every label comes from within 3 voxels of the undeformed "
              "place, and %d labels moved", moved);
        free(whole);
        free(lwhole);
    }
    /* 5. draws: probabilities, ranges, a fixed number of draws */
    {
        ts_spatial_aug_opts o = {.rot_p = 0.2, .rot_deg = 30, .zoom_p = 0.2, .zoom_min = 0.7, .zoom_max = 1.4,
                                 .elastic_p = 0.3, .elastic_points = 7, .elastic_disp = 7.5};
        ts_spatial_aug_opts always = o;
        always.rot_p = always.zoom_p = always.elastic_p = 1;
        const int N = 20000;
        int nrot = 0, nzoom = 0, nel = 0, in_range = 1, same_count = 1;
        double amax = 0, zmin = 10, zmax = 0;
        for (int t = 0; t < N; t++) {
            ts_rng r1, r2;
            ts_rng_init(&r1, 9, (uint32_t)t, 1);
            ts_rng_init(&r2, 9, (uint32_t)t, 1);
            ts_spatial_xform x, y;
            ts_spatial_aug_draw(&o, &r1, &x);
            ts_spatial_aug_draw(&always, &r2, &y);
            same_count &= ts_rng_u32(&r1) == ts_rng_u32(&r2);
            const int rot = x.angle[0] != 0 || x.angle[1] != 0 || x.angle[2] != 0;
            nrot += rot;
            nzoom += x.zoom != 1;
            nel += x.elastic;
            in_range &= x.on == (rot || x.zoom != 1 || x.elastic);
            for (int d = 0; d < 3; d++) amax = fmax(amax, fabs(y.angle[d]));
            zmin = fmin(zmin, y.zoom);
            zmax = fmax(zmax, y.zoom);
            /* a is zoom times a rotation: a a^T = zoom^2 I */
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++) {
                    double s = y.a[i][0] * y.a[j][0] + y.a[i][1] * y.a[j][1] + y.a[i][2] * y.a[j][2];
                    in_range &= fabs(s - (i == j) * y.zoom * y.zoom) < 1e-12;
                }
        }
        in_range &= amax <= 30 && amax > 29 && zmin >= 0.7 && zmin < 0.71 && zmax <= 1.4 && zmax > 1.39;
        ts_ok(fabs(nrot / (double)N - 0.2) < 0.015 && fabs(nzoom / (double)N - 0.2) < 0.015 &&
                  fabs(nel / (double)N - 0.3) < 0.015,
              "draws: rotation on %.3f, zoom on %.3f, elastic on %.3f of %d patches (0.2, 0.2, 0.3)", nrot / (double)N,
              nzoom / (double)N, nel / (double)N, N);
        ts_ok(in_range, "draws: angles within 30 degrees (largest %.2f), zoom in [0.7, 1.4] (%.3f..%.3f), a = zoom x "
              "a rotation", amax, zmin, zmax);
        ts_ok(same_count, "draws: the same number of random numbers whether a transform is on or not");
        ts_spatial_aug_opts off;
        memset(&off, 0, sizeof off);
        ts_rng r1, r2;
        ts_rng_init(&r1, 9, 0, 1);
        ts_rng_init(&r2, 9, 0, 1);
        ts_spatial_xform x;
        ts_spatial_aug_draw(&off, &r1, &x);
        ts_ok(!x.on && ts_rng_u32(&r1) == ts_rng_u32(&r2), "draws: all off draws nothing and is the identity");
        ts_spatial_aug_opts bad = o;
        bad.zoom_min = 1.5;
        int e1 = ts_spatial_aug_check(&bad);
        ts_ok(e1 == TS_ERR_CONFIG && strstr(ts_err_message(), "data.zoom_min"), "check: %s", ts_err_message());
        bad = o;
        bad.elastic_points = 40;
        e1 = ts_spatial_aug_check(&bad);
        ts_ok(e1 == TS_ERR_CONFIG && strstr(ts_err_message(), "data.elastic_points"), "check: %s", ts_err_message());
        ts_ok(ts_spatial_aug_check(&o) == 0, "check: the defaults pass");
    }
    /* 6. in the H-W plane (data.aug_2d, nnU-Net's dummy 2D augmentation of anisotropic patches) */
    {
        ts_ok(ts_spatial_aug_plane_auto((const int64_t[3]){8, 64, 64}) &&
                  ts_spatial_aug_plane_auto((const int64_t[3]){4, 12, 13}) &&
                  !ts_spatial_aug_plane_auto((const int64_t[3]){32, 64, 64}) &&
                  !ts_spatial_aug_plane_auto((const int64_t[3]){4, 12, 12}) &&
                  !ts_spatial_aug_plane_auto((const int64_t[3]){64, 16, 16}),
              "in-plane rule: the largest edge more than 3 times the D edge (8x64x64, 4x12x13 yes; 32x64x64, "
              "4x12x12, 64x16x16 no)");
        ts_spatial_aug_opts po = {.rot_p = 1, .rot_deg = 30, .zoom_p = 1, .zoom_min = 0.7, .zoom_max = 1.4,
                                  .plane = 1, .rot_deg_plane = 180};
        int planar = 1;
        double amax = 0;
        for (int t = 0; t < 5000; t++) {
            ts_rng r1;
            ts_rng_init(&r1, 4, (uint32_t)t, 1);
            ts_spatial_xform x;
            ts_spatial_aug_draw(&po, &r1, &x);
            amax = fmax(amax, fabs(x.angle[0]));
            planar &= x.angle[1] == 0 && x.angle[2] == 0 && x.a[0][0] == 1 && x.a[0][1] == 0 && x.a[0][2] == 0 &&
                      x.a[1][0] == 0 && x.a[2][0] == 0;
            /* the H-W block: zoom x a rotation */
            const double s = x.a[1][1] * x.a[1][1] + x.a[1][2] * x.a[1][2], q = x.a[1][1] * x.a[2][1] + x.a[1][2] * x.a[2][2];
            planar &= fabs(s - x.zoom * x.zoom) < 1e-12 && fabs(q) < 1e-12;
        }
        ts_ok(planar && amax > 175 && amax <= 180,
              "in-plane draws: a rotation about D only, up to 180 degrees (largest %.1f), the zoom of H and W only",
              amax);
        /* zoom 2 in the plane on an odd patch: patch voxel s is volume voxel (lo + s) along D, lo + c + 2 (s - c)
         * along H and W */
        const int64_t Q[3] = {5, 5, 7}, nq = 5 * 5 * 7, lo[3] = {6, 4, 9}, nvol = VOL[0] * VOL[1] * VOL[2];
        ts_spatial_aug_opts zo = {.zoom_p = 1, .zoom_min = 2, .zoom_max = 2, .plane = 1, .rot_deg_plane = 180};
        ts_spatial_xform x;
        ts_spatial_aug_draw(&zo, &r, &x);
        float *whole = malloc((size_t)(C * nvol) * 4);
        uint8_t *lwhole = malloc((size_t)nvol);
        err = ts_dataset_read_sample(ds, 2, whole, lwhole);
        if (!err) err = ts_spatial_aug_box(ds, 2, &x, Q, 0, 0, lo, z3, Q, nan_to_zero, NULL, a, la, mn, mx);
        int same = !err && x.on;
        for (int64_t z = 0; z < Q[0] && same; z++)
            for (int64_t y = 0; y < Q[1]; y++)
                for (int64_t w = 0; w < Q[2]; w++) {
                    const int64_t vz = lo[0] + z, vy = lo[1] + 2 + 2 * (y - 2), vx = lo[2] + 3 + 2 * (w - 3);
                    const int64_t t = (z * Q[1] + y) * Q[2] + w, v = (vz * VOL[1] + vy) * VOL[2] + vx;
                    const int in = vz >= 0 && vz < VOL[0] && vy >= 0 && vy < VOL[1] && vx >= 0 && vx < VOL[2];
                    for (int64_t c = 0; c < C; c++) same &= a[c * nq + t] == (in ? whole[c * nvol + v] : 0);
                    same &= la[t] == (in ? lwhole[v] : 0);
                }
        ts_ok(same, "in-plane zoom 2: D kept, H and W sampled every other voxel about the centre (%s)",
              err ? ts_err_message() : "ok");
        /* elastic in the plane: every label comes from its own D slice (within 3 voxels in H and W); in 3D
         * some do not */
        int own[2] = {1, 1};
        for (int pl = 0; pl < 2; pl++) {
            ts_spatial_aug_opts eo = {.elastic_p = 1, .elastic_points = 5, .elastic_disp = 2.5, .plane = pl,
                                      .rot_deg_plane = 180};
            for (int rep = 0; rep < 4; rep++) {
                ts_spatial_xform xe;
                ts_spatial_aug_draw(&eo, &r, &xe);
                const int64_t elo[3] = {3 + rep, 1, 5 + 2 * rep};
                err = ts_spatial_aug_box(ds, 2, &xe, P, 0, 0, elo, z3, P, nan_to_zero, NULL, a, la, mn, mx);
                own[pl] &= !err;
                for (int64_t z = 0; z < P[0]; z++)
                    for (int64_t y = 0; y < P[1]; y++)
                        for (int64_t w = 0; w < P[2]; w++) {
                            const int64_t t = (z * P[1] + y) * P[2] + w, c0[3] = {elo[0] + z, elo[1] + y, elo[2] + w};
                            int found = 0;
                            for (int64_t dy = -3; dy <= 3 && !found; dy++)
                                for (int64_t dx = -3; dx <= 3 && !found; dx++) {
                                    const int64_t q[3] = {c0[0], c0[1] + dy, c0[2] + dx};
                                    const int in = q[0] >= 0 && q[0] < VOL[0] && q[1] >= 0 && q[1] < VOL[1] &&
                                                   q[2] >= 0 && q[2] < VOL[2];
                                    found = (in ? lwhole[(q[0] * VOL[1] + q[1]) * VOL[2] + q[2]] : 0) == la[t];
                                }
                            own[pl] &= found;
                        }
            }
        }
        ts_ok(own[1] && !own[0], "elastic in the plane: every label from its own D slice; the 3D field moves some "
              "across slices");
        free(whole);
        free(lwhole);
    }
    /* 8. cubic convolution and one-hot linear labels: the identity is the plain crop (the kernels interpolate);
     * a zoom of 1/2 on an odd patch samples half-way between voxels, where Keys' weights are -1/16, 9/16,
     * 9/16, -1/16 and one-hot linear takes the class of the larger share, ties to the lower class */
    {
        int same = 1;
        for (int k = 0; k < 4; k++)
            for (int fl = 0; fl < 8; fl += 3) {
                const int64_t box[3] = {P[0], (k & 1) ? P[2] : P[1], (k & 1) ? P[1] : P[2]};
                int64_t lo[3];
                for (int d = 0; d < 3; d++) lo[d] = -3 + (int64_t)ts_rng_below(&r, (uint64_t)(VOL[d] - box[d] + 7));
                ts_spatial_xform x = identity();
                x.cubic = x.label_linear = 1;
                err = ts_spatial_aug_box(ds, fl % 3, &x, P, k, fl, lo, z3, P, nan_to_zero, NULL, a, la, mn, mx);
                if (!err) err = plain(ds, fl % 3, P, k, fl, lo, b, lb);
                same &= !err && !memcmp(a, b, (size_t)(C * nv) * 4) && !memcmp(la, lb, (size_t)nv);
            }
        ts_ok(same, "cubic image, one-hot linear label: the identity is the plain crop (4 rotations, flip sets, boxes "
              "partly outside)");
        const int64_t Q[3] = {5, 5, 7}, nq = 5 * 5 * 7, lo[3] = {6, 4, 9}, nvol = VOL[0] * VOL[1] * VOL[2];
        ts_spatial_xform x = identity();
        x.cubic = x.label_linear = 1;
        for (int d = 0; d < 3; d++) x.a[d][d] = 0.5;
        float *whole = malloc((size_t)(C * nvol) * 4);
        uint8_t *lwhole = malloc((size_t)nvol);
        err = ts_dataset_read_sample(ds, 1, whole, lwhole);
        if (!err) err = ts_spatial_aug_box(ds, 1, &x, Q, 0, 0, lo, z3, Q, nan_to_zero, NULL, a, la, mn, mx);
        double worst = 0;
        int labels = !err, halves = 0;
        for (int64_t z = 0; z < Q[0] && !err; z++)
            for (int64_t y = 0; y < Q[1]; y++)
                for (int64_t w = 0; w < Q[2]; w++) {
                    /* per axis: the place lo + c + (s - c)/2, its taps and weights */
                    const int64_t s3[3] = {z, y, w};
                    int64_t i0[3], nt[3];
                    double cw[3][4], lw[3][2];
                    for (int d = 0; d < 3; d++) {
                        /* 4 x place = 4 lo + 2c + 2s with 2c = Q - 1; half-way when s - c is odd */
                        const int64_t c2 = Q[d] - 1, odd = (2 * s3[d] - c2) % 4 != 0;
                        i0[d] = (4 * lo[d] + c2 + 2 * s3[d]) / 4;
                        nt[d] = odd ? 2 : 1;
                        halves += odd && d == 0;
                        const double kw[4] = {-1.0 / 16, 9.0 / 16, 9.0 / 16, -1.0 / 16};
                        for (int j = 0; j < 4; j++) cw[d][j] = odd ? kw[j] : j == 1;
                        lw[d][0] = odd ? 0.5 : 1;
                        lw[d][1] = odd ? 0.5 : 0;
                    }
                    const int64_t t = (z * Q[1] + y) * Q[2] + w;
                    for (int64_t c = 0; c < C; c++) {
                        double acc = 0;
                        for (int i = 0; i < 4; i++)
                            for (int j = 0; j < 4; j++)
                                for (int q = 0; q < 4; q++) {
                                    const int64_t p0 = i0[0] - 1 + i, p1 = i0[1] - 1 + j, p2 = i0[2] - 1 + q;
                                    const int in = p0 >= 0 && p0 < VOL[0] && p1 >= 0 && p1 < VOL[1] && p2 >= 0 &&
                                                   p2 < VOL[2];
                                    if (in) acc += cw[0][i] * cw[1][j] * cw[2][q] *
                                                   whole[c * nvol + (p0 * VOL[1] + p1) * VOL[2] + p2];
                                }
                        worst = fmax(worst, fabs(acc - a[c * nq + t]));
                    }
                    double share[256] = {0};
                    for (int i = 0; i < nt[0]; i++)
                        for (int j = 0; j < nt[1]; j++)
                            for (int q = 0; q < nt[2]; q++) {
                                const int64_t p0 = i0[0] + i, p1 = i0[1] + j, p2 = i0[2] + q;
                                const int in = p0 < VOL[0] && p1 < VOL[1] && p2 < VOL[2];
                                share[in ? lwhole[(p0 * VOL[1] + p1) * VOL[2] + p2] : 0] += lw[0][i] * lw[1][j] * lw[2][q];
                            }
                    int best = 0;
                    for (int cl = 1; cl < 256; cl++)
                        if (share[cl] > share[best]) best = cl;
                    labels &= la[t] == best;
                }
        ts_ok(!err && worst < 1e-4 && labels && halves > 0,
              "zoom 1/2 with cubic and one-hot linear: half-way samples take Keys' weights (max difference %.2g) "
              "and the label of the larger share, ties to the lower class",
              worst);
        free(whole);
        free(lwhole);
    }
    /* 7. the memory plan's read box (ts_spatial_aug_read_voxels) bounds every box read, and is not loose */
    for (int pl = 0; pl < 2; pl++) {
        const int64_t Pm[3] = {pl ? 8 : 48, 64, pl ? 64 : 40}, big[3] = {1000, 1000, 1000};
        ts_spatial_aug_opts mo = {.rot_p = 1, .rot_deg = 30, .zoom_p = 1, .zoom_min = 0.7, .zoom_max = 1.4,
                                  .elastic_p = 1, .elastic_points = 7, .elastic_disp = 7.5, .plane = pl,
                                  .rot_deg_plane = 180};
        const double bound = ts_spatial_aug_read_voxels(&mo, Pm, big);
        int within;
        const double most = largest_read(&mo, Pm, (const int64_t[3]){400, 400, 400}, big, 3000, 5, bound, &within);
        const int64_t small[3] = {30, 30, 30};
        /* clipped: 30 per axis, but D in the plane is 8 + 2 x 7.5 + 4 = 27 */
        const double clipped = ts_spatial_aug_read_voxels(&mo, Pm, small);
        ts_ok(within && most > 0.4 * bound && clipped == (pl ? 27.0 * 30 * 30 : 27000.0),
              "%s: 3000 read boxes of a %lldx%lldx%lld patch at most %.0f voxels, the plan's bound %.0f (%.2f of it); "
              "clipped to a 30^3 volume",
              pl ? "in the plane" : "3D", (long long)Pm[0], (long long)Pm[1], (long long)Pm[2], most, bound,
              most / bound);
    }
    { /* a zoom alone on a long H x W box, a volume that clips one in-plane axis: the 90-degree rotations
       * swap the read box's H and W, and the bound takes the larger */
        const int64_t Pz[3] = {8, 64, 256}, vz[3] = {1000, 300, 80};
        ts_spatial_aug_opts zo = {.zoom_p = 1, .zoom_min = 0.7, .zoom_max = 1.4};
        const double bound = ts_spatial_aug_read_voxels(&zo, Pz, vz);
        int within;
        const double most = largest_read(&zo, Pz, (const int64_t[3]){100, 0, 0}, vz, 400, 6, bound, &within);
        ts_ok(within && most > 0.5 * bound, "a zoom alone, 8x64x256 patch in a 1000x300x80 volume, every 90-degree "
              "rotation: read boxes at most %.0f voxels, the bound %.0f", most, bound);
    }
    {
        ts_spatial_aug_opts none;
        memset(&none, 0, sizeof none);
        ts_ok(ts_spatial_aug_read_voxels(&none, P, NULL) == 0, "no spatial transform: no read box beyond the patch");
    }
    free(a);
    free(b);
    free(la);
    free(lb);
    ts_dataset_close(&ds);
    int rc = ts_done();
    MPI_Finalize();
    return rc;
}
