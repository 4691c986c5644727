/* How one run is parallelised (docs/parallelism.md, docs/architecture.md
 * "The layout object"): built once from the configuration and the world
 * communicator, then handed to training, `bench step`, `bench io`,
 * evaluation and `tessera infer`; none of them splits a communicator or
 * creates a ts_coll of its own. A ts_layout owns the dp x pp x sp grid,
 * every group's communicator and ts_coll, the spatial split and this rank's
 * box of the patch, the pipeline's schedule and micro-batches, and the
 * gradient path's keys; the groups a gradient path asks for are made here
 * too (ts_layout_group), while the paths and their rules are in
 * src/train/gradpath.c. It knows nothing of the model: the patch and the
 * number of levels come in the spec. */
#ifndef TS_PARALLEL_LAYOUT_H
#define TS_PARALLEL_LAYOUT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "src/core/config.h"
#include "src/parallel/buckets.h"
#include "src/parallel/grid.h"
#include "src/parallel/pipe.h"
#include "src/parallel/spatial.h"

typedef enum {
    TS_LAYOUT_TRAIN = 0, /* tessera train, bench step: every group and every gradient rule */
    TS_LAYOUT_INFER,     /* tessera infer: parallel.dp ignored (replicas = ranks / (pp x sp)), GPipe with one
                          * micro-batch, no gradient path */
    TS_LAYOUT_IO         /* bench io: no pipeline (pp 1), the patch split as one level, no gradient path */
} ts_layout_role;

/* Groups made on request (ts_layout_group) beyond the role's own: a
 * gradient path asks for them (src/train/gradpath.c). */
typedef enum {
    TS_GROUP_REPLICAS = 0, /* the replicas (same stage and spatial piece): the dp communicator's ranks */
    TS_GROUP_PIECES,       /* a replica's spatial pieces of this stage: the sp communicator's ranks */
    TS_GROUP_NODE          /* the ranks of this stage's dp x sp group on this rank's node */
} ts_layout_group_kind;

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
    ts_coll *extra[4];         /* the groups made by ts_layout_group (owned) */
    int nextra;
    ts_spatial *spatial;       /* the spatial group (1 x 1 x 1 when sp = 1) */
    int sp_dims[3];
    int64_t box_lo[3], box[3]; /* this rank's box of every patch */
    int micro;                 /* micro-batches per step: train.accum, or parallel.microbatches with pp > 1 */
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
/* Collective on world. Checks the spec against the job (a refusal fails
 * every rank before any work), then creates the grid, the spatial group
 * and box, and every ts_coll the role needs (TS_LAYOUT_IO: none, the
 * ts_coll pointers are NULL). The gradient path's rules come after, in
 * ts_gradpath_create (src/train/gradpath.h). Errors agreed. */
int ts_layout_create(MPI_Comm world, const ts_layout_spec *spec, ts_layout **out);
/* Collective on the layout's world. NULL-safe; *L = NULL. */
void ts_layout_destroy(ts_layout **L);
/* Collective on the layout's world (every rank asks for the same groups in
 * the same order). A new ts_coll over group `which` of this rank, owned by
 * the layout (destroyed with it): a group of its own, so that a gradient
 * path's reductions on the progress thread never share a ts_coll with the
 * role's groups. At most 4 per layout. Errors agreed. */
int ts_layout_group(ts_layout *L, ts_layout_group_kind which, ts_coll **out);
/* Local. One line: the grid, the spatial split and box. */
void ts_layout_describe(const ts_layout *L, char *buf, size_t n);

#endif
