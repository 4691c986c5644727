/* The layout object (src/parallel/layout.h). Owns: the parallel.* keys,
 * every rule on how the grid and the pipeline combine, every communicator
 * split and every ts_coll of a run, the groups a gradient path asks for
 * included (the paths and their rules: src/train/gradpath.c). Must not:
 * read model.* keys, touch a model or data, or communicate outside
 * ts_layout_create, ts_layout_group and ts_layout_destroy. */
#include "tsbuild.h"
#include "src/parallel/layout.h"
#include "src/core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const ts_cfg_key ts_layout_config_keys[] = {
    {"parallel.layout", TS_CFG_STRING, "given", NULL, "given: parallel.dp, pp, sp as set; auto: the planner ranks the "
     "layouts of the job's ranks at start and the run takes the fastest predicted; dp, sp, pp or D,P,S: that layout; "
     "auto and the forced ones hold the global batch train.batch x train.accum x ranks and set train.batch, "
     "parallel.microbatches and the schedule (docs/parallelism.md, \"Choosing the layout\")"},
    {"parallel.layout_calib", TS_CFG_STRING, "", NULL, "parallel.layout other than given: the planner's rates from "
     "this file (tessera bench step --calibrate); empty: a 2-step timing pass on rank 0 at start"},
    {"parallel.layout_tie", TS_CFG_FLOAT, "0.05", "0:1", "parallel.layout = auto: layouts predicted within this share "
     "of the fastest prediction are timed at start (1 warm-up and 2 steps each) and the fastest measured taken; 0: "
     "the prediction alone"},
    {"parallel.dp", TS_CFG_INT, "0", "0:", "data-parallel replicas (0: ranks / (pp x sp))"},
    {"parallel.pp", TS_CFG_INT, "1", "1:", "pipeline stages (each a contiguous range of the network's layer units)"},
    {"parallel.pp_cut", TS_CFG_STRING, "auto", NULL, "first units of stages 1..pp-1, e.g. enc2,dec1; auto: balanced by a timing pass"},
    {"parallel.sp", TS_CFG_INT, "1", "1:", "ranks sharing each sample's volume (spatial parallelism)"},
    {"parallel.sp_dims", TS_CFG_STRING, "auto", NULL, "split of the patch over parallel.sp ranks: D,H,W counts, or auto (depth first)"},
    {"parallel.microbatches", TS_CFG_INT, "1", "1:", "micro-batches of train.batch per step through the pipeline (parallel.pp > 1)"},
    {"parallel.schedule", TS_CFG_ENUM, "1f1b", "gpipe|1f1b", "pipeline schedule: gpipe (all forwards, then all backwards) or 1f1b"},
    {"parallel.bucket_mb", TS_CFG_FLOAT, "25", "0.001:", "gradient bucket size, MB"},
    /* gradient compression of the buckets: src/parallel/buckets.c, collectives/compress.c */
    {"parallel.compress", TS_CFG_STRING, "none", NULL, "gradient compression: none, bf16, fp16, topk:RATIO, sign or powersgd:RANK"},
    {"parallel.compress_warmup", TS_CFG_INT, "0", "0:", "first steps of each start with uncompressed gradients (as 1-bit Adam's warm-up)"},
    {"parallel.local_steps", TS_CFG_INT, "1", "1:", "local SGD: replicas step on their own gradients and average parameters "
     "and optimizer state every this many steps (1: synchronous data parallelism)"},
    {"parallel.local_sgd", TS_CFG_ENUM, "global", "global|node", "local SGD (parallel.local_steps > 1): global: no gradient "
     "exchange between replicas; node: gradients averaged over the replicas of a node every step, parameters over all "
     "every local_steps"},
    {"parallel.zero", TS_CFG_INT, "0", "0:1", "1: sharded optimizer state (ZeRO stage 1): gradients reduce-scattered, each rank "
     "of the gradient group (dp x sp) steps its shard of the parameters and holds only its shard's optimizer state, "
     "parameters all-gathered; checkpoints stay whole"},
    {NULL, 0, NULL, NULL, NULL},
};

static int copy_str(char *dst, size_t n, const char *src, const char *key)
{
    if (strlen(src) >= n) return TS_ERR(TS_ERR_CONFIG, "%s = '%s': longer than %zu characters", key, src, n - 1);
    memcpy(dst, src, strlen(src) + 1);
    return 0;
}

void ts_layout_spec_default(ts_layout_role role, const int64_t patch[3], int levels, ts_layout_spec *out)
{
    memset(out, 0, sizeof *out);
    out->role = role;
    out->pp = out->sp = 1;
    for (int d = 0; d < 3; d++) out->patch[d] = patch[d];
    out->levels = role == TS_LAYOUT_IO ? 1 : levels;
    snprintf(out->sp_dims, sizeof out->sp_dims, "auto");
    snprintf(out->pp_cut, sizeof out->pp_cut, "auto");
    snprintf(out->compress_text, sizeof out->compress_text, "none");
    out->schedule = role == TS_LAYOUT_INFER ? TS_PIPE_GPIPE : TS_PIPE_1F1B;
    out->microbatches = out->accum = out->local_steps = 1;
    out->bucket_mb = 25;
    out->compress.cfg.kind = TS_COMPRESS_NONE;
    ts_coll_opts_default(&out->coll);
}

int ts_layout_spec_from_config(const ts_config *cfg, ts_layout_role role, const int64_t patch[3], int levels,
                               ts_layout_spec *out)
{
    ts_layout_spec s;
    memset(&s, 0, sizeof s);
    int64_t v;
    const char *str;
    s.role = role;
    for (int d = 0; d < 3; d++) s.patch[d] = patch[d];
    s.levels = role == TS_LAYOUT_IO ? 1 : levels;
    TS_TRY(ts_config_get_int(cfg, "parallel.dp", &v));
    s.dp = role == TS_LAYOUT_TRAIN ? (int)v : 0; /* inference and I/O run on any number of ranks */
    TS_TRY(ts_config_get_int(cfg, "parallel.pp", &v));
    s.pp = role == TS_LAYOUT_IO ? 1 : (int)v;
    TS_TRY(ts_config_get_int(cfg, "parallel.sp", &v));
    s.sp = (int)v;
    TS_TRY(ts_config_get_str(cfg, "parallel.sp_dims", &str));
    TS_TRY(copy_str(s.sp_dims, sizeof s.sp_dims, str, "parallel.sp_dims"));
    TS_TRY(ts_config_get_str(cfg, "parallel.pp_cut", &str));
    TS_TRY(copy_str(s.pp_cut, sizeof s.pp_cut, str, "parallel.pp_cut"));
    TS_TRY(ts_config_get_str(cfg, "parallel.schedule", &str));
    TS_TRY(ts_pipe_kind_parse(str, &s.schedule));
    TS_TRY(ts_config_get_int(cfg, "parallel.microbatches", &v));
    s.microbatches = (int)v;
    s.accum = 1;
    if (role == TS_LAYOUT_INFER) { /* windows pass through the stages one batch at a time */
        s.schedule = TS_PIPE_GPIPE;
        s.microbatches = 1;
    }
    TS_TRY(ts_config_get_float(cfg, "parallel.bucket_mb", &s.bucket_mb));
    s.local_steps = 1;
    if (role == TS_LAYOUT_TRAIN) {
        TS_TRY(ts_config_get_int(cfg, "train.accum", &v));
        s.accum = (int)v;
        TS_TRY(ts_dp_compress_from_config(cfg, &s.compress));
        TS_TRY(ts_config_get_str(cfg, "parallel.compress", &str));
        TS_TRY(copy_str(s.compress_text, sizeof s.compress_text, str, "parallel.compress"));
        TS_TRY(ts_config_get_int(cfg, "parallel.local_steps", &v));
        s.local_steps = (int)v;
        TS_TRY(ts_config_get_str(cfg, "parallel.local_sgd", &str));
        s.local_node = !strcmp(str, "node");
        TS_TRY(ts_config_get_int(cfg, "parallel.zero", &v));
        s.zero = (int)v;
    }
    TS_TRY(ts_coll_opts_from_config(cfg, &s.coll));
    *out = s;
    return 0;
}

/* the pipeline's rules (sizes only, the same on every rank) */
static int check_pipeline(ts_layout *L, int pp)
{
    const ts_layout_spec *s = &L->spec;
    L->micro = s->accum;
    if (pp == 1) {
        if (s->role == TS_LAYOUT_TRAIN && s->microbatches != 1)
            snprintf(L->note, sizeof L->note, "parallel.microbatches = %d has no effect without a pipeline "
                     "(parallel.pp = 1); micro-batches are train.accum", s->microbatches);
        return 0;
    }
    if (s->accum > 1)
        return TS_ERR(TS_ERR_CONFIG, "train.accum = %d with parallel.pp = %d: a pipeline accumulates its micro-batches; "
                      "set parallel.microbatches = %d instead", s->accum, pp, s->accum);
    if (s->schedule == TS_PIPE_1F1B && s->microbatches < pp)
        return TS_ERR(TS_ERR_CONFIG, "parallel.schedule = 1f1b needs parallel.microbatches >= parallel.pp, but %d < %d "
                      "(use more micro-batches, or parallel.schedule = gpipe)", s->microbatches, pp);
    const int U = 4 * s->levels - 1; /* the model's layer units (ts_unet_units) */
    if (pp > U)
        return TS_ERR(TS_ERR_CONFIG, "parallel.pp = %d stages, but the model has only %d layer units to cut between (%d "
                      "cut points; model.channels has %d levels): use parallel.pp <= %d", pp, U, U - 1, s->levels, U);
    L->micro = s->microbatches;
    return 0;
}

/* Collective on the grid's world: the collectives of the role's groups */
static int create_colls(ts_layout *L)
{
    const ts_grid *g = L->grid;
    const ts_coll_opts *co = &L->spec.coll;
    TS_TRY(ts_coll_create(g->stage_comm, co, &L->grad));
    L->replicas = L->grad;
    L->all = L->grad;
    if (g->sp > 1 || g->pp > 1) TS_TRY(ts_coll_create(g->dp_comm, co, &L->replicas));
    if (g->pp > 1) TS_TRY(ts_coll_create(g->world, co, &L->all));
    return 0;
}

int ts_layout_group(ts_layout *L, ts_layout_group_kind which, ts_coll **out)
{
    const ts_grid *g = L->grid;
    *out = NULL;
    if (L->nextra == (int)(sizeof L->extra / sizeof L->extra[0]) || !g || !L->grad)
        return TS_ERR(TS_ERR_INTERNAL, "layout: group %d asked of a layout without groups or with %d already", (int)which,
                      L->nextra); /* the same on every rank */
    int err;
    if (which == TS_GROUP_NODE) { /* the ranks of this stage's gradient group that share this rank's node */
        MPI_Comm gc;
        TS_MPI_TRY(MPI_Comm_split(g->stage_comm, g->node, g->rank, &gc));
        err = ts_coll_create(gc, &L->spec.coll, &L->extra[L->nextra]);
        MPI_Comm_free(&gc);
    } else {
        err = ts_coll_create(which == TS_GROUP_REPLICAS ? g->dp_comm : g->sp_comm, &L->spec.coll, &L->extra[L->nextra]);
    }
    TS_TRY(err);
    *out = L->extra[L->nextra++];
    return 0;
}

int ts_layout_create(MPI_Comm world, const ts_layout_spec *spec, ts_layout **out)
{
    int err = 0;
    *out = NULL;
    ts_layout *L = calloc(1, sizeof *L);
    if (!L) return TS_ERR(TS_ERR_NOMEM, "layout");
    L->spec = *spec;
    L->micro = 1;
    TS_CHECK(ts_grid_create(world, spec->dp, spec->pp, spec->sp, &L->grid)); /* agreed */
    const ts_grid *g = L->grid;
    L->world_rank = g->rank;
    L->world_size = g->size;
    L->dp_rank = g->d;
    L->dp_size = g->dp;
    /* the rules: sizes only, so every rank reaches the same answer without talking */
    TS_CHECK(ts_spatial_plan(g->sp, spec->sp_dims, spec->patch, spec->levels, L->sp_dims));
    TS_CHECK(check_pipeline(L, g->pp));
    TS_CHECK(ts_spatial_create(g->sp_comm, L->sp_dims, &L->spatial));
    TS_CHECK(ts_spatial_box(L->spatial, spec->patch, L->box_lo, L->box));
    if (spec->role != TS_LAYOUT_IO) TS_CHECK(create_colls(L));
cleanup:
    if (err) ts_layout_destroy(&L);
    *out = L;
    return err;
}

void ts_layout_destroy(ts_layout **Lp)
{
    ts_layout *L = Lp ? *Lp : NULL;
    if (!L) return;
    for (int i = 0; i < L->nextra; i++) ts_coll_destroy(&L->extra[i]);
    if (L->replicas != L->grad) ts_coll_destroy(&L->replicas);
    if (L->all != L->grad) ts_coll_destroy(&L->all);
    ts_coll_destroy(&L->grad);
    ts_spatial_destroy(&L->spatial);
    ts_grid_destroy(&L->grid);
    free(L);
    *Lp = NULL;
}

void ts_layout_describe(const ts_layout *L, char *buf, size_t n)
{
    char grid[512];
    ts_grid_describe(L->grid, grid, sizeof grid);
    snprintf(buf, n, "%s; patch split %dx%dx%d, box %lldx%lldx%lld", grid, L->sp_dims[0], L->sp_dims[1],
             L->sp_dims[2], (long long)L->box[0], (long long)L->box[1], (long long)L->box[2]);
}
