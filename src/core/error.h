/* Error codes and reporting for all of tessera.
 * A failing function records one message (with rank, file and line) through
 * ts_err() and returns a TS_ERR_* code; callers pass the code up with
 * TS_CHECK/TS_TRY. Only src/cli turns a code into an exit status. */
#ifndef TS_CORE_ERROR_H
#define TS_CORE_ERROR_H

#include <stddef.h>
#ifndef TS_ERROR_NO_MPI /* CUDA sources include this without MPI */
#include <mpi.h>
#endif

enum {
    TS_OK = 0,
    TS_ERR_ARG,         /* bad argument from the caller or the user */
    TS_ERR_CONFIG,      /* bad config file, key or value */
    TS_ERR_IO,          /* file system */
    TS_ERR_FORMAT,      /* a file's contents are wrong (truncated, corrupt, bad shape) */
    TS_ERR_MPI,         /* an MPI call failed */
    TS_ERR_HDF5,        /* an HDF5 call failed */
    TS_ERR_NOMEM,       /* allocation failed */
    TS_ERR_UNSUPPORTED, /* valid request this build or algorithm cannot serve */
    TS_ERR_MISMATCH,    /* ranks disagree (counts, config, ...) */
    TS_ERR_CUDA,        /* CUDA, cuBLAS, cuDNN or NCCL */
    TS_ERR_REMOTE,      /* another rank failed; its message is attached */
    TS_ERR_NUMERIC,     /* NaN/Inf where a finite value is required */
    TS_ERR_INTERNAL,    /* a broken invariant: a bug */
    TS_ERR_STOPPED,     /* stopped on request (a signal) after saving what resumes it */
    TS_ERR_COUNT_
};

/* Local. Records "file:line: message" as this thread's current error and
 * returns code (so callers can write `return TS_ERR(...)`). */
int ts_err(int code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define TS_ERR(code, ...) ts_err((code), __FILE__, __LINE__, __VA_ARGS__)

/* Local. Context for an error travelling up, the way PETSc's traces read:
 * when code is non-zero, appends "\n    in <what> (file:line)" to the
 * current message (innermost first, the cause stays the first line) and
 * returns code; when code is 0 it does nothing and returns 0, so a call
 * can be wrapped: TS_CHECK(TS_CTX(read_sample(...), "sample %s of %s", ...)).
 * At most TS_ERR_CTX_MAX lines are kept; the rest are counted. */
int ts_err_ctx(int code, const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
#define TS_CTX(code, ...) ts_err_ctx((code), __FILE__, __LINE__, __VA_ARGS__)
#define TS_ERR_CTX_MAX 8

#ifndef TS_ERROR_NO_MPI
/* Local. Records an MPI failure with MPI's own error string. */
int ts_err_mpi(int mpirc, const char *file, int line, const char *call);
#endif

/* Local. The current thread's last message ("" if none) and its code. */
const char *ts_err_message(void);
int ts_err_last(void);
void ts_err_clear(void);
const char *ts_err_name(int code);

/* Local. The world rank shown in messages (set once by the program). */
void ts_err_set_rank(int rank);
int ts_err_rank(void);

/* Collective on comm. Every rank passes its own status; if any rank failed,
 * every rank returns a non-zero code and ranks that did not fail record
 * "rank R failed: <R's message>" (R = lowest failing rank of comm, shown as
 * its world rank). Returns 0 on every rank when all passed. */
#ifndef TS_ERROR_NO_MPI
int ts_err_agree(MPI_Comm comm, int err);
#endif

/* Propagation helpers. TS_CHECK/TS_FAIL/TS_MPI need `int err` and a
 * `cleanup:` label; TS_TRY returns at once. */
#define TS_CHECK(expr)                                                      \
    do {                                                                    \
        int ts_rc_ = (expr);                                                \
        if (ts_rc_ != 0) { err = ts_rc_; goto cleanup; }                    \
    } while (0)
#define TS_TRY(expr)                                                        \
    do {                                                                    \
        int ts_rc_ = (expr);                                                \
        if (ts_rc_ != 0) return ts_rc_;                                     \
    } while (0)
#define TS_FAIL(code, ...)                                                  \
    do { err = ts_err((code), __FILE__, __LINE__, __VA_ARGS__); goto cleanup; } while (0)
#define TS_MPI(call)                                                        \
    do {                                                                    \
        int ts_mrc_ = (call);                                               \
        if (ts_mrc_ != MPI_SUCCESS) {                                       \
            err = ts_err_mpi(ts_mrc_, __FILE__, __LINE__, #call);           \
            goto cleanup;                                                   \
        }                                                                   \
    } while (0)
#define TS_MPI_TRY(call)                                                    \
    do {                                                                    \
        int ts_mrc_ = (call);                                               \
        if (ts_mrc_ != MPI_SUCCESS)                                         \
            return ts_err_mpi(ts_mrc_, __FILE__, __LINE__, #call);          \
    } while (0)

/* Local. Allocation that records TS_ERR_NOMEM with the size and the
 * caller's file and line on failure and returns NULL; the caller owns the
 * memory and free()s it. */
void *ts_malloc(size_t bytes, const char *file, int line);
void *ts_calloc(size_t n, size_t size, const char *file, int line);
void *ts_aligned_alloc(size_t bytes, const char *file, int line); /* 64-byte aligned; free() it */
#define TS_MALLOC(b) ts_malloc((b), __FILE__, __LINE__)
#define TS_CALLOC(n, s) ts_calloc((n), (s), __FILE__, __LINE__)
#define TS_ALIGNED_ALLOC(b) ts_aligned_alloc((b), __FILE__, __LINE__)

#endif
