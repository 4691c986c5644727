/* A tiny TAP producer for C tests: ts_plan(n) (or ts_done() at the end
 * without a plan), ts_ok(cond, fmt, ...) prints "ok N - ..." or "not ok N -
 * ...", ts_skip_all(reason) exits 77-style via a TAP skip plan. In MPI tests
 * only rank 0 prints (set ts_tap_quiet on other ranks); results must be
 * agreed across ranks before calling ts_ok. */
#ifndef TS_TESTS_TAP_H
#define TS_TESTS_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int ts_tap_n = 0, ts_tap_failed = 0, ts_tap_quiet = 0;

static inline void ts_plan(int n)
{
    if (!ts_tap_quiet) printf("1..%d\n", n);
}

static inline int ts_ok(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int ts_ok(int cond, const char *fmt, ...)
{
    ts_tap_n++;
    if (!cond) ts_tap_failed++;
    if (ts_tap_quiet) return cond;
    va_list ap;
    va_start(ap, fmt);
    printf("%sok %d - ", cond ? "" : "not ", ts_tap_n);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    return cond;
}

static inline void ts_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void ts_diag(const char *fmt, ...)
{
    if (ts_tap_quiet) return;
    va_list ap;
    va_start(ap, fmt);
    printf("# ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

/* ends a test without a plan printed up front */
static inline int ts_done(void)
{
    if (!ts_tap_quiet) printf("1..%d\n", ts_tap_n);
    fflush(stdout);
    return ts_tap_failed ? 1 : 0;
}

static inline void ts_skip_all(const char *reason)
{
    if (!ts_tap_quiet) printf("1..0 # SKIP %s\n", reason);
    fflush(stdout);
    exit(0);
}

#endif
