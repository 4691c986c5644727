/* Private to collectives/, CUDA builds only: a channel's GPU state (its
 * device, its communication stream, its NCCL communicators, the host
 * staging of the hierarchical algorithm) and what device.c gives the two
 * NCCL algorithms (device.c, allreduce_hierarchical_nccl.c): communicators
 * made non-blocking, waits bounded by a deadline, errors agreed. */
#ifndef TS_COLLECTIVES_DEVICE_IMPL_H
#define TS_COLLECTIVES_DEVICE_IMPL_H

#ifdef TS_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include "collectives/coll_impl.h"

typedef struct ts_nccl {
    int gpu;             /* this rank's CUDA device */
    cudaStream_t stream; /* the channel's communication stream: all its GPU work */
    cudaEvent_t ready;   /* recorded on the default stream: the caller's queued work comes first */
    cudaEvent_t after;   /* recorded on the stream of ts_coll_device_order_after, where one is set */
    int have_stream, have_event;
    ncclComm_t flat;     /* every rank of the channel (`nccl`); NULL until first used */
    ncclComm_t node;     /* the ranks of this rank's node (`hierarchical`); NULL until first used */
    void *host;          /* pinned host staging of the inter-node step */
    size_t host_bytes;
} ts_nccl;

/* Local. The time (ts_time_now) by which a call that starts now must end:
 * 80% of the watchdog's deadline (fault.timeout; its default, 120 s, where
 * no watchdog runs), so that the abort and the error agreement finish
 * before the watchdog would end the job. */
double ts_nccl_deadline(void);

/* Collective on ch->comm (errors agreed): the channel's GPU state, made on
 * first use (the GPU: this rank's place on its machine mod the GPUs it
 * sees; a non-blocking stream; the event). Makes the GPU current for the
 * calling thread. */
int ts_nccl_state(ts_chan *ch, ts_nccl **out);

/* Collective on comm (ch->comm or ch->topo.node_comm; errors agreed on
 * ch->comm): a non-blocking NCCL communicator of comm's ranks into *slot.
 * Refuses first, on every rank, when two of comm's ranks would use one GPU.
 * NCCL's unique id goes from comm's rank 0 to the others by MPI_Bcast. The
 * initialisation is polled until deadline; on an error or past it the
 * communicator is aborted and the error names the rank and NCCL's message. */
int ts_nccl_comm(ts_chan *ch, ts_nccl *s, MPI_Comm comm, ncclComm_t *slot, double deadline, const char *what);

/* Local. Makes s->stream wait for the work queued so far on the default
 * stream (the caller's: its buffers are ready when the collective starts). */
int ts_nccl_after_caller(ts_nccl *s);

/* Local. r is what an NCCL call on *comm returned: while it is
 * ncclInProgress (a non-blocking communicator still enqueuing), polls
 * ncclCommGetAsyncError. An error, or the deadline passing, aborts *comm
 * (sets it NULL) and returns TS_ERR_CUDA naming the rank, what and NCCL's
 * message. 0 once the work is on the stream. */
int ts_nccl_enqueued(ts_chan *ch, ncclComm_t *comm, ncclResult_t r, double deadline, const char *what);

/* Local. Waits until s->stream has run all its work, polling cudaStreamQuery
 * and *comm's asynchronous error (never a bare cudaStreamSynchronize); errors
 * and the deadline as for ts_nccl_enqueued. */
int ts_nccl_wait(ts_chan *ch, ts_nccl *s, ncclComm_t *comm, double deadline, const char *what);

/* Collective on ch->comm: agrees on err (ts_err_agree). When any rank
 * failed, every rank aborts *comm (its peers' side is gone), so the next
 * call makes a new one. Returns the agreed code. */
int ts_nccl_agree(ts_chan *ch, ncclComm_t *comm, int err);

/* Local. Pinned host staging of at least bytes in s->host. */
int ts_nccl_host(ts_nccl *s, size_t bytes);

/* NCCL's type and reduction for tessera's (AVG is reduced as SUM, then divided). */
static inline ncclDataType_t ts_nccl_type(ts_dtype dt)
{
    static const ncclDataType_t t[TS_DTYPE_COUNT] = {ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat16,
                                                     ncclInt32,   ncclInt64,   ncclUint8};
    return t[dt];
}
static inline ncclRedOp_t ts_nccl_op(ts_op op)
{
    return op == TS_OP_MAX ? ncclMax : op == TS_OP_MIN ? ncclMin : ncclSum;
}
#endif

#endif
