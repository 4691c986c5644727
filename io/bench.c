/* The data-path benchmark (io/bench.h): what `tessera bench io` measures. */
#include "tsbuild.h"
#include "io/bench.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_ll(const char *v, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) return 1;
    *out = x;
    return 0;
}

int ts_io_bench_cfg_set(ts_io_bench_cfg *c, const char *key, const char *value, const char *where)
{
    if (!strncmp(key, "data.", 5)) return ts_config_set(c->cfg, key, value, where);
    if (!strcmp(key, "train.batch")) {
        if (parse_ll(value, &c->batch) || c->batch < 1 || c->batch > TS_LOADER_MAX_BATCH)
            return TS_ERR(TS_ERR_CONFIG, "%s: train.batch = '%s' (1..%d)", where, value, TS_LOADER_MAX_BATCH);
        return 0;
    }
    if (!strcmp(key, "train.seed")) {
        if (parse_ll(value, &c->seed) || c->seed < 0)
            return TS_ERR(TS_ERR_CONFIG, "%s: train.seed = '%s' (a non-negative integer)", where, value);
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

/* Collective. Phase 2: the loader, warm then steps batches. */
static int loader_phase(MPI_Comm comm, ts_dataset *ds, const ts_loader_opts *lopt, long long steps, long long warm,
                        ts_io_bench_result *r)
{
    int err = 0, lerr, rank, size;
    ts_loader *ld = NULL;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    lerr = ts_loader_create(ds, rank, size, lopt, &ld);
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
    r->samples_per_s = (double)steps * (double)r->batch * size / r->load_s;
cleanup:
    ts_loader_destroy(&ld);
    return err;
}

int ts_io_bench_run(MPI_Comm comm, const ts_io_bench_cfg *c, long long steps, long long warm, long long repeat,
                    ts_io_bench_result *r)
{
    int err = 0;
    ts_dataset *ds = NULL;
    memset(r, 0, sizeof *r);
    MPI_Comm_size(comm, &r->ranks);
    if (repeat < 1) repeat = 1;
    if (!ts_config_isset(c->cfg, "data.path"))
        TS_FAIL(TS_ERR_CONFIG, "bench io: data.path is not set in %s (or on the command line)", c->path);
    TS_CHECK(ts_config_check_ranks(c->cfg, comm));
    const char *path, *drv;
    TS_CHECK(ts_config_get_str(c->cfg, "data.path", &path));
    TS_CHECK(ts_config_get_str(c->cfg, "data.driver", &drv));
    snprintf(r->path, sizeof r->path, "%s", path);
    snprintf(r->driver, sizeof r->driver, "%s", drv);
    ts_dataset_opts dopt;
    ts_loader_opts lopt;
    TS_CHECK(ts_dataset_opts_from_config(c->cfg, &dopt));
    TS_CHECK(ts_loader_opts_from_config(c->cfg, &lopt));
    lopt.batch = (int)c->batch;
    lopt.seed = (uint64_t)c->seed;
    lopt.mode = TS_SAMPLER_TRAIN;
    r->repeat = (int)repeat;
    r->steps = steps;
    r->batch = c->batch;
    for (int k = 0; k < 3; k++) r->patch[k] = lopt.patch.patch[k];
    r->augment = lopt.patch.augment;
    r->prefetch = lopt.prefetch;
    TS_CHECK(ts_dataset_open(comm, path, &dopt, &ds));
    r->samples = ts_dataset_count(ds);
    TS_CHECK(read_phase(comm, ds, repeat, r));
    if (steps > 0) TS_CHECK(loader_phase(comm, ds, &lopt, steps, warm, r));
cleanup:
    ts_dataset_close(&ds);
    return err;
}

int ts_io_bench_write_json(const char *path, const ts_io_bench_result *r, const char *config)
{
    int err = 0;
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
    char *text = cJSON_Print(js);
    FILE *f = text ? fopen(path, "w") : NULL;
    if (!f || fprintf(f, "%s\n", text) < 0 || fclose(f) != 0) err = TS_ERR(TS_ERR_IO, "bench io: cannot write %s", path);
    free(text);
    cJSON_Delete(js);
    return err;
}
