/* ring: reduce-scatter then allgather around a ring, each step pipelined in
 * segments so that reducing one segment overlaps receiving the next.
 * Cost (p ranks, n bytes, α latency, β per byte, γ reduce per byte):
 *   2(p-1)·α + 2·(p-1)/p·n·β + (p-1)/p·n·γ        (bandwidth-optimal)
 * Reference: Patarasuk & Yuan, J. Parallel Distrib. Comput. 69 (2009). */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

int ts_allreduce_ring(ts_chan *ch, const ts_coll_args *a)
{
    /* block r reduced (and finished for AVG) on rank r, then every block everywhere */
    TS_TRY(ts_reduce_scatter_ring(ch, a));
    if (ch->topo.size == 1 || a->count == 0) return 0;
    return ts_ring_allgather(ch->comm, ch->topo.rank, ch->topo.size, a->recvbuf, a->count, a->dt, TS_TAG_RING);
}
