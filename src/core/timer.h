/* Wall-clock timers: a monotonic clock and accumulating timers for phases.
 * (PAPI counters per phase join these in src/core/perf.) */
#ifndef TS_CORE_TIMER_H
#define TS_CORE_TIMER_H

#include <stdint.h>

/* Local. Seconds on a monotonic clock. */
double ts_time_now(void);
/* Local. Seconds since the epoch (CLOCK_REALTIME): times that other
 * processes compare, e.g. across a relaunch. */
double ts_wall_now(void);

typedef struct ts_timer {
    double total;   /* accumulated seconds */
    double started; /* < 0 when stopped */
    int64_t count;  /* completed start/stop pairs */
} ts_timer;

static inline void ts_timer_reset(ts_timer *t)
{
    t->total = 0;
    t->started = -1;
    t->count = 0;
}
static inline void ts_timer_start(ts_timer *t) { t->started = ts_time_now(); }
static inline double ts_timer_stop(ts_timer *t)
{
    double d = t->started >= 0 ? ts_time_now() - t->started : 0;
    t->total += d;
    t->started = -1;
    t->count++;
    return d;
}

#endif
