/* How one run is parallelised (docs/parallelism.md, docs/architecture.md
 * "The layout object"): built once from the configuration and the world
 * communicator, then handed to training, `bench step`, `bench io`,
 * evaluation and `tessera infer`; none of them splits a communicator or
 * creates a ts_coll of its own. A ts_layout owns the dp x pp x sp grid,
 * every group's communicator and ts_coll, the spatial split and this rank's
 * box of the patch, the pipeline's schedule and micro-batches, and the
 * gradient path's configuration and groups (plain, compressed, sharded,
 * local SGD), with every rule on which of them combine. It knows nothing of
 * the model: the patch and the number of levels come in the spec. */
#ifndef TS_PARALLEL_LAYOUT_H
#define TS_PARALLEL_LAYOUT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "src/core/config.h"
#include "src/parallel/dp.h"
#include "src/parallel/grid.h"
#include "src/parallel/pipe.h"
#include "src/parallel/spatial.h"

typedef enum {
    TS_LAYOUT_TRAIN = 0, /* tessera train, bench step: every group and every gradient rule */
    TS_LAYOUT_INFER,     /* tessera infer: parallel.dp ignored (replicas = ranks / (pp x sp)), GPipe with one
                          * micro-batch, no gradient path */
    TS_LAYOUT_IO         /* bench io: no pipeline (pp 1), the patch split as one level, no gradient path */
} ts_layout_role;

/* The gradient path: how a step's gradients become every replica's update. */
typedef enum {
    TS_GRAD_PLAIN = 0, /* bucketed allreduce (average) over the gradient group */
    TS_GRAD_COMPRESS,  /* the same, compressed with error feedback (parallel.compress) */
    TS_GRAD_ZERO,      /* reduce-scattered, each rank steps its shard, all-gathered (parallel.zero = 1) */
    TS_GRAD_LOCAL      /* local SGD: parameters averaged every parallel.local_steps (parallel.local_steps > 1) */
} ts_grad_kind;

/* What a run asks for: the parallel.* and coll.* keys, and the model's patch and levels. */
typedef struct ts_layout_spec {
    ts_layout_role role;
    int dp, pp, sp;            /* parallel.dp (0: ranks / (pp x sp)), parallel.pp, parallel.sp */
    char sp_dims[64];          /* parallel.sp_dims: auto or D,H,W */
    char pp_cut[512];          /* parallel.pp_cut */
    int64_t patch[3];          /* the model's data.patch */
    int levels;                /* the model's resolution levels (the spatial split's halos; 1 for TS_LAYOUT_IO) */
    ts_pipe_kind schedule;     /* parallel.schedule */
    int microbatches;          /* parallel.microbatches */
    int accum;                 /* train.accum (the train role; else 1) */
    double bucket_mb;          /* parallel.bucket_mb */
    ts_dp_compress compress;   /* parallel.compress, parallel.compress_warmup (groups unset) */
    char compress_text[64];    /* parallel.compress as written */
    int local_steps;           /* parallel.local_steps (1: synchronous) */
    int local_node;            /* parallel.local_sgd = node */
    int zero;                  /* parallel.zero */
    ts_coll_opts coll;         /* coll.* (strings borrowed from the configuration) */
} ts_layout_spec;

typedef struct ts_layout {
    ts_layout_spec spec;
    ts_grid *grid;             /* sizes, coordinates, the node-ordered world and the dp/pp/sp/stage communicators */
    int world_rank, world_size;/* in grid->world */
    int dp_rank, dp_size;      /* this rank's replica, and the replicas */
    /* One ts_coll per group; where two groups have the same ranks the same object is named twice. */
    ts_coll *grad;             /* the gradient group: dp x sp ranks of this stage (mean loss, norm buffers) */
    ts_coll *replicas;         /* the replicas (evaluation windows, local SGD's averages); = grad if sp = pp = 1 */
    ts_coll *all;              /* every rank (evaluation sums over stages); = grad if pp = 1 */
    ts_coll *grad_reduce;      /* the group gradients are averaged over each step: grad, or with local SGD a
                                * replica's pieces (global) or a node's replicas x pieces (node) */
    ts_coll *comp_replicas;    /* compression with sp > 1: the replicas (compressed) ... */
    ts_coll *comp_pieces;      /* ... after an exact average over a replica's pieces; else both NULL */
    ts_spatial *spatial;       /* the spatial group (1 x 1 x 1 when sp = 1) */
    int sp_dims[3];
    int64_t box_lo[3], box[3]; /* this rank's box of every patch */
    int micro;                 /* micro-batches per step: train.accum, or parallel.microbatches with pp > 1 */
    ts_grad_kind grad_kind;    /* the gradient path the rules chose */
    char note[512];            /* said, not refused (e.g. a key that has no effect here); "" if none */
} ts_layout;

/* Config keys: every parallel.* key. */
extern const ts_cfg_key ts_layout_config_keys[];

/* Local. The spec with every parallel.* key at its default (one replica per
 * rank), for callers without a configuration of those keys (bench io). */
void ts_layout_spec_default(ts_layout_role role, const int64_t patch[3], int levels, ts_layout_spec *out);
/* Local. The spec of a run from cfg for role; patch and levels from the
 * caller's model configuration. Errors: a malformed value (TS_ERR_CONFIG
 * naming the key and where it was set). */
int ts_layout_spec_from_config(const ts_config *cfg, ts_layout_role role, const int64_t patch[3], int levels,
                               ts_layout_spec *out);
/* Local, the same answer on every rank (sizes only): the gradient path a
 * spec asks for, or TS_ERR_CONFIG naming the keys, where they were set and
 * why they do not combine (every such rule is here or in
 * ts_dp_compress_from_config). sp_one_node: every spatial group lies within
 * one node. */
int ts_layout_grad_choose(const ts_layout_spec *spec, const ts_config *cfg, int sp_one_node, ts_grad_kind *kind);
/* Collective on world. Checks the spec against the job (a refusal fails
 * every rank before any work), then creates the grid, the spatial group
 * and box, and every ts_coll the role needs (TS_LAYOUT_IO: none, the
 * ts_coll pointers are NULL). cfg (may be NULL) only names
 * where keys were set in messages. Errors agreed. */
int ts_layout_create(MPI_Comm world, const ts_layout_spec *spec, const ts_config *cfg, ts_layout **out);
/* Collective on the layout's world. NULL-safe; *L = NULL. */
void ts_layout_destroy(ts_layout **L);
/* Local. The compression settings with the layout's groups filled in. */
void ts_layout_compress(const ts_layout *L, ts_dp_compress *out);
/* Local. The gradient path's name: "plain", "compress", "zero", "local". */
const char *ts_layout_grad_name(ts_grad_kind k);
/* Local. One line: the grid, the spatial split and box, the gradient path. */
void ts_layout_describe(const ts_layout *L, char *buf, size_t n);

#endif
