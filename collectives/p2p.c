/* Point-to-point helpers for the algorithms: any byte count, cut into
 * pieces that fit MPI's int counts (ts_coll_pieces, unit-tested), and the
 * waits that yield the CPU when ranks outnumber cores. Bytes only: no
 * dtypes, no reductions, no choice of algorithm here. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#include <limits.h>
#include <stdlib.h>

#include <sched.h>
#include <time.h>

size_t ts_p2p_max_piece = (size_t)1 << 30;
int ts_p2p_yield = 0;

void ts_coll_relax(unsigned spins, int oversub)
{
    if (!oversub && spins < 4000) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else if (spins < 4100) {
        sched_yield();
    } else { /* still waiting: sleep a little so the awaited rank surely runs */
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

/* Waits for reqs: MPI_Waitall, or, with more ranks than CPUs, a test loop
 * that yields the CPU so the rank we wait for can run (MPI's own wait spins). */
static int wait_yield(MPI_Request *reqs, int n, MPI_Status *st, int yield)
{
    if (n == 0) return MPI_SUCCESS;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow" /* GCC 12 misreads MPI_STATUSES_IGNORE */
    if (!yield) return MPI_Waitall(n, reqs, st ? st : MPI_STATUSES_IGNORE);
    for (unsigned spins = 0;; spins++) {
        int done = 0, rc = MPI_Testall(n, reqs, &done, st ? st : MPI_STATUSES_IGNORE);
#pragma GCC diagnostic pop
        if (rc != MPI_SUCCESS || done) return rc;
        ts_coll_relax(spins, 1);
    }
}

static int wait_reqs(MPI_Request *reqs, int n, MPI_Status *st) { return wait_yield(reqs, n, st, ts_p2p_yield); }

int ts_coll_waitall_mpi(MPI_Request *reqs, int n, MPI_Status *st, int yield)
{
    return wait_yield(reqs, n, st, yield);
}

int ts_coll_oversubscribed(int local_size, int threads)
{
    const char *y = getenv("TESSERA_YIELD");
    if (y && *y) return atoi(y) != 0;
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    if (local_size < 1) local_size = 1;
    if (threads < 1) threads = 1;
    return (long)local_size * threads > cpus;
}

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
        MPI_Request rq[2];
        MPI_Status st[2];
        int k = 0, rk = -1;
        ts_coll_pieces(sbytes, ts_p2p_max_piece, i, &so, &sl);
        ts_coll_pieces(rbytes, ts_p2p_max_piece, i, &ro, &rl);
        if (i < nr) {
            TS_MPI_TRY(MPI_Irecv((char *)rbuf + ro, (int)rl, MPI_BYTE, src, tag, comm, &rq[k]));
            rk = k++;
        }
        if (i < ns) TS_MPI_TRY(MPI_Isend((const char *)sbuf + so, (int)sl, MPI_BYTE, dst, tag, comm, &rq[k++]));
        int rc = wait_reqs(rq, k, st);
        if (rc != MPI_SUCCESS) return ts_err_mpi(rc, __FILE__, __LINE__, "MPI_Sendrecv");
        if (rk >= 0) {
            int got;
            MPI_Get_count(&st[rk], MPI_BYTE, &got);
            if ((size_t)got != rl)
                return TS_ERR(TS_ERR_MISMATCH, "rank %d sent %d bytes where %zu were expected (counts differ between "
                                               "ranks?)", src, got, rl);
        }
    }
    return 0;
}

int ts_p2p_send(const void *buf, size_t bytes, int dst, int tag, MPI_Comm comm)
{
    size_t n = ts_coll_pieces(bytes, ts_p2p_max_piece, 0, NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        size_t o, l;
        ts_coll_pieces(bytes, ts_p2p_max_piece, i, &o, &l);
        MPI_Request rq;
        TS_MPI_TRY(MPI_Isend((const char *)buf + o, (int)l, MPI_BYTE, dst, tag, comm, &rq));
        TS_MPI_TRY(wait_reqs(&rq, 1, NULL));
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
        MPI_Request rq;
        TS_MPI_TRY(MPI_Irecv((char *)buf + o, (int)l, MPI_BYTE, src, tag, comm, &rq));
        TS_MPI_TRY(wait_reqs(&rq, 1, &st));
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
    TS_MPI_TRY(wait_reqs(reqs, nreq, NULL));
    return 0;
}
