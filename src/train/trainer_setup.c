/* `tessera train`'s setup and teardown: the layout, the model, the data
 * and folds, the loader, the schedule, the run directory, the stepper on the
 * gradient path, the memory plan checked against run.mem_limit_mb. Every
 * check that can refuse a configuration runs here, before any step. Must
 * not train. */
#include "tsbuild.h"
#include "src/train/trainer_impl.h"

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

/* train.conv = winograd: the largest Winograd layer's scratch (item buffers,
 * transformed weights, the weight gradient's chunk sums; the buffers are
 * reused from layer to layer) and the transformed weights (with a copy of
 * the weights) that evaluation's forwards cache while the weights do not
 * change. The layers: the 3x3x3 convolutions, encoder l (in -> c_l, c_l ->
 * c_l), decoder l (2 c_l -> c_l, c_l -> c_l); those no Winograd driver
 * takes have no scratch, and only those with 16+ channels each side cache
 * (the few-output-channel driver transforms its weights on each call). */
static double winograd_mb(const ts_unet_cfg *u, int batch, const int64_t box[3])
{
    size_t scratch = 0;
    double cached = 0;
    for (int l = 0; l < u->levels; l++) {
        const int c = u->channels[l], cin = l ? u->channels[l - 1] : u->in_channels;
        const int pairs[4][2] = {{cin, c}, {c, c}, {2 * c, c}, {c, c}}, np = l < u->levels - 1 ? 4 : 2;
        const int D = (int)(box[0] >> l), H = (int)(box[1] >> l), W = (int)(box[2] >> l);
        for (int i = 0; i < np; i++) {
            const int C = pairs[i][0], OC = pairs[i][1];
            const size_t b = ts_conv3d_winograd_scratch_bytes(batch, D, H, W, C, OC, 0, 1);
            if (b > scratch) scratch = b;
            if (C >= 16 && OC >= 16 && OC <= 2048) cached += (64.0 * C * ((OC + 15) / 16 * 16) + 27.0 * C * OC) * 4;
        }
    }
    return ((double)scratch + cached) / 1048576.0;
}

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
    int split_any = 0;
    for (int d = 0; d < 3; d++) split_any |= sp_dims && sp_dims[d] > 1;
    if (u->conv_winograd && u->precision != TS_PREC_FP16 && u->engine != TS_ENGINE_CUDA && !split_any)
        mp->scratch_mb += winograd_mb(u, batch, box);
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
    TS_TRY(ts_trainer_eval_mirror_axes(t->cfg, &axes));
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
    const char *cut = t->L->spec.pp_cut, *sched = ts_pipe_kind_name(t->L->spec.schedule);
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
    TS_CHECK(ts_layout_create(world, &spec, &t->L));
    TS_CHECK(ts_gradpath_create(t->L, cfg, &t->gp)); /* its rules refuse on every rank before any work */
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
    { /* the engine: a GPU per rank where one is found and the layout runs there (train.engine) */
        const ts_grid *g = t->L->grid;
        char note[256];
        TS_CHECK(ts_err_agree(g->world, ts_unet_engine_choose(&t->ucfg, g->local_rank, note, sizeof note)));
        if (note[0] && t->L->world_rank == 0) fprintf(stderr, "tessera train: note: %s\n", note);
    }
    TS_CHECK(ts_unet_create(&t->ucfg, ts_gradpath_arena_states(t->gp, ts_optim_state_count(&t->opt.cfg)), &t->model));
    t->arena = ts_unet_arena(t->model);
    TS_CHECK(ts_config_get_int(cfg, "train.seed", &c->seed));
    TS_CHECK(ts_unet_init(t->model, (uint64_t)c->seed)); /* same c->seed everywhere: identical replicas */
    {
        const char *init;
        TS_CHECK(ts_config_get_str(cfg, "model.init", &init));
        if (*init) /* every rank reads the same file: identical replicas */
            TS_CHECK(ts_err_agree(t->L->grid->world, TS_CTX(ts_weights_load(t->arena, init), "model.init = %s", init)));
    }
    ts_spatial_split_model(t->model, t->L->spatial);
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
    TS_CHECK(ts_stepper_create(t->model, &t->opt, ts_gradpath_reduce_group(t->gp), t->L->spec.bucket_mb, t->sync_bn,
                               t->L->spatial, &t->stepper));
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
    TS_CHECK(ts_gradpath_attach(t->gp, t->stepper)); /* compression, the sharded optimizer */
    {
        char line[1024];
        ts_gradpath_describe(t->gp, line, sizeof line);
        ts_run_say(&t->run, "%s", line);
        if (ts_gradpath_kind(t->gp) == TS_GRAD_COMPRESS) { /* the compressor's bytes (src/parallel/buckets.c) */
            ts_dp_compress_describe(ts_stepper_dp(t->stepper), line, sizeof line);
            ts_run_say(&t->run, "%s", line);
        }
    }
    {
        char why[768];
        int on;
        TS_CHECK(ts_stepper_device_asked(t->stepper, t->L->grid->world, &on, why, sizeof why));
        if (on >= 0) {
            if (on)
                ts_run_say(&t->run, "state: parameters, gradients and optimizer state on the GPU (TESSERA_CUDA_STATE=device): "
                           "buckets reduced there while backward runs, the optimizer's kernels; the host's copy "
                           "refreshed for checkpoints");
            else
                ts_run_say(&t->run, "state: TESSERA_CUDA_STATE=device not taken, the host keeps the master copy: %s", why);
        }
    }
    TS_CHECK(ts_trainer_report_state(t));
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

int ts_trainer_setup(trainer *t, const ts_config *cfg, MPI_Comm world, const char *name)
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
    TS_CHECK(ts_trainer_resume(t));
    ts_gradpath_mark_synced(t->gp, t->step); /* a checkpoint holds one model */
    TS_CHECK(ts_trainer_emergency_arm(t));
cleanup:
    return err;
}

void ts_trainer_teardown(trainer *t)
{
    ts_run_close(&t->run);
    ts_stepper_destroy(&t->stepper);
    ts_pipeline_destroy(&t->pipe);
    ts_perf_destroy(&t->perf);
    ts_loader_destroy(&t->loader);
    ts_dataset_close(&t->ds);
    ts_dataset_close(&t->eval_ds);
    ts_unet_destroy(&t->model);
    ts_gradpath_destroy(&t->gp);
    ts_layout_destroy(&t->L);
    free(t->trn);
    free(t->val);
    free(t->syn_img);
    free(t->syn_lab);
}

