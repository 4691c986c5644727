/* tessera bench coll: times collectives over a range of sizes for several
 * algorithms in one run (interleaved repetitions, medians, so ratios are
 * fair on a noisy machine), reports time, algbw and busbw (nccl-tests
 * formulas), counts wrong elements against exactly known results (--check),
 * and writes the fastest algorithm per size as a tuning table (--tune). */
#include "tsbuild.h"
#include "collectives/check.h"
#include "collectives/coll.h"
#include "collectives/device.h"
#include "collectives/model.h"
#include "src/cli/cli.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_ALGOS 16
#define MAX_SIZES 64

typedef struct {
    ts_coll_kind kind;
    ts_dtype dt;
    ts_op op;
    size_t min_bytes, max_bytes;
    const char *algos[MAX_ALGOS];
    int nalgo;
    int check, in_place, registered, device, repeat, root;
    double target_s;
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
    o->kind = TS_COLL_ALLREDUCE;
    o->dt = TS_FLOAT32;
    o->op = TS_OP_SUM;
    o->min_bytes = 8;
    o->max_bytes = (size_t)64 << 20;
    o->repeat = 5;
    o->target_s = 0.03;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED()                                                                     \
    do {                                                                           \
        if (!v) return TS_ERR(TS_ERR_ARG, "bench coll: %s needs a value", a);      \
        i++;                                                                       \
    } while (0)
        if (!strcmp(a, "--op")) {
            NEED();
            if (ts_coll_kind_parse(v, &o->kind)) return TS_ERR(TS_ERR_ARG, "bench coll: unknown --op '%s'", v);
        } else if (!strcmp(a, "--algo")) {
            NEED();
            if (strlen(v) >= 1024) return TS_ERR(TS_ERR_ARG, "bench coll: --algo is %zu characters long (at most 1023)", strlen(v));
            snprintf(algo_buf, 1024, "%s", v);
        } else if (!strcmp(a, "--min-bytes") || !strcmp(a, "--max-bytes")) {
            NEED();
            size_t b;
            if (ts_cli_parse_bytes(v, &b))
                return TS_ERR(TS_ERR_ARG, "bench coll: %s '%s' is not a size (bytes, K/M/G suffixes, at most 2^63)", a, v);
            if (a[2] == 'm' && a[3] == 'i') o->min_bytes = b;
            else o->max_bytes = b;
        } else if (!strcmp(a, "--dtype")) {
            NEED();
            if (ts_dtype_parse(v, &o->dt)) return TS_ERR(TS_ERR_ARG, "bench coll: unknown --dtype '%s'", v);
        } else if (!strcmp(a, "--reduce")) {
            NEED();
            if (ts_coll_op_parse(v, &o->op)) return TS_ERR(TS_ERR_ARG, "bench coll: unknown --reduce '%s'", v);
        } else if (!strcmp(a, "--check")) {
            o->check = 1;
        } else if (!strcmp(a, "--in-place")) {
            o->in_place = 1;
        } else if (!strcmp(a, "--registered")) {
            o->registered = o->in_place = 1;
        } else if (!strcmp(a, "--device")) {
            NEED();
            if (strcmp(v, "gpu") && strcmp(v, "cpu")) return TS_ERR(TS_ERR_ARG, "bench coll: --device gpu|cpu");
            o->device = !strcmp(v, "gpu");
        } else if (!strcmp(a, "--repeat")) {
            NEED();
            if (parse_int(v, 1, 1000000, &o->repeat))
                return TS_ERR(TS_ERR_ARG, "bench coll: --repeat '%s' is not a whole number in 1..1000000", v);
        } else if (!strcmp(a, "--time-ms")) {
            NEED();
            char *end;
            double ms = strtod(v, &end);
            if (end == v || *end || !(ms > 0) || !(ms <= 3.6e6))
                return TS_ERR(TS_ERR_ARG, "bench coll: --time-ms '%s' must be a number above 0 and at most 3600000", v);
            o->target_s = ms / 1000.0;
        } else if (!strcmp(a, "--root")) {
            NEED();
            if (parse_int(v, 0, INT_MAX, &o->root))
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
    if (o->min_bytes > o->max_bytes) return TS_ERR(TS_ERR_ARG, "bench coll: --min-bytes above --max-bytes");
    if (o->registered && o->device) return TS_ERR(TS_ERR_ARG, "bench coll: --registered is for host buffers");
    /* algorithm list: given, or every registered one; then auto */
    if (algo_buf[0]) {
        for (char *save = NULL, *t = strtok_r(algo_buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (o->nalgo == MAX_ALGOS) return TS_ERR(TS_ERR_ARG, "bench coll: too many algorithms");
            if (strcmp(t, "auto") && !known(o->kind, t))
                return TS_ERR(TS_ERR_ARG, "bench coll: unknown %s algorithm '%s'", ts_coll_kind_name(o->kind), t);
            o->algos[o->nalgo++] = t;
        }
    } else {
        for (const char *const *n = ts_coll_algorithms(o->kind); *n && o->nalgo < MAX_ALGOS - 1; n++)
            if ((strcmp(*n, "nccl") == 0) == o->device) o->algos[o->nalgo++] = *n; /* nccl only for GPU buffers */
        o->algos[o->nalgo++] = "auto";
    }
    return 0;
}

static double bus_factor(ts_coll_kind k, int p)
{
    if (k == TS_COLL_ALLREDUCE) return 2.0 * (p - 1) / p;
    if (k == TS_COLL_BCAST) return 1.0;
    return (double)(p - 1) / p;
}

/* the exact result of the check pattern at element i over p ranks, as a double */
static double expected(size_t i, int p, ts_op op, ts_dtype dt, int half, int seed)
{
    long long s = 0, mx = -1000, mn = 1000;
    for (int r = 0; r < p; r++) {
        long long v = TS_CHECK_VALUE(i, r, seed, half);
        s += v;
        if (v > mx) mx = v;
        if (v < mn) mn = v;
    }
    if (op == TS_OP_MAX) return (double)mx;
    if (op == TS_OP_MIN) return (double)mn;
    if (op == TS_OP_SUM) return (double)s;
    if (dt == TS_INT32 || dt == TS_INT64) return (double)(s / p);
    if (dt == TS_FLOAT32) return (double)((float)s / (float)p);
    if (dt == TS_BFLOAT16) return (double)ts_bf16_to_f32(ts_f32_to_bf16((float)s / (float)p));
    if (dt == TS_FLOAT16) return (double)ts_f16_to_f32(ts_f32_to_f16((float)s / (float)p));
    return (double)s / p;
}

/* Fills this rank's input for a check run. For allgather only the own
 * block holds data (others get a poison value); for bcast only the root. */
static void fill_host(const bench_opts *o, void *b, size_t n, int rank, int p, int seed)
{
    int half = o->dt == TS_BFLOAT16 || o->dt == TS_FLOAT16;
    size_t bo = 0, bl = n;
    if (o->kind == TS_COLL_ALLGATHER) ts_coll_block(n, o->dt, p, rank, &bo, &bl);
    for (size_t i = 0; i < n; i++) {
        double v;
        if (o->kind == TS_COLL_ALLGATHER)
            v = i >= bo && i < bo + bl ? TS_CHECK_VALUE(i, rank, seed, half) : 99;
        else if (o->kind == TS_COLL_BCAST)
            v = rank == o->root ? TS_CHECK_VALUE(i, 0, seed, half) : 99;
        else
            v = TS_CHECK_VALUE(i, rank, seed, half);
        ts_check_set(b, i, o->dt, v);
    }
}

static size_t count_wrong(const bench_opts *o, const void *b, size_t n, int rank, int p, int seed)
{
    int half = o->dt == TS_BFLOAT16 || o->dt == TS_FLOAT16;
    size_t wrong = 0, lo = 0, len = n;
    if (o->kind == TS_COLL_REDUCE_SCATTER) ts_coll_block(n, o->dt, p, rank, &lo, &len);
    for (size_t i = lo; i < lo + len; i++) {
        double want;
        if (o->kind == TS_COLL_ALLGATHER) {
            int owner = 0;
            for (int q = 0; q < p; q++) {
                size_t qo, ql;
                ts_coll_block(n, o->dt, p, q, &qo, &ql);
                if (i >= qo && i < qo + ql) owner = q;
            }
            want = TS_CHECK_VALUE(i, owner, seed, half);
        } else if (o->kind == TS_COLL_BCAST) {
            want = TS_CHECK_VALUE(i, 0, seed, half);
        } else {
            want = expected(i, p, o->op, o->dt, half, seed);
        }
        if (ts_check_get(b, i, o->dt) != want) wrong++;
    }
    return wrong;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int ts_cli_bench_coll(int argc, char **argv)
{
    int err = 0, rank = ts_cli_rank(), p = ts_cli_size();
    bench_opts o;
    char algo_buf[1024] = "";
    ts_coll *c = NULL;
    void *sbuf = NULL, *rbuf = NULL, *hbuf = NULL;
    cJSON *json = NULL;
    double *samples = NULL;
    if (ts_cli_wants_help(argc, argv)) {
        if (rank == 0) help();
        return 0;
    }
    int lerr = parse(argc, argv, &o, algo_buf);
    if (!lerr && o.root >= p) lerr = TS_ERR(TS_ERR_ARG, "bench coll: --root %d is not a rank (0..%d)", o.root, p - 1);
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    TS_CHECK(ts_coll_create(MPI_COMM_WORLD, NULL, &c));
    if (!algo_buf[0]) { /* the default list: only algorithms that can run here */
        int k = 0;
        for (int a = 0; a < o.nalgo; a++) {
            char why[256];
            if (!strcmp(o.algos[a], "auto") || o.device ||
                ts_coll_can_run(c, o.kind, o.algos[a], 1, o.dt, o.op, why, sizeof why))
                o.algos[k++] = o.algos[a];
            else if (rank == 0)
                printf("# skipping %s: %s\n", o.algos[a], why);
        }
        o.nalgo = k;
    }
    const size_t es = ts_dtype_size(o.dt);
    const int nodes = ts_coll_nodes(c);
    size_t sizes[MAX_SIZES];
    int nsize = 0;
    /* min, x4 steps, then max itself; no product may wrap around */
    for (size_t b = o.min_bytes;;) {
        sizes[nsize++] = b / es * es;
        if (b >= o.max_bytes || nsize == MAX_SIZES) break;
        b = b == 0 ? es : b > o.max_bytes / 4 ? o.max_bytes : b * 4;
        if (b > o.max_bytes) b = o.max_bytes;
    }
    size_t maxb = sizes[nsize - 1];
    {
        /* the buffers must fit in this node's memory (a clear error, not an
         * allocator failure or the OOM killer) */
        const long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        const double need = (double)maxb * (o.in_place || o.registered ? 1 : 2) * ts_coll_local_size(c),
                     have = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
        lerr = 0;
        if (!o.device && have > 0 && need > have)
            lerr = TS_ERR(TS_ERR_ARG, "bench coll: --max-bytes %zu needs %.3g GiB of buffers on this node (%d rank%s), "
                          "more than its %.3g GiB of memory", o.max_bytes, need / 1073741824.0, ts_coll_local_size(c),
                          ts_coll_local_size(c) > 1 ? "s" : "", have / 1073741824.0);
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    }
    /* buffers */
    lerr = 0;
    if (o.device) {
        lerr = ts_coll_device_alloc(maxb, ts_coll_local_rank(c), &rbuf);
        if (!lerr && !o.in_place) lerr = ts_coll_device_alloc(maxb, ts_coll_local_rank(c), &sbuf);
        if (!lerr) {
            hbuf = malloc(maxb ? maxb : 1);
            if (!hbuf) lerr = TS_ERR(TS_ERR_NOMEM, "bench buffers");
        }
    } else if (!o.registered) {
        rbuf = TS_ALIGNED_ALLOC(maxb);
        sbuf = o.in_place ? NULL : TS_ALIGNED_ALLOC(maxb);
        if (!rbuf || (!o.in_place && !sbuf)) lerr = TS_ERR_NOMEM;
        else {
            memset(rbuf, 0, maxb);
            if (sbuf) memset(sbuf, 0, maxb);
        }
    }
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    if (o.registered) {
        TS_CHECK(ts_coll_buffer_alloc(c, maxb, &rbuf));
        memset(rbuf, 0, maxb);
    }
    samples = malloc(sizeof *samples * (size_t)o.repeat);
    json = cJSON_CreateArray();
    if (!samples || !json) TS_FAIL(TS_ERR_NOMEM, "bench results");

    if (rank == 0) {
        printf("# tessera bench coll: %s %s%s%s, %d ranks on %d node(s) of %d%s, %s%s%s, median of %d\n",
               ts_coll_kind_name(o.kind), ts_dtype_name(o.dt),
               o.kind == TS_COLL_ALLREDUCE || o.kind == TS_COLL_REDUCE_SCATTER ? " " : "",
               o.kind == TS_COLL_ALLREDUCE || o.kind == TS_COLL_REDUCE_SCATTER ? ts_coll_op_name(o.op) : "", p, nodes,
               ts_coll_local_size(c), ts_coll_equal_nodes(c) ? "" : " (unequal)", o.device ? "GPU buffers, " : "",
               o.registered ? "registered buffers, in place" : o.in_place ? "in place" : "out of place",
               o.check ? ", checked" : "", o.repeat);
        printf("%12s  %-20s %12s %11s %11s %8s %8s  %s\n", "bytes", "algo", "time_us", "algbw_GBps", "busbw_GBps",
               "wrong", "vs_mpi", "chosen");
        fflush(stdout);
    }
    const char *best_algo[MAX_SIZES];
    size_t bucket[MAX_SIZES];
    static double medians[MAX_ALGOS][MAX_SIZES]; /* for the α-β fits of --tune */
    for (int si = 0; si < nsize; si++) {
        size_t bytes = sizes[si], count = bytes / es;
        double med[MAX_ALGOS];
        size_t wrong[MAX_ALGOS];
        int iters[MAX_ALGOS];
        const void *send = o.in_place ? TS_IN_PLACE : sbuf;
        /* correctness run and iteration count per algorithm */
        for (int a = 0; a < o.nalgo; a++) {
            wrong[a] = 0;
            if (o.check) {
                int seed = si * 31 + a;
                void *in = o.in_place || o.kind == TS_COLL_ALLGATHER || o.kind == TS_COLL_BCAST ? rbuf : sbuf;
                if (o.device) {
                    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, ts_coll_device_fill(in, count, o.dt, rank, seed)));
                } else {
                    fill_host(&o, in, count, rank, p, seed);
                }
                TS_CHECK(ts_coll_run(c, o.kind, o.algos[a], send, rbuf, count, o.dt, o.op, o.root));
                unsigned long long w = 0;
                if (o.device) {
                    size_t dw = 0;
                    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, ts_coll_device_wrong(rbuf, count, o.dt, p, o.op, seed, &dw)));
                    w = dw;
                } else {
                    w = count_wrong(&o, rbuf, count, rank, p, seed);
                }
                TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
                wrong[a] = (size_t)w;
            }
            /* warm-up, then size the timed loop from the slowest rank */
            TS_CHECK(ts_coll_run(c, o.kind, o.algos[a], send, rbuf, count, o.dt, o.op, o.root));
            double t = ts_time_now();
            TS_CHECK(ts_coll_run(c, o.kind, o.algos[a], send, rbuf, count, o.dt, o.op, o.root));
            t = ts_time_now() - t;
            TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
            double n = o.target_s / (t > 1e-7 ? t : 1e-7);
            iters[a] = n < 1 ? 1 : n > 100000 ? 100000 : (int)n;
        }
        /* interleaved repetitions: every algorithm sees the same noise */
        double *all = malloc(sizeof *all * (size_t)(o.nalgo * o.repeat));
        if (!all) TS_FAIL(TS_ERR_NOMEM, "samples");
        for (int r = 0; r < o.repeat && !err; r++)
            for (int a = 0; a < o.nalgo; a++) {
                /* one untimed call first: what the previous algorithm left
                 * behind (MPI's deferred work, cache state) is not charged here */
                err = ts_coll_run(c, o.kind, o.algos[a], send, rbuf, count, o.dt, o.op, o.root);
                if (err) break;
                MPI_Barrier(MPI_COMM_WORLD);
                double t = ts_time_now();
                for (int k = 0; k < iters[a]; k++) {
                    err = ts_coll_run(c, o.kind, o.algos[a], send, rbuf, count, o.dt, o.op, o.root);
                    if (err) break;
                }
                t = (ts_time_now() - t) / iters[a];
                if (err) break;
                MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                all[a * o.repeat + r] = t;
            }
        if (err) {
            free(all);
            goto cleanup;
        }
        int best = -1, mpi_idx = -1;
        for (int a = 0; a < o.nalgo; a++) {
            memcpy(samples, all + a * o.repeat, sizeof *samples * (size_t)o.repeat);
            qsort(samples, (size_t)o.repeat, sizeof *samples, cmp_double);
            med[a] = o.repeat % 2 ? samples[o.repeat / 2] : 0.5 * (samples[o.repeat / 2 - 1] + samples[o.repeat / 2]);
            if (!strcmp(o.algos[a], "mpi")) mpi_idx = a;
            if (strcmp(o.algos[a], "auto") && (best < 0 || med[a] < med[best])) best = a;
        }
        free(all);
        best_algo[si] = best >= 0 ? o.algos[best] : "auto";
        for (int a = 0; a < o.nalgo; a++) medians[a][si] = med[a];
        bucket[si] = si + 1 < nsize ? (sizes[si] + sizes[si + 1]) / 2 : (size_t)-1 / 2;
        for (int a = 0; a < o.nalgo; a++) {
            double algbw = bytes / med[a] / 1e9, busbw = algbw * bus_factor(o.kind, p);
            const char *why = "", *chosen = "";
            if (!strcmp(o.algos[a], "auto")) chosen = ts_coll_choice(c, o.kind, count, o.dt, o.op, &why);
            if (rank == 0) {
                char ratio[32] = "-";
                if (mpi_idx >= 0) snprintf(ratio, sizeof ratio, "%.2f", med[mpi_idx] / med[a]);
                printf("%12zu  %-20s %12.2f %11.3f %11.3f %8zu %8s  %s%s%s%s\n", bytes, o.algos[a], med[a] * 1e6, algbw,
                       busbw, wrong[a], ratio, chosen, *why ? " (" : "", why, *why ? ")" : "");
            }
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "op", ts_coll_kind_name(o.kind));
            cJSON_AddStringToObject(e, "algo", o.algos[a]);
            if (*chosen) cJSON_AddStringToObject(e, "chosen", chosen);
            cJSON_AddNumberToObject(e, "ranks", p);
            cJSON_AddNumberToObject(e, "nodes", nodes);
            cJSON_AddNumberToObject(e, "bytes", (double)bytes);
            cJSON_AddStringToObject(e, "dtype", ts_dtype_name(o.dt));
            cJSON_AddStringToObject(e, "reduce", ts_coll_op_name(o.op));
            cJSON_AddNumberToObject(e, "time_us", med[a] * 1e6);
            cJSON_AddNumberToObject(e, "algbw_GBps", algbw);
            cJSON_AddNumberToObject(e, "busbw_GBps", busbw);
            if (o.check) cJSON_AddNumberToObject(e, "wrong", (double)wrong[a]);
            else cJSON_AddNullToObject(e, "wrong");
            cJSON_AddItemToArray(json, e);
        }
        if (rank == 0) fflush(stdout);
    }
    lerr = 0;
    if (rank == 0 && o.json) {
        char *text = cJSON_Print(json);
        FILE *f = text ? fopen(o.json, "w") : NULL;
        if (!f || fputs(text, f) < 0 || fputc('\n', f) < 0) lerr = TS_ERR(TS_ERR_IO, "%s: cannot write", o.json);
        if (f && fclose(f) != 0 && !lerr) lerr = TS_ERR(TS_ERR_IO, "%s: cannot write", o.json);
        free(text);
    }
    if (rank == 0 && o.tune && !lerr) {
        lerr = ts_coll_tuning_write(o.tune, o.kind, p, nodes, bucket, best_algo, nsize);
        if (!lerr) printf("# tuning table for %s at %d ranks on %d node(s) written to %s\n", ts_coll_kind_name(o.kind),
                          p, nodes, o.tune);
        /* the α-β model of each algorithm (collectives/model.h), for tessera plan */
        ts_coll_fit fits[MAX_ALGOS];
        double bytes[MAX_SIZES];
        int nf = 0;
        for (int si = 0; si < nsize; si++) bytes[si] = (double)(sizes[si] ? sizes[si] : es);
        for (int a = 0; a < o.nalgo && !lerr && p > 1; a++) {
            if (!strcmp(o.algos[a], "auto") || nsize < 2) continue;
            if (ts_coll_model_fit(ts_coll_kind_name(o.kind), o.algos[a], p, nodes, bytes, medians[a], nsize, &fits[nf])) {
                ts_err_clear();
                continue;
            }
            printf("# model %-20s alpha %8.3f us  beta %8.4f ns/byte (%.2f GB/s)  median error %.0f%%\n", o.algos[a],
                   fits[nf].alpha_s * 1e6, fits[nf].beta_s * 1e9, fits[nf].beta_s > 0 ? 1e-9 / fits[nf].beta_s : 0.0,
                   fits[nf].max_rel_err * 100);
            nf++;
        }
        if (nf && !lerr) lerr = ts_coll_model_write(o.tune, fits, nf);
    }
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    if (o.check) {
        /* a wrong result is a failure of the run */
        cJSON *e;
        cJSON_ArrayForEach(e, json)
        {
            cJSON *w = cJSON_GetObjectItemCaseSensitive(e, "wrong");
            if (cJSON_IsNumber(w) && w->valuedouble > 0)
                TS_FAIL(TS_ERR_INTERNAL, "bench coll --check: %s at %.0f bytes gave %.0f wrong elements",
                        cJSON_GetObjectItemCaseSensitive(e, "algo")->valuestring,
                        cJSON_GetObjectItemCaseSensitive(e, "bytes")->valuedouble, w->valuedouble);
        }
    }
cleanup:
    if (o.registered && rbuf && c) ts_coll_buffer_free(c, &rbuf);
    else if (o.device) {
        ts_coll_device_free(rbuf);
        ts_coll_device_free(sbuf);
    } else {
        free(rbuf);
        free(sbuf);
    }
    free(hbuf);
    free(samples);
    cJSON_Delete(json);
    ts_coll_destroy(&c);
    return err;
}
