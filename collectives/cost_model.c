/* The collectives' cost model (cost_model.h): each algorithm's α-β shape
 * L(p), B(p), following the cost comments of collectives/<op>_<algo>.c, the
 * fit of α and β to measured times, predictions from the fits, and the fits'
 * "models" array in the tuning table. Local arithmetic and file I/O only: no
 * MPI and no timing here (collectives/bench.c measures; `tessera plan` predicts). */
#include "tsbuild.h"
#include "collectives/cost_model.h"
#include "src/core/error.h"
#include "src/core/path.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ts_coll_model_shape(const char *op, const char *algo, int p, double *L, double *B)
{
    const double lg = p > 1 ? ceil(log2((double)p)) : 0, pw = p > 1 && (p & (p - 1)) == 0;
    const double fold = p > 1 && !pw ? 2 : 0; /* non-powers of two fold the extra ranks in pairs first */
    const double frac = p > 0 ? (double)(p - 1) / p : 0;
    *L = 2 * lg;
    *B = 2 * frac;
    if (p <= 1) {
        *L = *B = 0;
        return;
    }
    if (!strcmp(op, "allreduce")) {
        if (!strcmp(algo, "ring") || !strcmp(algo, "nccl")) *L = 2.0 * (p - 1), *B = 2 * frac;
        else if (!strcmp(algo, "recursive_doubling")) *L = lg + fold, *B = lg + fold;
        else if (!strcmp(algo, "rabenseifner")) *L = 2 * floor(log2((double)p)) + fold, *B = 2 * frac + fold;
        else if (!strcmp(algo, "tree")) *L = 2 * ceil(log2((double)p + 1)), *B = 2;
        else if (!strcmp(algo, "shm")) *L = 2, *B = 4 - 2.0 / p;
        else if (!strcmp(algo, "hierarchical")) *L = 2, *B = 3;
        /* mpi and unknown: the bandwidth-optimal shape MPI libraries use for large messages */
    } else if (!strcmp(op, "reduce_scatter") || !strcmp(op, "allgather")) {
        if (!strcmp(algo, "ring")) *L = p - 1, *B = frac;
        else if (!strcmp(algo, "shm")) *L = 1, *B = 2 - 1.0 / p;
        else *L = lg, *B = frac;
    } else if (!strcmp(op, "bcast")) {
        if (!strcmp(algo, "shm")) *L = 1, *B = 2;
        else *L = lg, *B = lg;
    }
}

static int cmp_d(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}
/* median of v[0..n) (reorders v) */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int ts_coll_model_fit(const char *op, const char *algo, int p, int nodes, const double *bytes, const double *t, int k,
                      ts_coll_fit *out)
{
    memset(out, 0, sizeof *out);
    if (k < 2 || p < 2) return TS_ERR(TS_ERR_ARG, "model fit of %s %s: needs 2+ sizes and 2+ ranks", op, algo);
    snprintf(out->op, sizeof out->op, "%s", op);
    snprintf(out->algo, sizeof out->algo, "%s", algo);
    out->ranks = p;
    out->nodes = nodes;
    /* robust to a noisy machine: a from the small messages (median of the
     * three smallest sizes), b from the large ones (median of (t - a) / n
     * over sizes >= 1 MiB, or the largest two when none is that big) */
    int *ord = malloc(sizeof *ord * (size_t)k);
    double *v = malloc(sizeof *v * (size_t)k), a, b;
    if (!ord || !v) {
        free(ord);
        free(v);
        return TS_ERR(TS_ERR_NOMEM, "model fit");
    }
    for (int i = 0; i < k; i++) ord[i] = i;
    for (int i = 1; i < k; i++) /* by size (k is small) */
        for (int j = i; j > 0 && bytes[ord[j]] < bytes[ord[j - 1]]; j--) {
            int x = ord[j];
            ord[j] = ord[j - 1];
            ord[j - 1] = x;
        }
    out->min_bytes = bytes[ord[0]];
    out->max_bytes = bytes[ord[k - 1]];
    int ns = k < 3 ? 1 : 3, nl = 0;
    for (int i = 0; i < ns; i++) v[i] = t[ord[i]];
    a = median(v, ns);
    for (int i = 0; i < k; i++)
        if (bytes[ord[i]] >= 1048576.0 && bytes[ord[i]] > 0) v[nl++] = (t[ord[i]] - a) / bytes[ord[i]];
    if (nl == 0)
        for (int i = k - 2 < ns ? ns : k - 2; i < k; i++) v[nl++] = (t[ord[i]] - a) / (bytes[ord[i]] > 0 ? bytes[ord[i]] : 1);
    b = nl ? median(v, nl) : 0;
    if (b < 0) b = 0;
    if (a < 0) a = 0;
    for (int i = 0; i < k; i++) v[i] = fabs(a + b * bytes[i] - t[i]) / t[i];
    out->max_rel_err = median(v, k); /* the typical error; single noisy sizes do not count */
    free(ord);
    free(v);
    double L, B;
    ts_coll_model_shape(op, algo, p, &L, &B);
    out->alpha_s = L > 0 ? a / L : a;
    out->beta_s = B > 0 ? b / B : b;
    return 0;
}

double ts_coll_model_time(const ts_coll_fit *f, int p, double bytes)
{
    if (p <= 1) return 0;
    double L, B;
    ts_coll_model_shape(f->op, f->algo, p, &L, &B);
    return L * f->alpha_s + B * bytes * f->beta_s;
}

double ts_coll_model_best(const ts_coll_fit *fits, int nfits, const char *op, int nodes, int p, double bytes,
                          const char **algo)
{
    /* the measured rank count nearest p (ties: the larger) */
    int near = -1;
    for (int i = 0; i < nfits; i++) {
        if (strcmp(fits[i].op, op) || fits[i].nodes != nodes) continue;
        int d = abs(fits[i].ranks - p), dn = near < 0 ? 1 << 30 : abs(near - p);
        if (d < dn || (d == dn && fits[i].ranks > near)) near = fits[i].ranks;
    }
    double best = -1;
    for (int i = 0; near >= 0 && i < nfits; i++) {
        if (strcmp(fits[i].op, op) || fits[i].nodes != nodes || fits[i].ranks != near) continue;
        double t = ts_coll_model_time(&fits[i], p, bytes);
        if (best < 0 || t < best) {
            best = t;
            if (algo) *algo = fits[i].algo;
        }
    }
    return best;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

int ts_coll_model_write(const char *path, const ts_coll_fit *fits, int n)
{
    int err = 0;
    char *text = slurp(path), *out = NULL, tmp[4096];
    cJSON *root = text ? cJSON_Parse(text) : NULL, *models, *keep;
    FILE *f = NULL;
    if (!root) root = cJSON_CreateObject();
    if (!root) TS_FAIL(TS_ERR_NOMEM, "tuning models");
    if (!cJSON_GetObjectItemCaseSensitive(root, "version")) cJSON_AddNumberToObject(root, "version", 1);
    keep = cJSON_CreateArray();
    models = cJSON_GetObjectItemCaseSensitive(root, "models");
    if (cJSON_IsArray(models)) {
        cJSON *m;
        cJSON_ArrayForEach(m, models)
        {
            int same = 0;
            cJSON *op = cJSON_GetObjectItemCaseSensitive(m, "op"), *al = cJSON_GetObjectItemCaseSensitive(m, "algo");
            cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "ranks"), *nd = cJSON_GetObjectItemCaseSensitive(m, "nodes");
            for (int i = 0; i < n && cJSON_IsString(op) && cJSON_IsString(al) && cJSON_IsNumber(r) && cJSON_IsNumber(nd); i++)
                same |= !strcmp(op->valuestring, fits[i].op) && !strcmp(al->valuestring, fits[i].algo) &&
                        r->valueint == fits[i].ranks && nd->valueint == fits[i].nodes;
            if (!same) cJSON_AddItemToArray(keep, cJSON_Duplicate(m, 1));
        }
    }
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "op", fits[i].op);
        cJSON_AddStringToObject(e, "algo", fits[i].algo);
        cJSON_AddNumberToObject(e, "ranks", fits[i].ranks);
        cJSON_AddNumberToObject(e, "nodes", fits[i].nodes);
        cJSON_AddNumberToObject(e, "alpha_us", fits[i].alpha_s * 1e6);
        cJSON_AddNumberToObject(e, "beta_ns_per_byte", fits[i].beta_s * 1e9);
        cJSON_AddNumberToObject(e, "max_rel_err", fits[i].max_rel_err);
        cJSON_AddNumberToObject(e, "min_bytes", fits[i].min_bytes);
        cJSON_AddNumberToObject(e, "max_bytes", fits[i].max_bytes);
        cJSON_AddItemToArray(keep, e);
    }
    if (models) cJSON_ReplaceItemInObjectCaseSensitive(root, "models", keep);
    else cJSON_AddItemToObject(root, "models", keep);
    out = cJSON_Print(root);
    if (!out) TS_FAIL(TS_ERR_NOMEM, "tuning models");
    TS_CHECK(ts_path_fmt(tmp, sizeof tmp, "tuning table", "%s.tmp", path));
    f = fopen(tmp, "wb");
    if (!f) TS_FAIL(TS_ERR_IO, "%s: cannot create", tmp);
    if (fputs(out, f) < 0 || fputc('\n', f) < 0) TS_FAIL(TS_ERR_IO, "%s: write failed", tmp);
    if (fclose(f)) {
        f = NULL;
        TS_FAIL(TS_ERR_IO, "%s: write failed", tmp);
    }
    f = NULL;
    if (rename(tmp, path)) TS_FAIL(TS_ERR_IO, "cannot rename %s to %s", tmp, path);
cleanup:
    if (f) fclose(f);
    free(out);
    free(text);
    cJSON_Delete(root);
    return err;
}

int ts_coll_model_load(const char *path, ts_coll_fit **fits, int *n)
{
    int err = 0, k = 0;
    char *text = slurp(path);
    cJSON *root = NULL;
    ts_coll_fit *f = NULL;
    *fits = NULL;
    *n = 0;
    if (!text) return TS_ERR(TS_ERR_IO, "%s: cannot read the tuning table", path);
    root = cJSON_Parse(text);
    if (!root) TS_FAIL(TS_ERR_FORMAT, "%s: not valid JSON", path);
    cJSON *models = cJSON_GetObjectItemCaseSensitive(root, "models"), *m;
    int cap = cJSON_IsArray(models) ? cJSON_GetArraySize(models) : 0;
    f = calloc((size_t)(cap ? cap : 1), sizeof *f);
    if (!f) TS_FAIL(TS_ERR_NOMEM, "models");
    if (cap)
        cJSON_ArrayForEach(m, models)
        {
            cJSON *op = cJSON_GetObjectItemCaseSensitive(m, "op"), *al = cJSON_GetObjectItemCaseSensitive(m, "algo");
            cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "ranks"), *nd = cJSON_GetObjectItemCaseSensitive(m, "nodes");
            cJSON *a = cJSON_GetObjectItemCaseSensitive(m, "alpha_us"), *b = cJSON_GetObjectItemCaseSensitive(m, "beta_ns_per_byte");
            if (!cJSON_IsString(op) || !cJSON_IsString(al) || !cJSON_IsNumber(r) || !cJSON_IsNumber(nd) ||
                !cJSON_IsNumber(a) || !cJSON_IsNumber(b))
                TS_FAIL(TS_ERR_FORMAT, "%s: models[%d] needs op, algo, ranks, nodes, alpha_us, beta_ns_per_byte", path, k);
            snprintf(f[k].op, sizeof f[k].op, "%s", op->valuestring);
            snprintf(f[k].algo, sizeof f[k].algo, "%s", al->valuestring);
            f[k].ranks = r->valueint;
            f[k].nodes = nd->valueint;
            f[k].alpha_s = a->valuedouble * 1e-6;
            f[k].beta_s = b->valuedouble * 1e-9;
            cJSON *e = cJSON_GetObjectItemCaseSensitive(m, "max_rel_err");
            f[k].max_rel_err = cJSON_IsNumber(e) ? e->valuedouble : 0;
            k++;
        }
    *fits = f;
    *n = k;
    f = NULL;
cleanup:
    free(f);
    free(text);
    cJSON_Delete(root);
    return err;
}
