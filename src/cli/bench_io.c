/* tessera bench io: the arguments and the report of the data-path
 * benchmark; the measurement, the patch dump and the JSON are src/bench/bench_io.c. */
#include "tsbuild.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "src/bench/bench_io.h"
#include "src/cli/cli.h"
#include "src/core/config.h"
#include "src/core/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void report(const ts_io_bench_result *r)
{
    printf("bench io: %s, %lld samples, %d rank%s, driver %s\n", r->path, (long long)r->samples, r->ranks,
           r->ranks > 1 ? "s" : "", r->driver);
    printf("  read    %.1f MB in %.4f s (median of %d): %.3f GB/s, %.1f samples/s\n", r->bytes / 1e6, r->read_s,
           r->repeat, r->read_GBps, r->read_samples_per_s);
    if (r->steps > 0)
        printf("  loader  %lld batches of %lld, patch %lldx%lldx%lld, augmentation %s, prefetch %d: %.1f "
               "samples/s (%.1f batches/s; waited %.0f%% of the time)\n",
               r->steps, r->batch, (long long)r->patch[0], (long long)r->patch[1], (long long)r->patch[2],
               r->augment ? "on" : "off", r->prefetch, r->samples_per_s, r->samples_per_s / (double)r->batch / r->replicas,
               100.0 * r->wait_s / (r->load_s > 0 ? r->load_s : 1));
}

int ts_cli_bench_io(int argc, char **argv)
{
    int err = 0, lerr = 0;
    ts_io_bench_cfg c;
    ts_io_bench_result r;
    const char *json = NULL, *dump = NULL;
    int64_t steps = 20, warm = 3, repeat = 3;
    const int rank = ts_cli_rank();
    memset(&c, 0, sizeof c);
    if (argc < 2 || ts_cli_wants_help(argc, argv)) {
        if (rank == 0) help();
        return argc < 2 ? TS_ERR(TS_ERR_ARG, "bench io: CONFIG is required") : 0;
    }
    TS_CHECK(ts_io_bench_cfg_load(argv[1], &c));
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *dst = !strcmp(a, "--steps") ? &steps : !strcmp(a, "--warmup") ? &warm
                         : !strcmp(a, "--repeat") ? &repeat : NULL;
        if (dst || !strcmp(a, "--json") || !strcmp(a, "--dump-patch")) {
            if (!v) TS_FAIL(TS_ERR_ARG, "bench io: %s needs a value", a);
            i++;
            if (!dst && a[2] == 'j') json = v;
            else if (!dst) dump = v;
            else if (ts_parse_i64(v, dst) || *dst < 0) TS_FAIL(TS_ERR_ARG, "bench io: %s %s", a, v);
            continue;
        }
        const char *eq = strchr(a, '=');
        if (!eq) TS_FAIL(TS_ERR_ARG, "bench io: unexpected argument '%s' (see --help)", a);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - a), a);
        int k = ts_io_bench_cfg_set(&c, key, eq + 1, "command line");
        if (k < 0)
            TS_FAIL(TS_ERR_CONFIG, "bench io: unknown key %s (data.*, train.batch, train.seed, parallel.sp, "
                    "parallel.sp_dims)", key);
        if (k) TS_FAIL(k, "%s", ts_err_message());
    }
    if (dump) {
        long long n = 0;
        TS_CHECK(ts_io_bench_dump(MPI_COMM_WORLD, &c, dump, &n));
        if (rank == 0)
            printf("bench io: wrote %lld patches to %s\n", n, dump);
        goto cleanup;
    }
    TS_CHECK(ts_io_bench_run(MPI_COMM_WORLD, &c, steps, warm, repeat, &r));
    if (rank == 0) {
        report(&r);
        if (json) lerr = ts_io_bench_write_json(json, &r, argv[1]);
    }
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
cleanup:
    ts_io_bench_cfg_free(&c);
    return err;
}
