/* Inference of one scan (src/train/infer.h): the model and checkpoint, the
 * scan read and normalised as training patches are, the sliding-window
 * prediction over the ranks (src/train/evaluate.c), resampling back to the
 * scan's grid, the NIfTI outputs and the Dice against a reference. */
#include "tsbuild.h"
#include "src/train/infer.h"
#include "collectives/coll.h"
#include "io/checkpoint.h"
#include "io/labelmap.h"
#include "io/loader.h"
#include "io/nifti.h"
#include "io/resample.h"
#include "io/writer.h"
#include "src/core/error.h"
#include "src/core/path.h"
#include "src/model/unet.h"
#include "src/model/weights.h"
#include "src/parallel/grid.h"
#include "src/parallel/spatial.h"
#include "src/train/evaluate.h"
#include "src/train/pipeline.h"
#include "src/train/step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct infer {
    const ts_config *cfg;
    const ts_infer_opts *o;
    MPI_Comm world;
    int rank;
    ts_unet_cfg u;
    ts_loader_opts lo;
    double overlap;
    ts_unet *m;
    ts_nifti *img;              /* the scan */
    int64_t C, dhw[3], nv;      /* channels; the grid predicted on (coarser with downsample) */
    int64_t fine[3], nfine;     /* the scan's grid */
    float *vol, *prob;          /* the normalised image [C, dhw]; probabilities [K, dhw] */
    uint8_t *pred, *full, *zeros;
} infer;

int ts_infer_find_checkpoint(const char *arg, char *path, size_t n)
{
    char sub[4096];
    int64_t step;
    if (ts_ckpt_is_complete(arg)) return ts_path_fmt(path, n, "checkpoint", "%s", arg);
    if (ts_ckpt_latest(arg, path, n, &step) == 0) return 0;
    TS_TRY(ts_path_join(sub, sizeof sub, arg, "ckpt"));
    if (ts_ckpt_latest(sub, path, n, &step) == 0) return 0;
    struct stat st;
    if (stat(arg, &st) != 0) return TS_ERR(TS_ERR_IO, "checkpoint=%s: no such file or directory", arg);
    return TS_ERR(TS_ERR_FORMAT, "checkpoint=%s: not a complete checkpoint, and no complete checkpoint inside it or "
                                 "in its ckpt/ folder", arg);
}

/* Local. The model of the config with the checkpoint's parameters. */
static int load_model(infer *t, const char *ckpt)
{
    char state[4200];
    TS_TRY(ts_unet_cfg_from_config(t->cfg, &t->u));
    TS_TRY(ts_loader_opts_from_config(t->cfg, &t->lo));
    TS_TRY(ts_config_get_float(t->cfg, "eval.overlap", &t->overlap));
    TS_TRY(ts_unet_create(&t->u, 0, &t->m));
    TS_TRY(ts_path_join(state, sizeof state, ckpt, "state.h5"));
    return ts_weights_load(ts_unet_arena(t->m), state); /* errors name state.h5 in the checkpoint */
}

/* Local. Reads the scan, checks its channels, puts it on the coarse grid
 * (downsample) and normalises it with its own statistics (data.norm). */
static int load_scan(infer *t)
{
    const char *input = t->o->input;
    const int f = t->o->downsample;
    TS_TRY(ts_nifti_read(input, &t->img));
    t->C = t->img->dim[3];
    t->dhw[0] = t->img->dim[2]; /* NIfTI (i, j, k) is (W, H, D) */
    t->dhw[1] = t->img->dim[1];
    t->dhw[2] = t->img->dim[0];
    t->nv = t->dhw[0] * t->dhw[1] * t->dhw[2];
    if (t->C != t->u.in_channels)
        return TS_ERR(TS_ERR_FORMAT, "%s has %lld channel%s, model.in_channels is %d", input, (long long)t->C,
                      t->C == 1 ? "" : "s", t->u.in_channels);
    t->vol = malloc(sizeof *t->vol * (size_t)(t->nv * t->C));
    t->pred = malloc((size_t)t->nv);
    t->zeros = calloc((size_t)t->nv, 1);
    if (!t->vol || !t->pred || !t->zeros) return TS_ERR(TS_ERR_NOMEM, "%s: %lld voxels", input, (long long)t->nv);
    TS_TRY(ts_nifti_to_float(t->img, t->vol));
    memcpy(t->fine, t->dhw, sizeof t->fine);
    t->nfine = t->nv;
    if (f > 1) {
        int64_t c3[3] = {ts_resample_size(t->dhw[0], f), ts_resample_size(t->dhw[1], f), ts_resample_size(t->dhw[2], f)};
        float *small = malloc(sizeof *small * (size_t)(c3[0] * c3[1] * c3[2] * t->C));
        t->full = malloc((size_t)t->nfine);
        if (!small || !t->full) {
            free(small);
            return TS_ERR(TS_ERR_NOMEM, "%s: downsampling", input);
        }
        ts_resample_down(t->C, t->dhw, f, t->vol, small, NULL, 0, NULL);
        free(t->vol);
        t->vol = small;
        memcpy(t->dhw, c3, sizeof c3);
        t->nv = c3[0] * c3[1] * c3[2];
    }
    ts_sample s;
    ts_sample_meta meta;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "%s", input);
    snprintf(s.source_image, sizeof s.source_image, "%s", input);
    s.shape[0] = t->C;
    for (int k = 0; k < 3; k++) s.shape[k + 1] = t->dhw[k];
    s.image = t->vol;
    s.label = t->zeros;
    TS_TRY(ts_sample_stats(&s, 1, &meta));
    double pct[TS_IO_MAX_CHANNELS * TS_IO_NPCT];
    for (int64_t c = 0; c < t->C; c++) memcpy(pct + c * TS_IO_NPCT, meta.pct[c], sizeof meta.pct[c]);
    /* dataset statistics come from the training dataset (dataset_norm below) */
    if (t->lo.patch.norm == TS_NORM_DATASET && !ts_config_isset(t->cfg, "data.path"))
        return TS_ERR(TS_ERR_CONFIG, "data.norm = dataset needs data.path (the training dataset's statistics)");
    const int fgn = t->lo.patch.norm == TS_NORM_FOREGROUND; /* the same mask and statistics as convert */
    ts_patch_normalize(t->vol, t->C, t->nv, &t->lo.patch, fgn ? meta.fg_mean : meta.mean, fgn ? meta.fg_std : meta.std,
                       pct, NULL, NULL);
    return 0;
}

/* Collective on world. data.norm = dataset: normalises the scan again with
 * the training dataset's statistics (data.path). */
static int dataset_norm(infer *t)
{
    int err = 0;
    const char *dpath;
    ts_dataset *ds = NULL;
    TS_CHECK(ts_config_get_str(t->cfg, "data.path", &dpath));
    ts_dataset_opts dso = {.check = 0};
    TS_CHECK(ts_dataset_open(t->world, dpath, &dso, &ds));
    if (t->o->downsample > 1)
        TS_FAIL(TS_ERR_UNSUPPORTED, "infer: downsample= with data.norm = dataset is not available yet (use data.norm = image)");
    /* undo the image z-score: normalise the scan's values again */
    TS_CHECK(ts_err_agree(t->world, ts_nifti_to_float(t->img, t->vol)));
    double pct[TS_IO_MAX_CHANNELS * TS_IO_NPCT] = {0}, mean[TS_IO_MAX_CHANNELS] = {0}, sd[TS_IO_MAX_CHANNELS];
    for (int c = 0; c < TS_IO_MAX_CHANNELS; c++) sd[c] = 1;
    ts_patch_opts po = t->lo.patch;
    po.clip_lo = po.clip_hi = -1;
    ts_patch_normalize(t->vol, t->C, t->nv, &po, mean, sd, pct, ts_dataset_mean(ds), ts_dataset_std(ds));
cleanup:
    ts_dataset_close(&ds);
    return err;
}

static int pipe_forward(void *ctx, const ts_tensor *x, const ts_tensor **logits)
{
    return ts_pipeline_forward(ctx, x, logits);
}

/* Collective on world. Windows over the replicas, each window's volume over
 * a spatial group (parallel.sp) or through pipeline stages (parallel.pp);
 * then the labels back onto the scan's grid. */
static int predict(infer *t)
{
    int err = 0, dims[3];
    int64_t batch, spn, pp;
    const char *spdims;
    ts_eval_split es;
    ts_grid *grid = NULL;
    ts_spatial *sp = NULL;
    ts_pipeline *pipe = NULL;
    ts_coll *coll = NULL, *all = NULL;
    TS_CHECK(ts_config_get_int(t->cfg, "train.batch", &batch));
    TS_CHECK(ts_config_get_int(t->cfg, "parallel.sp", &spn));
    TS_CHECK(ts_config_get_int(t->cfg, "parallel.pp", &pp));
    TS_CHECK(ts_config_get_str(t->cfg, "parallel.sp_dims", &spdims));
    TS_CHECK(ts_grid_create(t->world, 0, (int)pp, (int)spn, &grid));
    TS_CHECK(ts_spatial_plan((int)spn, spdims, t->u.patch, t->u.levels, dims));
    TS_CHECK(ts_spatial_create(grid->sp_comm, dims, &sp));
    TS_CHECK(ts_spatial_box(sp, t->u.patch, es.box_lo, es.box_size));
    TS_CHECK(ts_coll_create(grid->dp_comm, NULL, &coll));
    TS_CHECK(ts_coll_create(grid->world, NULL, &all));
    es.all = all;
    es.forward = NULL;
    es.forward_ctx = NULL;
    ts_stepper_split_model(t->m, sp);
    if (pp > 1) { /* the stages of training's cut (or a balanced one): windows pass through them */
        const char *cut;
        int first[4 * TS_UNET_MAX_LEVELS];
        double cost[4 * TS_UNET_MAX_LEVELS] = {0};
        TS_CHECK(ts_config_get_str(t->cfg, "parallel.pp_cut", &cut));
        TS_CHECK(ts_pipeline_plan(t->m, grid->world, (int)pp, cut, (int)batch, es.box_size, first, cost));
        TS_CHECK(ts_pipeline_create(t->m, grid->pp_comm, first, TS_PIPE_GPIPE, 1, &pipe));
        TS_CHECK(ts_err_agree(grid->world, ts_unet_setup(t->m, (int)batch, (int)es.box_size[0], (int)es.box_size[1],
                                                          (int)es.box_size[2])));
        es.forward = pipe_forward;
        es.forward_ctx = pipe;
    }
    if (t->o->probabilities) {
        t->prob = malloc(sizeof *t->prob * (size_t)(t->nv * t->u.classes));
        TS_CHECK(ts_err_agree(t->world, t->prob ? 0 : TS_ERR(TS_ERR_NOMEM, "%s: class probabilities", t->o->input)));
    }
    TS_CHECK(ts_eval_predict(t->m, coll, spn > 1 || pp > 1 ? &es : NULL, t->vol, t->dhw, t->overlap, (int)batch,
                             t->pred, t->prob));
    if (t->o->downsample > 1) { /* back onto the scan's grid */
        ts_resample_up_labels(t->pred, t->fine, t->o->downsample, t->full);
        uint8_t *p = t->pred;
        t->pred = t->full;
        t->full = p;
        t->nv = t->nfine;
    }
cleanup:
    ts_coll_destroy(&coll);
    ts_pipeline_destroy(&pipe);
    ts_coll_destroy(&all);
    ts_spatial_destroy(&sp);
    ts_grid_destroy(&grid);
    return err;
}

/* Collective on world (rank 0 writes; its error reaches every rank). The
 * labels, and the probabilities, with the scan's grid, voxel sizes and
 * sform/qform. */
static int write_outputs(infer *t)
{
    int lerr = 0;
    if (t->rank == 0) {
        const ts_nifti *img = t->img;
        ts_nifti_geom g;
        memset(&g, 0, sizeof g);
        for (int k = 0; k < 3; k++) {
            g.dim[k] = img->dim[k];
            g.pixdim[k] = img->pixdim[k];
        }
        g.dim[3] = 1;
        memcpy(g.sform, img->sform, sizeof g.sform);
        memcpy(g.qform, img->qform, sizeof g.qform);
        g.sform_code = img->sform_code;
        g.qform_code = img->qform_code;
        lerr = ts_nifti_write(t->o->output, &g, TS_NIFTI_UINT8, img->version, t->pred);
        if (!lerr && t->o->probabilities) { /* [K][D][H][W]: NIfTI x (W) fastest, classes along the 4th dimension */
            g.dim[3] = t->u.classes;
            lerr = ts_nifti_write(t->o->probabilities, &g, TS_NIFTI_FLOAT32, img->version, t->prob);
        }
    }
    return ts_err_agree(t->world, lerr);
}

/* Collective on world. Per-class Dice of the prediction against the
 * reference label volume (mapped through the label map first). */
static int reference_dice(infer *t, ts_infer_result *r)
{
    int lerr = 0;
    const char *label = t->o->label, *lmap = t->o->label_map;
    ts_nifti *ref = NULL;
    ts_labelmap *map = NULL;
    uint8_t *lab = NULL;
    const ts_nifti *img = t->img;
    lerr = ts_nifti_read(label, &ref);
    if (!lerr && (ref->dim[0] != img->dim[0] || ref->dim[1] != img->dim[1] || ref->dim[2] != img->dim[2] ||
                  ref->dim[3] != 1))
        lerr = TS_ERR(TS_ERR_FORMAT, "%s (%lldx%lldx%lldx%lld) is not on the grid of %s", label,
                      (long long)ref->dim[0], (long long)ref->dim[1], (long long)ref->dim[2],
                      (long long)ref->dim[3], t->o->input);
    if (!lerr && lmap) lerr = ts_labelmap_load(lmap, &map);
    if (!lerr) {
        lab = malloc((size_t)t->nv);
        if (!lab) lerr = TS_ERR(TS_ERR_NOMEM, "%s: %lld voxels", label, (long long)t->nv);
    }
    for (int64_t v = 0; v < t->nv && !lerr; v++) {
        double x = ts_nifti_get(ref, v);
        int c = (int)x;
        if (map && ts_labelmap_lookup(map, (int64_t)x, &c))
            lerr = TS_ERR(TS_ERR_FORMAT, "%s: label value %g is not in the label map %s", label, x, lmap);
        else if (c < 0 || c >= t->u.classes)
            lerr = TS_ERR(TS_ERR_FORMAT, "%s: label %d is not a class of the model (%d classes)%s", label, c,
                          t->u.classes, map ? "" : "; is a label_map= needed?");
        else lab[v] = (uint8_t)c;
    }
    int err = ts_err_agree(t->world, lerr);
    if (!err) {
        int64_t tp[TS_IO_MAX_CLASSES] = {0}, fp[TS_IO_MAX_CLASSES] = {0}, fn[TS_IO_MAX_CLASSES] = {0};
        ts_eval_confusion(t->pred, lab, t->nv, t->u.classes, tp, fp, fn);
        for (int k = 0; k < t->u.classes; k++) {
            r->dice[k] = ts_eval_dice(tp[k], fp[k], fn[k]);
            snprintf(r->class_names[k], sizeof r->class_names[k], "%s", map ? ts_labelmap_class_name(map, k) : "");
        }
        r->have_dice = 1;
    }
    free(lab);
    ts_labelmap_destroy(&map);
    ts_nifti_free(&ref);
    return err;
}

int ts_infer_run(const ts_config *cfg, MPI_Comm world, const ts_infer_opts *o, ts_infer_result *r)
{
    int err = 0, lerr = 0;
    infer t;
    memset(&t, 0, sizeof t);
    memset(r, 0, sizeof *r);
    t.cfg = cfg;
    t.o = o;
    t.world = world;
    TS_MPI(MPI_Comm_rank(world, &t.rank));
    if (o->downsample < 1 || o->downsample > 8)
        lerr = TS_ERR(TS_ERR_ARG, "infer: downsample=%d must be 1..8", o->downsample);
    else if (o->probabilities && o->downsample > 1)
        lerr = TS_ERR(TS_ERR_ARG, "infer: probabilities= is not available with downsample= (the probabilities live "
                                  "on the coarse grid)");
    if (!lerr) lerr = ts_infer_find_checkpoint(o->checkpoint, r->checkpoint, sizeof r->checkpoint);
    TS_CHECK(ts_err_agree(world, lerr));
    lerr = load_model(&t, r->checkpoint);
    if (!lerr) lerr = load_scan(&t);
    TS_CHECK(ts_err_agree(world, lerr));
    if (t.lo.patch.norm == TS_NORM_DATASET) TS_CHECK(dataset_norm(&t));
    if (t.lo.patch.norm == TS_NORM_CT) { /* the training dataset's CT statistics (io/patch.h) */
        const char *dp = "";
        if (ts_config_isset(cfg, "data.path")) TS_CHECK(ts_config_get_str(cfg, "data.path", &dp));
        TS_CHECK(ts_patch_normalize_scan(world, dp, t.vol, t.C, t.nv));
    }
    TS_CHECK(predict(&t));
    TS_CHECK(write_outputs(&t));
    for (int k = 0; k < 3; k++) r->dim[k] = t.img->dim[k];
    r->classes = t.u.classes;
    if (o->label) TS_CHECK(reference_dice(&t, r));
cleanup:
    ts_unet_destroy(&t.m);
    ts_nifti_free(&t.img);
    free(t.vol);
    free(t.prob);
    free(t.pred);
    free(t.full);
    free(t.zeros);
    return err;
}
