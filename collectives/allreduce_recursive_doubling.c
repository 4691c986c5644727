/* recursive_doubling: log2(p) rounds; in round k each rank exchanges its
 * whole vector with rank ^ 2^k and reduces. Non-powers of two fold the
 * first 2·(p - 2^⌊log2 p⌋) ranks in pairs first and send the result back
 * at the end. Latency-optimal, for small messages.
 * Cost: ⌈log2 p⌉·(α + n·β + n·γ) (+ 2(α + n·β) with the fold).
 * Reference: Thakur, Rabenseifner & Gropp, IJHPCA 19 (2005). */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

/* Shared by rabenseifner: the fold maps rank to newrank (or -1 when the
 * rank sits out after sending its data to its neighbour). */
int ts_fold_newrank(int rank, int p, int *pof2_out)
{
    int pof2 = 1;
    while (pof2 * 2 <= p) pof2 *= 2;
    int rem = p - pof2;
    *pof2_out = pof2;
    if (rank < 2 * rem) return rank % 2 ? rank / 2 : -1;
    return rank - rem;
}

int ts_fold_oldrank(int newrank, int p, int pof2)
{
    int rem = p - pof2;
    return newrank < rem ? newrank * 2 + 1 : newrank + rem;
}

int ts_allreduce_recursive_doubling(ts_chan *ch, const ts_coll_args *a)
{
    const int p = ch->topo.size, rank = ch->topo.rank;
    const size_t es = ts_dtype_size(a->dt), bytes = a->count * es;
    MPI_Comm comm = ch->comm;
    char *buf = a->recvbuf;
    void *tmp;
    ts_coll_copy(a->recvbuf, a->sendbuf, bytes);
    if (p == 1 || a->count == 0) return 0;
    ts_op op = a->op == TS_OP_AVG ? TS_OP_SUM : a->op;
    TS_TRY(ts_chan_scratch(ch, bytes, &tmp));
    int pof2, nr = ts_fold_newrank(rank, p, &pof2), rem = p - pof2;
    if (rank < 2 * rem) {
        if (nr < 0) { /* even: hand my data to rank+1, get the result back */
            TS_TRY(ts_p2p_send(buf, bytes, rank + 1, TS_TAG_RD, comm));
        } else {
            TS_TRY(ts_p2p_recv(tmp, bytes, rank - 1, TS_TAG_RD, comm));
            ts_reduce_local(buf, tmp, a->count, a->dt, op);
        }
    }
    if (nr >= 0) {
        for (int mask = 1; mask < pof2; mask <<= 1) {
            int partner = ts_fold_oldrank(nr ^ mask, p, pof2);
            TS_TRY(ts_p2p_sendrecv(buf, bytes, partner, tmp, bytes, partner, TS_TAG_RD, comm));
            /* a op b == b op a bit for bit (IEEE sum, max, min), so both
             * partners hold identical partial results */
            ts_reduce_local(buf, tmp, a->count, a->dt, op);
        }
    }
    if (rank < 2 * rem) {
        if (nr < 0)
            TS_TRY(ts_p2p_recv(buf, bytes, rank + 1, TS_TAG_RD, comm));
        else
            TS_TRY(ts_p2p_send(buf, bytes, rank - 1, TS_TAG_RD, comm));
    }
    ts_reduce_finish(buf, a->count, a->dt, a->op, p);
    return 0;
}
