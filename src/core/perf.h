/* Per-phase timers and counters of one rank. A ts_perf holds a table of
 * named phases (the caller's list: the trainer's is TS_PHASE_LIST in
 * src/train/run.h) and a set of counter events; ts_perf_begin/ts_perf_end
 * bracket a phase on the calling thread and add its wall time and the
 * counters' increments to that phase. Phases may nest (a step holds
 * forward and backward); a phase begun again before it ends counts once.
 *
 * Events come from perf.papi_events: PAPI presets or native names (probed
 * by adding and starting each one: virtual machines list events that then
 * fail) and the software events perf::TASK-CLOCK, perf::PAGE-FAULTS,
 * perf::CONTEXT-SWITCHES (and perf::CPU-CLOCK, perf::MINOR-FAULTS,
 * perf::MAJOR-FAULTS, perf::CPU-MIGRATIONS). A software event PAPI cannot
 * count (its perf_event component is disabled where the VM has no PMU) is
 * read through Linux perf_event_open directly, and failing that from the
 * thread's CPU clock and getrusage(RUSAGE_THREAD). An event nothing can
 * count is reported unavailable with the reason; when a requested event is
 * unavailable the three software events are added as the fallback. Counters
 * never make a run fail. They count the calling (main) thread of the rank. */
#ifndef TS_CORE_PERF_H
#define TS_CORE_PERF_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#define TS_PERF_MAX_EVENTS 16
#define TS_PERF_MAX_PHASES 64

typedef struct ts_perf ts_perf;

/* How an event is counted on this rank. */
typedef enum {
    TS_PERF_SRC_NONE = 0,   /* unavailable */
    TS_PERF_SRC_PAPI,       /* through PAPI */
    TS_PERF_SRC_PERF_EVENT, /* Linux perf_event_open, software event */
    TS_PERF_SRC_RUSAGE      /* thread CPU clock / getrusage(RUSAGE_THREAD) */
} ts_perf_source;

typedef struct ts_perf_event {
    char name[64];
    ts_perf_source source; /* on this rank */
    int all_ranks;         /* counted on every rank of the communicator */
    int fallback;          /* added because a requested event was unavailable */
    char reason[256];      /* why unavailable (first rank lacking it), or "" */
    int reason_rank;       /* that rank, or -1 */
    const char *unit;      /* "ns" for the clocks, "" for counts */
} ts_perf_event;

/* Collective on comm (the ranks agree on the event list and on every
 * event's availability; nothing is kept of comm). names: nphase phase names
 * (borrowed; must outlive the object). events: a comma list of event
 * names, "auto" (PAPI_TOT_CYC, PAPI_TOT_INS, PAPI_FP_OPS, PAPI_L3_TCM where
 * they work, else the software events), or "" / "none" (timers only).
 * timers = 0 makes begin/end no-ops (for measuring what they cost). Fails
 * only for a bad argument or memory, agreed; never over counters. */
int ts_perf_create(MPI_Comm comm, int nphase, const char *const *names, const char *events, int timers, ts_perf **out);
void ts_perf_destroy(ts_perf **p);

/* Local, main thread. Bracket a phase. NULL p is a no-op. */
void ts_perf_begin(ts_perf *p, int phase);
void ts_perf_end(ts_perf *p, int phase);
/* Local, any thread once the phase is not being timed. Adds seconds
 * measured elsewhere (a communication thread's busy time) to a phase. */
void ts_perf_add(ts_perf *p, int phase, double seconds);
/* Local. Zeroes every phase's time, count and counters. */
void ts_perf_reset(ts_perf *p);

/* Local queries. */
int ts_perf_nphase(const ts_perf *p);
const char *ts_perf_phase_name(const ts_perf *p, int phase);
double ts_perf_seconds(const ts_perf *p, int phase);
int64_t ts_perf_calls(const ts_perf *p, int phase);
int ts_perf_nevents(const ts_perf *p); /* the agreed list, available or not */
const ts_perf_event *ts_perf_event_info(const ts_perf *p, int e);
/* Accumulated increments of event e in phase (0 where not counted here). */
long long ts_perf_count(const ts_perf *p, int phase, int e);
/* Index of an event that is counted on every rank, or -1. */
int ts_perf_find(const ts_perf *p, const char *name);
int ts_perf_timers_on(const ts_perf *p);
/* "papi", "perf_event_open", "rusage" or "unavailable". */
const char *ts_perf_source_name(ts_perf_source s);
/* Local. One line per event for people: what is counted and how, what is
 * unavailable and why. */
void ts_perf_describe(const ts_perf *p, char *buf, size_t n);

#endif
