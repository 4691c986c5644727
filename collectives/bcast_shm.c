/* bcast shm: the root stages, everyone copies out. Cost ≈ 2·n·βm. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

int ts_bcast_shm(ts_chan *ch, const ts_coll_args *a)
{
    return ts_shm_bcast(&ch->shm, a->recvbuf, a->count * ts_dtype_size(a->dt), a->root, a->check ? &a->sig : NULL);
}
