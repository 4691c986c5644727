/* Inference (src/infer/infer.h): the model, checkpoint and parallel layout
 * set up once; per scan, the scan read and normalised as training patches
 * are, the sliding-window prediction over the ranks (src/infer/evaluate.c,
 * with test-time mirroring src/infer/mirror.c), resampling back to the
 * scan's grid (undoing the dataset's recorded preprocessing replayed on
 * the scan: src/infer/infer_prep.c), post-processing, the NIfTI outputs
 * and the metrics against a reference (src/infer/infer_metrics.c); the
 * scans come from src/infer/infer_list.c. Owns the run over the scans and
 * the order of its steps; the summary is printed by src/cli/infer.c. */
#include "tsbuild.h"
#include "src/infer/infer_impl.h"
#include "collectives/coll.h"
#include "io/checkpoint.h"
#include "io/labelmap.h"
#include "io/loader.h"
#include "io/nifti.h"
#include "io/preprocess.h"
#include "io/resample.h"
#include "io/writer.h"
#include "src/core/error.h"
#include "src/core/path.h"
#include "src/infer/evaluate.h"
#include "src/infer/surface.h"
#include "src/model/cost.h"
#include "src/nn/layers.h"
#include "src/model/unet.h"
#include "src/model/weights.h"
#include "src/parallel/grid.h"
#include "src/parallel/layout.h"
#include "src/parallel/pipeline.h"
#include "src/parallel/spatial.h"
#include "src/parallel/split_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct infer {
    const ts_config *cfg;
    const ts_infer_opts *o;
    MPI_Comm world;
    int rank, local_rank; /* local_rank: on its node (ts_coll_node_info), picks the GPU */
    ts_unet_cfg u;
    ts_loader_opts lo;
    double overlap;
    int64_t batch;
    int winograd; /* conv=winograd (the default): ts_unet_set_winograd */
    ts_unet *m;
    ts_unet **ms;    /* m and its clones for streams= (nm models) */
    int nm;
    /* built once for every scan */
    ts_layout *L; /* the grid (parallel.dp ignored), the spatial split, the collectives */
    ts_pipeline *pipe;
    ts_eval_split es;
    ts_dataset *ds;             /* data.norm = dataset: the training dataset's statistics */
    ts_labelmap *map;           /* label_map= */
    int keep[TS_IO_MAX_CLASSES]; /* post-processing: keep the class's largest component ([0]: the foreground's) */
    int prep_on;                /* the dataset's preprocessing replayed (src/infer/infer_prep.c) */
    ts_fp_prep prep;
    /* the scan */
    ts_eval_stats st;           /* the predictions' parts, summed over the scans */
    double t_read, t_predict, t_write, t_metrics; /* wall seconds summed over the scans */
    const ts_infer_item *it;
    ts_nifti *img;
    int64_t C, dhw[3], nv;      /* channels; the grid predicted on (coarser with downsample) */
    int64_t fine[3], nfine;     /* the grid before downsample (the scan's, or the preprocessed one) */
    int64_t scan[3], nscan;     /* the scan's grid */
    ts_sample ps;               /* prep_on: what the preprocessing did (ts_prep_undo_labels) */
    float *vol, *prob;          /* the normalised image [C, dhw]; probabilities [K, dhw] */
    float *raw;                 /* prep_on with data.norm = dataset: vol before normalising */
    uint8_t *pred, *full, *zeros, *back;
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

/* Local. train.engine: the GPU of this rank's local rank where one is
 * found, as in training; the windows' forwards run there, the blending on
 * the host. */
static int choose_engine(infer *t)
{
    char note[256];
    TS_TRY(ts_unet_engine_choose(&t->u, t->local_rank, note, sizeof note));
    if (note[0] && t->rank == 0) fprintf(stderr, "tessera infer: note: %s\n", note);
    return 0;
}

/* Local. The model of the config with the checkpoint's parameters. */
static int load_model(infer *t, const char *ckpt)
{
    char state[4200];
    TS_TRY(ts_unet_cfg_from_config(t->cfg, &t->u));
    if (t->o->precision) { /* precision= instead of the config's train.precision */
        const char *p = t->o->precision;
        if (!strcmp(p, "fp32")) t->u.precision = TS_PREC_FP32;
        else if (!strcmp(p, "bf16")) t->u.precision = TS_PREC_BF16;
        else if (!strcmp(p, "fp16")) t->u.precision = TS_PREC_FP16;
        else return TS_ERR(TS_ERR_ARG, "infer: precision=%s: give fp32, bf16 or fp16", p);
    }
    TS_TRY(ts_loader_opts_from_config(t->cfg, &t->lo));
    TS_TRY(ts_config_get_float(t->cfg, "eval.overlap", &t->overlap));
    /* default winograd, but direct for bf16 on AMX tiles: its direct gathers outrun the Winograd
     * products, which stay on VDPBF16PS (docs/performance.md, "2026-12-07 (sixth session)") */
    const int amx = t->u.precision == TS_PREC_BF16 && !strcmp(ts_nn_bf16_isa(), "amx");
    const char *cv = t->o->conv ? t->o->conv : amx ? "direct" : "winograd";
    if (strcmp(cv, "winograd") && strcmp(cv, "direct"))
        return TS_ERR(TS_ERR_ARG, "infer: conv=%s: give winograd or direct", cv);
    t->winograd = !strcmp(cv, "winograd");
    TS_TRY(choose_engine(t));
    TS_TRY(ts_unet_create(&t->u, 0, &t->m));
    ts_unet_set_winograd(t->m, t->winograd);
    TS_TRY(ts_path_join(state, sizeof state, ckpt, "state.h5"));
    return ts_weights_load(ts_unet_arena(t->m), state); /* errors name state.h5 in the checkpoint */
}

/* Local. Reads the scan, checks its channels, puts it on the coarse grid
 * (downsample) and normalises it with its own statistics (data.norm). */
static int load_scan(infer *t)
{
    const char *input = t->it->input;
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
    if (!t->vol) return TS_ERR(TS_ERR_NOMEM, "%s: %lld voxels", input, (long long)t->nv);
    TS_TRY(ts_nifti_to_float(t->img, t->vol));
    memcpy(t->scan, t->dhw, sizeof t->scan);
    t->nscan = t->nv;
    if (t->prep_on) { /* cropped and resampled as convert did (data.path's /fingerprint) */
        TS_TRY(ts_infer_prep_apply(&t->prep, input, t->img, &t->vol, t->dhw, &t->ps));
        t->nv = t->dhw[0] * t->dhw[1] * t->dhw[2];
    }
    t->pred = malloc((size_t)t->nv);
    t->zeros = calloc((size_t)t->nv, 1);
    if (!t->pred || !t->zeros) return TS_ERR(TS_ERR_NOMEM, "%s: %lld voxels", input, (long long)t->nv);
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
    if (t->lo.patch.norm_nch > 0 && t->lo.patch.norm_nch != t->C)
        return TS_ERR(TS_ERR_FORMAT, "%s: %lld channel(s), data.norm lists %d modes (one per channel)", input,
                      (long long)t->C, t->lo.patch.norm_nch);
    if (t->prep_on && t->lo.patch.norm == TS_NORM_DATASET) { /* dataset_norm starts again from these values */
        if (!(t->raw = malloc(sizeof *t->raw * (size_t)(t->nv * t->C))))
            return TS_ERR(TS_ERR_NOMEM, "%s: %lld voxels", input, (long long)t->nv);
        memcpy(t->raw, t->vol, sizeof *t->raw * (size_t)(t->nv * t->C));
    }
    double pct[TS_IO_MAX_CHANNELS * TS_IO_NPCT];
    for (int64_t c = 0; c < t->C; c++) memcpy(pct + c * TS_IO_NPCT, meta.pct[c], sizeof meta.pct[c]);
    /* dataset statistics come from the training dataset (dataset_norm below) */
    if (t->lo.patch.norm == TS_NORM_DATASET && !ts_config_isset(t->cfg, "data.path"))
        return TS_ERR(TS_ERR_CONFIG, "data.norm = dataset needs data.path (the training dataset's statistics)");
    /* foreground: the same mask and statistics as convert; ct channels are
     * finished by ts_patch_normalize_scan (the training dataset's) */
    const ts_norm_stats st = {meta.mean, meta.std, meta.fg_mean, meta.fg_std, pct, NULL, NULL, NULL};
    ts_patch_normalize(t->vol, t->C, t->nv, &t->lo.patch, &st);
    return 0;
}

/* Local. data.norm = dataset: normalises the scan again with the training
 * dataset's statistics (data.path, opened by setup). */
static int dataset_norm(infer *t)
{
    if (t->o->downsample > 1)
        return TS_ERR(TS_ERR_UNSUPPORTED, "infer: downsample= with data.norm = dataset is not available yet (use "
                                          "data.norm = image)");
    /* undo the image z-score: normalise the scan's (preprocessed) values again */
    if (t->raw) memcpy(t->vol, t->raw, sizeof *t->vol * (size_t)(t->nv * t->C));
    else TS_TRY(ts_nifti_to_float(t->img, t->vol));
    double pct[TS_IO_MAX_CHANNELS * TS_IO_NPCT] = {0}, mean[TS_IO_MAX_CHANNELS] = {0}, sd[TS_IO_MAX_CHANNELS];
    for (int c = 0; c < TS_IO_MAX_CHANNELS; c++) sd[c] = 1;
    ts_patch_opts po = t->lo.patch;
    po.clip_lo = po.clip_hi = -1;
    const ts_norm_stats st = {mean, sd, NULL, NULL, pct, ts_dataset_mean(t->ds), ts_dataset_std(t->ds), NULL};
    ts_patch_normalize(t->vol, t->C, t->nv, &po, &st);
    return 0;
}

static int pipe_forward(void *ctx, const ts_tensor *x, const ts_tensor **logits)
{
    return ts_pipeline_forward(ctx, x, logits);
}

/* Local. streams=: the model and streams - 1 clones of it (t->ms), each
 * running its own windows on OMP_NUM_THREADS / streams threads; only the
 * whole model on a rank (no spatial split, no stages), at most one a thread.
 * With neither streams= nor batch= given, a stream a thread where the
 * threads divide train.batch (each forward then takes train.batch / threads
 * windows: the same windows in flight, so the same memory), else one. */
static int make_streams(infer *t)
{
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    int n = t->o->streams > 0 ? t->o->streams : 1;
    const int gpu = t->u.engine == TS_ENGINE_CUDA;
    if (gpu && n > 1)
        return TS_ERR(TS_ERR_ARG, "infer: streams=%d: the model runs on the GPU (train.engine), one stream there; give "
                                  "streams=1 or train.engine=cpu", n);
    if (!gpu && t->o->streams <= 0 && t->o->batch <= 0 && threads > 1 && t->batch % threads == 0 &&
        t->L->grid->sp == 1 && t->L->grid->pp == 1) {
        n = threads;
        t->batch /= threads;
    }
    if (n > 1 && (t->L->grid->sp > 1 || t->L->grid->pp > 1))
        return TS_ERR(TS_ERR_ARG, "infer: streams=%d needs parallel.sp = parallel.pp = 1 (each stream runs the whole "
                                  "model; give streams=1)", n);
    if (n > threads)
        return TS_ERR(TS_ERR_ARG, "infer: streams=%d is more than the %d OpenMP thread%s of a rank (OMP_NUM_THREADS)",
                      n, threads, threads == 1 ? "" : "s");
    if (!(t->ms = calloc((size_t)n, sizeof *t->ms))) return TS_ERR(TS_ERR_NOMEM, "infer: %d streams", n);
    t->ms[0] = t->m;
    t->nm = n;
    for (int j = 1; j < n; j++) TS_TRY(ts_unet_clone(t->m, &t->ms[j]));
    return 0;
}

/* Collective on world. The layout every scan is predicted on: windows over
 * the replicas, each window's volume over a spatial group (parallel.sp) or
 * through pipeline stages (parallel.pp); the training dataset for
 * data.norm = dataset. */
static int setup_layout(infer *t)
{
    int err = 0;
    ts_layout_spec spec;
    TS_CHECK(ts_config_get_int(t->cfg, "train.batch", &t->batch));
    if (t->o->batch > 0) t->batch = t->o->batch; /* batch= */
    TS_CHECK(ts_layout_spec_from_config(t->cfg, TS_LAYOUT_INFER, t->u.patch, t->u.levels, &spec));
    TS_CHECK(ts_layout_create(t->world, &spec, &t->L));
    for (int d = 0; d < 3; d++) {
        t->es.box_lo[d] = t->L->box_lo[d];
        t->es.box_size[d] = t->L->box[d];
    }
    t->es.all = t->L->all;
    t->es.forward = NULL;
    t->es.forward_ctx = NULL;
    ts_spatial_split_model(t->m, t->L->spatial);
    if (t->L->grid->pp > 1) { /* the stages of training's cut (or a balanced one): windows pass through them */
        int first[4 * TS_UNET_MAX_LEVELS];
        double cost[4 * TS_UNET_MAX_LEVELS] = {0};
        const int64_t *bs = t->es.box_size;
        TS_CHECK(ts_pipeline_create_on(t->m, t->L, (int)t->batch, first, cost, &t->pipe));
        TS_CHECK(ts_err_agree(t->L->grid->world, ts_unet_setup(t->m, (int)t->batch, (int)bs[0], (int)bs[1], (int)bs[2])));
        t->es.forward = pipe_forward;
        t->es.forward_ctx = t->pipe;
    }
    TS_CHECK(ts_err_agree(t->world, make_streams(t)));
    if (t->lo.patch.norm == TS_NORM_DATASET) {
        const char *dpath;
        ts_dataset_opts dso = {.check = 0};
        TS_CHECK(ts_config_get_str(t->cfg, "data.path", &dpath));
        TS_CHECK(ts_dataset_open(t->world, dpath, &dso, &t->ds));
    }
cleanup:
    return err;
}

static void teardown(infer *t)
{
    ts_dataset_close(&t->ds);
    ts_pipeline_destroy(&t->pipe);
    ts_layout_destroy(&t->L);
    ts_labelmap_destroy(&t->map);
    for (int j = 1; j < t->nm; j++) ts_unet_destroy(&t->ms[j]);
    free(t->ms);
    t->ms = NULL;
    t->nm = 0;
    ts_unet_destroy(&t->m);
}

/* Collective on world. The scan's labels (and probabilities), mirrored as
 * asked, then back onto the scan's grid. */
static int predict(infer *t)
{
    int err = 0;
    if (t->it->prob[0]) {
        t->prob = malloc(sizeof *t->prob * (size_t)(t->nv * t->u.classes));
        TS_CHECK(ts_err_agree(t->world, t->prob ? 0 : TS_ERR(TS_ERR_NOMEM, "%s: class probabilities", t->it->input)));
    }
    TS_CHECK(ts_eval_predict_mirror(t->ms, t->nm, t->L->replicas, t->L->grid->sp > 1 || t->L->grid->pp > 1 ? &t->es : NULL, t->vol, t->dhw,
                                    t->overlap, (int)t->batch, t->o->mirror, t->pred, t->prob, &t->st));
    if (t->o->downsample > 1) { /* back onto the scan's grid */
        ts_resample_up_labels(t->pred, t->fine, t->o->downsample, t->full);
        uint8_t *p = t->pred;
        t->pred = t->full;
        t->full = p;
        t->nv = t->nfine;
    }
    if (t->prep_on) { /* back onto the scan's grid and geometry; background outside the crop box */
        t->back = malloc((size_t)t->nscan);
        TS_CHECK(ts_err_agree(t->world, t->back ? ts_prep_undo_labels(&t->ps, &t->prep, t->pred, t->u.classes,
                                                                      t->back)
                                                : TS_ERR(TS_ERR_NOMEM, "%s: labels back onto the scan", t->it->input)));
        uint8_t *p = t->pred;
        t->pred = t->back;
        t->back = p;
        if (t->prob) { /* the probabilities too (nnU-Net: linear, background 1 outside the crop box) */
            float *q = malloc(sizeof *q * (size_t)(t->nscan * t->u.classes));
            int e = q ? ts_prep_undo_probs(&t->ps, &t->prep, t->prob, t->u.classes, q)
                      : TS_ERR(TS_ERR_NOMEM, "%s: class probabilities back onto the scan", t->it->input);
            free(e ? q : t->prob);
            if (!e) t->prob = q;
            TS_CHECK(ts_err_agree(t->world, e));
        }
        memcpy(t->fine, t->scan, sizeof t->fine);
        t->nv = t->nfine = t->nscan;
    }
cleanup:
    return err;
}

/* Local (the same on every rank: the labels are). Keeps the largest
 * component of the whole foreground (t->keep[0]), then of the classes of
 * t->keep, as nnU-Net applies its decision; s->removed counts what went. */
static int postprocess(infer *t, ts_infer_scan *s)
{
    if (t->keep[0]) TS_TRY(ts_keep_largest_component(t->pred, t->fine, TS_FOREGROUND, &s->removed[0]));
    for (int k = 1; k < t->u.classes; k++)
        if (t->keep[k]) TS_TRY(ts_keep_largest_component(t->pred, t->fine, k, &s->removed[k]));
    return 0;
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
        lerr = ts_nifti_write(t->it->output, &g, TS_NIFTI_UINT8, img->version, t->pred);
        if (!lerr && t->prob) { /* [K][D][H][W]: NIfTI x (W) fastest, classes along the 4th dimension */
            g.dim[3] = t->u.classes;
            lerr = ts_nifti_write(t->it->prob, &g, TS_NIFTI_FLOAT32, img->version, t->prob);
        }
    }
    return ts_err_agree(t->world, lerr);
}

/* Local. The reference label volume of the scan as classes (through the
 * label map first); *out owned by the caller. */
static int read_reference(infer *t, uint8_t **out)
{
    int err = 0;
    const char *label = t->it->label, *lmap = t->o->label_map;
    const ts_nifti *img = t->img;
    ts_nifti *ref = NULL;
    uint8_t *lab = NULL;
    TS_CHECK(ts_nifti_read(label, &ref));
    if (ref->dim[0] != img->dim[0] || ref->dim[1] != img->dim[1] || ref->dim[2] != img->dim[2] || ref->dim[3] != 1)
        TS_FAIL(TS_ERR_FORMAT, "%s (%lldx%lldx%lldx%lld) is not on the grid of %s", label, (long long)ref->dim[0],
                (long long)ref->dim[1], (long long)ref->dim[2], (long long)ref->dim[3], t->it->input);
    if (!(lab = malloc((size_t)t->nv))) TS_FAIL(TS_ERR_NOMEM, "%s: %lld voxels", label, (long long)t->nv);
    for (int64_t v = 0; v < t->nv; v++) {
        double x = ts_nifti_get(ref, v);
        int c = (int)x;
        if (t->map && ts_labelmap_lookup(t->map, (int64_t)x, &c))
            TS_FAIL(TS_ERR_FORMAT, "%s: label value %g is not in the label map %s", label, x, lmap);
        else if (c < 0 || c >= t->u.classes)
            TS_FAIL(TS_ERR_FORMAT, "%s: label %d is not a class of the model (%d classes)%s", label, c, t->u.classes,
                    t->map ? "" : "; is a label_map= needed?");
        lab[v] = (uint8_t)c;
    }
    *out = lab;
    lab = NULL;
cleanup:
    free(lab);
    ts_nifti_free(&ref);
    return err;
}

/* Collective on world. Per-class Dice, HD95 and NSD (and, to decide the
 * post-processing, Dice with each class's largest component) against the
 * reference, computed on rank 0 and sent to every rank. */
static int scan_metrics(infer *t, ts_infer_scan *s, double tol)
{
    int err = 0, lerr = 0;
    const int K = t->u.classes;
    uint8_t *lab = NULL;
    if (t->rank == 0) {
        /* header voxel sizes of x, y, z; the metrics want D, H, W */
        const double sp[3] = {fabs(t->img->pixdim[2]), fabs(t->img->pixdim[1]), fabs(t->img->pixdim[0])};
        lerr = read_reference(t, &lab);
        if (!lerr)
            lerr = TS_CTX(ts_infer_scan_metrics(t->pred, lab, t->fine, sp, K, tol, t->o->decide != NULL, s),
                          "metrics of %s against %s", t->it->output, t->it->label);
    }
    TS_CHECK(ts_err_agree(t->world, lerr));
    TS_MPI(MPI_Bcast(s->dice, K, MPI_DOUBLE, 0, t->world));
    TS_MPI(MPI_Bcast(s->hd95, K, MPI_DOUBLE, 0, t->world));
    TS_MPI(MPI_Bcast(s->nsd, K, MPI_DOUBLE, 0, t->world));
    TS_MPI(MPI_Bcast(s->dice_pp, K, MPI_DOUBLE, 0, t->world));
    TS_MPI(MPI_Bcast(s->dice_fg, K, MPI_DOUBLE, 0, t->world));
    TS_MPI(MPI_Bcast(s->dice_fg_pp, K, MPI_DOUBLE, 0, t->world));
    TS_MPI(MPI_Bcast(&s->fg_dice, 1, MPI_DOUBLE, 0, t->world));
    s->have_metrics = 1;
cleanup:
    free(lab);
    return err;
}

static void free_scan(infer *t)
{
    ts_nifti_free(&t->img);
    free(t->vol);
    free(t->prob);
    free(t->pred);
    free(t->full);
    free(t->zeros);
    free(t->raw);
    free(t->back);
    t->vol = t->prob = t->raw = NULL;
    t->pred = t->full = t->zeros = t->back = NULL;
}

/* Collective on world. One scan from reading to its metrics. */
static int run_scan(infer *t, const ts_infer_item *it, double tol, ts_infer_scan *s)
{
    int err = 0;
    t->it = it;
    s->input = it->input;
    s->output = it->output;
    s->label = it->label[0] ? it->label : NULL;
    s->classes = t->u.classes;
    double t0 = MPI_Wtime(), t1;
    TS_CHECK(ts_err_agree(t->world, load_scan(t)));
    if (t->lo.patch.norm == TS_NORM_DATASET) TS_CHECK(ts_err_agree(t->world, dataset_norm(t)));
    { /* the ct channels: the training dataset's CT statistics (io/patch.h) */
        const char *dp = "";
        if (ts_config_isset(t->cfg, "data.path")) TS_CHECK(ts_config_get_str(t->cfg, "data.path", &dp));
        TS_CHECK(ts_patch_normalize_scan(t->world, dp, &t->lo.patch, t->vol, t->C, t->nv));
    }
    t1 = MPI_Wtime();
    t->t_read += t1 - t0;
    TS_CHECK(predict(t));
    t0 = MPI_Wtime();
    t->t_predict += t0 - t1;
    TS_CHECK(ts_err_agree(t->world, postprocess(t, s)));
    TS_CHECK(write_outputs(t));
    t1 = MPI_Wtime();
    t->t_write += t1 - t0;
    for (int k = 0; k < 3; k++) {
        s->dim[k] = t->img->dim[k];
        s->spacing[k] = fabs(t->img->pixdim[k]);
        s->prep_dim[k] = t->prep_on ? t->ps.shape[3 - k] : 0;
    }
    for (int k = 0; k < t->u.classes; k++)
        s->dice[k] = s->hd95[k] = s->nsd[k] = s->dice_pp[k] = s->dice_fg[k] = s->dice_fg_pp[k] = NAN;
    s->fg_dice = NAN;
    if (s->label) TS_CHECK(scan_metrics(t, s, tol));
    t->t_metrics += MPI_Wtime() - t1;
cleanup:
    free_scan(t);
    return err;
}

/* Local. The options that do not go together, before any work. */
static int check_opts(const ts_infer_opts *o)
{
    if (o->downsample < 1 || o->downsample > 8)
        return TS_ERR(TS_ERR_ARG, "infer: downsample=%d must be 1..8", o->downsample);
    if (o->probabilities && o->downsample > 1)
        return TS_ERR(TS_ERR_ARG, "infer: probabilities= is not available with downsample= (the probabilities live "
                                  "on the coarse grid)");
    if (o->mirror & ~(TS_INFER_MIRROR_X | TS_INFER_MIRROR_Y | TS_INFER_MIRROR_Z))
        return TS_ERR(TS_ERR_ARG, "infer: mirror mask %d has bits other than x, y, z", o->mirror);
    if (o->keep_largest && o->postprocess)
        return TS_ERR(TS_ERR_ARG, "infer: keep_largest= and postprocess= both choose the post-processing: give one");
    if (o->decide && !o->label)
        return TS_ERR(TS_ERR_ARG, "infer: decide=%s needs label= (reference labels of the validation scans)", o->decide);
    if (o->decide && (o->keep_largest || o->postprocess))
        return TS_ERR(TS_ERR_ARG, "infer: decide= compares the raw prediction with and without the post-processing: "
                                  "drop keep_largest=/postprocess=");
    if (o->metrics && !o->label) return TS_ERR(TS_ERR_ARG, "infer: metrics=%s needs label=", o->metrics);
    return 0;
}

/* Local. The model, the label map, the post-processing classes, the
 * preprocessing to replay. */
static int prepare(infer *t, const char *ckpt, ts_infer_result *r)
{
    const ts_infer_opts *o = t->o;
    TS_TRY(ts_infer_prep_load(t->cfg, o, &t->prep, &t->prep_on, r));
    TS_TRY(load_model(t, ckpt));
    if (o->label_map) TS_TRY(ts_labelmap_load(o->label_map, &t->map));
    if (o->keep_largest) TS_TRY(ts_infer_parse_keep(o->keep_largest, t->u.classes, t->keep));
    if (o->postprocess) TS_TRY(ts_infer_read_decision(o->postprocess, t->u.classes, t->keep));
    return 0;
}

/* Collective on world (rank 0 writes). Summary, metrics file, decision. */
static int finish(infer *t, const ts_infer_scan *s, int n, const ts_infer_list *l, ts_infer_result *r)
{
    int lerr = 0;
    const int K = t->u.classes;
    double without[TS_IO_MAX_CLASSES], with[TS_IO_MAX_CLASSES], fg[2];
    ts_infer_summarise(s, n, K, r);
    lerr = ts_infer_metrics_path(t->o, l, r->metrics, sizeof r->metrics);
    if (!lerr && t->o->decide) {
        ts_infer_decide(s, n, K, r->decision, without, with, fg);
        r->decided = 1;
        if (t->rank == 0) lerr = ts_infer_write_decision(t->o->decide, r, n, without, with, fg);
    }
    if (!lerr && t->rank == 0) lerr = ts_infer_write_metrics(r->metrics, t->o, r, s, n);
    return ts_err_agree(t->world, lerr);
}

int ts_infer_run(const ts_config *cfg, MPI_Comm world, const ts_infer_opts *o, ts_infer_result *r)
{
    int err = 0, lerr = 0;
    infer t;
    ts_infer_list l = {0};
    ts_infer_scan *scans = NULL;
    const double start = MPI_Wtime();
    memset(&t, 0, sizeof t);
    memset(r, 0, sizeof *r);
    t.cfg = cfg;
    t.o = o;
    t.world = world;
    TS_MPI(MPI_Comm_rank(world, &t.rank));
    r->nsd_tol = o->nsd_tol >= 0 ? o->nsd_tol : TS_INFER_NSD_TOL_MM;
    lerr = check_opts(o);
    if (!lerr) lerr = ts_infer_find_checkpoint(o->checkpoint, r->checkpoint, sizeof r->checkpoint);
    if (!lerr) lerr = ts_infer_list_make(o, t.rank == 0, &l);
    if (!lerr && !(scans = calloc((size_t)l.n, sizeof *scans)))
        lerr = TS_ERR(TS_ERR_NOMEM, "results of %d scans", l.n);
    TS_CHECK(ts_err_agree(world, lerr));
    {
        int node, nnodes, lsize; /* collective: every rank is here */
        TS_CHECK(ts_err_agree(world, ts_coll_node_info(world, &node, &nnodes, &t.local_rank, &lsize)));
    }
    TS_CHECK(ts_err_agree(world, prepare(&t, r->checkpoint, r)));
    if (t.lo.patch.norm == TS_NORM_DATASET && !ts_config_isset(cfg, "data.path"))
        TS_CHECK(ts_err_agree(world, TS_ERR(TS_ERR_CONFIG, "data.norm = dataset needs data.path (the training "
                                                           "dataset's statistics)")));
    TS_CHECK(setup_layout(&t));
    r->setup_s = MPI_Wtime() - start;
    r->classes = t.u.classes;
    r->nscans = l.n;
    r->have_dice = o->label != NULL;
    memcpy(r->keep, t.keep, sizeof r->keep);
    for (int k = 0; k < t.u.classes; k++)
        snprintf(r->class_names[k], sizeof r->class_names[k], "%s", t.map ? ts_labelmap_class_name(t.map, k) : "");
    for (int i = 0; i < l.n; i++) {
        scans[i].index = i;
        scans[i].count = l.n;
        TS_CHECK(run_scan(&t, &l.item[i], r->nsd_tol, &scans[i]));
        for (int k = 0; k < 3; k++) r->dim[k] = scans[i].dim[k];
        memcpy(r->dice, scans[i].dice, sizeof r->dice);
        if (o->on_scan) o->on_scan(&scans[i], o->on_scan_ctx);
    }
    double t0 = MPI_Wtime();
    if (o->label) TS_CHECK(finish(&t, scans, l.n, &l, r));
    else r->metrics[0] = 0;
    t.t_metrics += MPI_Wtime() - t0;
    {
        ts_unet_cost c;
        TS_CHECK(ts_unet_cost_of(&t.u, 1, t.u.patch, NULL, &c));
        r->flop_per_window = c.flops_forward;
    }
    r->read_s = t.t_read;
    r->network_s = t.st.network_s;
    r->blend_s = t.st.blend_s;
    r->reduce_s = t.st.reduce_s;
    r->predict_s = t.t_predict;
    r->write_s = t.t_write;
    r->metrics_s = t.t_metrics;
    r->windows = t.st.windows;
    r->forwards = t.st.forwards;
    r->batch = (int)t.batch;
    r->streams = t.nm;
    r->stream_min = t.st.stream_min;
    r->stream_max = t.st.stream_max;
    r->precision = t.u.precision == TS_PREC_BF16 ? "bf16" : t.u.precision == TS_PREC_FP16 ? "fp16" : "fp32";
    r->conv = t.u.engine == TS_ENGINE_CUDA                     ? "cudnn"
              : t.winograd && t.u.precision != TS_PREC_FP16 ? "winograd"
                                                             : "direct"; /* fp16: always direct */
    r->total_s = MPI_Wtime() - start;
cleanup:
    teardown(&t);
    free_scan(&t);
    free(scans);
    ts_infer_list_free(&l);
    return err;
}
