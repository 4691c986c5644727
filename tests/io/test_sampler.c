/* The distributed sampler over a real dataset on P ranks: training steps
 * (each followed by an allreduce, as gradient synchronisation would be: a
 * rank taking fewer steps hangs the job, and the wrapper's timeout fails the
 * test) cover E epochs of the global stream; every epoch is a permutation of
 * the samples; the global order is written to ORDER_FILE for comparison
 * across rank counts. Evaluation reads every sample exactly once, whole, and
 * checks its contents against the index statistics. A saved position
 * resumes the same stream. The loader on P ranks yields, slot for slot, the
 * augmented patches a one-rank loader yields at the same stream positions.
 * usage: test_sampler DATA.h5 ORDER_FILE [BATCH [EPOCHS]] */
#include "tsbuild.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "io/sampler.h"
#include "src/core/error.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int all_ok(int ok)
{
    int r = 0;
    MPI_Allreduce(&ok, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

int main(int argc, char **argv)
{
    int prov, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ts_err_set_rank(rank);
    ts_tap_quiet = rank != 0;
    if (argc < 3) {
        fprintf(stderr, "usage: %s DATA.h5 ORDER_FILE [BATCH [EPOCHS]]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    const int B = argc > 3 ? atoi(argv[3]) : 2, E = argc > 4 ? atoi(argv[4]) : 3;
    const uint64_t seed = 1234;
    ts_dataset *ds = NULL;
    int err = ts_dataset_open(MPI_COMM_WORLD, argv[1], NULL, &ds);
    if (!ts_ok(all_ok(!err), "open %s on %d rank(s) (%s)", argv[1], size, err ? ts_err_message() : "ok")) {
        MPI_Finalize();
        return ts_done();
    }
    const int64_t N = ts_dataset_count(ds), PB = (int64_t)size * B;

    /* ---- training: E epochs of the global stream ---- */
    ts_sampler *s = NULL;
    ts_sampler_create(N, NULL, rank, size, B, seed, TS_SAMPLER_TRAIN, &s);
    const int64_t steps = (E * N + PB - 1) / PB, L = steps * PB;
    int64_t *stream = calloc((size_t)L, sizeof(int64_t)), *mine = calloc((size_t)(2 * B), sizeof(int64_t)),
            *allv = calloc((size_t)(2 * PB), sizeof(int64_t));
    int64_t idx[64], pos[64];
    int ok_read = 1, ok_pos = 1;
    for (int64_t st = 0; st < steps; st++) {
        ts_sampler_next(s, idx, pos);
        for (int b = 0; b < B; b++) {
            /* read a small box of each sample drawn, as a loader would */
            float img[8 * 8 * 8 * TS_IO_MAX_CHANNELS];
            uint8_t lab[8 * 8 * 8];
            int64_t lo[3] = {0, 0, 0}, sz[3] = {8, 8, 8};
            if (ts_dataset_read_box(ds, idx[b], lo, sz, img, lab, 0.0f)) ok_read = 0;
            mine[2 * b] = pos[b];
            mine[2 * b + 1] = idx[b];
        }
        MPI_Allgather(mine, 2 * B, MPI_INT64_T, allv, 2 * B, MPI_INT64_T, MPI_COMM_WORLD);
        for (int64_t t = 0; t < PB; t++) {
            int64_t p = allv[2 * t], i = allv[2 * t + 1];
            if (p < st * PB || p >= (st + 1) * PB) ok_pos = 0;
            else stream[p] = i;
        }
        double g = 1, gs = 0; /* the gradient allreduce of a training step */
        MPI_Allreduce(&g, &gs, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (gs != size) ok_pos = 0;
    }
    ts_ok(all_ok(ok_read), "train: %lld steps of batch %d per rank, every drawn sample read", (long long)steps, B);
    ts_ok(all_ok(ok_pos), "train: rank r slot b of step s takes stream position s*P*B + b*P + r");
    int perm_ok = 1;
    for (int e = 0; e < E; e++) {
        char *seen = calloc((size_t)N, 1);
        for (int64_t p = e * N; p < (e + 1) * N; p++) {
            if (stream[p] < 0 || stream[p] >= N || seen[stream[p]]) perm_ok = 0;
            else seen[stream[p]] = 1;
        }
        free(seen);
    }
    ts_ok(all_ok(perm_ok), "train: each of %d epochs visits all %lld samples exactly once", E, (long long)N);
    if (rank == 0) {
        FILE *f = fopen(argv[2], "w");
        for (int64_t p = 0; p < E * N && f; p++) fprintf(f, "%lld\n", (long long)stream[p]);
        if (f) fclose(f);
    }
    /* different epochs are shuffled differently (N >= 4) */
    if (N >= 4) {
        int differ = 0;
        for (int64_t p = 0; p < N; p++) differ |= stream[p] != stream[N + p];
        ts_ok(all_ok(differ), "train: epochs 0 and 1 have different orders");
    }

    /* ---- resume: position saved after 3 steps ---- */
    {
        ts_sampler *a = NULL, *b = NULL;
        ts_sampler_create(N, NULL, rank, size, B, seed, TS_SAMPLER_TRAIN, &a);
        for (int k = 0; k < 3; k++) ts_sampler_next(a, idx, pos);
        int64_t saved = ts_sampler_position(a);
        ts_sampler_create(N, NULL, rank, size, B, seed, TS_SAMPLER_TRAIN, &b);
        ts_sampler_seek(b, saved);
        int same = saved == 3 * PB;
        for (int k = 0; k < 5; k++) {
            int64_t i1[64], i2[64];
            ts_sampler_next(a, i1, NULL);
            ts_sampler_next(b, i2, NULL);
            same &= !memcmp(i1, i2, (size_t)B * sizeof(int64_t));
        }
        ts_ok(all_ok(same), "train: a sampler restored at position %lld continues identically", (long long)saved);
        ts_sampler_destroy(&a);
        ts_sampler_destroy(&b);
    }

    /* ---- evaluation: every sample exactly once, read whole and checked ---- */
    {
        ts_sampler *v = NULL;
        ts_sampler_create(N, NULL, rank, size, B, seed, TS_SAMPLER_EVAL, &v);
        int64_t *count = calloc((size_t)N, sizeof(int64_t)), nsteps = 0, empty = 0;
        int content = 1;
        while (ts_sampler_next(v, idx, NULL) == 0) {
            nsteps++;
            for (int b = 0; b < B; b++) {
                if (idx[b] < 0) {
                    empty++;
                    continue;
                }
                count[idx[b]]++;
                ts_sample_info in;
                ts_dataset_info(ds, idx[b], &in);
                int64_t nv = in.shape[1] * in.shape[2] * in.shape[3];
                float *img = malloc((size_t)(in.shape[0] * nv) * sizeof(float));
                uint8_t *lab = malloc((size_t)nv);
                if (ts_dataset_read_sample(ds, idx[b], img, lab)) {
                    content = 0;
                } else {
                    for (int64_t c = 0; c < in.shape[0]; c++) {
                        double sum = 0;
                        for (int64_t t = 0; t < nv; t++) sum += img[c * nv + t];
                        if (fabs(sum / nv - in.mean[c]) > 1e-6 * (1 + fabs(in.mean[c]))) content = 0;
                    }
                    int64_t k1 = 0;
                    for (int64_t t = 0; t < nv; t++) k1 += lab[t] == 1;
                    if (k1 != in.class_voxels[1]) content = 0;
                }
                free(img);
                free(lab);
            }
            double g = 1, gs = 0;
            MPI_Allreduce(&g, &gs, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        }
        int64_t *tot = calloc((size_t)N, sizeof(int64_t)), te = 0;
        MPI_Allreduce(count, tot, (int)N, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(&empty, &te, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        int once = 1;
        for (int64_t i = 0; i < N; i++) once &= tot[i] == 1;
        int64_t mx = 0, mn = 0;
        MPI_Allreduce(&nsteps, &mx, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&nsteps, &mn, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
        ts_ok(all_ok(once), "eval: every sample exactly once over %d rank(s)", size);
        ts_ok(mx == mn && mx == (N + PB - 1) / PB, "eval: every rank takes %lld steps", (long long)mx);
        ts_ok(te == mx * PB - N, "eval: %lld empty slots, no sample repeated", (long long)te);
        ts_ok(all_ok(content), "eval: every sample's image means and class counts match the index");
        free(count);
        free(tot);
        ts_sampler_destroy(&v);
    }
    /* ---- the loader on P ranks: slot b of step s on rank r is the batch a
     * one-rank, batch-1 loader yields at stream position s*P*B + b*P + r ---- */
    {
        ts_loader_opts lo;
        memset(&lo, 0, sizeof lo);
        lo.patch.patch[0] = lo.patch.patch[1] = lo.patch.patch[2] = 12;
        lo.patch.augment = lo.patch.flip = lo.patch.rot90 = 1;
        lo.patch.scale = lo.patch.shift = 0.1;
        lo.patch.gamma = 0.3;
        lo.patch.fg_fraction = 0.5;
        lo.patch.norm = TS_NORM_IMAGE;
        lo.patch.clip_lo = lo.patch.clip_hi = -1;
        lo.prefetch = 0; /* both loaders share ds: keep them in this thread */
        lo.seed = 77;
        lo.mode = TS_SAMPLER_TRAIN;
        ts_loader_opts one = lo;
        lo.batch = B;
        one.batch = 1;
        ts_loader *l = NULL, *ref = NULL;
        int e = ts_loader_create(ds, rank, size, &lo, &l);
        if (!e) e = ts_loader_create(ds, 0, 1, &one, &ref);
        int same = !e;
        const int64_t C = ts_dataset_channels(ds), nv = 12 * 12 * 12;
        for (int st = 0; st < 4 && same; st++) {
            const ts_batch *b = NULL, *r = NULL;
            if (ts_loader_next(l, &b)) {
                same = 0;
                break;
            }
            for (int q = 0; q < B && same; q++) {
                int64_t p = (int64_t)st * PB + (int64_t)q * size + rank;
                if (ts_loader_seek(ref, p) || ts_loader_next(ref, &r)) {
                    same = 0;
                    break;
                }
                same &= r->sample[0] == b->sample[q] &&
                        !memcmp((const float *)b->image.data + q * C * nv, r->image.data, (size_t)(C * nv) * 4) &&
                        !memcmp((const uint8_t *)b->label.data + q * nv, r->label.data, (size_t)nv);
            }
        }
        if (e) ts_diag("loader: %s", ts_err_message());
        ts_ok(all_ok(same), "loader on %d rank(s): each augmented patch equals the one-rank loader's at its stream "
                            "position", size);
        ts_loader_destroy(&l);
        ts_loader_destroy(&ref);
    }
    ts_sampler_destroy(&s);
    free(stream);
    free(mine);
    free(allv);
    ts_dataset_close(&ds);
    int rc = ts_done();
    MPI_Finalize();
    return rc;
}
