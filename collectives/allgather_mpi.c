/* allgather mpi: MPI_Allgatherv in place with the blocks of ts_coll_block.
 * Cost: the library's. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#include <limits.h>
#include <stdlib.h>

int ts_allgather_mpi(ts_chan *ch, const ts_coll_args *a)
{
    const int p = ch->topo.size;
    const size_t es = ts_dtype_size(a->dt);
    int err = 0, *counts = NULL, *displs = NULL;
    if (a->count * es > INT_MAX)
        return TS_ERR(TS_ERR_UNSUPPORTED, "allgather mpi: more than INT_MAX bytes");
    counts = malloc(sizeof *counts * (size_t)p);
    displs = malloc(sizeof *displs * (size_t)p);
    if (!counts || !displs) TS_FAIL(TS_ERR_NOMEM, "counts");
    for (int q = 0; q < p; q++) {
        size_t o, l;
        ts_coll_block(a->count, a->dt, p, q, &o, &l);
        counts[q] = (int)(l * es);
        displs[q] = (int)(o * es);
    }
    TS_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, a->recvbuf, counts, displs, MPI_BYTE, ch->comm));
cleanup:
    free(counts);
    free(displs);
    return err;
}
