/* The ts_coll object: creation (dup, topology, staging, forced names,
 * tuning table), the blocking entry points, registered buffers, names.
 * No algorithm lives here: every call goes through ts_coll_dispatch
 * (registry.c), which chooses and runs one. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"
#include "src/core/fault.h"
#include "src/core/watchdog.h"
#include "collectives/device.h"

#include <stdlib.h>
#include <string.h>

#define SHM_HALF_DEFAULT ((size_t)1 << 20)

const ts_cfg_key ts_coll_config_keys[] = {
    {"coll.allreduce", TS_CFG_STRING, "auto", NULL, "allreduce algorithm (auto or a name from `tessera info`)"},
    {"coll.reduce_scatter", TS_CFG_STRING, "auto", NULL, "reduce-scatter algorithm"},
    {"coll.allgather", TS_CFG_STRING, "auto", NULL, "allgather algorithm"},
    {"coll.bcast", TS_CFG_STRING, "auto", NULL, "broadcast algorithm"},
    {"coll.tuning", TS_CFG_STRING, NULL, NULL, "tuning table written by `tessera bench coll --tune`"},
    {"coll.validate", TS_CFG_BOOL, "true", NULL, "check counts, dtypes and ops across ranks on every call"},
    {"coll.shm_chunk_kb", TS_CFG_INT, "1024", "64:1048576", "shared-memory staging per rank and half, KiB"},
    {NULL, 0, NULL, NULL, NULL},
};

void ts_coll_opts_default(ts_coll_opts *o)
{
    memset(o, 0, sizeof *o);
    o->validate = 1;
}

int ts_coll_opts_from_config(const ts_config *cfg, ts_coll_opts *o)
{
    static const char *const keys[TS_COLL_KIND_COUNT] = {"coll.allreduce", "coll.reduce_scatter",
                                                         "coll.allgather", "coll.bcast"};
    ts_coll_opts_default(o);
    for (int k = 0; k < TS_COLL_KIND_COUNT; k++) {
        const char *s;
        TS_TRY(ts_config_get_str(cfg, keys[k], &s));
        o->force[k] = strcmp(s, "auto") ? s : NULL;
    }
    if (ts_config_isset(cfg, "coll.tuning")) TS_TRY(ts_config_get_str(cfg, "coll.tuning", &o->tuning_file));
    TS_TRY(ts_config_get_bool(cfg, "coll.validate", &o->validate));
    int64_t kb;
    TS_TRY(ts_config_get_int(cfg, "coll.shm_chunk_kb", &kb));
    o->shm_chunk = (size_t)kb << 10;
    return 0;
}

void ts_split_block(size_t count, int p, int r, size_t *offset, size_t *len)
{
    size_t q = count / (size_t)p, rem = count % (size_t)p, rr = (size_t)r;
    *offset = rr * q + (rr < rem ? rr : rem);
    *len = q + (rr < rem);
}

void ts_coll_block(size_t count, ts_dtype dt, int p, int r, size_t *offset, size_t *len)
{
    size_t es = ts_dtype_size(dt), unit = es && es < 64 ? 64 / es : 1;
    size_t units = (count + unit - 1) / unit, uo, ul;
    ts_split_block(units, p, r, &uo, &ul);
    size_t o = uo * unit, e = (uo + ul) * unit;
    if (o > count) o = count;
    if (e > count) e = count;
    *offset = o;
    *len = e - o;
}

int ts_chan_scratch(ts_chan *ch, size_t bytes, void **out)
{
    if (bytes > ch->scratch_bytes) {
        free(ch->scratch);
        ch->scratch = TS_ALIGNED_ALLOC(bytes);
        ch->scratch_bytes = ch->scratch ? bytes : 0;
        if (!ch->scratch) return TS_ERR_NOMEM;
    }
    *out = ch->scratch;
    return 0;
}

static void chan_free(ts_chan *ch)
{
    ts_nccl_chan_free(ch);
    ts_shm_free(&ch->shm);
    ts_topo_free(&ch->topo);
    if (ch->comm != MPI_COMM_NULL) MPI_Comm_free(&ch->comm);
    free(ch->scratch);
    ch->scratch = NULL;
}

/* Collective: a channel on its own dup of base. */
int ts_chan_create(ts_coll *c, ts_chan *ch)
{
    int err = 0;
    memset(ch, 0, sizeof *ch);
    ch->comm = MPI_COMM_NULL;
    ch->topo.node_comm = ch->topo.peer_comm = ch->topo.leader_comm = MPI_COMM_NULL;
    ch->shm.win = MPI_WIN_NULL;
    ch->owner = c;
    TS_MPI(MPI_Comm_dup(c->base_comm, &ch->comm));
    TS_MPI(MPI_Comm_set_errhandler(ch->comm, MPI_ERRORS_RETURN));
    TS_CHECK(ts_topo_create(ch->comm, &ch->topo));
    TS_CHECK(ts_shm_create(ch->topo.node_comm, c->opts.shm_chunk ? c->opts.shm_chunk : SHM_HALF_DEFAULT,
                           ch->topo.real_local_size, &ch->shm));
cleanup:
    if (err) chan_free(ch);
    return err;
}

int ts_coll_create(MPI_Comm comm, const ts_coll_opts *opts, ts_coll **out)
{
    int err = 0;
    ts_coll *c = TS_CALLOC(1, sizeof *c);
    *out = NULL;
    if (!c) return TS_ERR_NOMEM; /* every rank fails alike: allocation of a few bytes */
    if (opts)
        c->opts = *opts;
    else
        ts_coll_opts_default(&c->opts);
    c->base_comm = MPI_COMM_NULL;
    c->main.comm = MPI_COMM_NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_work, NULL);
    pthread_cond_init(&c->cv_done, NULL);
    TS_MPI(MPI_Comm_dup(comm, &c->base_comm));
    TS_MPI(MPI_Comm_set_errhandler(c->base_comm, MPI_ERRORS_RETURN));
    /* forced algorithms: options, then environment; the same on every rank
     * for the same config, so every rank fails alike on a bad name */
    static const char *const env[TS_COLL_KIND_COUNT] = {"TESSERA_COLL_ALLREDUCE", "TESSERA_COLL_REDUCE_SCATTER",
                                                        "TESSERA_COLL_ALLGATHER", "TESSERA_COLL_BCAST"};
    int lerr = 0;
    for (int k = 0; k < TS_COLL_KIND_COUNT && !lerr; k++) {
        const char *name = c->opts.force[k];
        if (!name || !*name) name = getenv(env[k]);
        c->forced[k] = -1;
        if (!name || !*name || !strcmp(name, "auto")) continue;
        c->forced[k] = ts_coll_registry_find((ts_coll_kind)k, name);
        if (c->forced[k] < 0) {
            char list[512] = "";
            for (const char *const *n = ts_coll_algorithms((ts_coll_kind)k); *n; n++) {
                size_t l = strlen(list);
                snprintf(list + l, sizeof list - l, "%s%s", l ? ", " : "", *n);
            }
            lerr = TS_ERR(TS_ERR_ARG, "unknown %s algorithm '%s' (known: auto, %s%s)",
                          ts_coll_kind_name((ts_coll_kind)k), name, list,
#ifdef TS_HAVE_CUDA
                          ""
#else
                          !strcmp(name, "nccl") ? "; nccl needs a build with --with-cuda" : ""
#endif
            );
        }
    }
    const char *tf = c->opts.tuning_file ? c->opts.tuning_file : getenv("TESSERA_COLL_TUNING");
    if (!lerr && tf && *tf) lerr = ts_coll_tuning_load(c, tf);
    TS_CHECK(ts_err_agree(c->base_comm, lerr));
    TS_CHECK(ts_chan_create(c, &c->main));
    *out = c;
    return 0;
cleanup:
    ts_coll_destroy(&c);
    return err;
}

int ts_coll_async_stop(ts_coll *c);

int ts_coll_destroy(ts_coll **cp)
{
    if (!cp || !*cp) return 0;
    ts_coll *c = *cp;
    int err = ts_coll_async_stop(c);
    while (c->reg) {
        void *b = c->reg->base;
        ts_coll_buffer_free(c, &b);
    }
    if (c->async) {
        chan_free(c->async);
        free(c->async);
    }
    if (c->main.comm != MPI_COMM_NULL) chan_free(&c->main);
    if (c->base_comm != MPI_COMM_NULL) MPI_Comm_free(&c->base_comm);
    free(c->tuning);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv_work);
    pthread_cond_destroy(&c->cv_done);
    free(c);
    *cp = NULL;
    return err;
}

int ts_coll_size(const ts_coll *c) { return c->main.topo.size; }
int ts_coll_rank(const ts_coll *c) { return c->main.topo.rank; }
int ts_coll_nodes(const ts_coll *c) { return c->main.topo.nnodes; }
int ts_coll_local_size(const ts_coll *c) { return c->main.topo.local_size; }
int ts_coll_local_rank(const ts_coll *c) { return c->main.topo.local_rank; }
int ts_coll_node_index(const ts_coll *c) { return c->main.topo.node; }
int ts_coll_equal_nodes(const ts_coll *c) { return c->main.topo.equal_nodes; }

int ts_coll_run(ts_coll *c, ts_coll_kind kind, const char *algo, const void *sendbuf, void *recvbuf,
                size_t count, ts_dtype dt, ts_op op, int root)
{
    int idx = -1;
    if ((unsigned)kind >= TS_COLL_KIND_COUNT) return TS_ERR(TS_ERR_ARG, "invalid collective %d", (int)kind);
    if (algo && strcmp(algo, "auto")) {
        idx = ts_coll_registry_find(kind, algo);
        if (idx < 0) return TS_ERR(TS_ERR_ARG, "unknown %s algorithm '%s'", ts_coll_kind_name(kind), algo);
    }
    ts_coll_args a = {.kind = kind, .sendbuf = sendbuf, .recvbuf = recvbuf, .count = count, .dt = dt, .op = op,
                      .root = root};
    ts_fault_point(ts_coll_kind_name(kind)); /* (an injected hang: this rank never arrives) */
    ts_watch_enter(ts_coll_kind_name(kind), "collective", count * ts_dtype_size(dt));
    int rc = ts_coll_dispatch(c, &c->main, &a, idx);
    ts_watch_leave();
    return rc;
}

int ts_coll_allreduce(ts_coll *c, const void *sendbuf, void *recvbuf, size_t count, ts_dtype dt, ts_op op)
{
    return ts_coll_run(c, TS_COLL_ALLREDUCE, NULL, sendbuf, recvbuf, count, dt, op, 0);
}

int ts_coll_reduce_scatter(ts_coll *c, const void *sendbuf, void *recvbuf, size_t count, ts_dtype dt, ts_op op)
{
    return ts_coll_run(c, TS_COLL_REDUCE_SCATTER, NULL, sendbuf, recvbuf, count, dt, op, 0);
}

int ts_coll_allgather(ts_coll *c, void *buf, size_t count, ts_dtype dt)
{
    return ts_coll_run(c, TS_COLL_ALLGATHER, NULL, NULL, buf, count, dt, TS_OP_SUM, 0);
}

int ts_coll_bcast(ts_coll *c, void *buf, size_t count, ts_dtype dt, int root)
{
    return ts_coll_run(c, TS_COLL_BCAST, NULL, NULL, buf, count, dt, TS_OP_SUM, root);
}

/* ---- registered buffers ---- */

int ts_coll_buffer_alloc(ts_coll *c, size_t bytes, void **buf)
{
    int err = 0;
    ts_regwin *w = TS_CALLOC(1, sizeof *w);
    MPI_Comm node = c->main.topo.node_comm;
    int p = c->main.topo.local_size;
    *buf = NULL;
    if (!w) return TS_ERR_NOMEM;
    w->win = MPI_WIN_NULL;
    w->peer = TS_CALLOC((size_t)p, sizeof *w->peer);
    if (!w->peer) TS_FAIL(TS_ERR_NOMEM, "registered buffer");
    void *base;
    TS_MPI(MPI_Win_allocate_shared((MPI_Aint)(bytes ? bytes : 64), 64, MPI_INFO_NULL, node, &base, &w->win));
    for (int q = 0; q < p; q++) {
        MPI_Aint sz;
        int du;
        void *ptr;
        TS_MPI(MPI_Win_shared_query(w->win, q, &sz, &du, &ptr));
        w->peer[q] = ptr;
    }
    TS_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, w->win));
    w->base = base;
    w->bytes = bytes;
    pthread_mutex_lock(&c->mu);
    w->id = ++c->next_reg_id;
    w->next = c->reg;
    c->reg = w;
    pthread_mutex_unlock(&c->mu);
    *buf = base;
    return 0;
cleanup:
    if (w->win != MPI_WIN_NULL) MPI_Win_free(&w->win);
    free(w->peer);
    free(w);
    return err;
}

int ts_coll_buffer_free(ts_coll *c, void **buf)
{
    if (!buf || !*buf) return 0;
    pthread_mutex_lock(&c->mu);
    ts_regwin **pp = &c->reg;
    while (*pp && (*pp)->base != *buf) pp = &(*pp)->next;
    ts_regwin *w = *pp;
    if (w) *pp = w->next;
    pthread_mutex_unlock(&c->mu);
    if (!w) return TS_ERR(TS_ERR_ARG, "ts_coll_buffer_free: %p was not allocated by ts_coll_buffer_alloc", *buf);
    int err = 0;
    MPI_Win_unlock_all(w->win);
    TS_MPI(MPI_Win_free(&w->win));
cleanup:
    free(w->peer);
    free(w);
    *buf = NULL;
    return err;
}

ts_regwin *ts_coll_find_reg(ts_coll *c, const void *p, size_t bytes)
{
    ts_regwin *found = NULL;
    pthread_mutex_lock(&c->mu);
    for (ts_regwin *w = c->reg; w; w = w->next)
        if ((const char *)p >= w->base && (const char *)p + bytes <= w->base + w->bytes) {
            found = w;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    return found;
}

/* ---- names ---- */

static const char *const op_names[TS_OP_COUNT] = {"sum", "avg", "max", "min"};
static const char *const kind_names[TS_COLL_KIND_COUNT] = {"allreduce", "reduce_scatter", "allgather", "bcast"};

const char *ts_coll_op_name(ts_op op) { return (unsigned)op < TS_OP_COUNT ? op_names[op] : "invalid"; }
const char *ts_coll_kind_name(ts_coll_kind k)
{
    return (unsigned)k < TS_COLL_KIND_COUNT ? kind_names[k] : "invalid";
}

int ts_coll_op_parse(const char *s, ts_op *op)
{
    for (int i = 0; i < TS_OP_COUNT; i++)
        if (!strcmp(s, op_names[i])) {
            *op = (ts_op)i;
            return 0;
        }
    return 1;
}

int ts_coll_kind_parse(const char *s, ts_coll_kind *k)
{
    for (int i = 0; i < TS_COLL_KIND_COUNT; i++)
        if (!strcmp(s, kind_names[i])) {
            *k = (ts_coll_kind)i;
            return 0;
        }
    return 1;
}
