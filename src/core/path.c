/* Bounded path building; see path.h. The messages quote at most the first
 * 80 characters of an overlong path (the error buffer has a limit too).
 * Owns the length checks only: no allocation, touches no file. */
#include "tsbuild.h"
#include "src/core/path.h"
#include "src/core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int too_long(const char *what, const char *s, size_t len, size_t n)
{
    return TS_ERR(TS_ERR_ARG, "%s%spath too long (%zu characters, at most %zu): '%.80s%s'", what ? what : "",
                  what ? ": " : "", len, n ? n - 1 : 0, s, len > 80 ? "..." : "");
}

int ts_path_check(const char *s, size_t n, const char *what)
{
    size_t len = strlen(s);
    if (len < n) return 0;
    return TS_ERR(TS_ERR_ARG, "%s is %zu characters long: at most %zu ('%.80s%s')", what, len, n ? n - 1 : 0, s,
                  len > 80 ? "..." : "");
}

int ts_path_join(char *dst, size_t n, const char *a, const char *b)
{
    size_t la = strlen(a), lb = b ? strlen(b) : 0;
    int slash = lb && !(la && a[la - 1] == '/');
    size_t len = la + (size_t)slash + lb;
    if (n) dst[0] = '\0';
    if (len >= n) {
        if (!lb) return too_long(NULL, a, len, n);
        /* quote what the path would have been */
        char show[96];
        snprintf(show, sizeof show, "%s%s%s", a, slash ? "/" : "", b);
        return too_long(NULL, show, len, n);
    }
    memcpy(dst, a, la);
    if (slash) dst[la] = '/';
    if (lb) memcpy(dst + la + (size_t)slash, b, lb);
    dst[len] = '\0';
    return 0;
}

int ts_path_fmt(char *dst, size_t n, const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(dst, n, fmt, ap);
    va_end(ap);
    if (len >= 0 && (size_t)len < n) return 0;
    char show[96];
    va_start(ap, fmt);
    vsnprintf(show, sizeof show, fmt, ap);
    va_end(ap);
    if (n) dst[0] = '\0';
    if (len < 0) return TS_ERR(TS_ERR_ARG, "%s: cannot format the path", what ? what : "path");
    return too_long(what, show, (size_t)len, n);
}
