/* tessera collectives: allreduce, reduce-scatter, allgather and broadcast
 * with topology-aware algorithms (one file each), chosen per call by a forced
 * name, a measured tuning table or built-in rules. Usable alone: depends on
 * MPI and src/core only.
 *
 *   ts_coll *c;  ts_coll_create(comm, NULL, &c);           // collective
 *   ts_coll_allreduce(c, TS_IN_PLACE, buf, n, TS_FLOAT32, TS_OP_SUM);
 *   ts_coll_destroy(&c);                                     // collective
 *
 * Every call is collective over the communicator given to ts_coll_create and
 * must be made in the same order on every rank. Counts, dtypes and ops are
 * checked across ranks (unless validation is off): a mismatch fails on every
 * rank instead of hanging. */
#ifndef TS_COLLECTIVES_COLL_H
#define TS_COLLECTIVES_COLL_H

#include <mpi.h>
#include <stddef.h>

#include "src/core/config.h"
#include "src/core/dtype.h"

typedef enum { TS_OP_SUM = 0, TS_OP_AVG, TS_OP_MAX, TS_OP_MIN, TS_OP_COUNT } ts_op;

typedef enum {
    TS_COLL_ALLREDUCE = 0,
    TS_COLL_REDUCE_SCATTER,
    TS_COLL_ALLGATHER,
    TS_COLL_BCAST,
    TS_COLL_KIND_COUNT
} ts_coll_kind;

/* sendbuf value meaning "in place: the input is in recvbuf" */
#define TS_IN_PLACE ((const void *)0)

typedef struct ts_coll ts_coll;
typedef struct ts_coll_req ts_coll_req;

typedef struct ts_coll_opts {
    const char *force[TS_COLL_KIND_COUNT]; /* algorithm per kind; NULL = env, then auto */
    const char *tuning_file;               /* tuning table JSON; NULL = env TESSERA_COLL_TUNING */
    int validate;                          /* check counts/dtype/op across ranks: 1 (default) or 0 */
    size_t shm_chunk;                      /* bytes per shared-memory staging chunk (0 = default) */
} ts_coll_opts;

/* Local. Default options (no forced algorithm, validation on). */
void ts_coll_opts_default(ts_coll_opts *o);

/* Config keys of the collectives ([coll] section) and reading them. */
extern const ts_cfg_key ts_coll_config_keys[];
int ts_coll_opts_from_config(const ts_config *cfg, ts_coll_opts *o);

/* Collective on comm. Duplicates comm, discovers the topology (node-local
 * ranks by MPI_Comm_split_type; TESSERA_RANKS_PER_NODE=k fakes nodes of k
 * consecutive ranks), allocates shared-memory staging, loads the tuning
 * table. Forced names are checked here (unknown name = error on every rank). */
int ts_coll_create(MPI_Comm comm, const ts_coll_opts *opts, ts_coll **out);
/* Collective. Waits for queued operations, frees everything; NULL is fine. */
int ts_coll_destroy(ts_coll **c);

/* Local queries. */
int ts_coll_size(const ts_coll *c);
int ts_coll_rank(const ts_coll *c);
int ts_coll_nodes(const ts_coll *c);
int ts_coll_local_size(const ts_coll *c);
int ts_coll_local_rank(const ts_coll *c);
int ts_coll_node_index(const ts_coll *c);
/* 1 when every node holds the same number of ranks */
int ts_coll_equal_nodes(const ts_coll *c);
/* Collective on comm: the node of this rank (nodes numbered by their lowest
 * rank, TESSERA_RANKS_PER_NODE honoured as by ts_coll_create), the number
 * of nodes, and this rank's place on its node. No ts_coll needed. */
int ts_coll_node_info(MPI_Comm comm, int *node, int *nnodes, int *local_rank, int *local_size);

/* Collective. recvbuf = op over ranks of sendbuf (or of recvbuf when sendbuf
 * is TS_IN_PLACE). count may be 0 or above INT_MAX. AVG divides the sum by
 * the number of ranks (integer division for integer types). Half types
 * (bfloat16, float16) are reduced in float32 within a rank. */
int ts_coll_allreduce(ts_coll *c, const void *sendbuf, void *recvbuf, size_t count, ts_dtype dt, ts_op op);

/* Block r of a buffer of count elements of dt split over p ranks, as used
 * by reduce-scatter and allgather: balanced in whole 64-byte cache lines
 * (the last blocks may be shorter or empty). Local. */
void ts_coll_block(size_t count, ts_dtype dt, int p, int r, size_t *offset, size_t *len);

/* Collective. Reduces count elements over ranks; rank r receives block r
 * (ts_coll_block) of the result at the same offset of recvbuf (a full-size
 * buffer; the rest of it is scratch). sendbuf TS_IN_PLACE: input in recvbuf. */
int ts_coll_reduce_scatter(ts_coll *c, const void *sendbuf, void *recvbuf, size_t count, ts_dtype dt, ts_op op);
/* Collective. buf holds count elements; rank r contributes block r; on
 * return every rank holds all blocks. */
int ts_coll_allgather(ts_coll *c, void *buf, size_t count, ts_dtype dt);
/* Collective. Copies count elements of root's buf to every rank's buf. */
int ts_coll_bcast(ts_coll *c, void *buf, size_t count, ts_dtype dt, int root);

/* Collective. As above with a named algorithm ("auto" = the automatic choice);
 * an unknown name or a case the algorithm cannot serve fails on every rank. */
int ts_coll_run(ts_coll *c, ts_coll_kind kind, const char *algo, const void *sendbuf, void *recvbuf,
                size_t count, ts_dtype dt, ts_op op, int root);

/* Nonblocking allreduce: queued to this communicator's progress thread,
 * which runs queued operations in order while the caller computes. Buffers
 * must stay untouched until the request completes. Needs MPI initialised
 * with MPI_THREAD_MULTIPLE. Collective (same order on every rank). */
int ts_coll_iallreduce(ts_coll *c, const void *sendbuf, void *recvbuf, size_t count, ts_dtype dt, ts_op op,
                       ts_coll_req **req);
int ts_coll_ireduce_scatter(ts_coll *c, const void *sendbuf, void *recvbuf, size_t count, ts_dtype dt,
                            ts_op op, ts_coll_req **req);
int ts_coll_iallgather(ts_coll *c, void *buf, size_t count, ts_dtype dt, ts_coll_req **req);
/* Local. *done = 1 once finished; returns the operation's error if it failed. */
int ts_coll_test(ts_coll_req *req, int *done);
/* Local. Waits, frees the request, sets *req = NULL, returns the operation's result. */
int ts_coll_wait(ts_coll_req **req);
/* Local. Seconds the progress thread has spent running operations so far. */
double ts_coll_async_seconds(ts_coll *c);

/* Local. 1 when this node runs more threads than this process may use
 * CPUs: local_size ranks on the node x threads each > the CPUs of the
 * affinity mask (TESSERA_YIELD=0 or 1 overrides). Waiting ranks then
 * should yield their CPU to the rank they wait for. */
int ts_coll_oversubscribed(int local_size, int threads);
/* Local. Waits for n plain MPI requests (statuses into st, which may be
 * NULL): MPI_Waitall, or with yield a test loop that yields the CPU while
 * it waits (MPI's own wait spins and, when ranks outnumber CPUs, keeps the
 * awaited rank off the CPU). */
int ts_coll_waitall_mpi(MPI_Request *reqs, int n, MPI_Status *st, int yield);

/* Collective over the ranks of a node. Buffers in a shared window: node
 * peers read them in place, so an in-place allreduce on such a buffer moves
 * no data through staging copies. Free with ts_coll_buffer_free (collective). */
int ts_coll_buffer_alloc(ts_coll *c, size_t bytes, void **buf);
int ts_coll_buffer_free(ts_coll *c, void **buf);

/* Names. Local. */
const char *ts_coll_op_name(ts_op op);
int ts_coll_op_parse(const char *s, ts_op *op);
const char *ts_coll_kind_name(ts_coll_kind k);
int ts_coll_kind_parse(const char *s, ts_coll_kind *k);

/* Local. 1 if the named algorithm can serve such a call on this
 * communicator (host buffers); else 0 with the reason in why. */
int ts_coll_can_run(ts_coll *c, ts_coll_kind kind, const char *algo, size_t count, ts_dtype dt, ts_op op, char *why,
                    size_t n);

/* Local. Lists registered algorithms of a kind (NULL-terminated names). */
const char *const *ts_coll_algorithms(ts_coll_kind kind);
/* Local. The algorithm auto would use for this call and why
 * ("forced", "tuning", "rule"). */
const char *ts_coll_choice(ts_coll *c, ts_coll_kind kind, size_t count, ts_dtype dt, ts_op op, const char **why);

/* Local. Writes a tuning table: for each size bucket the fastest algorithm,
 * for a communicator of this shape. entries[i] covers messages up to
 * max_bytes[i] (ascending). */
int ts_coll_tuning_write(const char *path, ts_coll_kind kind, int ranks, int nodes, const size_t *max_bytes,
                         const char *const *algos, int n);
/* Local. Reloads the tuning table into c (file as in opts). */
int ts_coll_tuning_load(ts_coll *c, const char *path);

/* Local. Pieces for messages above INT_MAX elements: piece i of a message of
 * count elements cut into pieces of at most max elements. Returns the number
 * of pieces. */
size_t ts_coll_pieces(size_t count, size_t max, size_t i, size_t *offset, size_t *len);

#endif
