/* Paths in fixed-size buffers without silent truncation: a path that does
 * not fit is an error naming what it is for (a config key, a file role) and
 * the path itself, never a shorter path that points somewhere else. */
#ifndef TS_CORE_PATH_H
#define TS_CORE_PATH_H

#include <stddef.h>

/* Local. dst = a "/" b (just a when b is NULL or empty; no second '/' when a
 * already ends in one). When the result needs more than n - 1 characters it
 * is TS_ERR_ARG "path too long (L characters, at most n - 1): <a/b>"
 * and dst holds "" (never a truncated path). */
int ts_path_join(char *dst, size_t n, const char *a, const char *b);

/* Local. printf into a path buffer of n bytes. When it does not fit it is
 * TS_ERR_ARG naming `what` (e.g. "run.dir", "checkpoint manifest"), the
 * length and the start of the path; dst holds "". */
int ts_path_fmt(char *dst, size_t n, const char *what, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Local. 0 when s (a path given by the user) is shorter than n bytes with
 * its terminator, else TS_ERR_ARG "<what> is L characters long: at most
 * n - 1 (<start of s>...)". */
int ts_path_check(const char *s, size_t n, const char *what);

#endif
