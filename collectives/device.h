/* GPU side of the collectives: recognising device buffers, the NCCL
 * communicator of a channel, and device fill/check kernels for benchmarks.
 * In a build without CUDA the queries answer "no device" and the kernels
 * report TS_ERR_UNSUPPORTED. */
#ifndef TS_COLLECTIVES_DEVICE_H
#define TS_COLLECTIVES_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/dtype.h"

struct ts_chan;

/* Local. 1 if p points to GPU memory. */
int ts_coll_is_device(const void *p);
/* Local. Number of visible GPUs (0 without CUDA or without devices). */
int ts_coll_device_count(void);
/* Local. Frees a channel's NCCL communicator, if any. */
void ts_nccl_chan_free(struct ts_chan *ch);

/* Local. Device memory for benchmarks: selects GPU (local_rank % count). */
int ts_coll_device_alloc(size_t bytes, int local_rank, void **p);
void ts_coll_device_free(void *p);
/* Local. Fills n elements with the check pattern of (rank, seed); counts
 * elements that differ from the expected reduction over p ranks. */
int ts_coll_device_fill(void *p, size_t n, ts_dtype dt, int rank, int seed);
int ts_coll_device_wrong(const void *p, size_t n, ts_dtype dt, int nranks, int op, int seed, size_t *wrong);
/* Local. Divides int32/int64 elements by nranks on the device. */
int ts_coll_device_int_avg(void *p, size_t n, ts_dtype dt, int nranks);

#endif
