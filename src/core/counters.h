/* Hardware and software counters through PAPI, probed at run time: an
 * event counts as available only if it can be added to an event set and
 * started (VMs list preset events that then fail). Without PAPI in the
 * build every query answers "none". */
#ifndef TS_CORE_COUNTERS_H
#define TS_CORE_COUNTERS_H

#include <stddef.h>

/* Local. 1 if PAPI is compiled in and initialises. */
int ts_counters_init(void);
/* Local. Probes each name (NULL-terminated list); writes the ones that
 * work, comma-separated, into out. Returns how many work. */
int ts_counters_probe(const char *const *names, char *out, size_t n);
/* The default candidates: PAPI presets, then perf:: software events. */
extern const char *const ts_counters_default[];

#endif
