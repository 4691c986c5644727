/* The scans of `tessera infer` (infer_impl.h): input= as a scan, a folder,
 * a comma list or a list file, and for each scan its output, label and
 * probability paths, all checked before anything is predicted. Owns the
 * list only: nothing here reads a scan. */
#include "tsbuild.h"
#include "src/infer/infer_impl.h"
#include "src/core/error.h"
#include "src/core/path.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* the length of name without .nii or .nii.gz; 0 when it has neither */
static size_t nii_stem(const char *name)
{
    size_t n = strlen(name);
    if (n > 7 && !strcmp(name + n - 7, ".nii.gz")) return n - 7;
    if (n > 4 && !strcmp(name + n - 4, ".nii")) return n - 4;
    return 0;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct names {
    int n, cap;
    char **v;
} names;

static int names_add(names *s, const char *p, size_t len)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        char **v = realloc(s->v, sizeof *v * (size_t)cap);
        if (!v) return TS_ERR(TS_ERR_NOMEM, "input list");
        s->v = v, s->cap = cap;
    }
    if (!(s->v[s->n] = strndup(p, len))) return TS_ERR(TS_ERR_NOMEM, "input list");
    s->n++;
    return 0;
}

static void names_free(names *s)
{
    for (int i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
}

/* The *.nii and *.nii.gz of folder dir, sorted by name. */
static int list_folder(const char *dir, names *s)
{
    char p[4096];
    DIR *d = opendir(dir);
    if (!d) return TS_ERR(TS_ERR_IO, "input=%s: cannot open the folder: %s", dir, strerror(errno));
    int err = 0;
    struct dirent *e;
    int first = s->n;
    while (!err && (e = readdir(d)))
        if (e->d_name[0] != '.' && nii_stem(e->d_name)) {
            err = ts_path_join(p, sizeof p, dir, e->d_name);
            if (!err) err = names_add(s, p, strlen(p));
        }
    closedir(d);
    if (!err) qsort(s->v + first, (size_t)(s->n - first), sizeof *s->v, cmp_str);
    return err;
}

/* A list file: a path a line; blank lines and lines starting with # skipped. */
static int list_file(const char *path, names *s)
{
    char line[4200];
    FILE *f = fopen(path, "r");
    if (!f) return TS_ERR(TS_ERR_IO, "input=%s: %s", path, strerror(errno));
    int err = 0, ln = 0;
    while (!err && fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        ln++;
        if (n == sizeof line - 1 && line[n - 1] != '\n')
            err = TS_ERR(TS_ERR_FORMAT, "input=%s line %d: longer than %zu characters", path, ln, sizeof line - 2);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t')) n--;
        char *p = line;
        while (*p == ' ' || *p == '\t') p++, n--;
        if (!err && n && *p != '#') err = names_add(s, p, n);
    }
    fclose(f);
    return err;
}

/* The scans input= names; *multi: a folder, a comma list or a list file. */
static int input_names(const char *in, names *s, int *multi)
{
    struct stat st;
    *multi = 1;
    if (strchr(in, ',')) {
        for (const char *p = in; *p;) {
            size_t n = strcspn(p, ",");
            if (n) TS_TRY(names_add(s, p, n));
            p += n + (p[n] == ',');
        }
        return 0;
    }
    if (stat(in, &st) != 0) return TS_ERR(TS_ERR_IO, "input=%s: %s", in, strerror(errno));
    if (S_ISDIR(st.st_mode)) return list_folder(in, s);
    if (nii_stem(in)) {
        *multi = 0;
        return names_add(s, in, strlen(in));
    }
    return list_file(in, s);
}

/* label/NAME for scan `in`: the same name, .nii and .nii.gz swapped, or
 * without nnU-Net's channel suffix _0000. "" when none exists. */
static int find_label(const char *dir, const char *in, char *out, size_t n)
{
    const char *b = base_name(in);
    size_t stem = nii_stem(b);
    char name[4096];
    const char *ext[2] = {".nii.gz", ".nii"};
    out[0] = 0;
    TS_TRY(ts_path_join(out, n, dir, b));
    if (access(out, R_OK) == 0) return 0;
    for (int strip = 0; strip < 2; strip++) {
        size_t k = stem;
        if (strip) {
            if (k < 5 || strncmp(b + k - 5, "_0000", 5)) break;
            k -= 5;
        }
        for (int e = 0; e < 2; e++) {
            TS_TRY(ts_path_fmt(name, sizeof name, "label", "%.*s%s", (int)k, b, ext[e]));
            TS_TRY(ts_path_join(out, n, dir, name));
            if (access(out, R_OK) == 0) return 0;
        }
    }
    out[0] = 0;
    return 0;
}

/* A folder for several outputs: created (create = 1) when missing. */
static int out_folder(const char *key, const char *dir, int nscans, int create)
{
    if (nii_stem(dir))
        return TS_ERR(TS_ERR_ARG, "%s=%s names a NIfTI file, but input= names %d scans: give a folder", key, dir,
                      nscans);
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return TS_ERR(TS_ERR_ARG, "%s=%s is a file, but input= names %d scans: give a folder", key, dir, nscans);
    if (create && mkdir(dir, 0777) != 0 && errno != EEXIST)
        return TS_ERR(TS_ERR_IO, "%s=%s: cannot create the folder: %s", key, dir, strerror(errno));
    return 0;
}

/* Several scans: no two with one file name. */
static int check_names(const ts_infer_list *l)
{
    for (int i = 0; i < l->n; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(base_name(l->item[i].input), base_name(l->item[j].input)))
                return TS_ERR(TS_ERR_ARG, "input=: %s and %s have the same file name: their outputs would collide",
                              l->item[j].input, l->item[i].input);
    return 0;
}

/* Several scans (rank 0, after creating out): none written into its own folder. */
static int check_folders(const ts_infer_list *l, const char *out)
{
    char ro[PATH_MAX], ri[PATH_MAX], dir[4096];
    int have_out = realpath(out, ro) != NULL;
    for (int i = 0; i < l->n; i++) {
        const char *bi = base_name(l->item[i].input);
        TS_TRY(ts_path_fmt(dir, sizeof dir, "input", "%.*s", (int)(bi - l->item[i].input), l->item[i].input));
        if (have_out && realpath(dir[0] ? dir : ".", ri) && !strcmp(ri, ro))
            return TS_ERR(TS_ERR_ARG, "output=%s is the folder of %s: the masks would overwrite the scans", out,
                          l->item[i].input);
    }
    return 0;
}

int ts_infer_list_make(const ts_infer_opts *o, int create, ts_infer_list *l)
{
    int err = 0;
    names s = {0};
    memset(l, 0, sizeof *l);
    TS_CHECK(input_names(o->input, &s, &l->multi));
    if (!s.n) TS_FAIL(TS_ERR_ARG, "input=%s names no scan (*.nii, *.nii.gz)", o->input);
    if (!(l->item = calloc((size_t)s.n, sizeof *l->item))) TS_FAIL(TS_ERR_NOMEM, "input list of %d scans", s.n);
    l->n = s.n;
    const int label_dir = o->label && is_dir(o->label);
    if (l->multi) {
        if (o->probabilities && !strcmp(o->probabilities, o->output))
            TS_FAIL(TS_ERR_ARG, "probabilities=%s is output=: give another folder", o->probabilities);
        struct stat st;
        if (o->label && stat(o->label, &st) != 0)
            TS_FAIL(TS_ERR_IO, "label=%s: %s (a folder of references is needed: input= names %d scans)", o->label,
                    strerror(errno), s.n);
        if (o->label && !label_dir)
            TS_FAIL(TS_ERR_ARG, "label=%s is not a folder, but input= names %d scans", o->label, s.n);
    } else if (!strcmp(o->input, o->output))
        TS_FAIL(TS_ERR_ARG, "output=%s is the input scan", o->output);
    for (int i = 0; i < s.n; i++) {
        ts_infer_item *it = &l->item[i];
        const char *b = base_name(s.v[i]);
        if (!nii_stem(b)) TS_FAIL(TS_ERR_ARG, "input=%s: %s is not a NIfTI file (.nii, .nii.gz)", o->input, s.v[i]);
        TS_CHECK(ts_path_fmt(it->input, sizeof it->input, "input", "%s", s.v[i]));
        if (l->multi) {
            TS_CHECK(ts_path_join(it->output, sizeof it->output, o->output, b));
            if (o->probabilities) TS_CHECK(ts_path_join(it->prob, sizeof it->prob, o->probabilities, b));
        } else {
            TS_CHECK(ts_path_fmt(it->output, sizeof it->output, "output", "%s", o->output));
            if (o->probabilities) TS_CHECK(ts_path_fmt(it->prob, sizeof it->prob, "probabilities", "%s", o->probabilities));
        }
        if (label_dir) {
            TS_CHECK(find_label(o->label, it->input, it->label, sizeof it->label));
            if (!it->label[0])
                TS_FAIL(TS_ERR_IO, "label=%s has no reference for %s (looked for %s, .nii/.nii.gz, without _0000)",
                        o->label, it->input, b);
        } else if (o->label) {
            if (access(o->label, R_OK) != 0) TS_FAIL(TS_ERR_IO, "label=%s: %s", o->label, strerror(errno));
            TS_CHECK(ts_path_fmt(it->label, sizeof it->label, "label", "%s", o->label));
        }
    }
    if (l->multi) {
        TS_CHECK(check_names(l));
        TS_CHECK(out_folder("output", o->output, s.n, create));
        if (o->probabilities) TS_CHECK(out_folder("probabilities", o->probabilities, s.n, create));
        if (create) TS_CHECK(check_folders(l, o->output));
    }
cleanup:
    names_free(&s);
    if (err) ts_infer_list_free(l);
    return err;
}

void ts_infer_list_free(ts_infer_list *l)
{
    free(l->item);
    l->item = NULL;
    l->n = 0;
}

int ts_infer_metrics_path(const ts_infer_opts *o, const ts_infer_list *l, char *path, size_t n)
{
    if (o->metrics) return ts_path_fmt(path, n, "metrics", "%s", o->metrics);
    if (l->multi) return ts_path_join(path, n, o->output, "metrics.json");
    size_t stem = nii_stem(o->output);
    return ts_path_fmt(path, n, "metrics", "%.*s.metrics.json", (int)(stem ? stem : strlen(o->output)), o->output);
}
