/* Monotonic clock for timers. Also the wall clock (ts_wall_now); no state:
 * per-phase timing and counters are perf.c's. */
#include "tsbuild.h"
#include "src/core/timer.h"

#include <time.h>

double ts_time_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double ts_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
