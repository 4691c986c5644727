/* GPU side of the collectives: recognising device buffers, which GPU a
 * rank uses, which algorithms serve GPU buffers, the channel's NCCL state,
 * and device fill/check kernels for benchmarks. In a build without CUDA the
 * queries answer "no device" and the kernels report TS_ERR_UNSUPPORTED. */
#ifndef TS_COLLECTIVES_DEVICE_H
#define TS_COLLECTIVES_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "src/core/dtype.h"

struct ts_chan;

/* Local. 1 if p points to GPU memory. */
int ts_coll_is_device(const void *p);
/* Local. Number of visible GPUs (0 without CUDA or without devices). */
int ts_coll_device_count(void);
/* Local. The GPU this rank's collectives on c use: its place among the
 * ranks of its machine (the real node, before TESSERA_RANKS_PER_NODE) mod
 * the number of visible GPUs; -1 when it sees none. */
int ts_coll_gpu(const ts_coll *c);
/* Collective (a ts_coll is destroyed collectively). Frees a channel's GPU
 * state: its NCCL communicators (finalised, or aborted when that does not
 * finish), stream and host staging. */
void ts_nccl_chan_free(struct ts_chan *ch);

/* Local. From now on, device collectives (any channel, any thread) order
 * their work after what was queued on stream (a cudaStream_t; NULL: no
 * stream but the default one) when they start, as they do after the
 * default stream's. The GPU engine's compute stream is non-blocking, so
 * gradient buckets reduced while backward runs need it
 * (src/train/step.c). A no-op without CUDA. */
void ts_coll_device_order_after(void *stream);

/* Local. 1: the named algorithm serves GPU buffers on c; 0: it is a GPU
 * algorithm that cannot serve them here (why says so); -1: host memory only
 * (or unknown). */
int ts_coll_device_algo(ts_coll *c, ts_coll_kind kind, const char *algo, char *why, size_t n);
/* Local. As ts_coll_choice, for GPU buffers. */
const char *ts_coll_device_choice(ts_coll *c, ts_coll_kind kind, size_t count, ts_dtype dt, ts_op op,
                                  const char **why);

/* Local. Device memory for benchmarks on GPU gpu (ts_coll_gpu), which
 * becomes the calling thread's current device. */
int ts_coll_device_alloc(size_t bytes, int gpu, void **p);
void ts_coll_device_free(void *p);
/* Local. Fills n elements with the check pattern of (rank, seed); counts
 * elements that differ from the expected reduction over p ranks. */
int ts_coll_device_fill(void *p, size_t n, ts_dtype dt, int rank, int seed);
int ts_coll_device_wrong(const void *p, size_t n, ts_dtype dt, int nranks, int op, int seed, size_t *wrong);
/* Local. Queues on stream (a cudaStream_t) the end of an AVG: n elements
 * divided by nranks, as ts_reduce_finish does on the host (integer division
 * for integers, half types divided in float32 and rounded once). Returns a
 * launch error; completion is the caller's wait on stream. */
int ts_coll_device_avg(void *p, size_t n, ts_dtype dt, int nranks, void *stream);

#endif
