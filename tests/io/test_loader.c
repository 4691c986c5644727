/* Patches, augmentation, normalisation and the prefetching loader (one
 * rank): the spatial transform against direct formulas; centred patches
 * equal the boxes read directly, with padding; foreground oversampling;
 * augmentation keeps image and label aligned (a dataset whose image is its
 * label); z-score and clipping; batches identical for every prefetch depth;
 * evaluation visits each sample once; resume from a saved position; an
 * error on the loader thread (a corrupt chunk) reaches the caller.
 * usage: test_loader DIR */
#include "tsbuild.h"
#include "io/dataset.h"
#include "io/h5.h"
#include "io/loader.h"
#include "io/synth.h"
#include "io/writer.h"
#include "src/core/error.h"
#include "tests/tap.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ts_patch_opts plain(int64_t edge)
{
    ts_patch_opts o;
    memset(&o, 0, sizeof o);
    o.patch[0] = o.patch[1] = o.patch[2] = edge;
    o.norm = TS_NORM_NONE;
    o.clip_lo = o.clip_hi = -1;
    return o;
}

static void test_transform(void)
{
    const int64_t D = 3, H = 4, W = 5, C = 2;
    float in[C * D * H * W], out[C * D * H * W];
    uint8_t lin[D * H * W], lout[D * H * W];
    int ok = 1;
    for (int k = 0; k < 4; k++)
        for (int fl = 0; fl < 8; fl++) {
            const int64_t rh = (k & 1) ? W : H, rw = (k & 1) ? H : W;
            for (int64_t t = 0; t < C * D * rh * rw; t++) in[t] = (float)t;
            for (int64_t t = 0; t < D * rh * rw; t++) lin[t] = (uint8_t)t;
            ts_patch_transform(in, lin, C, (const int64_t[]){D, H, W}, k, fl, out, lout);
            for (int64_t c = 0; c < C; c++)
                for (int64_t z = 0; z < D; z++)
                    for (int64_t y = 0; y < H; y++)
                        for (int64_t x = 0; x < W; x++) {
                            /* flip the output coordinates, then undo a counter-clockwise rotation */
                            int64_t fz = (fl & 1) ? D - 1 - z : z, fy = (fl & 2) ? H - 1 - y : y,
                                    fx = (fl & 4) ? W - 1 - x : x, sy = fy, sx = fx;
                            for (int r = 0; r < k; r++) {
                                /* one rotation maps box (h, w) -> (w, h): (y, x) <- (x, h-1-y) */
                                int64_t hh = (r & 1) ? W : H;
                                int64_t ny = sx, nx = hh - 1 - sy;
                                sy = ny;
                                sx = nx;
                            }
                            float want = in[((c * D + fz) * rh + sy) * rw + sx];
                            if (out[((c * D + z) * H + y) * W + x] != want) ok = 0;
                            if (c == 0 && lout[(z * H + y) * W + x] != lin[(fz * rh + sy) * rw + sx]) ok = 0;
                        }
        }
    ts_ok(ok, "transform: 4 rotations x 8 flip sets on a 3x4x5 box match the direct formula (image and label)");
    /* four quarter turns of a cube are the identity; two equal flipping H and W */
    const int64_t E = 4, n = E * E * E;
    float a[n], b[n], c2[n], f[n];
    for (int64_t t = 0; t < n; t++) a[t] = (float)(t * 7 % 13);
    memcpy(b, a, sizeof a);
    for (int r = 0; r < 4; r++) {
        ts_patch_transform(b, NULL, 1, (const int64_t[]){E, E, E}, 1, 0, c2, NULL);
        memcpy(b, c2, sizeof b);
    }
    ts_ok(!memcmp(a, b, sizeof a), "transform: four quarter turns are the identity");
    ts_patch_transform(a, NULL, 1, (const int64_t[]){E, E, E}, 2, 0, b, NULL);
    ts_patch_transform(a, NULL, 1, (const int64_t[]){E, E, E}, 0, 6, f, NULL);
    ts_ok(!memcmp(b, f, sizeof b), "transform: a half turn equals flipping H and W");
}

/* a dataset whose image equals its label (as floats) */
static int write_mirror(const char *path)
{
    ts_dswriter_opts wo = {.count = 3, .channels = 1, .classes = 4, .shards = 1, .chunk = 8, .seed = 1};
    ts_dswriter *w = NULL;
    TS_TRY(ts_dswriter_create(MPI_COMM_SELF, path, &wo, &w));
    for (int64_t r = 0; r < ts_dswriter_rounds(w); r++) {
        ts_synth_opts so = {.size = {13, 17, 11}, .classes = 4, .seed = 9};
        ts_sample s;
        int e = ts_synth_sample(&so, ts_dswriter_local_index(w, r), &s);
        if (!e) {
            int64_t nv = s.shape[1] * s.shape[2] * s.shape[3];
            for (int64_t t = 0; t < nv; t++) s.image[t] = (float)s.label[t];
        }
        e = ts_dswriter_put(w, e ? NULL : &s, e);
        ts_sample_release(&s);
        if (e) {
            ts_dswriter_destroy(&w);
            return e;
        }
    }
    int e = ts_dswriter_finish(w);
    ts_dswriter_destroy(&w);
    return e;
}

static int batches_equal(const ts_batch *a, const ts_batch *b)
{
    return ts_tensor_bytes(&a->image) == ts_tensor_bytes(&b->image) &&
           !memcmp(a->image.data, b->image.data, ts_tensor_bytes(&a->image)) &&
           !memcmp(a->label.data, b->label.data, ts_tensor_bytes(&a->label)) &&
           !memcmp(a->sample, b->sample, (size_t)a->image.shape[0] * sizeof(int64_t));
}

int main(int argc, char **argv)
{
    int prov;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    ts_err_set_rank(0);
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    char p1[512], p2[512], p3[512];
    snprintf(p1, sizeof p1, "%s/phantoms.h5", argv[1]);
    snprintf(p2, sizeof p2, "%s/mirror.h5", argv[1]);
    snprintf(p3, sizeof p3, "%s/corrupt.h5", argv[1]);
    test_transform();

    ts_synth_opts so = {.size = {20, 24, 28}, .channels = 2, .classes = 3, .seed = 11};
    int err = ts_synth_write(MPI_COMM_SELF, p1, &so, 6, 1, 8);
    ts_synth_opts small = {.size = {12, 12, 12}, .channels = 1, .classes = 3, .seed = 4};
    char p4[600];
    snprintf(p4, sizeof p4, "%s/small.h5", argv[1]);
    if (!err) err = ts_synth_write(MPI_COMM_SELF, p4, &small, 2, 1, 64);
    if (!err) err = write_mirror(p2);
    if (!ts_ok(!err, "write the test datasets (%s)", err ? ts_err_message() : "ok")) return ts_done();
    ts_dataset *ds = NULL, *sm = NULL, *mir = NULL;
    err = ts_dataset_open(MPI_COMM_SELF, p1, NULL, &ds);
    if (!err) err = ts_dataset_open(MPI_COMM_SELF, p4, NULL, &sm);
    if (!err) err = ts_dataset_open(MPI_COMM_SELF, p2, NULL, &mir);
    if (!ts_ok(!err, "open them (%s)", err ? ts_err_message() : "ok")) return ts_done();

    /* centred patch (no augmentation, no normalisation) equals the box read directly */
    {
        ts_patch_opts o = plain(16);
        int64_t C = 2, nv = 16 * 16 * 16;
        float *a = malloc((size_t)(C * nv) * 4), *b = malloc((size_t)(C * nv) * 4),
              *sc = malloc(ts_patch_scratch_floats(ds, &o) * 4);
        uint8_t *la = malloc((size_t)nv), *lb = malloc((size_t)nv);
        ts_rng r;
        ts_rng_init(&r, 1, 0, 0);
        int e = ts_patch_draw(ds, 3, &o, &r, 0, a, la, sc);
        int64_t lo[3] = {(20 - 16) / 2, (24 - 16) / 2, (28 - 16) / 2}, sz[3] = {16, 16, 16};
        e |= ts_dataset_read_box(ds, 3, lo, sz, b, lb, 0.0f);
        ts_ok(!e && !memcmp(a, b, (size_t)(C * nv) * 4) && !memcmp(la, lb, (size_t)nv),
              "eval patch: the centred box, read as is");
        free(a);
        free(b);
        free(sc);
        free(la);
        free(lb);
    }
    /* padding: 12^3 volumes in 16^3 patches */
    {
        ts_patch_opts o = plain(16);
        int64_t nv = 16 * 16 * 16;
        float *a = malloc((size_t)nv * 4), *sc = malloc(ts_patch_scratch_floats(sm, &o) * 4),
              *full = malloc(12 * 12 * 12 * 4);
        uint8_t *la = malloc((size_t)nv), *lfull = malloc(12 * 12 * 12);
        ts_rng r;
        ts_rng_init(&r, 1, 0, 0);
        int e = ts_patch_draw(sm, 1, &o, &r, 0, a, la, sc);
        e |= ts_dataset_read_sample(sm, 1, full, lfull);
        int ok = !e;
        for (int64_t z = 0; z < 16; z++)
            for (int64_t y = 0; y < 16; y++)
                for (int64_t x = 0; x < 16; x++) {
                    int in = z >= 2 && z < 14 && y >= 2 && y < 14 && x >= 2 && x < 14;
                    int64_t t = (z * 16 + y) * 16 + x, s = ((z - 2) * 12 + (y - 2)) * 12 + (x - 2);
                    if (in ? (a[t] != full[s] || la[t] != lfull[s]) : (a[t] != 0 || la[t] != 0)) ok = 0;
                }
        ts_ok(ok, "a 12^3 volume sits centred in a 16^3 patch, padded with 0 (image) and 0 (label)");
        /* with z-score, padding is still 0 and the volume is (x - mean) / std */
        o.norm = TS_NORM_IMAGE;
        ts_sample_info in;
        ts_dataset_info(sm, 1, &in);
        e = ts_patch_draw(sm, 1, &o, &r, 0, a, la, sc);
        ok = !e;
        for (int64_t z = 0; z < 16; z++)
            for (int64_t y = 0; y < 16; y++)
                for (int64_t x = 0; x < 16; x++) {
                    int in_ = z >= 2 && z < 14 && y >= 2 && y < 14 && x >= 2 && x < 14;
                    int64_t t = (z * 16 + y) * 16 + x, s = ((z - 2) * 12 + (y - 2)) * 12 + (x - 2);
                    double want = in_ ? (full[s] - (float)in.mean[0]) * (float)(1.0 / in.std[0]) : 0.0;
                    if (fabs(a[t] - want) > 1e-5) ok = 0;
                }
        ts_ok(ok, "z-score per image inside, 0 in the padding");
        /* random training crops of a small volume keep the whole volume inside the patch */
        o.norm = TS_NORM_NONE;
        ok = 1;
        for (int t = 0; t < 20; t++) {
            ts_rng_init(&r, 5, (uint32_t)t, 0);
            e = ts_patch_draw(sm, 0, &o, &r, 1, a, la, sc);
            int64_t nz = 0;
            for (int64_t v = 0; v < nv; v++) nz += a[v] != 0;
            if (e || nz < 12 * 12 * 12 - 50) ok = 0; /* (a few voxels may be exactly 0) */
        }
        ts_ok(ok, "training crops of a volume smaller than the patch contain the whole volume");
        free(a);
        free(sc);
        free(full);
        free(la);
        free(lfull);
    }
    /* foreground oversampling */
    {
        ts_patch_opts o = plain(6);
        o.fg_fraction = 1.0;
        int64_t C = 2, nv = 6 * 6 * 6;
        float *a = malloc((size_t)(C * nv) * 4), *sc = malloc(ts_patch_scratch_floats(ds, &o) * 4);
        uint8_t *la = malloc((size_t)nv);
        int all = 1, some_bg = 0;
        for (int t = 0; t < 60; t++) {
            ts_rng r;
            ts_rng_init(&r, 3, (uint32_t)t, 0);
            if (ts_patch_draw(ds, t % 6, &o, &r, 1, a, la, sc)) all = 0;
            int fg = 0;
            for (int64_t v = 0; v < nv; v++) fg |= la[v] > 0;
            all &= fg;
            /* the centre voxel is foreground unless the box was clamped at a border */
        }
        ts_ok(all, "fg_fraction 1: all 60 patches of 6^3 contain foreground");
        o.fg_fraction = 0.0;
        for (int t = 0; t < 60; t++) {
            ts_rng r;
            ts_rng_init(&r, 3, (uint32_t)t, 0);
            ts_patch_draw(ds, t % 6, &o, &r, 1, a, la, sc);
            int fg = 0;
            for (int64_t v = 0; v < nv; v++) fg |= la[v] > 0;
            some_bg |= !fg;
        }
        ts_ok(some_bg, "fg_fraction 0: some random 6^3 patches hold no foreground");
        free(a);
        free(sc);
        free(la);
    }
    /* augmentation keeps image and label aligned; rotations and flips occur */
    {
        ts_patch_opts o = plain(8);
        o.patch[2] = 6; /* H != W: rotations read a swapped box */
        o.augment = o.flip = o.rot90 = 1;
        o.fg_fraction = 0.5;
        int64_t nv = 8 * 8 * 6;
        float *a = malloc((size_t)nv * 4), *sc = malloc(ts_patch_scratch_floats(mir, &o) * 4), *ref = malloc((size_t)nv * 4);
        uint8_t *la = malloc((size_t)nv);
        int aligned = 1, differ = 0;
        for (int t = 0; t < 50; t++) {
            ts_rng r;
            ts_rng_init(&r, 8, (uint32_t)t, 0);
            if (ts_patch_draw(mir, t % 3, &o, &r, 1, a, la, sc)) aligned = 0;
            for (int64_t v = 0; v < nv; v++) aligned &= a[v] == (float)la[v];
            if (t == 0) memcpy(ref, a, (size_t)nv * 4);
            else differ |= memcmp(ref, a, (size_t)nv * 4) != 0;
        }
        ts_ok(aligned, "flips and rotations (8x8x6 patches) move image and label together");
        ts_ok(differ, "augmented patches differ from draw to draw");
        /* intensity augmentation changes values, not labels; a stream position gives the same patch */
        o.scale = 0.2;
        o.shift = 0.2;
        o.gamma = 0.5;
        ts_rng r1, r2;
        ts_rng_init(&r1, 8, 77, 0);
        ts_rng_init(&r2, 8, 77, 0);
        uint8_t *lb = malloc((size_t)nv);
        float *b = malloc((size_t)nv * 4);
        ts_patch_draw(mir, 1, &o, &r1, 1, a, la, sc);
        ts_patch_draw(mir, 1, &o, &r2, 1, b, lb, sc);
        ts_ok(!memcmp(a, b, (size_t)nv * 4) && !memcmp(la, lb, (size_t)nv), "same stream, same patch");
        free(a);
        free(b);
        free(sc);
        free(ref);
        free(la);
        free(lb);
    }
    /* normalisation over a whole volume: mean 0, std 1; clipping bounds */
    {
        ts_patch_opts o = plain(0);
        o.patch[0] = 20;
        o.patch[1] = 24;
        o.patch[2] = 28;
        o.norm = TS_NORM_IMAGE;
        int64_t nv = 20 * 24 * 28;
        float *a = malloc((size_t)(2 * nv) * 4), *sc = malloc(ts_patch_scratch_floats(ds, &o) * 4);
        uint8_t *la = malloc((size_t)nv);
        ts_rng r;
        ts_rng_init(&r, 1, 0, 0);
        ts_patch_draw(ds, 2, &o, &r, 0, a, la, sc);
        int ok = 1;
        for (int c = 0; c < 2; c++) {
            double s = 0, ss = 0;
            for (int64_t v = 0; v < nv; v++) s += a[c * nv + v];
            for (int64_t v = 0; v < nv; v++) ss += (a[c * nv + v] - s / nv) * (a[c * nv + v] - s / nv);
            ok &= fabs(s / nv) < 1e-5 && fabs(sqrt(ss / nv) - 1) < 1e-5;
        }
        ts_ok(ok, "z-score per image: each channel of a whole volume has mean 0 and std 1");
        ts_sample_info in;
        ts_dataset_info(ds, 2, &in);
        o.clip_lo = 1;
        o.clip_hi = 4; /* 1 and 99 percent */
        ts_patch_draw(ds, 2, &o, &r, 0, a, la, sc);
        float mn = INFINITY, mx = -INFINITY;
        for (int64_t v = 0; v < nv; v++) {
            mn = a[v] < mn ? a[v] : mn;
            mx = a[v] > mx ? a[v] : mx;
        }
        double wlo = (in.pct[1] - in.mean[0]) / in.std[0], whi = (in.pct[4] - in.mean[0]) / in.std[0];
        ts_ok(fabs(mn - wlo) < 1e-5 && fabs(mx - whi) < 1e-5, "clipping to the 1st/99th percentiles: [%.4f, %.4f]",
              (double)mn, (double)mx);
        o.norm = TS_NORM_DATASET;
        o.clip_lo = o.clip_hi = -1;
        float *b = malloc((size_t)(2 * nv) * 4);
        ts_patch_draw(ds, 2, &o, &r, 0, a, la, sc);
        ts_dataset_read_sample(ds, 2, b, la);
        ok = 1;
        for (int c = 0; c < 2; c++)
            for (int64_t v = 0; v < nv; v += 97)
                ok &= fabs(a[c * nv + v] - (b[c * nv + v] - ts_dataset_mean(ds)[c]) / ts_dataset_std(ds)[c]) < 1e-5;
        ts_ok(ok, "z-score with the dataset's mean and std");
        free(a);
        free(b);
        free(sc);
        free(la);
    }
    /* the loader: identical batches whatever the prefetch depth */
    {
        ts_loader_opts lo;
        memset(&lo, 0, sizeof lo);
        lo.patch = plain(10);
        lo.patch.augment = lo.patch.flip = lo.patch.rot90 = 1;
        lo.patch.scale = lo.patch.shift = 0.1;
        lo.patch.gamma = 0.3;
        lo.patch.fg_fraction = 0.33;
        lo.patch.norm = TS_NORM_IMAGE;
        lo.batch = 3;
        lo.seed = 21;
        lo.mode = TS_SAMPLER_TRAIN;
        ts_batch ref[7];
        memset(ref, 0, sizeof ref);
        int same = 1, ok = 1;
        const int depths[] = {0, 1, 3};
        for (int d = 0; d < 3; d++) {
            lo.prefetch = depths[d];
            ts_loader *l = NULL;
            if (ts_loader_create(ds, 0, 1, &lo, &l)) {
                ok = 0;
                break;
            }
            for (int st = 0; st < 7; st++) {
                const ts_batch *b = NULL;
                if (ts_loader_next(l, &b)) {
                    ok = 0;
                    break;
                }
                ok &= b->step == st && b->position == st * 3 && b->next_position == (st + 1) * 3;
                if (d == 0) {
                    ref[st] = *b;
                    ts_tensor_alloc(&ref[st].image, TS_FLOAT32, 5, b->image.shape);
                    ts_tensor_alloc(&ref[st].label, TS_UINT8, 4, b->label.shape);
                    memcpy(ref[st].image.data, b->image.data, ts_tensor_bytes(&b->image));
                    memcpy(ref[st].label.data, b->label.data, ts_tensor_bytes(&b->label));
                } else {
                    same &= batches_equal(b, &ref[st]);
                }
            }
            ts_loader_destroy(&l);
        }
        ts_ok(ok, "loader: 7 batches of 3 with prefetch 0, 1, 3; steps and positions counted");
        ts_ok(same, "loader: batches are identical for every prefetch depth");
        /* resume: a loader restored at the position after 4 batches continues identically */
        lo.prefetch = 2;
        ts_loader *l = NULL;
        ts_loader_create(ds, 0, 1, &lo, &l);
        const ts_batch *b = NULL;
        for (int st = 0; st < 4; st++) ts_loader_next(l, &b);
        int64_t saved = ts_loader_position(l);
        ts_loader_destroy(&l);
        ts_loader_create(ds, 0, 1, &lo, &l);
        ts_loader_seek(l, saved);
        int resumed = saved == 12;
        for (int st = 4; st < 7; st++) {
            if (ts_loader_next(l, &b)) resumed = 0;
            else resumed &= batches_equal(b, &ref[st]);
        }
        ts_ok(resumed, "loader: seek to the saved position %lld repeats batches 4..6", (long long)saved);
        ts_loader_destroy(&l);
        for (int st = 0; st < 7; st++) {
            ts_tensor_free(&ref[st].image);
            ts_tensor_free(&ref[st].label);
        }
    }
    /* evaluation: each sample once, empty slots zeroed, then the end */
    {
        ts_loader_opts lo;
        memset(&lo, 0, sizeof lo);
        lo.patch = plain(8);
        lo.batch = 4;
        lo.prefetch = 2;
        lo.mode = TS_SAMPLER_EVAL;
        ts_loader *l = NULL;
        int ok = !ts_loader_create(ds, 0, 1, &lo, &l), count[6] = {0}, steps = 0, zero = 1;
        const ts_batch *b = NULL;
        int rc;
        while (ok && (rc = ts_loader_next(l, &b)) == 0) {
            steps++;
            for (int s = 0; s < 4; s++) {
                if (b->sample[s] >= 0) count[b->sample[s]]++;
                else {
                    const float *x = (const float *)b->image.data + s * 2 * 512;
                    for (int v = 0; v < 1024; v++) zero &= x[v] == 0;
                }
            }
        }
        ok &= rc == 1 && ts_loader_next(l, &b) == 1;
        for (int i = 0; i < 6; i++) ok &= count[i] == 1;
        ts_ok(ok && steps == 2 && zero, "eval loader: 6 samples in 2 batches of 4, empty slots zero, then the end");
        ts_loader_destroy(&l);
    }
    ts_dataset_close(&ds);
    ts_dataset_close(&sm);
    ts_dataset_close(&mir);

    /* an error on the loader thread: a corrupt chunk of sample 1 */
    {
        int e = ts_synth_write(MPI_COMM_SELF, p3, &so, 3, 1, 32);
        hid_t f = H5Fopen(p3, H5F_ACC_RDONLY, H5P_DEFAULT);
        hid_t d = H5Dopen2(f, "/samples/000001/image", H5P_DEFAULT);
        hsize_t off[4], size;
        unsigned mask;
        haddr_t addr;
        H5Dget_chunk_info(d, H5Dget_space(d), 0, off, &mask, &addr, &size);
        H5Dclose(d);
        H5Fclose(f);
        int fd = open(p3, O_RDWR);
        unsigned char x = 0;
        if (pread(fd, &x, 1, (off_t)(addr + 100)) == 1) {
            x ^= 0x5a;
            e |= pwrite(fd, &x, 1, (off_t)(addr + 100)) != 1;
        }
        close(fd);
        ts_dataset *bad = NULL;
        if (!e) e = ts_dataset_open(MPI_COMM_SELF, p3, NULL, &bad);
        if (e) ts_diag("corrupt dataset: %s", ts_err_message());
        ts_loader_opts lo;
        memset(&lo, 0, sizeof lo);
        lo.patch = plain(8);
        lo.batch = 1;
        lo.prefetch = 2;
        lo.mode = TS_SAMPLER_EVAL;
        ts_loader *l = NULL;
        if (!e) e = ts_loader_create(bad, 0, 1, &lo, &l);
        const ts_batch *b = NULL;
        int r0 = e ? -1 : ts_loader_next(l, &b), r1 = e ? -1 : ts_loader_next(l, &b);
        const char *msg = ts_err_message();
        ts_ok(!e && r0 == 0 && r1 == TS_ERR_FORMAT && strstr(msg, "Fletcher-32") && strstr(msg, "corrupt.h5") &&
                  strstr(msg, "/samples/000001/image"),
              "a corrupt chunk read on the loader thread is reported by next(): %s", msg);
        ts_ok(!e && ts_loader_next(l, &b) == TS_ERR_FORMAT, "and again on the next call (no hang)");
        ts_loader_destroy(&l);
        ts_dataset_close(&bad);
    }
    int rc = ts_done();
    MPI_Finalize();
    return rc;
}
