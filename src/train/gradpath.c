/* The gradient path (src/train/gradpath.h). Owns: the table of the four
 * paths, the one function with every rule on which of them combine
 * (ts_gradpath_choose), the groups each path asks the layout for, and the
 * optimizer's entry point. The mechanics stay where they are: the buckets,
 * their compression and the reduce-scatter in src/parallel/buckets.c, the
 * optimizer over the arena and the parameter average in the stepper
 * (src/train/step.c). Must not: split a communicator or create a ts_coll
 * itself (ts_layout_group does), read keys other than the layout's spec. */
#include "tsbuild.h"
#include "src/train/gradpath.h"
#include "src/core/error.h"
#include "src/core/timer.h"
#include "src/train/emergency.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct path_ops {
    ts_grad_kind kind;
    const char *name;
    const char *asked; /* the keys that ask for it */
    /* Collective on the layout's world: the groups the path needs beyond the layout's gradient group (NULL: none) */
    int (*open)(ts_gradpath *g);
    /* Collective on the layout's world: the stepper set up for the path (NULL: nothing to set) */
    int (*attach)(ts_gradpath *g);
    /* Collective: after step `step`'s optimizer step (applied or skipped); NULL: nothing */
    int (*after)(ts_gradpath *g, int64_t step);
    /* Collective: every replica one model after `step`; NULL: the path keeps them in sync every step */
    int (*sync)(ts_gradpath *g, int64_t step);
    /* Local: a step's gradients are reduced across replicas */
    int (*crosses)(const ts_gradpath *g);
} path_ops;

struct ts_gradpath {
    const path_ops *ops;
    ts_layout *L;
    ts_stepper *s;
    ts_coll *reduce;                       /* the buckets' group: the layout's grad group, or local SGD's */
    ts_coll *comp_replicas, *comp_pieces;  /* compression with sp > 1: compressed over replicas after an exact
                                            * average over a replica's pieces; else NULL */
    int64_t last_avg;                      /* local SGD: the step after which the replicas last averaged */
    ts_gradpath_stats st;
};

/* ---- the paths ---- */

static int crosses_sync(const ts_gradpath *g) { return g->L->dp_size > 1; }

/* compress: with sp > 1 only the reduction over replicas is compressed (the pieces first averaged exactly) */
static int compress_open(ts_gradpath *g)
{
    if (g->L->grid->sp == 1) return 0;
    TS_TRY(ts_layout_group(g->L, TS_GROUP_REPLICAS, &g->comp_replicas));
    return ts_layout_group(g->L, TS_GROUP_PIECES, &g->comp_pieces);
}

static int compress_attach(ts_gradpath *g)
{
    ts_dp_compress c = g->L->spec.compress;
    c.group = g->comp_replicas;
    c.inner = g->comp_pieces;
    return ts_err_agree(g->L->grid->world, ts_stepper_set_compress(g->s, &c));
}

static int zero_attach(ts_gradpath *g) { return ts_err_agree(g->L->grid->world, ts_stepper_set_zero(g->s)); }

/* local SGD: gradients within a replica's pieces (global) or the node's replicas and their pieces (node) */
static int local_open(ts_gradpath *g)
{
    return ts_layout_group(g->L, g->L->spec.local_node ? TS_GROUP_NODE : TS_GROUP_PIECES, &g->reduce);
}

/* parameters, optimizer state and batch-norm buffers averaged over the replicas, once after `step` */
static int local_average(ts_gradpath *g, int64_t step)
{
    if (g->last_avg == step) return 0;
    g->last_avg = step;
    if (ts_coll_size(g->L->replicas) == 1) return 0;
    ts_emergency_begin_update();
    const double t0 = ts_time_now();
    TS_TRY(ts_stepper_average_params(g->s, g->L->replicas));
    g->st.param_average_s += ts_time_now() - t0;
    g->st.param_averages++;
    return 0;
}

static int local_after(ts_gradpath *g, int64_t step)
{
    return step % g->L->spec.local_steps == 0 ? local_average(g, step) : 0;
}

static int local_crosses(const ts_gradpath *g) { return ts_coll_size(g->reduce) > g->L->grid->sp; }

static const path_ops paths[TS_GRAD_KINDS] = {
    [TS_GRAD_PLAIN] = {TS_GRAD_PLAIN, "plain", "the default", NULL, NULL, NULL, NULL, crosses_sync},
    [TS_GRAD_COMPRESS] = {TS_GRAD_COMPRESS, "compress", "parallel.compress", compress_open, compress_attach, NULL, NULL,
                          crosses_sync},
    [TS_GRAD_ZERO] = {TS_GRAD_ZERO, "zero", "parallel.zero = 1", NULL, zero_attach, NULL, NULL, crosses_sync},
    [TS_GRAD_LOCAL] = {TS_GRAD_LOCAL, "local", "parallel.local_steps > 1", local_open, NULL, local_after,
                       local_average, local_crosses},
};

/* ---- the rules ---- */

static const char *where(const ts_config *cfg, const char *key)
{
    return cfg ? ts_config_source(cfg, key) : "given";
}

int ts_gradpath_choose(const ts_layout *L, const ts_config *cfg, ts_grad_kind *kind)
{
    const ts_layout_spec *s = &L->spec;
    const int comp = s->compress.cfg.kind != TS_COMPRESS_NONE, local = s->local_steps > 1;
    if (comp && local)
        return TS_ERR(TS_ERR_CONFIG, "parallel.compress = %s with parallel.local_steps = %d: local SGD averages "
                      "parameters every %d steps instead of reducing gradients, and compression applies to the "
                      "gradient reduction of synchronous data parallelism (use one or the other)", s->compress_text,
                      s->local_steps, s->local_steps);
    if (s->zero && local)
        return TS_ERR(TS_ERR_CONFIG, "parallel.zero = 1 (%s) with parallel.local_steps = %d: a sharded optimizer steps "
                      "each shard on gradients reduced over the whole group every step, while local SGD's replicas step "
                      "on their own gradients and so each need the whole optimizer state; use one of the two",
                      where(cfg, "parallel.zero"), s->local_steps);
    if (s->zero && comp)
        return TS_ERR(TS_ERR_CONFIG, "parallel.zero = 1 (%s) with parallel.compress = %s (%s): the sharded optimizer "
                      "reduce-scatters the buckets, and the compressors (error feedback, PowerSGD's factors) work on "
                      "whole-bucket allreduces; use one of the two", where(cfg, "parallel.zero"), s->compress_text,
                      where(cfg, "parallel.compress"));
    if (local && s->local_node && !L->grid->sp_one_node)
        return TS_ERR(TS_ERR_CONFIG, "parallel.local_sgd = node needs every spatial group inside one node (its pieces "
                      "reduce gradients every step): use parallel.local_sgd = global, or a parallel.sp that divides the "
                      "ranks per node");
    /* after the refusals at most one is asked for, so the order below does not matter */
    *kind = local ? TS_GRAD_LOCAL : s->zero ? TS_GRAD_ZERO : comp ? TS_GRAD_COMPRESS : TS_GRAD_PLAIN;
    return 0;
}

/* ---- the interface ---- */

int ts_gradpath_create(ts_layout *L, const ts_config *cfg, ts_gradpath **out)
{
    ts_grad_kind k;
    *out = NULL;
    if (L->spec.role != TS_LAYOUT_TRAIN || !L->grad)
        return TS_ERR(TS_ERR_INTERNAL, "gradient path: the layout is not a training layout");
    TS_TRY(ts_gradpath_choose(L, cfg, &k)); /* sizes and keys only: the same on every rank */
    ts_gradpath *g = TS_CALLOC(1, sizeof *g);
    /* agreed before the groups, whose creation is collective */
    int err = ts_err_agree(L->grid->world, g ? 0 : TS_ERR(TS_ERR_NOMEM, "gradient path"));
    if (err) {
        free(g);
        return err;
    }
    g->ops = &paths[k];
    g->L = L;
    g->reduce = L->grad;
    g->last_avg = -1;
    err = g->ops->open ? g->ops->open(g) : 0;
    if (err) {
        ts_gradpath_destroy(&g);
        return err;
    }
    *out = g;
    return 0;
}

void ts_gradpath_destroy(ts_gradpath **gp)
{
    if (!gp || !*gp) return;
    free(*gp); /* the groups are the layout's */
    *gp = NULL;
}

ts_grad_kind ts_gradpath_kind(const ts_gradpath *g) { return g->ops->kind; }

const char *ts_gradpath_name(ts_grad_kind k) { return (unsigned)k < TS_GRAD_KINDS ? paths[k].name : "?"; }

ts_coll *ts_gradpath_reduce_group(const ts_gradpath *g) { return g->reduce; }

int ts_gradpath_arena_states(const ts_gradpath *g, int nstate) { return g->ops->kind == TS_GRAD_ZERO ? 0 : nstate; }

int ts_gradpath_attach(ts_gradpath *g, ts_stepper *s)
{
    if (g->s) return TS_ERR(TS_ERR_INTERNAL, "gradient path: attached twice");
    g->s = s;
    return g->ops->attach ? g->ops->attach(g) : 0;
}

int ts_gradpath_update(ts_gradpath *g, int64_t step, int apply)
{
    if (!g->s) return TS_ERR(TS_ERR_INTERNAL, "gradient path: no stepper attached");
    if (apply) {
        ts_emergency_begin_update(); /* the parameters change until the step is committed */
        TS_TRY(ts_stepper_apply(g->s));
    }
    g->st.updates++;
    if (g->ops->crosses(g)) g->st.crossed++;
    return g->ops->after ? g->ops->after(g, step) : 0;
}

int ts_gradpath_sync(ts_gradpath *g, int64_t step)
{
    if (!g->s) return TS_ERR(TS_ERR_INTERNAL, "gradient path: no stepper attached");
    return g->ops->sync ? g->ops->sync(g, step) : 0;
}

void ts_gradpath_mark_synced(ts_gradpath *g, int64_t step) { g->last_avg = step; }

void ts_gradpath_get_stats(const ts_gradpath *g, ts_gradpath_stats *st) { *st = g->st; }

void ts_gradpath_reset_stats(ts_gradpath *g) { memset(&g->st, 0, sizeof g->st); }

void ts_gradpath_describe(const ts_gradpath *g, char *buf, size_t n)
{
    const ts_layout *L = g->L;
    switch (g->ops->kind) {
    case TS_GRAD_LOCAL:
        snprintf(buf, n, "gradient path local (%s): gradients averaged every step over %d rank(s) (%s), parameters, "
                 "optimizer state and batch-norm buffers over the %d replicas every %d steps", g->ops->asked,
                 ts_coll_size(g->reduce), L->spec.local_node ? "the node's replicas and their pieces" : "the replica's pieces",
                 L->dp_size, L->spec.local_steps);
        break;
    case TS_GRAD_ZERO:
        snprintf(buf, n, "gradient path zero (%s): buckets reduce-scattered over %d rank(s), each steps its shard, "
                 "parameters all-gathered", g->ops->asked, ts_coll_size(g->reduce));
        break;
    default:
        snprintf(buf, n, "gradient path %s (%s): buckets averaged over %d rank(s)%s", g->ops->name, g->ops->asked,
                 ts_coll_size(g->reduce), g->comp_replicas ? ", compressed over the replicas after an exact average "
                 "over each replica's pieces" : "");
    }
}
