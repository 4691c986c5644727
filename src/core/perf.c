/* Per-phase timers and counters; see perf.h. Three ways to count, tried in
 * order for each event: PAPI (one event set, each event added and the set
 * started before it is kept), Linux perf_event_open for the software
 * events, the thread's CPU clock and getrusage(RUSAGE_THREAD). A phase's
 * begin and end each read every counter once: with PAPI one PAPI_read, with
 * perf_event one read(2) per event, with rusage one or two system calls. */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include "tsbuild.h"
#include "src/core/perf.h"
#include "src/core/counters.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#ifdef TS_HAVE_PAPI
#include <papi.h>
#endif
#if defined(__linux__) && __has_include(<linux/perf_event.h>)
#include <linux/perf_event.h>
#include <sys/syscall.h>
#define TS_HAVE_PERF_EVENT 1
#endif

/* the software events and how each fallback counts them */
enum { SW_TASK_CLOCK, SW_CPU_CLOCK, SW_PAGE_FAULTS, SW_MINOR_FAULTS, SW_MAJOR_FAULTS, SW_CONTEXT_SWITCHES,
       SW_CPU_MIGRATIONS, SW_COUNT };
static const char *const sw_names[SW_COUNT] = {"TASK-CLOCK",   "CPU-CLOCK",        "PAGE-FAULTS",   "MINOR-FAULTS",
                                               "MAJOR-FAULTS", "CONTEXT-SWITCHES", "CPU-MIGRATIONS"};
static const char *const fallback_names[] = {"perf::TASK-CLOCK", "perf::PAGE-FAULTS", "perf::CONTEXT-SWITCHES", NULL};
static const char *const auto_names[] = {"PAPI_TOT_CYC", "PAPI_TOT_INS", "PAPI_FP_OPS", "PAPI_L3_TCM", NULL};

struct ts_perf {
    int nphase, timers, nev;
    const char *const *names;
    ts_perf_event ev[TS_PERF_MAX_EVENTS];
    int sw[TS_PERF_MAX_EVENTS];   /* software event kind, or -1 */
    int fd[TS_PERF_MAX_EVENTS];   /* perf_event_open descriptor, or -1 */
    int papi_slot[TS_PERF_MAX_EVENTS]; /* position in the PAPI set, or -1 */
    int papi_set, npapi, papi_running;
    int need_clock, need_rusage;  /* rusage-sourced events present */
    int ncounted;                 /* events counted on this rank */
    /* per phase */
    double seconds[TS_PERF_MAX_PHASES], t0[TS_PERF_MAX_PHASES];
    int64_t calls[TS_PERF_MAX_PHASES];
    int depth[TS_PERF_MAX_PHASES];
    long long acc[TS_PERF_MAX_PHASES][TS_PERF_MAX_EVENTS], c0[TS_PERF_MAX_PHASES][TS_PERF_MAX_EVENTS];
};

const char *ts_perf_source_name(ts_perf_source s)
{
    switch (s) {
    case TS_PERF_SRC_PAPI: return "papi";
    case TS_PERF_SRC_PERF_EVENT: return "perf_event_open";
    case TS_PERF_SRC_RUSAGE: return "rusage";
    default: return "unavailable";
    }
}

/* the software kind of a name ("perf::TASK-CLOCK", any case), or -1 */
static int sw_kind(const char *name)
{
    if (strncasecmp(name, "perf::", 6)) return -1;
    for (int k = 0; k < SW_COUNT; k++)
        if (!strcasecmp(name + 6, sw_names[k])) return k;
    return -1;
}

/* ---- PAPI ---- */
#ifdef TS_HAVE_PAPI
static void papi_reason(int rc, int code, const char *what, char *out, size_t n)
{
    char b[400] = "";
    int disabled = rc == PAPI_ECMP || rc == PAPI_ENOCMP;
#ifdef PAPI_ECMP_DISABLED
    disabled |= rc == PAPI_ECMP_DISABLED;
#endif
    if (disabled) { /* say which component is disabled and why */
        const PAPI_component_info_t *ci = PAPI_get_component_info(PAPI_get_event_component(code));
        for (int k = 0; (!ci || !ci->disabled) && k < PAPI_num_components(); k++) {
            ci = PAPI_get_component_info(k); /* a preset maps to no component: the disabled CPU one */
            if (ci && strcmp(ci->name, "perf_event")) ci = NULL;
        }
        if (ci && ci->disabled) snprintf(b, sizeof b, " (component %s: %s)", ci->name, ci->disabled_reason);
    }
    snprintf(out, n, "%s: %s%s", what, PAPI_strerror(rc), b);
}
#endif

/* Tries to count event i through PAPI: added to the shared set, which must
 * still start and stop with it; kept when it does. */
static int papi_try(ts_perf *p, int i)
{
#ifdef TS_HAVE_PAPI
    if (!ts_counters_init()) {
        snprintf(p->ev[i].reason, sizeof p->ev[i].reason, "PAPI_library_init failed");
        return 0;
    }
    int code, rc;
    if ((rc = PAPI_event_name_to_code(p->ev[i].name, &code)) != PAPI_OK) {
        snprintf(p->ev[i].reason, sizeof p->ev[i].reason, "PAPI does not know the event: %s", PAPI_strerror(rc));
        return 0;
    }
    if (p->papi_set == PAPI_NULL && (rc = PAPI_create_eventset(&p->papi_set)) != PAPI_OK) {
        papi_reason(rc, code, "PAPI_create_eventset", p->ev[i].reason, sizeof p->ev[i].reason);
        p->papi_set = PAPI_NULL;
        return 0;
    }
    if ((rc = PAPI_add_event(p->papi_set, code)) != PAPI_OK) {
        papi_reason(rc, code, "PAPI_add_event", p->ev[i].reason, sizeof p->ev[i].reason);
        return 0;
    }
    long long v[TS_PERF_MAX_EVENTS];
    if ((rc = PAPI_start(p->papi_set)) != PAPI_OK || (rc = PAPI_stop(p->papi_set, v)) != PAPI_OK) {
        papi_reason(rc, code, p->npapi ? "PAPI_start (with the events before it)" : "PAPI_start", p->ev[i].reason,
                    sizeof p->ev[i].reason);
        PAPI_remove_event(p->papi_set, code);
        return 0;
    }
    p->papi_slot[i] = p->npapi++;
    return 1;
#else
    snprintf(p->ev[i].reason, sizeof p->ev[i].reason, "this build has no PAPI (configure --with-papi)");
    (void)p;
    return 0;
#endif
}

/* ---- perf_event_open (software events) ---- */
static int perf_event_try(ts_perf *p, int i)
{
#ifdef TS_HAVE_PERF_EVENT
    static const int cfg[SW_COUNT] = {PERF_COUNT_SW_TASK_CLOCK,      PERF_COUNT_SW_CPU_CLOCK,
                                      PERF_COUNT_SW_PAGE_FAULTS,     PERF_COUNT_SW_PAGE_FAULTS_MIN,
                                      PERF_COUNT_SW_PAGE_FAULTS_MAJ, PERF_COUNT_SW_CONTEXT_SWITCHES,
                                      PERF_COUNT_SW_CPU_MIGRATIONS};
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_SOFTWARE;
    a.size = sizeof a;
    a.config = (unsigned long long)cfg[p->sw[i]];
    a.exclude_hv = 1;
    int fd = (int)syscall(SYS_perf_event_open, &a, 0 /* this thread */, -1, -1, 0);
    if (fd < 0) {
        size_t l = strlen(p->ev[i].reason);
        snprintf(p->ev[i].reason + l, sizeof p->ev[i].reason - l, "%sperf_event_open: %s", l ? "; " : "",
                 strerror(errno));
        return 0;
    }
    uint64_t v;
    if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) {
        close(fd);
        return 0;
    }
    p->fd[i] = fd;
    return 1;
#else
    (void)p;
    (void)i;
    return 0;
#endif
}

static int rusage_try(ts_perf *p, int i)
{
    int k = p->sw[i];
    if (k == SW_CPU_MIGRATIONS) return 0; /* getrusage has no such figure */
    if (k == SW_TASK_CLOCK || k == SW_CPU_CLOCK) p->need_clock = 1;
    else p->need_rusage = 1;
    return 1;
}

/* probes event i on this rank: sets source (and reason when none works) */
static void probe(ts_perf *p, int i, const char *sw_start)
{
    ts_perf_event *e = &p->ev[i];
    e->reason[0] = '\0';
    e->source = TS_PERF_SRC_NONE;
    p->sw[i] = sw_kind(e->name);
    e->unit = p->sw[i] == SW_TASK_CLOCK || p->sw[i] == SW_CPU_CLOCK ? "ns" : "";
    /* TESSERA_PERF_SOFTWARE=perf_event|rusage: software events skip the earlier ways (for tests) */
    int skip_papi = p->sw[i] >= 0 && sw_start && (!strcmp(sw_start, "perf_event") || !strcmp(sw_start, "rusage"));
    int skip_pe = p->sw[i] >= 0 && sw_start && !strcmp(sw_start, "rusage");
    if (!skip_papi && papi_try(p, i)) e->source = TS_PERF_SRC_PAPI;
    else if (p->sw[i] >= 0 && !skip_pe && perf_event_try(p, i)) e->source = TS_PERF_SRC_PERF_EVENT;
    else if (p->sw[i] >= 0 && rusage_try(p, i)) e->source = TS_PERF_SRC_RUSAGE;
    if (e->source != TS_PERF_SRC_NONE && e->source != TS_PERF_SRC_PAPI && p->sw[i] >= 0)
        e->reason[0] = '\0'; /* counted another way: what PAPI said does not matter */
    if (e->source == TS_PERF_SRC_NONE && !e->reason[0]) snprintf(e->reason, sizeof e->reason, "no way to count it here");
}

/* the ranks agree: all_ranks per event, the first lacking rank's reason */
static int agree(ts_perf *p, MPI_Comm comm, int from)
{
    int err = 0, rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    for (int i = from; i < p->nev; i++) {
        int lack = p->ev[i].source == TS_PERF_SRC_NONE ? rank : size;
        TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &lack, 1, MPI_INT, MPI_MIN, comm));
        p->ev[i].all_ranks = lack == size;
        p->ev[i].reason_rank = lack < size ? lack : -1;
        if (lack < size) TS_MPI(MPI_Bcast(p->ev[i].reason, (int)sizeof p->ev[i].reason, MPI_CHAR, lack, comm));
    }
cleanup:
    return err;
}

static int add_name(ts_perf *p, const char *name, int fallback)
{
    for (int i = 0; i < p->nev; i++)
        if (!strcasecmp(p->ev[i].name, name)) return 0;
    if (p->nev == TS_PERF_MAX_EVENTS)
        return TS_ERR(TS_ERR_CONFIG, "perf.papi_events: more than %d events", TS_PERF_MAX_EVENTS);
    if (strlen(name) >= sizeof p->ev[0].name) return TS_ERR(TS_ERR_CONFIG, "perf.papi_events: event name '%s' too long", name);
    ts_perf_event *e = &p->ev[p->nev];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->fallback = fallback;
    e->reason_rank = -1;
    e->unit = "";
    p->fd[p->nev] = -1;
    p->papi_slot[p->nev] = -1;
    p->sw[p->nev] = -1;
    p->nev++;
    return 0;
}

int ts_perf_create(MPI_Comm comm, int nphase, const char *const *names, const char *events, int timers, ts_perf **out)
{
    int err = 0, lerr = 0;
    ts_perf *p = NULL;
    char *list = NULL;
    *out = NULL;
    if (nphase < 1 || nphase > TS_PERF_MAX_PHASES)
        lerr = TS_ERR(TS_ERR_ARG, "ts_perf_create: %d phases (1..%d)", nphase, TS_PERF_MAX_PHASES);
    if (!lerr && !(p = TS_CALLOC(1, sizeof *p))) lerr = TS_ERR_NOMEM;
    TS_CHECK(ts_err_agree(comm, lerr));
    p->nphase = nphase;
    p->names = names;
    p->timers = timers;
#ifdef TS_HAVE_PAPI
    p->papi_set = PAPI_NULL;
#endif
    if (!events) events = "";
    const char *sw_start = getenv("TESSERA_PERF_SOFTWARE");
    int autom = !strcasecmp(events, "auto");
    if (timers && strcasecmp(events, "none")) {
        if (autom) {
            for (int i = 0; auto_names[i] && !lerr; i++) lerr = add_name(p, auto_names[i], 0);
        } else {
            list = strdup(events);
            if (!list) lerr = TS_ERR_NOMEM;
            for (char *save = NULL, *t = list ? strtok_r(list, ",", &save) : NULL; t && !lerr;
                 t = strtok_r(NULL, ",", &save)) {
                while (isspace((unsigned char)*t)) t++;
                char *end = t + strlen(t);
                while (end > t && isspace((unsigned char)end[-1])) *--end = '\0';
                if (*t) lerr = add_name(p, t, 0);
            }
        }
    }
    TS_CHECK(ts_err_agree(comm, lerr));
    for (int i = 0; i < p->nev; i++) probe(p, i, sw_start);
    TS_CHECK(agree(p, comm, 0));
    /* an unavailable event: count the software events instead (as well) */
    int missing = 0, first_fb = p->nev;
    for (int i = 0; i < p->nev; i++) missing |= !p->ev[i].all_ranks;
    if (missing) {
        for (int k = 0; fallback_names[k]; k++) TS_CHECK(add_name(p, fallback_names[k], 1));
        for (int i = first_fb; i < p->nev; i++) probe(p, i, sw_start);
        TS_CHECK(agree(p, comm, first_fb));
    }
    if (autom) /* auto: presets that do not work here are not worth listing as failures */
        for (int i = 0; i < p->nev; i++) p->ev[i].fallback = 0;
#ifdef TS_HAVE_PAPI
    if (p->npapi > 0) p->papi_running = PAPI_start(p->papi_set) == PAPI_OK;
    if (p->npapi > 0 && !p->papi_running) /* worked one by one, not all together: give up PAPI quietly */
        for (int i = 0; i < p->nev; i++)
            if (p->ev[i].source == TS_PERF_SRC_PAPI) {
                p->ev[i].source = TS_PERF_SRC_NONE;
                snprintf(p->ev[i].reason, sizeof p->ev[i].reason, "PAPI_start failed for the whole event set");
            }
#endif
    for (int i = 0; i < p->nev; i++) p->ncounted += p->ev[i].source != TS_PERF_SRC_NONE;
    *out = p;
    p = NULL;
cleanup:
    free(list);
    ts_perf_destroy(&p);
    return err;
}

void ts_perf_destroy(ts_perf **pp)
{
    if (!pp || !*pp) return;
    ts_perf *p = *pp;
#ifdef TS_HAVE_PAPI
    if (p->papi_set != PAPI_NULL) {
        long long v[TS_PERF_MAX_EVENTS];
        if (p->papi_running) PAPI_stop(p->papi_set, v);
        PAPI_cleanup_eventset(p->papi_set);
        PAPI_destroy_eventset(&p->papi_set);
    }
#endif
    for (int i = 0; i < p->nev; i++)
        if (p->fd[i] >= 0) close(p->fd[i]);
    free(p);
    *pp = NULL;
}

/* every counted event's current value */
static void read_all(ts_perf *p, long long *v)
{
#ifdef TS_HAVE_PAPI
    long long pv[TS_PERF_MAX_EVENTS];
    if (p->papi_running && PAPI_read(p->papi_set, pv) != PAPI_OK) memset(pv, 0, sizeof pv);
#endif
    long long clk = 0;
    struct rusage ru;
    if (p->need_clock) {
        struct timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        clk = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
    if (p->need_rusage) getrusage(RUSAGE_THREAD, &ru);
    for (int i = 0; i < p->nev; i++) {
        switch (p->ev[i].source) {
#ifdef TS_HAVE_PAPI
        case TS_PERF_SRC_PAPI: v[i] = p->papi_running ? pv[p->papi_slot[i]] : 0; break;
#endif
        case TS_PERF_SRC_PERF_EVENT: {
            uint64_t x = 0;
            v[i] = read(p->fd[i], &x, sizeof x) == (ssize_t)sizeof x ? (long long)x : 0;
            break;
        }
        case TS_PERF_SRC_RUSAGE:
            switch (p->sw[i]) {
            case SW_TASK_CLOCK:
            case SW_CPU_CLOCK: v[i] = clk; break;
            case SW_PAGE_FAULTS: v[i] = ru.ru_minflt + ru.ru_majflt; break;
            case SW_MINOR_FAULTS: v[i] = ru.ru_minflt; break;
            case SW_MAJOR_FAULTS: v[i] = ru.ru_majflt; break;
            case SW_CONTEXT_SWITCHES: v[i] = ru.ru_nvcsw + ru.ru_nivcsw; break;
            default: v[i] = 0;
            }
            break;
        default: v[i] = 0;
        }
    }
}

void ts_perf_begin(ts_perf *p, int phase)
{
    if (!p || !p->timers || phase < 0 || phase >= p->nphase) return;
    if (p->depth[phase]++ > 0) return;
    if (p->ncounted) read_all(p, p->c0[phase]);
    p->t0[phase] = ts_time_now();
}

void ts_perf_end(ts_perf *p, int phase)
{
    if (!p || !p->timers || phase < 0 || phase >= p->nphase || p->depth[phase] == 0) return;
    if (--p->depth[phase] > 0) return;
    p->seconds[phase] += ts_time_now() - p->t0[phase];
    p->calls[phase]++;
    if (p->ncounted) {
        long long v[TS_PERF_MAX_EVENTS];
        read_all(p, v);
        for (int i = 0; i < p->nev; i++) p->acc[phase][i] += v[i] - p->c0[phase][i];
    }
}

void ts_perf_add(ts_perf *p, int phase, double seconds)
{
    if (!p || !p->timers || phase < 0 || phase >= p->nphase) return;
    p->seconds[phase] += seconds;
    p->calls[phase]++;
}

void ts_perf_reset(ts_perf *p)
{
    if (!p) return;
    memset(p->seconds, 0, sizeof p->seconds);
    memset(p->calls, 0, sizeof p->calls);
    memset(p->acc, 0, sizeof p->acc);
}

int ts_perf_nphase(const ts_perf *p) { return p ? p->nphase : 0; }
const char *ts_perf_phase_name(const ts_perf *p, int phase)
{
    return p && phase >= 0 && phase < p->nphase ? p->names[phase] : "?";
}
double ts_perf_seconds(const ts_perf *p, int phase)
{
    return p && phase >= 0 && phase < p->nphase ? p->seconds[phase] : 0;
}
int64_t ts_perf_calls(const ts_perf *p, int phase) { return p && phase >= 0 && phase < p->nphase ? p->calls[phase] : 0; }
int ts_perf_nevents(const ts_perf *p) { return p ? p->nev : 0; }
const ts_perf_event *ts_perf_event_info(const ts_perf *p, int e) { return p && e >= 0 && e < p->nev ? &p->ev[e] : NULL; }
long long ts_perf_count(const ts_perf *p, int phase, int e)
{
    return p && phase >= 0 && phase < p->nphase && e >= 0 && e < p->nev ? p->acc[phase][e] : 0;
}
int ts_perf_find(const ts_perf *p, const char *name)
{
    for (int i = 0; p && i < p->nev; i++)
        if (!strcasecmp(p->ev[i].name, name) && p->ev[i].all_ranks) return i;
    return -1;
}
int ts_perf_timers_on(const ts_perf *p) { return p && p->timers; }

void ts_perf_describe(const ts_perf *p, char *buf, size_t n)
{
    size_t l = 0;
    if (!n) return;
    buf[0] = '\0';
    if (!p || !p->timers) {
        snprintf(buf, n, "timers and counters off (perf.timers = false)");
        return;
    }
    int any = 0;
    for (int i = 0; i < p->nev && l < n; i++)
        if (p->ev[i].all_ranks) {
            l += (size_t)snprintf(buf + l, n - l, "%s%s (%s%s)", any++ ? ", " : "counting per phase: ", p->ev[i].name,
                                  ts_perf_source_name(p->ev[i].source), p->ev[i].fallback ? ", fallback" : "");
        }
    if (!any && l < n) l += (size_t)snprintf(buf + l, n - l, "no counters (timers only)");
    /* unavailable events, those with the same reason together */
    int done[TS_PERF_MAX_EVENTS] = {0};
    for (int i = 0; i < p->nev && l < n; i++) {
        if (p->ev[i].all_ranks || done[i]) continue;
        l += (size_t)snprintf(buf + l, n - l, "; %s", p->ev[i].name);
        for (int j = i + 1; j < p->nev && l < n; j++)
            if (!p->ev[j].all_ranks && !done[j] && p->ev[j].reason_rank == p->ev[i].reason_rank &&
                !strcmp(p->ev[j].reason, p->ev[i].reason)) {
                l += (size_t)snprintf(buf + l, n - l, ", %s", p->ev[j].name);
                done[j] = 1;
            }
        if (l < n)
            l += (size_t)snprintf(buf + l, n - l, " unavailable (rank %d: %s)", p->ev[i].reason_rank, p->ev[i].reason);
    }
}
