/* Run directory, metrics, perf report and progress; see run.h. Owns the
 * run directory's files (config.ini, metrics.jsonl, perf.json,
 * launches.jsonl, stopped; ckpt/ created and tested), written by rank 0, and
 * the progress lines; must not write or read a checkpoint (io/checkpoint.c). */
#include "tsbuild.h"
#include "src/train/run.h"
#include "src/core/error.h"
#include "src/core/launch.h"
#include "src/core/path.h"
#include "src/core/timer.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *const ts_phase_names[TS_PH_COUNT] = {
#define TS_PH_NAME_(id, name, kind, what) name,
    TS_PHASE_LIST(TS_PH_NAME_)
#undef TS_PH_NAME_
};
static const char *const phase_kinds[TS_PH_COUNT] = {
#define TS_PH_KIND_(id, name, kind, what) kind,
    TS_PHASE_LIST(TS_PH_KIND_)
#undef TS_PH_KIND_
};
const char *ts_phase_name(int p) { return p >= 0 && p < TS_PH_COUNT ? ts_phase_names[p] : "?"; }
const char *ts_phase_kind(int p) { return p >= 0 && p < TS_PH_COUNT ? phase_kinds[p] : "?"; }

/* creates path and its parents (any length: the copy is the path's own size) */
static int mkdir_p(const char *path)
{
    int err = 0;
    char *b = strdup(path);
    if (!b) return TS_ERR(TS_ERR_NOMEM, "%s", path);
    for (char *p = b + 1; *p && !err; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(b, 0777) && errno != EEXIST) err = TS_ERR(TS_ERR_IO, "%s: cannot create: %s", b, strerror(errno));
            *p = '/';
        }
    if (!err && mkdir(b, 0777) && errno != EEXIST) err = TS_ERR(TS_ERR_IO, "%s: cannot create: %s", b, strerror(errno));
    free(b);
    return err;
}

/* The longest run directory: what fits r->dir. The names built under it
 * (config.ini.tmp, ckpt/, perf.json, ...) are checked again where built. */
#define RUN_DIR_MAX (sizeof(((ts_run *)0)->dir) - 1)

int ts_run_open(ts_run *r, MPI_Comm comm, const char *dir, const ts_config *cfg, double log_seconds)
{
    int err = 0;
    memset(r, 0, sizeof *r);
    MPI_Comm_rank(comm, &r->rank);
    /* the key as given, before any caller could have cut it to a buffer */
    const char *given = NULL;
    if (cfg && ts_config_isset(cfg, "run.dir") && !ts_config_get_str(cfg, "run.dir", &given))
        err = ts_path_check(given, RUN_DIR_MAX + 1, "run.dir");
    if (!err) err = ts_path_check(dir, RUN_DIR_MAX + 1, given ? "run.dir" : "the run directory");
    if (err) return ts_err_agree(comm, err);
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    r->log_seconds = log_seconds;
    r->tty = isatty(STDOUT_FILENO);
    r->t_start = r->t_last_print = ts_time_now();
    if (r->rank == 0) {
        char p[1100], tmp[1200];
        err = ts_path_join(p, sizeof p, dir, "ckpt");
        if (!err) err = mkdir_p(p);
        if (!err) err = ts_path_join(p, sizeof p, dir, "config.ini");
        if (!err) err = ts_path_fmt(tmp, sizeof tmp, "run.dir", "%s.tmp", p);
        if (!err) {
            FILE *f = fopen(tmp, "w");
            if (!f) err = TS_ERR(TS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
            else {
                err = ts_config_write(cfg, f);
                if (fclose(f) && !err) err = TS_ERR(TS_ERR_IO, "%s: write failed", tmp);
                if (!err && rename(tmp, p)) err = TS_ERR(TS_ERR_IO, "%s: cannot rename: %s", p, strerror(errno));
            }
        }
        if (!err) err = ts_path_join(p, sizeof p, dir, "stopped");
        if (!err) remove(p); /* a new start: no longer stopped */
        if (!err) err = ts_path_join(p, sizeof p, dir, "ckpt/.write-test");
        if (!err) { /* ckpt/ must take files now, not when the first checkpoint is due hours later */
            FILE *w = fopen(p, "w");
            int bad = !w || fputs("tessera\n", w) < 0;
            if (w && fclose(w) != 0) bad = 1;
            if (bad) err = TS_ERR(TS_ERR_IO, "%s/ckpt: cannot write checkpoints there: %s", dir, strerror(errno));
            unlink(p);
        }
        if (!err) err = ts_path_join(p, sizeof p, dir, "metrics.jsonl");
        if (!err) {
            r->metrics = fopen(p, "a");
            if (!r->metrics) err = TS_ERR(TS_ERR_IO, "%s: cannot open: %s", p, strerror(errno));
        }
    }
    return ts_err_agree(comm, err);
}

int ts_run_truncate_metrics(ts_run *r, int64_t step)
{
    if (r->rank != 0 || !r->metrics) return 0;
    char p[1100], tmp[1200], line[8192];
    snprintf(p, sizeof p, "%s/metrics.jsonl", r->dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    fclose(r->metrics);
    r->metrics = NULL;
    FILE *in = fopen(p, "r"), *out = fopen(tmp, "w");
    int err = 0, dropped = 0;
    if (!in || !out) err = TS_ERR(TS_ERR_IO, "%s: cannot rewrite: %s", p, strerror(errno));
    while (!err && fgets(line, sizeof line, in)) {
        const char *k = strstr(line, "\"step\": ");
        const long long s = k ? atoll(k + 8) : 0;
        if (k && s > step) {
            dropped++;
            continue;
        }
        if (fputs(line, out) < 0) err = TS_ERR(TS_ERR_IO, "%s: write failed", tmp);
    }
    if (in) fclose(in);
    if (out && fclose(out) != 0 && !err) err = TS_ERR(TS_ERR_IO, "%s: write failed", tmp);
    if (!err && dropped && rename(tmp, p) != 0) err = TS_ERR(TS_ERR_IO, "%s: cannot rename: %s", p, strerror(errno));
    if (!dropped || err) unlink(tmp);
    r->metrics = fopen(p, "a");
    if (!r->metrics && !err) err = TS_ERR(TS_ERR_IO, "%s: cannot open: %s", p, strerror(errno));
    return err;
}

void ts_run_close(ts_run *r)
{
    if (r->bar_open) {
        fputc('\n', stdout);
        r->bar_open = 0;
    }
    if (r->metrics) fclose(r->metrics);
    r->metrics = NULL;
}

int ts_run_metrics(ts_run *r, int64_t step, int64_t epoch, double loss, double lr, double samples_per_s,
                   const double *dice, const double *hd95, const double *nsd, int K, const char *const *class_names)
{
    if (r->rank != 0 || !r->metrics) return 0;
    /* JSON has no NaN or Inf: a non-finite loss is null, flagged */
    if (isfinite(loss))
        fprintf(r->metrics, "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"samples_per_s\": %.6g",
                (long long)step, (long long)epoch, loss, lr, samples_per_s);
    else
        fprintf(r->metrics, "{\"step\": %lld, \"epoch\": %lld, \"loss\": null, \"nonfinite\": true, \"lr\": %.9g, "
                            "\"samples_per_s\": %.6g", (long long)step, (long long)epoch, lr, samples_per_s);
    if (dice) {
        fprintf(r->metrics, ", \"dice\": [");
        for (int k = 0; k < K; k++) fprintf(r->metrics, "%s%.6g", k ? ", " : "", dice[k] != dice[k] ? -1.0 : dice[k]);
        fprintf(r->metrics, "]");
        for (int m = 0; m < 2; m++) { /* eval.surface: null where not finite (a class missed or absent) */
            const double *v = m ? nsd : hd95;
            if (!v) continue;
            fprintf(r->metrics, ", \"%s\": [", m ? "nsd" : "hd95_mm");
            for (int k = 0; k < K; k++) {
                if (isfinite(v[k])) fprintf(r->metrics, "%s%.9g", k ? ", " : "", v[k]);
                else fprintf(r->metrics, "%snull", k ? ", " : "");
            }
            fprintf(r->metrics, "]");
        }
        if (class_names) {
            fprintf(r->metrics, ", \"classes\": [");
            for (int k = 0; k < K; k++) fprintf(r->metrics, "%s\"%s\"", k ? ", " : "", class_names[k]);
            fprintf(r->metrics, "]");
        }
    }
    fprintf(r->metrics, "}\n");
    if (fflush(r->metrics) != 0) return TS_ERR(TS_ERR_IO, "%s/metrics.jsonl: write failed (disk full?)", r->dir);
    return 0;
}

static void fmt_eta(double s, char *b, size_t n)
{
    if (s < 0 || s != s) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(b, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else snprintf(b, n, "%ldm%02lds", t / 60, t % 60);
}

void ts_run_progress(ts_run *r, int64_t step, double loss, double samples_per_s, int force)
{
    if (r->rank != 0) return;
    double now = ts_time_now();
    int64_t done = step - r->first_step, left = r->total_steps - step;
    double eta = done > 0 ? (now - r->t_start) / (double)done * (double)left : 0;
    char e[32];
    fmt_eta(eta, e, sizeof e);
    if (r->tty) {
        if (!force && now - r->t_last_print < 0.2 && step < r->total_steps) return;
        int width = 30, fill = r->total_steps ? (int)(width * step / r->total_steps) : width;
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        printf("\r[%s] step %lld/%lld  loss %.4f  %.2f samples/s  ETA %s ", bar, (long long)step,
               (long long)r->total_steps, loss, samples_per_s, e);
        r->bar_open = 1;
    } else {
        if (!force && now - r->t_last_print < r->log_seconds) return;
        printf("step %lld/%lld  loss %.4f  %.2f samples/s  elapsed %.0f s  ETA %s\n", (long long)step,
               (long long)r->total_steps, loss, samples_per_s, now - r->t_start, e);
    }
    fflush(stdout);
    r->t_last_print = now;
}

void ts_run_say(ts_run *r, const char *fmt, ...)
{
    if (r->rank != 0) return;
    if (r->bar_open) {
        fputc('\n', stdout);
        r->bar_open = 0;
    }
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
}

/* statistics over the ranks that have a value (have[r] != 0) */
typedef struct {
    double min, mean, max;
    int n;
} stats;
static stats stats_of(const double *v, const int *have, int size, int stride)
{
    stats s = {0, 0, 0, 0};
    for (int r = 0; r < size; r++) {
        if (have && !have[r]) continue;
        double x = v[(size_t)r * (size_t)stride];
        if (s.n == 0 || x < s.min) s.min = x;
        if (s.n == 0 || x > s.max) s.max = x;
        s.mean += x;
        s.n++;
    }
    if (s.n) s.mean /= s.n;
    return s;
}

/* {"min": .., "mean": .., "max": .., "imbalance": .., "per_rank": [..]} */
static void write_stats(FILE *f, const double *v, const int *have, int size, int stride, const char *fmt)
{
    stats s = stats_of(v, have, size, stride);
    char b[64];
    fprintf(f, "{\"min\": ");
    fprintf(f, fmt, s.min);
    fprintf(f, ", \"mean\": ");
    fprintf(f, fmt, s.mean);
    fprintf(f, ", \"max\": ");
    fprintf(f, fmt, s.max);
    if (s.mean > 0) fprintf(f, ", \"imbalance\": %.4f", s.max / s.mean);
    else fprintf(f, ", \"imbalance\": null");
    fprintf(f, ", \"per_rank\": [");
    for (int r = 0; r < size; r++) {
        if (have && !have[r]) snprintf(b, sizeof b, "null");
        else snprintf(b, sizeof b, fmt, v[(size_t)r * (size_t)stride]);
        fprintf(f, "%s%s", r ? ", " : "", b);
    }
    fprintf(f, "]}");
}

/* sum over ranks of phase ph's event e (ranks that count it), and how many */
static double sum_count(const double *cnt, const int *have, int size, int nph, int nev, int ph, int e, int *n)
{
    double s = 0;
    *n = 0;
    for (int r = 0; r < size; r++)
        if (have[(size_t)r * (size_t)nev + (size_t)e]) {
            s += cnt[((size_t)r * (size_t)nph + (size_t)ph) * (size_t)nev + (size_t)e];
            (*n)++;
        }
    return s;
}

/* Rank 0's gathered figures: per rank the phase seconds sec[rank][phase],
 * the counters cnt[rank][phase][event], which events counted
 * have[rank][event]; tcol and hcol are one column's scratch. */
typedef struct perf_gathered {
    int size, nph, nev;
    const double *sec, *cnt;
    const int *have;
    double *tcol;
    int *hcol;
} perf_gathered;

/* perf.json's "counters": each event's status, then per phase per event
 * the statistics over the ranks that counted it (rank 0). */
static void write_counters(FILE *f, const ts_perf *perf, const perf_gathered *g)
{
    const int size = g->size, nph = g->nph, nev = g->nev;
    const double *cnt = g->cnt;
    const int *have = g->have;
    double *tcol = g->tcol;
    int *hcol = g->hcol;
    /* counters: status, then per phase per event */
    fprintf(f, "},\n  \"counters\": {\n    \"scope\": \"the main thread of each rank\",\n    \"events\": [");
    for (int e = 0; e < nev; e++) {
        const ts_perf_event *ev = ts_perf_event_info(perf, e);
        char reason[600];
        size_t k = 0;
        for (const char *c = ev->reason; *c && k + 2 < sizeof reason; c++) {
            if (*c == '"' || *c == '\\') reason[k++] = '\\';
            reason[k++] = (unsigned char)*c < 0x20 ? ' ' : *c;
        }
        reason[k] = '\0';
        int n = 0;
        for (int q = 0; q < size; q++) n += have[(size_t)q * (size_t)nev + (size_t)e];
        fprintf(f, "%s\n      {\"name\": \"%s\", \"available\": %s, \"ranks_counting\": %d, \"source\": \"%s\", "
                   "\"unit\": \"%s\", \"fallback\": %s",
                e ? "," : "", ev->name, n == size ? "true" : "false", n,
                ts_perf_source_name(ev->source), ev->unit, ev->fallback ? "true" : "false");
        if (ev->reason_rank >= 0) fprintf(f, ", \"reason\": \"%s\", \"reason_rank\": %d", reason, ev->reason_rank);
        fprintf(f, "}");
    }
    fprintf(f, "%s],\n    \"phases\": {", nev ? "\n    " : "");
    int firstp = 1;
    for (int i = 0; i < nph && nev; i++) {
        fprintf(f, "%s\n      \"%s\": {", firstp ? "" : ",", ts_perf_phase_name(perf, i));
        firstp = 0;
        int firste = 1;
        for (int e = 0; e < nev; e++) {
            int n = 0;
            for (int q = 0; q < size; q++) {
                hcol[q] = have[(size_t)q * (size_t)nev + (size_t)e];
                tcol[q] = cnt[((size_t)q * (size_t)nph + (size_t)i) * (size_t)nev + (size_t)e];
                n += hcol[q];
            }
            if (!n) continue;
            fprintf(f, "%s\n        \"%s\": ", firste ? "" : ",", ts_perf_event_info(perf, e)->name);
            firste = 0;
            write_stats(f, tcol, hcol, size, 1, "%.0f");
        }
        fprintf(f, "%s}", firste ? "" : "\n      ");
    }
    fprintf(f, "%s}\n  },\n", firstp ? "" : "\n    ");
}

/* perf.json's "derived": IPC, counter and model GFLOP/s, CPU busy fraction,
 * collective bytes per step (rank 0). Returns 1 if anything was written. */
static int write_derived(FILE *f, const ts_perf *perf, const perf_gathered *g, int64_t steps, const ts_run_derived *d)
{
    const int size = g->size, nph = g->nph, nev = g->nev;
    const double *cnt = g->cnt, *sec = g->sec;
    const int *have = g->have;
    /* derived figures */
    fprintf(f, "  \"derived\": {");
    int firstd = 1;
#define SEP() (firstd ? (firstd = 0, "\n    ") : ",\n    ")
    const int ins = ts_perf_find(perf, "PAPI_TOT_INS"), cyc = ts_perf_find(perf, "PAPI_TOT_CYC");
    int fp = ts_perf_find(perf, "PAPI_FP_OPS");
    if (fp < 0) fp = ts_perf_find(perf, "PAPI_SP_OPS");
    const int clk = ts_perf_find(perf, "perf::TASK-CLOCK");
    if (ins >= 0 && cyc >= 0) {
        fprintf(f, "%s\"ipc\": {", SEP());
        for (int i = 0, k = 0; i < nph; i++) {
            int n1, n2;
            double a = sum_count(cnt, have, size, nph, nev, i, ins, &n1), b = sum_count(cnt, have, size, nph, nev, i, cyc, &n2);
            if (b > 0) fprintf(f, "%s\"%s\": %.4f", k++ ? ", " : "", ts_perf_phase_name(perf, i), a / b);
        }
        fprintf(f, "}");
    }
    if (fp >= 0) {
        fprintf(f, "%s\"counter_gflops_per_s_per_rank\": {", SEP());
        for (int i = 0, k = 0; i < nph; i++) {
            int n;
            double a = sum_count(cnt, have, size, nph, nev, i, fp, &n);
            stats st = stats_of(sec + i, NULL, size, nph);
            if (st.mean > 0 && n) fprintf(f, "%s\"%s\": %.4f", k++ ? ", " : "", ts_perf_phase_name(perf, i), a / n / st.mean / 1e9);
        }
        fprintf(f, "}");
    }
    if (clk >= 0) { /* CPU time of the main thread over wall time: < 1 where it waits or is descheduled */
        fprintf(f, "%s\"cpu_busy_fraction\": {", SEP());
        for (int i = 0, k = 0; i < nph; i++) {
            int n;
            double a = sum_count(cnt, have, size, nph, nev, i, clk, &n);
            stats st = stats_of(sec + i, NULL, size, nph);
            if (st.mean > 0 && n) fprintf(f, "%s\"%s\": %.4f", k++ ? ", " : "", ts_perf_phase_name(perf, i), a / n / 1e9 / st.mean);
        }
        fprintf(f, "}");
    }
    if (d && d->flops_forward > 0 && steps > 0) {
        stats sf = stats_of(sec + TS_PH_FORWARD, NULL, size, nph), sb = stats_of(sec + TS_PH_BACKWARD, NULL, size, nph);
        stats ss = stats_of(sec + TS_PH_STEP, NULL, size, nph);
        const double ft = d->flops_forward + d->flops_backward;
        fprintf(f, "%s\"model_flops_per_step_per_rank\": {\"forward\": %.6g, \"backward\": %.6g}", SEP(),
                d->flops_forward, d->flops_backward);
        fprintf(f, "%s\"model_gflops_per_s_per_rank\": {\"forward\": %.4f, \"backward\": %.4f, \"step\": %.4f}", SEP(),
                sf.mean > 0 ? d->flops_forward * (double)steps / sf.mean / 1e9 : 0.0,
                sb.mean > 0 ? d->flops_backward * (double)steps / sb.mean / 1e9 : 0.0,
                ss.mean > 0 ? ft * (double)steps / ss.mean / 1e9 : 0.0);
        fprintf(f, "%s\"model_gflops_per_s_total\": %.4f", SEP(), ss.max > 0 ? ft * (double)steps * size / ss.max / 1e9 : 0.0);
    }
    if (d) {
        const int pr = d->grad_ranks > 1 ? d->grad_ranks : 1;
        fprintf(f, "%s\"collective_bytes_per_step\": {\"gradient_allreduce\": %.0f, \"gradient_allreduce_bus\": %.0f, "
                   "\"halo_sent_per_rank\": %.0f, \"spatial_sums\": %lld}",
                SEP(), pr > 1 ? d->grad_bytes : 0.0, pr > 1 ? d->grad_bytes * 2.0 * (pr - 1) / pr : 0.0, d->halo_bytes,
                (long long)d->spatial_sums);
    }
#undef SEP
    return !firstd;
}

int ts_run_perf(ts_run *r, MPI_Comm comm, const ts_perf *perf, int64_t steps, double samples_per_s,
                const ts_run_derived *d, const char *extra_json)
{
    int size, rank, err = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    const int nph = ts_perf_nphase(perf), nev = ts_perf_nevents(perf);
    const size_t per = (size_t)nph * (size_t)(1 + nev) + (size_t)nev; /* seconds, counters, counted flags */
    double *mine = calloc(per, sizeof *mine), *all = NULL, *sec = NULL, *cnt = NULL, *tcol = NULL;
    int *have = NULL, *hcol = NULL;
    FILE *f = NULL;
    char tmp[1200], p[1100];
    if (!mine) return TS_ERR(TS_ERR_NOMEM, "perf report");
    for (int i = 0; i < nph; i++) mine[i] = ts_perf_seconds(perf, i);
    for (int i = 0; i < nph; i++)
        for (int e = 0; e < nev; e++) mine[(size_t)nph + (size_t)i * (size_t)nev + (size_t)e] = (double)ts_perf_count(perf, i, e);
    for (int e = 0; e < nev; e++)
        mine[(size_t)nph * (size_t)(1 + nev) + (size_t)e] = ts_perf_event_info(perf, e)->source != TS_PERF_SRC_NONE;
    int lerr = 0;
    if (rank == 0 && !(all = malloc(sizeof *all * per * (size_t)size))) lerr = TS_ERR(TS_ERR_NOMEM, "perf report");
    TS_CHECK(ts_err_agree(comm, lerr));
    TS_MPI(MPI_Gather(mine, (int)per, MPI_DOUBLE, all, (int)per, MPI_DOUBLE, 0, comm));
    if (rank == 0) {
        sec = malloc(sizeof *sec * (size_t)nph * (size_t)size);
        cnt = malloc(sizeof *cnt * ((size_t)nph * (size_t)(nev ? nev : 1) * (size_t)size));
        have = malloc(sizeof *have * ((size_t)(nev ? nev : 1) * (size_t)size));
        tcol = malloc(sizeof *tcol * (size_t)size);
        hcol = malloc(sizeof *hcol * (size_t)size);
        if (!sec || !cnt || !have || !tcol || !hcol) lerr = TS_ERR(TS_ERR_NOMEM, "perf report");
    }
    if (rank == 0 && !lerr) {
        for (int q = 0; q < size; q++) {
            const double *a = all + (size_t)q * per;
            for (int i = 0; i < nph; i++) sec[(size_t)q * (size_t)nph + (size_t)i] = a[i];
            for (size_t k = 0; k < (size_t)nph * (size_t)nev; k++) cnt[(size_t)q * (size_t)nph * (size_t)nev + k] = a[(size_t)nph + k];
            for (int e = 0; e < nev; e++) have[(size_t)q * (size_t)nev + (size_t)e] = a[(size_t)nph * (size_t)(1 + nev) + (size_t)e] != 0;
        }
        lerr = ts_path_join(p, sizeof p, r->dir, "perf.json");
        if (!lerr) lerr = ts_path_fmt(tmp, sizeof tmp, "perf.json", "%s.tmp", p);
        if (!lerr) f = fopen(tmp, "w");
        if (!lerr && !f) lerr = TS_ERR(TS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    if (rank == 0 && !lerr) {
        fprintf(f, "{\n  \"ranks\": %d,\n  \"steps\": %lld,\n  \"samples_per_s\": %.6g,\n", size, (long long)steps,
                samples_per_s);
        /* phases: seconds on every rank */
        fprintf(f, "  \"phases_s\": {\n");
        for (int i = 0; i < nph; i++) {
            fprintf(f, "    \"%s\": ", ts_perf_phase_name(perf, i));
            write_stats(f, sec + i, NULL, size, nph, "%.6f");
            fprintf(f, "%s\n", i + 1 < nph ? "," : "");
        }
        fprintf(f, "  },\n  \"phase_kinds\": {");
        for (int i = 0; i < nph; i++)
            fprintf(f, "%s\"%s\": \"%s\"", i ? ", " : "", ts_perf_phase_name(perf, i), ts_phase_kind(i));
        fprintf(f, "},\n  \"phase_calls\": {");
        for (int i = 0; i < nph; i++)
            fprintf(f, "%s\"%s\": %lld", i ? ", " : "", ts_perf_phase_name(perf, i), (long long)ts_perf_calls(perf, i));
        perf_gathered g = {size, nph, nev, sec, cnt, have, tcol, hcol};
        write_counters(f, perf, &g);
        const int wrote = write_derived(f, perf, &g, steps, d);
        char lj[1024];
        ts_launch_json(ts_launch_current(), lj, sizeof lj);
        fprintf(f, "%s},\n  \"launch\": %s%s%s\n}\n", wrote ? "\n  " : "", lj, extra_json ? ",\n  " : "",
                extra_json ? extra_json : "");
        int bad = fclose(f) != 0;
        f = NULL;
        if (bad || rename(tmp, p)) lerr = TS_ERR(TS_ERR_IO, "%s: write failed", p);
    }
    err = lerr;
cleanup:
    if (f) fclose(f);
    free(mine);
    free(all);
    free(sec);
    free(cnt);
    free(have);
    free(tcol);
    free(hcol);
    return ts_err_agree(comm, err);
}

int ts_run_record_launch(ts_run *r, int64_t first_step, int64_t total_steps)
{
    if (r->rank != 0) return 0;
    char p[1100], lj[1024], when[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    ts_launch_json(ts_launch_current(), lj, sizeof lj);
    TS_TRY(ts_path_join(p, sizeof p, r->dir, "launches.jsonl"));
    FILE *f = fopen(p, "a");
    if (!f) return TS_ERR(TS_ERR_IO, "%s: cannot open: %s", p, strerror(errno));
    fprintf(f, "{\"time\": \"%s\", \"first_step\": %lld, \"total_steps\": %lld, \"launch\": %s}\n", when,
            (long long)first_step, (long long)total_steps, lj);
    if (fclose(f)) return TS_ERR(TS_ERR_IO, "%s: write failed", p);
    return 0;
}

int ts_run_mark_stopped(ts_run *r, int64_t step, int64_t total_steps)
{
    if (r->rank != 0) return 0;
    char p[1100], tmp[1200];
    TS_TRY(ts_path_join(p, sizeof p, r->dir, "stopped"));
    TS_TRY(ts_path_fmt(tmp, sizeof tmp, "stopped", "%s.tmp", p));
    FILE *f = fopen(tmp, "w");
    if (!f) return TS_ERR(TS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    fprintf(f, "step %lld of %lld\n", (long long)step, (long long)total_steps);
    if (fclose(f) || rename(tmp, p)) return TS_ERR(TS_ERR_IO, "%s: write failed", p);
    return 0;
}
