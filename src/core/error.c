/* Error recording: one message per thread, with rank, file and line, and the
 * collective agreement that lets every rank leave a failed operation together.
 * Also the checked allocators (ts_malloc, ts_calloc, ts_aligned_alloc). Never
 * exits; prints only with TESSERA_ERROR_TRACE set. */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/core/watchdog.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define TS_ERR_MSG_MAX 2048

static _Thread_local char err_msg[TS_ERR_MSG_MAX];
static _Thread_local int err_code;
static int err_rank = -1;

static const char *const err_names[TS_ERR_COUNT_] = {
    "ok", "bad argument", "config error", "I/O error", "bad file contents",
    "MPI error", "HDF5 error", "out of memory", "unsupported",
    "ranks disagree", "CUDA error", "failed on another rank", "non-finite value",
    "internal error", "stopped",
};

void ts_err_set_rank(int rank) { err_rank = rank; }
int ts_err_rank(void) { return err_rank; }

const char *ts_err_name(int code)
{
    if (code < 0 || code >= TS_ERR_COUNT_) return "unknown error";
    return err_names[code];
}

static const char *short_file(const char *file);

int ts_err(int code, const char *file, int line, const char *fmt, ...)
{
    char body[TS_ERR_MSG_MAX];
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int need = vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    if (need >= (int)sizeof body / 2) {
        /* too long (a path of thousands of characters): keep the start and
         * the end, where the cause is, and say how much is left out */
        char *all = malloc((size_t)need + 1);
        if (all) {
            vsnprintf(all, (size_t)need + 1, fmt, ap2);
            const size_t keep = sizeof body / 4 - 32; /* half the buffer, the rest for context lines */
            snprintf(body, sizeof body, "%.*s[... %zu characters left out ...]%s", (int)keep, all,
                     (size_t)need - 2 * keep, all + need - keep);
            free(all);
        }
    }
    va_end(ap2);
    /* strip the build-tree prefix so messages show paths from the top */
    snprintf(err_msg, sizeof err_msg, "%s (%s:%d)", body, short_file(file), line);
    err_code = code;
    if (getenv("TESSERA_ERROR_TRACE"))
        fprintf(stderr, "[rank %d] error recorded: %s\n", err_rank, err_msg);
    return code;
}

static const char *short_file(const char *file)
{
    for (const char *p = file; *p; p++)
        if ((p == file || p[-1] == '/') &&
            (!strncmp(p, "src/", 4) || !strncmp(p, "collectives/", 12) || !strncmp(p, "io/", 3)))
            return p;
    return file;
}

int ts_err_ctx(int code, const char *file, int line, const char *fmt, ...)
{
    if (!code) return 0;
    int lines = 0;
    for (const char *p = err_msg; (p = strstr(p, "\n    in ")); p++) lines++;
    const size_t len = strlen(err_msg);
    if (lines >= TS_ERR_CTX_MAX) return code;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (lines == TS_ERR_CTX_MAX - 1) snprintf(what, sizeof what, "(more callers left out)");
    snprintf(err_msg + len, sizeof err_msg - len, "\n    in %s (%s:%d)", what, short_file(file), line);
    if (getenv("TESSERA_ERROR_TRACE")) fprintf(stderr, "[rank %d] error context: %s\n", err_rank, what);
    return code;
}

int ts_err_mpi(int mpirc, const char *file, int line, const char *call)
{
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(mpirc, s, &len);
    return ts_err(TS_ERR_MPI, file, line, "%s failed: %s", call, s);
}

const char *ts_err_message(void) { return err_msg; }
int ts_err_last(void) { return err_code; }
void ts_err_clear(void)
{
    err_msg[0] = '\0';
    err_code = 0;
}

int ts_err_agree(MPI_Comm comm, int err)
{
    int rank, size;
    if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS)
        return err ? err : TS_ERR(TS_ERR_MPI, "communicator unusable while agreeing on errors");
    int mine = err ? rank : size, first = size;
    ts_watch_enter("error agreement", "", sizeof mine);
    int rc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
    ts_watch_leave();
    if (rc != MPI_SUCCESS) return ts_err_mpi(rc, __FILE__, __LINE__, "MPI_Allreduce(error flag)");
    if (first == size) return 0;
    /* the first failing rank sends its code, world rank and message to all */
    struct { int code, wrank; char msg[TS_ERR_MSG_MAX]; } pkt;
    if (rank == first) {
        pkt.code = err;
        pkt.wrank = err_rank;
        snprintf(pkt.msg, sizeof pkt.msg, "%s", err_msg);
    }
    rc = MPI_Bcast(&pkt, (int)sizeof pkt, MPI_BYTE, first, comm);
    if (rc != MPI_SUCCESS) return err ? err : ts_err_mpi(rc, __FILE__, __LINE__, "MPI_Bcast(error)");
    if (err) return err;
    char copy[TS_ERR_MSG_MAX];
    snprintf(copy, sizeof copy, "%s", pkt.msg);
    snprintf(err_msg, sizeof err_msg, "rank %d failed: %s", pkt.wrank, copy);
    err_code = TS_ERR_REMOTE;
    return TS_ERR_REMOTE;
}

void *ts_malloc(size_t bytes, const char *file, int line)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) ts_err(TS_ERR_NOMEM, file, line, "cannot allocate %zu bytes", bytes);
    return p;
}

void *ts_calloc(size_t n, size_t size, const char *file, int line)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) ts_err(TS_ERR_NOMEM, file, line, "cannot allocate %zu x %zu bytes", n, size);
    return p;
}

/* Blocks of at least TS_HUGE_MIN bytes are aligned to 2 MiB, rounded up to
 * it and advised to the kernel as transparent huge pages (where THP is
 * "madvise", as on Debian's default kernels): a large tensor is then
 * faulted in 2 MiB at a time instead of 4 KiB (each fault is dear in a
 * VM; docs/performance.md, "Inference"). The callers touch what they
 * allocate, so the memory used is about the same; without THP the advice
 * is ignored. */
#define TS_HUGE_MIN ((size_t)8 << 20)
#define TS_HUGE_PAGE ((size_t)2 << 20)

void *ts_aligned_alloc(size_t bytes, const char *file, int line)
{
    void *p = NULL;
    const size_t al = bytes >= TS_HUGE_MIN ? TS_HUGE_PAGE : 64;
    size_t b = (bytes + al - 1) & ~(al - 1);
    if (bytes > (size_t)-1 - al || posix_memalign(&p, al, b ? b : 64) != 0) { /* no wrap to a tiny block */
        ts_err(TS_ERR_NOMEM, file, line, "cannot allocate %zu bytes", bytes);
        return NULL;
    }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (al == TS_HUGE_PAGE) (void)madvise(p, b, MADV_HUGEPAGE); /* advice: a refusal changes nothing */
#endif
    return p;
}
