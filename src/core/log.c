/* Logging with levels and rank prefixes; see log.h. Owns the level
 * (TESSERA_LOG or ts_log_set_level) and the prefix: warnings and errors to
 * stderr, the rest to stdout. No MPI: the rank is handed to ts_log_init. */
#include "tsbuild.h"
#include "src/core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int log_rank = 0;
static ts_log_level log_level = TS_LOG_INFO;

int ts_log_parse_level(const char *s, ts_log_level *out)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) {
            *out = (ts_log_level)i;
            return 0;
        }
    return 1;
}

void ts_log_init(int world_rank)
{
    log_rank = world_rank;
    const char *e = getenv("TESSERA_LOG");
    ts_log_level l;
    if (e && !ts_log_parse_level(e, &l)) log_level = l;
}

void ts_log_set_level(ts_log_level level) { log_level = level; }
ts_log_level ts_log_get_level(void) { return log_level; }

static void vlog(ts_log_level level, int prefix, const char *fmt, va_list ap)
{
    static const char *const tags[] = {"error: ", "warning: ", "", "debug: "};
    FILE *f = level <= TS_LOG_WARN ? stderr : stdout;
    char buf[4096];
    vsnprintf(buf, sizeof buf, fmt, ap);
    if (prefix)
        fprintf(f, "[rank %d] %s%s\n", log_rank, tags[level], buf);
    else
        fprintf(f, "%s%s\n", tags[level], buf);
    fflush(f);
}

void ts_log(ts_log_level level, const char *fmt, ...)
{
    if (level > log_level) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(level, 1, fmt, ap);
    va_end(ap);
}

void ts_log_root(ts_log_level level, const char *fmt, ...)
{
    if (level > log_level || log_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(level, 0, fmt, ap);
    va_end(ap);
}
