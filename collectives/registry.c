/* The algorithm registry and per-call dispatch: which algorithms exist for
 * each collective, what each can serve, how one is chosen (forced name,
 * tuning table, built-in rules) and the cross-rank check of counts, dtype
 * and op that turns a mismatch into an error on every rank instead of a hang. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"
#include "collectives/device.h"

#include <string.h>

static int sup_host(const ts_chan *ch, const ts_coll_args *a, char *why, size_t n)
{
    (void)ch;
    if (a->device) {
        snprintf(why, n, "buffers are in GPU memory and this algorithm works on host memory");
        return 0;
    }
    return 1;
}

static int sup_node(const ts_chan *ch, const ts_coll_args *a, char *why, size_t n)
{
    if (!sup_host(ch, a, why, n)) return 0;
    if (ch->topo.nnodes > 1) {
        snprintf(why, n, "it works within one node and this communicator spans %d nodes", ch->topo.nnodes);
        return 0;
    }
    if (ch->topo.local_size > TS_SHM_MAX_LOCAL) {
        snprintf(why, n, "more than %d ranks on a node", TS_SHM_MAX_LOCAL);
        return 0;
    }
    return 1;
}

/* host buffers through shared memory; in CUDA builds GPU buffers too, with
 * NCCL inside the node (one GPU per rank of a node: checked when its NCCL
 * communicator is made, the same on every rank) */
static int sup_hier(const ts_chan *ch, const ts_coll_args *a, char *why, size_t n)
{
    if (!ch->topo.equal_nodes) {
        snprintf(why, n, "it needs the same number of ranks on every node (nodes here hold %d to %d ranks)",
                 ch->topo.min_local, ch->topo.max_local);
        return 0;
    }
    if (!a->device && ch->topo.local_size > TS_SHM_MAX_LOCAL) {
        snprintf(why, n, "more than %d ranks on a node", TS_SHM_MAX_LOCAL);
        return 0;
    }
    return 1;
}

#ifdef TS_HAVE_CUDA
#define HIER_FLAGS TS_ALGO_DEVICE
/* GPU buffers only (a count of zero touches no memory); one GPU per rank:
 * checked when the NCCL communicator is made, the same on every rank */
static int sup_device(const ts_chan *ch, const ts_coll_args *a, char *why, size_t n)
{
    (void)ch;
    if (!a->device && a->count) {
        snprintf(why, n, "it needs buffers in GPU memory");
        return 0;
    }
    return 1;
}
#else
#define HIER_FLAGS 0
#endif

static const ts_coll_algo registry[] = {
    {"ring", TS_COLL_ALLREDUCE, 0, sup_host, ts_allreduce_ring},
    {"recursive_doubling", TS_COLL_ALLREDUCE, 0, sup_host, ts_allreduce_recursive_doubling},
    {"rabenseifner", TS_COLL_ALLREDUCE, 0, sup_host, ts_allreduce_rabenseifner},
    {"tree", TS_COLL_ALLREDUCE, 0, sup_host, ts_allreduce_tree},
    {"shm", TS_COLL_ALLREDUCE, TS_ALGO_CHECKS, sup_node, ts_allreduce_shm},
    {"hierarchical", TS_COLL_ALLREDUCE, HIER_FLAGS, sup_hier, ts_allreduce_hierarchical},
    {"mpi", TS_COLL_ALLREDUCE, TS_ALGO_RAW, sup_host, ts_allreduce_mpi},
#ifdef TS_HAVE_CUDA
    {"nccl", TS_COLL_ALLREDUCE, TS_ALGO_DEVICE, sup_device, ts_allreduce_nccl},
#endif
    {"ring", TS_COLL_REDUCE_SCATTER, 0, sup_host, ts_reduce_scatter_ring},
    {"shm", TS_COLL_REDUCE_SCATTER, TS_ALGO_CHECKS, sup_node, ts_reduce_scatter_shm},
    {"mpi", TS_COLL_REDUCE_SCATTER, TS_ALGO_RAW, sup_host, ts_reduce_scatter_mpi},
    {"ring", TS_COLL_ALLGATHER, 0, sup_host, ts_allgather_ring},
    {"shm", TS_COLL_ALLGATHER, TS_ALGO_CHECKS, sup_node, ts_allgather_shm},
    {"mpi", TS_COLL_ALLGATHER, TS_ALGO_RAW, sup_host, ts_allgather_mpi},
    {"binomial", TS_COLL_BCAST, 0, sup_host, ts_bcast_binomial},
    {"shm", TS_COLL_BCAST, TS_ALGO_CHECKS, sup_node, ts_bcast_shm},
    {"mpi", TS_COLL_BCAST, TS_ALGO_RAW, sup_host, ts_bcast_mpi},
};
#define NALGO ((int)(sizeof registry / sizeof registry[0]))

int ts_coll_registry_count(void) { return NALGO; }
const ts_coll_algo *ts_coll_registry_get(int i) { return i >= 0 && i < NALGO ? &registry[i] : NULL; }

int ts_coll_registry_find(ts_coll_kind kind, const char *name)
{
    for (int i = 0; i < NALGO; i++)
        if (registry[i].kind == kind && !strcmp(registry[i].name, name)) return i;
    return -1;
}

const char *const *ts_coll_algorithms(ts_coll_kind kind)
{
    static const char *lists[TS_COLL_KIND_COUNT][NALGO + 1];
    static int filled;
    if (!filled) { /* the table is constant: filling twice writes the same values */
        for (int k = 0; k < TS_COLL_KIND_COUNT; k++) {
            int n = 0;
            for (int i = 0; i < NALGO; i++)
                if (registry[i].kind == (ts_coll_kind)k) lists[k][n++] = registry[i].name;
            lists[k][n] = NULL;
        }
        filled = 1;
    }
    return (unsigned)kind < TS_COLL_KIND_COUNT ? lists[kind] : NULL;
}

/* Built-in rules, used when nothing is forced and no tuning entry applies.
 * GPU buffers: hierarchical across nodes (NCCL inside each, host-staged MPI
 * between them), nccl within one node or when nodes differ in size. */
static int rule_choice(const ts_chan *ch, ts_coll_kind kind, size_t bytes, int device)
{
    const ts_topo *t = &ch->topo;
    if (device) {
        if (kind == TS_COLL_ALLREDUCE && t->nnodes > 1 && t->equal_nodes)
            return ts_coll_registry_find(kind, "hierarchical");
        return ts_coll_registry_find(kind, "nccl");
    }
    int single = t->nnodes == 1 && t->local_size <= TS_SHM_MAX_LOCAL;
    switch (kind) {
    case TS_COLL_ALLREDUCE:
        if (single) return ts_coll_registry_find(kind, "shm");
        if (t->equal_nodes && t->local_size > 1 && bytes >= ((size_t)64 << 10))
            return ts_coll_registry_find(kind, "hierarchical");
        if (bytes < ((size_t)64 << 10)) return ts_coll_registry_find(kind, "recursive_doubling");
        return ts_coll_registry_find(kind, bytes < ((size_t)8 << 20) ? "rabenseifner" : "ring");
    case TS_COLL_REDUCE_SCATTER:
        return ts_coll_registry_find(kind, single ? "shm" : "ring");
    case TS_COLL_ALLGATHER:
        return ts_coll_registry_find(kind, single ? "shm" : "ring");
    case TS_COLL_BCAST:
        return ts_coll_registry_find(kind, single ? "shm" : "binomial");
    default:
        return -1;
    }
}

/* The tuning table's choice for this shape and size, or -1. */
static int tuning_choice(const ts_coll *c, const ts_chan *ch, ts_coll_kind kind, size_t bytes)
{
    int best = -1;
    size_t best_max = 0;
    int largest = -1;
    size_t largest_max = 0;
    for (int i = 0; i < c->ntuning; i++) {
        const ts_tuning_entry *e = &c->tuning[i];
        if (e->kind != (int)kind || e->ranks != ch->topo.size || e->nodes != ch->topo.nnodes) continue;
        if (e->max_bytes >= bytes && (best < 0 || e->max_bytes < best_max)) {
            best = e->algo;
            best_max = e->max_bytes;
        }
        if (largest < 0 || e->max_bytes > largest_max) {
            largest = e->algo;
            largest_max = e->max_bytes;
        }
    }
    return best >= 0 ? best : largest;
}

static int choose(const ts_coll *c, const ts_chan *ch, const ts_coll_args *a, const char **why)
{
    size_t bytes = a->count * ts_dtype_size(a->dt);
    int i = tuning_choice(c, ch, a->kind, bytes);
    if (i >= 0) {
        char w[256];
        if (registry[i].supports(ch, a, w, sizeof w)) {
            *why = "tuning";
            return i;
        }
    }
    *why = "rule";
    return rule_choice(ch, a->kind, bytes, a->device);
}

static const char *choice(ts_coll *c, ts_coll_kind kind, size_t count, ts_dtype dt, ts_op op, int device,
                          const char **why)
{
    ts_coll_args a = {.kind = kind, .count = count, .dt = dt, .op = op, .device = device};
    const char *w = "forced";
    int i = c->forced[kind];
    if (i < 0) i = choose(c, &c->main, &a, &w);
    if (why) *why = w;
    return i >= 0 ? registry[i].name : "none";
}

const char *ts_coll_choice(ts_coll *c, ts_coll_kind kind, size_t count, ts_dtype dt, ts_op op, const char **why)
{
    return choice(c, kind, count, dt, op, 0, why);
}

const char *ts_coll_device_choice(ts_coll *c, ts_coll_kind kind, size_t count, ts_dtype dt, ts_op op,
                                  const char **why)
{
    return choice(c, kind, count, dt, op, 1, why);
}

static int reduces(ts_coll_kind k) { return k == TS_COLL_ALLREDUCE || k == TS_COLL_REDUCE_SCATTER; }

/* Cross-node check: min and max of each signature field over all ranks,
 * reduced with tessera's recursive doubling (its waits yield the CPU when
 * ranks outnumber cores, where MPI's own spin). */
static int check_sig_mpi(ts_chan *ch, const ts_shm_sig *sig)
{
    long long v[6] = {(long long)sig->count, sig->kind, sig->dtype, sig->op, sig->root, sig->algo}, mm[12];
    for (int i = 0; i < 6; i++) {
        mm[i] = v[i];
        mm[6 + i] = -v[i];
    }
    ts_coll_args a = {.kind = TS_COLL_ALLREDUCE, .sendbuf = mm, .recvbuf = mm, .count = 12, .dt = TS_INT64,
                      .op = TS_OP_MAX};
    TS_TRY(ts_allreduce_recursive_doubling(ch, &a));
    static const char *const field[6] = {"count", "collective", "dtype", "op", "root", "algorithm"};
    for (int i = 0; i < 6; i++)
        if (mm[i] != -mm[6 + i])
            return TS_ERR(TS_ERR_MISMATCH,
                          "collective arguments differ between ranks: %s ranges from %lld to %lld "
                          "(this rank: %s count %llu dtype %s op %s)",
                          field[i], -mm[6 + i], mm[i], ts_coll_kind_name((ts_coll_kind)sig->kind),
                          (unsigned long long)sig->count, ts_dtype_name((ts_dtype)sig->dtype),
                          ts_coll_op_name((ts_op)sig->op));
    return 0;
}

int ts_coll_dispatch(ts_coll *c, ts_chan *ch, ts_coll_args *a, int algo)
{
    const size_t es = ts_dtype_size(a->dt);
    int forced = algo >= 0;
    const char *why = "forced";
    if (!forced && c->forced[a->kind] >= 0) {
        algo = c->forced[a->kind];
        forced = 1;
    }
    /* argument checks: identical on every rank for identical arguments */
    if ((unsigned)a->dt >= TS_DTYPE_COUNT)
        return TS_ERR(TS_ERR_ARG, "%s: invalid dtype %d", ts_coll_kind_name(a->kind), (int)a->dt);
    if (reduces(a->kind) && a->dt == TS_UINT8)
        return TS_ERR(TS_ERR_UNSUPPORTED, "%s%s%s: dtype uint8 cannot be reduced (use int32)",
                      ts_coll_kind_name(a->kind), forced ? " with algorithm " : "",
                      forced ? registry[algo].name : "");
    if ((unsigned)a->op >= TS_OP_COUNT) return TS_ERR(TS_ERR_ARG, "invalid op %d", (int)a->op);
    if (a->count && !a->recvbuf) return TS_ERR(TS_ERR_ARG, "%s: NULL buffer", ts_coll_kind_name(a->kind));
    if (a->kind == TS_COLL_BCAST && (a->root < 0 || a->root >= ch->topo.size))
        return TS_ERR(TS_ERR_ARG, "bcast: root %d is not a rank of a %d-rank communicator", a->root, ch->topo.size);
    if (!a->sendbuf) a->sendbuf = a->recvbuf;
    if (a->count > SIZE_MAX / (es ? es : 1)) return TS_ERR(TS_ERR_ARG, "count %zu overflows", a->count);
    a->device = a->count ? ts_coll_is_device(a->recvbuf) : 0;
    if (!forced) {
        algo = choose(c, ch, a, &why);
        if (algo < 0)
            return TS_ERR(TS_ERR_UNSUPPORTED, "%s: no algorithm for %s buffers in this build",
                          ts_coll_kind_name(a->kind), a->device ? "GPU" : "host");
    }
    const ts_coll_algo *al = &registry[algo];
    char reason[256] = "";
    if (!al->supports(ch, a, reason, sizeof reason))
        return TS_ERR(TS_ERR_UNSUPPORTED, "%s algorithm '%s' (%s) cannot serve this call: %s",
                      ts_coll_kind_name(a->kind), al->name, why, reason);
    a->algo = algo;
    memset(&a->sig, 0, sizeof a->sig);
    a->sig.count = a->count;
    a->sig.kind = a->kind;
    a->sig.dtype = a->dt;
    a->sig.op = reduces(a->kind) ? a->op : 0;
    a->sig.root = a->kind == TS_COLL_BCAST ? a->root : 0;
    a->sig.algo = algo;
    a->reg = NULL;
    a->check = 0;
    if (a->kind == TS_COLL_ALLREDUCE && a->sendbuf == a->recvbuf && !strcmp(al->name, "shm") && a->count) {
        ts_regwin *w = ts_coll_find_reg(c, a->recvbuf, a->count * es);
        if (w) {
            a->reg = w;
            a->sig.inplace_reg = 1;
            a->sig.reg_id = w->id;
            a->sig.reg_off = (char *)a->recvbuf - w->base;
        }
    }
    int validate = c->opts.validate && !(forced && (al->flags & TS_ALGO_RAW));
    if (validate) {
        if (ch->topo.nnodes == 1) {
            if (al->flags & TS_ALGO_CHECKS)
                a->check = 1;
            else
                TS_TRY(ts_shm_exchange_sig(&ch->shm, ts_shm_next_round(&ch->shm), &a->sig));
        } else {
            TS_TRY(check_sig_mpi(ch, &a->sig));
        }
    } else if (a->reg) {
        a->check = 1; /* the registered path needs the exchange for the peers' offsets */
    }
    return al->run(ch, a);
}

int ts_coll_can_run(ts_coll *c, ts_coll_kind kind, const char *algo, size_t count, ts_dtype dt, ts_op op, char *why,
                    size_t n)
{
    int i = ts_coll_registry_find(kind, algo);
    if (i < 0) {
        snprintf(why, n, "unknown %s algorithm '%s'", ts_coll_kind_name(kind), algo);
        return 0;
    }
    ts_coll_args a = {.kind = kind, .count = count, .dt = dt, .op = op};
    return registry[i].supports(&c->main, &a, why, n);
}

int ts_coll_device_algo(ts_coll *c, ts_coll_kind kind, const char *algo, char *why, size_t n)
{
    int i = ts_coll_registry_find(kind, algo);
    if (i < 0 || !(registry[i].flags & TS_ALGO_DEVICE)) return -1;
    ts_coll_args a = {.kind = kind, .count = 1, .dt = TS_FLOAT32, .op = TS_OP_SUM, .device = 1};
    return registry[i].supports(&c->main, &a, why, n);
}
