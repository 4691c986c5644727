/* tree: pipelined binary-tree reduce to rank 0, then pipelined broadcast
 * down the same tree. The message is cut into segments of s bytes so all
 * levels work at once.
 * Cost: (2·⌈log2(p+1)⌉ + 2(n/s - 1))·(α + s·β) + (n/s + log2 p)·s·γ,
 * i.e. about 2·n·β + n·γ for long messages: each link carries the message
 * twice, so it trails ring's bandwidth but keeps latency at O(log p).
 * Reference: Sanders, Speck & Träff, Parallel Computing 35 (2009). */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#include <stdlib.h>

#define TREE_SEG ((size_t)64 << 10)

int ts_allreduce_tree(ts_chan *ch, const ts_coll_args *a)
{
    const int p = ch->topo.size, r = ch->topo.rank;
    const size_t es = ts_dtype_size(a->dt), bytes = a->count * es;
    MPI_Comm comm = ch->comm;
    char *buf = a->recvbuf, *tmp;
    int err = 0, nreq = 0;
    MPI_Request *reqs = NULL;
    ts_coll_copy(a->recvbuf, a->sendbuf, bytes);
    if (p == 1 || a->count == 0) return 0;
    ts_op op = a->op == TS_OP_AVG ? TS_OP_SUM : a->op;
    size_t seg = TREE_SEG / es ? TREE_SEG / es : 1, nseg = (a->count + seg - 1) / seg;
    int parent = r ? (r - 1) / 2 : -1, kids[2] = {2 * r + 1, 2 * r + 2}, nk = 0;
    for (int k = 0; k < 2; k++)
        if (kids[k] < p) nk++;
    TS_TRY(ts_chan_scratch(ch, (size_t)2 * seg * es, (void **)&tmp));
    reqs = malloc(sizeof *reqs * (nseg * 2 * ts_p2p_nreq(seg * es) + 4));
    if (!reqs) return TS_ERR(TS_ERR_NOMEM, "tree requests");
    /* reduce: per segment, children's partial sums come in (in child order,
     * so every run adds in the same order), then go up */
    for (size_t j = 0; j < nseg; j++) {
        size_t o = j * seg, n = a->count - o < seg ? a->count - o : seg;
        for (int k = 0; k < nk; k++) {
            TS_CHECK(ts_p2p_recv(tmp + (size_t)k * seg * es, n * es, kids[k], TS_TAG_TREE, comm));
        }
        for (int k = 0; k < nk; k++) ts_reduce_local(buf + o * es, tmp + (size_t)k * seg * es, n, a->dt, op);
        if (parent >= 0) TS_CHECK(ts_p2p_isend(buf + o * es, n * es, parent, TS_TAG_TREE, comm, reqs, &nreq));
        else ts_reduce_finish(buf + o * es, n, a->dt, a->op, p);
    }
    TS_CHECK(ts_p2p_waitall(reqs, nreq));
    nreq = 0;
    /* broadcast: per segment, from the parent, on to the children */
    for (size_t j = 0; j < nseg; j++) {
        size_t o = j * seg, n = a->count - o < seg ? a->count - o : seg;
        if (parent >= 0) TS_CHECK(ts_p2p_recv(buf + o * es, n * es, parent, TS_TAG_TREE, comm));
        for (int k = 0; k < nk; k++)
            TS_CHECK(ts_p2p_isend(buf + o * es, n * es, kids[k], TS_TAG_TREE, comm, reqs, &nreq));
    }
    TS_CHECK(ts_p2p_waitall(reqs, nreq));
cleanup:
    free(reqs);
    return err;
}
