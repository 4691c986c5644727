/* binomial: broadcast down a binomial tree rooted at root, pipelined in
 * segments so that inner ranks forward segment j while receiving j+1.
 * Cost: (⌈log2 p⌉ + n/s - 1)·(α + s·β) for segment size s.
 * Reference: Thakur, Rabenseifner & Gropp, IJHPCA 19 (2005). */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#include <stdlib.h>

#define BCAST_SEG ((size_t)128 << 10)

int ts_bcast_binomial(ts_chan *ch, const ts_coll_args *a)
{
    const int p = ch->topo.size, vr = (ch->topo.rank - a->root + p) % p; /* rank relative to root */
    const size_t bytes = a->count * ts_dtype_size(a->dt);
    char *buf = a->recvbuf;
    int err = 0, nreq = 0, parent = -1, kids[64], nk = 0;
    MPI_Request *reqs = NULL;
    if (p == 1 || bytes == 0) return 0;
    int mask = 1;
    while (mask < p) {
        if (vr & mask) {
            parent = ((vr - mask) + a->root) % p;
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < p) kids[nk++] = (vr + mask + a->root) % p;
    size_t nseg = (bytes + BCAST_SEG - 1) / BCAST_SEG;
    reqs = malloc(sizeof *reqs * (nseg * (size_t)(nk + 1) * ts_p2p_nreq(BCAST_SEG) + 1));
    if (!reqs) return TS_ERR(TS_ERR_NOMEM, "bcast requests");
    for (size_t j = 0; j < nseg; j++) {
        size_t o = j * BCAST_SEG, n = bytes - o < BCAST_SEG ? bytes - o : BCAST_SEG;
        if (parent >= 0) TS_CHECK(ts_p2p_recv(buf + o, n, parent, TS_TAG_BCAST, ch->comm));
        for (int k = 0; k < nk; k++)
            TS_CHECK(ts_p2p_isend(buf + o, n, kids[k], TS_TAG_BCAST, ch->comm, reqs, &nreq));
    }
    TS_CHECK(ts_p2p_waitall(reqs, nreq));
cleanup:
    free(reqs);
    return err;
}
