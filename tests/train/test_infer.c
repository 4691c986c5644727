/* The pieces of tessera infer without a model (src/infer/mirror.c,
 * infer_metrics.c): flips against index arithmetic, keep_largest= parsing,
 * per-scan metrics with the largest-component Dice, the mean and sample
 * std over scans (non-finite values left out), nnU-Net's decision rule
 * (ties and absent classes not applied), and the decision file read back. */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/infer/evaluate.h"
#include "src/infer/infer_impl.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_flip(void)
{
    const int64_t n[3] = {3, 4, 5}, nv = 60;
    float in[120], out[120], back[120];
    for (int i = 0; i < 120; i++) in[i] = (float)i;
    int bad = 0, moved = 1;
    for (int f = 0; f < 8; f++) {
        ts_eval_flip(in, out, 2, n, f);
        for (int c = 0; c < 2; c++)
            for (int z = 0; z < 3; z++)
                for (int y = 0; y < 4; y++)
                    for (int x = 0; x < 5; x++) {
                        int zs = f & TS_EVAL_FLIP_D ? 2 - z : z, ys = f & TS_EVAL_FLIP_H ? 3 - y : y,
                            xs = f & TS_EVAL_FLIP_W ? 4 - x : x;
                        bad += out[c * nv + (z * 4 + y) * 5 + x] != in[c * nv + (zs * 4 + ys) * 5 + xs];
                    }
        ts_eval_flip(out, back, 2, n, f);
        bad += memcmp(back, in, sizeof in) != 0;
        if (f) moved &= memcmp(out, in, sizeof in) != 0;
    }
    ts_ok(!bad && moved, "ts_eval_flip: the 8 flips of a 2x3x4x5 volume by index, each its own inverse");
}

static void test_keep_parse(void)
{
    int keep[4];
    ts_ok(ts_infer_parse_keep("all", 4, keep) == 0 && !keep[0] && keep[1] && keep[2] && keep[3],
          "keep_largest=all: classes 1..K-1");
    ts_ok(ts_infer_parse_keep("3,1", 4, keep) == 0 && !keep[0] && keep[1] && !keep[2] && keep[3],
          "keep_largest=3,1");
    ts_ok(ts_infer_parse_keep("0", 4, keep) == TS_ERR_ARG && strstr(ts_err_message(), "background"),
          "keep_largest=0 refused: %s", ts_err_message());
    ts_ok(ts_infer_parse_keep("4", 4, keep) == TS_ERR_ARG && strstr(ts_err_message(), "not a class"),
          "keep_largest=4 with 4 classes refused");
    ts_ok(ts_infer_parse_keep("1;2", 4, keep) == TS_ERR_ARG, "keep_largest=1;2 refused");
    ts_ok(ts_infer_parse_keep("foreground,2", 4, keep) == 0 && keep[0] && !keep[1] && keep[2] && !keep[3],
          "keep_largest=foreground,2: the whole foreground's, then class 2's");
    ts_ok(ts_infer_parse_keep("foregroundx", 4, keep) == TS_ERR_ARG, "keep_largest=foregroundx refused");
}

/* a 1x6x6 slab: class 1 in two components (4 + 1 voxels), class 2 only in the reference */
static void test_scan_metrics(void)
{
    const int64_t n[3] = {1, 6, 6};
    uint8_t pred[36] = {0}, ref[36] = {0};
    const double sp[3] = {2, 1, 1};
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < 2; x++) pred[y * 6 + x] = ref[y * 6 + x] = 1;
    pred[5 * 6 + 5] = 1; /* a stray voxel */
    ref[3 * 6 + 3] = 2;
    ts_infer_scan s;
    memset(&s, 0, sizeof s);
    int e = ts_infer_scan_metrics(pred, ref, n, sp, 3, 1.0, 1, &s);
    ts_ok(!e && fabs(s.dice[1] - 8.0 / 9) < 1e-12 && fabs(s.dice_pp[1] - 1) < 1e-12,
          "class 1: Dice 8/9 (%.6f), 1 with its largest component (%.6f)", s.dice[1], s.dice_pp[1]);
    ts_ok(s.dice[2] == 0 && isinf(s.hd95[2]) && s.nsd[2] == 0 && s.dice_pp[2] == 0,
          "class 2 only in the reference: Dice 0, HD95 inf, NSD 0");
    ts_ok(fabs(s.fg_dice - 4.0 / 9) < 1e-12, "foreground mean Dice (8/9 + 0) / 2 = %.6f", s.fg_dice);
    /* the stray voxel is sqrt(4^2 + 4^2) mm from the nearest reference voxel (1, 1) */
    ts_ok(s.hd95[1] > 0 && s.nsd[1] > 0.5 && s.nsd[1] < 1, "class 1: HD95 %.4f mm, NSD %.4f", s.hd95[1], s.nsd[1]);
}

static void test_summary_decide(void)
{
    ts_infer_scan s[3];
    memset(s, 0, sizeof s);
    const double d1[3] = {0.5, 0.7, 0.9}, p1[3] = {0.6, 0.7, 0.9}; /* class 1: raises the mean */
    const double d2[3] = {0.8, 0.6, 0.4}, p2[3] = {0.9, 0.5, 0.4}; /* class 2: a tie of the means */
    const double h1[3] = {2, INFINITY, 4};
    for (int i = 0; i < 3; i++) {
        s[i].dice[0] = s[i].dice_pp[0] = 0.99;
        s[i].dice[1] = d1[i], s[i].dice_pp[1] = p1[i];
        s[i].dice[2] = d2[i], s[i].dice_pp[2] = p2[i];
        s[i].dice[3] = s[i].dice_pp[3] = NAN; /* class 3 in no scan */
        for (int k = 0; k < 4; k++) s[i].dice_fg[k] = s[i].dice[k], s[i].dice_fg_pp[k] = s[i].dice_pp[k];
        s[i].hd95[1] = h1[i];
        s[i].nsd[1] = 0.5;
    }
    ts_infer_result r;
    memset(&r, 0, sizeof r);
    ts_infer_summarise(s, 3, 4, &r);
    ts_ok(fabs(r.mean_dice[1].mean - 0.7) < 1e-12 && fabs(r.mean_dice[1].std - 0.2) < 1e-12 && r.mean_dice[1].n == 3,
          "Dice of class 1: mean 0.7, sample std 0.2 over 3");
    ts_ok(fabs(r.mean_hd95[1].mean - 3) < 1e-12 && r.mean_hd95[1].n == 2 && fabs(r.mean_hd95[1].std - sqrt(2)) < 1e-12,
          "HD95 of class 1: the infinite scan left out (mean 3 over 2)");
    ts_ok(r.mean_dice[3].n == 0 && isnan(r.mean_dice[3].mean), "class 3 in no scan: n 0, mean NaN");
    ts_ok(fabs(r.fg_dice.mean - 0.65) < 1e-12 && r.fg_dice.n == 3, "foreground mean Dice over scans %.4f",
          r.fg_dice.mean);
    double wo[4], wi[4], fg[2];
    int dec[4];
    ts_infer_decide(s, 3, 4, dec, wo, wi, fg);
    ts_ok(!dec[0] && dec[1] && !dec[2] && !dec[3] && fabs(wi[1] - 0.7333333333333) < 1e-9 && isnan(fg[0]),
          "decision: no whole-foreground step (class 3 in no scan), class 1 kept (mean 0.7 -> %.4f), "
          "class 2 not (a tie), absent class 3 not",
          wi[1]);
    /* the whole-foreground step raising the mean over the classes (class 2 gains more than class 1 loses);
     * the classes then decided on what it left. With class 3 in no scan nnU-Net's mean over the classes is
     * NaN and the step is never taken; class 3 present (Dice 0.5 either way) lets it be. */
    ts_infer_scan t[3];
    memcpy(t, s, sizeof t);
    for (int i = 0; i < 3; i++) {
        t[i].dice_fg[1] = d1[i] - 0.05, t[i].dice_fg_pp[1] = d1[i] - 0.05; /* class 1: nothing more to gain */
        t[i].dice_fg[2] = d2[i] + 0.1, t[i].dice_fg_pp[2] = d2[i] + 0.15;  /* class 2: its own step helps */
    }
    int dt[4];
    double to[4], ti[4], tf[2];
    ts_infer_decide(t, 3, 4, dt, to, ti, tf);
    ts_ok(!dt[0] && isnan(tf[0]) && isnan(tf[1]), "decision: a class in no scan makes the mean over the classes NaN "
          "(nnU-Net's np.mean): no whole-foreground step");
    for (int i = 0; i < 3; i++) t[i].dice[3] = t[i].dice_pp[3] = t[i].dice_fg[3] = t[i].dice_fg_pp[3] = 0.5;
    ts_infer_decide(t, 3, 4, dt, to, ti, tf);
    ts_ok(dt[0] && !dt[1] && dt[2] && !dt[3] && fabs(tf[0] - 0.6) < 1e-9 && fabs(tf[1] - 0.6166666666667) < 1e-9 &&
              fabs(to[2] - 0.7) < 1e-9 && fabs(ti[2] - 0.75) < 1e-9,
          "decision: the whole foreground kept (mean over classes 0.60 -> %.4f), then class 2 on it (0.70 -> 0.75), "
          "class 1 not (no gain after the step, though it gained from raw)",
          tf[1]);
    /* written and read back */
    char path[] = "/tmp/tessera-test-infer-XXXXXX";
    int fd = mkstemp(path);
    memcpy(r.decision, dec, sizeof dec);
    r.classes = 4;
    int keep[4] = {1, 1, 1, 1};
    int e = fd < 0 ? -1 : ts_infer_write_decision(path, &r, 3, wo, wi, fg);
    if (!e) e = ts_infer_read_decision(path, 4, keep);
    ts_ok(!e && !keep[0] && keep[1] && !keep[2] && !keep[3], "the decision file read back: keep class 1 only");
    memcpy(r.decision, dt, sizeof dt);
    e = fd < 0 ? -1 : ts_infer_write_decision(path, &r, 3, to, ti, tf);
    if (!e) e = ts_infer_read_decision(path, 4, keep);
    ts_ok(!e && keep[0] && !keep[1] && keep[2] && !keep[3],
          "the second decision read back: the whole foreground, then class 2");
    ts_ok(ts_infer_read_decision(path, 3, keep) == TS_ERR_FORMAT && strstr(ts_err_message(), "the model has 3"),
          "a decision for 4 classes refused for a 3-class model: %s", ts_err_message());
    FILE *f = fopen(path, "w");
    if (f) fputs("{\"format\": \"other\"}", f), fclose(f);
    ts_ok(ts_infer_read_decision(path, 4, keep) == TS_ERR_FORMAT, "another JSON file refused");
    if (fd >= 0) close(fd), unlink(path);
}

int main(void)
{
    test_flip();
    test_keep_parse();
    test_scan_metrics();
    test_summary_decide();
    return ts_done();
}
