/* bcast mpi: MPI_Bcast in pieces below INT_MAX bytes. Cost: the library's. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

int ts_bcast_mpi(ts_chan *ch, const ts_coll_args *a)
{
    size_t bytes = a->count * ts_dtype_size(a->dt), n = ts_coll_pieces(bytes, ts_p2p_max_piece, 0, NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        size_t o, l;
        ts_coll_pieces(bytes, ts_p2p_max_piece, i, &o, &l);
        TS_MPI_TRY(MPI_Bcast((char *)a->recvbuf + o, (int)l, MPI_BYTE, a->root, ch->comm));
    }
    return 0;
}
