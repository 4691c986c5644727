/* allgather shm: each rank stages pieces of its block, everyone copies all
 * blocks out. Cost ≈ (1/p + 1)·n·βm per rank + rounds·barrier. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

int ts_allgather_shm(ts_chan *ch, const ts_coll_args *a)
{
    return ts_shm_run(&ch->shm, TS_SHM_ALLGATHER, a->recvbuf, a->recvbuf, a->count, a->dt, a->op,
                      a->check ? &a->sig : NULL);
}
