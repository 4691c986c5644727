/* HDF5 glue for io/: the TS_H5 error adapter (a negative return is an error;
 * the message carries HDF5's own error stack), the process-wide lock that
 * serialises HDF5 calls (Debian's parallel HDF5 is not thread-safe, and the
 * loader reads on a background thread), small attribute helpers, and the
 * Fletcher-32 checksum that HDF5 stores after each filtered chunk, computed
 * here block-wise so the direct-chunk read and write paths verify at memory
 * speed rather than through HDF5's byte-at-a-time filter. */
#ifndef TS_IO_H5_H
#define TS_IO_H5_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "src/core/error.h"

/* Local. Records TS_ERR_HDF5 with "what: <HDF5 error stack>" (the stack of
 * the calling thread, innermost first) and returns the code. */
int ts_h5_err(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Adapters in the TS_CHECK style: need `int err` and a `cleanup:` label.
 * TS_H5(call) names the call; TS_H5M(call, fmt, ...) names what failed. */
#define TS_H5(call)                                                         \
    do {                                                                    \
        if ((call) < 0) {                                                   \
            err = ts_h5_err(__FILE__, __LINE__, "%s failed", #call);        \
            goto cleanup;                                                   \
        }                                                                   \
    } while (0)
#define TS_H5M(call, ...)                                                   \
    do {                                                                    \
        if ((call) < 0) {                                                   \
            err = ts_h5_err(__FILE__, __LINE__, __VA_ARGS__);               \
            goto cleanup;                                                   \
        }                                                                   \
    } while (0)

/* Local. Once per process: turns off HDF5's automatic error printing (errors
 * are reported through ts_err) and raises glibc's mmap/trim thresholds so
 * that the megabyte-sized buffers of chunk I/O are reused instead of being
 * mapped and faulted in on every call (set TESSERA_NO_MALLOC_TUNE=1 to keep
 * glibc's defaults). Called by every io entry point that touches HDF5. */
void ts_h5_init(void);

/* Local. The process-wide HDF5 lock (recursive). Every io function that
 * calls HDF5 holds it; other modules calling HDF5 while a loader runs must
 * take it too. */
void ts_h5_lock(void);
void ts_h5_unlock(void);

/* Local. HDF5's Fletcher-32 (H5_checksum_fletcher32: big-endian 16-bit
 * words, sums folded every 360 words), bit-identical, computed per block. */
uint32_t ts_h5_fletcher32(const void *data, size_t len);

/* Local. Opens an existing object's attribute and checks that it exists;
 * the helpers below read or write whole attributes. Strings are written as
 * variable-length UTF-8 (h5py reads them as str). Errors name attr and where. */
int ts_h5_attr_exists(hid_t obj, const char *name);
int ts_h5_write_attr_f64(hid_t obj, const char *name, int ndim, const hsize_t *dims, const double *v);
int ts_h5_write_attr_i64(hid_t obj, const char *name, int ndim, const hsize_t *dims, const int64_t *v);
int ts_h5_write_attr_str(hid_t obj, const char *name, const char *s);
int ts_h5_write_attr_strs(hid_t obj, const char *name, int n, const char *const *s);
/* Reads exactly n values (the attribute must hold n); where names the file or object in messages. */
int ts_h5_read_attr_f64(hid_t obj, const char *name, int64_t n, double *v, const char *where);
int ts_h5_read_attr_i64(hid_t obj, const char *name, int64_t n, int64_t *v, const char *where);
/* Reads a string attribute (fixed or variable length) into buf. */
int ts_h5_read_attr_str(hid_t obj, const char *name, char *buf, size_t n, const char *where);
/* Reads a 1-D string array attribute; *out gets n malloc'ed strings (free with ts_h5_free_strs). */
int ts_h5_read_attr_strs(hid_t obj, const char *name, int *n, char ***out, const char *where);
void ts_h5_free_strs(int n, char **s);

#endif
