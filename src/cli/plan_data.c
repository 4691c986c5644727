/* tessera plan-data DATASET [CONFIG] [key=value ...] [--mem-mb M]: prints
 * the dataset's fingerprint (io/fingerprint.h) and the plan made from it
 * (src/plan/plan_data.h). Every rank reads and plans; rank 0 prints. */
#include "tsbuild.h"
#include "src/cli/cli.h"
#include "src/core/error.h"
#include "src/plan/plan_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(void)
{
    printf("usage: tessera plan-data DATASET [CONFIG] [section.key=value ...] [--mem-mb M]\n\n"
           "Prints the fingerprint `tessera convert` recorded in DATASET (docs/formats-dataset.md: spacings\n"
           "and shapes before and after cropping, per channel the modality and the foreground intensity\n"
           "statistics) and plans as nnU-Net does (docs/medical.md): the target spacing (per-axis median of\n"
           "the scans' spacings; on an axis more than 3x coarser than the others whose median size is 3x\n"
           "smaller, the 10th percentile), the median shape of the cropped scans at that spacing (of the stored\n"
           "volumes when convert resampled them: the plan is then for the stored grid), and a patch\n"
           "and batch for CONFIG's model (model.*, its optimizer state, data.prefetch; default: the default\n"
           "config; in_channels and classes from the dataset) within --mem-mb M MiB per rank (default 8192,\n"
           "nnU-Net's 8 GB reference) by the memory plan `tessera train` checks against run.mem_limit_mb:\n"
           "the initial patch is a 256^3-voxel box shaped like 1/spacing, clipped to the median shape, in\n"
           "multiples of 2^(levels-1); the axis largest against the median shape shrinks until batch 2 fits;\n"
           "the batch is the largest that fits, at most 5%% of the dataset's voxels, at least 2. Without\n"
           "model.channels in CONFIG or the overrides the network follows the patch as nnU-Net's planner\n"
           "does: a level per pooling that keeps at least 4 voxels on every axis (pooling is isotropic),\n"
           "32 features doubling per level up to 320 (and residual blocks 1,3,4,6,... with model.arch =\n"
           "resenc), recomputed as the patch shrinks. It prints the convert option for the spacing and the\n"
           "data.patch, train.batch, data.norm (and model.channels, model.res_blocks) to use.\n");
}

static void print_fingerprint(const char *path, const ts_fingerprint *fp)
{
    double lo[3] = {1e300, 1e300, 1e300}, hi[3] = {0, 0, 0};
    int64_t slo[3] = {INT64_MAX, INT64_MAX, INT64_MAX}, shi[3] = {0, 0, 0};
    for (int64_t i = 0; i < fp->n; i++)
        for (int d = 0; d < 3; d++) {
            const double s = fp->spacing_orig[3 * i + d];
            const int64_t e = fp->shape_crop[3 * i + d];
            lo[d] = s < lo[d] ? s : lo[d];
            hi[d] = s > hi[d] ? s : hi[d];
            slo[d] = e < slo[d] ? e : slo[d];
            shi[d] = e > shi[d] ? e : shi[d];
        }
    printf("tessera plan-data: %s, %lld sample%s, %d channel%s, %d classes\n", path, (long long)fp->n,
           fp->n > 1 ? "s" : "", fp->C, fp->C > 1 ? "s" : "", fp->K);
    printf("  preprocessing: crop %s, %s", fp->prep.crop ? "nonzero" : "none",
           fp->prep.spacing[0] > 0 ? "resampled to" : fp->prep.downsample > 1 ? "downsampled" : "not resampled");
    if (fp->prep.spacing[0] > 0)
        printf(" %g x %g x %g mm (D, H, W)", fp->prep.spacing[0], fp->prep.spacing[1], fp->prep.spacing[2]);
    printf("\n  scan spacing (D, H, W mm): %g..%g x %g..%g x %g..%g\n", lo[0], hi[0], lo[1], hi[1], lo[2], hi[2]);
    printf("  shape after cropping (D, H, W): %lld..%lld x %lld..%lld x %lld..%lld\n", (long long)slo[0],
           (long long)shi[0], (long long)slo[1], (long long)shi[1], (long long)slo[2], (long long)shi[2]);
    printf("  foreground: %lld voxels (label > 0)%s\n", (long long)fp->fi.voxels,
           fp->fi.voxels ? "" : ": no intensity statistics (data.norm = ct is not available)");
    for (int c = 0; c < fp->C && fp->fi.voxels; c++)
        printf("  channel %d (%s, %s): foreground mean %g std %g min %g max %g, percentiles 0.5/50/99.5: %g %g %g\n",
               c, fp->channel_names[c], fp->prep.modality[c], fp->fi.mean[c], fp->fi.std[c], fp->fi.min[c],
               fp->fi.max[c], fp->fi.pct[c][0], fp->fi.pct[c][1], fp->fi.pct[c][2]);
}

static void print_plan(const ts_plan_data *p)
{
    static const char *axis[3] = {"D", "H", "W"};
    printf("plan (model with %d levels, budget %.0f MiB per rank):\n", p->levels, p->budget_mb);
    printf("  target spacing: %.6g x %.6g x %.6g mm (D, H, W)%s%s%s\n", p->target[0], p->target[1], p->target[2],
           p->aniso_axis >= 0 ? "; anisotropic: " : "", p->aniso_axis >= 0 ? axis[p->aniso_axis] : "",
           p->aniso_axis >= 0 ? " takes the 10th percentile of its spacings" : "");
    if (p->stored)
        printf("  the dataset is resampled already: patch and batch for its stored grid (median spacing %.6g x %.6g x "
               "%.6g mm)\n", p->grid[0], p->grid[1], p->grid[2]);
    printf("  median shape %s: %.1f x %.1f x %.1f\n", p->stored ? "as stored" : "at the target spacing",
           p->median_shape[0], p->median_shape[1], p->median_shape[2]);
    printf("  patch %lld x %lld x %lld, batch %d (memory allows %d, 5%% of the dataset's voxels %d): about %.0f MiB "
           "per rank\n", (long long)p->patch[0], (long long)p->patch[1], (long long)p->patch[2], p->batch, p->batch_mem,
           p->batch_cap, p->mem_mb);
    if (p->stored)
        printf("use (for this dataset; at the target spacing: convert again with --spacing %.6g,%.6g,%.6g and plan "
               "again):\n", p->target[2], p->target[1], p->target[0]);
    else
        printf("use:\n  tessera convert ... --spacing %.6g,%.6g,%.6g   (X,Y,Z = W,H,D)\n", p->target[2], p->target[1],
               p->target[0]);
    printf("  data.patch = %lld,%lld,%lld\n  train.batch = %d\n  data.norm = %s\n", (long long)p->patch[0],
           (long long)p->patch[1], (long long)p->patch[2], p->batch, p->norm);
    if (p->topology) { /* nnU-Net's network topology for the patch */
        printf("  model.channels = ");
        for (int l = 0; l < p->levels; l++) printf("%s%d", l ? "," : "", p->channels[l]);
        printf("\n");
        if (p->resenc) {
            printf("  model.res_blocks = ");
            for (int l = 0; l < p->levels; l++) printf("%s%d", l ? "," : "", p->res_blocks[l]);
            printf("\n");
        }
    }
}

int ts_cli_plan_data(int argc, char **argv)
{
    int err = 0, lerr = 0, nover = 0;
    const char *path = NULL, *cfgpath = NULL;
    double mem = 8192;
    char **over = calloc((size_t)argc + 1, sizeof *over);
    ts_config *cfg = NULL;
    ts_fingerprint fp;
    ts_plan_data plan;
    memset(&fp, 0, sizeof fp);
    if (ts_cli_wants_help(argc, argv)) {
        if (ts_cli_rank() == 0) help();
        free(over);
        return 0;
    }
    if (!over) return TS_ERR_NOMEM;
    for (int i = 1; i < argc && !lerr; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--mem-mb")) {
            char *end = NULL;
            mem = i + 1 < argc ? strtod(argv[++i], &end) : 0;
            if (!end || *end || !(mem > 0)) lerr = TS_ERR(TS_ERR_ARG, "plan-data: --mem-mb needs a positive number of MiB");
        } else if (a[0] != '-' && strchr(a, '=')) {
            over[nover++] = argv[i];
        } else if (a[0] != '-' && !path) {
            path = a;
        } else if (a[0] != '-' && !cfgpath) {
            cfgpath = a;
        } else {
            lerr = TS_ERR(TS_ERR_ARG, "plan-data: unexpected argument '%s' (see tessera plan-data --help)", a);
        }
    }
    if (!lerr && !path) lerr = TS_ERR(TS_ERR_ARG, "plan-data: no DATASET given (see tessera plan-data --help)");
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    TS_CHECK(ts_cli_load_config(cfgpath, nover, over, MPI_COMM_WORLD, &cfg));
    lerr = ts_fingerprint_read(path, &fp);
    if (!lerr) lerr = ts_plan_data_run(cfg, &fp, mem, &plan);
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    if (ts_cli_rank() == 0) {
        print_fingerprint(path, &fp);
        print_plan(&plan);
    }
cleanup:
    ts_fingerprint_free(&fp);
    ts_config_destroy(&cfg);
    free(over);
    return err;
}
