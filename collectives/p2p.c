/* Point-to-point helpers for the algorithms: any byte count, cut into
 * pieces that fit MPI's int counts (ts_coll_pieces, unit-tested). */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#include <limits.h>

size_t ts_p2p_max_piece = (size_t)1 << 30;

size_t ts_coll_pieces(size_t count, size_t max, size_t i, size_t *offset, size_t *len)
{
    if (max == 0) max = 1;
    size_t n = count == 0 ? 0 : (count - 1) / max + 1;
    if (offset && len) {
        *offset = i * max;
        *len = i < n ? (count - *offset < max ? count - *offset : max) : 0;
    }
    return n;
}

int ts_p2p_sendrecv(const void *sbuf, size_t sbytes, int dst, void *rbuf, size_t rbytes, int src, int tag,
                    MPI_Comm comm)
{
    size_t ns = ts_coll_pieces(sbytes, ts_p2p_max_piece, 0, NULL, NULL);
    size_t nr = ts_coll_pieces(rbytes, ts_p2p_max_piece, 0, NULL, NULL);
    size_t n = ns > nr ? ns : nr;
    for (size_t i = 0; i < n; i++) {
        size_t so, sl, ro, rl;
        ts_coll_pieces(sbytes, ts_p2p_max_piece, i, &so, &sl);
        ts_coll_pieces(rbytes, ts_p2p_max_piece, i, &ro, &rl);
        int rc;
        if (i < ns && i < nr)
            rc = MPI_Sendrecv((const char *)sbuf + so, (int)sl, MPI_BYTE, dst, tag, (char *)rbuf + ro, (int)rl,
                              MPI_BYTE, src, tag, comm, MPI_STATUS_IGNORE);
        else if (i < ns)
            rc = MPI_Send((const char *)sbuf + so, (int)sl, MPI_BYTE, dst, tag, comm);
        else
            rc = MPI_Recv((char *)rbuf + ro, (int)rl, MPI_BYTE, src, tag, comm, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return ts_err_mpi(rc, __FILE__, __LINE__, "MPI_Sendrecv");
    }
    return 0;
}

int ts_p2p_send(const void *buf, size_t bytes, int dst, int tag, MPI_Comm comm)
{
    size_t n = ts_coll_pieces(bytes, ts_p2p_max_piece, 0, NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        size_t o, l;
        ts_coll_pieces(bytes, ts_p2p_max_piece, i, &o, &l);
        TS_MPI_TRY(MPI_Send((const char *)buf + o, (int)l, MPI_BYTE, dst, tag, comm));
    }
    return 0;
}

int ts_p2p_recv(void *buf, size_t bytes, int src, int tag, MPI_Comm comm)
{
    size_t n = ts_coll_pieces(bytes, ts_p2p_max_piece, 0, NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        size_t o, l;
        ts_coll_pieces(bytes, ts_p2p_max_piece, i, &o, &l);
        MPI_Status st;
        TS_MPI_TRY(MPI_Recv((char *)buf + o, (int)l, MPI_BYTE, src, tag, comm, &st));
        int got;
        MPI_Get_count(&st, MPI_BYTE, &got);
        if ((size_t)got != l)
            return TS_ERR(TS_ERR_MISMATCH, "rank %d sent %d bytes where %zu were expected (counts differ between ranks?)",
                          src, got, l);
    }
    return 0;
}

size_t ts_p2p_nreq(size_t bytes)
{
    size_t n = ts_coll_pieces(bytes, ts_p2p_max_piece, 0, NULL, NULL);
    return n ? n : 1;
}

int ts_p2p_isend(const void *buf, size_t bytes, int dst, int tag, MPI_Comm comm, MPI_Request *reqs, int *nreq)
{
    size_t n = ts_coll_pieces(bytes, ts_p2p_max_piece, 0, NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        size_t o, l;
        ts_coll_pieces(bytes, ts_p2p_max_piece, i, &o, &l);
        TS_MPI_TRY(MPI_Isend((const char *)buf + o, (int)l, MPI_BYTE, dst, tag, comm, &reqs[(*nreq)++]));
    }
    return 0;
}

int ts_p2p_irecv(void *buf, size_t bytes, int src, int tag, MPI_Comm comm, MPI_Request *reqs, int *nreq)
{
    size_t n = ts_coll_pieces(bytes, ts_p2p_max_piece, 0, NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        size_t o, l;
        ts_coll_pieces(bytes, ts_p2p_max_piece, i, &o, &l);
        TS_MPI_TRY(MPI_Irecv((char *)buf + o, (int)l, MPI_BYTE, src, tag, comm, &reqs[(*nreq)++]));
    }
    return 0;
}

int ts_p2p_waitall(MPI_Request *reqs, int nreq)
{
    if (nreq == 0) return 0;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow" /* GCC 12 misreads MPI_STATUSES_IGNORE */
    TS_MPI_TRY(MPI_Waitall(nreq, reqs, MPI_STATUSES_IGNORE));
#pragma GCC diagnostic pop
    return 0;
}
