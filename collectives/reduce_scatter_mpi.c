/* reduce_scatter mpi: MPI_Reduce_scatter with the block sizes of
 * ts_coll_block, result placed at the block's offset. Cost: the library's. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#include <limits.h>
#include <stdlib.h>

int ts_reduce_scatter_mpi(ts_chan *ch, const ts_coll_args *a)
{
    const int p = ch->topo.size, r = ch->topo.rank;
    const size_t es = ts_dtype_size(a->dt);
    MPI_Datatype mt;
    MPI_Op mo;
    int err = 0, *counts = NULL;
    TS_TRY(ts_mpi_type_op(a->dt, a->op, &mt, &mo));
    if (a->count / (size_t)p + 1 > INT_MAX / 2)
        return TS_ERR(TS_ERR_UNSUPPORTED, "reduce_scatter mpi: blocks above INT_MAX/2 elements");
    counts = malloc(sizeof *counts * (size_t)p);
    if (!counts) return TS_ERR(TS_ERR_NOMEM, "counts");
    size_t o, l;
    for (int q = 0; q < p; q++) {
        ts_coll_block(a->count, a->dt, p, q, &o, &l);
        counts[q] = (int)l;
    }
    ts_coll_block(a->count, a->dt, p, r, &o, &l);
    if (a->sendbuf == a->recvbuf) {
        /* MPI puts my block at the start of recvbuf: move it to its offset */
        TS_MPI(MPI_Reduce_scatter(MPI_IN_PLACE, a->recvbuf, counts, mt, mo, ch->comm));
        memmove((char *)a->recvbuf + o * es, a->recvbuf, l * es);
    } else {
        TS_MPI(MPI_Reduce_scatter(a->sendbuf, (char *)a->recvbuf + o * es, counts, mt, mo, ch->comm));
    }
    ts_reduce_finish((char *)a->recvbuf + o * es, l, a->dt, a->op, p);
cleanup:
    free(counts);
    return err;
}
