/* hierarchical on GPU buffers (allreduce_hierarchical.c hands them here):
 * (1) NCCL reduce-scatter among the GPUs of a node (an NCCL communicator of
 * the node's ranks), (2) each rank's shard copied to pinned host memory,
 * MPI_Allreduce among the ranks with the same local rank on every node,
 * copied back (MPI never sees a device pointer: MPICH here is not
 * CUDA-aware), (3) NCCL all-gather in the node. With L ranks per node each
 * holds q = count / L elements through (1)-(3); the last count % L elements
 * are allreduced in the node by NCCL (grouped with (1)) and carried by
 * every rank's inter-node message, so any count works. AVG is a SUM divided
 * once, on the host shard, by the rank count. All GPU work runs on the
 * channel's stream; every wait has the deadline of device.c and the call
 * ends with one error agreement over the channel (device_impl.h).
 * Cost (N nodes, L GPUs each, n bytes; βg per byte between a node's GPUs,
 * βh per byte of a device-host copy):
 *   ≈ 2·(L-1)/L·n·βg + 2·(n/L)·βh + 2·(N-1)/N·(n/L)·β + MPI's and NCCL's α terms
 * Needs the same number of ranks on every node and one GPU per rank of a
 * node (ranks of different nodes may share one: faked nodes on one GPU). */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#ifdef TS_HAVE_CUDA
#include "collectives/device_impl.h"

#include <limits.h>

typedef struct hier {
    ts_chan *ch;
    ts_nccl *s;
    const ts_coll_args *a;
    size_t es, q, r;   /* element size, shard and tail counts */
    char *mine, *tail; /* this rank's shard and the tail, in recvbuf */
    double deadline;
} hier;

/* (1): shard and tail reduced over the node, then copied to the host */
static int node_reduce(hier *h)
{
    const ts_coll_args *a = h->a;
    ts_nccl *s = h->s;
    const char *send_tail = (const char *)a->sendbuf + (h->tail - (char *)a->recvbuf);
    ncclDataType_t t = ts_nccl_type(a->dt);
    ncclRedOp_t o = ts_nccl_op(a->op);
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess && h->q) r = ncclReduceScatter(a->sendbuf, h->mine, h->q, t, o, s->node, s->stream);
    if (r == ncclSuccess && h->r) r = ncclAllReduce(send_tail, h->tail, h->r, t, o, s->node, s->stream);
    ncclResult_t end = ncclGroupEnd();
    TS_TRY(ts_nccl_enqueued(h->ch, &s->node, r != ncclSuccess ? r : end, h->deadline,
                            "hierarchical: reduce-scatter in the node"));
    cudaError_t e = cudaSuccess;
    if (h->q) e = cudaMemcpyAsync(s->host, h->mine, h->q * h->es, cudaMemcpyDeviceToHost, s->stream);
    if (e == cudaSuccess && h->r)
        e = cudaMemcpyAsync((char *)s->host + h->q * h->es, h->tail, h->r * h->es, cudaMemcpyDeviceToHost, s->stream);
    if (e != cudaSuccess)
        return TS_ERR(TS_ERR_CUDA, "rank %d: hierarchical: copy to the host: %s", ts_err_rank(), cudaGetErrorString(e));
    return ts_nccl_wait(h->ch, s, &s->node, h->deadline, "hierarchical: reduce-scatter in the node");
}

/* (2): the host shard and tail allreduced among the peers, in pieces below INT_MAX */
static int peers_allreduce(hier *h)
{
    MPI_Datatype mt;
    MPI_Op mo;
    const size_t n = h->q + h->r;
    TS_TRY(ts_mpi_type_op(h->a->dt, h->a->op, &mt, &mo));
    for (size_t i = 0, np = ts_coll_pieces(n, INT_MAX / 2, 0, NULL, NULL); i < np; i++) {
        size_t o, l;
        ts_coll_pieces(n, INT_MAX / 2, i, &o, &l);
        TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, (char *)h->s->host + o * h->es, (int)l, mt, mo,
                                 h->ch->topo.peer_comm));
    }
    return 0;
}

/* (3): shard and tail back to the GPU, the shards gathered over the node */
static int node_gather(hier *h)
{
    ts_nccl *s = h->s;
    cudaError_t e = cudaSuccess;
    if (h->q) e = cudaMemcpyAsync(h->mine, s->host, h->q * h->es, cudaMemcpyHostToDevice, s->stream);
    if (e == cudaSuccess && h->r)
        e = cudaMemcpyAsync(h->tail, (char *)s->host + h->q * h->es, h->r * h->es, cudaMemcpyHostToDevice, s->stream);
    if (e != cudaSuccess)
        return TS_ERR(TS_ERR_CUDA, "rank %d: hierarchical: copy to the GPU: %s", ts_err_rank(), cudaGetErrorString(e));
    if (h->q) {
        ncclResult_t r = ncclAllGather(h->mine, h->a->recvbuf, h->q, ts_nccl_type(h->a->dt), s->node, s->stream);
        TS_TRY(ts_nccl_enqueued(h->ch, &s->node, r, h->deadline, "hierarchical: all-gather in the node"));
    }
    return ts_nccl_wait(h->ch, s, &s->node, h->deadline, "hierarchical: all-gather in the node");
}

int ts_allreduce_hierarchical_nccl(ts_chan *ch, const ts_coll_args *a)
{
    const ts_topo *t = &ch->topo;
    hier h = {.ch = ch, .a = a, .es = ts_dtype_size(a->dt), .deadline = ts_nccl_deadline()};
    if (a->count == 0) return 0;
    h.q = a->count / (size_t)t->local_size;
    h.r = a->count % (size_t)t->local_size;
    h.mine = (char *)a->recvbuf + (size_t)t->local_rank * h.q * h.es;
    h.tail = (char *)a->recvbuf + (size_t)t->local_size * h.q * h.es;
    TS_TRY(ts_nccl_state(ch, &h.s));
    if (!h.s->node) TS_TRY(ts_nccl_comm(ch, h.s, t->node_comm, &h.s->node, h.deadline, "hierarchical"));
    /* the same size on every rank: an agreed failure leaves none waiting in (2) */
    TS_TRY(ts_err_agree(ch->comm, ts_nccl_host(h.s, (h.q + h.r) * h.es)));
    int lerr = ts_nccl_after_caller(h.s);
    if (!lerr) lerr = node_reduce(&h);
    if (t->nnodes > 1) { /* a rank that failed still takes part: its peers on other nodes wait for it */
        int e = peers_allreduce(&h);
        if (!lerr) lerr = e;
    }
    if (!lerr) {
        ts_reduce_finish(h.s->host, h.q + h.r, a->dt, a->op, t->size);
        lerr = node_gather(&h);
    }
    return ts_nccl_agree(ch, &h.s->node, lerr);
}

#else /* no CUDA: no buffer is a device buffer, so this is never chosen */

int ts_allreduce_hierarchical_nccl(ts_chan *ch, const ts_coll_args *a)
{
    (void)ch;
    (void)a;
    return TS_ERR(TS_ERR_UNSUPPORTED, "hierarchical on GPU buffers needs a build with --with-cuda");
}
#endif
