/* `tessera train`: the data-parallel training loop; see trainer.h.
 * Per step: next batch(es) from the prefetching loader -> forward, loss ->
 * backward, whose parameter gradients are handed to the bucket reducer as
 * they become final (tail of the arena first) -> wait for the buckets ->
 * optimizer. Then metrics, evaluation and checkpoints when due. */
#include "tsbuild.h"
#include "src/train/trainer.h"
#include "collectives/coll.h"
#include "io/checkpoint.h"
#include "src/train/emergency.h"
#include "io/dataset.h"
#include "io/loader.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/core/launch.h"
#include "src/core/log.h"
#include "src/core/path.h"
#include "src/core/perf.h"
#include "src/core/rng.h"
#include "src/core/timer.h"
#include "src/core/watchdog.h"
#include "src/model/cost.h"
#include "src/model/unet.h"
#include "src/optim/loss_scale.h"
#include "src/optim/optim.h"
#include "src/parallel/dp.h"
#include "src/parallel/grid.h"
#include "src/parallel/layout.h"
#include "src/parallel/spatial.h"
#include "src/train/evaluate.h"
#include "src/train/run.h"
#include "src/model/weights.h"
#include "src/train/grad_dump.h"
#include "src/train/pipeline.h"
#include "src/train/step.h"
#include "src/train/surface.h"
#include "src/train/synthetic.h"

#include <math.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

const ts_cfg_key ts_train_config_keys[] = {
    {"train.epochs", TS_CFG_INT, "0", "0:", "epochs to train (0: train.steps decides)"},
    {"train.accum", TS_CFG_INT, "1", "1:4096", "micro-batches accumulated per optimizer step"},
    {"train.lr_scaling", TS_CFG_ENUM, "none", "none|linear", "linear: lr x global batch / train.base_batch"},
    {"train.base_batch", TS_CFG_INT, "0", "0:", "global batch train.lr was tuned for (0: train.batch x micro-batches per step)"},
    {"train.deterministic", TS_CFG_BOOL, "false", NULL, "bit-identical reruns (fixed reduction orders)"},
    {"train.log_every", TS_CFG_INT, "10", "1:", "steps between metrics.jsonl lines"},
    {"train.dump_grads", TS_CFG_STRING, "", NULL, "write the first step's gradients (reduced, before the optimizer) and "
     "buffers to this HDF5 file, the same from any layout (docs/parallelism.md, \"Equal to one rank\")"},
    {"train.log_seconds", TS_CFG_FLOAT, "30", "0.1:", "seconds between progress lines in a batch log"},
    {"model.sync_bn", TS_CFG_BOOL, "false", NULL, "batch-norm statistics over the data-parallel group"},
    {"model.init", TS_CFG_STRING, "", NULL, "start from these weights (a weights file: tessera model init, model run, or "
     "exported from PyTorch; docs/formats-weights.md) instead of train.seed's; a checkpoint resumed replaces them"},
    {"eval.every", TS_CFG_INT, "0", "0:", "steps between evaluations (0: only at the end)"},
    {"eval.overlap", TS_CFG_FLOAT, "0.5", "0:0.95", "sliding-window overlap"},
    {"eval.max_volumes", TS_CFG_INT, "0", "0:", "volumes evaluated (0: all validation volumes)"},
    {"eval.final", TS_CFG_BOOL, "true", NULL, "evaluate after the last step"},
    {"eval.mirror", TS_CFG_ENUM, "none", "none|x|y|z|xy|xz|yz|xyz", "test-time mirroring of the validation volumes "
     "(as tessera infer mirror=): the volume and its flips along every subset of these axes (x = NIfTI i) predicted, "
     "the probabilities flipped back and averaged (xyz: 8 predictions, nnU-Net's default)"},
    {"eval.surface", TS_CFG_BOOL, "false", NULL, "also HD95 (mm) and NSD per class: each validation volume's, from its "
     "stored voxel spacing, averaged over the volumes where finite"},
    {"eval.nsd_tol", TS_CFG_FLOAT, "1", "0:", "NSD tolerance in mm (eval.surface)"},
    {"run.dir", TS_CFG_STRING, NULL, NULL, "run directory (default runs/<config name>)"},
    {"run.mem_limit_mb", TS_CFG_INT, "0", "0:", "per-rank memory ceiling in MiB checked at start (0: none)"},
    {"ckpt.every", TS_CFG_INT, "0", "0:", "steps between checkpoints (0: only at the end)"},
    {"ckpt.keep", TS_CFG_INT, "2", "0:", "checkpoints kept (0: all)"},
    {"ckpt.resume", TS_CFG_STRING, "auto", NULL, "auto (latest in run.dir/ckpt), none, or a checkpoint directory"},
    {"ckpt.emergency", TS_CFG_BOOL, "true", NULL, "when a peer is lost, every surviving rank writes the state it holds (docs/training.md, \"Losing a node\"); the next run resumes from it"},
    {"ckpt.emergency_dir", TS_CFG_STRING, "", NULL, "where (default run.dir/emergency; node-local storage works when the relaunch can read every survivor's)"},
    {"ckpt.every_minutes", TS_CFG_FLOAT, "30", "0:", "also checkpoint when this many minutes passed since the last one (0: off), so a lost rank costs at most that much"},
    {"fault.timeout", TS_CFG_FLOAT, "120", "1:", "watchdog deadline (s) for any single wait; a stuck rank ends the job with a report"},
    {"fault.max_bad_steps", TS_CFG_INT, "5", "1:", "steps in a row with a non-finite loss or gradient before the run stops"},
    {"perf.papi_events", TS_CFG_STRING, "auto", NULL,
     "counters per phase: comma list of PAPI events and perf::TASK-CLOCK, perf::PAGE-FAULTS, perf::CONTEXT-SWITCHES; "
     "auto, or none"},
    {"perf.timers", TS_CFG_BOOL, "true", NULL, "per-phase timers and counters (false: off, to measure their cost)"},
    {"perf.warmup_steps", TS_CFG_INT, "0", "0:", "first steps of this start left out of perf.json (warm-up)"},
    {NULL, 0, NULL, NULL, NULL},
};

typedef struct trainer {
    const ts_config *cfg;
    ts_layout *L;    /* the grid, every group's collectives, the spatial split, the gradient path (src/parallel/layout.h) */
    int64_t last_avg;            /* local SGD: the step after which parameters were last averaged */
    int64_t grad_xreplica, param_avgs; /* reductions that crossed replicas: gradient (per step), parameter averages */
    double state_bytes_max;   /* optimizer state bytes on the rank holding the most */
    ts_pipeline *pipe; /* pp > 1 */
    int stage_first[TS_UNET_MAX_LEVELS * 4];
    double unit_cost[TS_UNET_MAX_LEVELS * 4];
    int64_t mem_limit_mb;
    ts_unet *model;
    ts_arena *arena;
    ts_optim opt;
    ts_loss_scaler ls; /* train.precision = fp16: dynamic loss scale */
    ts_dataset *ds;      /* used by the loader's thread only */
    ts_dataset *eval_ds; /* a second handle for evaluation */
    ts_loader *loader;
    ts_stepper *stepper;
    ts_run run;
    ts_unet_cfg ucfg;
    int batch, accum, sync_bn, have_data;
    int64_t total_steps, step, epoch_steps;
    int64_t *val, nval, *trn, ntrn, syn_step;
    /* synthetic data when data.path is unset */
    float *syn_img;
    uint8_t *syn_lab;
    ts_perf *perf;      /* per-phase timers and counters (perf.json) */
    double step_s;      /* wall time of the training steps, with or without perf.timers */
    ts_pipeline_stats pp0; /* the pipeline's figures when perf.warmup_steps ended */
    int64_t early0;        /* the gradient buckets queued in backward by then */
    ts_mem_plan mem_plan;
    double rss0_mb; /* resident memory before the model */
    int64_t samples_done;
    const ts_batch *cur; /* the loader's batch being trained on (error context) */
    int grads_dumped;    /* train.dump_grads written (or not asked for) */
    char edir[1100];     /* ckpt.emergency_dir, resolved ("" when off) */
    double lost_at;      /* resumed from an emergency state: when the peer was lost (epoch seconds), else 0 */
    char lost[256];      /* ... and what was lost */
} trainer;

/* averages the batch-norm buffers over the group (replicas then evaluate
 * and checkpoint the same model, as DDP's buffer broadcast does) */
static int sync_buffers(trainer *t)
{
    ts_arena *a = t->arena;
    if (t->L->dp_size == 1 || a->nbuf == 0) return 0;
    for (int i = 0; i < a->n; i++) {
        if (a->p[i].kind != TS_BUFFER || a->p[i].dtype != TS_FLOAT32) continue;
        ts_tensor v = ts_arena_value(a, i);
        TS_TRY(ts_coll_allreduce(t->L->grad, TS_IN_PLACE, v.data, (size_t)v.shape[0], TS_FLOAT32, TS_OP_AVG));
    }
    return 0;
}

/* ---- local SGD ---- */
/* parallel.local_steps > 1: the stepper's gradients are averaged only over
 * the rank's spatial pieces (global), or over the replicas of its node and
 * their pieces (node): the layout's grad_reduce group; parameters,
 * optimizer state and batch-norm buffers are averaged over all replicas
 * every local_steps steps (and before a checkpoint or an evaluation, so
 * both see one model). */
/* averages this rank's parameters, optimizer state and batch-norm buffers
 * over the replicas (local SGD); no-op when already done after this step */
static int local_average(trainer *t, int64_t after_step)
{
    if (t->L->spec.local_steps <= 1 || t->last_avg == after_step) return 0;
    t->last_avg = after_step;
    if (ts_coll_size(t->L->replicas) == 1) return 0;
    const int err = ts_stepper_average_params(t->stepper, t->L->replicas);
    t->param_avgs++;
    return err;
}

/* ---- sharded optimizer state (parallel.zero = 1) ---- */
/* Once the stepper exists: shards its optimizer (zero = 1) and says how much
 * optimizer state each rank holds. Collective on world. */
static int start_zero(trainer *t)
{
    const ts_arena *a = t->arena;
    const int ns = ts_optim_state_count(&t->opt.cfg);
    if (t->L->spec.zero) TS_TRY(ts_err_agree(t->L->grid->world, ts_stepper_set_zero(t->stepper)));
    const double mine = (double)ts_stepper_state_floats(t->stepper) * ns * sizeof(float);
    const double whole = (double)a->nparam * ns * sizeof(float), MiB = 1048576.0;
    t->state_bytes_max = mine;
    TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &t->state_bytes_max, 1, MPI_DOUBLE, MPI_MAX, t->L->grid->world));
    if (t->L->spec.zero)
        ts_run_say(&t->run, "optimizer state: parallel.zero = 1, sharded over the %d ranks of each gradient group (dp %d "
                   "x sp %d%s): %.3f MiB per rank at most, %.3fx the whole state's %.3f MiB", ts_coll_size(t->L->grad),
                   t->L->grid->dp, t->L->grid->sp, t->pipe ? ", within each pipeline stage" : "", t->state_bytes_max / MiB,
                   whole > 0 ? t->state_bytes_max / whole : 0.0, whole / MiB);
    else
        ts_run_say(&t->run, "optimizer state: %.3f MiB per rank (parallel.zero = 0: every rank holds all of it)",
                   t->state_bytes_max / MiB);
    return 0;
}

/* ---- checkpoints ---- */
static const char *state_name(const ts_optim_cfg *o, int s)
{
    if (o->kind == TS_OPT_ADAMW) return s == 0 ? "exp_avg" : "exp_avg_sq";
    return "momentum_buffer";
}

/* the checkpoint's named views: parameters and buffers in the arena, the
 * optimizer state in the whole state regions state[s] (the arena's, or
 * gathered ones with a sharded optimizer) */
static int ckpt_items(trainer *t, float *const *state, ts_ckpt_item **out, int *n)
{
    ts_arena *a = t->arena;
    int ns = ts_optim_state_count(&t->opt.cfg), k = 0;
    ts_ckpt_item *it = calloc((size_t)a->n * (size_t)(1 + ns), sizeof *it);
    if (!it) return TS_ERR(TS_ERR_NOMEM, "checkpoint items");
    for (int i = 0; i < a->n; i++) {
        snprintf(it[k].name, sizeof it[k].name, "/params/%s", a->p[i].name);
        it[k++].t = ts_arena_value(a, i);
    }
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < a->n; i++) {
            if (a->p[i].kind != TS_PARAM) continue;
            snprintf(it[k].name, sizeof it[k].name, "/optim/%s/%s", state_name(&t->opt.cfg, s), a->p[i].name);
            it[k].t = ts_arena_value(a, i);
            it[k++].t.data = state[s] ? state[s] + a->p[i].offset : NULL; /* NULL: a sharded state off the writer */
        }
    *out = it;
    *n = k;
    return 0;
}

/* Pipeline: every stage holds valid values only for its own units; before
 * a checkpoint every rank gets all of them. The entries of other stages are
 * zeroed and the regions combined with a bitwise OR over the pipeline
 * group (exactly one stage holds each entry, so OR copies it, whatever its
 * type). */
static int gather_stages(trainer *t)
{
    if (!t->pipe) return 0;
    ts_arena *a = t->arena;
    int u0, u1, slots, e0, e1, x;
    ts_unet_stage(t->model, &u0, &u1, &slots);
    ts_unet_unit_params(t->model, u0, &e0, &x);
    ts_unet_unit_params(t->model, u1 - 1, &x, &e1);
    for (int i = 0; i < a->n; i++) {
        if (i >= e0 && i < e1) continue;
        ts_tensor v = ts_arena_value(a, i);
        memset(v.data, 0, ts_tensor_bytes(&v));
        if (a->p[i].kind != TS_PARAM || t->L->spec.zero) continue; /* a sharded state is gathered by save_ckpt */
        for (int k = 0; k < a->nstate; k++) {
            ts_tensor st = ts_arena_state(a, k, i);
            memset(st.data, 0, ts_tensor_bytes(&st));
        }
    }
    float *regions[2 + TS_ARENA_MAX_STATE] = {a->params, a->buffers};
    size_t sizes[2 + TS_ARENA_MAX_STATE] = {a->nparam, a->nbuf};
    int nr = 2;
    for (int k = 0; k < a->nstate && !t->L->spec.zero; k++) {
        regions[nr] = a->state[k];
        sizes[nr++] = a->nparam;
    }
    for (int r = 0; r < nr; r++)
        for (size_t off = 0; off < sizes[r]; off += (size_t)1 << 28) { /* pieces below INT_MAX ints */
            const size_t n = sizes[r] - off < ((size_t)1 << 28) ? sizes[r] - off : ((size_t)1 << 28);
            TS_MPI_TRY(TS_WATCHED("checkpoint: gathering the stages", MPI_Allreduce(MPI_IN_PLACE, regions[r] + off, (int)n, MPI_INT32_T, MPI_BOR, t->L->grid->pp_comm)));
        }
    return 0;
}

/* 1 if every float parameter and buffer of the arena is finite */
static int params_finite(const ts_arena *a)
{
    for (int i = 0; i < a->n; i++) {
        if (a->p[i].dtype != TS_FLOAT32) continue;
        const ts_tensor v = ts_arena_value(a, i);
        const float *x = v.data;
        for (int64_t k = 0; k < a->p[i].numel; k++)
            if (!isfinite(x[k])) return 0;
    }
    return 1;
}

/* The whole optimizer state regions for a checkpoint: the arena's own, or
 * with zero = 1 whole-size ones on world rank 0 only (the writer; freed by
 * free_full_state), NULL elsewhere. */
static int full_state(trainer *t, float **full)
{
    const ts_arena *a = t->arena;
    memset(full, 0, sizeof *full * TS_ARENA_MAX_STATE);
    if (t->L->spec.zero && t->L->grid->rank != 0) return 0;
    for (int s = 0; s < a->nstate; s++) {
        full[s] = t->L->spec.zero ? TS_ALIGNED_ALLOC((a->nparam ? a->nparam : 16) * sizeof(float)) : a->state[s];
        if (!full[s]) return TS_ERR(TS_ERR_NOMEM, "whole optimizer state for the checkpoint (%zu floats)", a->nparam);
    }
    return 0;
}

static void free_full_state(trainer *t, float **full)
{
    for (int s = 0; s < TS_ARENA_MAX_STATE && t->L->spec.zero; s++) free(full[s]);
    memset(full, 0, sizeof *full * TS_ARENA_MAX_STATE);
}

static int save_ckpt(trainer *t)
{
    float *full[TS_ARENA_MAX_STATE] = {NULL};
    int err = 0, n = 0;
    ts_ckpt_item *it = NULL;
    char dir[1100], path[4096], *text = NULL;
    size_t tlen = 0;
    int64_t keep;
    ts_perf_begin(t->perf, TS_PH_CKPT);
    TS_CHECK(local_average(t, t->step));
    TS_CHECK(sync_buffers(t));
    TS_CHECK(gather_stages(t));
    {
        /* never a checkpoint from non-finite parameters (it would rotate good ones out) */
        int bad = !params_finite(t->arena);
        TS_MPI(TS_WATCHED("checkpoint: finite parameters", MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, t->L->grid->world)));
        if (bad)
            TS_FAIL(TS_ERR_NUMERIC, "step %lld: the parameters are not finite (NaN or Inf): no checkpoint is written "
                    "(the newest in %s/ckpt stays the newest); lower train.lr or set train.clip_norm",
                    (long long)t->step, t->run.dir);
    }
    /* a sharded state is gathered whole onto the writer, rank 0 (transient; docs/parallelism.md) */
    TS_CHECK(ts_err_agree(t->L->grid->world, full_state(t, full)));
    if (t->L->spec.zero) TS_CHECK(ts_stepper_state_gather(t->stepper, t->L->grid->world, full));
    TS_CHECK(ckpt_items(t, full, &it, &n));
    TS_CHECK(ts_config_get_int(t->cfg, "ckpt.keep", &keep));
    FILE *mf = open_memstream(&text, &tlen);
    if (mf) {
        ts_config_write(t->cfg, mf);
        fclose(mf);
    }
    ts_ckpt_meta m = {.step = t->step,
                      .epoch = t->epoch_steps ? t->step / t->epoch_steps : 0,
                      .sampler_position = t->loader ? ts_loader_position(t->loader) : 0,
                      .ranks = t->L->world_size,
                      .config_hash = ts_config_hash(t->cfg),
                      .config = text,
                      .loss_scale = t->ls.dynamic ? t->ls.scale : 0,
                      .loss_scale_good = t->ls.good};
    int64_t seed;
    TS_CHECK(ts_config_get_int(t->cfg, "train.seed", &seed));
    m.seed = (uint64_t)seed;
    snprintf(dir, sizeof dir, "%s/ckpt", t->run.dir);
    ts_watch_enter("checkpoint write (parallel HDF5)", "world", 0); /* collective HDF5 calls wait for every rank */
    err = TS_CTX(ts_ckpt_save(t->L->grid->world, dir, it, n, &m, (int)keep, path, sizeof path), "the checkpoint of step %lld "
                 "in %s", (long long)t->step, dir);
    ts_watch_leave();
    TS_CHECK(err);
    ts_run_say(&t->run, "checkpoint: %s", path);
cleanup:
    ts_perf_end(t->perf, TS_PH_CKPT);
    free_full_state(t, full);
    free(text);
    free(it);
    return err;
}

/* ckpt.resume = auto: an emergency state newer than the newest checkpoint,
 * complete over the survivors' files, becomes a checkpoint (rank 0 writes
 * it) that the search below then finds; otherwise says why it is not used.
 * Collective on world. */
static int emergency_resume(trainer *t, const char *dir, ts_ckpt_item *it, int n)
{
    if (!t->edir[0]) return 0;
    int err = 0, lerr = 0;
    char line[1400] = "", path[4096];
    int64_t last = -1, done = -1;
    if (t->L->grid->rank == 0) {
        ts_emergency_meta em;
        ts_emergency_found f;
        if (ts_ckpt_latest(dir, path, sizeof path, &last) != 0) last = -1;
        lerr = ts_emergency_assemble(t->edir, last, it, n, &em, &f);
        if (!lerr && f.step >= 0) {
            ts_ckpt_meta m = {.step = em.step, .sampler_position = em.sampler_position, .seed = em.seed,
                              .config_hash = em.config_hash, .ranks = f.world_size, .loss_scale = em.loss_scale,
                              .loss_scale_good = em.loss_scale_good,
                              .epoch = t->epoch_steps ? em.step / t->epoch_steps : 0};
            lerr = TS_CTX(ts_ckpt_save(MPI_COMM_SELF, dir, it, n, &m, 0, path, sizeof path),
                          "the emergency state of step %lld as a checkpoint in %s", (long long)em.step, dir);
            if (!lerr) lerr = ts_emergency_remove(t->edir, em.step);
            if (!lerr) {
                done = em.step;
                t->lost_at = f.lost_at;
                snprintf(t->lost, sizeof t->lost, "%s", f.lost[0] ? f.lost : "a peer");
                snprintf(line, sizeof line, "emergency state: %s lost at step %lld; the %d surviving rank file%s "
                         "(of %d ranks) hold%s all of step %lld, now %s", t->lost, (long long)em.step + 1, f.files,
                         f.files == 1 ? "" : "s", f.world_size, f.files == 1 ? "s" : "", (long long)em.step, path);
                const int64_t gb = (int64_t)t->batch * t->L->micro * t->L->dp_size;
                if (f.global_batch > 0 && f.global_batch != gb) {
                    size_t k = strlen(line);
                    snprintf(line + k, sizeof line - k, "; note: the global batch is %lld, the run had %lld "
                             "(set train.accum or parallel.microbatches to keep it; jobs/elastic.sh does)",
                             (long long)gb, (long long)f.global_batch);
                }
            }
        } else if (!lerr && f.why[0]) {
            snprintf(line, sizeof line, "emergency state not used: %s; resuming from the last checkpoint%s", f.why,
                     last >= 0 ? "" : " (none: from the start)");
        } else if (!lerr && f.stale >= 0) { /* lost right after a checkpoint: it holds what the survivors did */
            t->lost_at = f.lost_at;
            snprintf(t->lost, sizeof t->lost, "%s", f.lost[0] ? f.lost : "a peer");
            snprintf(line, sizeof line, "emergency state: %s lost at step %lld; the survivors' state of step %lld is "
                     "no newer than the checkpoint of step %lld, which is used", t->lost, (long long)f.stale + 1,
                     (long long)f.stale, (long long)last);
        }
        if (!lerr && last >= 0) lerr = ts_emergency_remove_upto(t->edir, last); /* states a checkpoint covers */
    }
    TS_CHECK(ts_err_agree(t->L->grid->world, lerr));
    TS_MPI(MPI_Bcast(line, (int)sizeof line, MPI_CHAR, 0, t->L->grid->world));
    TS_MPI(MPI_Bcast(&done, 1, MPI_INT64_T, 0, t->L->grid->world));
    TS_MPI(MPI_Bcast(&t->lost_at, 1, MPI_DOUBLE, 0, t->L->grid->world));
    if (line[0]) ts_run_say(&t->run, "%s", line);
cleanup:
    return err;
}

/* the emergency state: armed after the resume, committed after every step (docs/training.md) */
static int emergency_end(const char *why, const char *lost, double waited_s)
{
    return ts_emergency_write(why, lost, waited_s) == 0 ? TS_EXIT_PEER_LOST : 1;
}

static int emergency_arm(trainer *t)
{
    if (!t->edir[0]) return 0;
    const char *names[TS_ARENA_MAX_STATE];
    ts_emergency_cfg c = {.dir = t->edir, .arena = t->arena, .e0 = 0, .e1 = t->arena->n,
                          .state_sharded = t->L->spec.zero, .state_names = names, .world_rank = t->L->grid->rank,
                          .world_size = t->L->grid->size,
                          .grid = {t->L->grid->d, t->L->grid->dp, t->L->grid->p, t->L->grid->pp, t->L->grid->s, t->L->grid->sp},
                          .config_hash = ts_config_hash(t->cfg),
                          .global_batch = (int64_t)t->batch * t->L->micro * t->L->dp_size};
    int64_t seed;
    TS_TRY(ts_config_get_int(t->cfg, "train.seed", &seed));
    c.seed = (uint64_t)seed;
    for (int s = 0; s < ts_optim_state_count(&t->opt.cfg) && s < TS_ARENA_MAX_STATE; s++) names[s] = state_name(&t->opt.cfg, s);
    if (t->pipe) { /* the entries of this rank's stage */
        int u0, u1, slots, x;
        ts_unet_stage(t->model, &u0, &u1, &slots);
        ts_unet_unit_params(t->model, u0, &c.e0, &x);
        ts_unet_unit_params(t->model, u1 - 1, &x, &c.e1);
    }
    TS_TRY(ts_emergency_setup(&c));
    ts_emergency_commit(t->step, t->opt.step, t->loader ? ts_loader_position(t->loader) : 0,
                        t->ls.dynamic ? t->ls.scale : 0, t->ls.good);
    ts_watchdog_on_end(emergency_end);
    return 0;
}

/* Resumes from ckpt.resume: a path, or (auto) the newest checkpoint in
 * run.dir/ckpt; a corrupt one (checksum, format) or one with non-finite
 * parameters is reported and, under auto, the one before it is tried.
 * metrics.jsonl loses the lines after the step resumed from (they would
 * repeat). Collective on world. */
static int resume(trainer *t)
{
    float *full[TS_ARENA_MAX_STATE] = {NULL};
    int err = 0, n = 0;
    ts_ckpt_item *it = NULL;
    const char *how;
    char path[4096] = "", dir[1100];
    TS_CHECK(ts_config_get_str(t->cfg, "ckpt.resume", &how));
    if (!strcmp(how, "none")) return 0;
    const int autom = !strcmp(how, "auto");
    int64_t st = INT64_MAX;
    snprintf(dir, sizeof dir, "%s/ckpt", t->run.dir);
    /* room for "/manifest.json" after the path (checkpoint.c) */
    if (!autom) TS_CHECK(ts_err_agree(t->L->grid->world, ts_path_check(how, sizeof path - 16, "ckpt.resume")));
    TS_CHECK(ts_err_agree(t->L->grid->world, full_state(t, full)));
    TS_CHECK(ckpt_items(t, full, &it, &n));
    if (autom) TS_CHECK(emergency_resume(t, dir, it, n));
    ts_ckpt_meta m;
    for (;;) {
        if (autom) {
            if (ts_ckpt_before(dir, st, path, sizeof path, &st) != 0) { /* nothing (more) to resume */
                if (path[0]) ts_run_say(&t->run, "no older checkpoint in %s: starting from scratch", dir);
                goto cleanup;
            }
        } else {
            snprintf(path, sizeof path, "%s", how);
        }
        /* a sharded state: rank 0 reads it and hands out the shards below */
        int lerr = ts_ckpt_load(path, it, t->L->spec.zero && t->L->grid->rank != 0 ? t->arena->n : n, &m);
        if (!lerr && !params_finite(t->arena))
            lerr = TS_ERR(TS_ERR_FORMAT, "%s holds non-finite parameters (NaN or Inf)", path);
        lerr = ts_err_agree(t->L->grid->world, lerr);
        if (!lerr) break;
        if (!autom || lerr == TS_ERR_NOMEM) {
            err = lerr; /* the agreed message stands */
            goto cleanup;
        }
        ts_run_say(&t->run, "checkpoint %s is not usable (%s): trying the one before it", path, ts_err_message());
        ts_err_clear();
    }
    if (t->L->spec.zero) TS_CHECK(ts_stepper_state_scatter(t->stepper, t->L->grid->world, full)); /* each rank's shard */
    t->step = m.step;
    t->opt.step = m.step;
    if (t->ls.dynamic && m.loss_scale > 0) { /* the scale where it was (a checkpoint without one: the initial) */
        t->ls.scale = m.loss_scale;
        t->ls.good = m.loss_scale_good;
        ts_stepper_set_loss_scale(t->stepper, t->ls.scale);
    }
    if (m.config_hash != ts_config_hash(t->cfg))
        ts_run_say(&t->run, "note: the config differs from the one that wrote %s (resuming anyway)", path);
    if (t->loader) TS_CHECK(ts_loader_seek(t->loader, m.sampler_position));
    TS_CHECK(ts_err_agree(t->L->grid->world, ts_run_truncate_metrics(&t->run, m.step)));
    ts_run_say(&t->run, "resumed from %s at step %lld", path, (long long)m.step);
cleanup:
    free_full_state(t, full);
    free(it);
    return err;
}

/* ---- data ---- */
static int next_batch(trainer *t, ts_tensor *img, ts_tensor *lab)
{
    if (t->have_data) {
        const ts_batch *b;
        ts_perf_begin(t->perf, TS_PH_DATA);
        int rc = ts_loader_next(t->loader, &b);
        ts_perf_end(t->perf, TS_PH_DATA);
        if (rc == 1) return TS_ERR(TS_ERR_INTERNAL, "training loader ended");
        if (rc) return rc;
        *img = b->image;
        *lab = b->label;
        t->cur = b;
    } else { /* synthetic random data of the configured shape: this rank's box of it */
        const ts_unet_cfg *u = &t->ucfg;
        int64_t seed;
        TS_TRY(ts_config_get_int(t->cfg, "train.seed", &seed));
        ts_synthetic_batch((uint64_t)seed, t->L->dp_rank, t->syn_step++, t->batch, u->in_channels, u->classes, u->patch,
                           t->L->box_lo, t->L->box, t->syn_img, t->syn_lab);
        int64_t si[5] = {t->batch, u->in_channels, t->L->box[0], t->L->box[1], t->L->box[2]}, sl[4] = {t->batch, t->L->box[0], t->L->box[1], t->L->box[2]};
        *img = ts_tensor_view(t->syn_img, TS_FLOAT32, 5, si);
        *lab = ts_tensor_view(t->syn_lab, TS_UINT8, 4, sl);
    }
    return 0;
}

/* ---- evaluation over validation volumes ---- */
static int pipe_forward(void *ctx, const ts_tensor *x, const ts_tensor **logits)
{
    return ts_pipeline_forward(ctx, x, logits);
}

/* eval.mirror's axes as a TS_EVAL_FLIP_* mask (x = W, y = H, z = D) */
static int eval_mirror_axes(const ts_config *cfg, int *axes)
{
    const char *m;
    TS_TRY(ts_config_get_str(cfg, "eval.mirror", &m));
    if (ts_eval_parse_axes(m, axes)) /* the key's choices are checked at load */
        return TS_ERR(TS_ERR_CONFIG, "eval.mirror = %s (%s)", m, ts_config_source(cfg, "eval.mirror"));
    return 0;
}

/* Collective. HD95 and NSD of every class of one volume (rank 0 computes, every rank gets them) */
static int volume_surface(trainer *t, int64_t vol, const uint8_t *pred, const uint8_t *lab, const int64_t dhw[3],
                          double tol, double *hd95, double *nsd)
{
    int err = 0, lerr = 0;
    const int K = t->ucfg.classes;
    double sp[3];
    /* every rank reads the spacing: with the MPI-IO driver HDF5's metadata reads are collective */
    TS_CHECK(ts_err_agree(t->L->grid->world, ts_dataset_spacing(t->eval_ds, vol, sp)));
    if (t->L->world_rank == 0) { /* the root of the broadcast below */
        for (int k = 0; k < K && !lerr; k++) {
            ts_surface_metrics sm;
            lerr = ts_surface_metrics_class(pred, lab, dhw, sp, k, tol, &sm);
            hd95[k] = sm.hd95;
            nsd[k] = sm.nsd;
        }
    }
    TS_CHECK(ts_err_agree(t->L->grid->world, lerr));
    TS_MPI(MPI_Bcast(hd95, K, MPI_DOUBLE, 0, t->L->grid->world));
    TS_MPI(MPI_Bcast(nsd, K, MPI_DOUBLE, 0, t->L->grid->world));
cleanup:
    return err;
}

/* Collective. Dice per class over the validation volumes (their voxels pooled); with eval.surface (*surface
 * set) hd95_out and nsd_out the mean over the volumes where finite (NaN: none); eval.mirror mirrors each
 * prediction. */
static int evaluate(trainer *t, double *dice_out, double *hd95_out, double *nsd_out, int *surface_out)
{
    int err = 0;
    const int K = t->ucfg.classes;
    int64_t *tp = calloc((size_t)K * 3, sizeof *tp), *fp = tp + K, *fn = tp + 2 * K, maxv;
    float *img = NULL;
    uint8_t *lab = NULL, *pred = NULL;
    double overlap, tol, hsum[TS_IO_MAX_CLASSES] = {0}, nsum[TS_IO_MAX_CLASSES] = {0};
    double hv[TS_IO_MAX_CLASSES], nvv[TS_IO_MAX_CLASSES];
    int surface = 0, axes, hn[TS_IO_MAX_CLASSES] = {0}, nn[TS_IO_MAX_CLASSES] = {0};
    if (!tp) return TS_ERR(TS_ERR_NOMEM, "eval counts");
    ts_perf_begin(t->perf, TS_PH_EVAL);
    TS_CHECK(local_average(t, t->step));
    TS_CHECK(ts_config_get_int(t->cfg, "eval.max_volumes", &maxv));
    TS_CHECK(ts_config_get_float(t->cfg, "eval.overlap", &overlap));
    TS_CHECK(ts_config_get_float(t->cfg, "eval.nsd_tol", &tol));
    TS_CHECK(ts_config_get_bool(t->cfg, "eval.surface", &surface));
    TS_CHECK(eval_mirror_axes(t->cfg, &axes));
    const ts_spatial_stats halo_before = *ts_spatial_get_stats(t->L->spatial); /* training's figures only */
    TS_CHECK(sync_buffers(t));
    const int64_t *vol = t->nval ? t->val : t->trn;
    int64_t nvol = t->nval ? t->nval : t->ntrn;
    if (maxv > 0 && nvol > maxv) nvol = maxv;
    ts_loader_opts lo;
    TS_CHECK(ts_loader_opts_from_config(t->cfg, &lo));
    for (int64_t v = 0; v < nvol; v++) {
        ts_sample_info in;
        int lerr = ts_dataset_info(t->eval_ds, vol[v], &in);
        TS_CHECK(ts_err_agree(t->L->grid->world, lerr));
        int64_t dhw[3] = {in.shape[1], in.shape[2], in.shape[3]}, nv = dhw[0] * dhw[1] * dhw[2];
        free(img);
        free(lab);
        free(pred);
        img = malloc(sizeof *img * (size_t)(nv * in.shape[0]));
        lab = malloc((size_t)nv);
        pred = malloc((size_t)nv);
        lerr = !img || !lab || !pred ? TS_ERR(TS_ERR_NOMEM, "evaluation volume %lld", (long long)vol[v]) : 0;
        if (!lerr) lerr = ts_patch_read_volume(t->eval_ds, vol[v], &lo.patch, img, lab);
        TS_CHECK(ts_err_agree(t->L->grid->world, lerr));
        ts_eval_split es;
        memcpy(es.box_lo, t->L->box_lo, sizeof es.box_lo);
        memcpy(es.box_size, t->L->box, sizeof es.box_size);
        es.all = t->L->all;
        es.forward = t->pipe ? pipe_forward : NULL;
        es.forward_ctx = t->pipe;
        TS_CHECK(ts_eval_predict_mirror(t->model, t->L->replicas, t->L->grid->sp > 1 || t->pipe ? &es : NULL, img, dhw,
                                        overlap, t->batch, axes, pred, NULL));
        ts_eval_confusion(pred, lab, nv, K, tp, fp, fn);
        if (surface) {
            TS_CHECK(volume_surface(t, vol[v], pred, lab, dhw, tol, hv, nvv));
            for (int k = 0; k < K; k++) {
                if (isfinite(hv[k])) hsum[k] += hv[k], hn[k]++;
                if (isfinite(nvv[k])) nsum[k] += nvv[k], nn[k]++;
            }
        }
    }
    for (int k = 0; k < K; k++) {
        dice_out[k] = ts_eval_dice(tp[k], fp[k], fn[k]);
        hd95_out[k] = surface && hn[k] ? hsum[k] / hn[k] : NAN;
        nsd_out[k] = surface && nn[k] ? nsum[k] / nn[k] : NAN;
    }
    *surface_out = surface;
cleanup:
    ts_spatial_set_stats(t->L->spatial, &halo_before);
    ts_perf_end(t->perf, TS_PH_EVAL);
    free(tp);
    free(img);
    free(lab);
    free(pred);
    return err;
}

static void report_dice(trainer *t, const double *dice, const double *hd95, const double *nsd)
{
    const int K = t->ucfg.classes;
    char line[4096];
    size_t l = (size_t)snprintf(line, sizeof line, "eval at step %lld: Dice", (long long)t->step);
    double mean = 0;
    int nfg = 0;
    for (int k = 0; k < K && l < sizeof line; k++) {
        const char *name = t->have_data ? ts_dataset_class_name(t->eval_ds, k) : NULL;
        l += (size_t)snprintf(line + l, sizeof line - l, " %s=%.4f", name ? name : "class", dice[k]);
        if (k > 0 && dice[k] == dice[k]) {
            mean += dice[k];
            nfg++;
        }
    }
    if (nfg && l < sizeof line) l += (size_t)snprintf(line + l, sizeof line - l, "  (foreground mean %.4f)", mean / nfg);
    for (int m = 0; hd95 && m < 2 && l < sizeof line; m++) { /* eval.surface: the foreground classes */
        const double *v = m ? nsd : hd95;
        l += (size_t)snprintf(line + l, sizeof line - l, m ? "; NSD" : "; HD95 mm");
        for (int k = 1; k < K && l < sizeof line; k++) /* "-": in no volume finite (missed everywhere, or absent) */
            l += isfinite(v[k]) ? (size_t)snprintf(line + l, sizeof line - l, " %.4g", v[k])
                                : (size_t)snprintf(line + l, sizeof line - l, " -");
    }
    ts_run_say(&t->run, "%s", line);
}

/* ---- memory plan ---- */
static double rss_now_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb / 1024.0;
}

double ts_train_peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

double ts_train_rss_mb(void) { return rss_now_mb(); }

int ts_train_memory_plan(ts_unet *m, const ts_unet_split *split, const ts_unet_cfg *u, int batch, int channels,
                         int prefetch, const int64_t box[3], const int sp_dims[3], double read_bytes, double process_mb,
                         ts_mem_plan *mp)
{
    const ts_arena *a = ts_unet_arena(m);
    size_t act;
    TS_TRY(ts_unet_plan_bytes_split(m, split, batch, (int)box[0], (int)box[1], (int)box[2], &act));
    const double nv = (double)box[0] * (double)box[1] * (double)box[2], MiB = 1048576.0;
    memset(mp, 0, sizeof *mp);
    mp->activations_mb = (double)act / MiB;
    mp->params_mb = (double)(a->nparam * (size_t)(2 + a->nstate) + a->nbuf) * 4 / MiB;
    /* batch slots (the loader's ring, or the synthetic batch) and the reading scratch: a patch, or what the
     * loader allocates for an augmented one (read_bytes) */
    const double patch_bytes = nv * (4.0 * channels + 1);
    mp->data_mb = ((double)(prefetch + 1) * batch * patch_bytes + (read_bytes > patch_bytes ? read_bytes : patch_bytes)) / MiB;
    /* the convolution kernels' per-thread slabs, packed weights and partial sums */
    const int cmax = u->channels[u->levels - 1];
    mp->scratch_mb = (8.0 * 27 * cmax * cmax * 4 + 16.0 * (1 << 20) * 4) / MiB;
    /* the halo exchange's send and receive buffers: two per neighbour, as large as the largest
     * exchange (level 0's decoder conv on [up, skip], 2 c0 channels) */
    for (int d = 0; d < 3; d++)
        if (sp_dims && sp_dims[d] > 1) mp->halo_mb += 2.0 * 2.0 * batch * (nv / (double)box[d]) * 2.0 * u->channels[0] * 4 / MiB;
    mp->process_mb = process_mb;
    mp->total_mb = mp->activations_mb + mp->params_mb + mp->data_mb + mp->scratch_mb + mp->halo_mb + mp->process_mb;
    return 0;
}

/* run.mem_limit_mb: the plan of this configuration against the limit, and
 * the smallest parallel.sp that would fit (same model, auto split) */
static int check_memory(trainer *t, int prefetch, double read_bytes)
{
    ts_mem_plan mp;
    const ts_unet_cfg *u = &t->ucfg;
    ts_unet_split own;
    memset(&own, 0, sizeof own);
    ts_spatial_split_dims(t->L->spatial, own.on);
    for (int d = 0; d < 3; d++)
        for (int side = 0; side < 2; side++) own.nbr[d][side] = ts_spatial_neighbor(t->L->spatial, d, side);
    TS_TRY(ts_train_memory_plan(t->model, t->L->grid->sp > 1 ? &own : NULL, u, t->batch, u->in_channels, prefetch, t->L->box,
                                t->L->sp_dims, read_bytes, t->rss0_mb, &mp));
    if (t->L->spec.zero) { /* the shard's optimizer state (the arena is allocated without it): about 1/(dp x sp) */
        const double st = (double)ts_optim_state_count(&t->opt.cfg) * (double)t->arena->nparam * 4 /
                          ts_coll_size(t->L->grad) / 1048576.0;
        mp.params_mb += st;
        mp.total_mb += st;
    }
    t->mem_plan = mp;
    if (t->mem_limit_mb <= 0 || mp.total_mb <= (double)t->mem_limit_mb) return 0;
    char hint[256] = "";
    for (int sp = t->L->grid->sp * 2; sp <= 4096; sp *= 2) {
        int dims[3];
        if (ts_spatial_plan(sp, "auto", u->patch, u->levels, dims)) {
            ts_err_clear();
            continue;
        }
        /* the plan of an interior rank of that split (neighbours on both sides) */
        ts_unet_split fake;
        memset(&fake, 0, sizeof fake);
        int64_t box[3];
        for (int d = 0; d < 3; d++) {
            fake.on[d] = dims[d] > 1;
            fake.nbr[d][0] = fake.nbr[d][1] = dims[d] > 1;
            box[d] = u->patch[d] / dims[d];
        }
        ts_mem_plan q;
        TS_TRY(ts_train_memory_plan(t->model, &fake, u, t->batch, u->in_channels, prefetch, box, dims,
                                    read_bytes * (double)(box[0] * box[1] * box[2]) /
                                        (double)(t->L->box[0] * t->L->box[1] * t->L->box[2]),
                                    t->rss0_mb, &q));
        if (q.total_mb <= (double)t->mem_limit_mb) {
            snprintf(hint, sizeof hint, "; parallel.sp = %d (sp_dims %d,%d,%d) would need about %.0f MiB per rank", sp,
                     dims[0], dims[1], dims[2], q.total_mb);
            break;
        }
    }
    return TS_ERR(TS_ERR_CONFIG,
                  "run.mem_limit_mb = %lld: this configuration needs about %.0f MiB per rank (activations and "
                  "gradients %.0f MiB for a box of %lldx%lldx%lld x batch %d, parameters and optimizer state %.0f MiB, "
                  "data %.0f MiB, halo buffers %.0f MiB, kernel scratch %.0f MiB, process at start %.0f MiB)%s",
                  (long long)t->mem_limit_mb, mp.total_mb, mp.activations_mb, (long long)t->L->box[0], (long long)t->L->box[1],
                  (long long)t->L->box[2], t->batch, mp.params_mb, mp.data_mb, mp.halo_mb, mp.scratch_mb, mp.process_mb,
                  hint[0] ? hint : "; no parallel.sp up to 4096 brings it under the limit: reduce data.patch or train.batch");
}

/* run.mem_limit_mb and evaluation: every rank holds a whole validation
 * volume with its class sums (K + 1 floats per voxel) while it evaluates */
static int check_eval_memory(trainer *t)
{
    int64_t every;
    int fin, axes;
    TS_TRY(ts_config_get_int(t->cfg, "eval.every", &every));
    TS_TRY(ts_config_get_bool(t->cfg, "eval.final", &fin));
    TS_TRY(eval_mirror_axes(t->cfg, &axes));
    if (!t->have_data || (every <= 0 && !fin)) return 0;
    const int64_t *vol = t->nval ? t->val : t->trn, nvol = t->nval ? t->nval : t->ntrn;
    double most = 0;
    for (int64_t v = 0; v < nvol; v++) {
        ts_sample_info in;
        TS_TRY(ts_dataset_info(t->eval_ds, vol[v], &in));
        const double nv = (double)in.shape[1] * (double)in.shape[2] * (double)in.shape[3];
        /* eval.mirror: a flipped copy of the volume and two more sets of class sums (ts_eval_predict_mirror) */
        const double mirror = axes ? 4.0 * ((double)in.shape[0] + 2.0 * t->ucfg.classes) : 0;
        const double mb = nv * (4.0 * (t->ucfg.classes + 1) + 4.0 * (double)in.shape[0] + 2.0 + mirror) / 1048576.0;
        if (mb > most) most = mb;
    }
    t->mem_plan.eval_mb = most;
    t->mem_plan.total_mb += most;
    if (t->mem_limit_mb > 0 && t->mem_plan.total_mb > (double)t->mem_limit_mb)
        return TS_ERR(TS_ERR_CONFIG, "run.mem_limit_mb = %lld: training needs about %.0f MiB per rank and evaluating the "
                      "largest validation volume of %s adds %.0f MiB (the volume and its class sums, held whole on every "
                      "rank); raise the limit, or set eval.final = false and eval.every = 0",
                      (long long)t->mem_limit_mb, t->mem_plan.total_mb - most, ts_dataset_path(t->eval_ds), most);
    return 0;
}

/* the pipeline's cut: printed, and written to the run directory as pipeline.json */
static int report_cut(trainer *t, const char *dir)
{
    const int P = t->L->grid->pp, U = ts_unet_units(t->model);
    const char *cut = t->L->spec.pp_cut, *sched = t->L->spec.schedule == TS_PIPE_GPIPE ? "gpipe" : "1f1b";
    char name[32], line[1024], path[1100];
    const int measured = !strcmp(cut, "auto");
    FILE *f = NULL;
    if (t->L->grid->rank == 0) {
        snprintf(path, sizeof path, "%s/pipeline.json", dir);
        f = fopen(path, "w");
    }
    int bad = t->L->grid->rank == 0 && !f;
    TS_TRY(ts_err_agree(t->L->grid->world, bad ? TS_ERR(TS_ERR_IO, "%s: cannot write the pipeline's cut", path) : 0));
    if (f)
        fprintf(f, "{\n  \"stages\": %d, \"microbatches\": %d, \"schedule\": \"%s\", \"cut\": \"%s\",\n"
                   "  \"bubble_formula\": %.6f,\n  \"stage\": [\n", P, t->L->micro, sched, measured ? "auto (timing pass)" : cut,
                ts_pipe_bubble(P, t->L->micro));
    double total = 0;
    for (int u = 0; u < U; u++) total += t->unit_cost[u];
    for (int k = 0; k < P; k++) {
        size_t l = 0;
        double c = 0;
        for (int u = t->stage_first[k]; u < t->stage_first[k + 1]; u++) {
            l += (size_t)snprintf(line + l, sizeof line - l, "%s%s", u > t->stage_first[k] ? "," : "",
                                  ts_unet_unit_name(t->model, u, name, sizeof name));
            c += t->unit_cost[u];
        }
        if (measured)
            ts_run_say(&t->run, "pipeline stage %d: %s, estimated %.1f ms per micro-batch (forward + backward, %.0f%%)", k,
                       line, c * 1e3, total > 0 ? 100 * c / total : 0);
        else
            ts_run_say(&t->run, "pipeline stage %d: %s (parallel.pp_cut)", k, line);
        if (f && measured) fprintf(f, "    {\"units\": \"%s\", \"estimated_ms\": %.3f}%s\n", line, c * 1e3, k + 1 < P ? "," : "");
        else if (f) fprintf(f, "    {\"units\": \"%s\", \"estimated_ms\": null}%s\n", line, k + 1 < P ? "," : "");
    }
    if (f) {
        fprintf(f, "  ]\n}\n");
        bad = fclose(f) != 0;
    }
    ts_run_say(&t->run, "pipeline: %d stages, %d micro-batches of %d per step, %s; ideal bubble (P-1)/(M+P-1) = %.3f", P,
               t->L->micro, t->batch, sched, ts_pipe_bubble(P, t->L->micro));
    return ts_err_agree(t->L->grid->world, bad ? TS_ERR(TS_ERR_IO, "%s: write failed", path) : 0);
}

/* ---- setup ---- */
/* Cross-validation (data.folds > 0): the held-out fold's subjects replace
 * the data.val_fraction split (same on every rank: names and seed are). */
static int setup_folds(trainer *t, const ts_config *cfg, int64_t n, double valf, uint64_t seed)
{
    int64_t folds64, fold64;
    const char *delim;
    TS_TRY(ts_config_get_int(cfg, "data.folds", &folds64));
    TS_TRY(ts_config_get_int(cfg, "data.fold", &fold64));
    int folds = (int)folds64, fold = (int)fold64;
    TS_TRY(ts_config_get_str(cfg, "data.subject_delim", &delim));
    if (!folds) {
        if (fold)
            return TS_ERR(TS_ERR_CONFIG, "data.fold = %d (%s) needs data.folds", fold, ts_config_source(cfg, "data.fold"));
        return 0;
    }
    if (valf > 0)
        return TS_ERR(TS_ERR_CONFIG, "data.val_fraction (%s) and data.folds (%s): choose one way to hold out samples",
                      ts_config_source(cfg, "data.val_fraction"), ts_config_source(cfg, "data.folds"));
    const char **names = malloc(sizeof(char *) * (size_t)(n > 0 ? n : 1));
    if (!names) return TS_ERR(TS_ERR_NOMEM, "folds: %lld names", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        ts_sample_info info;
        int e = ts_dataset_info(t->ds, i, &info);
        if (e) {
            free(names);
            return e;
        }
        names[i] = info.name;
    }
    free(t->val);
    t->val = malloc(sizeof *t->val * (size_t)n);
    int e = t->val ? 0 : TS_ERR(TS_ERR_NOMEM, "folds");
    if (!e) e = ts_sampler_folds(names, n, folds, fold, seed, delim, t->trn, &t->ntrn, t->val, &t->nval);
    free(names);
    if (!e && (t->ntrn == 0 || t->nval == 0))
        e = TS_ERR(TS_ERR_CONFIG, "data.fold %d of %d leaves %lld training and %lld validation samples", fold, folds,
                   (long long)t->ntrn, (long long)t->nval);
    return e;
}

/* what the parts of setup hand on to each other */
typedef struct setup_ctx {
    int64_t seed;            /* train.seed */
    char dir[1024];          /* the run directory */
    int64_t global, base;    /* the global batch; train.base_batch */
    double base_lr;          /* train.lr before scaling */
    const char *scaling;     /* train.lr_scaling */
} setup_ctx;

/* the layout: the grid, the spatial split of the patch, the collectives, the
 * gradient path (every rule checked before any work) */
static int setup_grid(trainer *t, const ts_config *cfg, MPI_Comm world)
{
    int err = 0;
    ts_layout_spec spec;
    t->cfg = cfg;
    t->rss0_mb = rss_now_mb();
    TS_CHECK(ts_config_get_int(cfg, "run.mem_limit_mb", &t->mem_limit_mb));
    TS_CHECK(ts_unet_cfg_from_config(cfg, &t->ucfg));
    TS_CHECK(ts_layout_spec_from_config(cfg, TS_LAYOUT_TRAIN, t->ucfg.patch, t->ucfg.levels, &spec));
    TS_CHECK(ts_layout_create(world, &spec, cfg, &t->L));
    if (t->L->note[0] && t->L->world_rank == 0) /* said once (the run directory is not open yet) */
        fprintf(stderr, "tessera train: note: %s\n", t->L->note);
cleanup:
    return err;
}

/* the optimizer, the batch and micro-batches, the model with its initial weights */
static int setup_model(trainer *t, const ts_config *cfg, setup_ctx *c)
{
    int err = 0;
    int64_t v;
    /* model and optimizer */
    TS_CHECK(ts_optim_cfg_from_config(cfg, &t->opt.cfg));
    TS_CHECK(ts_loss_scaler_from_config(cfg, t->ucfg.precision, &t->ls));
    TS_CHECK(ts_config_get_int(cfg, "train.batch", &v));
    t->batch = (int)v;
    TS_CHECK(ts_config_get_int(cfg, "train.accum", &v));
    t->accum = (int)v;
    TS_CHECK(ts_config_get_bool(cfg, "model.sync_bn", &t->sync_bn));
    TS_CHECK(ts_unet_create(&t->ucfg, t->L->spec.zero ? 0 : ts_optim_state_count(&t->opt.cfg), &t->model));
    t->arena = ts_unet_arena(t->model);
    TS_CHECK(ts_config_get_int(cfg, "train.seed", &c->seed));
    TS_CHECK(ts_unet_init(t->model, (uint64_t)c->seed)); /* same c->seed everywhere: identical replicas */
    {
        const char *init;
        TS_CHECK(ts_config_get_str(cfg, "model.init", &init));
        if (*init) /* every rank reads the same file: identical replicas */
            TS_CHECK(ts_err_agree(t->L->grid->world, TS_CTX(ts_weights_load(t->arena, init), "model.init = %s", init)));
    }
    ts_stepper_split_model(t->model, t->L->spatial);
cleanup:
    return err;
}

/* the dataset, its training/validation split (or folds) */
static int setup_data(trainer *t, const ts_config *cfg)
{
    int err = 0;
    int64_t v;
    /* data */
    t->have_data = ts_config_isset(cfg, "data.path");
    if (t->have_data) {
        const char *path;
        ts_dataset_opts dso;
        double valf;
        TS_CHECK(ts_config_get_str(cfg, "data.path", &path));
        TS_CHECK(ts_dataset_opts_from_config(cfg, &dso));
        if (t->L->grid->sp > 1) memcpy(dso.box_hint, t->L->box, sizeof dso.box_hint); /* the chunk cache for a box */
        TS_CHECK(ts_dataset_open(t->L->grid->world, path, &dso, &t->ds));
        dso.check = 0; /* checked once above */
        TS_CHECK(ts_dataset_open(t->L->grid->world, path, &dso, &t->eval_ds));
        int64_t n = ts_dataset_count(t->ds);
        if (ts_dataset_channels(t->ds) != t->ucfg.in_channels)
            TS_FAIL(TS_ERR_CONFIG, "%s has %d image channels, model.in_channels is %d", path,
                    ts_dataset_channels(t->ds), t->ucfg.in_channels);
        if (ts_dataset_classes(t->ds) > t->ucfg.classes)
            TS_FAIL(TS_ERR_CONFIG, "%s has %d classes, model.classes is %d", path, ts_dataset_classes(t->ds),
                    t->ucfg.classes);
        TS_CHECK(ts_config_get_float(cfg, "data.val_fraction", &valf));
        TS_CHECK(ts_config_get_int(cfg, "data.split_seed", &v));
        t->nval = (int64_t)floor(valf * (double)n);
        if (t->nval >= n) t->nval = n - 1;
        t->ntrn = n - t->nval;
        t->trn = malloc(sizeof *t->trn * (size_t)t->ntrn);
        t->val = malloc(sizeof *t->val * (size_t)(t->nval ? t->nval : 1));
        if (!t->trn || !t->val) TS_FAIL(TS_ERR_NOMEM, "split");
        ts_sampler_split(n, t->nval, (uint64_t)v, t->trn, t->val);
        TS_CHECK(setup_folds(t, cfg, n, valf, (uint64_t)v));
        int det;
        TS_CHECK(ts_config_get_bool(cfg, "train.deterministic", &det));
        if (det && t->batch * t->L->dp_size > t->ntrn)
            TS_FAIL(TS_ERR_CONFIG,
                    "train.deterministic: the global micro-batch (train.batch %d x %d replicas) is larger than the %lld "
                    "training samples of %s; every step would repeat samples within a batch",
                    t->batch, t->L->dp_size, (long long)t->ntrn, path);
    }
cleanup:
    return err;
}

/* the pipeline cut, the memory check, then the loader (on the stages that take data) or synthetic buffers */
static int setup_loader(trainer *t, const ts_config *cfg, setup_ctx *c)
{
    int err = 0;
    int lerr = 0;
    /* the pipeline's cut: given, or balanced by a timing pass on every rank */
    TS_CHECK(ts_pipeline_create_on(t->model, t->L, t->batch, t->stage_first, t->unit_cost, &t->pipe));
    {
        ts_loader_opts lo0;
        TS_CHECK(ts_loader_opts_from_config(cfg, &lo0));
        double read_bytes = 0; /* what the loader allocates for an augmented patch (at most the largest volume) */
        if (t->have_data && lo0.patch.augment) {
            int64_t vol[3] = {0, 0, 0};
            for (int64_t i = 0; i < ts_dataset_count(t->eval_ds); i++) {
                ts_sample_info in;
                TS_CHECK(ts_dataset_info(t->eval_ds, i, &in));
                for (int d = 0; d < 3; d++) vol[d] = in.shape[d + 1] > vol[d] ? in.shape[d + 1] : vol[d];
            }
            read_bytes = ts_patch_read_bytes(&lo0.patch, t->L->box, t->ucfg.in_channels, vol);
        }
        TS_CHECK(ts_err_agree(t->L->grid->world,
                              check_memory(t, ts_config_isset(cfg, "data.path") ? lo0.prefetch : 0, read_bytes)));
    }
    /* data, part 2: the loader (on the stages that take data), or synthetic buffers */
    if (t->have_data) {
        const char *path;
        ts_loader_opts lo;
        TS_CHECK(ts_config_get_str(cfg, "data.path", &path));
        TS_CHECK(ts_loader_opts_from_config(cfg, &lo));
        lo.batch = t->batch;
        lo.seed = (uint64_t)c->seed;
        lo.mode = TS_SAMPLER_TRAIN;
        lo.subset = t->trn;
        lo.nsubset = t->ntrn;
        if (t->L->grid->sp > 1) { /* this rank's box of every patch; the group finishes the augmentation */
            memcpy(lo.sub_lo, t->L->box_lo, sizeof lo.sub_lo);
            memcpy(lo.sub_size, t->L->box, sizeof lo.sub_size);
            lo.group = ts_spatial_comm(t->L->spatial);
        }
        /* the stages that take data: the first (images) and the last (labels) */
        if (!t->pipe || ts_pipeline_first(t->pipe) || ts_pipeline_last(t->pipe))
            lerr = ts_loader_create(t->ds, t->L->dp_rank, t->L->dp_size, &lo, &t->loader);
        TS_CHECK(ts_err_agree(t->L->grid->world, lerr));
        t->epoch_steps = (t->ntrn + (int64_t)t->batch * t->L->dp_size * t->L->micro - 1) / ((int64_t)t->batch * t->L->dp_size * t->L->micro);
        TS_CHECK(ts_err_agree(t->L->grid->world, check_eval_memory(t)));
    } else {
        const ts_unet_cfg *u = &t->ucfg;
        int64_t nv = t->L->box[0] * t->L->box[1] * t->L->box[2];
        t->syn_img = malloc(sizeof(float) * (size_t)(t->batch * u->in_channels * nv));
        t->syn_lab = malloc((size_t)(t->batch * nv));
        if (!t->syn_img || !t->syn_lab) TS_FAIL(TS_ERR_NOMEM, "synthetic batch");
        t->epoch_steps = 0;
    }
cleanup:
    return err;
}

/* steps, global batch, learning rate */
static int setup_schedule(trainer *t, const ts_config *cfg, setup_ctx *c)
{
    int err = 0;
    int64_t epochs, steps;
    TS_CHECK(ts_config_get_int(cfg, "train.epochs", &epochs));
    TS_CHECK(ts_config_get_int(cfg, "train.steps", &steps));
    if (epochs > 0 && !t->have_data)
        TS_FAIL(TS_ERR_CONFIG, "train.epochs needs a dataset (data.path); without one use train.steps");
    t->total_steps = epochs > 0 ? epochs * t->epoch_steps : steps;
    t->opt.cfg.total_steps = t->total_steps;
    TS_CHECK(ts_config_get_int(cfg, "train.base_batch", &c->base));
    TS_CHECK(ts_config_get_str(cfg, "train.lr_scaling", &c->scaling));
    c->global = (int64_t)t->batch * t->L->micro * t->L->dp_size;
    if (c->base == 0) c->base = (int64_t)t->batch * t->L->micro;
    c->base_lr = t->opt.cfg.lr;
    if (!strcmp(c->scaling, "linear")) t->opt.cfg.lr = c->base_lr * (double)c->global / (double)c->base;
cleanup:
    return err;
}

/* the run directory and what the run says about its setup */
static int setup_run_dir(trainer *t, const ts_config *cfg, const char *name, setup_ctx *c)
{
    int err = 0;
    if (ts_config_isset(cfg, "run.dir")) {
        const char *d;
        TS_CHECK(ts_config_get_str(cfg, "run.dir", &d));
        if (strlen(d) + sizeof "/ckpt/.tmp-step-18446744073709551615/manifest.json" > sizeof c->dir)
            TS_FAIL(TS_ERR_CONFIG, "run.dir (%s) is %zu characters long; at most %zu are supported", ts_config_source(cfg, "run.dir"),
                    strlen(d), sizeof c->dir - sizeof "/ckpt/.tmp-step-18446744073709551615/manifest.json");
        snprintf(c->dir, sizeof c->dir, "%s", d);
    } else {
        snprintf(c->dir, sizeof c->dir, "runs/%s", name);
    }
    double logsec;
    TS_CHECK(ts_config_get_float(cfg, "train.log_seconds", &logsec));
    TS_CHECK(ts_run_open(&t->run, t->L->grid->world, c->dir, cfg, logsec));
    char layout[512], path[1100];
    ts_grid_describe(t->L->grid, layout, sizeof layout);
    ts_run_say(&t->run, "tessera train: %s", layout);
    if (t->L->grid->sp > 1)
        ts_run_say(&t->run, "spatial split: data.patch %lldx%lldx%lld over sp %d as %dx%dx%d (D x H x W): every rank holds "
                   "a box of %lldx%lldx%lld; layout in %s/grid.json",
                   (long long)t->ucfg.patch[0], (long long)t->ucfg.patch[1], (long long)t->ucfg.patch[2], t->L->grid->sp,
                   t->L->sp_dims[0], t->L->sp_dims[1], t->L->sp_dims[2], (long long)t->L->box[0], (long long)t->L->box[1],
                   (long long)t->L->box[2], c->dir);
    ts_run_say(&t->run, "memory plan per rank: about %.0f MiB (activations and gradients %.0f, parameters and optimizer "
               "%.0f, data %.0f, halo buffers %.0f, scratch %.0f, evaluation %.0f, process at start %.0f)%s",
               t->mem_plan.total_mb, t->mem_plan.activations_mb, t->mem_plan.params_mb, t->mem_plan.data_mb,
               t->mem_plan.halo_mb, t->mem_plan.scratch_mb, t->mem_plan.eval_mb, t->mem_plan.process_mb,
               t->mem_limit_mb > 0 ? " within run.mem_limit_mb" : "");
    if (t->ucfg.ckpt_levels) {
        char lv[64];
        ts_run_say(&t->run, "activation checkpointing: levels %s recomputed in backward (model.checkpoint_levels)",
                   ts_unet_checkpoint_str(t->ucfg.ckpt_levels, lv, sizeof lv));
    }
    {
        int coords[3];
        ts_spatial_coords(t->L->spatial, coords);
        snprintf(path, sizeof path, "%s/grid.json", c->dir);
        TS_CHECK(ts_grid_write_layout(t->L->grid, path, t->L->sp_dims, coords, t->L->box_lo, t->L->box));
    }
    ts_run_say(&t->run, "global batch %lld = train.batch %d x %d micro-batches x dp %d; lr %.6g (train.lr %.6g, %s scaling "
               "from base batch %lld, %lld warm-up steps); %lld steps; run directory %s",
               (long long)c->global, t->batch, t->L->micro, t->L->dp_size, t->opt.cfg.lr, c->base_lr, c->scaling, (long long)c->base,
               (long long)t->opt.cfg.warmup_steps, (long long)t->total_steps, c->dir);
    if (t->have_data)
        ts_run_say(&t->run, "data: %lld training and %lld validation samples%s", (long long)t->ntrn, (long long)t->nval,
                   t->nval ? "" : " (evaluation uses the training volumes)");
    else
        ts_run_say(&t->run, "data: none (data.path unset): random images and labels of the configured patch");
cleanup:
    return err;
}

/* the step: gradient buckets during backward, synchronised batch norm, pipeline, compression,
 * sharded optimizer, the activations, the perf machinery */
static int setup_stepper(trainer *t, const ts_config *cfg, setup_ctx *c)
{
    int err = 0;
    TS_CHECK(ts_stepper_create(t->model, &t->opt, t->L->grad_reduce, t->L->spec.bucket_mb, t->sync_bn, t->L->spatial,
                               &t->stepper));
    ts_stepper_set_loss_scale(t->stepper, t->ls.scale);
    if (t->ucfg.precision == TS_PREC_FP16)
        ts_run_say(&t->run, "precision: fp16 convolution operands (rounded to IEEE half, fp32 arithmetic: fp16 numerics, not "
                   "speed), dynamic loss scale %g doubled after %lld good steps; weights, norms, loss, optimizer fp32",
                   t->ls.scale, (long long)t->ls.interval);
    else
        ts_run_say(&t->run, "precision: %s convolutions%s%s%s; weights, norms, loss, optimizer fp32",
                   t->ucfg.precision == TS_PREC_BF16 ? "bf16" : "fp32", t->ucfg.precision == TS_PREC_BF16 ? " (" : "",
                   t->ucfg.precision == TS_PREC_BF16 ? ts_nn_bf16_isa() : "",
                   t->ucfg.precision == TS_PREC_BF16 ? " kernels, chosen at run time)" : "");
    if (t->ucfg.norm == TS_NORM_BATCH && t->L->grid->dp > 1 && !t->sync_bn) /* said, not silently different */
        ts_run_say(&t->run, "note: batch norm with %d replicas and model.sync_bn = false: each replica normalises its own "
                   "micro-batch of %d (as PyTorch DDP), so training differs from one rank with the global batch; "
                   "model.sync_bn = true computes one rank's statistics (docs/parallelism.md, \"Equal to one rank\")",
                   t->L->grid->dp, t->batch);
    if (t->pipe) {
        TS_CHECK(ts_stepper_set_pipeline(t->stepper, t->pipe, t->L->grid->pp_comm));
        TS_CHECK(report_cut(t, c->dir));
    }
    if (t->L->grad_kind == TS_GRAD_COMPRESS) { /* gradient compression (src/parallel/dp.c) */
        char line[1024];
        ts_dp_compress comp; /* with sp > 1 only the reduction over replicas is compressed */
        ts_layout_compress(t->L, &comp);
        TS_CHECK(ts_stepper_set_compress(t->stepper, &comp));
        ts_dp_compress_describe(ts_stepper_dp(t->stepper), line, sizeof line);
        ts_run_say(&t->run, "%s", line);
    }
    TS_CHECK(start_zero(t));
    /* the box's activations, now that the split is set: a rank that cannot allocate them fails with all */
    TS_CHECK(ts_err_agree(t->L->grid->world, ts_unet_setup(t->model, t->batch, (int)t->L->box[0], (int)t->L->box[1], (int)t->L->box[2])));
    {
        const char *events;
        int timers;
        char line[2048];
        TS_CHECK(ts_config_get_str(cfg, "perf.papi_events", &events));
        TS_CHECK(ts_config_get_bool(cfg, "perf.timers", &timers));
        TS_CHECK(ts_perf_create(t->L->grid->world, TS_PH_COUNT, ts_phase_names, events, timers, &t->perf));
        ts_stepper_set_perf(t->stepper, t->perf);
        ts_perf_describe(t->perf, line, sizeof line);
        ts_run_say(&t->run, "perf: %s; per phase and per rank in %s/perf.json", line, c->dir);
    }
cleanup:
    return err;
}

static int setup(trainer *t, const ts_config *cfg, MPI_Comm world, const char *name)
{
    int err = 0;
    setup_ctx c;
    memset(&c, 0, sizeof c);
    TS_CHECK(setup_grid(t, cfg, world));
    TS_CHECK(setup_model(t, cfg, &c));
    TS_CHECK(setup_data(t, cfg));
    TS_CHECK(setup_loader(t, cfg, &c));
    TS_CHECK(setup_schedule(t, cfg, &c));
    TS_CHECK(setup_run_dir(t, cfg, name, &c));
    TS_CHECK(setup_stepper(t, cfg, &c));
    {
        int on;
        const char *ed;
        TS_CHECK(ts_config_get_bool(cfg, "ckpt.emergency", &on));
        TS_CHECK(ts_config_get_str(cfg, "ckpt.emergency_dir", &ed));
        if (on && ed[0]) TS_CHECK(ts_path_fmt(t->edir, sizeof t->edir, "ckpt.emergency_dir", "%s", ed));
        else if (on) TS_CHECK(ts_path_fmt(t->edir, sizeof t->edir, "ckpt.emergency_dir", "%s/emergency", t->run.dir));
    }
    TS_CHECK(resume(t));
    t->last_avg = t->step; /* a checkpoint holds one model */
    TS_CHECK(emergency_arm(t));
cleanup:
    return err;
}

static void teardown(trainer *t)
{
    ts_run_close(&t->run);
    ts_stepper_destroy(&t->stepper);
    ts_pipeline_destroy(&t->pipe);
    ts_perf_destroy(&t->perf);
    ts_loader_destroy(&t->loader);
    ts_dataset_close(&t->ds);
    ts_dataset_close(&t->eval_ds);
    ts_unet_destroy(&t->model);
    ts_layout_destroy(&t->L);
    free(t->trn);
    free(t->val);
    free(t->syn_img);
    free(t->syn_lab);
}

/* ---- one optimizer step ---- */
/* the pipeline's data: each micro-batch in order, on the first and last stages */
static int pipe_next(void *ctx, ts_tensor *img, ts_tensor *lab)
{
    return next_batch(ctx, img, lab);
}

/* error context: the samples of the batch that failed (names and file) */
static int batch_ctx(const trainer *t, int rc)
{
    if (!rc || rc == TS_ERR_REMOTE || !t->have_data || !t->cur) return rc; /* another rank's batch failed */
    char names[400] = "";
    size_t len = 0;
    for (int b = 0; b < t->batch && b < TS_LOADER_MAX_BATCH && len + 1 < sizeof names; b++) {
        ts_sample_info si = {0};
        if (t->cur->sample[b] < 0 || ts_dataset_info(t->ds, t->cur->sample[b], &si)) continue;
        int k = snprintf(names + len, sizeof names - len, "%s%lld (%s)", len ? ", " : "", (long long)t->cur->sample[b],
                         si.name ? si.name : "?");
        if (k > 0) len += (size_t)k;
    }
    return TS_CTX(rc, "the batch of samples %s of %s", names, ts_dataset_path(t->ds));
}

/* train.dump_grads: the first step's reduced gradients and buffers (grad_dump.h) */
static int dump_grads(trainer *t, double loss)
{
    const char *path;
    t->grads_dumped = 1;
    TS_TRY(ts_config_get_str(t->cfg, "train.dump_grads", &path));
    if (!path || !*path) return 0;
    ts_grad_share sh = {0, t->arena->n, 0, NULL, NULL};
    if (t->pipe) {
        int u0, u1, slots, x;
        ts_unet_stage(t->model, &u0, &u1, &slots);
        ts_unet_unit_params(t->model, u0, &sh.e0, &x);
        ts_unet_unit_params(t->model, u1 - 1, &x, &sh.e1);
    }
    ts_stepper_shard(t->stepper, &sh.npieces, &sh.plo, &sh.plen);
    TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, t->L->grid->world));
    loss /= t->L->grid->size; /* every rank holds its replica's loss */
    TS_TRY(ts_grad_dump(path, t->arena, t->L->grid, &sh, loss, t->step + 1));
    ts_run_say(&t->run, "gradients of step %lld: %s", (long long)(t->step + 1), path);
    return 0;
}

/* *skipped: 0 the step was applied; 1 skipped for a non-finite loss or
 * gradient (counts toward fault.max_bad_steps); 2 skipped for an fp16
 * loss-scale overflow (finite loss, non-finite gradients: the scale halves) */
static int train_step(trainer *t, double *loss_out, int *skipped)
{
    double loss_sum = 0;
    *skipped = 0;
    if (ts_fault_at(TS_FAULT_MPIERR, ts_fault_step(), NULL)) /* injected: what a broken connection returns */
        return ts_err_mpi(MPI_ERR_OTHER, __FILE__, __LINE__, "MPI_Allreduce (injected by TESSERA_FAULT=mpierr)");
    const int inject = ts_fault_at(TS_FAULT_OVERFLOW, ts_fault_step(), NULL); /* injected: this rank's gradients overflow */
    if (inject) ts_stepper_inject_overflow(t->stepper, 1);
    if (t->pipe) {
        /* (an error on one stage leaves its neighbours waiting for its messages: the job's exit grace ends it) */
        double loss = 0;
        TS_TRY(ts_stepper_pipe_step(t->stepper, pipe_next, t, &loss));
        TS_MPI_TRY(TS_WATCHED("pipeline loss", MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, t->L->grid->pp_comm))); /* the last stage's */
        loss_sum = loss * t->L->micro;
    } else {
        for (int a = 0; a < t->accum; a++) {
            ts_tensor img, lab;
            double loss;
            TS_TRY(ts_err_agree(t->L->grid->world, next_batch(t, &img, &lab)));
            TS_TRY(batch_ctx(t, ts_stepper_micro(t->stepper, &img, &lab, a == 0, a == t->accum - 1, &loss)));
            loss_sum += loss;
        }
    }
    if (ts_fault_at(TS_FAULT_NAN, ts_fault_step(), NULL)) { /* injected: this rank's loss and gradients */
        loss_sum = NAN;
        ts_stepper_poison(t->stepper);
    }
    if (inject) ts_stepper_inject_overflow(t->stepper, 0);
    TS_TRY(ts_stepper_reduce(t->stepper, t->L->micro));
    if (!t->grads_dumped) TS_TRY(dump_grads(t, loss_sum / t->L->micro));
    /* a non-finite loss or gradient on any rank: every rank skips the optimizer step together; with fp16 a
     * finite loss and non-finite gradients are a loss-scale overflow (the scale halves on every rank) */
    int bad[2] = {!isfinite(loss_sum), !ts_stepper_grads_finite(t->stepper)};
    TS_MPI_TRY(TS_WATCHED("bad-step agreement", MPI_Allreduce(MPI_IN_PLACE, bad, 2, MPI_INT, MPI_MAX, t->L->grid->world)));
    if (bad[0] || bad[1]) {
        t->opt.step++; /* the schedule moves on as if the step had been taken */
        *skipped = 1;
        if (t->ls.dynamic && !bad[0] && !ts_loss_scaler_update(&t->ls, 1)) {
            *skipped = 2;
            ts_stepper_set_loss_scale(t->stepper, t->ls.scale);
        }
    } else {
        ts_emergency_begin_update(); /* the parameters change until the step is committed */
        TS_TRY(ts_stepper_apply(t->stepper));
        if (t->ls.dynamic) {
            ts_loss_scaler_update(&t->ls, 0);
            ts_stepper_set_loss_scale(t->stepper, t->ls.scale);
        }
    }
    if (t->L->spec.local_steps <= 1 ? t->L->dp_size > 1 : ts_coll_size(t->L->grad_reduce) > t->L->grid->sp)
        t->grad_xreplica++;
    if (t->L->spec.local_steps > 1 && (t->step + 1) % t->L->spec.local_steps == 0) {
        ts_emergency_begin_update();
        TS_TRY(local_average(t, t->step + 1));
    }
    *loss_out = loss_sum / t->L->micro;
    return 0;
}

/* perf.json's "pipeline": per stage (the largest over the stage's ranks)
 * busy, span, idle and message time, the bubble fraction idle / span
 * next to (P - 1) / (M + P - 1); appended to extra. Collective on world. */
static int pipeline_perf(trainer *t, char *extra, size_t n)
{
    if (!t->pipe) return 0;
    enum { NV = 5 };
    const int P = t->L->grid->pp;
    const ts_pipeline_stats *ps = ts_pipeline_get_stats(t->pipe);
    double *v = TS_CALLOC((size_t)P * NV, sizeof *v);
    if (!v) return TS_ERR(TS_ERR_NOMEM, "pipeline figures");
    const int s = t->L->grid->p;
    v[s * NV + 0] = ps->busy_s;
    v[s * NV + 1] = ps->span_s;
    v[s * NV + 2] = ps->p2p_s;
    v[s * NV + 3] = ps->wait_s;
    v[s * NV + 4] = ps->bytes;
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, P * NV, MPI_DOUBLE, MPI_MAX, t->L->grid->world);
    if (rc != MPI_SUCCESS) {
        free(v);
        return ts_err_mpi(rc, __FILE__, __LINE__, "MPI_Allreduce (pipeline figures)");
    }
    const char *sched = t->L->spec.schedule == TS_PIPE_GPIPE ? "gpipe" : "1f1b";
    size_t l = strlen(extra);
    l += (size_t)snprintf(extra + l, n - l,
                          ",\n  \"pipeline\": {\"stages\": %d, \"microbatches\": %d, \"schedule\": \"%s\", "
                          "\"bubble_formula\": %.6f, \"stage\": [", P, t->L->micro, sched, ts_pipe_bubble(P, t->L->micro));
    char units[512], name[32];
    for (int k = 0; k < P && l < n; k++) {
        size_t u = 0;
        for (int x = t->stage_first[k]; x < t->stage_first[k + 1]; x++)
            u += (size_t)snprintf(units + u, sizeof units - u, "%s%s", x > t->stage_first[k] ? "," : "",
                                  ts_unet_unit_name(t->model, x, name, sizeof name));
        const double *w = v + k * NV, idle = w[1] - w[0] > 0 ? w[1] - w[0] : 0;
        l += (size_t)snprintf(extra + l, n - l,
                              "%s\n    {\"units\": \"%s\", \"busy_s\": %.6f, \"span_s\": %.6f, \"idle_s\": %.6f, "
                              "\"p2p_s\": %.6f, \"wait_s\": %.6f, \"bubble\": %.4f, \"bytes_sent\": %.0f}",
                              k ? "," : "", units, w[0], w[1], idle, w[2], w[3], w[1] > 0 ? idle / w[1] : 0, w[4]);
    }
    if (l < n) snprintf(extra + l, n - l, "]}");
    free(v);
    return 0;
}

/* the settings of the training loop */
typedef struct loop_cfg {
    int64_t log_every, eval_every, ckpt_every, warmup, max_bad;
    int final_eval;
    double fault_timeout, every_min;
    int64_t per_step; /* samples per step over all replicas */
} loop_cfg;

/* the loop's running sums between log lines */
typedef struct loop_state {
    double t_window, loss_window, t_train0, train_s, last_ckpt, step_mean;
    int64_t steps_window, first;
    int bad_steps;
} loop_state;

/* A step whose optimizer step was skipped (2: fp16 overflow, 1: non-finite): said, counted, and the run
 * stopped after fault.max_bad_steps in a row. */
static int after_skip(trainer *t, const loop_cfg *lc, loop_state *ls, int skipped)
{
    int err = 0;
    if (skipped == 2) {
        ts_run_say(&t->run, "step %lld: fp16 gradients overflowed on some rank: the optimizer step is skipped on every "
                   "rank and the loss scale halves to %g (not a bad step for fault.max_bad_steps)",
                   (long long)t->step, t->ls.scale);
    } else if (skipped) {
        ls->bad_steps++;
        ts_run_say(&t->run, "step %lld: non-finite loss or gradients on some rank: the optimizer step is skipped on "
                   "every rank (%d of fault.max_bad_steps = %lld in a row)", (long long)t->step, ls->bad_steps,
                   (long long)lc->max_bad);
        if (ls->bad_steps >= lc->max_bad) {
            TS_CHECK(ts_run_metrics(&t->run, t->step, t->epoch_steps ? (t->step - 1) / t->epoch_steps : 0, NAN,
                                    ts_optim_lr(&t->opt.cfg, t->step - 1), 0, NULL, NULL, NULL, 0, NULL));
            TS_FAIL(TS_ERR_NUMERIC, "%d steps in a row with a non-finite loss or gradients (up to step %lld): the run "
                    "stops (fault.max_bad_steps); checkpoints in %s/ckpt are only ever written from finite "
                    "parameters, the newest resumes (lower train.lr, or set train.clip_norm)", ls->bad_steps,
                    (long long)t->step, t->run.dir);
        }
    } else {
        ls->bad_steps = 0;
    }
cleanup:
    return err;
}

/* Collective. The mean loss over replicas, progress, metrics every train.log_every steps and the evaluation
 * when due. */
static int log_and_eval(trainer *t, const loop_cfg *lc, loop_state *ls, double loss, double *dice)
{
    int err = 0;
    /* the loss people see: the mean over replicas */
    double lsum = loss;
    TS_CHECK(ts_coll_allreduce(t->L->grad, TS_IN_PLACE, &lsum, 1, TS_FLOAT64, TS_OP_AVG));
    ls->loss_window += lsum;
    ls->steps_window++;
    double now = ts_time_now(), sps = (double)(ls->steps_window * lc->per_step) / (now - ls->t_window);
    ts_run_progress(&t->run, t->step, lsum, sps, 0);
    int do_eval = t->have_data && ((lc->eval_every > 0 && t->step % lc->eval_every == 0) || (lc->final_eval && t->step == t->total_steps));
    if (t->step % lc->log_every == 0 || t->step == t->total_steps || do_eval) {
        ls->train_s += now - ls->t_train0;
        /* rank 0 writes: a full disk there fails every rank before the next collective */
        TS_CHECK(ts_err_agree(t->L->grid->world,
                              ts_run_metrics(&t->run, t->step, t->epoch_steps ? (t->step - 1) / t->epoch_steps : 0,
                                             ls->loss_window / ls->steps_window, ts_optim_lr(&t->opt.cfg, t->step - 1), sps,
                                             NULL, NULL, NULL, 0, NULL)));
        ls->loss_window = 0;
        ls->steps_window = 0;
        ls->t_window = ts_time_now();
        ls->t_train0 = ls->t_window;
    }
    if (do_eval) {
        double hd95[TS_IO_MAX_CLASSES], nsd[TS_IO_MAX_CLASSES];
        int surface = 0;
        TS_CHECK(evaluate(t, dice, hd95, nsd, &surface));
        report_dice(t, dice, surface ? hd95 : NULL, surface ? nsd : NULL);
        const char *names[256];
        for (int k = 0; k < t->ucfg.classes; k++) names[k] = ts_dataset_class_name(t->eval_ds, k);
        TS_CHECK(ts_err_agree(t->L->grid->world,
                              ts_run_metrics(&t->run, t->step, t->epoch_steps ? (t->step - 1) / t->epoch_steps : 0, lsum,
                                             ts_optim_lr(&t->opt.cfg, t->step - 1), sps, dice, surface ? hd95 : NULL,
                                             surface ? nsd : NULL, t->ucfg.classes, names)));
        ls->t_window = ls->t_train0 = ts_time_now();
    }
cleanup:
    return err;
}

/* Collective. A checkpoint when due (by step, by the clock on any rank, at the end, or on a stop request on
 * any rank); a stop request ends the run after it (TS_ERR_STOPPED). */
static int checkpoint_or_stop(trainer *t, const loop_cfg *lc, loop_state *ls, int skipped,
                              volatile sig_atomic_t *stop)
{
    int err = 0;
    /* a stop request on any rank (preemption), or a checkpoint due by the clock (any rank's): leave or
     * checkpoint together; not right after a step skipped as bad (the streak may not be over; an fp16
     * overflow is not one) */
    int flags[2] = {stop && *stop ? 1 : 0, lc->every_min > 0 && ts_time_now() - ls->last_ckpt >= 60 * lc->every_min};
    TS_MPI(TS_WATCHED("checkpoint/stop agreement", MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MAX, t->L->grid->world)));
    const int stopping = flags[0];
    if (((lc->ckpt_every > 0 && t->step % lc->ckpt_every == 0) || t->step == t->total_steps || stopping || flags[1]) &&
        !(skipped == 1 && !stopping && t->step < t->total_steps)) {
        TS_CHECK(save_ckpt(t));
        ls->last_ckpt = ts_time_now();
    }
    if (stopping && t->step < t->total_steps) {
        TS_CHECK(ts_err_agree(t->L->grid->world, ts_run_mark_stopped(&t->run, t->step, t->total_steps)));
        ts_run_say(&t->run, "stop requested (signal): checkpoint written at step %lld of %lld; run the same command "
                   "again to continue", (long long)t->step, (long long)t->total_steps);
        TS_FAIL(TS_ERR_STOPPED, "stopped by a signal at step %lld of %lld after writing the checkpoint in %s/ckpt; "
                "rerun the same command to resume", (long long)t->step, (long long)t->total_steps, t->run.dir);
    }
cleanup:
    return err;
}

/* the perf.json fields beyond the phases: batch, grid, halo, memory, data-parallel reductions, optimizer
 * state, precision (collective: the loss-scale extremes) */
static int perf_extra(trainer *t, const loop_cfg *lc, const ts_spatial_stats *hs, const double hv[5], int64_t steps,
                      char *extra, size_t n)
{
    int err = 0;
    const double hidden = ts_perf_seconds(t->perf, TS_PH_COMM_TOTAL) - ts_perf_seconds(t->perf, TS_PH_COMM_EXPOSED);
    snprintf(extra, n,
             "\"global_batch\": %lld, \"dp\": %d, \"buckets\": %d, \"sync_bn\": %s, "
             "\"buckets_in_backward\": %.1f, \"comm_hidden_s\": %.6f,\n  \"grid\": {\"dp\": %d, \"pp\": %d, \"sp\": %d}, \"sp_dims\": [%d, %d, %d], "
             "\"box\": [%lld, %lld, %lld],\n  \"halo\": {\"exposed_s\": %.6f, \"hidden_s\": %.6f, \"sums_s\": %.6f, "
             "\"bytes\": %.0f, \"exchanges_per_step\": %.1f},\n  \"memory\": {\"peak_rss_mb\": %.1f, \"plan_mb\": %.1f, "
             "\"activations_mb\": %.1f, \"limit_mb\": %lld}",
             (long long)lc->per_step, t->L->dp_size, ts_stepper_buckets(t->stepper), t->sync_bn ? "true" : "false",
             steps > 0 ? (double)(ts_stepper_times(t->stepper)->buckets_early - t->early0) / (double)steps : 0.0, hidden > 0 ? hidden : 0, t->L->grid->dp, t->L->grid->pp, t->L->grid->sp, t->L->sp_dims[0], t->L->sp_dims[1], t->L->sp_dims[2],
             (long long)t->L->box[0], (long long)t->L->box[1], (long long)t->L->box[2], hv[0], hv[1], hv[2], hv[3],
             steps > 0 ? (double)hs->exchanges / (double)steps : 0.0, hv[4], t->mem_plan.total_mb,
             t->mem_plan.activations_mb, (long long)t->mem_limit_mb);
    {
        size_t l = strlen(extra);
        snprintf(extra + l, n - l,
                 ",\n  \"dp_reductions\": {\"local_steps\": %d, \"local_sgd\": \"%s\", \"gradient\": %lld, "
                 "\"parameter_averages\": %lld}",
                 t->L->spec.local_steps, t->L->spec.local_node ? "node" : "global", (long long)t->grad_xreplica,
                 (long long)t->param_avgs);
        l = strlen(extra);
        snprintf(extra + l, n - l,
                 ",\n  \"optimizer_state\": {\"zero\": %d, \"shard_ranks\": %d, \"bytes_per_rank\": %.0f, "
                 "\"bytes_whole\": %.0f}", t->L->spec.zero, t->L->spec.zero ? ts_coll_size(t->L->grad) : 1, t->state_bytes_max,
                 (double)t->arena->nparam * ts_optim_state_count(&t->opt.cfg) * sizeof(float));
    }
    {
        /* the precision, and the loss scale and its overflows as every rank saw them (min, max over ranks) */
        double lv[4] = {-t->ls.scale, t->ls.scale, -(double)t->ls.overflows, (double)t->ls.overflows};
        TS_MPI(TS_WATCHED("log line figures", MPI_Allreduce(MPI_IN_PLACE, lv, 4, MPI_DOUBLE, MPI_MAX, t->L->grid->world)));
        const ts_precision pr = t->ucfg.precision;
        size_t l = strlen(extra);
        snprintf(extra + l, n - l,
                 ",\n  \"precision\": {\"mode\": \"%s\", \"conv_kernels\": \"%s\", \"loss_scale\": %s, "
                 "\"loss_scale_min\": %.9g, \"loss_scale_max\": %.9g, \"overflow_steps_min\": %.0f, "
                 "\"overflow_steps_max\": %.0f}",
                 pr == TS_PREC_FP16 ? "fp16" : pr == TS_PREC_BF16 ? "bf16" : "fp32",
                 pr == TS_PREC_BF16 ? ts_nn_bf16_isa() : pr == TS_PREC_FP16 ? "fp32 on fp16-rounded operands" : "fp32",
                 t->ls.dynamic ? "\"dynamic\"" : "null", -lv[0], lv[1], -lv[2], lv[3]);
    }
cleanup:
    return err;
}

/* Collective. After the last step: samples/s of the slowest rank, perf.json, the closing line. */
static int finish_run(trainer *t, const loop_cfg *lc, const loop_state *ls)
{
    int err = 0;
    char extra[8192];
    int64_t steps = t->step - ls->first;
    /* samples/s of the slowest rank */
    double slow = t->step_s, sps = 0;
    TS_MPI(TS_WATCHED("log line figures", MPI_Allreduce(MPI_IN_PLACE, &slow, 1, MPI_DOUBLE, MPI_MAX, t->L->grid->world)));
    if (slow > 0) sps = (double)(steps * lc->per_step) / slow;
    /* halo exchange and spatial sums: per-rank phases, and their maxima here; peak memory (max over ranks) */
    const ts_spatial_stats *hs = ts_spatial_get_stats(t->L->spatial);
    ts_perf_add(t->perf, TS_PH_HALO_EXPOSED, hs->exposed_s);
    ts_perf_add(t->perf, TS_PH_HALO_HIDDEN, hs->hidden_s);
    ts_perf_add(t->perf, TS_PH_SPATIAL_SUMS, hs->sum_s);
    if (t->pipe) { /* pipeline stages: the stage's idle wait and its messages */
        const ts_pipeline_stats *ps = ts_pipeline_get_stats(t->pipe);
        ts_perf_add(t->perf, TS_PH_PP_WAIT, ps->wait_s - t->pp0.wait_s);
        ts_perf_add(t->perf, TS_PH_PP_P2P, ps->p2p_s - t->pp0.p2p_s);
    }
    double hv[5] = {hs->exposed_s, hs->hidden_s, hs->sum_s, (double)hs->bytes, ts_train_peak_rss_mb()};
    TS_MPI(TS_WATCHED("log line figures", MPI_Allreduce(MPI_IN_PLACE, hv, 5, MPI_DOUBLE, MPI_MAX, t->L->grid->world)));
    TS_CHECK(perf_extra(t, lc, hs, hv, steps, extra, sizeof extra));
    if (t->mem_limit_mb > 0 && hv[4] > (double)t->mem_limit_mb)
        ts_run_say(&t->run, "warning: peak resident memory %.0f MiB on some rank exceeded run.mem_limit_mb = %lld "
                   "(the plan said %.0f MiB)", hv[4], (long long)t->mem_limit_mb, t->mem_plan.total_mb);
    /* derived figures: the model's FLOPs for this rank's box (a stage's share with pp > 1, taken as 1/pp),
     * bytes the collectives move */
    ts_run_derived dv;
    memset(&dv, 0, sizeof dv);
    ts_unet_cost uc;
    int split[3] = {t->L->sp_dims[0] > 1, t->L->sp_dims[1] > 1, t->L->sp_dims[2] > 1};
    if (ts_unet_cost_of(&t->ucfg, t->batch * t->L->micro, t->L->box, split, &uc) == 0) {
        dv.flops_forward = uc.flops_forward / t->L->grid->pp;
        dv.flops_backward = uc.flops_backward / t->L->grid->pp;
        dv.spatial_sums = t->L->grid->sp > 1 ? uc.norms * 2 : 0;
    } else {
        ts_err_clear();
    }
    dv.grad_bytes = (double)t->arena->nparam * sizeof(float) / t->L->grid->pp;
    dv.grad_ranks = ts_coll_size(t->L->grad);
    dv.halo_bytes = steps > 0 ? (double)hs->bytes / (double)steps : 0;
    TS_CHECK(pipeline_perf(t, extra, sizeof extra));
    { /* gradient compression: bytes per step against float32 (src/parallel/dp.c) */
        size_t l = strlen(extra);
        if (l + 1024 < sizeof extra) {
            strcat(extra, ",\n  ");
            TS_CHECK(ts_dp_compress_json(ts_stepper_dp(t->stepper), t->L->grid->pp_comm, extra + l + 4, sizeof extra - l - 4));
        }
    }
    TS_CHECK(ts_run_perf(&t->run, t->L->grid->world, t->perf, steps, sps, &dv, extra));
    ts_run_say(&t->run, "done: %lld steps, %.2f samples/s; %s/metrics.jsonl, %s/perf.json", (long long)steps, sps,
               t->run.dir, t->run.dir);
cleanup:
    return err;
}

int ts_train_run(const ts_config *cfg, MPI_Comm world, const char *name, volatile sig_atomic_t *stop)
{
    trainer t;
    int err = 0;
    memset(&t, 0, sizeof t);
    double *dice = NULL;
    loop_cfg lc;
    loop_state ls;
    memset(&lc, 0, sizeof lc);
    memset(&ls, 0, sizeof ls);
    {
        /* the watchdog first: from here on no wait of this run hangs silently */
        double to;
        TS_CHECK(ts_config_get_float(cfg, "fault.timeout", &to));
        TS_CHECK(ts_watchdog_start(world, to, stop, 10.0));
    }
    TS_CHECK(setup(&t, cfg, world, name));
    TS_CHECK(ts_stepper_set_agree(t.stepper, t.L->grid->world));
    TS_CHECK(ts_config_get_float(cfg, "fault.timeout", &lc.fault_timeout));
    TS_CHECK(ts_config_get_int(cfg, "fault.max_bad_steps", &lc.max_bad));
    TS_CHECK(ts_config_get_float(cfg, "ckpt.every_minutes", &lc.every_min));
    TS_CHECK(ts_config_get_int(cfg, "train.log_every", &lc.log_every));
    TS_CHECK(ts_config_get_int(cfg, "eval.every", &lc.eval_every));
    TS_CHECK(ts_config_get_int(cfg, "ckpt.every", &lc.ckpt_every));
    TS_CHECK(ts_config_get_int(cfg, "perf.warmup_steps", &lc.warmup));
    TS_CHECK(ts_config_get_bool(cfg, "eval.final", &lc.final_eval));
    dice = calloc((size_t)t.ucfg.classes, sizeof *dice);
    if (!dice) TS_FAIL(TS_ERR_NOMEM, "dice");
    t.run.first_step = t.step;
    t.run.total_steps = t.total_steps;
    TS_CHECK(ts_err_agree(t.L->grid->world, ts_run_record_launch(&t.run, t.step, t.total_steps)));
    lc.per_step = (int64_t)t.batch * t.L->micro * t.L->dp_size;
    ls.t_window = ts_time_now();
    ls.first = t.step;
    ls.t_train0 = ts_time_now();
    ls.last_ckpt = ts_time_now();
    while (t.step < t.total_steps) {
        double ts0 = ts_time_now(), loss = 0;
        int skipped = 0;
        ts_fault_set_step(t.step + 1);
        ts_watch_set_step(t.step + 1);
        ts_fault_point(NULL); /* an injected kill */
        /* inside steps the watchdog's deadline is also a multiple of the measured step time */
        if (t.step - ls.first >= 3 && ls.step_mean > 0)
            ts_watchdog_set_timeout(fmin(lc.fault_timeout, fmax(30.0, 20 * ls.step_mean)));
        ts_perf_begin(t.perf, TS_PH_STEP);
        err = train_step(&t, &loss, &skipped);
        ts_perf_end(t.perf, TS_PH_STEP);
        if (err == TS_ERR_MPI) { /* a peer gone? then this rank writes what it holds and exits 76 (never returns) */
            char why[600];
            snprintf(why, sizeof why, "an MPI error in step %lld (%.500s)", (long long)t.step + 1, ts_err_message());
            ts_watchdog_end_if_peer_gone(why);
        }
        TS_CHECK(TS_CTX(err, "training step %lld (rank %d)", (long long)t.step + 1, t.L->grid->rank));
        ts_watchdog_set_timeout(lc.fault_timeout);
        t.step++;
        ts_emergency_commit(t.step, t.opt.step, t.loader ? ts_loader_position(t.loader) : 0,
                            t.ls.dynamic ? t.ls.scale : 0, t.ls.good);
        if (t.lost_at > 0) { /* the first step after a lost peer */
            ts_run_say(&t.run, "resumed after the loss of %s: step %lld done %.1f s after the loss", t.lost,
                       (long long)t.step, ts_wall_now() - t.lost_at);
            t.lost_at = 0;
        }
        t.step_s += ts_time_now() - ts0;
        ls.step_mean = ls.step_mean > 0 ? 0.8 * ls.step_mean + 0.2 * (ts_time_now() - ts0) : ts_time_now() - ts0;
        TS_CHECK(after_skip(&t, &lc, &ls, skipped));
        if (lc.warmup > 0 && t.step - ls.first == lc.warmup && t.step < t.total_steps) { /* perf.json from here on */
            const ts_spatial_stats zero = {0};
            ts_perf_reset(t.perf);
            ts_spatial_set_stats(t.L->spatial, &zero);
            if (t.pipe) t.pp0 = *ts_pipeline_get_stats(t.pipe);
            t.early0 = ts_stepper_times(t.stepper)->buckets_early;
            t.step_s = 0;
            ls.first = t.step;
            lc.warmup = 0;
        }
        TS_CHECK(log_and_eval(&t, &lc, &ls, loss, dice));
        TS_CHECK(checkpoint_or_stop(&t, &lc, &ls, skipped, stop));
    }
    ls.train_s += ts_time_now() - ls.t_train0;
    ts_run_progress(&t.run, t.step, 0, 0, 0);
    TS_CHECK(finish_run(&t, &lc, &ls));
cleanup:
    free(dice);
    ts_watchdog_on_end(NULL);
    ts_emergency_teardown();
    teardown(&t);
    ts_watchdog_stop();
    return err;
}
