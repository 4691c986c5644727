/* `tessera train`: the data-parallel training loop; see trainer.h.
 * Per step: next batch(es) from the prefetching loader -> forward, loss ->
 * backward, whose parameter gradients are handed to the bucket reducer as
 * they become final (tail of the arena first) -> wait for the buckets ->
 * optimizer. Then metrics, evaluation and checkpoints when due.
 * This file owns the loop: ts_train_run, one step, metrics, when to
 * evaluate and checkpoint (setup, checkpoints and evaluation are in
 * trainer_setup.c, trainer_ckpt.c, trainer_eval.c). It must not split
 * communicators or read parallel.* keys: the layout does
 * (src/parallel/layout.h). */
#include "tsbuild.h"
#include "src/train/trainer_impl.h"

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


/* averages the batch-norm buffers over the group (replicas then evaluate
 * and checkpoint the same model, as DDP's buffer broadcast does) */
int ts_trainer_sync_buffers(trainer *t)
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

/* ---- optimizer state (sharded with parallel.zero = 1: the gradient path's attach) ---- */
/* Once the gradient path is attached: says how much optimizer state each
 * rank holds. Collective on world. */
int ts_trainer_report_state(trainer *t)
{
    const ts_arena *a = t->arena;
    const int ns = ts_optim_state_count(&t->opt.cfg);
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
    if (t->arena->dev_master) TS_TRY(ts_arena_grads_to_host(t->arena)); /* reduced on the GPU */
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
    }
    /* the optimizer (unless skipped) and what the gradient path does after a step (local SGD's average) */
    TS_TRY(ts_gradpath_update(t->gp, t->step + 1, !*skipped));
    if (!*skipped && t->ls.dynamic) {
        ts_loss_scaler_update(&t->ls, 0);
        ts_stepper_set_loss_scale(t->stepper, t->ls.scale);
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
    const char *sched = ts_pipe_kind_name(t->L->spec.schedule);
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
        TS_CHECK(ts_trainer_evaluate(t, dice, hd95, nsd, &surface));
        ts_trainer_report_dice(t, dice, surface ? hd95 : NULL, surface ? nsd : NULL);
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
        TS_CHECK(ts_trainer_save_ckpt(t));
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
        ts_gradpath_stats gs;
        ts_gradpath_get_stats(t->gp, &gs);
        snprintf(extra + l, n - l,
                 ",\n  \"dp_reductions\": {\"path\": \"%s\", \"local_steps\": %d, \"local_sgd\": \"%s\", "
                 "\"gradient\": %lld, \"parameter_averages\": %lld}",
                 ts_gradpath_name(ts_gradpath_kind(t->gp)), t->L->spec.local_steps,
                 t->L->spec.local_node ? "node" : "global", (long long)gs.crossed, (long long)gs.param_averages);
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
    { /* gradient compression: bytes per step against float32 (src/parallel/buckets.c) */
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
    TS_CHECK(ts_trainer_setup(&t, cfg, world, name));
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
        if (t.edir[0]) { /* the state on the GPU: the emergency state reads the host's copy of this rank's range */
            size_t lo, hi;
            ts_stepper_param_range(t.stepper, &lo, &hi);
            TS_CHECK(ts_arena_pull(t.arena, lo, hi));
        }
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
    ts_trainer_teardown(&t);
    ts_watchdog_stop();
    return err;
}

