/* tessera infer CONFIG checkpoint=DIR input=SCAN|DIR|LIST output=MASK|DIR
 * [label=SEG|DIR [label_map=MAP]] [mirror=AXES] [keep_largest=CLASSES |
 * postprocess=PP.json] [decide=PP.json] [preprocess=dataset|none] ...: the
 * arguments of sliding-window inference and its printed summary; the work
 * (the dataset's preprocessing, prediction, mirroring, post-processing,
 * NIfTI outputs, metrics) is ts_infer_run (src/infer/infer.h). */
#include "tsbuild.h"
#include "src/cli/cli.h"
#include "src/core/error.h"
#include "src/infer/evaluate.h"
#include "src/infer/infer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(void)
{
    printf("usage: [mpiexec.mpich -n N] tessera infer CONFIG checkpoint=DIR input=SCAN|DIR|A,B,...|LIST\n"
           "                                  output=MASK.nii.gz|DIR [label=SEG.nii.gz|DIR [label_map=MAP.txt]]\n"
           "                                  [mirror=xyz] [keep_largest=all|foreground,1,2,... | postprocess=PP.json]\n"
           "                                  [decide=PP.json] [nsd_tol=MM] [metrics=FILE.json]\n"
           "                                  [downsample=F] [probabilities=PROB.nii.gz|DIR] [preprocess=dataset|none]\n"
           "                                  [precision=fp32|bf16|fp16] [conv=winograd|direct] [batch=N] [streams=S]\n"
           "                                  [section.key=value ...]\n\n"
           "Predicts label volumes for NIfTI scans (channels along the 4th dimension) with the model of\n"
           "CONFIG and the parameters of a checkpoint, loaded once: DIR is a checkpoint (ckpt/step-<N>), a\n"
           "checkpoint folder (the newest complete one is used) or a run directory. input= is one scan, a\n"
           "folder (its *.nii and *.nii.gz, by name), names separated by commas, or a list file (a path a\n"
           "line); with several scans output= (and probabilities=) is a folder, created if missing, and\n"
           "each mask is named as its scan. Each scan is normalised as training patches are (data.norm,\n"
           "data.clip), cut into windows of data.patch with eval.overlap, predicted with Gaussian weighting\n"
           "and written as uint8 NIfTI with its dimensions, voxel sizes and sform/qform. The windows are\n"
           "split over the data-parallel replicas; parallel.sp splits each window's volume over a spatial\n"
           "group and parallel.pp passes it through pipeline stages, as in training (both from CONFIG:\n"
           "override them on the command line, e.g. parallel.sp=1 on one rank).\n"
           "mirror=AXES (x, y, z: the NIfTI axes, e.g. xyz; default none) is test-time mirroring: the\n"
           "scan is also predicted flipped along each subset of AXES (8 predictions for xyz, as nnU-Net)\n"
           "and the class probabilities flipped back and averaged.\n"
           "label= (a file, or with several scans a folder matched by file name; .nii/.nii.gz and an\n"
           "nnU-Net channel suffix _0000 are tolerated) adds per-class Dice, HD95 and NSD (millimetres\n"
           "from the header's voxel sizes; NSD within nsd_tol= mm, default 1), mapped through label_map=\n"
           "first (e.g. configs/labelmaps/aal-3class.txt for the AAL atlas); they are printed per scan,\n"
           "as mean and sample std over the scans, and written to metrics= (default: MASK.metrics.json\n"
           "next to the mask, or DIR/metrics.json).\n"
           "keep_largest= keeps only the largest 26-connected component of the classes named (all: every\n"
           "foreground class; foreground: of the whole foreground as one region, before the classes);\n"
           "postprocess=PP.json applies a decision written by decide=PP.json, which with label= on\n"
           "validation scans follows nnU-Net's rule: the whole foreground's largest component where that\n"
           "raises the mean over the classes of their mean Dice, then a class's where that raises its own.\n"
           "downsample=F predicts on a grid F times coarser (as `convert --downsample F` stored the training\n"
           "data) and writes the labels back on the scan's own grid. probabilities= also writes the\n"
           "class probabilities (float32, 4-D: x, y, z, class; not with downsample=).\n"
           "preprocess=dataset (the default): when data.path names a dataset whose fingerprint records a\n"
           "crop to the non-zero box and/or a target spacing (tessera convert --crop nonzero --spacing),\n"
           "each scan is cropped and resampled the same way before it is normalised and predicted, and\n"
           "the labels are resampled back onto the scan's grid (background outside the crop box), the\n"
           "probabilities= too (each class linearly, background 1 outside the box, as nnU-Net exports\n"
           "them); downsample= must be the dataset's. preprocess=none predicts on the scan as it is.\n"
           "precision= is the convolutions' precision (default: CONFIG's train.precision; bf16 runs on\n"
           "AVX512-BF16 where the CPU has it, on AMX tiles where it has those; docs/performance.md states the\n"
           "Dice bf16 keeps against fp32);\n"
           "conv=winograd (the default; for bf16 on AMX tiles the default is direct, which is faster there)\n"
           "runs the 3x3x3 convolutions with at least 16 input and 16 output\n"
           "channels (fp32: also 16+ input and at most 8 output) as Winograd F(2x2x2, 3x3x3) convolutions\n"
           "(64 instead of 216 multiplications per 2x2x2 outputs; fp32: probabilities within about 1e-6\n"
           "of the direct convolution's, not the same bits; bf16: the layers with 64+ channels in and out\n"
           "together, bf16 products with fp32 sums; docs/engine.md); conv=direct runs them all as direct\n"
           "convolutions. fp16 is always direct.\n"
           "batch=N puts N windows in each forward (default: train.batch). streams=S runs S forwards at\n"
           "once on each rank, each with its own copy of the model (S times the activations) and\n"
           "OMP_NUM_THREADS / S threads, taking the next forward when done (a stream on a slower or shared\n"
           "core runs fewer), their probabilities added in the order of one stream (the same result); at\n"
           "most one stream a thread, only with parallel.sp = parallel.pp = 1. Default, with\n"
           "neither batch= nor streams= given: a stream a thread where the threads divide train.batch,\n"
           "each forward taking train.batch / threads windows (the same windows in flight), else 1.\n"
           "train.engine (CONFIG's, or train.engine=cpu|cuda|auto on the command line; default auto) runs\n"
           "the windows' forwards on the GPU of each rank's local rank where one is found and the layout\n"
           "allows (parallel.sp = parallel.pp = 1, model.arch = unet; one stream), through cuDNN in\n"
           "precision=; reading, blending and writing stay on the host. Written on 2026-12-06 and not yet\n"
           "run on a GPU (the model's GPU forward itself is checked: docs/gpu.md).\n"
           "The closing line says where the time went (set-up, reading, the network, blending the windows,\n"
           "writing, metrics) and the network's GFLOP/s; `tessera bench infer` times the command against\n"
           "the machine's peak.\n");
}

static void print_row(const char *title, const double *v, const ts_infer_scan *s, const ts_infer_result *r)
{
    printf("%s", title);
    for (int k = 0; k < s->classes; k++)
        printf(" %s%s%d=%.4f", r->class_names[k], *r->class_names[k] ? "/" : "class ", k, v[k]);
    printf("\n");
}

/* rank 0 prints each scan as it is done */
static void on_scan(const ts_infer_scan *s, void *ctx)
{
    const ts_infer_result *r = ctx;
    if (ts_cli_rank() != 0) return;
    printf("infer: [%d/%d] %s (%lldx%lldx%lld) -> %s", s->index + 1, s->count, s->input, (long long)s->dim[0],
           (long long)s->dim[1], (long long)s->dim[2], s->output);
    if (s->prep_dim[0])
        printf(" (predicted preprocessed: %lldx%lldx%lld)", (long long)s->prep_dim[0], (long long)s->prep_dim[1],
               (long long)s->prep_dim[2]);
    printf("\n");
    if (!s->have_metrics) return;
    print_row("Dice per class:", s->dice, s, r);
    print_row("HD95 per class (mm):", s->hd95, s, r);
    print_row("NSD per class:", s->nsd, s, r);
    printf("foreground mean Dice: %.4f\n", s->fg_dice);
}

static void print_stat(const char *title, const ts_infer_stat *st, const ts_infer_result *r)
{
    printf("%s", title);
    for (int k = 0; k < r->classes; k++)
        printf(" %s%s%d=%.4f+-%.4f(n=%d)", r->class_names[k], *r->class_names[k] ? "/" : "class ", k, st[k].mean,
               st[k].std, st[k].n);
    printf("\n");
}

static void print_summary(const ts_infer_opts *o, const ts_infer_result *r)
{
    printf("infer: %d scan%s with %s\n", r->nscans, r->nscans == 1 ? "" : "s", r->checkpoint);
    if (r->prep_on) {
        printf("preprocessing of %s replayed:%s", r->prep_from, r->prep_crop ? " crop to the non-zero box" : "");
        if (r->prep_spacing[0] > 0)
            printf("%s resampled to %g x %g x %g mm (x, y, z)", r->prep_crop ? "," : "", r->prep_spacing[2],
                   r->prep_spacing[1], r->prep_spacing[0]);
        printf("\n");
    }
    char on[96] = "";
    if (r->streams > 1)
        snprintf(on, sizeof on, " on %d streams (%lld to %lld a stream)", r->streams, (long long)r->stream_min,
                 (long long)r->stream_max);
    printf("infer: %.2f s: set-up %.2f, reading %.2f, prediction %.2f (network %.2f: %lld windows in %lld forwards of "
           "%d%s, %s %s, %.1f GFLOP/s; blending %.2f, sums %.2f), writing %.2f, metrics %.2f\n",
           r->total_s, r->setup_s, r->read_s, r->predict_s, r->network_s, (long long)r->windows, (long long)r->forwards,
           r->batch, on, r->precision, r->conv, r->network_s > 0 ? r->flop_per_window * (double)r->windows / r->network_s / 1e9 : 0,
           r->blend_s, r->reduce_s, r->write_s, r->metrics_s);
    if (!r->have_dice) return;
    if (r->nscans > 1) {
        print_stat("mean Dice over the scans:", r->mean_dice, r);
        print_stat("mean HD95 over the scans (mm):", r->mean_hd95, r);
        print_stat("mean NSD over the scans:", r->mean_nsd, r);
        printf("foreground mean Dice over %d scans: %.4f +- %.4f (sample std)\n", r->fg_dice.n, r->fg_dice.mean,
               r->fg_dice.std);
    }
    printf("metrics: %s (NSD tolerance %g mm)\n", r->metrics, r->nsd_tol);
    if (r->decided) {
        printf("post-processing decided (%s): %skeep the largest component of", o->decide,
               r->decision[0] ? "keep the whole foreground's largest component, then " : "");
        int any = 0;
        for (int k = 1; k < r->classes; k++)
            if (r->decision[k]) printf(" %d", k), any = 1;
        printf("%s\n", any ? "" : " no class");
    }
}

/* mirror=AXES: letters x, y, z (or "none") into TS_INFER_MIRROR_* */
static int parse_mirror(const char *a, int *mask)
{
    if (!ts_eval_parse_axes(a, mask)) return 0; /* TS_INFER_MIRROR_* are the TS_EVAL_FLIP_* bits */
    return *a ? TS_ERR(TS_ERR_ARG, "infer: mirror=%s: give axes x, y, z (e.g. xyz) or none", a)
              : TS_ERR(TS_ERR_ARG, "infer: mirror= is empty: give axes x, y, z (e.g. xyz) or none");
}

int ts_cli_infer_opt(const char *a, ts_infer_opts *o, int *lerr)
{
    static const char *keys[] = {"checkpoint=", "input=", "output=", "label=", "label_map=", "probabilities=",
                                 "metrics=", "keep_largest=", "postprocess=", "decide=", "precision=", "conv="};
    const char **dst[] = {&o->checkpoint, &o->input, &o->output, &o->label, &o->label_map, &o->probabilities,
                          &o->metrics, &o->keep_largest, &o->postprocess, &o->decide, &o->precision, &o->conv};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!strncmp(a, keys[i], strlen(keys[i]))) {
            *dst[i] = a + strlen(keys[i]);
            return 0;
        }
    char *end;
    if (!strncmp(a, "downsample=", 11)) {
        long f = strtol(a + 11, &end, 10);
        if (end == a + 11 || *end || f < 1 || f > 8)
            *lerr = TS_ERR(TS_ERR_ARG, "infer: downsample=%s must be 1..8", a + 11);
        o->downsample = (int)f;
    } else if (!strncmp(a, "batch=", 6)) {
        long b = strtol(a + 6, &end, 10);
        if (end == a + 6 || *end || b < 1 || b > 4096)
            *lerr = TS_ERR(TS_ERR_ARG, "infer: batch=%s must be 1..4096 windows per forward", a + 6);
        o->batch = (int)b;
    } else if (!strncmp(a, "streams=", 8)) {
        long n = strtol(a + 8, &end, 10);
        if (end == a + 8 || *end || n < 1 || n > 1024)
            *lerr = TS_ERR(TS_ERR_ARG, "infer: streams=%s must be 1..1024 forwards at once (at most the threads)", a + 8);
        o->streams = (int)n;
    } else if (!strncmp(a, "nsd_tol=", 8)) {
        o->nsd_tol = strtod(a + 8, &end);
        if (end == a + 8 || *end || !isfinite(o->nsd_tol) || o->nsd_tol < 0)
            *lerr = TS_ERR(TS_ERR_ARG, "infer: nsd_tol=%s must be a distance in mm >= 0", a + 8);
    } else if (!strncmp(a, "mirror=", 7)) *lerr = parse_mirror(a + 7, &o->mirror);
    else if (!strncmp(a, "preprocess=", 11)) {
        if (!strcmp(a + 11, "none")) o->preprocess = TS_INFER_PREP_NONE;
        else if (!strcmp(a + 11, "dataset")) o->preprocess = TS_INFER_PREP_DATASET;
        else *lerr = TS_ERR(TS_ERR_ARG, "infer: preprocess=%s: give dataset or none", a + 11);
    }
    else return 1;
    return 0;
}

int ts_cli_infer(int argc, char **argv)
{
    int err = 0, lerr = 0, nover = 0, rank = ts_cli_rank();
    const char *cfgpath = NULL;
    char **over = NULL;
    ts_config *cfg = NULL;
    ts_infer_opts o = {.downsample = 1, .nsd_tol = -1, .on_scan = on_scan};
    ts_infer_result *r = NULL;
    if (ts_cli_wants_help(argc, argv)) {
        if (rank == 0) help();
        return 0;
    }
    over = calloc((size_t)argc, sizeof *over);
    r = malloc(sizeof *r);
    if (!over || !r) {
        free(over);
        free(r);
        return TS_ERR(TS_ERR_NOMEM, "arguments");
    }
    o.on_scan_ctx = r;
    for (int i = 1; i < argc && !lerr; i++) {
        const char *a = argv[i];
        if (!ts_cli_infer_opt(a, &o, &lerr)) continue;
        if (a[0] != '-' && strchr(a, '=')) over[nover++] = argv[i];
        else if (!cfgpath && a[0] != '-') cfgpath = a;
        else lerr = TS_ERR(TS_ERR_ARG, "infer: unexpected argument '%s' (see tessera infer --help)", a);
    }
    if (!lerr && (!cfgpath || !o.checkpoint || !o.input || !o.output))
        lerr = TS_ERR(TS_ERR_ARG, "infer: CONFIG, checkpoint=, input= and output= are required (see --help)");
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    TS_CHECK(ts_cli_load_config(cfgpath, nover, over, MPI_COMM_WORLD, &cfg));
    TS_CHECK(ts_infer_run(cfg, MPI_COMM_WORLD, &o, r));
    if (rank == 0) print_summary(&o, r);
cleanup:
    ts_config_destroy(&cfg);
    free(r);
    free(over);
    return err;
}
