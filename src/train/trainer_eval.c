/* `tessera train`'s evaluation over the validation volumes: sliding-window
 * prediction on the layout's groups (src/infer/evaluate.h), Dice, and with
 * eval.surface HD95 and NSD. Must not change the model: it evaluates what
 * the replicas hold after an average. */
#include "tsbuild.h"
#include "src/train/trainer_impl.h"

/* ---- evaluation over validation volumes ---- */
static int pipe_forward(void *ctx, const ts_tensor *x, const ts_tensor **logits)
{
    return ts_pipeline_forward(ctx, x, logits);
}

/* eval.mirror's axes as a TS_EVAL_FLIP_* mask (x = W, y = H, z = D) */
int ts_trainer_eval_mirror_axes(const ts_config *cfg, int *axes)
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
int ts_trainer_evaluate(trainer *t, double *dice_out, double *hd95_out, double *nsd_out, int *surface_out)
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
    TS_CHECK(ts_gradpath_sync(t->gp, t->step)); /* one model on every replica */
    TS_CHECK(ts_config_get_int(t->cfg, "eval.max_volumes", &maxv));
    TS_CHECK(ts_config_get_float(t->cfg, "eval.overlap", &overlap));
    TS_CHECK(ts_config_get_float(t->cfg, "eval.nsd_tol", &tol));
    TS_CHECK(ts_config_get_bool(t->cfg, "eval.surface", &surface));
    TS_CHECK(ts_trainer_eval_mirror_axes(t->cfg, &axes));
    const ts_spatial_stats halo_before = *ts_spatial_get_stats(t->L->spatial); /* training's figures only */
    TS_CHECK(ts_trainer_sync_buffers(t));
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
        TS_CHECK(ts_eval_predict_mirror(&t->model, 1, t->L->replicas, t->L->grid->sp > 1 || t->pipe ? &es : NULL, img, dhw,
                                        overlap, t->batch, axes, pred, NULL, NULL));
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

void ts_trainer_report_dice(trainer *t, const double *dice, const double *hd95, const double *nsd)
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

