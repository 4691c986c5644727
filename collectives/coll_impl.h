/* Private to collectives/: the communicator object, its channels, the
 * shared-memory staging area, the algorithm descriptor and the helpers that
 * algorithm files share (point-to-point with large counts, local reductions). */
#ifndef TS_COLLECTIVES_COLL_IMPL_H
#define TS_COLLECTIVES_COLL_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "src/core/error.h"

/* ---- topology of one communicator ---- */
typedef struct ts_topo {
    int rank, size;             /* in the channel's communicator */
    int local_rank, local_size; /* in this rank's (possibly faked) node */
    int node, nnodes;           /* node index (ordered by lowest rank) and count */
    int equal_nodes;            /* every node has local_size ranks */
    int min_local, max_local;   /* smallest and largest node */
    int real_local_size;        /* ranks sharing this machine (before faking nodes) */
    int real_local_rank;        /* this rank's place among them (selects its GPU) */
    MPI_Comm node_comm;         /* ranks of this node */
    MPI_Comm peer_comm;         /* ranks with the same local rank, one per node */
    MPI_Comm leader_comm;       /* local rank 0 of each node; MPI_COMM_NULL elsewhere */
} ts_topo;

/* Collective on comm: fills t (communicators are new; free with ts_topo_free). */
int ts_topo_create(MPI_Comm comm, ts_topo *t);
void ts_topo_free(ts_topo *t);

/* ---- shared-memory staging within a node ---- */
typedef struct ts_shm_sig {
    uint64_t count;
    int32_t kind, dtype, op, root;
    int32_t algo;     /* index of the algorithm in the registry */
    int32_t inplace_reg; /* 1: in place on a registered buffer */
    int64_t reg_off;  /* offset of the buffer in its registered window */
    int32_t reg_id;   /* which registered window */
    int32_t pad;
} ts_shm_sig;

typedef struct ts_shm_ctl {
    _Atomic uint64_t arrive; /* barrier epoch reached by this rank */
    char pad0[56];
    ts_shm_sig sig[2];       /* per round parity */
    char pad1[64];
} ts_shm_ctl;

typedef struct ts_shm {
    MPI_Win win;
    MPI_Comm comm;     /* the node communicator (borrowed), for MPI progress */
    int p, me;
    ts_shm_ctl **ctl;  /* control block of each local rank */
    char **data;       /* staging data of each local rank: two halves */
    size_t half;       /* bytes in one half */
    uint64_t epoch;    /* barriers passed */
    uint64_t round;    /* rounds started (selects half and sig slot) */
    int oversub;       /* more ranks than CPUs on this node: yield while waiting */
} ts_shm;

/* Collective on node_comm. machine_ranks: ranks sharing the CPUs of this
 * machine (waits yield when they outnumber the CPUs). */
int ts_shm_create(MPI_Comm node_comm, size_t half_bytes, int machine_ranks, ts_shm *s);
void ts_shm_free(ts_shm *s);
/* Node barrier on shared flags (all local ranks, same order). */
void ts_shm_barrier(ts_shm *s);
/* Starts a round: returns its parity (0/1). */
static inline int ts_shm_next_round(ts_shm *s) { return (int)(s->round++ & 1); }
/* Publishes sig for this round, barriers, and compares every rank's sig with
 * this one. All ranks see the same signatures, so all agree on the result. */
int ts_shm_exchange_sig(ts_shm *s, int parity, const ts_shm_sig *mine);

/* ---- registered buffers: shared windows owned by a ts_coll ---- */
typedef struct ts_regwin {
    MPI_Win win;
    char *base;      /* this rank's part */
    size_t bytes;
    char **peer;     /* every local rank's part */
    int id;
    struct ts_regwin *next;
} ts_regwin;

/* ---- one ordered stream of collectives ---- */
typedef struct ts_chan {
    MPI_Comm comm;
    ts_topo topo;
    ts_shm shm;        /* on topo.node_comm */
    struct ts_coll *owner;
    void *nccl;        /* GPU state (collectives/device_impl.h), created on first use */
    void *scratch;     /* algorithm scratch */
    size_t scratch_bytes;
} ts_chan;

int ts_chan_scratch(ts_chan *ch, size_t bytes, void **out);

/* ---- algorithms ---- */
typedef struct ts_coll_args {
    ts_coll_kind kind;
    const void *sendbuf; /* never TS_IN_PLACE here: set to recvbuf when in place */
    void *recvbuf;
    size_t count;
    ts_dtype dt;
    ts_op op;
    int root;
    int algo;            /* registry index */
    int device;          /* buffers are in GPU memory */
    int check;           /* TS_ALGO_CHECKS algorithms: validate sig at the first barrier */
    ts_shm_sig sig;      /* this rank's signature of the call */
    struct ts_regwin *reg; /* in place on a registered buffer (else NULL) */
} ts_coll_args;

enum {
    TS_ALGO_CHECKS = 1,  /* compares signatures across ranks itself */
    TS_ALGO_DEVICE = 2,  /* serves device buffers (nccl: only those; hierarchical: both) */
    TS_ALGO_RAW = 4,     /* the MPI library itself: keeps MPI's semantics, no extra checks */
};

typedef struct ts_coll_algo {
    const char *name;
    ts_coll_kind kind;
    unsigned flags;
    /* 1 if it can serve this call; else 0 with the reason in why */
    int (*supports)(const ts_chan *ch, const ts_coll_args *a, char *why, size_t n);
    int (*run)(ts_chan *ch, const ts_coll_args *a);
} ts_coll_algo;

int ts_coll_registry_count(void);
const ts_coll_algo *ts_coll_registry_get(int i);
int ts_coll_registry_find(ts_coll_kind kind, const char *name);

/* ---- the communicator object ---- */
typedef struct ts_tuning_entry {
    int kind, ranks, nodes;
    size_t max_bytes;
    int algo;
} ts_tuning_entry;

struct ts_coll {
    ts_coll_opts opts;
    int forced[TS_COLL_KIND_COUNT]; /* registry index or -1 */
    ts_chan main;
    ts_chan *async;                 /* channel of the progress thread */
    ts_tuning_entry *tuning;
    int ntuning;
    ts_regwin *reg;
    int next_reg_id;
    /* progress thread */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    struct ts_coll_req *head, *tail;
    int stop;
    double async_busy;              /* seconds spent running queued operations (under mu) */
    MPI_Comm base_comm;             /* dup of the user's comm */
};

/* A queued operation that is not one collective (collectives/compress.c):
 * runs on the progress thread with the async channel. */
typedef int (*ts_coll_task_fn)(ts_coll *c, ts_chan *ch, void *ctx);

struct ts_coll_req {
    ts_coll_args args;
    ts_coll_task_fn fn; /* NULL: the collective in args */
    void *ctx;
    ts_coll *c;
    _Atomic int done;
    int err;
    char msg[1024];
    struct ts_coll_req *next;
};

/* Queues fn(c, async channel, ctx) on the progress thread, in call order
 * with the nonblocking collectives. Collective in the same way. */
int ts_coll_enqueue_task(ts_coll *c, ts_coll_task_fn fn, void *ctx, ts_coll_req **req);

/* Runs one call on a channel: selection, validation, algorithm. */
int ts_coll_dispatch(ts_coll *c, ts_chan *ch, ts_coll_args *a, int algo_forced);

/* Finds a registered window holding [p, p+bytes); NULL if none. */
ts_regwin *ts_coll_find_reg(ts_coll *c, const void *p, size_t bytes);

/* ---- helpers shared by algorithm files ---- */
/* Local reductions: inout[i] = inout[i] op in[i] (AVG reduces as SUM). */
void ts_reduce_local(void *inout, const void *in, size_t n, ts_dtype dt, ts_op op);
/* out = op over ins[0..k) (out may alias any input); half types accumulate in float32. */
void ts_reduce_multi(void *out, const void *const *ins, int k, size_t n, ts_dtype dt, ts_op op);
/* For AVG: divides n elements by p (integer division for integers); else nothing. */
void ts_reduce_finish(void *buf, size_t n, ts_dtype dt, ts_op op, int p);

/* Point-to-point of any byte count (split into pieces below INT_MAX). */
int ts_p2p_sendrecv(const void *sbuf, size_t sbytes, int dst, void *rbuf, size_t rbytes, int src, int tag,
                    MPI_Comm comm);
int ts_p2p_send(const void *buf, size_t bytes, int dst, int tag, MPI_Comm comm);
int ts_p2p_recv(void *buf, size_t bytes, int src, int tag, MPI_Comm comm);
/* Nonblocking halves: up to *nreq requests are appended to reqs (the caller
 * provides room for ts_p2p_nreq(bytes)). */
size_t ts_p2p_nreq(size_t bytes);
int ts_p2p_isend(const void *buf, size_t bytes, int dst, int tag, MPI_Comm comm, MPI_Request *reqs, int *nreq);
int ts_p2p_irecv(void *buf, size_t bytes, int src, int tag, MPI_Comm comm, MPI_Request *reqs, int *nreq);
int ts_p2p_waitall(MPI_Request *reqs, int nreq);

/* Largest piece moved by one MPI call (bytes); tests may lower it. */
extern size_t ts_p2p_max_piece;
/* One step of a wait loop: pause, then yield, then short sleeps once the
 * wait is long (at once when oversub: ranks outnumber CPUs). */
void ts_coll_relax(unsigned spins, int oversub);
/* 1: waits yield the CPU (set when a node holds more ranks than CPUs). */
extern int ts_p2p_yield;

/* Tags used by the algorithms on a channel communicator. */
enum { TS_TAG_RING = 100, TS_TAG_RD, TS_TAG_RAB, TS_TAG_TREE, TS_TAG_HIER, TS_TAG_BCAST, TS_TAG_AG, TS_TAG_RS, TS_TAG_A2A };

/* Balanced split of count items over p: the first count % p parts get one
 * more. Local. */
void ts_split_block(size_t count, int p, int r, size_t *offset, size_t *len);

/* A local copy that may be large. */
void ts_coll_copy(void *dst, const void *src, size_t bytes);

/* Algorithm entry points (one file each). */
int ts_allreduce_ring(ts_chan *ch, const ts_coll_args *a);
int ts_allreduce_recursive_doubling(ts_chan *ch, const ts_coll_args *a);
int ts_allreduce_rabenseifner(ts_chan *ch, const ts_coll_args *a);
int ts_allreduce_tree(ts_chan *ch, const ts_coll_args *a);
int ts_allreduce_shm(ts_chan *ch, const ts_coll_args *a);
int ts_allreduce_hierarchical(ts_chan *ch, const ts_coll_args *a);
int ts_allreduce_mpi(ts_chan *ch, const ts_coll_args *a);
int ts_allreduce_nccl(ts_chan *ch, const ts_coll_args *a);
int ts_allreduce_hierarchical_nccl(ts_chan *ch, const ts_coll_args *a); /* hierarchical's GPU half */
int ts_reduce_scatter_ring(ts_chan *ch, const ts_coll_args *a);
int ts_reduce_scatter_shm(ts_chan *ch, const ts_coll_args *a);
int ts_reduce_scatter_mpi(ts_chan *ch, const ts_coll_args *a);
int ts_allgather_ring(ts_chan *ch, const ts_coll_args *a);
int ts_allgather_shm(ts_chan *ch, const ts_coll_args *a);
int ts_allgather_mpi(ts_chan *ch, const ts_coll_args *a);
int ts_bcast_binomial(ts_chan *ch, const ts_coll_args *a);
int ts_bcast_shm(ts_chan *ch, const ts_coll_args *a);
int ts_bcast_mpi(ts_chan *ch, const ts_coll_args *a);

/* Ring reduce-scatter over an arbitrary communicator on buf (in place):
 * block r (ts_coll_block over p) ends reduced on rank r. Shared by the ring
 * and hierarchical algorithms. */
int ts_ring_reduce_scatter(MPI_Comm comm, int rank, int p, void *buf, size_t count, ts_dtype dt, ts_op op,
                           void *tmp, size_t tmp_bytes, int tag);
int ts_ring_allgather(MPI_Comm comm, int rank, int p, void *buf, size_t count, ts_dtype dt, int tag);
size_t ts_ring_scratch_bytes(ts_dtype dt);

/* MPI datatype and op for the `mpi` algorithms (user op for half types). */
int ts_mpi_type_op(ts_dtype dt, ts_op op, MPI_Datatype *mt, MPI_Op *mo);

#define TS_SHM_MAX_LOCAL 256

/* ---- the shared-memory block engine (shm.c) ----
 * The buffer is cut into local_size blocks (ts_coll_block, cache-line
 * aligned); each round moves one piece of every block through the staging
 * halves. Modes: */
typedef enum {
    TS_SHM_ALLREDUCE,      /* everyone gets the reduction */
    TS_SHM_REDUCE_SCATTER, /* local rank l gets block l reduced */
    TS_SHM_ALLGATHER,      /* local rank l contributes block l; everyone gets all */
} ts_shm_mode;

/* Collective on the node. send may equal recv. If sig is not NULL it is
 * published with the first barrier and checked against every local rank
 * (mismatch = TS_ERR_MISMATCH on every local rank). AVG divides by the
 * node's rank count (pass SUM to get the plain sum). */
int ts_shm_run(ts_shm *s, ts_shm_mode mode, const void *send, void *recv, size_t count, ts_dtype dt, ts_op op,
               const ts_shm_sig *sig);
/* In-place allreduce / reduce-scatter / allgather on buffers inside
 * registered windows: peers' buffers (peer_base[q] + q's sig->reg_off) are
 * read and written directly. sig is required. Allreduce finishes AVG. */
int ts_shm_run_registered(ts_shm *s, ts_shm_mode mode, char *const *peer_base, size_t count, ts_dtype dt,
                          ts_op op, const ts_shm_sig *sig);
/* Broadcast from local rank root through staging. */
int ts_shm_bcast(ts_shm *s, void *buf, size_t bytes, int root, const ts_shm_sig *sig);

#endif
