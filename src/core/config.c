/* Options database over inih; see config.h. Values are kept as validated
 * strings with their source; typed getters parse them again (cheap, and the
 * string is what gets hashed and written). Owns parsing, validation against
 * the key tables handed in, the sources, the hash and the ranks' agreement on
 * it; it names no key itself: each module owns its table. */
#include "tsbuild.h"
#include "src/core/config.h"
#include "src/core/error.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const ts_cfg_key *k;
    char *value;  /* NULL = unset */
    char *source;
} cfg_entry;

struct ts_config {
    cfg_entry *e;
    int n;
};

int ts_config_create(const ts_cfg_key *const *tables, ts_config **out)
{
    int err = 0, n = 0;
    ts_config *c = NULL;
    for (int t = 0; tables[t]; t++)
        for (const ts_cfg_key *k = tables[t]; k->key; k++) n++;
    c = TS_CALLOC(1, sizeof *c);
    if (!c) TS_FAIL(TS_ERR_NOMEM, "config");
    c->e = TS_CALLOC((size_t)n, sizeof *c->e);
    if (!c->e) TS_FAIL(TS_ERR_NOMEM, "config");
    for (int t = 0; tables[t]; t++)
        for (const ts_cfg_key *k = tables[t]; k->key; k++) {
            /* two modules may read the same key if they declare it alike */
            int dup = 0;
            for (int i = 0; i < c->n && !dup; i++) {
                const ts_cfg_key *o = c->e[i].k;
                if (strcmp(o->key, k->key)) continue;
                if (o->type != k->type || !o->def != !k->def || (o->def && strcmp(o->def, k->def)) ||
                    !o->spec != !k->spec || (o->spec && strcmp(o->spec, k->spec)))
                    TS_FAIL(TS_ERR_INTERNAL, "config key %s declared twice, differently", k->key);
                dup = 1;
            }
            if (dup) continue;
            c->e[c->n].k = k;
            if (k->def) {
                c->e[c->n].value = strdup(k->def);
                c->e[c->n].source = strdup("default");
            }
            c->n++;
        }
    *out = c;
    return 0;
cleanup:
    ts_config_destroy(&c);
    return err;
}

void ts_config_destroy(ts_config **cfg)
{
    if (!cfg || !*cfg) return;
    for (int i = 0; i < (*cfg)->n; i++) {
        free((*cfg)->e[i].value);
        free((*cfg)->e[i].source);
    }
    free((*cfg)->e);
    free(*cfg);
    *cfg = NULL;
}

static cfg_entry *find(const ts_config *c, const char *key)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].k->key, key)) return &c->e[i];
    return NULL;
}

int ts_parse_i64(const char *s, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s) return 1;
    while (isspace((unsigned char)*end)) end++;
    if (*end) return 1;
    *v = x;
    return 0;
}

static int parse_f64(const char *s, double *v)
{
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || end == s || !isfinite(x)) return 1;
    while (isspace((unsigned char)*end)) end++;
    if (*end) return 1;
    *v = x;
    return 0;
}

static int parse_bool(const char *s, int *v)
{
    static const char *const t[] = {"true", "yes", "on", "1"}, *const f[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, t[i])) { *v = 1; return 0; }
        if (!strcasecmp(s, f[i])) { *v = 0; return 0; }
    }
    return 1;
}

/* range "lo:hi": checks x against the bounds present */
static int in_range(const char *spec, double x, char *why, size_t n)
{
    if (!spec || !*spec) return 1;
    const char *colon = strchr(spec, ':');
    if (!colon) return 1;
    char lo[64] = "", hi[64] = "";
    snprintf(lo, sizeof lo, "%.*s", (int)(colon - spec), spec);
    snprintf(hi, sizeof hi, "%s", colon + 1);
    if (*lo && x < strtod(lo, NULL)) {
        snprintf(why, n, "must be >= %s", lo);
        return 0;
    }
    if (*hi && x > strtod(hi, NULL)) {
        snprintf(why, n, "must be <= %s", hi);
        return 0;
    }
    return 1;
}

/* v[0 .. len) is one of the choices "a|b|c" */
static int is_choice(const char *spec, const char *v, size_t len)
{
    for (const char *p = spec; p && *p;) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == len && !strncmp(p, v, l)) return 1;
        p = bar ? bar + 1 : p + l;
    }
    return 0;
}

static int validate(const ts_cfg_key *k, const char *v, char *why, size_t n)
{
    int64_t i;
    double d;
    int b;
    switch (k->type) {
    case TS_CFG_INT:
        if (ts_parse_i64(v, &i)) { snprintf(why, n, "is not an integer"); return 0; }
        return in_range(k->spec, (double)i, why, n);
    case TS_CFG_FLOAT:
        if (parse_f64(v, &d)) { snprintf(why, n, "is not a finite number"); return 0; }
        return in_range(k->spec, d, why, n);
    case TS_CFG_BOOL:
        if (parse_bool(v, &b)) { snprintf(why, n, "is not a boolean (true/false)"); return 0; }
        return 1;
    case TS_CFG_STRING:
        return 1;
    case TS_CFG_ENUM:
        if (is_choice(k->spec, v, strlen(v))) return 1;
        snprintf(why, n, "is not one of %s", k->spec);
        return 0;
    case TS_CFG_ENUMLIST:
        for (const char *p = v;; p++) {
            const size_t l = strcspn(p, ",");
            const char *w = p;
            size_t wl = l;
            while (wl && *w == ' ') w++, wl--;
            while (wl && w[wl - 1] == ' ') wl--;
            if (!is_choice(k->spec, w, wl)) {
                snprintf(why, n, "has '%.*s', not one of %s", (int)wl, w, k->spec);
                return 0;
            }
            p += l;
            if (!*p) return 1;
        }
    case TS_CFG_INTLIST: {
        char *copy = strdup(v), *save = NULL;
        int ok = copy != NULL, count = 0;
        for (char *tok = ok ? strtok_r(copy, ",", &save) : NULL; tok && ok; tok = strtok_r(NULL, ",", &save)) {
            if (ts_parse_i64(tok, &i)) {
                snprintf(why, n, "has '%s', not an integer", tok);
                ok = 0;
            } else if (!in_range(k->spec, (double)i, why, n)) {
                ok = 0;
            }
            count++;
        }
        if (ok && count == 0) { snprintf(why, n, "is an empty list"); ok = 0; }
        free(copy);
        return ok;
    }
    }
    return 0;
}

int ts_config_set(ts_config *cfg, const char *key, const char *value, const char *where)
{
    cfg_entry *e = find(cfg, key);
    if (!e) return TS_ERR(TS_ERR_CONFIG, "%s: unknown key '%s'", where, key);
    /* trim surrounding whitespace */
    while (isspace((unsigned char)*value)) value++;
    size_t len = strlen(value);
    while (len && isspace((unsigned char)value[len - 1])) len--;
    char *v = strndup(value, len), *src = strdup(where);
    if (!v || !src) {
        free(v);
        free(src);
        return TS_ERR(TS_ERR_NOMEM, "config value");
    }
    char why[256] = "";
    if (!validate(e->k, v, why, sizeof why)) {
        int rc = TS_ERR(TS_ERR_CONFIG, "%s: %s = '%s' %s", where, key, v, why);
        free(v);
        free(src);
        return rc;
    }
    free(e->value);
    free(e->source);
    e->value = v;
    e->source = src;
    return 0;
}

int ts_config_set_arg(ts_config *cfg, const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return TS_ERR(TS_ERR_CONFIG, "command line: '%s' is not section.key=value", arg);
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)(eq - arg), arg);
    return ts_config_set(cfg, key, eq + 1, "command line");
}

/* inih reads through this reader one line at a time, so the handler knows
 * the line it is called for. */
typedef struct {
    ts_config *cfg;
    const char *name;
    const char *text; /* remaining input */
    int line;
    int err;
    int err_line; /* line of the handler's error */
} ini_ctx;

static char *cfg_reader(char *str, int num, void *stream)
{
    ini_ctx *x = stream;
    if (!*x->text) return NULL;
    const char *eol = strchr(x->text, '\n');
    size_t len = eol ? (size_t)(eol - x->text) + 1 : strlen(x->text);
    size_t take = len < (size_t)num - 1 ? len : (size_t)num - 1;
    memcpy(str, x->text, take);
    str[take] = '\0';
    x->text += take;
    if (take == len) x->line++;
    return str;
}

static int cfg_handler(void *user, const char *section, const char *name, const char *value)
{
    ini_ctx *x = user;
    if (x->err) return 0;
    char key[256], where[1100];
    snprintf(key, sizeof key, "%s.%s", section, name);
    snprintf(where, sizeof where, "%s:%d", x->name, x->line);
    if (!*section) {
        x->err = TS_ERR(TS_ERR_CONFIG, "%s: key '%s' outside any [section]", where, name);
        x->err_line = x->line;
        return 0;
    }
    x->err = ts_config_set(x->cfg, key, value, where);
    if (x->err) x->err_line = x->line;
    return x->err == 0;
}

static int parse_text(ts_config *cfg, const char *text, const char *name)
{
    ini_ctx x = {cfg, name, text, 0, 0, 0};
    int rc = ini_parse_stream((ini_reader)cfg_reader, &x, cfg_handler, &x);
    if (x.err && !(rc > 0 && rc < x.err_line)) return x.err; /* else a syntax error came first */
    if (rc == -2) return TS_ERR(TS_ERR_NOMEM, "%s: out of memory while parsing", name);
    if (rc > 0) return TS_ERR(TS_ERR_CONFIG, "%s:%d: syntax error (expected [section] or key = value)", name, rc);
    if (rc < 0) return TS_ERR(TS_ERR_CONFIG, "%s: cannot parse", name);
    return 0;
}

/* A file applies completely or not at all: values are restored on error. */
int ts_config_load_string(ts_config *cfg, const char *text, const char *name)
{
    cfg_entry *saved = malloc(sizeof *saved * (size_t)(cfg->n ? cfg->n : 1));
    if (!saved) return TS_ERR(TS_ERR_NOMEM, "config");
    for (int i = 0; i < cfg->n; i++) {
        saved[i] = cfg->e[i];
        cfg->e[i].value = cfg->e[i].value ? strdup(cfg->e[i].value) : NULL;
        cfg->e[i].source = cfg->e[i].source ? strdup(cfg->e[i].source) : NULL;
    }
    int err = parse_text(cfg, text, name);
    for (int i = 0; i < cfg->n; i++) {
        cfg_entry *drop = err ? &cfg->e[i] : &saved[i];
        free(drop->value);
        free(drop->source);
        if (err) cfg->e[i] = saved[i];
    }
    free(saved);
    return err;
}

int ts_config_load_file(ts_config *cfg, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return TS_ERR(TS_ERR_IO, "%s: cannot open config file", path);
    char *text = NULL;
    size_t cap = 0, len = 0;
    int err = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *t = realloc(text, cap);
            if (!t) {
                err = TS_ERR(TS_ERR_NOMEM, "%s: reading config", path);
                break;
            }
            text = t;
        }
        size_t r = fread(text + len, 1, 4096, f);
        len += r;
        if (r < 4096) break;
    }
    if (!err && ferror(f)) err = TS_ERR(TS_ERR_IO, "%s: read error", path);
    fclose(f);
    if (!err) {
        text[len] = '\0';
        err = ts_config_load_string(cfg, text, path);
    }
    free(text);
    return err;
}

static cfg_entry *need(const ts_config *cfg, const char *key, int *err)
{
    cfg_entry *e = find(cfg, key);
    if (!e) {
        *err = TS_ERR(TS_ERR_INTERNAL, "config key '%s' is not in any schema", key);
        return NULL;
    }
    if (!e->value) {
        *err = TS_ERR(TS_ERR_CONFIG, "config key '%s' is required but not set", key);
        return NULL;
    }
    *err = 0;
    return e;
}

int ts_config_isset(const ts_config *cfg, const char *key)
{
    cfg_entry *e = find(cfg, key);
    return e && e->value;
}

int ts_config_get_int(const ts_config *cfg, const char *key, int64_t *out)
{
    int err;
    cfg_entry *e = need(cfg, key, &err);
    if (!e) return err;
    if (e->k->type != TS_CFG_INT) return TS_ERR(TS_ERR_INTERNAL, "config key '%s' is not an int", key);
    return ts_parse_i64(e->value, out) ? TS_ERR(TS_ERR_CONFIG, "%s: '%s'", key, e->value) : 0;
}

int ts_config_get_float(const ts_config *cfg, const char *key, double *out)
{
    int err;
    cfg_entry *e = need(cfg, key, &err);
    if (!e) return err;
    if (e->k->type != TS_CFG_FLOAT) return TS_ERR(TS_ERR_INTERNAL, "config key '%s' is not a float", key);
    return parse_f64(e->value, out) ? TS_ERR(TS_ERR_CONFIG, "%s: '%s'", key, e->value) : 0;
}

int ts_config_get_bool(const ts_config *cfg, const char *key, int *out)
{
    int err;
    cfg_entry *e = need(cfg, key, &err);
    if (!e) return err;
    if (e->k->type != TS_CFG_BOOL) return TS_ERR(TS_ERR_INTERNAL, "config key '%s' is not a bool", key);
    return parse_bool(e->value, out) ? TS_ERR(TS_ERR_CONFIG, "%s: '%s'", key, e->value) : 0;
}

int ts_config_get_str(const ts_config *cfg, const char *key, const char **out)
{
    int err;
    cfg_entry *e = need(cfg, key, &err);
    if (!e) return err;
    *out = e->value;
    return 0;
}

int ts_config_get_intlist(const ts_config *cfg, const char *key, int64_t *vals, int max, int *n)
{
    int err;
    cfg_entry *e = need(cfg, key, &err);
    if (!e) return err;
    if (e->k->type != TS_CFG_INTLIST) return TS_ERR(TS_ERR_INTERNAL, "config key '%s' is not a list", key);
    int count = 0;
    const char *p = e->value;
    while (*p) {
        char *end;
        long long x = strtoll(p, &end, 10);
        if (count >= max) return TS_ERR(TS_ERR_CONFIG, "%s: more than %d values", key, max);
        vals[count++] = x;
        p = end;
        while (*p == ',' || isspace((unsigned char)*p)) p++;
    }
    *n = count;
    return 0;
}

int ts_config_given(const ts_config *cfg, const char *key)
{
    cfg_entry *e = find(cfg, key);
    return e && e->value && e->source && strcmp(e->source, "default") != 0;
}

const char *ts_config_source(const ts_config *cfg, const char *key)
{
    cfg_entry *e = find(cfg, key);
    return e && e->source ? e->source : "unset";
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp((*(const cfg_entry *const *)a)->k->key, (*(const cfg_entry *const *)b)->k->key);
}

/* entries sorted by key (caller frees) */
static const cfg_entry **sorted(const ts_config *cfg)
{
    const cfg_entry **s = malloc(sizeof *s * (size_t)(cfg->n ? cfg->n : 1));
    if (!s) return NULL;
    for (int i = 0; i < cfg->n; i++) s[i] = &cfg->e[i];
    qsort(s, (size_t)cfg->n, sizeof *s, cmp_entry);
    return s;
}

int ts_config_write(const ts_config *cfg, FILE *f)
{
    const cfg_entry **s = sorted(cfg);
    if (!s) return TS_ERR(TS_ERR_NOMEM, "config write");
    char section[128] = "";
    for (int i = 0; i < cfg->n; i++) {
        if (!s[i]->value) continue;
        const char *key = s[i]->k->key, *dot = strchr(key, '.');
        if (!dot) continue;
        if (strncmp(section, key, (size_t)(dot - key)) || section[dot - key]) {
            snprintf(section, sizeof section, "%.*s", (int)(dot - key), key);
            fprintf(f, "%s[%s]\n", i ? "\n" : "", section);
        }
        fprintf(f, "%s = %s\n", dot + 1, s[i]->value);
    }
    free(s);
    return ferror(f) ? TS_ERR(TS_ERR_IO, "writing resolved config") : 0;
}

uint64_t ts_config_hash(const ts_config *cfg)
{
    const cfg_entry **s = sorted(cfg);
    uint64_t h = 1469598103934665603ULL;
    if (!s) return 0;
    for (int i = 0; i < cfg->n; i++) {
        if (!s[i]->value) continue;
        for (int pass = 0; pass < 2; pass++) {
            const unsigned char *p = (const unsigned char *)(pass ? s[i]->value : s[i]->k->key);
            for (; *p; p++) {
                h ^= *p;
                h *= 1099511628211ULL;
            }
            h ^= (uint64_t)(pass ? '\n' : '=');
            h *= 1099511628211ULL;
        }
    }
    free(s);
    return h;
}

int ts_config_check_ranks(const ts_config *cfg, MPI_Comm comm)
{
    int err = 0, size, rank;
    unsigned long long h = ts_config_hash(cfg), *all = NULL;
    TS_MPI(MPI_Comm_size(comm, &size));
    TS_MPI(MPI_Comm_rank(comm, &rank));
    all = malloc(sizeof *all * (size_t)size);
    if (!all) TS_FAIL(TS_ERR_NOMEM, "config hash");
    TS_MPI(MPI_Allgather(&h, 1, MPI_UNSIGNED_LONG_LONG, all, 1, MPI_UNSIGNED_LONG_LONG, comm));
    {
        char list[256] = "";
        int bad = 0;
        for (int r = 1; r < size; r++)
            if (all[r] != all[0]) {
                if (bad < 8) {
                    size_t l = strlen(list);
                    snprintf(list + l, sizeof list - l, "%s%d", bad ? ", " : "", r);
                }
                bad++;
            }
        if (bad)
            TS_FAIL(TS_ERR_MISMATCH,
                    "the resolved config differs between ranks: rank%s %s%s differ%s from rank 0 "
                    "(same config file and overrides on every rank?)",
                    bad > 1 ? "s" : "", list, bad > 8 ? ", ..." : "", bad > 1 ? "" : "s");
    }
    TS_CHECK(ts_env_check_ranks(comm));
cleanup:
    free(all);
    return err;
}

/* the environment variables that change collective or topology behaviour */
static const char *const env_checked[] = {"TESSERA_COLL_ALLREDUCE", "TESSERA_COLL_REDUCE_SCATTER", "TESSERA_COLL_ALLGATHER",
                                          "TESSERA_COLL_BCAST", "TESSERA_COLL_TUNING", "TESSERA_RANKS_PER_NODE", NULL};

int ts_env_check_ranks(MPI_Comm comm)
{
    int err = 0, size, rank;
    char (*all)[128] = NULL;
    TS_MPI(MPI_Comm_size(comm, &size));
    TS_MPI(MPI_Comm_rank(comm, &rank));
    all = malloc(sizeof *all * (size_t)size);
    if (!all) TS_FAIL(TS_ERR_NOMEM, "environment check");
    for (int v = 0; env_checked[v]; v++) {
        char mine[128];
        const char *e = getenv(env_checked[v]);
        /* unset and set differ; values longer than the buffer compare by their first 126 characters */
        snprintf(mine, sizeof mine, "%c%s", e ? '=' : '-', e ? e : "");
        TS_MPI(MPI_Allgather(mine, (int)sizeof mine, MPI_CHAR, all, (int)sizeof mine, MPI_CHAR, comm));
        for (int r = 1; r < size; r++)
            if (strcmp(all[r], all[0]))
                TS_FAIL(TS_ERR_MISMATCH,
                        "environment variable %s differs between ranks: rank 0 has %s%s%s, rank %d has %s%s%s (it "
                        "changes how the collectives run: set it alike on every rank)",
                        env_checked[v], all[0][0] == '=' ? "'" : "", all[0][0] == '=' ? all[0] + 1 : "it unset",
                        all[0][0] == '=' ? "'" : "", r, all[r][0] == '=' ? "'" : "",
                        all[r][0] == '=' ? all[r] + 1 : "it unset", all[r][0] == '=' ? "'" : "");
    }
cleanup:
    free(all);
    return err;
}

void ts_config_print_help(const ts_config *cfg, FILE *f)
{
    static const char *const tn[] = {"int", "float", "bool", "string", "choice", "int list"};
    for (int i = 0; i < cfg->n; i++) {
        const ts_cfg_key *k = cfg->e[i].k;
        fprintf(f, "  %-26s %-8s %s", k->key, tn[k->type], k->doc ? k->doc : "");
        if (k->spec) fprintf(f, " [%s]", k->spec);
        if (k->def) fprintf(f, " (default %s)", k->def);
        fputc('\n', f);
    }
}
