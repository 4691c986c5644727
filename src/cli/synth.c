/* tessera synth: synthetic 3D phantoms (ellipsoids and blobs with smooth
 * intensity fields and noise; labels = the shapes) written as a tessera
 * dataset, for tests and scaling runs of any size. Parses and prints only:
 * the phantoms and their writing are io/synth.c's. */
#include "tsbuild.h"
#include "io/synth.h"
#include "src/cli/cli.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <stdlib.h>
#include <string.h>

static void help(void)
{
    printf("usage: tessera synth --out DATA.h5 --count N --size D|D,H,W [--classes K] [--channels C]\n"
           "                     [--seed S] [--noise X] [--shards N] [--chunk E]\n\n"
           "Writes N phantoms: per foreground class an ellipsoid or a blob of overlapping spheroids (random\n"
           "position, radii, rotation); the image is a per-class intensity times a smooth field plus Gaussian\n"
           "noise of std X (default 0.05). Classes K (default 3) include the background; channels C (default\n"
           "1) have their own intensities. Sample i depends only on (S, i): the same dataset on any number\n"
           "of ranks. --shards and --chunk as in `tessera convert` (default one file, chunk edge 64).\n");
}

static int parse_size(const char *s, int64_t *d)
{
    char *end;
    long long a = strtoll(s, &end, 10), b, c;
    if (end == s || a < 1) return 1;
    if (!*end) {
        d[0] = d[1] = d[2] = a;
        return 0;
    }
    if (*end != ',') return 1;
    b = strtoll(end + 1, &end, 10);
    if (*end != ',' || b < 1) return 1;
    c = strtoll(end + 1, &end, 10);
    if (*end || c < 1) return 1;
    d[0] = a;
    d[1] = b;
    d[2] = c;
    return 0;
}

int ts_cli_synth(int argc, char **argv)
{
    int err = 0, shards = 1, chunk = 64;
    const char *out = NULL;
    long long count = 0;
    ts_synth_opts o = {.channels = 1, .classes = 3};
    if (ts_cli_wants_help(argc, argv)) {
        if (ts_cli_rank() == 0) help();
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return TS_ERR(TS_ERR_ARG, "synth: %s needs a value (see --help)", a);
        i++;
        if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--count")) count = atoll(v);
        else if (!strcmp(a, "--size")) {
            if (parse_size(v, o.size)) return TS_ERR(TS_ERR_ARG, "synth: --size %s: an edge or D,H,W", v);
        } else if (!strcmp(a, "--classes")) o.classes = atoi(v);
        else if (!strcmp(a, "--channels")) o.channels = atoi(v);
        else if (!strcmp(a, "--seed")) o.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--noise")) o.noise = atof(v);
        else if (!strcmp(a, "--shards")) shards = atoi(v);
        else if (!strcmp(a, "--chunk")) chunk = atoi(v);
        else return TS_ERR(TS_ERR_ARG, "synth: unknown option '%s' (see --help)", a);
    }
    if (!out) return TS_ERR(TS_ERR_ARG, "synth: --out is required");
    if (count < 1) return TS_ERR(TS_ERR_ARG, "synth: --count must be >= 1");
    if (!o.size[0]) return TS_ERR(TS_ERR_ARG, "synth: --size is required");
    if (o.classes < 2 || o.classes > 256) return TS_ERR(TS_ERR_ARG, "synth: --classes %d (2..256)", o.classes);
    if (o.channels < 1 || o.channels > 16) return TS_ERR(TS_ERR_ARG, "synth: --channels %d (1..16)", o.channels);
    if (shards < 1) return TS_ERR(TS_ERR_ARG, "synth: --shards must be >= 1");
    if (chunk < 1 || chunk > 4096) return TS_ERR(TS_ERR_ARG, "synth: --chunk (1..4096)");
    double t0 = ts_time_now();
    TS_CHECK(ts_synth_write(MPI_COMM_WORLD, out, &o, count, shards, chunk));
    if (ts_cli_rank() == 0)
        printf("synth: wrote %lld samples of %lldx%lldx%lld (%d channel%s, %d classes) to %s in %.1f s\n", count,
               (long long)o.size[0], (long long)o.size[1], (long long)o.size[2], o.channels,
               o.channels > 1 ? "s" : "", o.classes, out, ts_time_now() - t0);
cleanup:
    return err;
}
