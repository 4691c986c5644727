/* tessera infer CONFIG checkpoint=DIR input=SCAN.nii.gz output=MASK.nii.gz
 * [label=SEG.nii.gz [label_map=MAP]]: sliding-window prediction of a whole
 * scan with a trained model (windows split over the ranks), written as a
 * NIfTI label volume with the input's grid and affine; with a reference
 * label it also prints the per-class Dice. */
#include "tsbuild.h"
#include "collectives/coll.h"
#include "io/checkpoint.h"
#include "io/dataset.h"
#include "io/labelmap.h"
#include "io/loader.h"
#include "io/nifti.h"
#include "io/resample.h"
#include "io/writer.h"
#include "src/cli/cli.h"
#include "src/core/error.h"
#include "src/core/path.h"
#include "src/model/unet.h"
#include "src/model/weights.h"
#include "src/parallel/grid.h"
#include "src/parallel/spatial.h"
#include "src/train/evaluate.h"
#include "src/train/step.h"

#include <nifti1.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void help(void)
{
    printf("usage: [mpiexec.mpich -n N] tessera infer CONFIG checkpoint=DIR input=SCAN.nii.gz output=MASK.nii.gz\n"
           "                                  [label=SEG.nii.gz [label_map=MAP.txt]] [downsample=F]\n"
           "                                  [probabilities=PROB.nii.gz]\n"
           "                                  [section.key=value ...]\n\n"
           "Predicts a label volume for a NIfTI scan (channels along the 4th dimension) with the model of\n"
           "CONFIG and the parameters of a checkpoint: DIR is a checkpoint (ckpt/step-<N>), a checkpoint\n"
           "folder (the newest complete one is used) or a run directory. The scan is normalised as training\n"
           "patches are (data.norm, data.clip), cut into windows of data.patch with eval.overlap, predicted\n"
           "with Gaussian weighting and written as uint8 NIfTI with the input's dimensions, voxel sizes and\n"
           "sform/qform. The windows are split over the data-parallel replicas; parallel.sp splits each\n"
           "window's volume over a spatial group and parallel.pp passes it through pipeline stages, as in\n"
           "training (both taken from CONFIG: override them on the command line, e.g. parallel.sp=1 on one\n"
           "rank). label= adds per-class Dice against a reference\n"
           "(mapped through label_map= first, e.g. configs/labelmaps/aal-3class.txt for the AAL atlas).\n"
           "downsample=F predicts on a grid F times coarser (as `convert --downsample F` stored the training\n"
           "data) and writes the labels back on the scan's own grid. probabilities= also writes the\n"
           "Gaussian-weighted class probabilities (float32, 4-D: x, y, z, class; not with downsample=).\n");
}

static int pipe_forward(void *ctx, const ts_tensor *x, const ts_tensor **logits)
{
    return ts_pipeline_forward(ctx, x, logits);
}

/* checkpoint=: a step directory, a ckpt folder, or a run directory */
static int find_checkpoint(const char *arg, char *path, size_t n)
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

int ts_cli_infer(int argc, char **argv)
{
    int err = 0, lerr = 0, nover = 0, rank = ts_cli_rank();
    const char *cfgpath = NULL, *ckpt = NULL, *input = NULL, *output = NULL, *label = NULL, *lmap = NULL,
               *probpath = NULL;
    float *prob = NULL;
    int f = 1;
    uint8_t *full = NULL;
    char **over = NULL, ck[4096] = "", state[4200];
    ts_config *cfg = NULL;
    ts_unet *m = NULL;
    ts_coll *coll = NULL, *all = NULL;
    ts_grid *grid = NULL;
    ts_spatial *sp = NULL;
    ts_pipeline *pipe = NULL;
    ts_nifti *img = NULL, *ref = NULL;
    ts_labelmap *map = NULL;
    ts_dataset *ds = NULL;
    float *vol = NULL;
    uint8_t *pred = NULL, *lab = NULL, *zeros = NULL;
    if (ts_cli_wants_help(argc, argv)) {
        if (rank == 0) help();
        return 0;
    }
    over = calloc((size_t)argc, sizeof *over);
    if (!over) return TS_ERR(TS_ERR_NOMEM, "arguments");
    for (int i = 1; i < argc && !lerr; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "checkpoint=", 11)) ckpt = a + 11;
        else if (!strncmp(a, "input=", 6)) input = a + 6;
        else if (!strncmp(a, "output=", 7)) output = a + 7;
        else if (!strncmp(a, "label=", 6)) label = a + 6;
        else if (!strncmp(a, "label_map=", 10)) lmap = a + 10;
        else if (!strncmp(a, "probabilities=", 14)) probpath = a + 14;
        else if (!strncmp(a, "downsample=", 11)) {
            f = atoi(a + 11);
            if (f < 1 || f > 8) lerr = TS_ERR(TS_ERR_ARG, "infer: downsample=%s must be 1..8", a + 11);
        }
        else if (a[0] != '-' && strchr(a, '=')) over[nover++] = argv[i];
        else if (!cfgpath && a[0] != '-') cfgpath = a;
        else lerr = TS_ERR(TS_ERR_ARG, "infer: unexpected argument '%s' (see tessera infer --help)", a);
    }
    if (!lerr && (!cfgpath || !ckpt || !input || !output))
        lerr = TS_ERR(TS_ERR_ARG, "infer: CONFIG, checkpoint=, input= and output= are required (see --help)");
    if (!lerr && probpath && f > 1)
        lerr = TS_ERR(TS_ERR_ARG, "infer: probabilities= is not available with downsample= (the probabilities live on the "
                                  "coarse grid)");
    if (!lerr) lerr = find_checkpoint(ckpt, ck, sizeof ck);
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    TS_CHECK(ts_cli_load_config(cfgpath, nover, over, MPI_COMM_WORLD, &cfg));
    ts_unet_cfg u;
    ts_loader_opts lo;
    double overlap;
    lerr = ts_unet_cfg_from_config(cfg, &u);
    if (!lerr) lerr = ts_loader_opts_from_config(cfg, &lo);
    if (!lerr) lerr = ts_config_get_float(cfg, "eval.overlap", &overlap);
    if (!lerr) lerr = ts_unet_create(&u, 0, &m);
    if (!lerr) lerr = ts_path_join(state, sizeof state, ck, "state.h5");
    if (!lerr) lerr = ts_weights_load(ts_unet_arena(m), state);
    /* the scan and its normalisation */
    if (!lerr) lerr = ts_nifti_read(input, &img);
    int64_t C = img ? img->dim[3] : 0, dhw[3] = {0, 0, 0}, nv = 0;
    if (!lerr) {
        dhw[0] = img->dim[2];
        dhw[1] = img->dim[1];
        dhw[2] = img->dim[0];
        nv = dhw[0] * dhw[1] * dhw[2];
        if (C != u.in_channels)
            lerr = TS_ERR(TS_ERR_FORMAT, "%s has %lld channel%s, model.in_channels is %d", input, (long long)C,
                          C == 1 ? "" : "s", u.in_channels);
    }
    if (!lerr) {
        vol = malloc(sizeof *vol * (size_t)(nv * C));
        pred = malloc((size_t)nv);
        zeros = calloc((size_t)nv, 1);
        if (!vol || !pred || !zeros) lerr = TS_ERR(TS_ERR_NOMEM, "%s: %lld voxels", input, (long long)nv);
    }
    if (!lerr) lerr = ts_nifti_to_float(img, vol);
    /* fine voxels: the scan's grid (output); dhw/nv: the grid predicted on */
    const int64_t fine[3] = {dhw[0], dhw[1], dhw[2]}, nfine = nv;
    if (!lerr && f > 1) {
        int64_t c3[3] = {ts_resample_size(dhw[0], f), ts_resample_size(dhw[1], f), ts_resample_size(dhw[2], f)};
        float *small = malloc(sizeof *small * (size_t)(c3[0] * c3[1] * c3[2] * C));
        full = malloc((size_t)nfine);
        if (!small || !full) lerr = TS_ERR(TS_ERR_NOMEM, "%s: downsampling", input);
        else {
            ts_resample_down(C, dhw, f, vol, small, NULL, 0, NULL);
            free(vol);
            vol = small;
            for (int k = 0; k < 3; k++) dhw[k] = c3[k];
            nv = c3[0] * c3[1] * c3[2];
        }
    }
    if (!lerr) {
        ts_sample s;
        ts_sample_meta meta;
        memset(&s, 0, sizeof s);
        snprintf(s.name, sizeof s.name, "%s", input);
        snprintf(s.source_image, sizeof s.source_image, "%s", input);
        s.shape[0] = C;
        for (int k = 0; k < 3; k++) s.shape[k + 1] = dhw[k];
        s.image = vol;
        s.label = zeros;
        lerr = ts_sample_stats(&s, 1, &meta);
        const double *dm = NULL, *dsd = NULL;
        double pct[TS_IO_MAX_CHANNELS * TS_IO_NPCT];
        for (int64_t c = 0; c < C && !lerr; c++) memcpy(pct + c * TS_IO_NPCT, meta.pct[c], sizeof meta.pct[c]);
        if (!lerr && lo.patch.norm == TS_NORM_DATASET) {
            /* dataset statistics come from the training dataset */
            if (!ts_config_isset(cfg, "data.path"))
                lerr = TS_ERR(TS_ERR_CONFIG, "data.norm = dataset needs data.path (the training dataset's statistics)");
        }
        if (!lerr) ts_patch_normalize(vol, C, nv, &lo.patch, meta.mean, meta.std, pct, dm, dsd);
    }
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    if (lo.patch.norm == TS_NORM_DATASET) {
        const char *dpath;
        TS_CHECK(ts_config_get_str(cfg, "data.path", &dpath));
        ts_dataset_opts dso = {.check = 0};
        TS_CHECK(ts_dataset_open(MPI_COMM_WORLD, dpath, &dso, &ds));
        /* undo the image z-score: normalise again with the dataset's statistics */
        if (f > 1)
            TS_FAIL(TS_ERR_UNSUPPORTED, "infer: downsample= with data.norm = dataset is not available yet (use data.norm = image)");
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, ts_nifti_to_float(img, vol)));
        double pct[TS_IO_MAX_CHANNELS * TS_IO_NPCT] = {0}, mean[TS_IO_MAX_CHANNELS] = {0}, sd[TS_IO_MAX_CHANNELS];
        for (int c = 0; c < TS_IO_MAX_CHANNELS; c++) sd[c] = 1;
        ts_patch_opts po = lo.patch;
        po.clip_lo = po.clip_hi = -1;
        ts_patch_normalize(vol, C, nv, &po, mean, sd, pct, ts_dataset_mean(ds), ts_dataset_std(ds));
    }
    /* predict: windows over the replicas, each window's volume over a spatial group */
    int64_t batch, spn, pp;
    const char *spdims;
    int dims[3];
    ts_eval_split es;
    TS_CHECK(ts_config_get_int(cfg, "train.batch", &batch));
    TS_CHECK(ts_config_get_int(cfg, "parallel.sp", &spn));
    TS_CHECK(ts_config_get_int(cfg, "parallel.pp", &pp));
    TS_CHECK(ts_config_get_str(cfg, "parallel.sp_dims", &spdims));
    TS_CHECK(ts_grid_create(MPI_COMM_WORLD, 0, (int)pp, (int)spn, &grid));
    TS_CHECK(ts_spatial_plan((int)spn, spdims, u.patch, u.levels, dims));
    TS_CHECK(ts_spatial_create(grid->sp_comm, dims, &sp));
    TS_CHECK(ts_spatial_box(sp, u.patch, es.box_lo, es.box_size));
    TS_CHECK(ts_coll_create(grid->dp_comm, NULL, &coll));
    TS_CHECK(ts_coll_create(grid->world, NULL, &all));
    es.all = all;
    es.forward = NULL;
    es.forward_ctx = NULL;
    ts_stepper_split_model(m, sp);
    if (pp > 1) { /* the stages of training's cut (or a balanced one): windows pass through them */
        const char *cut;
        int first[4 * TS_UNET_MAX_LEVELS];
        double cost[4 * TS_UNET_MAX_LEVELS] = {0};
        TS_CHECK(ts_config_get_str(cfg, "parallel.pp_cut", &cut));
        TS_CHECK(ts_pipeline_plan(m, grid->world, (int)pp, cut, (int)batch, es.box_size, first, cost));
        TS_CHECK(ts_pipeline_create(m, grid->pp_comm, first, TS_PIPE_GPIPE, 1, &pipe));
        TS_CHECK(ts_err_agree(grid->world, ts_unet_setup(m, (int)batch, (int)es.box_size[0], (int)es.box_size[1],
                                                          (int)es.box_size[2])));
        es.forward = pipe_forward;
        es.forward_ctx = pipe;
    }
    if (probpath) {
        prob = malloc(sizeof *prob * (size_t)(nv * u.classes));
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, prob ? 0 : TS_ERR(TS_ERR_NOMEM, "%s: class probabilities", input)));
    }
    TS_CHECK(ts_eval_predict(m, coll, spn > 1 || pp > 1 ? &es : NULL, vol, dhw, overlap, (int)batch, pred, prob));
    if (f > 1) { /* back onto the scan's grid */
        ts_resample_up_labels(pred, fine, f, full);
        uint8_t *t = pred;
        pred = full;
        full = t;
        nv = nfine;
    }
    /* write (rank 0) */
    lerr = 0;
    if (rank == 0) {
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
        lerr = ts_nifti_write(output, &g, NIFTI_TYPE_UINT8, img->version, pred);
        if (!lerr && probpath) { /* [K][D][H][W]: NIfTI x (W) fastest, classes along the 4th dimension */
            g.dim[3] = u.classes;
            lerr = ts_nifti_write(probpath, &g, NIFTI_TYPE_FLOAT32, img->version, prob);
        }
    }
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    if (rank == 0) printf("infer: %s (%lldx%lldx%lld) -> %s with %s\n", input, (long long)img->dim[0],
                          (long long)img->dim[1], (long long)img->dim[2], output, ck);
    /* Dice against a reference */
    if (label) {
        lerr = ts_nifti_read(label, &ref);
        if (!lerr && (ref->dim[0] != img->dim[0] || ref->dim[1] != img->dim[1] || ref->dim[2] != img->dim[2] ||
                      ref->dim[3] != 1))
            lerr = TS_ERR(TS_ERR_FORMAT, "%s (%lldx%lldx%lldx%lld) is not on the grid of %s", label,
                          (long long)ref->dim[0], (long long)ref->dim[1], (long long)ref->dim[2],
                          (long long)ref->dim[3], input);
        if (!lerr && lmap) lerr = ts_labelmap_load(lmap, &map);
        if (!lerr) {
            lab = malloc((size_t)nv);
            if (!lab) lerr = TS_ERR_NOMEM;
        }
        for (int64_t v = 0; v < nv && !lerr; v++) {
            double x = ts_nifti_get(ref, v);
            int t = (int)x;
            if (map && ts_labelmap_lookup(map, (int64_t)x, &t))
                lerr = TS_ERR(TS_ERR_FORMAT, "%s: label value %g is not in the label map %s", label, x, lmap);
            else if (t < 0 || t >= u.classes)
                lerr = TS_ERR(TS_ERR_FORMAT, "%s: label %d is not a class of the model (%d classes)%s", label, t,
                              u.classes, map ? "" : "; is a label_map= needed?");
            else lab[v] = (uint8_t)t;
        }
        TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
        int64_t tp[256] = {0}, fp[256] = {0}, fn[256] = {0};
        ts_eval_confusion(pred, lab, nv, u.classes, tp, fp, fn);
        if (rank == 0) {
            double mean = 0;
            int nfg = 0;
            printf("Dice per class:");
            for (int k = 0; k < u.classes; k++) {
                double d = ts_eval_dice(tp[k], fp[k], fn[k]);
                const char *nm = map ? ts_labelmap_class_name(map, k) : "";
                printf(" %s%s%d=%.4f", nm, *nm ? "/" : "class ", k, d);
                if (k > 0 && d == d) {
                    mean += d;
                    nfg++;
                }
            }
            printf("\nforeground mean Dice: %.4f\n", nfg ? mean / nfg : 0.0);
        }
    }
cleanup:
    ts_dataset_close(&ds);
    ts_coll_destroy(&coll);
    ts_pipeline_destroy(&pipe);
    ts_coll_destroy(&all);
    ts_spatial_destroy(&sp);
    ts_grid_destroy(&grid);
    ts_unet_destroy(&m);
    ts_nifti_free(&img);
    ts_nifti_free(&ref);
    ts_labelmap_destroy(&map);
    ts_config_destroy(&cfg);
    free(vol);
    free(prob);
    free(pred);
    free(full);
    free(lab);
    free(zeros);
    free(over);
    return err;
}
