/* Metrics and post-processing of `tessera infer` (infer_impl.h): per-scan
 * Dice, HD95 and NSD (src/infer/surface.c), the mean and spread over the
 * scans, the classes whose largest component is kept, nnU-Net's decision
 * rule on validation scans, and the JSON metrics and decision files. Owns
 * the figures and files; the distances themselves are surface.c's. */
#include "tsbuild.h"
#include "src/infer/infer_impl.h"
#include "src/core/error.h"
#include "src/infer/evaluate.h"
#include "src/infer/surface.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ts_infer_parse_keep(const char *spec, int K, int *keep)
{
    for (int k = 0; k < K; k++) keep[k] = 0;
    if (!strcmp(spec, "all")) {
        for (int k = 1; k < K; k++) keep[k] = 1;
        return 0;
    }
    for (const char *p = spec; *p;) {
        char *end;
        if (!strncmp(p, "foreground", 10) && (p[10] == ',' || !p[10])) { /* the whole foreground, first */
            keep[0] = 1;
            p += p[10] ? 11 : 10;
            continue;
        }
        long c = strtol(p, &end, 10);
        if (end == p || (*end && *end != ','))
            return TS_ERR(TS_ERR_ARG, "keep_largest=%s: not \"all\" or a comma list of classes and \"foreground\"",
                          spec);
        if (c < 1 || c >= K)
            return TS_ERR(TS_ERR_ARG, "keep_largest=%s: class %ld is %s", spec, c,
                          c == 0 ? "the background" : "not a class of the model");
        keep[c] = 1;
        p = *end ? end + 1 : end;
    }
    return 0;
}

int ts_infer_read_decision(const char *path, int K, int *keep)
{
    int err = 0;
    char *text = NULL;
    cJSON *j = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return TS_ERR(TS_ERR_IO, "postprocess=%s: %s", path, strerror(errno));
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n < 0 || n > (1 << 24) || fseek(f, 0, SEEK_SET) != 0) TS_FAIL(TS_ERR_IO, "postprocess=%s: cannot read", path);
    if (!(text = calloc((size_t)n + 1, 1))) TS_FAIL(TS_ERR_NOMEM, "postprocess=%s", path);
    if (fread(text, 1, (size_t)n, f) != (size_t)n) TS_FAIL(TS_ERR_IO, "postprocess=%s: cannot read", path);
    j = cJSON_Parse(text);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    const cJSON *nk = cJSON_GetObjectItemCaseSensitive(j, "classes");
    const cJSON *kl = cJSON_GetObjectItemCaseSensitive(j, "keep_largest");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "tessera-postprocess-1") || !cJSON_IsNumber(nk) ||
        !cJSON_IsArray(kl))
        TS_FAIL(TS_ERR_FORMAT, "postprocess=%s: not a decision file of tessera infer decide= (format, classes, "
                               "keep_largest)", path);
    if (nk->valueint != K)
        TS_FAIL(TS_ERR_FORMAT, "postprocess=%s: decided for %d classes, the model has %d", path, nk->valueint, K);
    for (int k = 0; k < K; k++) keep[k] = 0;
    const cJSON *fg = cJSON_GetObjectItemCaseSensitive(j, "keep_largest_foreground"); /* absent in older files */
    if (fg && !cJSON_IsBool(fg))
        TS_FAIL(TS_ERR_FORMAT, "postprocess=%s: keep_largest_foreground is not true or false", path);
    keep[0] = cJSON_IsTrue(fg);
    const cJSON *c;
    cJSON_ArrayForEach(c, kl)
    {
        if (!cJSON_IsNumber(c) || c->valueint < 1 || c->valueint >= K)
            TS_FAIL(TS_ERR_FORMAT, "postprocess=%s: keep_largest holds a value that is not a foreground class", path);
        keep[c->valueint] = 1;
    }
cleanup:
    cJSON_Delete(j);
    free(text);
    fclose(f);
    return err;
}

static double fg_mean(const ts_infer_scan *s, int K);

/* class k's Dice of pred against ref (K classes) */
static double class_dice(const uint8_t *pred, const uint8_t *ref, int64_t nv, int K, int k)
{
    int64_t tp[TS_IO_MAX_CLASSES] = {0}, fp[TS_IO_MAX_CLASSES] = {0}, fn[TS_IO_MAX_CLASSES] = {0};
    ts_eval_confusion(pred, ref, nv, K, tp, fp, fn);
    return ts_eval_dice(tp[k], fp[k], fn[k]);
}

int ts_infer_scan_metrics(const uint8_t *pred, const uint8_t *ref, const int64_t dhw[3], const double spacing[3],
                          int K, double tol, int pp, ts_infer_scan *s)
{
    int err = 0;
    const int64_t nv = dhw[0] * dhw[1] * dhw[2];
    int64_t tp[TS_IO_MAX_CLASSES] = {0}, fp[TS_IO_MAX_CLASSES] = {0}, fn[TS_IO_MAX_CLASSES] = {0};
    int64_t ftp[TS_IO_MAX_CLASSES] = {0}, ffp[TS_IO_MAX_CLASSES] = {0}, ffn[TS_IO_MAX_CLASSES] = {0};
    uint8_t *copy = NULL, *fg = NULL;
    ts_eval_confusion(pred, ref, nv, K, tp, fp, fn);
    for (int k = 0; k < K; k++) {
        ts_surface_metrics sm;
        s->dice[k] = ts_eval_dice(tp[k], fp[k], fn[k]);
        TS_CHECK(ts_surface_metrics_class(pred, ref, dhw, spacing, k, tol, &sm));
        s->hd95[k] = sm.hd95;
        s->nsd[k] = sm.nsd;
        s->dice_pp[k] = s->dice[k];
    }
    s->fg_dice = fg_mean(s, K);
    if (pp) {
        /* from the raw prediction (copy), and after the whole-foreground step (fg), each class's largest
         * component kept in turn (copy) */
        if (!(copy = TS_MALLOC((size_t)nv)) || !(fg = TS_MALLOC((size_t)nv)))
            TS_FAIL(TS_ERR_NOMEM, "post-processing a %lld-voxel mask", (long long)nv);
        memcpy(fg, pred, (size_t)nv);
        TS_CHECK(ts_keep_largest_component(fg, dhw, TS_FOREGROUND, NULL));
        ts_eval_confusion(fg, ref, nv, K, ftp, ffp, ffn);
        for (int k = 0; k < K; k++) s->dice_fg[k] = s->dice_fg_pp[k] = ts_eval_dice(ftp[k], ffp[k], ffn[k]);
        for (int k = 1; k < K; k++) {
            if (fp[k] || tp[k]) { /* predicted: something to remove */
                memcpy(copy, pred, (size_t)nv);
                TS_CHECK(ts_keep_largest_component(copy, dhw, k, NULL));
                s->dice_pp[k] = class_dice(copy, ref, nv, K, k);
            }
            if (ffp[k] || ftp[k]) {
                memcpy(copy, fg, (size_t)nv);
                TS_CHECK(ts_keep_largest_component(copy, dhw, k, NULL));
                s->dice_fg_pp[k] = class_dice(copy, ref, nv, K, k);
            }
        }
    }
cleanup:
    free(copy);
    free(fg);
    return err;
}

/* the foreground mean Dice of a scan: classes 1..K-1 present in either map */
static double fg_mean(const ts_infer_scan *s, int K)
{
    double m = 0;
    int n = 0;
    for (int k = 1; k < K; k++)
        if (s->dice[k] == s->dice[k]) m += s->dice[k], n++;
    return n ? m / n : NAN;
}

/* value `what` of scan s, class k: 0 Dice, 1 HD95, 2 NSD, 3 foreground mean Dice */
static double value(const ts_infer_scan *s, int what, int k, int K)
{
    return what == 0 ? s->dice[k] : what == 1 ? s->hd95[k] : what == 2 ? s->nsd[k] : fg_mean(s, K);
}

/* mean and sample std over the scans where the value is finite */
static ts_infer_stat stat_of(const ts_infer_scan *s, int n, int what, int k, int K)
{
    ts_infer_stat st = {NAN, NAN, 0};
    double sum = 0, sq = 0;
    for (int i = 0; i < n; i++) {
        double v = value(&s[i], what, k, K);
        if (isfinite(v)) sum += v, st.n++;
    }
    if (!st.n) return st;
    st.mean = sum / st.n;
    for (int i = 0; i < n; i++) {
        double v = value(&s[i], what, k, K);
        if (isfinite(v)) sq += (v - st.mean) * (v - st.mean);
    }
    st.std = st.n > 1 ? sqrt(sq / (st.n - 1)) : 0;
    return st;
}

void ts_infer_summarise(const ts_infer_scan *s, int n, int K, ts_infer_result *r)
{
    for (int k = 0; k < K; k++) {
        r->mean_dice[k] = stat_of(s, n, 0, k, K);
        r->mean_hd95[k] = stat_of(s, n, 1, k, K);
        r->mean_nsd[k] = stat_of(s, n, 2, k, K);
    }
    r->fg_dice = stat_of(s, n, 3, 0, K);
}

/* the mean over the n scans of a per-class value (member at byte offset off) where it is finite
 * (nnU-Net's nanmean: a class in neither map has no Dice) */
static double class_mean(const ts_infer_scan *s, int n, size_t off, int k)
{
    double a = 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        const double v = ((const double *)((const char *)&s[i] + off))[k];
        if (v == v) a += v, m++;
    }
    return m ? a / m : NAN;
}

/* the mean over the foreground classes of their means: NaN when one of them is (a class in no scan), as
 * nnU-Net's foreground_mean (np.mean over the classes' nanmeans), so that its step is then not taken */
static double over_classes(const double *v, int K)
{
    double a = 0;
    for (int k = 1; k < K; k++) a += v[k];
    return K > 1 ? a / (K - 1) : NAN;
}

void ts_infer_decide(const ts_infer_scan *s, int n, int K, int *decision, double *without, double *with,
                     double fg[2])
{
    double raw[TS_IO_MAX_CLASSES], fgs[TS_IO_MAX_CLASSES];
    for (int k = 0; k < K; k++) {
        raw[k] = class_mean(s, n, offsetof(ts_infer_scan, dice), k);
        fgs[k] = class_mean(s, n, offsetof(ts_infer_scan, dice_fg), k);
    }
    /* 1. the whole foreground as one region: kept when it raises the mean over the classes */
    fg[0] = over_classes(raw, K);
    fg[1] = over_classes(fgs, K);
    decision[0] = fg[0] == fg[0] && fg[1] == fg[1] && fg[1] > fg[0];
    /* 2. each class on what step 1 left: kept when it raises that class's mean */
    for (int k = 0; k < K; k++) {
        without[k] = decision[0] ? fgs[k] : raw[k];
        with[k] = class_mean(s, n, decision[0] ? offsetof(ts_infer_scan, dice_fg_pp) : offsetof(ts_infer_scan, dice_pp),
                             k);
        decision[k] = k == 0 ? decision[0] : without[k] == without[k] && with[k] == with[k] && with[k] > without[k];
    }
}

/* a number, or null where it is not finite (JSON has no NaN or infinity) */
static cJSON *num(double v)
{
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

static cJSON *num_array(const double *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, num(v[i]));
    return a;
}

static cJSON *stat_json(const ts_infer_stat *st, int K)
{
    cJSON *o = cJSON_CreateObject(), *m = cJSON_AddArrayToObject(o, "mean"), *s = cJSON_AddArrayToObject(o, "std"),
          *n = cJSON_AddArrayToObject(o, "n");
    for (int k = 0; k < K; k++) {
        cJSON_AddItemToArray(m, num(st[k].mean));
        cJSON_AddItemToArray(s, num(st[k].std));
        cJSON_AddItemToArray(n, cJSON_CreateNumber(st[k].n));
    }
    return o;
}

/* Writes j to path (rank 0's file) and frees it. */
static int write_json(const char *path, const char *what, cJSON *j)
{
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return TS_ERR(TS_ERR_NOMEM, "%s=%s", what, path);
    FILE *f = fopen(path, "w");
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    int e = errno;
    if (f && fclose(f) != 0) ok = 0, e = errno;
    free(text);
    return ok ? 0 : TS_ERR(TS_ERR_IO, "%s=%s: cannot write: %s", what, path, strerror(e));
}

/* one scan's object of the metrics file */
static cJSON *scan_json(const ts_infer_scan *s, const ts_infer_result *r, int K, int pp)
{
    cJSON *o = cJSON_CreateObject(), *a;
    double dim[3] = {(double)s->dim[0], (double)s->dim[1], (double)s->dim[2]}, rem[TS_IO_MAX_CLASSES];
    cJSON_AddStringToObject(o, "input", s->input);
    cJSON_AddStringToObject(o, "output", s->output);
    cJSON_AddStringToObject(o, "label", s->label ? s->label : "");
    cJSON_AddItemToObject(o, "dim", num_array(dim, 3));
    cJSON_AddItemToObject(o, "spacing_mm", num_array(s->spacing, 3));
    cJSON_AddItemToObject(o, "dice", num_array(s->dice, K));
    cJSON_AddItemToObject(o, "hd95_mm", num_array(s->hd95, K));
    cJSON_AddItemToObject(o, "nsd", num_array(s->nsd, K));
    cJSON_AddItemToObject(o, "foreground_mean_dice", num(s->fg_dice));
    if (pp) {
        for (int k = 0; k < K; k++) rem[k] = r->keep[k] ? (double)s->removed[k] : 0;
        cJSON_AddItemToObject(o, "removed_voxels", num_array(rem, K)); /* [0]: by the whole-foreground step */
    }
    if ((a = cJSON_CreateArray())) { /* in either map: where HD95 is null, was it absent from both? */
        for (int k = 0; k < K; k++) cJSON_AddItemToArray(a, cJSON_CreateBool(s->dice[k] == s->dice[k]));
        cJSON_AddItemToObject(o, "present", a);
    }
    return o;
}

int ts_infer_write_metrics(const char *path, const ts_infer_opts *o, const ts_infer_result *r,
                           const ts_infer_scan *s, int n)
{
    const int K = r->classes;
    int pp = 0;
    char mirror[4] = "";
    cJSON *j = cJSON_CreateObject(), *a;
    if (!j) return TS_ERR(TS_ERR_NOMEM, "metrics=%s", path);
    cJSON_AddStringToObject(j, "format", "tessera-metrics-1");
    cJSON_AddStringToObject(j, "checkpoint", r->checkpoint);
    cJSON_AddNumberToObject(j, "nsd_tolerance_mm", r->nsd_tol);
    snprintf(mirror, sizeof mirror, "%s%s%s", o->mirror & TS_INFER_MIRROR_X ? "x" : "",
             o->mirror & TS_INFER_MIRROR_Y ? "y" : "", o->mirror & TS_INFER_MIRROR_Z ? "z" : "");
    cJSON_AddStringToObject(j, "mirror", mirror);
    cJSON_AddBoolToObject(j, "keep_largest_foreground", r->keep[0]);
    pp = r->keep[0];
    a = cJSON_AddArrayToObject(j, "keep_largest");
    for (int k = 1; k < K; k++)
        if (r->keep[k]) cJSON_AddItemToArray(a, cJSON_CreateNumber(k)), pp = 1;
    a = cJSON_AddArrayToObject(j, "class_names");
    for (int k = 0; k < K; k++) cJSON_AddItemToArray(a, cJSON_CreateString(r->class_names[k]));
    a = cJSON_AddArrayToObject(j, "scans");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, scan_json(&s[i], r, K, pp));
    cJSON *sum = cJSON_AddObjectToObject(j, "summary");
    cJSON_AddNumberToObject(sum, "scans", n);
    cJSON_AddItemToObject(sum, "dice", stat_json(r->mean_dice, K));
    cJSON_AddItemToObject(sum, "hd95_mm", stat_json(r->mean_hd95, K));
    cJSON_AddItemToObject(sum, "nsd", stat_json(r->mean_nsd, K));
    cJSON *fg = cJSON_AddObjectToObject(sum, "foreground_mean_dice");
    cJSON_AddItemToObject(fg, "mean", num(r->fg_dice.mean));
    cJSON_AddItemToObject(fg, "std", num(r->fg_dice.std));
    cJSON_AddNumberToObject(fg, "n", r->fg_dice.n);
    return write_json(path, "metrics", j);
}

int ts_infer_write_decision(const char *path, const ts_infer_result *r, int n, const double *without,
                            const double *with, const double fg[2])
{
    const int K = r->classes;
    cJSON *j = cJSON_CreateObject(), *a;
    if (!j) return TS_ERR(TS_ERR_NOMEM, "decide=%s", path);
    cJSON_AddStringToObject(j, "format", "tessera-postprocess-1");
    cJSON_AddStringToObject(j, "rule", "first keep the largest 26-connected component of the whole foreground where "
                                       "that raises the mean over the classes of their mean Dice over the scans; then, "
                                       "on what that left, keep the largest component of a class where that raises the "
                                       "class's mean Dice");
    cJSON_AddStringToObject(j, "checkpoint", r->checkpoint);
    cJSON_AddNumberToObject(j, "classes", K);
    cJSON_AddNumberToObject(j, "scans", n);
    cJSON_AddBoolToObject(j, "keep_largest_foreground", r->decision[0]);
    cJSON_AddItemToObject(j, "foreground_mean_dice_without", num(fg[0]));
    cJSON_AddItemToObject(j, "foreground_mean_dice_with", num(fg[1]));
    a = cJSON_AddArrayToObject(j, "keep_largest");
    for (int k = 1; k < K; k++)
        if (r->decision[k]) cJSON_AddItemToArray(a, cJSON_CreateNumber(k));
    cJSON_AddItemToObject(j, "mean_dice_without", num_array(without, K));
    cJSON_AddItemToObject(j, "mean_dice_with", num_array(with, K));
    return write_json(path, "decide", j);
}
