/* reduce_scatter ring: the first half of the ring allreduce.
 * Cost: (p-1)·α + (p-1)/p·n·(β+γ). Block r of the result ends on rank r. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

int ts_reduce_scatter_ring(ts_chan *ch, const ts_coll_args *a)
{
    const int p = ch->topo.size, r = ch->topo.rank;
    const size_t es = ts_dtype_size(a->dt);
    void *tmp;
    ts_coll_copy(a->recvbuf, a->sendbuf, a->count * es);
    if (p == 1 || a->count == 0) return 0;
    TS_TRY(ts_chan_scratch(ch, ts_ring_scratch_bytes(a->dt), &tmp));
    ts_op op = a->op == TS_OP_AVG ? TS_OP_SUM : a->op;
    TS_TRY(ts_ring_reduce_scatter(ch->comm, r, p, a->recvbuf, a->count, a->dt, op, tmp, ts_ring_scratch_bytes(a->dt),
                                  TS_TAG_RS));
    size_t o, l;
    ts_coll_block(a->count, a->dt, p, r, &o, &l);
    ts_reduce_finish((char *)a->recvbuf + o * es, l, a->dt, a->op, p);
    return 0;
}
