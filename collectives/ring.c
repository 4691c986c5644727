/* Ring building blocks over any communicator: pipelined reduce-scatter and
 * allgather. Used by the ring algorithms and by hierarchical. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#include <stdlib.h>

#define RING_SEG ((size_t)256 << 10) /* bytes per pipelined segment */

int ts_ring_reduce_scatter(MPI_Comm comm, int rank, int p, void *buf, size_t count, ts_dtype dt, ts_op op,
                           void *tmp, size_t tmp_bytes, int tag)
{
    const size_t es = ts_dtype_size(dt);
    char *b = buf, *t[2];
    int err = 0, right = (rank + 1) % p, left = (rank + p - 1) % p;
    MPI_Request *reqs = NULL;
    if (p == 1 || count == 0) return 0;
    size_t seg = RING_SEG / es;
    if (seg == 0) seg = 1;
    if (tmp_bytes < 2 * seg * es) return TS_ERR(TS_ERR_INTERNAL, "ring scratch too small");
    t[0] = tmp;
    t[1] = (char *)tmp + seg * es;
    size_t maxblk, b0;
    ts_coll_block(count, dt, p, 0, &b0, &maxblk); /* block 0 is the largest */
    size_t maxseg = (maxblk + seg - 1) / seg;
    size_t per = ts_p2p_nreq(seg * es); /* requests per segment */
    reqs = malloc(sizeof *reqs * (maxseg * per + 2 * per));
    if (!reqs) return TS_ERR(TS_ERR_NOMEM, "ring requests");
    MPI_Request *rq[2] = {reqs + maxseg * per, reqs + maxseg * per + per};
    for (int s = 0; s < p - 1; s++) {
        size_t so, sl, ro, rl;
        ts_coll_block(count, dt, p, (rank - s - 1 + 2 * p) % p, &so, &sl);
        ts_coll_block(count, dt, p, (rank - s - 2 + 2 * p) % p, &ro, &rl);
        int ns = 0;
        int nrq[2] = {0, 0};
        /* all segments of the outgoing block go out at once */
        for (size_t o = 0; o < sl; o += seg) {
            size_t n = sl - o < seg ? sl - o : seg;
            TS_CHECK(ts_p2p_isend(b + (so + o) * es, n * es, right, tag, comm, reqs, &ns));
        }
        size_t nseg = (rl + seg - 1) / seg;
        if (nseg) TS_CHECK(ts_p2p_irecv(t[0], (rl < seg ? rl : seg) * es, left, tag, comm, rq[0], &nrq[0]));
        for (size_t j = 0; j < nseg; j++) {
            size_t o = j * seg, n = rl - o < seg ? rl - o : seg;
            TS_CHECK(ts_p2p_waitall(rq[j & 1], nrq[j & 1]));
            nrq[j & 1] = 0;
            if (j + 1 < nseg) {
                size_t n2 = rl - o - seg < seg ? rl - o - seg : seg;
                TS_CHECK(ts_p2p_irecv(t[(j + 1) & 1], n2 * es, left, tag, comm, rq[(j + 1) & 1], &nrq[(j + 1) & 1]));
            }
            ts_reduce_local(b + (ro + o) * es, t[j & 1], n, dt, op);
        }
        TS_CHECK(ts_p2p_waitall(reqs, ns));
    }
cleanup:
    free(reqs);
    return err;
}

int ts_ring_allgather(MPI_Comm comm, int rank, int p, void *buf, size_t count, ts_dtype dt, int tag)
{
    const size_t es = ts_dtype_size(dt);
    int right = (rank + 1) % p, left = (rank + p - 1) % p;
    for (int s = 0; s < p - 1; s++) {
        size_t so, sl, ro, rl;
        ts_coll_block(count, dt, p, (rank - s + p) % p, &so, &sl);
        ts_coll_block(count, dt, p, (rank - s - 1 + 2 * p) % p, &ro, &rl);
        TS_TRY(ts_p2p_sendrecv((char *)buf + so * es, sl * es, right, (char *)buf + ro * es, rl * es, left, tag,
                               comm));
    }
    return 0;
}

size_t ts_ring_scratch_bytes(ts_dtype dt) { return 2 * RING_SEG + 2 * ts_dtype_size(dt); }
