/* Dataset writer and reader on any number of ranks: synthetic phantoms
 * written as one file (collectively when ranks > 1) and as shards, read back
 * whole, as boxes inside and across the volume border (multi-chunk volumes
 * with edge chunks, with and without the chunk cache), collectively by
 * slabs, and through the H5Dread path; statistics and foreground
 * coordinates checked against the phantoms regenerated in memory.
 * usage: test_dataset DIR (a scratch directory shared by the ranks) */
#include "tsbuild.h"
#include "io/dataset.h"
#include "io/h5.h"
#include "io/synth.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "tests/tap.h"

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

/* reference box from a full sample, padding outside */
static void ref_box(const ts_sample *s, const int64_t *lo, const int64_t *sz, float pad, float *img, uint8_t *lab)
{
    const int64_t C = s->shape[0], D = s->shape[1], H = s->shape[2], W = s->shape[3];
    for (int64_t c = 0; c < C; c++)
        for (int64_t z = 0; z < sz[0]; z++)
            for (int64_t y = 0; y < sz[1]; y++)
                for (int64_t x = 0; x < sz[2]; x++) {
                    int64_t gz = lo[0] + z, gy = lo[1] + y, gx = lo[2] + x;
                    int in = gz >= 0 && gz < D && gy >= 0 && gy < H && gx >= 0 && gx < W;
                    int64_t o = ((c * sz[0] + z) * sz[1] + y) * sz[2] + x;
                    img[o] = in ? s->image[((c * D + gz) * H + gy) * W + gx] : pad;
                    if (c == 0) lab[(z * sz[1] + y) * sz[2] + x] = in ? s->label[(gz * H + gy) * W + gx] : 0;
                }
}

static void check_dataset(const char *path, const ts_synth_opts *so, int64_t count, const char *what, int box_hint)
{
    ts_dataset *ds = NULL;
    ts_dataset_opts oo = {.driver = TS_IO_DRIVER_MPIO, .check = 1};
    if (box_hint) oo.box_hint[0] = oo.box_hint[1] = oo.box_hint[2] = box_hint;
    int err = ts_dataset_open(MPI_COMM_WORLD, path, &oo, &ds);
    if (!ts_ok(all_ok(err == 0), "%s: open (%s)", what, err ? ts_err_message() : "ok")) return;
    int ok = ts_dataset_count(ds) == count && ts_dataset_channels(ds) == so->channels &&
             ts_dataset_classes(ds) == so->classes && !strcmp(ts_dataset_class_name(ds, 0), "background");
    ts_ok(all_ok(ok), "%s: count %lld, channels %d, classes %d", what, (long long)ts_dataset_count(ds),
          ts_dataset_channels(ds), ts_dataset_classes(ds));

    /* every sample, whole, equals the phantom; stats match; foreground coordinates are foreground */
    int same = 1, stats = 1, fg = 1;
    double dsum = 0, dn = 0;
    for (int64_t i = 0; i < count; i++) {
        ts_sample s;
        if (ts_synth_sample(so, i, &s)) {
            same = 0;
            break;
        }
        int64_t nv = s.shape[1] * s.shape[2] * s.shape[3], C = s.shape[0];
        float *img = malloc((size_t)(C * nv) * sizeof(float));
        uint8_t *lab = malloc((size_t)nv);
        /* spread the reads over the ranks, every rank reads sample 0 */
        if (i % size == rank || i == 0) {
            if (ts_dataset_read_sample(ds, i, img, lab)) {
                ts_diag("read %lld: %s", (long long)i, ts_err_message());
                same = 0;
            } else if (memcmp(img, s.image, (size_t)(C * nv) * sizeof(float)) || memcmp(lab, s.label, (size_t)nv)) {
                same = 0;
            }
        }
        ts_sample_info inf;
        ts_dataset_info(ds, i, &inf);
        double sum = 0, ss = 0;
        for (int64_t v = 0; v < nv; v++) sum += s.image[v];
        double mean = sum / nv;
        for (int64_t v = 0; v < nv; v++) ss += (s.image[v] - mean) * (s.image[v] - mean);
        if (fabs(inf.mean[0] - mean) > 1e-9 || fabs(inf.std[0] - sqrt(ss / nv)) > 1e-9) stats = 0;
        if (strcmp(inf.name, s.name) || inf.shape[1] != s.shape[1]) stats = 0;
        int64_t cnt1 = 0;
        for (int64_t v = 0; v < nv; v++) cnt1 += s.label[v] == 1;
        if (inf.class_voxels[1] != cnt1) stats = 0;
        dsum += sum;
        dn += nv;
        if (i % size == rank) {
            int64_t nk = inf.nfg < 50 ? inf.nfg : 50;
            if (inf.nfg < 1) fg = 0;
            for (int64_t k = 0; k < nk; k++) {
                int64_t c3[3];
                if (ts_dataset_read_foreground(ds, i, k * inf.nfg / nk, c3) ||
                    !s.label[(c3[0] * s.shape[2] + c3[1]) * s.shape[3] + c3[2]])
                    fg = 0;
            }
        }
        free(img);
        free(lab);
        ts_sample_release(&s);
    }
    ts_ok(all_ok(same), "%s: every sample read whole equals the phantom", what);
    ts_ok(all_ok(stats), "%s: index statistics (mean, std, class voxels, names) match", what);
    ts_ok(all_ok(fg), "%s: stored foreground coordinates are foreground voxels", what);
    ts_ok(all_ok(fabs(ts_dataset_mean(ds)[0] - dsum / dn) < 1e-9), "%s: dataset mean %.6f", what,
          ts_dataset_mean(ds)[0]);

    /* random boxes, inside and across the border */
    ts_rng g;
    ts_rng_init(&g, 7, (uint32_t)rank, 1);
    int boxes = 1;
    for (int t = 0; t < 40; t++) {
        int64_t i = (int64_t)ts_rng_below(&g, (uint64_t)count);
        ts_sample s;
        ts_synth_sample(so, i, &s);
        int64_t lo[3], sz[3];
        for (int k = 0; k < 3; k++) {
            sz[k] = 1 + (int64_t)ts_rng_below(&g, (uint64_t)s.shape[k + 1] + 8);
            lo[k] = (int64_t)ts_rng_below(&g, (uint64_t)(s.shape[k + 1] + 10)) - 6;
        }
        if (t < 5) /* some boxes strictly inside */
            for (int k = 0; k < 3; k++) {
                sz[k] = 1 + (int64_t)ts_rng_below(&g, (uint64_t)s.shape[k + 1]);
                lo[k] = (int64_t)ts_rng_below(&g, (uint64_t)(s.shape[k + 1] - sz[k] + 1));
            }
        int64_t nv = sz[0] * sz[1] * sz[2], C = s.shape[0];
        float *img = malloc((size_t)(C * nv) * sizeof(float)), *rimg = malloc((size_t)(C * nv) * sizeof(float));
        uint8_t *lab = malloc((size_t)nv), *rlab = malloc((size_t)nv);
        ref_box(&s, lo, sz, -3.5f, rimg, rlab);
        if (ts_dataset_read_box(ds, i, lo, sz, img, lab, -3.5f)) {
            ts_diag("box: %s", ts_err_message());
            boxes = 0;
        } else if (memcmp(img, rimg, (size_t)(C * nv) * sizeof(float)) || memcmp(lab, rlab, (size_t)nv)) {
            ts_diag("box of sample %lld at (%lld,%lld,%lld) size (%lld,%lld,%lld) differs", (long long)i,
                    (long long)lo[0], (long long)lo[1], (long long)lo[2], (long long)sz[0], (long long)sz[1],
                    (long long)sz[2]);
            boxes = 0;
        }
        free(img);
        free(rimg);
        free(lab);
        free(rlab);
        ts_sample_release(&s);
    }
    ts_ok(all_ok(boxes), "%s: 40 random boxes per rank (inside and across borders) match", what);

    /* collective slabs: rank r reads depth slab r of sample count-1, plus a margin outside */
    {
        ts_sample s;
        int64_t i = count - 1;
        ts_synth_sample(so, i, &s);
        int64_t D = s.shape[1], per = (D + size - 1) / size;
        int64_t lo[3] = {rank * per - 1, -2, 0}, sz[3] = {per + 2, s.shape[2] + 4, s.shape[3]};
        if (rank == size - 1 && size > 1) sz[0] = 0; /* a rank with an empty box */
        int64_t nv = sz[0] * sz[1] * sz[2], C = s.shape[0];
        float *img = malloc((size_t)(C * nv + 1) * sizeof(float)), *rimg = malloc((size_t)(C * nv + 1) * sizeof(float));
        uint8_t *lab = malloc((size_t)nv + 1), *rlab = malloc((size_t)nv + 1);
        ref_box(&s, lo, sz, 9.0f, rimg, rlab);
        int e = ts_dataset_read_box_all(ds, i, lo, sz, img, lab, 9.0f);
        int good = !e && !memcmp(img, rimg, (size_t)(C * nv) * sizeof(float)) && !memcmp(lab, rlab, (size_t)nv);
        if (e) ts_diag("read_box_all: %s", ts_err_message());
        ts_ok(all_ok(good), "%s: collective slab reads of one sample match", what);
        free(img);
        free(rimg);
        free(lab);
        free(rlab);
        ts_sample_release(&s);
    }
    ts_ok(all_ok(ts_dataset_bytes_read(ds) > 0), "%s: bytes read are counted", what);
    ts_dataset_close(&ds);
    ts_ok(ds == NULL, "%s: close", what);
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
    char p1[512], p2[512], p3[512];
    snprintf(p1, sizeof p1, "%s/one.h5", argv[1]);
    snprintf(p2, sizeof p2, "%s/sharded.h5", argv[1]);
    snprintf(p3, sizeof p3, "%s/wholechunk.h5", argv[1]);

    /* multi-chunk volumes with edge chunks: 21x18x27, chunk edge 8; two channels */
    ts_synth_opts so = {.size = {21, 18, 27}, .channels = 2, .classes = 4, .seed = 42};
    int err = ts_synth_write(MPI_COMM_WORLD, p1, &so, 7, 1, 8);
    ts_ok(all_ok(err == 0), "synth 7 samples into one file on %d rank(s) (%s)", size, err ? ts_err_message() : "ok");
    ts_ok(all_ok(access(p1, F_OK) == 0), "the file exists");
    char part[600];
    snprintf(part, sizeof part, "%s.partial", p1);
    ts_ok(all_ok(access(part, F_OK) != 0), "no temporary file is left");
    check_dataset(p1, &so, 7, "one file", 0);
    check_dataset(p1, &so, 7, "one file, chunk cache", 12);

    err = ts_synth_write(MPI_COMM_WORLD, p2, &so, 7, 3, 8);
    ts_ok(all_ok(err == 0), "synth 7 samples into 3 shards (%s)", err ? ts_err_message() : "ok");
    int shards_ok = 1;
    for (int k = 0; k < 3; k++) {
        char sn[600];
        ts_io_shard_name(p2, k, 3, sn, sizeof sn);
        shards_ok &= access(sn, F_OK) == 0;
    }
    ts_ok(all_ok(shards_ok), "the 3 shard files exist");
    check_dataset(p2, &so, 7, "3 shards", 0);

    /* one chunk per sample and channel (the bench layout) */
    ts_synth_opts so2 = {.size = {16, 16, 16}, .channels = 1, .classes = 3, .seed = 5};
    err = ts_synth_write(MPI_COMM_WORLD, p3, &so2, 5, 1, 64);
    ts_ok(all_ok(err == 0), "synth 5 samples of 16^3, one chunk each (%s)", err ? ts_err_message() : "ok");
    check_dataset(p3, &so2, 5, "whole-sample chunks", 0);

    MPI_Barrier(MPI_COMM_WORLD);
    int rc = ts_done();
    MPI_Finalize();
    return rc;
}
