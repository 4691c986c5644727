/* hierarchical: (1) reduce-scatter inside each node through shared memory,
 * (2) allreduce of each block among the ranks with the same local rank on
 * every node (ring for large blocks, recursive doubling for small ones),
 * (3) allgather inside each node through shared memory. Each inter-node
 * link carries 1/L of the data (L ranks per node) and all L peers groups run
 * at once, so the network sees the node, not the rank, count.
 * Cost (N nodes, L per node, n bytes; shared-memory copies at βs per byte):
 *   ≈ 3·n·βs + 2·(N-1)/N·(n/L)·β + 2(N-1)·α      (ring between nodes)
 * Needs the same number of ranks on every node. GPU buffers take the same
 * three steps with NCCL inside the node: allreduce_hierarchical_nccl.c.
 * Reference: Sack & Gropp, "Collective algorithms for multiported torus
 * networks" (2015); NCCL's tree/ring split inside and across nodes. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#define HIER_SMALL ((size_t)64 << 10) /* per-peer block below this: recursive doubling */

int ts_fold_newrank(int rank, int p, int *pof2_out);
int ts_fold_oldrank(int newrank, int p, int pof2);

/* recursive doubling on an arbitrary communicator (block of the peers) */
static int peers_rd(MPI_Comm comm, int rank, int p, char *buf, char *tmp, size_t count, ts_dtype dt, ts_op op)
{
    size_t bytes = count * ts_dtype_size(dt);
    int pof2, nr = ts_fold_newrank(rank, p, &pof2), rem = p - pof2;
    if (rank < 2 * rem) {
        if (nr < 0) TS_TRY(ts_p2p_send(buf, bytes, rank + 1, TS_TAG_HIER, comm));
        else {
            TS_TRY(ts_p2p_recv(tmp, bytes, rank - 1, TS_TAG_HIER, comm));
            ts_reduce_local(buf, tmp, count, dt, op);
        }
    }
    if (nr >= 0)
        for (int mask = 1; mask < pof2; mask <<= 1) {
            int partner = ts_fold_oldrank(nr ^ mask, p, pof2);
            TS_TRY(ts_p2p_sendrecv(buf, bytes, partner, tmp, bytes, partner, TS_TAG_HIER, comm));
            ts_reduce_local(buf, tmp, count, dt, op);
        }
    if (rank < 2 * rem) {
        if (nr < 0) TS_TRY(ts_p2p_recv(buf, bytes, rank + 1, TS_TAG_HIER, comm));
        else TS_TRY(ts_p2p_send(buf, bytes, rank - 1, TS_TAG_HIER, comm));
    }
    return 0;
}

int ts_allreduce_hierarchical(ts_chan *ch, const ts_coll_args *a)
{
    const ts_topo *t = &ch->topo;
    const size_t es = ts_dtype_size(a->dt);
    ts_op op = a->op == TS_OP_AVG ? TS_OP_SUM : a->op;
    if (a->device) return ts_allreduce_hierarchical_nccl(ch, a);
    if (t->size == 1 || a->count == 0) {
        ts_coll_copy(a->recvbuf, a->sendbuf, a->count * es);
        return 0;
    }
    /* (1) my block, reduced over the node, lands in recvbuf */
    TS_TRY(ts_shm_run(&ch->shm, TS_SHM_REDUCE_SCATTER, a->sendbuf, a->recvbuf, a->count, a->dt, op,
                      a->check ? &a->sig : NULL));
    size_t off, len;
    ts_coll_block(a->count, a->dt, t->local_size, t->local_rank, &off, &len);
    char *blk = (char *)a->recvbuf + off * es;
    /* (2) across nodes, among my peers */
    if (t->nnodes > 1 && len > 0) {
        int pr, pp;
        MPI_Comm_rank(t->peer_comm, &pr);
        MPI_Comm_size(t->peer_comm, &pp);
        if (len * es < HIER_SMALL) {
            char *tmp;
            TS_TRY(ts_chan_scratch(ch, len * es, (void **)&tmp));
            TS_TRY(peers_rd(t->peer_comm, pr, pp, blk, tmp, len, a->dt, op));
        } else {
            void *tmp;
            TS_TRY(ts_chan_scratch(ch, ts_ring_scratch_bytes(a->dt), &tmp));
            TS_TRY(ts_ring_reduce_scatter(t->peer_comm, pr, pp, blk, len, a->dt, op, tmp,
                                          ts_ring_scratch_bytes(a->dt), TS_TAG_HIER));
            size_t o, l;
            ts_coll_block(len, a->dt, pp, pr, &o, &l);
            ts_reduce_finish(blk + o * es, l, a->dt, a->op, t->size);
            TS_TRY(ts_ring_allgather(t->peer_comm, pr, pp, blk, len, a->dt, TS_TAG_HIER));
            goto gather; /* already finished */
        }
    }
    ts_reduce_finish(blk, len, a->dt, a->op, t->size);
gather:
    /* (3) every block to every local rank */
    return ts_shm_run(&ch->shm, TS_SHM_ALLGATHER, a->recvbuf, a->recvbuf, a->count, a->dt, op, NULL);
}
