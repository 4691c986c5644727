/* Run directory, metrics, perf report and progress; see run.h. */
#include "tsbuild.h"
#include "src/train/run.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const phase_names[TS_PH_COUNT] = {"data_wait", "forward", "backward", "comm_exposed",
                                                     "comm_total", "optimizer", "eval", "checkpoint", "step"};
const char *ts_phase_name(int p) { return p >= 0 && p < TS_PH_COUNT ? phase_names[p] : "?"; }

static int mkdir_p(const char *path)
{
    char b[1024];
    snprintf(b, sizeof b, "%s", path);
    for (char *p = b + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(b, 0777) && errno != EEXIST) return TS_ERR(TS_ERR_IO, "%s: cannot create: %s", b, strerror(errno));
            *p = '/';
        }
    if (mkdir(b, 0777) && errno != EEXIST) return TS_ERR(TS_ERR_IO, "%s: cannot create: %s", b, strerror(errno));
    return 0;
}

int ts_run_open(ts_run *r, MPI_Comm comm, const char *dir, const ts_config *cfg, double log_seconds)
{
    int err = 0;
    memset(r, 0, sizeof *r);
    MPI_Comm_rank(comm, &r->rank);
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    r->log_seconds = log_seconds;
    r->tty = isatty(STDOUT_FILENO);
    r->t_start = r->t_last_print = ts_time_now();
    if (r->rank == 0) {
        char p[1100];
        snprintf(p, sizeof p, "%s/ckpt", dir);
        err = mkdir_p(p);
        if (!err) {
            snprintf(p, sizeof p, "%s/config.ini", dir);
            char tmp[1200];
            snprintf(tmp, sizeof tmp, "%s.tmp", p);
            FILE *f = fopen(tmp, "w");
            if (!f) err = TS_ERR(TS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
            else {
                err = ts_config_write(cfg, f);
                if (fclose(f) && !err) err = TS_ERR(TS_ERR_IO, "%s: write failed", tmp);
                if (!err && rename(tmp, p)) err = TS_ERR(TS_ERR_IO, "%s: cannot rename: %s", p, strerror(errno));
            }
        }
        if (!err) {
            snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
            r->metrics = fopen(p, "a");
            if (!r->metrics) err = TS_ERR(TS_ERR_IO, "%s: cannot open: %s", p, strerror(errno));
        }
    }
    return ts_err_agree(comm, err);
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
                   const double *dice, int K, const char *const *class_names)
{
    if (r->rank != 0 || !r->metrics) return 0;
    fprintf(r->metrics, "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"samples_per_s\": %.6g",
            (long long)step, (long long)epoch, loss, lr, samples_per_s);
    if (dice) {
        fprintf(r->metrics, ", \"dice\": [");
        for (int k = 0; k < K; k++) fprintf(r->metrics, "%s%.6g", k ? ", " : "", dice[k] != dice[k] ? -1.0 : dice[k]);
        fprintf(r->metrics, "]");
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

int ts_run_perf(ts_run *r, MPI_Comm comm, const double *phase_s, int64_t steps, double samples_per_s,
                const char *const *counter_names, const long long *counters, int ncounters, const char *extra_json)
{
    int size, err = 0;
    MPI_Comm_size(comm, &size);
    double mn[TS_PH_COUNT], mx[TS_PH_COUNT], sum[TS_PH_COUNT];
    TS_MPI(MPI_Allreduce(phase_s, mn, TS_PH_COUNT, MPI_DOUBLE, MPI_MIN, comm));
    TS_MPI(MPI_Allreduce(phase_s, mx, TS_PH_COUNT, MPI_DOUBLE, MPI_MAX, comm));
    TS_MPI(MPI_Allreduce(phase_s, sum, TS_PH_COUNT, MPI_DOUBLE, MPI_SUM, comm));
    long long cmn[64] = {0}, cmx[64] = {0}, csum[64] = {0};
    if (ncounters > 64) ncounters = 64;
    if (ncounters > 0) {
        TS_MPI(MPI_Allreduce(counters, cmn, ncounters, MPI_LONG_LONG, MPI_MIN, comm));
        TS_MPI(MPI_Allreduce(counters, cmx, ncounters, MPI_LONG_LONG, MPI_MAX, comm));
        TS_MPI(MPI_Allreduce(counters, csum, ncounters, MPI_LONG_LONG, MPI_SUM, comm));
    }
    if (r->rank == 0) {
        char p[1100], tmp[1200];
        snprintf(p, sizeof p, "%s/perf.json", r->dir);
        snprintf(tmp, sizeof tmp, "%s.tmp", p);
        FILE *f = fopen(tmp, "w");
        if (!f) TS_FAIL(TS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        fprintf(f, "{\n  \"ranks\": %d,\n  \"steps\": %lld,\n  \"samples_per_s\": %.6g,\n  \"phases_s\": {\n", size,
                (long long)steps, samples_per_s);
        for (int i = 0; i < TS_PH_COUNT; i++)
            fprintf(f, "    \"%s\": {\"min\": %.6f, \"mean\": %.6f, \"max\": %.6f}%s\n", phase_names[i], mn[i],
                    sum[i] / size, mx[i], i + 1 < TS_PH_COUNT ? "," : "");
        fprintf(f, "  },\n  \"counters\": {");
        for (int i = 0; i < ncounters; i++)
            fprintf(f, "%s\n    \"%s\": {\"min\": %lld, \"mean\": %.1f, \"max\": %lld}", i ? "," : "", counter_names[i],
                    cmn[i], (double)csum[i] / size, cmx[i]);
        fprintf(f, "%s}%s%s\n}\n", ncounters ? "\n  " : "", extra_json ? ",\n  " : "", extra_json ? extra_json : "");
        int bad = fclose(f) != 0;
        if (bad || rename(tmp, p)) TS_FAIL(TS_ERR_IO, "%s: write failed", p);
    }
cleanup:
    return ts_err_agree(comm, err);
}
