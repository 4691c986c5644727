/* tessera infer CONFIG checkpoint=DIR input=SCAN.nii.gz output=MASK.nii.gz
 * [label=SEG.nii.gz [label_map=MAP]]: the arguments of sliding-window
 * inference of a whole scan and its printed summary; the work (prediction,
 * resampling, NIfTI outputs, Dice) is ts_infer_run (src/train/infer.h). */
#include "tsbuild.h"
#include "src/cli/cli.h"
#include "src/core/error.h"
#include "src/train/infer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int ts_cli_infer(int argc, char **argv)
{
    int err = 0, lerr = 0, nover = 0, rank = ts_cli_rank();
    const char *cfgpath = NULL;
    char **over = NULL;
    ts_config *cfg = NULL;
    ts_infer_opts o = {.downsample = 1};
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
    for (int i = 1; i < argc && !lerr; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "checkpoint=", 11)) o.checkpoint = a + 11;
        else if (!strncmp(a, "input=", 6)) o.input = a + 6;
        else if (!strncmp(a, "output=", 7)) o.output = a + 7;
        else if (!strncmp(a, "label=", 6)) o.label = a + 6;
        else if (!strncmp(a, "label_map=", 10)) o.label_map = a + 10;
        else if (!strncmp(a, "probabilities=", 14)) o.probabilities = a + 14;
        else if (!strncmp(a, "downsample=", 11)) {
            char *end;
            long f = strtol(a + 11, &end, 10);
            if (end == a + 11 || *end || f < 1 || f > 8)
                lerr = TS_ERR(TS_ERR_ARG, "infer: downsample=%s must be 1..8", a + 11);
            o.downsample = (int)f;
        }
        else if (a[0] != '-' && strchr(a, '=')) over[nover++] = argv[i];
        else if (!cfgpath && a[0] != '-') cfgpath = a;
        else lerr = TS_ERR(TS_ERR_ARG, "infer: unexpected argument '%s' (see tessera infer --help)", a);
    }
    if (!lerr && (!cfgpath || !o.checkpoint || !o.input || !o.output))
        lerr = TS_ERR(TS_ERR_ARG, "infer: CONFIG, checkpoint=, input= and output= are required (see --help)");
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    TS_CHECK(ts_cli_load_config(cfgpath, nover, over, MPI_COMM_WORLD, &cfg));
    TS_CHECK(ts_infer_run(cfg, MPI_COMM_WORLD, &o, r));
    if (rank == 0) {
        printf("infer: %s (%lldx%lldx%lld) -> %s with %s\n", o.input, (long long)r->dim[0], (long long)r->dim[1],
               (long long)r->dim[2], o.output, r->checkpoint);
        if (r->have_dice) {
            double mean = 0;
            int nfg = 0;
            printf("Dice per class:");
            for (int k = 0; k < r->classes; k++) {
                double d = r->dice[k];
                const char *nm = r->class_names[k];
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
    ts_config_destroy(&cfg);
    free(r);
    free(over);
    return err;
}
