/* Emergency state on a lost peer; see emergency.h. Owns the per-rank
 * files and their assembly into a checkpoint's items; it must not use MPI
 * (the communicator is broken when it writes) nor HDF5 (the main thread may
 * be inside a collective HDF5 call when the watchdog writes). */
#include "tsbuild.h"
#include "src/train/emergency.h"
#include "io/checkpoint.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define MAGIC "TSEMRG01"
#define MAX_STATE TS_ARENA_MAX_STATE

static struct {
    int armed;
    ts_emergency_cfg c;
    char dir[1024];
    const char *state_names[MAX_STATE];
    char names[MAX_STATE][32];
    float *bufs;                 /* the buffers after the committed step */
    volatile unsigned seq;       /* odd while the parameters change */
    volatile int64_t step, opt_step, sampler_position, ls_good;
    volatile double loss_scale;
    volatile int committed;      /* a step was committed (before: the initial state, step 0) */
} E;

int ts_emergency_setup(const ts_emergency_cfg *cfg)
{
    ts_emergency_teardown();
    E.c = *cfg;
    snprintf(E.dir, sizeof E.dir, "%s", cfg->dir);
    E.c.dir = E.dir;
    for (int s = 0; s < cfg->arena->nstate && s < MAX_STATE; s++) {
        snprintf(E.names[s], sizeof E.names[s], "%s", cfg->state_names[s]);
        E.state_names[s] = E.names[s];
    }
    E.c.state_names = E.state_names;
    E.bufs = malloc((cfg->arena->nbuf ? cfg->arena->nbuf : 1) * sizeof(float));
    if (!E.bufs) return TS_ERR(TS_ERR_NOMEM, "emergency state: a copy of the buffers");
    if (cfg->arena->nbuf) memcpy(E.bufs, cfg->arena->buffers, cfg->arena->nbuf * sizeof(float));
    E.seq = 0;
    E.step = 0;
    E.armed = 1;
    return 0;
}

void ts_emergency_begin_update(void)
{
    if (!E.armed) return;
    /* odd: changing. Only once per step: a step may change the parameters twice (local SGD's update and its
     * average), and a second increment would make the count even, "stable", while they change */
    if (!(E.seq & 1u)) __atomic_add_fetch(&E.seq, 1, __ATOMIC_SEQ_CST);
}

void ts_emergency_commit(int64_t step, int64_t opt_step, int64_t sampler_position, double loss_scale,
                         int64_t loss_scale_good)
{
    if (!E.armed) return;
    if (!(E.seq & 1u)) __atomic_add_fetch(&E.seq, 1, __ATOMIC_SEQ_CST); /* a commit without begin: a skipped step */
    const ts_arena *a = E.c.arena;
    if (a->nbuf) memcpy(E.bufs, a->buffers, a->nbuf * sizeof(float));
    E.step = step;
    E.opt_step = opt_step;
    E.sampler_position = sampler_position;
    E.loss_scale = loss_scale;
    E.ls_good = loss_scale_good;
    E.committed = 1;
    __atomic_add_fetch(&E.seq, 1, __ATOMIC_SEQ_CST); /* even: stable */
}

void ts_emergency_teardown(void)
{
    E.armed = 0;
    free(E.bufs);
    E.bufs = NULL;
}

/* write all of n bytes */
static int put(int fd, const void *p, size_t n, uLong *crc)
{
    const char *b = p;
    if (crc) *crc = crc32_z(*crc, p, n);
    while (n) {
        ssize_t k = write(fd, b, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int mkdir_p(const char *path)
{
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

/* the views this rank writes: value of entry i (buffers: the committed copy) and its optimizer states */
static const void *entry_data(int i, int s)
{
    const ts_arena *a = E.c.arena;
    const ts_param *p = &a->p[i];
    if (s < 0) return p->kind == TS_BUFFER ? (const void *)(E.bufs + p->offset) : (const void *)(a->params + p->offset);
    return a->state[s] + p->offset;
}


int ts_emergency_write(const char *why, const char *lost, double waited_s)
{
    if (!E.armed) return 1;
    const ts_arena *a = E.c.arena;
    const unsigned seq0 = __atomic_load_n(&E.seq, __ATOMIC_SEQ_CST);
    int partial = (seq0 & 1u) != 0;
    const int64_t step = E.step;
    char sdir[1100], path[1200], tmp[1220];
    int fd = -1, err = 0;
    char *hdr = NULL;
    cJSON *o = cJSON_CreateObject(), *ents;
    if (!o) return TS_ERR(TS_ERR_NOMEM, "emergency state");
    snprintf(sdir, sizeof sdir, "%s/step-%lld", E.dir, (long long)step);
    snprintf(path, sizeof path, "%s/rank-%d.bin", sdir, E.c.world_rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (mkdir_p(sdir)) TS_FAIL(TS_ERR_IO, "emergency state: cannot create %s: %s", sdir, strerror(errno));
    /* the entries: names and where their bytes lie after the header */
    ents = cJSON_AddArrayToObject(o, "entries");
    size_t off = 0;
    const int ns = E.c.state_sharded ? 0 : a->nstate;
    for (int s = -1; s < ns && !partial; s++)
        for (int i = E.c.e0; i < E.c.e1; i++) {
            const ts_param *p = &a->p[i];
            if (s >= 0 && p->kind != TS_PARAM) continue;
            char name[200];
            if (s < 0) snprintf(name, sizeof name, "/params/%s", p->name);
            else snprintf(name, sizeof name, "/optim/%s/%s", E.c.state_names[s], p->name);
            const size_t bytes = (size_t)p->numel * ts_dtype_size(p->dtype);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", name);
            cJSON_AddNumberToObject(e, "offset", (double)off);
            cJSON_AddNumberToObject(e, "bytes", (double)bytes);
            cJSON_AddItemToArray(ents, e);
            off += bytes;
        }
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddNumberToObject(o, "step", (double)step);
    cJSON_AddNumberToObject(o, "opt_step", (double)E.opt_step);
    cJSON_AddNumberToObject(o, "sampler_position", (double)E.sampler_position);
    cJSON_AddNumberToObject(o, "loss_scale", E.loss_scale);
    cJSON_AddNumberToObject(o, "loss_scale_good", (double)E.ls_good);
    cJSON_AddNumberToObject(o, "world_rank", E.c.world_rank);
    cJSON_AddNumberToObject(o, "world_size", E.c.world_size);
    cJSON *g = cJSON_AddArrayToObject(o, "grid"); /* dp index, dp, pp index, pp, sp index, sp */
    for (int k = 0; k < 6; k++) cJSON_AddItemToArray(g, cJSON_CreateNumber(E.c.grid[k]));
    char hx[32];
    snprintf(hx, sizeof hx, "%016llx", (unsigned long long)E.c.config_hash);
    cJSON_AddStringToObject(o, "config_hash", hx);
    snprintf(hx, sizeof hx, "%llu", (unsigned long long)E.c.seed);
    cJSON_AddStringToObject(o, "seed", hx);
    cJSON_AddNumberToObject(o, "global_batch", (double)E.c.global_batch);
    cJSON_AddNumberToObject(o, "lost_at", ts_wall_now() - (waited_s > 0 ? waited_s : 0));
    cJSON_AddStringToObject(o, "why", why ? why : "");
    cJSON_AddStringToObject(o, "lost", lost ? lost : "");
    if (E.c.state_sharded) cJSON_AddStringToObject(o, "state", "sharded (parallel.zero = 1): not kept");
    hdr = cJSON_PrintUnformatted(o);
    if (!hdr) TS_FAIL(TS_ERR_NOMEM, "emergency state header");
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) TS_FAIL(TS_ERR_IO, "emergency state: cannot create %s: %s", tmp, strerror(errno));
    uLong crc = crc32(0L, Z_NULL, 0);
    uint32_t len = (uint32_t)strlen(hdr);
    int bad = put(fd, MAGIC, 8, &crc) || put(fd, &len, sizeof len, &crc) || put(fd, hdr, len, &crc);
    for (int s = -1; s < ns && !partial && !bad; s++)
        for (int i = E.c.e0; i < E.c.e1 && !bad; i++) {
            const ts_param *p = &a->p[i];
            if (s >= 0 && p->kind != TS_PARAM) continue;
            bad = put(fd, entry_data(i, s), (size_t)p->numel * ts_dtype_size(p->dtype), &crc);
        }
    /* the parameters changed while they were copied: this file cannot say one step */
    if (!partial && __atomic_load_n(&E.seq, __ATOMIC_SEQ_CST) != seq0) {
        partial = 1;
        cJSON_SetNumberValue(cJSON_GetObjectItem(o, "step"), (double)step);
        if (ftruncate(fd, 0) || lseek(fd, 0, SEEK_SET) < 0) bad = 1;
        cJSON_DeleteItemFromObject(o, "entries");
        cJSON_AddArrayToObject(o, "entries");
        free(hdr);
        cJSON_AddBoolToObject(o, "partial", 1);
        hdr = cJSON_PrintUnformatted(o);
        if (!hdr) TS_FAIL(TS_ERR_NOMEM, "emergency state header");
        crc = crc32(0L, Z_NULL, 0);
        len = (uint32_t)strlen(hdr);
        bad = bad || put(fd, MAGIC, 8, &crc) || put(fd, &len, sizeof len, &crc) || put(fd, hdr, len, &crc);
    } else if (partial) {
        /* the header said entries would follow only when not partial: rewrite it marked */
        if (ftruncate(fd, 0) || lseek(fd, 0, SEEK_SET) < 0) bad = 1;
        free(hdr);
        cJSON_AddBoolToObject(o, "partial", 1);
        hdr = cJSON_PrintUnformatted(o);
        if (!hdr) TS_FAIL(TS_ERR_NOMEM, "emergency state header");
        crc = crc32(0L, Z_NULL, 0);
        len = (uint32_t)strlen(hdr);
        bad = bad || put(fd, MAGIC, 8, &crc) || put(fd, &len, sizeof len, &crc) || put(fd, hdr, len, &crc);
    }
    uint32_t c32 = (uint32_t)crc;
    bad = bad || put(fd, &c32, sizeof c32, NULL) || fsync(fd);
    if (close(fd) && !bad) bad = 1;
    fd = -1;
    if (bad) TS_FAIL(TS_ERR_IO, "emergency state: writing %s failed: %s", tmp, strerror(errno));
    if (rename(tmp, path)) TS_FAIL(TS_ERR_IO, "emergency state: cannot rename %s: %s", tmp, strerror(errno));
    int dfd = open(sdir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    fprintf(stderr, "tessera: rank %d: emergency state of step %lld%s written to %s\n", E.c.world_rank,
            (long long)step, partial ? " (partial: the parameters were being updated)" : "", path);
cleanup:
    if (err) {
        fprintf(stderr, "tessera: error (rank %d): %s\n", E.c.world_rank, ts_err_message());
        if (fd >= 0) close(fd);
        unlink(tmp);
    }
    free(hdr);
    cJSON_Delete(o);
    return err;
}

/* ---- assembly ---- */
typedef struct rank_file {
    char path[1300];
    unsigned char *data; /* the whole file */
    size_t size, body;   /* body: where the entries' bytes start */
    cJSON *hdr;
} rank_file;

static void rank_file_free(rank_file *r)
{
    free(r->data);
    cJSON_Delete(r->hdr);
    memset(r, 0, sizeof *r);
}

/* 0: read and checked; else a reason in why */
static int rank_file_read(const char *path, rank_file *r, char *why, size_t n)
{
    memset(r, 0, sizeof *r);
    snprintf(r->path, sizeof r->path, "%s", path);
    FILE *f = fopen(path, "rb");
    if (!f) return snprintf(why, n, "%s: cannot open", path), 1;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    r->data = sz > 16 ? malloc((size_t)sz) : NULL;
    int ok = r->data && fread(r->data, 1, (size_t)sz, f) == (size_t)sz;
    fclose(f);
    if (!ok) return snprintf(why, n, "%s: unreadable or too short", path), 1;
    r->size = (size_t)sz;
    uint32_t c32, len;
    memcpy(&c32, r->data + r->size - 4, 4);
    if (memcmp(r->data, MAGIC, 8) || (uint32_t)crc32_z(crc32(0L, Z_NULL, 0), r->data, r->size - 4) != c32)
        return snprintf(why, n, "%s: not an emergency state file or damaged (checksum)", path), 1;
    memcpy(&len, r->data + 8, 4);
    if (12 + (size_t)len > r->size - 4) return snprintf(why, n, "%s: damaged header", path), 1;
    char *h = malloc((size_t)len + 1);
    if (!h) return snprintf(why, n, "out of memory"), 1;
    memcpy(h, r->data + 12, len);
    h[len] = '\0';
    r->hdr = cJSON_Parse(h);
    free(h);
    r->body = 12 + (size_t)len;
    if (!r->hdr) return snprintf(why, n, "%s: damaged header", path), 1;
    return 0;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(x) ? x->valuedouble : 0;
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* one step's directory: every rank file, and whether they cover the items */
static int try_step(const char *dir, int64_t step, ts_ckpt_item *items, int n, ts_emergency_meta *m,
                    ts_emergency_found *f)
{
    char sdir[1100];
    snprintf(sdir, sizeof sdir, "%s/step-%lld", dir, (long long)step);
    DIR *d = opendir(sdir);
    if (!d) return snprintf(f->why, sizeof f->why, "%s: cannot open", sdir), 1;
    rank_file *rf = NULL;
    int nf = 0, cap = 0, covered = 0, missing = -1, rc = 1;
    char why[400] = "";
    f->files = f->partial = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int r;
        char tail[8];
        if (sscanf(e->d_name, "rank-%d.bi%1s", &r, tail) != 2 || strcmp(e->d_name + strlen(e->d_name) - 4, ".bin")) continue;
        if (nf == cap) {
            rank_file *x = realloc(rf, sizeof *rf * (size_t)(cap = cap ? 2 * cap : 8));
            if (!x) break;
            rf = x;
        }
        char path[1300];
        snprintf(path, sizeof path, "%s/%s", sdir, e->d_name);
        if (rank_file_read(path, &rf[nf], why, sizeof why)) {
            fprintf(stderr, "tessera: note: emergency state: %s (skipped)\n", why);
            rank_file_free(&rf[nf]);
            continue;
        }
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(rf[nf].hdr, "partial");
        f->files++;
        if (cJSON_IsTrue(pt)) f->partial++;
        nf++;
    }
    closedir(d);
    if (nf == 0) {
        snprintf(f->why, sizeof f->why, "%s holds no readable rank file", sdir);
        goto done;
    }
    /* every item from some complete file */
    for (int i = 0; i < n; i++) {
        int got = 0;
        for (int k = 0; k < nf && !got; k++) {
            const cJSON *e;
            cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(rf[k].hdr, "entries"))
            {
                const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
                if (!cJSON_IsString(nm) || strcmp(nm->valuestring, items[i].name)) continue;
                const size_t off = (size_t)num(e, "offset"), bytes = (size_t)num(e, "bytes");
                if (bytes != ts_tensor_bytes(&items[i].t) || rf[k].body + off + bytes > rf[k].size - 4) continue;
                if (items[i].t.data) memcpy(items[i].t.data, rf[k].data + rf[k].body + off, bytes);
                got = 1;
                break;
            }
        }
        if (got) covered++;
        else if (missing < 0) missing = i;
    }
    const cJSON *h = rf[0].hdr;
    f->world_size = (int)num(h, "world_size");
    f->lost_at = num(h, "lost_at");
    f->global_batch = (int64_t)num(h, "global_batch");
    const cJSON *lo = cJSON_GetObjectItemCaseSensitive(h, "lost");
    snprintf(f->lost, sizeof f->lost, "%s", cJSON_IsString(lo) ? lo->valuestring : "");
    if (missing >= 0) {
        const cJSON *st = NULL;
        for (int k = 0; k < nf && !st; k++) st = cJSON_GetObjectItemCaseSensitive(rf[k].hdr, "state");
        snprintf(f->why, sizeof f->why,
                 "the emergency state of step %lld (%d rank file%s of %d ranks, %d partial) lacks %d of %d tensors, "
                 "first %s%s%s", (long long)step, f->files, f->files == 1 ? "" : "s", f->world_size, f->partial,
                 n - covered, n, items[missing].name, cJSON_IsString(st) ? ": the optimizer state was " : "",
                 cJSON_IsString(st) ? st->valuestring : "");
        goto done;
    }
    m->step = step;
    m->opt_step = (int64_t)num(h, "opt_step");
    m->sampler_position = (int64_t)num(h, "sampler_position");
    m->loss_scale = num(h, "loss_scale");
    m->loss_scale_good = (int64_t)num(h, "loss_scale_good");
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(h, "config_hash"), *sd = cJSON_GetObjectItemCaseSensitive(h, "seed");
    m->config_hash = cJSON_IsString(ch) ? strtoull(ch->valuestring, NULL, 16) : 0;
    m->seed = cJSON_IsString(sd) ? strtoull(sd->valuestring, NULL, 10) : 0;
    f->step = step;
    rc = 0;
done:
    for (int k = 0; k < nf; k++) rank_file_free(&rf[k]);
    free(rf);
    return rc;
}

/* the lost peer and the time of the loss from the first readable file of step f->stale */
static void stale_loss(const char *dir, ts_emergency_found *f)
{
    char sdir[1100], path[1400], why[400];
    snprintf(sdir, sizeof sdir, "%s/step-%lld", dir, (long long)f->stale);
    DIR *d = opendir(sdir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name + (strlen(e->d_name) > 4 ? strlen(e->d_name) - 4 : 0), ".bin")) continue;
        rank_file r;
        snprintf(path, sizeof path, "%s/%s", sdir, e->d_name);
        if (rank_file_read(path, &r, why, sizeof why) == 0) {
            const cJSON *lo = cJSON_GetObjectItemCaseSensitive(r.hdr, "lost");
            snprintf(f->lost, sizeof f->lost, "%s", cJSON_IsString(lo) ? lo->valuestring : "");
            f->lost_at = num(r.hdr, "lost_at");
            rank_file_free(&r);
            break;
        }
        rank_file_free(&r);
    }
    closedir(d);
}

int ts_emergency_assemble(const char *dir, int64_t after, ts_ckpt_item *items, int n, ts_emergency_meta *m,
                          ts_emergency_found *f)
{
    memset(f, 0, sizeof *f);
    memset(m, 0, sizeof *m);
    f->step = -1;
    f->stale = -1;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : TS_ERR(TS_ERR_IO, "%s: cannot read the emergency states: %s", dir, strerror(errno));
    int64_t steps[256];
    int ns = 0;
    f->stale = -1;
    for (struct dirent *e; (e = readdir(d)) && ns < 256;) {
        long long s;
        char c;
        if (sscanf(e->d_name, "step-%lld%c", &s, &c) != 1) continue;
        if (s > after) steps[ns++] = s;
        else if (s > f->stale) f->stale = s;
    }
    closedir(d);
    qsort(steps, (size_t)ns, sizeof *steps, cmp_desc);
    char first_why[512] = "";
    for (int i = 0; i < ns; i++) {
        if (try_step(dir, steps[i], items, n, m, f) == 0) return 0;
        if (!first_why[0]) snprintf(first_why, sizeof first_why, "%s", f->why);
    }
    f->step = -1;
    snprintf(f->why, sizeof f->why, "%s", first_why);
    if (ns == 0 && f->stale >= 0) stale_loss(dir, f); /* a loss right after a checkpoint: who and when */
    else f->stale = -1;
    return 0;
}

int ts_emergency_remove_upto(const char *dir, int64_t upto)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int64_t steps[256];
    int ns = 0, err = 0;
    for (struct dirent *e; (e = readdir(d)) && ns < 256;) {
        long long s;
        char c;
        if (sscanf(e->d_name, "step-%lld%c", &s, &c) == 1 && s <= upto) steps[ns++] = s;
    }
    closedir(d);
    for (int i = 0; i < ns && !err; i++) err = ts_emergency_remove(dir, steps[i]);
    return err;
}

int ts_emergency_remove(const char *dir, int64_t step)
{
    char sdir[1100], path[1400];
    snprintf(sdir, sizeof sdir, "%s/step-%lld", dir, (long long)step);
    DIR *d = opendir(sdir);
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", sdir, e->d_name);
        unlink(path);
    }
    closedir(d);
    if (rmdir(sdir)) return TS_ERR(TS_ERR_IO, "%s: cannot remove: %s", sdir, strerror(errno));
    return 0;
}
