/* The sampler's arithmetic on simulated rank counts (one process plays all
 * ranks): the global stream does not depend on ranks or batch; epochs are
 * permutations; every rank takes the same steps; evaluation covers each
 * sample once with empty slots only at the end; positions resume across
 * rank counts; subsets and splits. */
#include "tsbuild.h"
#include "io/sampler.h"
#include "src/core/error.h"
#include "tests/tap.h"

#include <stdlib.h>
#include <string.h>

/* Cross-validation by subject: every sample is held out exactly once over
 * the folds, a subject's scans stay together, folds are balanced by
 * subjects, and the assignment ignores the sample order. */
static void folds(void)
{
    const char *names[] = {"s07-a", "s01-a", "s02-a", "s01-b", "s03-a", "s04-a", "s05-a", "s02-b", "s06-a", "s07-b"};
    const char *rev[10];
    int64_t n = 10, tr[10], va[10], nt, nv, held[10] = {0};
    int per_fold_subjects[3] = {0};
    int ok = 1, together = 1;
    for (int f = 0; f < 3; f++) {
        ok &= ts_sampler_folds(names, n, 3, f, 42, "-", tr, &nt, va, &nv) == 0 && nt + nv == n && nv > 0;
        for (int64_t j = 0; j < nv; j++) held[va[j]]++;
        /* the subject of each held-out sample: its partner scan is held out too */
        for (int64_t j = 0; j < nv; j++)
            for (int64_t i = 0; i < n; i++)
                if (i != va[j] && !strncmp(names[i], names[va[j]], 3)) {
                    int in = 0;
                    for (int64_t k = 0; k < nv; k++) in |= va[k] == i;
                    together &= in;
                }
        char seen[10][4];
        int ns = 0;
        for (int64_t j = 0; j < nv; j++) {
            int dup = 0;
            for (int k = 0; k < ns; k++) dup |= !strncmp(seen[k], names[va[j]], 3);
            if (!dup) memcpy(seen[ns++], names[va[j]], 3);
        }
        per_fold_subjects[f] = ns;
    }
    int once = 1;
    for (int i = 0; i < 10; i++) once &= held[i] == 1;
    ts_ok(ok && once && together, "3 folds by subject: every sample held out once, a subject's scans together");
    ts_ok(per_fold_subjects[0] + per_fold_subjects[1] + per_fold_subjects[2] == 7 && per_fold_subjects[0] >= 2 &&
              per_fold_subjects[1] >= 2 && per_fold_subjects[2] >= 2,
          "7 subjects over 3 folds: %d, %d, %d", per_fold_subjects[0], per_fold_subjects[1], per_fold_subjects[2]);
    /* the same folds for the samples in reverse order */
    int64_t tr2[10], va2[10], nt2, nv2;
    for (int i = 0; i < 10; i++) rev[i] = names[9 - i];
    ts_sampler_folds(names, n, 3, 1, 42, "-", tr, &nt, va, &nv);
    ts_sampler_folds(rev, n, 3, 1, 42, "-", tr2, &nt2, va2, &nv2);
    int same = nv == nv2;
    for (int64_t j = 0; j < nv && same; j++) {
        int found = 0;
        for (int64_t k = 0; k < nv2; k++) found |= !strcmp(names[va[j]], rev[va2[k]]);
        same &= found;
    }
    ts_ok(same, "fold 1 holds the same subjects whatever the sample order");
    ts_ok(ts_sampler_folds(names, n, 8, 0, 42, "-", tr, &nt, va, &nv) == TS_ERR_CONFIG,
          "8 folds of 7 subjects refused: %s", ts_err_message());
    ts_ok(ts_sampler_folds(names, n, 3, 3, 42, "-", tr, &nt, va, &nv) == TS_ERR_CONFIG, "fold 3 of 3 refused");
    ts_ok(ts_sampler_folds(names, n, 10, 0, 42, "", tr, &nt, va, &nv) == 0 && nv == 1,
          "without a delimiter each sample is its own subject");
}

int main(void)
{
    const int64_t Ns[] = {1, 2, 5, 7, 64};
    const int Ps[] = {1, 2, 3, 4, 8}, Bs[] = {1, 2, 3};
    int order = 1, perms = 1, eval_once = 1, eval_steps = 1, eval_tail = 1;
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++) {
        const int64_t N = Ns[a], E = 3;
        /* reference stream: one rank, batch 1 */
        int64_t *ref = calloc((size_t)(E * N + 64), sizeof(int64_t));
        ts_sampler *r = NULL;
        ts_sampler_create(N, NULL, 0, 1, 1, 99, TS_SAMPLER_TRAIN, &r);
        for (int64_t p = 0; p < E * N + 64; p++) ts_sampler_next(r, &ref[p], NULL);
        ts_sampler_destroy(&r);
        for (int e = 0; e < E; e++) {
            char *seen = calloc((size_t)N, 1);
            for (int64_t p = e * N; p < (e + 1) * N; p++) {
                if (ref[p] < 0 || ref[p] >= N || seen[ref[p]]) perms = 0;
                else seen[ref[p]] = 1;
            }
            free(seen);
        }
        for (size_t b = 0; b < sizeof Ps / sizeof Ps[0]; b++)
            for (size_t c = 0; c < sizeof Bs / sizeof Bs[0]; c++) {
                const int P = Ps[b], B = Bs[c];
                ts_sampler *s[8];
                for (int k = 0; k < P; k++) ts_sampler_create(N, NULL, k, P, B, 99, TS_SAMPLER_TRAIN, &s[k]);
                int64_t steps = (E * N) / (P * B) + 1;
                for (int64_t st = 0; st < steps; st++)
                    for (int k = 0; k < P; k++) {
                        int64_t idx[3], pos[3];
                        ts_sampler_next(s[k], idx, pos);
                        for (int q = 0; q < B; q++) {
                            int64_t p = st * P * B + q * P + k;
                            if (pos[q] != p || (p < E * N + 64 && idx[q] != ref[p])) order = 0;
                        }
                    }
                for (int k = 0; k < P; k++) ts_sampler_destroy(&s[k]);
                /* evaluation */
                int64_t *cnt = calloc((size_t)N, sizeof(int64_t)), empty = 0;
                int64_t want_steps = (N + P * B - 1) / (P * B);
                for (int k = 0; k < P; k++) {
                    ts_sampler *v = NULL;
                    ts_sampler_create(N, NULL, k, P, B, 99, TS_SAMPLER_EVAL, &v);
                    int64_t n = 0, idx[3], last_real = -1, first_empty = -1;
                    while (ts_sampler_next(v, idx, NULL) == 0) {
                        for (int q = 0; q < B; q++) {
                            if (idx[q] >= 0) {
                                cnt[idx[q]]++;
                                last_real = n * B + q;
                            } else {
                                empty++;
                                if (first_empty < 0) first_empty = n * B + q;
                            }
                        }
                        n++;
                    }
                    if (n != want_steps || ts_sampler_steps_per_epoch(v) != want_steps) eval_steps = 0;
                    if (first_empty >= 0 && last_real > first_empty) eval_tail = 0;
                    ts_sampler_destroy(&v);
                }
                for (int64_t i = 0; i < N; i++) eval_once &= cnt[i] == 1;
                eval_once &= empty == want_steps * P * B - N;
                free(cnt);
            }
        free(ref);
    }
    ts_ok(order, "train: rank r slot b of step s draws global position s*P*B + b*P + r, the same stream for "
                 "P in 1..8 and B in 1..3");
    ts_ok(perms, "train: every epoch of the stream is a permutation (N = 1, 2, 5, 7, 64)");
    ts_ok(eval_once, "eval: every sample exactly once over all ranks, empty slots fill the rest");
    ts_ok(eval_steps, "eval: every rank takes ceil(N / (P*B)) steps");
    ts_ok(eval_tail, "eval: on each rank, empty slots come only after the last real sample");

    /* resume across rank counts: 2 ranks for 4 steps, then 3 ranks from the saved position */
    {
        const int64_t N = 11;
        ts_sampler *a[2], *b[3], *ref = NULL;
        for (int k = 0; k < 2; k++) ts_sampler_create(N, NULL, k, 2, 2, 5, TS_SAMPLER_TRAIN, &a[k]);
        int64_t idx[2];
        for (int st = 0; st < 4; st++)
            for (int k = 0; k < 2; k++) ts_sampler_next(a[k], idx, NULL);
        int64_t saved = ts_sampler_position(a[0]);
        int ok = saved == ts_sampler_position(a[1]) && saved == 16;
        ts_sampler_create(N, NULL, 0, 1, 1, 5, TS_SAMPLER_TRAIN, &ref);
        ts_sampler_seek(ref, saved);
        for (int k = 0; k < 3; k++) {
            ts_sampler_create(N, NULL, k, 3, 2, 5, TS_SAMPLER_TRAIN, &b[k]);
            ts_sampler_seek(b[k], saved);
        }
        for (int st = 0; st < 5; st++) {
            int64_t got[6];
            for (int k = 0; k < 3; k++) {
                int64_t t[2];
                ts_sampler_next(b[k], t, NULL);
                got[0 * 3 + k] = t[0];
                got[1 * 3 + k] = t[1];
            }
            for (int q = 0; q < 6; q++) {
                int64_t w;
                ts_sampler_next(ref, &w, NULL);
                ok &= got[q] == w;
            }
        }
        ts_ok(ok, "resume: position %lld saved on 2 ranks continues the same stream on 3 ranks", (long long)saved);
        ts_ok(ts_sampler_epoch(b[0]) == (16 + 30) / 11, "epoch follows the position");
        for (int k = 0; k < 2; k++) ts_sampler_destroy(&a[k]);
        for (int k = 0; k < 3; k++) ts_sampler_destroy(&b[k]);
        ts_sampler_destroy(&ref);
    }

    /* seeds change the order; a subset maps positions to dataset indices */
    {
        ts_sampler *x = NULL, *y = NULL, *z = NULL;
        ts_sampler_create(20, NULL, 0, 1, 20, 1, TS_SAMPLER_TRAIN, &x);
        ts_sampler_create(20, NULL, 0, 1, 20, 2, TS_SAMPLER_TRAIN, &y);
        int64_t i1[20], i2[20];
        ts_sampler_next(x, i1, NULL);
        ts_sampler_next(y, i2, NULL);
        ts_ok(memcmp(i1, i2, sizeof i1) != 0, "different seeds give different orders");
        const int64_t sub[5] = {3, 8, 13, 21, 34};
        ts_sampler_create(5, sub, 0, 1, 5, 1, TS_SAMPLER_TRAIN, &z);
        int64_t i3[5];
        ts_sampler_next(z, i3, NULL);
        int in = 1, seen = 0;
        for (int q = 0; q < 5; q++) {
            int hit = 0;
            for (int t = 0; t < 5; t++)
                if (i3[q] == sub[t]) hit = 1, seen |= 1 << t;
            in &= hit;
        }
        ts_ok(in && seen == 31, "a subset: one epoch draws each subset index once");
        ts_sampler_destroy(&x);
        ts_sampler_destroy(&y);
        ts_sampler_destroy(&z);
    }
    /* split */
    {
        int64_t tr[97], va[20], tr2[97], va2[20];
        ts_sampler_split(117, 20, 7, tr, va);
        ts_sampler_split(117, 20, 7, tr2, va2);
        char mark[117] = {0};
        int ok = 1;
        for (int i = 0; i < 97; i++) ok &= !mark[tr[i]]++ && (i == 0 || tr[i] > tr[i - 1]);
        for (int i = 0; i < 20; i++) ok &= !mark[va[i]]++ && (i == 0 || va[i] > va[i - 1]);
        for (int i = 0; i < 117; i++) ok &= mark[i] == 1;
        ts_ok(ok, "split: 97 train + 20 validation, disjoint, ascending, covering all");
        ts_ok(!memcmp(tr, tr2, sizeof tr) && !memcmp(va, va2, sizeof va), "split: deterministic for a seed");
    }
    /* bad arguments */
    {
        ts_sampler *s = NULL;
        ts_ok(ts_sampler_create(0, NULL, 0, 1, 1, 0, TS_SAMPLER_TRAIN, &s) == TS_ERR_ARG && !s, "no samples: error");
        ts_ok(ts_sampler_create(4, NULL, 2, 2, 1, 0, TS_SAMPLER_TRAIN, &s) == TS_ERR_ARG, "rank out of range: error");
    }
    folds();
    return ts_done();
}
