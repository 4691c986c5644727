/* Label maps; see labelmap.h. Entries are kept sorted for binary search,
 * with a direct table for the common case of small non-negative values. */
#include "tsbuild.h"
#include "io/labelmap.h"
#include "io/dataset.h"
#include "src/core/error.h"
#include "src/core/path.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIRECT 65536

typedef struct {
    int64_t src;
    int dst;
} entry;

struct ts_labelmap {
    char path[1024];
    entry *e;
    int n, cap;
    int classes;
    char *names[TS_IO_MAX_CLASSES];
    int16_t *direct; /* DIRECT entries, -1 = absent */
};

static int cmp_entry(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    return x->src < y->src ? -1 : x->src > y->src;
}

int ts_labelmap_parse(const char *text, const char *name, ts_labelmap **out)
{
    int err = 0;
    ts_labelmap *m = TS_CALLOC(1, sizeof *m);
    char *copy = strdup(text);
    *out = NULL;
    if (!m || !copy) TS_FAIL(TS_ERR_NOMEM, "label map");
    TS_CHECK(ts_path_check(name, sizeof m->path, "the label map's file name"));
    snprintf(m->path, sizeof m->path, "%s", name);
    int line = 0;
    for (char *l = copy, *next; l; l = next) {
        next = strchr(l, '\n');
        if (next) *next++ = '\0';
        line++;
        char *hash = strchr(l, '#');
        if (hash) *hash = '\0';
        char *p = l;
        while (isspace((unsigned char)*p)) p++;
        if (!*p) continue;
        char *end;
        errno = 0;
        long long src = strtoll(p, &end, 10);
        if (end == p || errno || !isspace((unsigned char)*end))
            TS_FAIL(TS_ERR_CONFIG, "%s:%d: expected 'source_value target_class [name]'", name, line);
        p = end;
        long long dst = strtoll(p, &end, 10);
        if (end == p || errno || (*end && !isspace((unsigned char)*end)))
            TS_FAIL(TS_ERR_CONFIG, "%s:%d: expected 'source_value target_class [name]'", name, line);
        if (dst < 0 || dst >= TS_IO_MAX_CLASSES)
            TS_FAIL(TS_ERR_CONFIG, "%s:%d: target class %lld is outside 0..%d", name, line, dst,
                    TS_IO_MAX_CLASSES - 1);
        p = end;
        while (isspace((unsigned char)*p)) p++;
        char *q = p + strlen(p);
        while (q > p && isspace((unsigned char)q[-1])) *--q = '\0';
        if (*p && !m->names[dst]) {
            m->names[dst] = strdup(p);
            if (!m->names[dst]) TS_FAIL(TS_ERR_NOMEM, "label map");
        }
        if (m->n == m->cap) {
            int nc = m->cap ? 2 * m->cap : 64;
            entry *ne = realloc(m->e, (size_t)nc * sizeof *ne);
            if (!ne) TS_FAIL(TS_ERR_NOMEM, "label map");
            m->e = ne;
            m->cap = nc;
        }
        m->e[m->n].src = src;
        m->e[m->n].dst = (int)dst;
        m->n++;
        if (dst + 1 > m->classes) m->classes = (int)dst + 1;
    }
    if (!m->n) TS_FAIL(TS_ERR_CONFIG, "%s: the label map has no entries", name);
    qsort(m->e, (size_t)m->n, sizeof *m->e, cmp_entry);
    for (int i = 1; i < m->n; i++)
        if (m->e[i].src == m->e[i - 1].src)
            TS_FAIL(TS_ERR_CONFIG, "%s: source value %lld is mapped twice", name, (long long)m->e[i].src);
    if (m->classes < 2) TS_FAIL(TS_ERR_CONFIG, "%s: the map yields only class 0 (needs at least 2 classes)", name);
    m->direct = TS_CALLOC(DIRECT, sizeof *m->direct);
    if (!m->direct) TS_FAIL(TS_ERR_NOMEM, "label map");
    for (int i = 0; i < DIRECT; i++) m->direct[i] = -1;
    for (int i = 0; i < m->n; i++)
        if (m->e[i].src >= 0 && m->e[i].src < DIRECT) m->direct[m->e[i].src] = (int16_t)m->e[i].dst;
    *out = m;
    m = NULL;
cleanup:
    free(copy);
    ts_labelmap_destroy(&m);
    return err;
}

int ts_labelmap_load(const char *path, ts_labelmap **out)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return TS_ERR(TS_ERR_IO, "cannot open label map %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    int err = 0;
    if (!buf) {
        fclose(f);
        return TS_ERR(TS_ERR_NOMEM, "label map");
    }
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                err = TS_ERR(TS_ERR_NOMEM, "label map");
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (!err && ferror(f)) err = TS_ERR(TS_ERR_IO, "cannot read label map %s", path);
    fclose(f);
    buf[n] = '\0';
    if (!err) err = ts_labelmap_parse(buf, path, out);
    free(buf);
    return err;
}

void ts_labelmap_destroy(ts_labelmap **mp)
{
    if (!mp || !*mp) return;
    ts_labelmap *m = *mp;
    for (int k = 0; k < TS_IO_MAX_CLASSES; k++) free(m->names[k]);
    free(m->e);
    free(m->direct);
    free(m);
    *mp = NULL;
}

int ts_labelmap_classes(const ts_labelmap *m) { return m->classes; }
const char *ts_labelmap_path(const ts_labelmap *m) { return m->path; }

const char *ts_labelmap_class_name(const ts_labelmap *m, int k)
{
    if (k < 0 || k >= TS_IO_MAX_CLASSES) return "";
    if (m->names[k]) return m->names[k];
    return k == 0 ? "background" : "";
}

int ts_labelmap_lookup(const ts_labelmap *m, int64_t source, int *target)
{
    if (source >= 0 && source < DIRECT) {
        int t = m->direct[source];
        if (t < 0) return 1;
        *target = t;
        return 0;
    }
    int lo = 0, hi = m->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (m->e[mid].src == source) {
            *target = m->e[mid].dst;
            return 0;
        }
        if (m->e[mid].src < source) lo = mid + 1;
        else hi = mid - 1;
    }
    return 1;
}
