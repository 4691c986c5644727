/* Shared pieces of the fuzz targets (tests/fuzz/fuzz_*.c): a private
 * scratch directory, writing an input to a file there, MPI started once (a
 * singleton; the targets run on MPI_COMM_SELF), a byte reader that turns the
 * input into choices (structure-aware targets), and the oracle FUZZ_REQUIRE,
 * which aborts (a crash for libFuzzer and for the replay test) when a
 * property of the code under test does not hold. Each target defines
 * LLVMFuzzerInitialize and LLVMFuzzerTestOneInput; replay.c runs them on
 * committed inputs in `make check`, the libFuzzer build (`make fuzz`,
 * tests/fuzz/run.sh) on generated ones. docs/testing.md describes both. */
#ifndef TS_TESTS_FUZZ_COMMON_H
#define TS_TESTS_FUZZ_COMMON_H

#include <dirent.h>
#include <errno.h>
#include <mpi.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/core/error.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_dir_[512];

static inline void fuzz_rmtree_(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            struct stat st;
            if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) fuzz_rmtree_(p);
            else unlink(p);
        }
        closedir(d);
    }
    rmdir(path);
}

static inline void fuzz_cleanup_(void)
{
    if (fuzz_dir_[0]) fuzz_rmtree_(fuzz_dir_);
    int fin = 0, init = 0;
    MPI_Initialized(&init);
    if (init) MPI_Finalized(&fin);
    if (init && !fin) MPI_Finalize();
}

/* The scratch directory (created once, removed at exit). */
static inline const char *fuzz_dir(void)
{
    if (!fuzz_dir_[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(fuzz_dir_, sizeof fuzz_dir_, "%s/tessera-fuzz.XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(fuzz_dir_)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(fuzz_cleanup_);
    }
    return fuzz_dir_;
}

/* Writes data to <scratch>/<name>; returns the path (static buffer). */
static inline const char *fuzz_write(const char *name, const void *data, size_t size)
{
    static char p[1024];
    snprintf(p, sizeof p, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(p, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) {
        perror(p);
        abort();
    }
    return p;
}

/* Writes data to dir/name (dir must exist). */
static inline void fuzz_write_at(const char *dir, const char *name, const void *data, size_t size)
{
    char p[1300];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) {
        perror(p);
        abort();
    }
}

static inline void fuzz_mpi_init(void)
{
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
        /* ROMIO allocates its 16 MiB collective buffer at every MPI-IO file
         * open; under ASan that is a fresh mapping each time (the dataset
         * target ran at 4 inputs/s). Small buffers keep the same code paths. */
        if (!getenv("ROMIO_HINTS")) {
            static char hints[600];
            snprintf(hints, sizeof hints, "%s/romio-hints", fuzz_dir());
            FILE *h = fopen(hints, "w");
            if (h) {
                fputs("cb_buffer_size 65536\nind_rd_buffer_size 65536\nind_wr_buffer_size 65536\n", h);
                fclose(h);
                setenv("ROMIO_HINTS", hints, 1);
            }
        }
        int prov;
        MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &prov);
    }
    ts_err_set_rank(0);
    fuzz_dir();
}

/* The oracle: a property that must hold. */
static void fuzz_fail_(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn, unused));
static void fuzz_fail_(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FUZZ PROPERTY FAILED at %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n  last tessera error: %s\n", ts_err_message());
    va_end(ap);
    abort();
}
#define FUZZ_REQUIRE(cond, ...)                                          \
    do {                                                                 \
        if (!(cond)) fuzz_fail_(__FILE__, __LINE__, __VA_ARGS__);        \
    } while (0)

/* A failed call must leave a message (an error without one is a bug). */
#define FUZZ_ERROR_HAS_MESSAGE(rc)                                                                              \
    FUZZ_REQUIRE((rc) == 0 || ts_err_message()[0], "call failed with code %d and no message", (int)(rc))

/* Reads choices from the input: each call takes bytes from the front;
 * when the input runs out every read gives 0. */
typedef struct {
    const uint8_t *p;
    size_t n;
} fuzz_bytes;

static inline uint64_t fuzz_take(fuzz_bytes *b, int nbytes)
{
    uint64_t v = 0;
    for (int k = 0; k < nbytes; k++) {
        v <<= 8;
        if (b->n) {
            v |= *b->p++;
            b->n--;
        }
    }
    return v;
}
static inline unsigned fuzz_u8(fuzz_bytes *b) { return (unsigned)fuzz_take(b, 1); }
/* a value in [lo, hi] */
static inline int64_t fuzz_range(fuzz_bytes *b, int64_t lo, int64_t hi)
{
    uint64_t span = (uint64_t)hi - (uint64_t)lo;
    uint64_t v = fuzz_take(b, span < 256 ? 1 : span < 65536 ? 2 : span < (1ull << 32) ? 4 : 8);
    return span == UINT64_MAX ? (int64_t)v : (int64_t)((uint64_t)lo + v % (span + 1));
}
/* an "interesting" int64: small values, edges and raw bytes */
static inline int64_t fuzz_i64(fuzz_bytes *b)
{
    static const int64_t special[] = {0, 1, 2, 3, -1, 4, 7, 8, 16, 63, 64, 255, 256, 4096, 65536,
                                      INT32_MAX, (int64_t)INT32_MAX + 1, INT64_MAX, INT64_MIN, -2};
    unsigned k = fuzz_u8(b);
    if (k < 2 * (sizeof special / sizeof special[0])) return special[k % (sizeof special / sizeof special[0])];
    return (int64_t)fuzz_take(b, 8);
}

#endif
