/* rabenseifner: reduce-scatter by recursive halving, then allgather by
 * recursive doubling, on the 2^⌊log2 p⌋ ranks left after folding the rest
 * in pairs (as in recursive_doubling). Bandwidth-optimal with log2 p rounds:
 * good for medium and large messages.
 * Cost: 2·log2(p)·α + 2·(p-1)/p·n·β + (p-1)/p·n·γ (+ fold: 2(α + n·β) + n·γ).
 * Reference: Rabenseifner, ICCS 2004; Thakur et al., IJHPCA 19 (2005). */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

int ts_fold_newrank(int rank, int p, int *pof2_out);
int ts_fold_oldrank(int newrank, int p, int pof2);

int ts_allreduce_rabenseifner(ts_chan *ch, const ts_coll_args *a)
{
    const int p = ch->topo.size, rank = ch->topo.rank;
    const size_t es = ts_dtype_size(a->dt), bytes = a->count * es;
    MPI_Comm comm = ch->comm;
    char *buf = a->recvbuf, *tmp;
    ts_coll_copy(a->recvbuf, a->sendbuf, bytes);
    if (p == 1 || a->count == 0) return 0;
    ts_op op = a->op == TS_OP_AVG ? TS_OP_SUM : a->op;
    TS_TRY(ts_chan_scratch(ch, bytes, (void **)&tmp));
    int pof2, nr = ts_fold_newrank(rank, p, &pof2), rem = p - pof2;
    if (rank < 2 * rem) {
        if (nr < 0) {
            TS_TRY(ts_p2p_send(buf, bytes, rank + 1, TS_TAG_RAB, comm));
        } else {
            TS_TRY(ts_p2p_recv(tmp, bytes, rank - 1, TS_TAG_RAB, comm));
            ts_reduce_local(buf, tmp, a->count, a->dt, op);
        }
    }
    if (nr >= 0) {
        /* blocks [lo, hi) of pof2 blocks that this rank is responsible for */
        int lo = 0, hi = pof2;
        for (int mask = pof2 / 2; mask >= 1; mask /= 2) {
            int partner = ts_fold_oldrank(nr ^ mask, p, pof2), mid = lo + (hi - lo) / 2;
            int klo = nr & mask ? mid : lo, khi = nr & mask ? hi : mid; /* kept */
            int slo = nr & mask ? lo : mid, shi = nr & mask ? mid : hi; /* sent */
            size_t ko, kl, so, sl, e;
            ts_split_block(a->count, pof2, klo, &ko, &e);
            ts_split_block(a->count, pof2, khi - 1, &kl, &e);
            kl = kl + e - ko;
            ts_split_block(a->count, pof2, slo, &so, &e);
            ts_split_block(a->count, pof2, shi - 1, &sl, &e);
            sl = sl + e - so;
            TS_TRY(ts_p2p_sendrecv(buf + so * es, sl * es, partner, tmp, kl * es, partner, TS_TAG_RAB, comm));
            ts_reduce_local(buf + ko * es, tmp, kl, a->dt, op);
            lo = klo;
            hi = khi;
        }
        /* lo == nr: finish my block, then gather the others back */
        size_t mo, ml;
        ts_split_block(a->count, pof2, nr, &mo, &ml);
        ts_reduce_finish(buf + mo * es, ml, a->dt, a->op, p);
        for (int mask = 1; mask < pof2; mask *= 2) {
            int partner = ts_fold_oldrank(nr ^ mask, p, pof2);
            int plo = (nr ^ mask) & ~(mask - 1), phi = plo + mask; /* partner's range */
            size_t o1, o2, e;
            ts_split_block(a->count, pof2, lo, &o1, &e);
            ts_split_block(a->count, pof2, hi - 1, &o2, &e);
            size_t myo = o1, myl = o2 + e - o1;
            ts_split_block(a->count, pof2, plo, &o1, &e);
            ts_split_block(a->count, pof2, phi - 1, &o2, &e);
            size_t po = o1, pl = o2 + e - o1;
            TS_TRY(ts_p2p_sendrecv(buf + myo * es, myl * es, partner, buf + po * es, pl * es, partner, TS_TAG_RAB,
                                   comm));
            if (plo < lo) lo = plo;
            if (phi > hi) hi = phi;
        }
    }
    if (rank < 2 * rem) {
        if (nr < 0)
            TS_TRY(ts_p2p_recv(buf, bytes, rank + 1, TS_TAG_RAB, comm));
        else
            TS_TRY(ts_p2p_send(buf, bytes, rank - 1, TS_TAG_RAB, comm));
    }
    return 0;
}
