/* Tuning tables: JSON written by `tessera bench coll --tune`, one entry per
 * (collective, ranks, nodes, size bucket) naming the fastest algorithm
 * measured there. docs/formats.md describes the file. Local file reading
 * and writing, no MPI; the "models" array in the same file is cost_model.c's. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"
#include "src/core/path.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, int *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        *err = TS_ERR(TS_ERR_IO, "%s: cannot open tuning table (coll.tuning or TESSERA_COLL_TUNING): %s", path,
                      strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        fclose(f);
        *err = TS_ERR(TS_ERR_IO, "%s: cannot read tuning table", path);
        return NULL;
    }
    s[n] = '\0';
    fclose(f);
    *err = 0;
    return s;
}

int ts_coll_tuning_load(ts_coll *c, const char *path)
{
    int err = 0;
    char *text = slurp(path, &err);
    cJSON *root = NULL;
    ts_tuning_entry *t = NULL;
    if (!text) return err;
    root = cJSON_Parse(text);
    if (!root) TS_FAIL(TS_ERR_FORMAT, "%s: not valid JSON", path);
    cJSON *entries = cJSON_GetObjectItemCaseSensitive(root, "entries");
    if (!cJSON_IsArray(entries)) TS_FAIL(TS_ERR_FORMAT, "%s: no \"entries\" array", path);
    int n = cJSON_GetArraySize(entries), k = 0;
    t = calloc((size_t)(n ? n : 1), sizeof *t);
    if (!t) TS_FAIL(TS_ERR_NOMEM, "tuning table");
    cJSON *e;
    cJSON_ArrayForEach(e, entries)
    {
        cJSON *op = cJSON_GetObjectItemCaseSensitive(e, "op"), *algo = cJSON_GetObjectItemCaseSensitive(e, "algo");
        cJSON *ranks = cJSON_GetObjectItemCaseSensitive(e, "ranks"), *nodes = cJSON_GetObjectItemCaseSensitive(e, "nodes");
        cJSON *mb = cJSON_GetObjectItemCaseSensitive(e, "max_bytes");
        ts_coll_kind kind;
        if (!cJSON_IsString(op) || !cJSON_IsString(algo) || !cJSON_IsNumber(ranks) || !cJSON_IsNumber(nodes) ||
            !cJSON_IsNumber(mb))
            TS_FAIL(TS_ERR_FORMAT, "%s: entry %d needs op, algo, ranks, nodes, max_bytes", path, k);
        /* 2^63: the largest size a double converts to size_t exactly; beyond it, or negative or NaN, the
         * conversion is undefined (found by fuzz_json) */
        if (!(mb->valuedouble >= 0 && mb->valuedouble <= 9223372036854775808.0))
            TS_FAIL(TS_ERR_FORMAT, "%s: entry %d: max_bytes %g is not a size (0 .. 2^63)", path, k, mb->valuedouble);
        if (ts_coll_kind_parse(op->valuestring, &kind))
            TS_FAIL(TS_ERR_FORMAT, "%s: entry %d: unknown op '%s'", path, k, op->valuestring);
        int idx = ts_coll_registry_find(kind, algo->valuestring);
        if (idx < 0)
            TS_FAIL(TS_ERR_FORMAT, "%s: entry %d: unknown %s algorithm '%s'", path, k, op->valuestring,
                    algo->valuestring);
        t[k].kind = kind;
        t[k].ranks = ranks->valueint;
        t[k].nodes = nodes->valueint;
        t[k].max_bytes = (size_t)mb->valuedouble;
        t[k].algo = idx;
        k++;
    }
    free(c->tuning);
    c->tuning = t;
    c->ntuning = k;
    t = NULL;
cleanup:
    free(t);
    cJSON_Delete(root);
    free(text);
    return err;
}

int ts_coll_tuning_write(const char *path, ts_coll_kind kind, int ranks, int nodes, const size_t *max_bytes,
                         const char *const *algos, int n)
{
    int err = 0;
    char *text = NULL;
    cJSON *root = cJSON_CreateObject(), *entries = NULL;
    FILE *f = NULL;
    char tmp[4096];
    if (!root) TS_FAIL(TS_ERR_NOMEM, "tuning table");
    cJSON_AddNumberToObject(root, "version", 1);
    /* keep entries of other shapes or collectives already in the file */
    FILE *old = fopen(path, "rb");
    if (old) {
        fclose(old);
        int e2;
        char *otext = slurp(path, &e2);
        cJSON *oroot = otext ? cJSON_Parse(otext) : NULL;
        free(otext);
        cJSON *oe = oroot ? cJSON_GetObjectItemCaseSensitive(oroot, "entries") : NULL;
        if (cJSON_IsArray(oe)) {
            cJSON *x;
            entries = cJSON_AddArrayToObject(root, "entries");
            cJSON_ArrayForEach(x, oe)
            {
                cJSON *op = cJSON_GetObjectItemCaseSensitive(x, "op");
                cJSON *r = cJSON_GetObjectItemCaseSensitive(x, "ranks"), *nd = cJSON_GetObjectItemCaseSensitive(x, "nodes");
                if (cJSON_IsString(op) && cJSON_IsNumber(r) && cJSON_IsNumber(nd) &&
                    !strcmp(op->valuestring, ts_coll_kind_name(kind)) && r->valueint == ranks && nd->valueint == nodes)
                    continue;
                cJSON_AddItemToArray(entries, cJSON_Duplicate(x, 1));
            }
        }
        cJSON *om = oroot ? cJSON_GetObjectItemCaseSensitive(oroot, "models") : NULL;
        /* the "models" array: collectives/cost_model.c's fits, kept as they were */
        if (cJSON_IsArray(om)) cJSON_AddItemToObject(root, "models", cJSON_Duplicate(om, 1));
        cJSON_Delete(oroot);
    }
    if (!entries) entries = cJSON_AddArrayToObject(root, "entries");
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "op", ts_coll_kind_name(kind));
        cJSON_AddNumberToObject(e, "ranks", ranks);
        cJSON_AddNumberToObject(e, "nodes", nodes);
        cJSON_AddNumberToObject(e, "max_bytes", (double)max_bytes[i]);
        cJSON_AddStringToObject(e, "algo", algos[i]);
        cJSON_AddItemToArray(entries, e);
    }
    text = cJSON_Print(root);
    if (!text) TS_FAIL(TS_ERR_NOMEM, "tuning table text");
    /* write to a temporary name, then rename: never a half-written table */
    tmp[0] = '\0';
    TS_CHECK(ts_path_fmt(tmp, sizeof tmp, "tuning table", "%s.tmp", path));
    f = fopen(tmp, "wb");
    if (!f) TS_FAIL(TS_ERR_IO, "%s: cannot create", tmp);
    if (fputs(text, f) < 0 || fputc('\n', f) < 0 || fflush(f) != 0) TS_FAIL(TS_ERR_IO, "%s: write failed", tmp);
    if (fclose(f) != 0) {
        f = NULL;
        TS_FAIL(TS_ERR_IO, "%s: write failed", tmp);
    }
    f = NULL;
    if (rename(tmp, path) != 0) TS_FAIL(TS_ERR_IO, "cannot rename %s to %s", tmp, path);
cleanup:
    if (f) fclose(f);
    if (err && tmp[0]) remove(tmp);
    free(text);
    cJSON_Delete(root);
    return err;
}
