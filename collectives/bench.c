/* The collective benchmark (collectives/bench.h): what `tessera bench coll`
 * measures (algorithms timed side by side per size, bus bandwidth, wrong
 * elements counted) and the JSON, tuning table and α-β fits it writes. It
 * runs algorithms only through ts_coll_run and prints nothing: the report is
 * src/cli/bench_coll.c's. */
#include "tsbuild.h"
#include "collectives/bench.h"
#include "collectives/check.h"
#include "collectives/device.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void ts_coll_bench_opts_default(ts_coll_bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->kind = TS_COLL_ALLREDUCE;
    o->dt = TS_FLOAT32;
    o->op = TS_OP_SUM;
    o->min_bytes = 8;
    o->max_bytes = (size_t)64 << 20;
    o->repeat = 5;
    o->target_s = 0.03;
}

static int known(ts_coll_kind kind, const char *name)
{
    for (const char *const *n = ts_coll_algorithms(kind); *n; n++)
        if (!strcmp(*n, name)) return 1;
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
static void fill_host(const ts_coll_bench_opts *o, void *b, size_t n, int rank, int p, int seed)
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

static size_t count_wrong(const ts_coll_bench_opts *o, const void *b, size_t n, int rank, int p, int seed)
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

/* checks of the options that need the communicator */
static int check_opts(const ts_coll_bench_opts *o, int p)
{
    if (o->min_bytes > o->max_bytes) return TS_ERR(TS_ERR_ARG, "bench coll: --min-bytes above --max-bytes");
    if (o->registered && o->device) return TS_ERR(TS_ERR_ARG, "bench coll: --registered is for host buffers");
    if (o->repeat < 1 || !(o->target_s > 0)) return TS_ERR(TS_ERR_ARG, "bench coll: repeat and time must be positive");
    if (o->nalgo < 0 || o->nalgo > TS_COLL_BENCH_MAX_ALGOS) return TS_ERR(TS_ERR_ARG, "bench coll: too many algorithms");
    for (int a = 0; a < o->nalgo; a++)
        if (strcmp(o->algos[a], "auto") && !known(o->kind, o->algos[a]))
            return TS_ERR(TS_ERR_ARG, "bench coll: unknown %s algorithm '%s'", ts_coll_kind_name(o->kind), o->algos[a]);
    if (o->root < 0 || o->root >= p) return TS_ERR(TS_ERR_ARG, "bench coll: --root %d is not a rank (0..%d)", o->root, p - 1);
    return 0;
}

/* the default list: every registered algorithm that can run here (for GPU
 * buffers those that serve them: nccl, hierarchical), then auto; the others
 * are listed as skipped */
static void default_algos(ts_coll_bench *b)
{
    ts_coll_bench_opts *o = &b->o;
    for (const char *const *n = ts_coll_algorithms(o->kind); *n && o->nalgo < TS_COLL_BENCH_MAX_ALGOS - 1; n++) {
        char *why = b->skip_why[b->nskipped];
        int can;
        if (o->device) {
            can = ts_coll_device_algo(b->c, o->kind, *n, why, sizeof b->skip_why[0]);
            if (can < 0) continue; /* host memory only */
        } else {
            if (!strcmp(*n, "nccl")) continue;
            can = ts_coll_can_run(b->c, o->kind, *n, 1, o->dt, o->op, why, sizeof b->skip_why[0]);
        }
        if (can)
            o->algos[o->nalgo++] = *n;
        else
            b->skipped[b->nskipped++] = *n;
    }
    o->algos[o->nalgo++] = "auto";
}

/* min, x4 steps, then max itself; no product may wrap around */
static void make_sizes(ts_coll_bench *b)
{
    const size_t es = ts_dtype_size(b->o.dt);
    for (size_t x = b->o.min_bytes;;) {
        b->sizes[b->nsize++] = x / es * es;
        if (x >= b->o.max_bytes || b->nsize == TS_COLL_BENCH_MAX_SIZES) break;
        x = x == 0 ? es : x > b->o.max_bytes / 4 ? b->o.max_bytes : x * 4;
        if (x > b->o.max_bytes) x = b->o.max_bytes;
    }
}

/* Collective: the buffers, after checking that they fit in this node's
 * memory (a clear error, not an allocator failure or the OOM killer). */
static int alloc_buffers(ts_coll_bench *b)
{
    const ts_coll_bench_opts *o = &b->o;
    const size_t maxb = b->sizes[b->nsize - 1];
    const long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    const double need = (double)maxb * (o->in_place || o->registered ? 1 : 2) * b->local_size,
                 have = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
    int lerr = 0;
    if (!o->device && have > 0 && need > have)
        lerr = TS_ERR(TS_ERR_ARG, "bench coll: --max-bytes %zu needs %.3g GiB of buffers on this node (%d rank%s), "
                      "more than its %.3g GiB of memory", o->max_bytes, need / 1073741824.0, b->local_size,
                      b->local_size > 1 ? "s" : "", have / 1073741824.0);
    TS_TRY(ts_err_agree(b->comm, lerr));
    if (o->device) {
        lerr = ts_coll_device_alloc(maxb, ts_coll_gpu(b->c), &b->rbuf);
        if (!lerr && !o->in_place) lerr = ts_coll_device_alloc(maxb, ts_coll_gpu(b->c), &b->sbuf);
        if (!lerr) {
            b->hbuf = malloc(maxb ? maxb : 1);
            if (!b->hbuf) lerr = TS_ERR(TS_ERR_NOMEM, "bench buffers");
        }
    } else if (!o->registered) {
        b->rbuf = TS_ALIGNED_ALLOC(maxb);
        b->sbuf = o->in_place ? NULL : TS_ALIGNED_ALLOC(maxb);
        if (!b->rbuf || (!o->in_place && !b->sbuf)) lerr = TS_ERR_NOMEM;
        else {
            memset(b->rbuf, 0, maxb);
            if (b->sbuf) memset(b->sbuf, 0, maxb);
        }
    }
    b->samples = malloc(sizeof *b->samples * (size_t)o->repeat);
    if (!lerr && !b->samples) lerr = TS_ERR(TS_ERR_NOMEM, "bench results");
    TS_TRY(ts_err_agree(b->comm, lerr));
    if (o->registered) {
        TS_TRY(ts_coll_buffer_alloc(b->c, maxb, &b->rbuf));
        memset(b->rbuf, 0, maxb);
    }
    return 0;
}

int ts_coll_bench_create(MPI_Comm comm, const ts_coll_bench_opts *o, ts_coll_bench **out)
{
    int err = 0, p = 1;
    *out = NULL;
    MPI_Comm_size(comm, &p);
    ts_coll_bench *b = TS_CALLOC(1, sizeof *b);
    if (b) b->comm = MPI_COMM_NULL;
    TS_CHECK(ts_err_agree(comm, b ? check_opts(o, p) : TS_ERR(TS_ERR_NOMEM, "bench coll")));
    b->o = *o;
    if (b->o.registered) b->o.in_place = 1;
    TS_MPI(MPI_Comm_dup(comm, &b->comm));
    b->ranks = p;
    TS_CHECK(ts_coll_create(b->comm, NULL, &b->c));
    if (!o->nalgo) default_algos(b);
    b->nodes = ts_coll_nodes(b->c);
    b->local_size = ts_coll_local_size(b->c);
    b->equal_nodes = ts_coll_equal_nodes(b->c);
    make_sizes(b);
    TS_CHECK(alloc_buffers(b));
    *out = b;
    return 0;
cleanup:
    ts_coll_bench_destroy(&b);
    return err;
}

/* Collective. The correctness run of algorithm a at count elements (check
 * only) and the timed-loop length sized from the slowest rank. */
static int prepare(ts_coll_bench *b, int si, int a, size_t count, size_t *wrong, int *iters)
{
    const ts_coll_bench_opts *o = &b->o;
    const void *send = o->in_place ? TS_IN_PLACE : b->sbuf;
    int rank;
    MPI_Comm_rank(b->comm, &rank);
    *wrong = 0;
    if (o->check) {
        int seed = si * 31 + a;
        void *in = o->in_place || o->kind == TS_COLL_ALLGATHER || o->kind == TS_COLL_BCAST ? b->rbuf : b->sbuf;
        if (o->device) TS_TRY(ts_err_agree(b->comm, ts_coll_device_fill(in, count, o->dt, rank, seed)));
        else fill_host(o, in, count, rank, b->ranks, seed);
        TS_TRY(ts_coll_run(b->c, o->kind, o->algos[a], send, b->rbuf, count, o->dt, o->op, o->root));
        unsigned long long w = 0;
        if (o->device) {
            size_t dw = 0;
            TS_TRY(ts_err_agree(b->comm, ts_coll_device_wrong(b->rbuf, count, o->dt, b->ranks, o->op, seed, &dw)));
            w = dw;
        } else {
            w = count_wrong(o, b->rbuf, count, rank, b->ranks, seed);
        }
        TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, b->comm));
        *wrong = (size_t)w;
    }
    /* warm-up, then size the timed loop from the slowest rank */
    TS_TRY(ts_coll_run(b->c, o->kind, o->algos[a], send, b->rbuf, count, o->dt, o->op, o->root));
    double t = ts_time_now();
    TS_TRY(ts_coll_run(b->c, o->kind, o->algos[a], send, b->rbuf, count, o->dt, o->op, o->root));
    t = ts_time_now() - t;
    TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, b->comm));
    double n = o->target_s / (t > 1e-7 ? t : 1e-7);
    *iters = n < 1 ? 1 : n > 100000 ? 100000 : (int)n;
    return 0;
}

/* Collective. Interleaved repetitions (every algorithm sees the same noise):
 * all[a * repeat + r] = the slowest rank's mean call time. */
static int repetitions(ts_coll_bench *b, size_t count, const int *iters, double *all)
{
    const ts_coll_bench_opts *o = &b->o;
    const void *send = o->in_place ? TS_IN_PLACE : b->sbuf;
    int err = 0;
    for (int r = 0; r < o->repeat && !err; r++)
        for (int a = 0; a < o->nalgo; a++) {
            /* one untimed call first: what the previous algorithm left
             * behind (MPI's deferred work, cache state) is not charged here */
            err = ts_coll_run(b->c, o->kind, o->algos[a], send, b->rbuf, count, o->dt, o->op, o->root);
            if (err) break;
            MPI_Barrier(b->comm);
            double t = ts_time_now();
            for (int k = 0; k < iters[a]; k++) {
                err = ts_coll_run(b->c, o->kind, o->algos[a], send, b->rbuf, count, o->dt, o->op, o->root);
                if (err) break;
            }
            t = (ts_time_now() - t) / iters[a];
            if (err) break;
            MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, b->comm);
            all[a * o->repeat + r] = t;
        }
    return err;
}

int ts_coll_bench_size(ts_coll_bench *b, int si)
{
    const ts_coll_bench_opts *o = &b->o;
    const size_t es = ts_dtype_size(o->dt), bytes = b->sizes[si], count = bytes / es;
    size_t wrong[TS_COLL_BENCH_MAX_ALGOS];
    int iters[TS_COLL_BENCH_MAX_ALGOS];
    double med[TS_COLL_BENCH_MAX_ALGOS];
    if (si != b->done) return TS_ERR(TS_ERR_ARG, "bench coll: size %d measured out of order (next: %d)", si, b->done);
    for (int a = 0; a < o->nalgo; a++) TS_TRY(prepare(b, si, a, count, &wrong[a], &iters[a]));
    double *all = malloc(sizeof *all * (size_t)(o->nalgo * o->repeat));
    if (!all) return TS_ERR(TS_ERR_NOMEM, "samples");
    int err = repetitions(b, count, iters, all);
    if (err) {
        free(all);
        return err;
    }
    int mpi_idx = -1;
    for (int a = 0; a < o->nalgo; a++) {
        memcpy(b->samples, all + a * o->repeat, sizeof *b->samples * (size_t)o->repeat);
        qsort(b->samples, (size_t)o->repeat, sizeof *b->samples, cmp_double);
        med[a] = o->repeat % 2 ? b->samples[o->repeat / 2]
                               : 0.5 * (b->samples[o->repeat / 2 - 1] + b->samples[o->repeat / 2]);
        if (!strcmp(o->algos[a], "mpi")) mpi_idx = a;
    }
    free(all);
    for (int a = 0; a < o->nalgo; a++) {
        ts_coll_bench_row *w = &b->rows[si][a];
        memset(w, 0, sizeof *w);
        w->bytes = bytes;
        w->algo = o->algos[a];
        w->time_s = med[a];
        w->algbw_GBps = bytes / med[a] / 1e9;
        w->busbw_GBps = w->algbw_GBps * bus_factor(o->kind, b->ranks);
        w->wrong = wrong[a];
        w->vs_mpi = mpi_idx >= 0 ? med[mpi_idx] / med[a] : -1;
        if (!strcmp(o->algos[a], "auto")) {
            const char *why = "", *chosen;
            if (o->device) chosen = ts_coll_device_choice(b->c, o->kind, count, o->dt, o->op, &why);
            else chosen = ts_coll_choice(b->c, o->kind, count, o->dt, o->op, &why);
            snprintf(w->chosen, sizeof w->chosen, "%s", chosen ? chosen : "");
            snprintf(w->why, sizeof w->why, "%s", why ? why : "");
        }
    }
    b->done++;
    return 0;
}

static int write_json(const ts_coll_bench *b, const char *path)
{
    const ts_coll_bench_opts *o = &b->o;
    int err = 0;
    cJSON *json = cJSON_CreateArray();
    for (int si = 0; si < b->done && json; si++)
        for (int a = 0; a < o->nalgo; a++) {
            const ts_coll_bench_row *w = &b->rows[si][a];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "op", ts_coll_kind_name(o->kind));
            cJSON_AddStringToObject(e, "algo", w->algo);
            if (*w->chosen) cJSON_AddStringToObject(e, "chosen", w->chosen);
            cJSON_AddNumberToObject(e, "ranks", b->ranks);
            cJSON_AddNumberToObject(e, "nodes", b->nodes);
            cJSON_AddNumberToObject(e, "bytes", (double)w->bytes);
            cJSON_AddStringToObject(e, "dtype", ts_dtype_name(o->dt));
            cJSON_AddStringToObject(e, "reduce", ts_coll_op_name(o->op));
            cJSON_AddNumberToObject(e, "time_us", w->time_s * 1e6);
            cJSON_AddNumberToObject(e, "algbw_GBps", w->algbw_GBps);
            cJSON_AddNumberToObject(e, "busbw_GBps", w->busbw_GBps);
            if (o->check) cJSON_AddNumberToObject(e, "wrong", (double)w->wrong);
            else cJSON_AddNullToObject(e, "wrong");
            cJSON_AddItemToArray(json, e);
        }
    char *text = json ? cJSON_Print(json) : NULL;
    FILE *f = text ? fopen(path, "w") : NULL;
    if (!f || fputs(text, f) < 0 || fputc('\n', f) < 0) err = TS_ERR(TS_ERR_IO, "%s: cannot write", path);
    if (f && fclose(f) != 0 && !err) err = TS_ERR(TS_ERR_IO, "%s: cannot write", path);
    free(text);
    cJSON_Delete(json);
    return err;
}

/* the tuning table: the fastest algorithm per size bucket, then the α-β
 * model of each algorithm (collectives/cost_model.h, for tessera plan) */
static int write_tuning(ts_coll_bench *b, const char *path)
{
    const ts_coll_bench_opts *o = &b->o;
    const char *best_algo[TS_COLL_BENCH_MAX_SIZES];
    size_t bucket[TS_COLL_BENCH_MAX_SIZES];
    double bytes[TS_COLL_BENCH_MAX_SIZES], t[TS_COLL_BENCH_MAX_SIZES];
    const size_t es = ts_dtype_size(o->dt);
    const int n = b->done;
    for (int si = 0; si < n; si++) {
        int best = -1;
        for (int a = 0; a < o->nalgo; a++)
            if (strcmp(o->algos[a], "auto") && (best < 0 || b->rows[si][a].time_s < b->rows[si][best].time_s)) best = a;
        best_algo[si] = best >= 0 ? o->algos[best] : "auto";
        bucket[si] = si + 1 < n ? (b->sizes[si] + b->sizes[si + 1]) / 2 : (size_t)-1 / 2;
        bytes[si] = (double)(b->sizes[si] ? b->sizes[si] : es);
    }
    TS_TRY(ts_coll_tuning_write(path, o->kind, b->ranks, b->nodes, bucket, best_algo, n));
    b->nfits = 0;
    for (int a = 0; a < o->nalgo && b->ranks > 1; a++) {
        if (!strcmp(o->algos[a], "auto") || n < 2) continue;
        for (int si = 0; si < n; si++) t[si] = b->rows[si][a].time_s;
        if (ts_coll_model_fit(ts_coll_kind_name(o->kind), o->algos[a], b->ranks, b->nodes, bytes, t, n,
                              &b->fits[b->nfits])) {
            ts_err_clear();
            continue;
        }
        b->nfits++;
    }
    return b->nfits ? ts_coll_model_write(path, b->fits, b->nfits) : 0;
}

int ts_coll_bench_finish(ts_coll_bench *b, const char *json, const char *tune)
{
    int rank, lerr = 0;
    MPI_Comm_rank(b->comm, &rank);
    if (rank == 0 && json) lerr = write_json(b, json);
    if (rank == 0 && tune && !lerr) lerr = write_tuning(b, tune);
    return ts_err_agree(b->comm, lerr);
}

int ts_coll_bench_wrong(const ts_coll_bench *b)
{
    if (!b->o.check) return 0;
    for (int si = 0; si < b->done; si++)
        for (int a = 0; a < b->o.nalgo; a++)
            if (b->rows[si][a].wrong > 0)
                return TS_ERR(TS_ERR_INTERNAL, "bench coll --check: %s at %.0f bytes gave %.0f wrong elements",
                              b->rows[si][a].algo, (double)b->rows[si][a].bytes, (double)b->rows[si][a].wrong);
    return 0;
}

void ts_coll_bench_destroy(ts_coll_bench **pb)
{
    ts_coll_bench *b = pb ? *pb : NULL;
    if (!b) return;
    if (b->o.registered && b->rbuf && b->c) ts_coll_buffer_free(b->c, &b->rbuf);
    else if (b->o.device) {
        ts_coll_device_free(b->rbuf);
        ts_coll_device_free(b->sbuf);
    } else {
        free(b->rbuf);
        free(b->sbuf);
    }
    free(b->hbuf);
    free(b->samples);
    ts_coll_destroy(&b->c);
    if (b->comm != MPI_COMM_NULL) MPI_Comm_free(&b->comm);
    free(b);
    *pb = NULL;
}
