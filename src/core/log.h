/* Logging: levels, a rank prefix, and rank-0-only printing for progress.
 * Messages go to stderr (errors, warnings) or stdout (info, debug). */
#ifndef TS_CORE_LOG_H
#define TS_CORE_LOG_H

typedef enum { TS_LOG_ERROR = 0, TS_LOG_WARN, TS_LOG_INFO, TS_LOG_DEBUG } ts_log_level;

/* Local. Sets this process's world rank and level; the level defaults to
 * TESSERA_LOG (error|warn|info|debug) or info. */
void ts_log_init(int world_rank);
void ts_log_set_level(ts_log_level level);
ts_log_level ts_log_get_level(void);
int ts_log_parse_level(const char *s, ts_log_level *out);

/* Local. Prints on this rank, prefixed "[rank R]" when the job has ranks. */
void ts_log(ts_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Local. Prints only on world rank 0 (no prefix): progress and reports. */
void ts_log_root(ts_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
