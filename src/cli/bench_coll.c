/* tessera bench coll: the arguments of the collective benchmark and its
 * table; the measurement, the JSON and the tuning table are
 * collectives/bench.c. */
#include "tsbuild.h"
#include "collectives/bench.h"
#include "collectives/coll.h"
#include "src/cli/cli.h"
#include "src/core/error.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ALGOS TS_COLL_BENCH_MAX_ALGOS

typedef struct {
    ts_coll_bench_opts b;
    const char *json, *tune;
} bench_opts;

static void help(void)
{
    printf("usage: tessera bench coll [--op allreduce|reduce_scatter|allgather|bcast] [--algo a,b,...]\n"
           "         [--min-bytes N] [--max-bytes N] [--dtype float32] [--reduce sum|avg|max|min]\n"
           "         [--check] [--in-place] [--registered] [--device gpu] [--repeat R] [--time-ms T]\n"
           "         [--json FILE] [--tune FILE]\n\n"
           "Times each algorithm (plus `auto`) at sizes from --min-bytes to --max-bytes (x4 steps, default\n"
           "8 B .. 64 MiB), R interleaved repetitions (default 5), each an untimed call then about T ms of\n"
           "timed calls (default 30); prints the "
           "median. Bandwidths: algbw = bytes / time; busbw = algbw * 2(p-1)/p for allreduce, (p-1)/p for\n"
           "reduce_scatter and allgather, 1 for bcast. --check fills inputs whose exact results are known\n"
           "and counts wrong elements over all ranks (column `wrong`). --registered puts the buffer in a\n"
           "shared window (ts_coll_buffer_alloc; implies --in-place). --tune FILE writes the fastest\n"
           "algorithm per size as a tuning table for this rank count and node count (used through\n"
           "coll.tuning or TESSERA_COLL_TUNING). Sizes accept K, M, G suffixes.\n"
           "Algorithms: ");
    for (int k = 0; k < TS_COLL_KIND_COUNT; k++) {
        printf("%s%s:", k ? "; " : "", ts_coll_kind_name((ts_coll_kind)k));
        for (const char *const *n = ts_coll_algorithms((ts_coll_kind)k); *n; n++) printf(" %s", *n);
    }
    printf("\n");
}

static int known(ts_coll_kind kind, const char *name)
{
    for (const char *const *n = ts_coll_algorithms(kind); *n; n++)
        if (!strcmp(*n, name)) return 1;
    return 0;
}

/* a whole number in lo..hi, nothing after it */
static int parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (end == s || *end || errno || x < lo || x > hi) return 1;
    *out = (int)x;
    return 0;
}

static int parse(int argc, char **argv, bench_opts *o, char *algo_buf)
{
    memset(o, 0, sizeof *o);
    ts_coll_bench_opts_default(&o->b);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED()                                                                     \
    do {                                                                           \
        if (!v) return TS_ERR(TS_ERR_ARG, "bench coll: %s needs a value", a);      \
        i++;                                                                       \
    } while (0)
        if (!strcmp(a, "--op")) {
            NEED();
            if (ts_coll_kind_parse(v, &o->b.kind)) return TS_ERR(TS_ERR_ARG, "bench coll: unknown --op '%s'", v);
        } else if (!strcmp(a, "--algo")) {
            NEED();
            if (strlen(v) >= 1024) return TS_ERR(TS_ERR_ARG, "bench coll: --algo is %zu characters long (at most 1023)", strlen(v));
            snprintf(algo_buf, 1024, "%s", v);
        } else if (!strcmp(a, "--min-bytes") || !strcmp(a, "--max-bytes")) {
            NEED();
            size_t b;
            if (ts_cli_parse_bytes(v, &b))
                return TS_ERR(TS_ERR_ARG, "bench coll: %s '%s' is not a size (bytes, K/M/G suffixes, at most 2^63)", a, v);
            if (a[2] == 'm' && a[3] == 'i') o->b.min_bytes = b;
            else o->b.max_bytes = b;
        } else if (!strcmp(a, "--dtype")) {
            NEED();
            if (ts_dtype_parse(v, &o->b.dt)) return TS_ERR(TS_ERR_ARG, "bench coll: unknown --dtype '%s'", v);
        } else if (!strcmp(a, "--reduce")) {
            NEED();
            if (ts_coll_op_parse(v, &o->b.op)) return TS_ERR(TS_ERR_ARG, "bench coll: unknown --reduce '%s'", v);
        } else if (!strcmp(a, "--check")) {
            o->b.check = 1;
        } else if (!strcmp(a, "--in-place")) {
            o->b.in_place = 1;
        } else if (!strcmp(a, "--registered")) {
            o->b.registered = o->b.in_place = 1;
        } else if (!strcmp(a, "--device")) {
            NEED();
            if (strcmp(v, "gpu") && strcmp(v, "cpu")) return TS_ERR(TS_ERR_ARG, "bench coll: --device gpu|cpu");
            o->b.device = !strcmp(v, "gpu");
        } else if (!strcmp(a, "--repeat")) {
            NEED();
            if (parse_int(v, 1, 1000000, &o->b.repeat))
                return TS_ERR(TS_ERR_ARG, "bench coll: --repeat '%s' is not a whole number in 1..1000000", v);
        } else if (!strcmp(a, "--time-ms")) {
            NEED();
            char *end;
            double ms = strtod(v, &end);
            if (end == v || *end || !(ms > 0) || !(ms <= 3.6e6))
                return TS_ERR(TS_ERR_ARG, "bench coll: --time-ms '%s' must be a number above 0 and at most 3600000", v);
            o->b.target_s = ms / 1000.0;
        } else if (!strcmp(a, "--root")) {
            NEED();
            if (parse_int(v, 0, INT_MAX, &o->b.root))
                return TS_ERR(TS_ERR_ARG, "bench coll: --root '%s' is not a rank number", v);
        } else if (!strcmp(a, "--json")) {
            NEED();
            o->json = v;
        } else if (!strcmp(a, "--tune")) {
            NEED();
            o->tune = v;
        } else {
            return TS_ERR(TS_ERR_ARG, "bench coll: unknown option '%s' (see --help)", a);
        }
#undef NEED
    }
    if (o->b.min_bytes > o->b.max_bytes) return TS_ERR(TS_ERR_ARG, "bench coll: --min-bytes above --max-bytes");
    if (o->b.registered && o->b.device) return TS_ERR(TS_ERR_ARG, "bench coll: --registered is for host buffers");
    /* the algorithms given */
    if (algo_buf[0]) {
        for (char *save = NULL, *t = strtok_r(algo_buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (o->b.nalgo == MAX_ALGOS) return TS_ERR(TS_ERR_ARG, "bench coll: too many algorithms");
            if (strcmp(t, "auto") && !known(o->b.kind, t))
                return TS_ERR(TS_ERR_ARG, "bench coll: unknown %s algorithm '%s'", ts_coll_kind_name(o->b.kind), t);
            o->b.algos[o->b.nalgo++] = t;
        }
    } /* none given: every algorithm that can run here, then auto (ts_coll_bench_create) */
    return 0;
}


static void print_header(const ts_coll_bench *b)
{
    const ts_coll_bench_opts *o = &b->o;
    for (int k = 0; k < b->nskipped; k++) printf("# skipping %s: %s\n", b->skipped[k], b->skip_why[k]);
    printf("# tessera bench coll: %s %s%s%s, %d ranks on %d node(s) of %d%s, %s%s%s, median of %d\n",
           ts_coll_kind_name(o->kind), ts_dtype_name(o->dt),
           o->kind == TS_COLL_ALLREDUCE || o->kind == TS_COLL_REDUCE_SCATTER ? " " : "",
           o->kind == TS_COLL_ALLREDUCE || o->kind == TS_COLL_REDUCE_SCATTER ? ts_coll_op_name(o->op) : "", b->ranks,
           b->nodes, b->local_size, b->equal_nodes ? "" : " (unequal)", o->device ? "GPU buffers, " : "",
           o->registered ? "registered buffers, in place" : o->in_place ? "in place" : "out of place",
           o->check ? ", checked" : "", o->repeat);
    printf("%12s  %-20s %12s %11s %11s %8s %8s  %s\n", "bytes", "algo", "time_us", "algbw_GBps", "busbw_GBps",
           "wrong", "vs_mpi", "chosen");
    fflush(stdout);
}

static void print_size(const ts_coll_bench *b, int si)
{
    for (int a = 0; a < b->o.nalgo; a++) {
        const ts_coll_bench_row *w = &b->rows[si][a];
        char ratio[32] = "-";
        if (w->vs_mpi >= 0) snprintf(ratio, sizeof ratio, "%.2f", w->vs_mpi);
        printf("%12zu  %-20s %12.2f %11.3f %11.3f %8zu %8s  %s%s%s%s\n", w->bytes, w->algo, w->time_s * 1e6,
               w->algbw_GBps, w->busbw_GBps, w->wrong, ratio, w->chosen, *w->why ? " (" : "", w->why,
               *w->why ? ")" : "");
    }
    fflush(stdout);
}

static void print_tuning(const ts_coll_bench *b, const char *tune)
{
    printf("# tuning table for %s at %d ranks on %d node(s) written to %s\n", ts_coll_kind_name(b->o.kind), b->ranks,
           b->nodes, tune);
    for (int k = 0; k < b->nfits; k++) {
        const ts_coll_fit *f = &b->fits[k];
        printf("# model %-20s alpha %8.3f us  beta %8.4f ns/byte (%.2f GB/s)  median error %.0f%%\n", f->algo,
               f->alpha_s * 1e6, f->beta_s * 1e9, f->beta_s > 0 ? 1e-9 / f->beta_s : 0.0, f->max_rel_err * 100);
    }
}

int ts_cli_bench_coll(int argc, char **argv)
{
    int err = 0, rank = ts_cli_rank();
    bench_opts o;
    char algo_buf[1024] = "";
    ts_coll_bench *b = NULL;
    if (ts_cli_wants_help(argc, argv)) {
        if (rank == 0) help();
        return 0;
    }
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, parse(argc, argv, &o, algo_buf)));
    TS_CHECK(ts_coll_bench_create(MPI_COMM_WORLD, &o.b, &b));
    if (rank == 0) print_header(b);
    for (int si = 0; si < b->nsize; si++) {
        TS_CHECK(ts_coll_bench_size(b, si));
        if (rank == 0) print_size(b, si);
    }
    TS_CHECK(ts_coll_bench_finish(b, o.json, o.tune));
    if (rank == 0 && o.tune) print_tuning(b, o.tune);
    TS_CHECK(ts_coll_bench_wrong(b)); /* a wrong result is a failure of the run */
cleanup:
    ts_coll_bench_destroy(&b);
    return err;
}
