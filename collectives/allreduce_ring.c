/* ring: reduce-scatter then allgather around a ring, each step pipelined in
 * segments so that reducing one segment overlaps receiving the next.
 * Cost (p ranks, n bytes, α latency, β per byte, γ reduce per byte):
 *   2(p-1)·α + 2·(p-1)/p·n·β + (p-1)/p·n·γ        (bandwidth-optimal)
 * Reference: Patarasuk & Yuan, J. Parallel Distrib. Comput. 69 (2009). */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

int ts_allreduce_ring(ts_chan *ch, const ts_coll_args *a)
{
    const int p = ch->topo.size, r = ch->topo.rank;
    const size_t es = ts_dtype_size(a->dt);
    void *tmp;
    ts_coll_copy(a->recvbuf, a->sendbuf, a->count * es);
    if (p == 1 || a->count == 0) return 0;
    TS_TRY(ts_chan_scratch(ch, ts_ring_scratch_bytes(a->dt), &tmp));
    ts_op op = a->op == TS_OP_AVG ? TS_OP_SUM : a->op;
    TS_TRY(ts_ring_reduce_scatter(ch->comm, r, p, a->recvbuf, a->count, a->dt, op, tmp, ts_ring_scratch_bytes(a->dt),
                                  TS_TAG_RING));
    size_t o, l;
    ts_coll_block(a->count, a->dt, p, r, &o, &l);
    ts_reduce_finish((char *)a->recvbuf + o * es, l, a->dt, a->op, p);
    return ts_ring_allgather(ch->comm, r, p, a->recvbuf, a->count, a->dt, TS_TAG_RING);
}

