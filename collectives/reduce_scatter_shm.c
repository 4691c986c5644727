/* reduce_scatter shm: the first half of the shm allreduce: per round each
 * rank stages pieces of the others' blocks and reduces a piece of its own.
 * Cost ≈ (2 - 1/p)·n·βm per rank + rounds·barrier. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

int ts_reduce_scatter_shm(ts_chan *ch, const ts_coll_args *a)
{
    return ts_shm_run(&ch->shm, TS_SHM_REDUCE_SCATTER, a->sendbuf, a->recvbuf, a->count, a->dt, a->op,
                      a->check ? &a->sig : NULL);
}
