/* tessera convert nifti | msd: NIfTI volumes (one or more image/label
 * pairs, or a Medical Segmentation Decathlon task folder) to a tessera
 * dataset, converted in parallel over the ranks of the job. Parses and
 * prints only: the conversion is io/convert.c's. */
#include "tsbuild.h"
#include "io/convert.h"
#include "io/dataset.h"
#include "src/cli/cli.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void help(void)
{
    printf("usage: tessera convert nifti --image IMG.nii.gz --label SEG.nii.gz [--image ... --label ...]\n"
           "                            [--label-map MAP.txt | --classes K] --out DATA.h5 [OPTIONS]\n"
           "       tessera convert msd TASK_DIR --out DATA.h5 [--label-map MAP.txt] [OPTIONS]\n\n"
           "Converts NIfTI-1/NIfTI-2 volumes (.nii, .nii.gz) to a tessera dataset (docs/formats-dataset.md):\n"
           "per sample an image [C, D, H, W] float32 (C = volumes along t) and a label [D, H, W] uint8.\n"
           "nifti: image/label pairs in order (repeat --image/--label); classes come from the label map,\n"
           "       from --classes K, or from the largest label value + 1 (one extra pass).\n"
           "msd:   TASK_DIR/dataset.json (`modality` = channels, `labels` = classes, `training` = pairs).\n"
           "--label-map MAP  text file, one line per source value: `source_value target_class [name]`\n"
           "                 (configs/labelmaps/); a value missing from the map is an error.\n"
           "options: --shards N (default 1: one file; N: N shard files plus the manifest DATA.h5)\n"
           "         --downsample F (store the volumes on a grid F times coarser: image block means, label\n"
           "         block majority, spacing and affines adjusted; infer with downsample=F to match)\n"
           "         --chunk E (chunk edge in voxels, default 64)  --seed S (foreground subsample, default 0)\n"
           "         --nan-to V (replace non-finite image voxels, NaN and +-Inf, by the finite V, with a warning\n"
           "         naming each file and the count; without it they are an error naming the file and the count)\n"
           "preprocessing (docs/medical.md), recorded per sample and in /fingerprint (tessera infer crops and\n"
           "resamples a new scan the same way and puts its mask back on the scan's grid):\n"
           "         --crop nonzero (crop each scan to the box of its non-zero image voxels, any channel; default\n"
           "         none) then --spacing X,Y,Z (mm along NIfTI i, j, k, as pixdim) or --spacing median (the\n"
           "         target spacing of `tessera plan-data`: per-axis median of the scans' spacings, the 10th\n"
           "         percentile on an anisotropic axis; one extra pass over the images): resample by any factor,\n"
           "         images cubic B-spline (--image-resample cubic, default; nnU-Net's order 3) or\n"
           "         --image-resample linear, labels one-hot linear (--label-resample linear, default; nnU-Net's\n"
           "         order 1) or --label-resample nearest; on an anisotropic scan (largest spacing > 3x the\n"
           "         smallest, one such axis) that axis by nearest voxel, images and labels (--anisotropic-axis\n"
           "         nearest, default; nnU-Net's separate z) or like the others (--anisotropic-axis same).\n"
           "         Default: no resampling. Not with --downsample.\n"
           "         --modality M1,M2,... (per channel: CT, MR or other; default: a channel named CT or MR in\n"
           "         dataset.json is that, others are other); data.norm = ct uses the CT statistics;\n"
           "         plan-data proposes data.norm from them (ct, foreground, or one per channel: ct,foreground)\n"
           "Every dataset records its fingerprint: shapes and spacings before and after cropping, and per\n"
           "channel the foreground (label > 0) intensity mean, std, min, max and 0.5/50/99.5 percentiles.\n"
           "Runs on any number of ranks: each converts its share; one file is written collectively,\n"
           "shards each by one rank. Output goes to temporary names renamed at the end: a failed\n"
           "conversion leaves nothing that looks like a dataset and never replaces an existing one.\n");
}

/* the preprocessing options: 1 when a was one of them (value v), 0 when not */
static int prep_option(const char *a, const char *v, ts_convert_opts *o, int *err)
{
    *err = 0;
    if (strcmp(a, "--crop") && strcmp(a, "--spacing") && strcmp(a, "--label-resample") && strcmp(a, "--modality") &&
        strcmp(a, "--image-resample") && strcmp(a, "--anisotropic-axis"))
        return 0;
    if (!v) {
        *err = TS_ERR(TS_ERR_ARG, "convert: %s needs a value", a);
    } else if (!strcmp(a, "--crop")) {
        if (strcmp(v, "nonzero") && strcmp(v, "none")) *err = TS_ERR(TS_ERR_ARG, "convert: --crop %s (nonzero, none)", v);
        o->crop_nonzero = !strcmp(v, "nonzero");
    } else if (!strcmp(a, "--label-resample")) {
        if (strcmp(v, "linear") && strcmp(v, "nearest"))
            *err = TS_ERR(TS_ERR_ARG, "convert: --label-resample %s (linear, nearest)", v);
        o->label_nearest = !strcmp(v, "nearest");
    } else if (!strcmp(a, "--image-resample")) {
        if (strcmp(v, "cubic") && strcmp(v, "linear"))
            *err = TS_ERR(TS_ERR_ARG, "convert: --image-resample %s (cubic, linear)", v);
        o->image_linear = !strcmp(v, "linear");
    } else if (!strcmp(a, "--anisotropic-axis")) {
        if (strcmp(v, "nearest") && strcmp(v, "same"))
            *err = TS_ERR(TS_ERR_ARG, "convert: --anisotropic-axis %s (nearest, same)", v);
        o->no_separate = !strcmp(v, "same");
    } else if (!strcmp(a, "--modality")) {
        o->modality = v;
    } else if (!strcmp(v, "median")) {
        o->spacing_median = 1;
    } else {
        double x[3];
        char tail;
        if (sscanf(v, "%lf,%lf,%lf%c", &x[0], &x[1], &x[2], &tail) != 3 || !(x[0] > 0) || !(x[1] > 0) || !(x[2] > 0) ||
            !isfinite(x[0] + x[1] + x[2]))
            *err = TS_ERR(TS_ERR_ARG, "convert: --spacing '%s' must be three positive numbers X,Y,Z (mm) or median", v);
        for (int d = 0; d < 3; d++) o->spacing[d] = x[2 - d]; /* NIfTI i, j, k = W, H, D */
    }
    return 1;
}

int ts_cli_convert(int argc, char **argv)
{
    int err = 0;
    const char **images = NULL, **labels = NULL;
    int ni = 0, nl = 0;
    const char *out = NULL, *dir = NULL;
    ts_convert_opts o = {.shards = 1, .chunk = 64};
    if (argc < 2 || ts_cli_wants_help(argc, argv)) {
        if (ts_cli_rank() == 0) help();
        return argc < 2 ? TS_ERR(TS_ERR_ARG, "convert: nifti or msd?") : 0;
    }
    const char *kind = argv[1];
    if (strcmp(kind, "nifti") && strcmp(kind, "msd"))
        return TS_ERR(TS_ERR_ARG, "convert: unknown source '%s' (nifti, msd)", kind);
    images = calloc((size_t)argc, sizeof *images);
    labels = calloc((size_t)argc, sizeof *labels);
    if (!images || !labels) TS_FAIL(TS_ERR_NOMEM, "arguments");
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED()                                                                  \
    do {                                                                        \
        if (!v) TS_FAIL(TS_ERR_ARG, "convert %s: %s needs a value", kind, a);   \
        i++;                                                                    \
    } while (0)
        if (prep_option(a, v, &o, &err)) {
            if (err) goto cleanup;
            i++;
        } else if (!strcmp(a, "--image") && !strcmp(kind, "nifti")) {
            NEED();
            images[ni++] = v;
        } else if (!strcmp(a, "--label") && !strcmp(kind, "nifti")) {
            NEED();
            labels[nl++] = v;
        } else if (!strcmp(a, "--label-map")) {
            NEED();
            o.label_map = v;
        } else if (!strcmp(a, "--classes") && !strcmp(kind, "nifti")) {
            NEED();
            o.classes = atoi(v);
            if (o.classes < 2 || o.classes > TS_IO_MAX_CLASSES)
                TS_FAIL(TS_ERR_ARG, "convert: --classes %s (2..%d)", v, TS_IO_MAX_CLASSES);
        } else if (!strcmp(a, "--out")) {
            NEED();
            out = v;
        } else if (!strcmp(a, "--downsample")) {
            NEED();
            o.downsample = atoi(v);
            if (o.downsample < 1 || o.downsample > 8) TS_FAIL(TS_ERR_ARG, "convert: --downsample %s must be 1..8", v);
        } else if (!strcmp(a, "--shards")) {
            NEED();
            o.shards = atoi(v);
            if (o.shards < 1) TS_FAIL(TS_ERR_ARG, "convert: --shards %s must be >= 1", v);
        } else if (!strcmp(a, "--chunk")) {
            NEED();
            o.chunk = atoi(v);
            if (o.chunk < 1 || o.chunk > 4096) TS_FAIL(TS_ERR_ARG, "convert: --chunk %s (1..4096)", v);
        } else if (!strcmp(a, "--nan-to")) {
            NEED();
            char *end;
            double x = strtod(v, &end);
            if (end == v || *end || !isfinite(x) || fabs(x) > FLT_MAX)
                TS_FAIL(TS_ERR_ARG, "convert: --nan-to '%s' must be a finite float32 number", v);
            o.nan_to_set = 1;
            o.nan_to = (float)x;
        } else if (!strcmp(a, "--seed")) {
            NEED();
            o.seed = strtoull(v, NULL, 10);
        } else if (a[0] != '-' && !strcmp(kind, "msd") && !dir) {
            dir = a;
        } else {
            TS_FAIL(TS_ERR_ARG, "convert %s: unexpected argument '%s' (see --help)", kind, a);
        }
#undef NEED
    }
    if (!out) TS_FAIL(TS_ERR_ARG, "convert %s: --out is required", kind);
    if (o.label_map && o.classes) TS_FAIL(TS_ERR_ARG, "convert: give --label-map or --classes, not both");
    double t0 = ts_time_now();
    if (!strcmp(kind, "nifti")) {
        if (!ni || ni != nl)
            TS_FAIL(TS_ERR_ARG, "convert nifti: %d --image and %d --label: give them in pairs", ni, nl);
        TS_CHECK(ts_convert_nifti(MPI_COMM_WORLD, ni, images, labels, &o, out));
    } else {
        if (!dir) TS_FAIL(TS_ERR_ARG, "convert msd: the task folder is required");
        TS_CHECK(ts_convert_msd(MPI_COMM_WORLD, dir, &o, out));
    }
    if (ts_cli_rank() == 0)
        printf("convert %s: wrote %s%s in %.1f s on %d rank%s\n", kind, out,
               o.shards > 1 ? " (manifest) and its shards" : "", ts_time_now() - t0, ts_cli_size(),
               ts_cli_size() > 1 ? "s" : "");
cleanup:
    free(images);
    free(labels);
    return err;
}
