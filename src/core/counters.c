/* PAPI probing; see counters.h. Owns the library's one-time initialisation
 * and the default event list; the counting itself is perf.c's. No MPI, prints
 * nothing; without TS_HAVE_PAPI every probe finds no counter. */
#include "tsbuild.h"
#include "src/core/counters.h"

#include <stdio.h>
#include <string.h>

#ifdef TS_HAVE_PAPI
#include <papi.h>
#endif

const char *const ts_counters_default[] = {
    "PAPI_TOT_CYC", "PAPI_TOT_INS", "PAPI_FP_OPS", "PAPI_L3_TCM",
    "perf::TASK-CLOCK", "perf::PAGE-FAULTS", "perf::CONTEXT-SWITCHES", NULL,
};

int ts_counters_init(void)
{
#ifdef TS_HAVE_PAPI
    static int state = 0; /* 0 unknown, 1 ok, -1 failed */
    if (state == 0) {
        int v = PAPI_library_init(PAPI_VER_CURRENT);
        state = v == PAPI_VER_CURRENT ? 1 : -1;
    }
    return state == 1;
#else
    return 0;
#endif
}

int ts_counters_probe(const char *const *names, char *out, size_t n)
{
    int ok = 0;
    if (n) out[0] = '\0';
#ifdef TS_HAVE_PAPI
    if (!ts_counters_init()) return 0;
    for (int i = 0; names[i]; i++) {
        int set = PAPI_NULL, code;
        long long v;
        if (PAPI_event_name_to_code((char *)names[i], &code) != PAPI_OK) continue;
        if (PAPI_create_eventset(&set) != PAPI_OK) continue;
        int works = PAPI_add_event(set, code) == PAPI_OK && PAPI_start(set) == PAPI_OK && PAPI_stop(set, &v) == PAPI_OK;
        PAPI_cleanup_eventset(set);
        PAPI_destroy_eventset(&set);
        if (!works) continue;
        size_t l = strlen(out);
        snprintf(out + l, n - l, "%s%s", ok ? "," : "", names[i]);
        ok++;
    }
#else
    (void)names;
#endif
    return ok;
}
