/* allgather ring: the second half of the ring allreduce.
 * Cost: (p-1)·α + (p-1)/p·n·β. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

int ts_allgather_ring(ts_chan *ch, const ts_coll_args *a)
{
    if (ch->topo.size == 1 || a->count == 0) return 0;
    return ts_ring_allgather(ch->comm, ch->topo.rank, ch->topo.size, a->recvbuf, a->count, a->dt, TS_TAG_AG);
}
