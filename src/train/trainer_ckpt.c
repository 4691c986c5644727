/* `tessera train`'s checkpoints and emergency state: what a checkpoint
 * holds, saving (the whole state gathered on rank 0, sharded optimizer
 * state included), resuming from ckpt.resume or from the survivors'
 * emergency state (src/train/emergency.h). Must not decide when to save:
 * the loop (trainer.c) does. */
#include "tsbuild.h"
#include "src/train/trainer_impl.h"

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

int ts_trainer_save_ckpt(trainer *t)
{
    float *full[TS_ARENA_MAX_STATE] = {NULL};
    int err = 0, n = 0;
    ts_ckpt_item *it = NULL;
    char dir[1100], path[4096], *text = NULL;
    size_t tlen = 0;
    int64_t keep;
    ts_perf_begin(t->perf, TS_PH_CKPT);
    TS_CHECK(ts_gradpath_sync(t->gp, t->step)); /* one model on every replica */
    TS_CHECK(ts_trainer_sync_buffers(t));
    { /* the state on the GPU: the host's copy of this rank's range, before the stages are gathered */
        size_t lo, hi;
        ts_stepper_param_range(t->stepper, &lo, &hi);
        TS_CHECK(ts_err_agree(t->L->grid->world, ts_arena_pull(t->arena, lo, hi)));
    }
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

int ts_trainer_emergency_arm(trainer *t)
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
int ts_trainer_resume(trainer *t)
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
    TS_CHECK(ts_err_agree(t->L->grid->world, ts_arena_push(t->arena))); /* the GPU's copy (mirror or master) */
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

