/* The data-path benchmark (src/bench/bench_io.h): what `tessera bench io`
 * measures and writes. Owns the measurement of the loader on the layout's
 * groups (parallel.sp, which io/ may not form), the patch dump and the
 * JSON; the report is printed by src/cli/bench_io.c. */
#include "tsbuild.h"
#include "src/bench/bench_io.h"
#include "src/bench/bench_json.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "io/nifti.h"
#include "src/core/error.h"
#include "src/core/timer.h"
#include "src/parallel/layout.h"
#include "src/parallel/spatial.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ts_io_bench_cfg_set(ts_io_bench_cfg *c, const char *key, const char *value, const char *where)
{
    if (!strncmp(key, "data.", 5)) return ts_config_set(c->cfg, key, value, where);
    if (!strcmp(key, "train.batch")) {
        if (ts_parse_i64(value, &c->batch) || c->batch < 1 || c->batch > TS_LOADER_MAX_BATCH)
            return TS_ERR(TS_ERR_CONFIG, "%s: train.batch = '%s' (1..%d)", where, value, TS_LOADER_MAX_BATCH);
        return 0;
    }
    if (!strcmp(key, "train.seed")) {
        if (ts_parse_i64(value, &c->seed) || c->seed < 0)
            return TS_ERR(TS_ERR_CONFIG, "%s: train.seed = '%s' (a non-negative integer)", where, value);
        return 0;
    }
    if (!strcmp(key, "parallel.sp")) {
        if (ts_parse_i64(value, &c->sp) || c->sp < 1 || c->sp > 1 << 20)
            return TS_ERR(TS_ERR_CONFIG, "%s: parallel.sp = '%s' (a positive integer)", where, value);
        return 0;
    }
    if (!strcmp(key, "parallel.sp_dims")) {
        if (strlen(value) >= sizeof c->sp_dims)
            return TS_ERR(TS_ERR_CONFIG, "%s: parallel.sp_dims = '%s' is too long", where, value);
        snprintf(c->sp_dims, sizeof c->sp_dims, "%s", value);
        return 0;
    }
    return -1; /* not ours */
}

static int ini_cb(void *user, const char *section, const char *name, const char *value)
{
    ts_io_bench_cfg *c = user;
    char key[256];
    if (c->err) return 0;
    snprintf(key, sizeof key, "%s.%s", section, name);
    int r = ts_io_bench_cfg_set(c, key, value, c->path);
    if (r > 0 || (r < 0 && !strcmp(section, "data"))) {
        c->err = r > 0 ? r : TS_ERR(TS_ERR_CONFIG, "%s: unknown key %s", c->path, key);
        return 0;
    }
    return 1;
}

int ts_io_bench_cfg_load(const char *path, ts_io_bench_cfg *c)
{
    static const ts_cfg_key *const tables[] = {ts_io_config_keys, NULL};
    memset(c, 0, sizeof *c);
    c->batch = 2;
    c->sp = 1;
    snprintf(c->sp_dims, sizeof c->sp_dims, "auto");
    c->path = path;
    TS_TRY(ts_config_create(tables, &c->cfg));
    errno = 0;
    int pr = ini_parse(path, ini_cb, c);
    if (c->err) return c->err; /* its message names the file and the key */
    if (pr < 0) return TS_ERR(TS_ERR_IO, "cannot read %s: %s", path, strerror(errno ? errno : ENOENT));
    if (pr > 0) return TS_ERR(TS_ERR_CONFIG, "%s:%d: syntax error", path, pr);
    return 0;
}

void ts_io_bench_cfg_free(ts_io_bench_cfg *c)
{
    ts_config_destroy(&c->cfg);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Collective. Phase 1: whole samples, this rank's share, repeat times. */
static int read_phase(MPI_Comm comm, ts_dataset *ds, long long repeat, ts_io_bench_result *r)
{
    int err = 0, lerr = 0, rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const int64_t N = ts_dataset_count(ds);
    size_t maxv = 0;
    for (int64_t i = 0; i < N; i++) {
        ts_sample_info in;
        ts_dataset_info(ds, i, &in);
        size_t v = (size_t)(in.shape[1] * in.shape[2] * in.shape[3]);
        if ((size_t)in.shape[0] * v > maxv) maxv = (size_t)in.shape[0] * v;
    }
    float *img = TS_ALIGNED_ALLOC(maxv * sizeof(float));
    uint8_t *lab = TS_ALIGNED_ALLOC(maxv);
    double *times = TS_CALLOC((size_t)repeat, sizeof(double));
    if (!img || !lab || !times) lerr = TS_ERR(TS_ERR_NOMEM, "bench io buffers");
    TS_CHECK(ts_err_agree(comm, lerr));
    uint64_t bytes0 = ts_dataset_bytes_read(ds), mybytes = 0, allbytes = 0;
    for (long long k = 0; k < repeat; k++) {
        TS_MPI(MPI_Barrier(comm));
        double t0 = ts_time_now();
        for (int64_t i = rank; i < N && !lerr; i += size) lerr = ts_dataset_read_sample(ds, i, img, lab);
        double dt = ts_time_now() - t0;
        TS_CHECK(ts_err_agree(comm, lerr));
        TS_MPI(MPI_Allreduce(&dt, &times[k], 1, MPI_DOUBLE, MPI_MAX, comm));
        if (k == 0) mybytes = ts_dataset_bytes_read(ds) - bytes0;
    }
    TS_MPI(MPI_Allreduce(&mybytes, &allbytes, 1, MPI_UINT64_T, MPI_SUM, comm));
    qsort(times, (size_t)repeat, sizeof *times, cmp_double);
    r->bytes = allbytes;
    r->read_s = times[repeat / 2];
    r->read_GBps = (double)allbytes / r->read_s / 1e9;
    r->read_samples_per_s = N / r->read_s;
cleanup:
    free(img);
    free(lab);
    free(times);
    return err;
}

/* Collective. Phase 2: the loader (replica dprank of dpsize), warm then steps batches. */
static int loader_phase(MPI_Comm comm, ts_dataset *ds, const ts_loader_opts *lopt, int dprank, int dpsize,
                        long long steps, long long warm, ts_io_bench_result *r)
{
    int err = 0, lerr;
    ts_loader *ld = NULL;
    lerr = ts_loader_create(ds, dprank, dpsize, lopt, &ld);
    TS_CHECK(ts_err_agree(comm, lerr));
    const ts_batch *b = NULL;
    for (long long s = 0; s < warm && !lerr; s++) lerr = ts_loader_next(ld, &b);
    TS_CHECK(ts_err_agree(comm, lerr));
    TS_MPI(MPI_Barrier(comm));
    double w0 = ts_loader_wait_seconds(ld), t0 = ts_time_now();
    for (long long s = 0; s < steps && !lerr; s++) lerr = ts_loader_next(ld, &b);
    double dt = ts_time_now() - t0;
    r->wait_s = ts_loader_wait_seconds(ld) - w0;
    TS_CHECK(ts_err_agree(comm, lerr));
    TS_MPI(MPI_Allreduce(&dt, &r->load_s, 1, MPI_DOUBLE, MPI_MAX, comm));
    r->samples_per_s = (double)steps * (double)r->batch * dpsize / r->load_s;
cleanup:
    ts_loader_destroy(&ld);
    return err;
}

/* --dump-patch: the first batch of the loader, each patch gathered from
 * the boxes of its spatial group (rank 0 of the group writes it).
 * Collective on the group; errors are the caller's to agree. */
static int dump_patches(ts_loader *ld, MPI_Comm grp, const int64_t patch[3], const int64_t blo[3],
                        const int64_t bsz[3], int64_t C, int dprank, int dpsize, const char *dir)
{
    const ts_batch *b = NULL;
    int err = 0, g = 0, G = 1;
    float *all = NULL, *img = NULL;
    uint8_t *lab = NULL, *lall = NULL;
    int64_t *boxes = NULL;
    TS_TRY(ts_loader_next(ld, &b));
    if (grp != MPI_COMM_NULL) {
        TS_MPI_TRY(MPI_Comm_rank(grp, &g));
        TS_MPI_TRY(MPI_Comm_size(grp, &G));
    }
    const int64_t nvs = bsz[0] * bsz[1] * bsz[2], nvp = patch[0] * patch[1] * patch[2];
    const int B = (int)b->image.shape[0];
    if (g == 0) {
        all = malloc((size_t)(G * C * nvs) * sizeof(float));
        lall = malloc((size_t)(G * nvs));
        img = malloc((size_t)(C * nvp) * sizeof(float));
        lab = malloc((size_t)nvp);
        boxes = malloc((size_t)G * 3 * sizeof(int64_t));
        if (!all || !lall || !img || !lab || !boxes) err = TS_ERR(TS_ERR_NOMEM, "bench io: --dump-patch buffers");
    }
    if (G > 1) TS_CHECK(ts_err_agree(grp, err));
    else if (err) goto cleanup;
    for (int s = 0; s < B; s++) {
        const float *mine = (const float *)b->image.data + (int64_t)s * C * nvs;
        const uint8_t *lmine = (const uint8_t *)b->label.data + (int64_t)s * nvs;
        if (G > 1) {
            TS_MPI(MPI_Gather(mine, (int)(C * nvs), MPI_FLOAT, all, (int)(C * nvs), MPI_FLOAT, 0, grp));
            TS_MPI(MPI_Gather(lmine, (int)nvs, MPI_UINT8_T, lall, (int)nvs, MPI_UINT8_T, 0, grp));
            TS_MPI(MPI_Gather(blo, 3, MPI_INT64_T, boxes, 3, MPI_INT64_T, 0, grp));
        } else {
            memcpy(all, mine, (size_t)(C * nvs) * sizeof(float));
            memcpy(lall, lmine, (size_t)nvs);
            memcpy(boxes, blo, 3 * sizeof(int64_t));
        }
        if (g != 0 || b->sample[s] < 0) continue;
        for (int r = 0; r < G; r++) /* every box into its place in the patch */
            for (int64_t c = 0; c < C; c++)
                for (int64_t z = 0; z < bsz[0]; z++)
                    for (int64_t y = 0; y < bsz[1]; y++) {
                        const int64_t *o = boxes + 3 * r;
                        const int64_t src = ((z * bsz[1]) + y) * bsz[2], dst = ((o[0] + z) * patch[1] + o[1] + y) * patch[2] + o[2];
                        memcpy(img + c * nvp + dst, all + (r * C + c) * nvs + src, (size_t)bsz[2] * sizeof(float));
                        if (c == 0) memcpy(lab + dst, lall + r * nvs + src, (size_t)bsz[2]);
                    }
        /* the sampler's stream position of slot s of this replica */
        const long long pos = (long long)(b->position + (int64_t)s * dpsize + dprank);
        ts_nifti_geom geo;
        memset(&geo, 0, sizeof geo);
        geo.dim[0] = patch[2];
        geo.dim[1] = patch[1];
        geo.dim[2] = patch[0];
        geo.dim[3] = C;
        for (int k = 0; k < 3; k++) geo.pixdim[k] = 1;
        for (int k = 0; k < 4; k++) geo.sform[5 * k] = geo.qform[5 * k] = 1;
        geo.sform_code = geo.qform_code = 1;
        char path[4096];
        snprintf(path, sizeof path, "%s/patch-%06lld_image.nii", dir, pos);
        if (!err) err = ts_nifti_write(path, &geo, TS_NIFTI_FLOAT32, 1, img);
        geo.dim[3] = 1;
        snprintf(path, sizeof path, "%s/patch-%06lld_label.nii", dir, pos);
        if (!err) err = ts_nifti_write(path, &geo, TS_NIFTI_UINT8, 1, lab);
    }
cleanup:
    free(all);
    free(lall);
    free(img);
    free(lab);
    free(boxes);
    return err;
}

/* the options of a run: dataset and loader from the config, and with
 * parallel.sp > 1 this rank's spatial group and box (spg: destroy it) */
typedef struct {
    ts_dataset_opts dopt;
    ts_loader_opts lopt;
    ts_layout *L;       /* dp x 1 x sp, as training builds it */
    int dprank, dpsize;
    int64_t blo[3], bsz[3];
} run_setup;

/* Collective on comm; errors agreed. The layout is the caller's to destroy
 * (run_free). */
static int setup_run(MPI_Comm comm, const ts_io_bench_cfg *c, run_setup *s)
{
    memset(s, 0, sizeof *s);
    if (!ts_config_isset(c->cfg, "data.path"))
        return TS_ERR(TS_ERR_CONFIG, "bench io: data.path is not set in %s (or on the command line)", c->path);
    TS_TRY(ts_config_check_ranks(c->cfg, comm));
    TS_TRY(ts_dataset_opts_from_config(c->cfg, &s->dopt));
    TS_TRY(ts_loader_opts_from_config(c->cfg, &s->lopt));
    s->lopt.batch = (int)c->batch;
    s->lopt.seed = (uint64_t)c->seed;
    s->lopt.mode = TS_SAMPLER_TRAIN;
    /* spatial groups of sp ranks, one data-parallel replica each: the grid training uses */
    ts_layout_spec spec;
    ts_layout_spec_default(TS_LAYOUT_IO, s->lopt.patch.patch, 1, &spec);
    spec.sp = (int)c->sp;
    snprintf(spec.sp_dims, sizeof spec.sp_dims, "%s", c->sp_dims);
    TS_TRY(ts_layout_create(comm, &spec, &s->L));
    s->dpsize = s->L->dp_size;
    s->dprank = s->L->dp_rank;
    for (int k = 0; k < 3; k++) s->bsz[k] = s->lopt.patch.patch[k];
    if (c->sp > 1) {
        memcpy(s->blo, s->L->box_lo, sizeof s->blo);
        memcpy(s->bsz, s->L->box, sizeof s->bsz);
        memcpy(s->lopt.sub_lo, s->blo, sizeof s->blo);
        memcpy(s->lopt.sub_size, s->bsz, sizeof s->bsz);
        s->lopt.group = ts_spatial_comm(s->L->spatial);
        memcpy(s->dopt.box_hint, s->bsz, sizeof s->dopt.box_hint);
    }
    return 0;
}

static void run_free(run_setup *s)
{
    ts_layout_destroy(&s->L);
}

int ts_io_bench_dump(MPI_Comm comm, const ts_io_bench_cfg *c, const char *dir, long long *n)
{
    int err = 0, lerr = 0;
    ts_dataset *ds = NULL;
    ts_loader *ld = NULL;
    run_setup s = {0};
    const char *path;
    struct stat st; /* before any work, on every rank (the group's first rank writes) */
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(dir, W_OK) != 0)
        lerr = TS_ERR(TS_ERR_ARG, "bench io: --dump-patch %s is not a writable directory", dir);
    TS_CHECK(ts_err_agree(comm, lerr));
    TS_CHECK(setup_run(comm, c, &s));
    TS_CHECK(ts_config_get_str(c->cfg, "data.path", &path));
    TS_CHECK(ts_dataset_open(comm, path, &s.dopt, &ds));
    lerr = ts_loader_create(ds, s.dprank, s.dpsize, &s.lopt, &ld);
    TS_CHECK(ts_err_agree(comm, lerr));
    lerr = dump_patches(ld, c->sp > 1 ? s.lopt.group : MPI_COMM_NULL, s.lopt.patch.patch, s.blo, s.bsz,
                        ts_dataset_channels(ds), s.dprank, s.dpsize, dir);
    TS_CHECK(ts_err_agree(comm, lerr));
    *n = c->batch * s.dpsize;
cleanup:
    ts_loader_destroy(&ld);
    ts_dataset_close(&ds);
    run_free(&s);
    return err;
}

int ts_io_bench_run(MPI_Comm comm, const ts_io_bench_cfg *c, long long steps, long long warm, long long repeat,
                    ts_io_bench_result *r)
{
    int err = 0;
    ts_dataset *ds = NULL;
    run_setup s = {0};
    memset(r, 0, sizeof *r);
    MPI_Comm_size(comm, &r->ranks);
    if (repeat < 1) repeat = 1;
    TS_CHECK(setup_run(comm, c, &s));
    const char *path, *drv;
    TS_CHECK(ts_config_get_str(c->cfg, "data.path", &path));
    TS_CHECK(ts_config_get_str(c->cfg, "data.driver", &drv));
    snprintf(r->path, sizeof r->path, "%s", path);
    snprintf(r->driver, sizeof r->driver, "%s", drv);
    r->repeat = (int)repeat;
    r->steps = steps;
    r->batch = c->batch;
    r->replicas = s.dpsize;
    for (int k = 0; k < 3; k++) r->patch[k] = s.lopt.patch.patch[k];
    r->augment = s.lopt.patch.augment;
    r->prefetch = s.lopt.prefetch;
    TS_CHECK(ts_dataset_open(comm, path, &s.dopt, &ds));
    r->samples = ts_dataset_count(ds);
    TS_CHECK(read_phase(comm, ds, repeat, r));
    if (steps > 0) TS_CHECK(loader_phase(comm, ds, &s.lopt, s.dprank, s.dpsize, steps, warm, r));
cleanup:
    ts_dataset_close(&ds);
    run_free(&s);
    return err;
}

int ts_io_bench_write_json(const char *path, const ts_io_bench_result *r, const char *config)
{
    cJSON *js = cJSON_CreateObject();
    if (!js) return TS_ERR(TS_ERR_NOMEM, "bench io: JSON");
    cJSON_AddNumberToObject(js, "samples_per_s", r->samples_per_s);
    cJSON_AddNumberToObject(js, "read_GBps", r->read_GBps);
    cJSON_AddNumberToObject(js, "bytes", (double)r->bytes);
    cJSON_AddNumberToObject(js, "read_s", r->read_s);
    cJSON_AddNumberToObject(js, "read_samples_per_s", r->read_samples_per_s);
    cJSON_AddNumberToObject(js, "ranks", r->ranks);
    cJSON_AddNumberToObject(js, "batch", (double)r->batch);
    cJSON *p = cJSON_AddArrayToObject(js, "patch");
    for (int k = 0; k < 3; k++) cJSON_AddItemToArray(p, cJSON_CreateNumber((double)r->patch[k]));
    cJSON_AddNumberToObject(js, "steps", (double)r->steps);
    cJSON_AddNumberToObject(js, "prefetch", r->prefetch);
    cJSON_AddBoolToObject(js, "augment", r->augment);
    cJSON_AddStringToObject(js, "driver", r->driver);
    cJSON_AddNumberToObject(js, "samples", (double)r->samples);
    cJSON_AddStringToObject(js, "config", config);
    return ts_bench_json_write(js, path, "bench io");
}
