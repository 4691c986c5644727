/* Shared-memory staging for node-local algorithms: one MPI-3 shared window
 * per channel, each rank owning a control block (barrier flag, call
 * signatures) and two staging halves used alternately by successive rounds.
 * The barrier is a flag per rank (epoch counters, release/acquire), so a
 * round costs one cache-line handoff, not an MPI call. */
#define _GNU_SOURCE
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

static int cpus_available(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    return 1;
}

int ts_shm_create(MPI_Comm node_comm, size_t half_bytes, int machine_ranks, ts_shm *s)
{
    int err = 0;
    MPI_Info info = MPI_INFO_NULL;
    memset(s, 0, sizeof *s);
    s->win = MPI_WIN_NULL;
    s->comm = node_comm;
    TS_MPI(MPI_Comm_rank(node_comm, &s->me));
    TS_MPI(MPI_Comm_size(node_comm, &s->p));
    s->half = (half_bytes + 4095) & ~(size_t)4095;
    size_t ctl_bytes = (sizeof(ts_shm_ctl) + 4095) & ~(size_t)4095;
    MPI_Aint bytes = (MPI_Aint)(ctl_bytes + 2 * s->half);
    void *base = NULL;
    TS_MPI(MPI_Info_create(&info));
    TS_MPI(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
    TS_MPI(MPI_Win_allocate_shared(bytes, 1, info, node_comm, &base, &s->win));
    s->ctl = calloc((size_t)s->p, sizeof *s->ctl);
    s->data = calloc((size_t)s->p, sizeof *s->data);
    if (!s->ctl || !s->data) TS_FAIL(TS_ERR_NOMEM, "shared-memory staging");
    for (int q = 0; q < s->p; q++) {
        MPI_Aint sz;
        int du;
        void *ptr;
        TS_MPI(MPI_Win_shared_query(s->win, q, &sz, &du, &ptr));
        s->ctl[q] = ptr;
        s->data[q] = (char *)ptr + ctl_bytes;
    }
    memset(base, 0, ctl_bytes);
    atomic_store(&s->ctl[s->me]->arrive, 0);
    const char *y = getenv("TESSERA_SHM_YIELD");
    s->oversub = y ? atoi(y) != 0 : (machine_ranks > s->p ? machine_ranks : s->p) > cpus_available();
    if (s->oversub) ts_p2p_yield = 1;
    TS_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win));
    /* every control block is initialised before anyone waits on it */
    TS_MPI(MPI_Barrier(node_comm));
cleanup:
    if (info != MPI_INFO_NULL) MPI_Info_free(&info);
    if (err) ts_shm_free(s);
    return err;
}

void ts_shm_free(ts_shm *s)
{
    if (s->win != MPI_WIN_NULL) {
        MPI_Win_unlock_all(s->win);
        MPI_Win_free(&s->win);
    }
    free(s->ctl);
    free(s->data);
    s->ctl = NULL;
    s->data = NULL;
}

/* While waiting, MPI's progress engine is poked now and then: a peer may
 * still be waiting for this rank to acknowledge an earlier point-to-point
 * transfer (rendezvous), and MPI only does that inside MPI calls. */
static void poke_mpi(MPI_Comm comm)
{
    int flag;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, MPI_STATUS_IGNORE);
}

void ts_shm_barrier(ts_shm *s)
{
    uint64_t e = ++s->epoch;
    atomic_store_explicit(&s->ctl[s->me]->arrive, e, memory_order_release);
    for (int i = 1; i < s->p; i++) {
        int q = (s->me + i) % s->p;
        unsigned spins = 0;
        while (atomic_load_explicit(&s->ctl[q]->arrive, memory_order_acquire) < e) {
            ++spins;
            if ((spins & 255) == 0) poke_mpi(s->comm);
            ts_coll_relax(s->oversub ? spins + 4000 : spins, s->oversub);
        }
    }
}

int ts_shm_exchange_sig(ts_shm *s, int parity, const ts_shm_sig *mine)
{
    s->ctl[s->me]->sig[parity] = *mine;
    ts_shm_barrier(s);
    for (int q = 0; q < s->p; q++) {
        const ts_shm_sig *o = &s->ctl[q]->sig[parity];
        if (o->count != mine->count || o->dtype != mine->dtype || o->op != mine->op || o->kind != mine->kind ||
            o->root != mine->root || o->algo != mine->algo || o->inplace_reg != mine->inplace_reg ||
            o->reg_id != mine->reg_id) {
            /* name the first pair that differs; every rank finds the same pair */
            const ts_shm_sig *a = &s->ctl[0]->sig[parity];
            int qq = 1;
            for (; qq < s->p; qq++) {
                const ts_shm_sig *b = &s->ctl[qq]->sig[parity];
                if (b->count != a->count || b->dtype != a->dtype || b->op != a->op || b->kind != a->kind ||
                    b->root != a->root || b->algo != a->algo || b->inplace_reg != a->inplace_reg ||
                    b->reg_id != a->reg_id)
                    break;
            }
            const ts_shm_sig *b = &s->ctl[qq < s->p ? qq : q]->sig[parity];
            if (a->inplace_reg != b->inplace_reg || a->reg_id != b->reg_id)
                return TS_ERR(TS_ERR_MISMATCH, "an in-place collective on a registered buffer must use a buffer "
                                               "of the same ts_coll_buffer_alloc call on every rank (local ranks 0 "
                                               "and %d differ)", qq < s->p ? qq : q);
            return TS_ERR(TS_ERR_MISMATCH,
                          "collective arguments differ between ranks of a node: local rank 0 has %s count %llu "
                          "dtype %s op %s, local rank %d has %s count %llu dtype %s op %s",
                          ts_coll_kind_name((ts_coll_kind)a->kind), (unsigned long long)a->count,
                          ts_dtype_name((ts_dtype)a->dtype), ts_coll_op_name((ts_op)a->op), qq < s->p ? qq : q,
                          ts_coll_kind_name((ts_coll_kind)b->kind), (unsigned long long)b->count,
                          ts_dtype_name((ts_dtype)b->dtype), ts_coll_op_name((ts_op)b->op));
        }
    }
    return 0;
}

/* ---------------- the block engine ---------------- */

/* Rounds when a small call is served by one copy-in of the whole buffer. */
static size_t small_limit(const ts_shm *s, ts_dtype dt)
{
    size_t lim = s->p <= 2 ? (size_t)4 << 10 : (size_t)2 << 10; /* measured: blocks win above */
    if (lim > s->half) lim = s->half;
    return lim / ts_dtype_size(dt);
}

/* One barrier that also checks the signature when one is given. */
static int round_barrier(ts_shm *s, int parity, const ts_shm_sig *sig)
{
    if (sig) return ts_shm_exchange_sig(s, parity, sig);
    ts_shm_barrier(s);
    return 0;
}

int ts_shm_run(ts_shm *s, ts_shm_mode mode, const void *send, void *recv, size_t count, ts_dtype dt, ts_op op,
               const ts_shm_sig *sig)
{
    const int p = s->p, me = s->me;
    const size_t es = ts_dtype_size(dt);
    const char *in = send ? send : recv;
    char *out = recv;
    const void *ins[TS_SHM_MAX_LOCAL];
    if (p > TS_SHM_MAX_LOCAL) return TS_ERR(TS_ERR_UNSUPPORTED, "more than %d ranks on a node", TS_SHM_MAX_LOCAL);

    /* small allreduce: everyone stages everything, everyone reduces all */
    if (mode == TS_SHM_ALLREDUCE && count <= small_limit(s, dt)) {
        int par = ts_shm_next_round(s);
        memcpy(s->data[me] + (size_t)par * s->half, in, count * es);
        TS_TRY(round_barrier(s, par, sig));
        for (int q = 0; q < p; q++) ins[q] = s->data[q] + (size_t)par * s->half;
        ts_reduce_multi(out, ins, p, count, dt, op);
        ts_reduce_finish(out, count, dt, op, p);
        return 0;
    }

    /* blocks of the buffer and the piece size per round */
    size_t boff[TS_SHM_MAX_LOCAL], blen[TS_SHM_MAX_LOCAL], maxb = 0;
    for (int q = 0; q < p; q++) {
        ts_coll_block(count, dt, p, q, &boff[q], &blen[q]);
        if (blen[q] > maxb) maxb = blen[q];
    }
    size_t piece = (s->half / (size_t)p) / 64 * 64 / es; /* elements per block per round */
    if (piece == 0) return TS_ERR(TS_ERR_INTERNAL, "shared staging too small for %d ranks", p);
    size_t rounds = maxb ? (maxb + piece - 1) / piece : 0;
    if (rounds == 0) { /* nothing to move: still agree on the call */
        int par = ts_shm_next_round(s);
        return round_barrier(s, par, sig);
    }
    for (size_t i = 0; i < rounds; i++) {
        int par = ts_shm_next_round(s);
        char *mine = s->data[me] + (size_t)par * s->half;
        size_t po = i * piece;
        /* stage: pieces of the other blocks (reduce) or of my block (gather) */
        if (mode == TS_SHM_ALLGATHER) {
            if (po < blen[me]) {
                size_t n = blen[me] - po < piece ? blen[me] - po : piece;
                memcpy(mine + (size_t)me * piece * es, in + (boff[me] + po) * es, n * es);
            }
        } else {
            for (int q = 0; q < p; q++) {
                if (q == me || po >= blen[q]) continue;
                size_t n = blen[q] - po < piece ? blen[q] - po : piece;
                memcpy(mine + (size_t)q * piece * es, in + (boff[q] + po) * es, n * es);
            }
        }
        TS_TRY(round_barrier(s, par, i == 0 ? sig : NULL));
        if (mode != TS_SHM_ALLGATHER && po < blen[me]) {
            size_t n = blen[me] - po < piece ? blen[me] - po : piece;
            for (int q = 0; q < p; q++)
                ins[q] = q == me ? (const void *)(in + (boff[me] + po) * es)
                                 : (const void *)(s->data[q] + (size_t)par * s->half + (size_t)me * piece * es);
            char *dst = out + (boff[me] + po) * es;
            ts_reduce_multi(dst, ins, p, n, dt, op);
            ts_reduce_finish(dst, n, dt, op, p);
            if (mode == TS_SHM_ALLREDUCE) memcpy(mine + (size_t)me * piece * es, dst, n * es);
        }
        if (mode == TS_SHM_REDUCE_SCATTER) continue;
        if (mode == TS_SHM_ALLREDUCE) ts_shm_barrier(s);
        for (int q = 0; q < p; q++) {
            if (po >= blen[q]) continue;
            if (q == me && (mode == TS_SHM_ALLREDUCE || in == out)) continue;
            size_t n = blen[q] - po < piece ? blen[q] - po : piece;
            memcpy(out + (boff[q] + po) * es, s->data[q] + (size_t)par * s->half + (size_t)q * piece * es, n * es);
        }
    }
    return 0;
}

int ts_shm_run_registered(ts_shm *s, ts_shm_mode mode, char *const *peer_base, size_t count, ts_dtype dt,
                          ts_op op, const ts_shm_sig *sig)
{
    const int p = s->p, me = s->me;
    const size_t es = ts_dtype_size(dt);
    const void *ins[TS_SHM_MAX_LOCAL];
    char *peer_bufs[TS_SHM_MAX_LOCAL];
    if (p > TS_SHM_MAX_LOCAL) return TS_ERR(TS_ERR_UNSUPPORTED, "more than %d ranks on a node", TS_SHM_MAX_LOCAL);
    int par = ts_shm_next_round(s);
    TS_TRY(ts_shm_exchange_sig(s, par, sig)); /* every input is ready; offsets are known */
    for (int q = 0; q < p; q++) peer_bufs[q] = peer_base[q] + s->ctl[q]->sig[par].reg_off;
    size_t off, len;
    ts_coll_block(count, dt, p, me, &off, &len);
    if (mode == TS_SHM_ALLGATHER) {
        for (int q = 0; q < p; q++) {
            if (q == me) continue;
            size_t qo, ql;
            ts_coll_block(count, dt, p, q, &qo, &ql);
            memcpy(peer_bufs[me] + qo * es, peer_bufs[q] + qo * es, ql * es);
        }
    } else {
        /* reduce my block in cache-sized pieces, then fan the piece out */
        const size_t step = ((size_t)32 << 10) / es;
        for (size_t o = 0; o < len; o += step) {
            size_t n = len - o < step ? len - o : step;
            for (int q = 0; q < p; q++) ins[q] = peer_bufs[q] + (off + o) * es;
            char *dst = peer_bufs[me] + (off + o) * es;
            ts_reduce_multi(dst, ins, p, n, dt, op);
            if (mode == TS_SHM_ALLREDUCE) {
                if (op == TS_OP_AVG) ts_reduce_finish(dst, n, dt, op, p);
                for (int q = 0; q < p; q++)
                    if (q != me) memcpy(peer_bufs[q] + (off + o) * es, dst, n * es);
            }
        }
    }
    ts_shm_barrier(s); /* every output is written */
    return 0;
}

int ts_shm_bcast(ts_shm *s, void *buf, size_t bytes, int root, const ts_shm_sig *sig)
{
    size_t rounds = bytes ? (bytes + s->half - 1) / s->half : 0;
    if (rounds == 0) {
        int par = ts_shm_next_round(s);
        return round_barrier(s, par, sig);
    }
    for (size_t i = 0; i < rounds; i++) {
        int par = ts_shm_next_round(s);
        size_t o = i * s->half, n = bytes - o < s->half ? bytes - o : s->half;
        if (s->me == root) memcpy(s->data[root] + (size_t)par * s->half, (char *)buf + o, n);
        TS_TRY(round_barrier(s, par, i == 0 ? sig : NULL));
        if (s->me != root) memcpy((char *)buf + o, s->data[root] + (size_t)par * s->half, n);
    }
    return 0;
}
