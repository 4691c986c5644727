/* shm: node-local allreduce through an MPI-3 shared window. Small messages:
 * every rank stages its vector and every rank reduces all of them (one
 * flag barrier). Large: the vector is cut into one block per rank; per
 * round each rank stages pieces of the others' blocks, reduces a piece of
 * its own block (its own part read in place), publishes it, and copies the
 * others' results out (two flag barriers). On registered buffers (in place,
 * ts_coll_buffer_alloc) nothing is staged: each rank reduces its block
 * straight from its peers' buffers and writes the result into all of them.
 * Cost (p local ranks, n bytes, βm per byte of memory traffic):
 *   staged ≈ (4 - 2/p)·n·βm per rank + 2·rounds·barrier; registered ≈ 2·n·βm.
 * No MPI messages at all: the copies are the cost. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

int ts_allreduce_shm(ts_chan *ch, const ts_coll_args *a)
{
    if (a->reg) {
        char *bases[TS_SHM_MAX_LOCAL];
        for (int q = 0; q < ch->shm.p; q++) bases[q] = a->reg->peer[q];
        return ts_shm_run_registered(&ch->shm, TS_SHM_ALLREDUCE, bases, a->count, a->dt, a->op, &a->sig);
    }
    return ts_shm_run(&ch->shm, TS_SHM_ALLREDUCE, a->sendbuf, a->recvbuf, a->count, a->dt, a->op,
                      a->check ? &a->sig : NULL);
}
