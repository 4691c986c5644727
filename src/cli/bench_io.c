/* tessera bench io: the data path of a config, in two timed phases run in
 * one invocation: (1) read: every rank reads its share of the samples whole
 * (raw chunks, checksums verified), R repetitions, median -> read_GBps;
 * (2) loader: the configured loader (patches, augmentation, normalisation,
 * prefetch thread) delivers batches as fast as it can -> samples_per_s.
 * Reads the [data] section of CONFIG (and train.batch, train.seed,
 * parallel.sp, parallel.sp_dims); other sections are ignored here (they
 * belong to `tessera train`). With parallel.sp = S the ranks form groups of
 * S consecutive ranks, each rank loading its box of every patch as in
 * training. --dump-patch DIR writes the first batch's augmented patches as
 * NIfTI files instead of timing (docs/medical.md, "Looking at a patch"). */
#include "tsbuild.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "io/nifti.h"
#include "src/cli/cli.h"
#include "src/core/config.h"
#include "src/core/error.h"
#include "src/core/timer.h"
#include "src/parallel/spatial.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void help(void)
{
    printf("usage: tessera bench io CONFIG [data.key=value ...] [train.batch=B] [--steps N] [--warmup W]\n"
           "                        [--repeat R] [--json FILE] [--dump-patch DIR]\n\n"
           "Times the data path of CONFIG (its [data] section, train.batch (default 2), train.seed) on the\n"
           "ranks of the job, two phases in one run:\n"
           "  read    every rank reads its share of the samples whole (all chunks, checksums verified),\n"
           "          R repetitions (default 3, median): read_GBps = bytes read by all ranks / time\n"
           "  loader  the configured loader (data.patch patches, augmentation, normalisation, data.prefetch\n"
           "          thread) delivers W warm-up (default 3) then N batches (default 20) as fast as it can:\n"
           "          samples_per_s = N * batch * ranks / time (0 = phase skipped with --steps 0)\n"
           "JSON (--json): samples_per_s, read_GBps, bytes (read by one repetition), read_s, read_samples_per_s,\n"
           "ranks, batch, patch, steps, prefetch, augment, driver, samples, config.\n"
           "parallel.sp=S (and parallel.sp_dims, as in training): groups of S consecutive ranks share each\n"
           "patch, every rank loading its box of it (the job's ranks must be a multiple of S).\n"
           "--dump-patch DIR: instead of timing, writes the first batch's training patches (train.batch per\n"
           "replica, augmented as configured) to DIR/patch-P_image.nii (float32, channels along t) and\n"
           "DIR/patch-P_label.nii (uint8), P the sample's stream position (6 digits): the same files whatever\n"
           "the number of ranks and parallel.sp, for a seed. DIR must exist.\n\ndata keys:\n");
    static const ts_cfg_key *const tables[] = {ts_io_config_keys, NULL};
    ts_config *c = NULL;
    if (!ts_config_create(tables, &c)) ts_config_print_help(c, stdout);
    ts_config_destroy(&c);
}

typedef struct {
    ts_config *cfg;
    const char *path;
    long long batch, seed, sp;
    char sp_dims[64];
    int err;
} ini_ctx;

static int parse_ll(const char *v, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end) return 1;
    *out = x;
    return 0;
}

static int set_key(ini_ctx *c, const char *key, const char *value, const char *where)
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
    if (!strcmp(key, "parallel.sp")) {
        if (parse_ll(value, &c->sp) || c->sp < 1 || c->sp > 1 << 20)
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

static int ini_cb(void *user, const char *section, const char *name, const char *value)
{
    ini_ctx *c = user;
    char key[256];
    if (c->err) return 0;
    snprintf(key, sizeof key, "%s.%s", section, name);
    int r = set_key(c, key, value, c->path);
    if (r > 0 || (r < 0 && !strcmp(section, "data"))) {
        c->err = r > 0 ? r : TS_ERR(TS_ERR_CONFIG, "%s: unknown key %s", c->path, key);
        return 0;
    }
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int ts_cli_bench_io(int argc, char **argv)
{
    int err = 0, lerr = 0;
    static const ts_cfg_key *const tables[] = {ts_io_config_keys, NULL};
    ini_ctx ctx = {.batch = 2, .seed = 0, .sp = 1, .sp_dims = "auto"};
    ts_spatial *spg = NULL;
    const char *dump = NULL;
    ts_dataset *ds = NULL;
    ts_loader *ld = NULL;
    float *img = NULL;
    uint8_t *lab = NULL;
    double *times = NULL;
    cJSON *js = NULL;
    const char *json = NULL;
    long long steps = 20, warm = 3, repeat = 3;
    const int rank = ts_cli_rank(), size = ts_cli_size();
    if (argc < 2 || ts_cli_wants_help(argc, argv)) {
        if (rank == 0) help();
        return argc < 2 ? TS_ERR(TS_ERR_ARG, "bench io: CONFIG is required") : 0;
    }
    TS_CHECK(ts_config_create(tables, &ctx.cfg));
    ctx.path = argv[1];
    errno = 0;
    int pr = ini_parse(argv[1], ini_cb, &ctx);
    if (ctx.err) TS_FAIL(ctx.err, "%s", ts_err_message());
    if (pr < 0) TS_FAIL(TS_ERR_IO, "cannot read %s: %s", argv[1], strerror(errno ? errno : ENOENT));
    if (pr > 0) TS_FAIL(TS_ERR_CONFIG, "%s:%d: syntax error", argv[1], pr);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long *dst = !strcmp(a, "--steps") ? &steps : !strcmp(a, "--warmup") ? &warm
                         : !strcmp(a, "--repeat") ? &repeat : NULL;
        if (dst || !strcmp(a, "--json") || !strcmp(a, "--dump-patch")) {
            if (!v) TS_FAIL(TS_ERR_ARG, "bench io: %s needs a value", a);
            i++;
            if (!dst && a[2] == 'j') json = v;
            else if (!dst) dump = v;
            else if (parse_ll(v, dst) || *dst < 0) TS_FAIL(TS_ERR_ARG, "bench io: %s %s", a, v);
            continue;
        }
        const char *eq = strchr(a, '=');
        if (!eq) TS_FAIL(TS_ERR_ARG, "bench io: unexpected argument '%s' (see --help)", a);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - a), a);
        int r = set_key(&ctx, key, eq + 1, "command line");
        if (r < 0)
            TS_FAIL(TS_ERR_CONFIG, "bench io: unknown key %s (data.*, train.batch, train.seed, parallel.sp, "
                    "parallel.sp_dims)", key);
        if (r) TS_FAIL(r, "%s", ts_err_message());
    }
    if (repeat < 1) repeat = 1;
    if (dump) { /* before any work, on every rank (the group's first rank writes) */
        struct stat st;
        if (stat(dump, &st) != 0 || !S_ISDIR(st.st_mode) || access(dump, W_OK) != 0)
            TS_FAIL(TS_ERR_ARG, "bench io: --dump-patch %s is not a writable directory", dump);
    }
    if (!ts_config_isset(ctx.cfg, "data.path"))
        TS_FAIL(TS_ERR_CONFIG, "bench io: data.path is not set in %s (or on the command line)", argv[1]);
    TS_CHECK(ts_config_check_ranks(ctx.cfg, MPI_COMM_WORLD));
    const char *path;
    TS_CHECK(ts_config_get_str(ctx.cfg, "data.path", &path));
    ts_dataset_opts dopt;
    ts_loader_opts lopt;
    TS_CHECK(ts_dataset_opts_from_config(ctx.cfg, &dopt));
    TS_CHECK(ts_loader_opts_from_config(ctx.cfg, &lopt));
    lopt.batch = (int)ctx.batch;
    lopt.seed = (uint64_t)ctx.seed;
    lopt.mode = TS_SAMPLER_TRAIN;
    /* spatial groups of sp consecutive ranks, one data-parallel replica each */
    if (size % ctx.sp)
        TS_FAIL(TS_ERR_CONFIG, "bench io: parallel.sp = %lld does not divide the job's %d ranks", ctx.sp, size);
    const int dpsize = size / (int)ctx.sp, dprank = rank / (int)ctx.sp;
    int64_t blo[3] = {0, 0, 0}, bsz[3] = {lopt.patch.patch[0], lopt.patch.patch[1], lopt.patch.patch[2]};
    if (ctx.sp > 1) {
        int dims[3];
        MPI_Comm grp;
        TS_CHECK(ts_spatial_plan((int)ctx.sp, ctx.sp_dims, lopt.patch.patch, 1, dims));
        TS_MPI(MPI_Comm_split(MPI_COMM_WORLD, dprank, rank, &grp));
        lerr = ts_spatial_create(grp, dims, &spg);
        MPI_Comm_free(&grp);
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
        TS_CHECK(ts_spatial_box(spg, lopt.patch.patch, blo, bsz));
        memcpy(lopt.sub_lo, blo, sizeof blo);
        memcpy(lopt.sub_size, bsz, sizeof bsz);
        lopt.group = ts_spatial_comm(spg);
        memcpy(dopt.box_hint, bsz, sizeof dopt.box_hint);
    }
    TS_CHECK(ts_dataset_open(MPI_COMM_WORLD, path, &dopt, &ds));
    if (dump) {
        lerr = ts_loader_create(ds, dprank, dpsize, &lopt, &ld);
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
        lerr = dump_patches(ld, ctx.sp > 1 ? lopt.group : MPI_COMM_NULL, lopt.patch.patch, blo, bsz,
                            ts_dataset_channels(ds), dprank, dpsize, dump);
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
        if (rank == 0)
            printf("bench io: wrote %lld patches (%lldx%lldx%lld) to %s\n", (long long)ctx.batch * dpsize,
                   (long long)lopt.patch.patch[0], (long long)lopt.patch.patch[1], (long long)lopt.patch.patch[2],
                   dump);
        goto cleanup;
    }
    const int64_t N = ts_dataset_count(ds);

    /* phase 1: whole samples, this rank's share */
    size_t maxv = 0;
    for (int64_t i = 0; i < N; i++) {
        ts_sample_info in;
        ts_dataset_info(ds, i, &in);
        size_t v = (size_t)(in.shape[1] * in.shape[2] * in.shape[3]);
        if ((size_t)in.shape[0] * v > maxv) maxv = (size_t)in.shape[0] * v;
    }
    img = TS_ALIGNED_ALLOC(maxv * sizeof(float));
    lab = TS_ALIGNED_ALLOC(maxv);
    times = TS_CALLOC((size_t)repeat, sizeof(double));
    if (!img || !lab || !times) lerr = TS_ERR(TS_ERR_NOMEM, "bench io buffers");
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    uint64_t bytes0 = ts_dataset_bytes_read(ds), mybytes = 0, allbytes = 0;
    for (long long r = 0; r < repeat; r++) {
        TS_MPI(MPI_Barrier(MPI_COMM_WORLD));
        double t0 = ts_time_now();
        for (int64_t i = rank; i < N && !lerr; i += size) lerr = ts_dataset_read_sample(ds, i, img, lab);
        double dt = ts_time_now() - t0;
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
        TS_MPI(MPI_Allreduce(&dt, &times[r], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
        if (r == 0) mybytes = ts_dataset_bytes_read(ds) - bytes0;
    }
    TS_MPI(MPI_Allreduce(&mybytes, &allbytes, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD));
    qsort(times, (size_t)repeat, sizeof *times, cmp_double);
    const double read_s = times[repeat / 2], gbps = (double)allbytes / read_s / 1e9;

    /* phase 2: the loader */
    double sps = 0, wait_s = 0, load_s = 0;
    if (steps > 0) {
        lerr = ts_loader_create(ds, dprank, dpsize, &lopt, &ld);
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
        const ts_batch *b = NULL;
        for (long long s = 0; s < warm && !lerr; s++) lerr = ts_loader_next(ld, &b);
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
        TS_MPI(MPI_Barrier(MPI_COMM_WORLD));
        double w0 = ts_loader_wait_seconds(ld), t0 = ts_time_now();
        for (long long s = 0; s < steps && !lerr; s++) lerr = ts_loader_next(ld, &b);
        double dt = ts_time_now() - t0;
        wait_s = ts_loader_wait_seconds(ld) - w0;
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
        TS_MPI(MPI_Allreduce(&dt, &load_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
        sps = (double)steps * (double)ctx.batch * dpsize / load_s;
        ts_loader_destroy(&ld);
    }
    if (rank == 0) {
        const char *drv, *aug;
        ts_config_get_str(ctx.cfg, "data.driver", &drv);
        aug = lopt.patch.augment ? "on" : "off";
        printf("bench io: %s, %lld samples, %d rank%s, driver %s\n", path, (long long)N, size, size > 1 ? "s" : "",
               drv);
        printf("  read    %.1f MB in %.4f s (median of %lld): %.3f GB/s, %.1f samples/s\n", allbytes / 1e6, read_s,
               repeat, gbps, N / read_s);
        if (steps > 0)
            printf("  loader  %lld batches of %lld, patch %lldx%lldx%lld, augmentation %s, prefetch %d: %.1f "
                   "samples/s (%.1f batches/s; waited %.0f%% of the time)\n",
                   steps, ctx.batch, (long long)lopt.patch.patch[0], (long long)lopt.patch.patch[1],
                   (long long)lopt.patch.patch[2], aug, lopt.prefetch, sps, sps / (double)ctx.batch / dpsize,
                   100.0 * wait_s / (load_s > 0 ? load_s : 1));
        if (json) {
            js = cJSON_CreateObject();
            cJSON_AddNumberToObject(js, "samples_per_s", sps);
            cJSON_AddNumberToObject(js, "read_GBps", gbps);
            cJSON_AddNumberToObject(js, "bytes", (double)allbytes);
            cJSON_AddNumberToObject(js, "read_s", read_s);
            cJSON_AddNumberToObject(js, "read_samples_per_s", N / read_s);
            cJSON_AddNumberToObject(js, "ranks", size);
            cJSON_AddNumberToObject(js, "batch", (double)ctx.batch);
            cJSON *p = cJSON_AddArrayToObject(js, "patch");
            for (int k = 0; k < 3; k++) cJSON_AddItemToArray(p, cJSON_CreateNumber((double)lopt.patch.patch[k]));
            cJSON_AddNumberToObject(js, "steps", (double)steps);
            cJSON_AddNumberToObject(js, "prefetch", lopt.prefetch);
            cJSON_AddBoolToObject(js, "augment", lopt.patch.augment);
            cJSON_AddStringToObject(js, "driver", drv);
            cJSON_AddNumberToObject(js, "samples", (double)N);
            cJSON_AddStringToObject(js, "config", argv[1]);
            char *text = cJSON_Print(js);
            FILE *f = text ? fopen(json, "w") : NULL;
            if (!f || fprintf(f, "%s\n", text) < 0 || fclose(f) != 0)
                lerr = TS_ERR(TS_ERR_IO, "bench io: cannot write %s", json);
            free(text);
        }
    }
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
cleanup:
    cJSON_Delete(js);
    ts_loader_destroy(&ld);
    ts_dataset_close(&ds);
    ts_spatial_destroy(&spg);
    free(img);
    free(lab);
    free(times);
    ts_config_destroy(&ctx.cfg);
    return err;
}
