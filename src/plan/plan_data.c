/* Experiment planning from a dataset's fingerprint; see plan_data.h. Owns
 * the choice of patch and batch for `tessera plan-data`; reads the
 * fingerprint only (io/fingerprint.h), no samples. The
 * memory of a candidate is the trainer's own plan (activations, parameters
 * and optimizer state, batch slots, kernel scratch, the process), so a
 * proposal that fits here passes run.mem_limit_mb at the same budget. */
#include "tsbuild.h"
#include "src/plan/plan_data.h"
#include "io/augment_spatial.h"
#include "io/loader.h"
#include "src/core/error.h"
#include "src/model/unet.h"
#include "src/optim/optim.h"
#include "src/train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ts_unet *m;
    ts_unet_cfg u;
    int prefetch;
    double process_mb;
    ts_patch_opts patch;          /* data.augment, the spatial and intensity augmentations: the read box counts;
                                   * the in-plane mode decided per patch as the loader does */
    const char *aug_2d;
    int64_t vol[3];               /* the largest stored volume */
} planner;

static int mem_of(planner *p, const int64_t patch[3], int batch, double *mb)
{
    ts_mem_plan mp;
    memcpy(p->u.patch, patch, sizeof p->u.patch);
    ts_patch_opts po = p->patch;
    po.spatial.plane = ts_spatial_aug_plane_of(p->aug_2d, patch); /* decided per patch, as the loader does */
    const double rb = ts_patch_read_bytes(&po, patch, p->u.in_channels, p->vol);
    TS_TRY(ts_train_memory_plan(p->m, NULL, &p->u, batch, p->u.in_channels, p->prefetch, patch, NULL, rb,
                                p->process_mb, &mp));
    *mb = mp.total_mb;
    return 0;
}

/* the median shape at the target spacing (stored: the stored shapes and
 * their median spacing, into grid), and the voxels of the dataset there */
static void median_shape(const ts_fingerprint *fp, const double target[3], int stored, double grid[3], double out[3],
                         double *voxels)
{
    double *v = malloc(sizeof *v * (size_t)fp->n);
    *voxels = 0;
    for (int d = 0; d < 3; d++) {
        for (int64_t i = 0; i < fp->n && v; i++)
            v[i] = stored ? (double)fp->shape[3 * i + d]
                          : (double)fp->shape_crop[3 * i + d] * fp->spacing_orig[3 * i + d] / target[d];
        out[d] = v ? ts_fp_percentile(v, fp->n, 50) : 1;
        for (int64_t i = 0; i < fp->n && v; i++) v[i] = fp->spacing[3 * i + d];
        grid[d] = !stored ? target[d] : v ? ts_fp_percentile(v, fp->n, 50) : 1;
    }
    free(v);
    *voxels = out[0] * out[1] * out[2] * (double)fp->n;
}

/* nnU-Net's initial patch: a box of 256^3 voxels shaped like 1 / spacing, clipped to the median shape (at
 * least a voxel) */
static void initial_box(const double target[3], const double med[3], double box[3])
{
    double inv[3], prod = 1;
    for (int d = 0; d < 3; d++) {
        inv[d] = 1.0 / target[d];
        prod *= inv[d];
    }
    const double f = cbrt(256.0 * 256.0 * 256.0 / prod);
    for (int d = 0; d < 3; d++) {
        box[d] = round(inv[d] * f);
        if (box[d] > med[d]) box[d] = med[d];
        if (box[d] < 1) box[d] = 1;
    }
}

/* nnU-Net's topology for a patch (get_pool_and_conv_props with isotropic pooling, which is what the model
 * has): pool while every axis keeps at least TS_PLAN_MIN_FEATURE voxels, at most TS_UNET_MAX_LEVELS - 1
 * times; features 32 doubling per level, capped at 320; residual blocks 1, 3, 4, 6, 6, ... (ResEnc M) */
#define TS_PLAN_MIN_FEATURE 4
static void topology(const int64_t patch[3], ts_unet_cfg *u)
{
    static const int blocks[TS_UNET_MAX_LEVELS] = {1, 3, 4, 6, 6, 6, 6, 6};
    int pools = TS_UNET_MAX_LEVELS - 1;
    for (int d = 0; d < 3; d++) {
        int k = 0;
        while (k < pools && patch[d] >> (k + 1) >= TS_PLAN_MIN_FEATURE) k++;
        pools = k;
    }
    u->levels = pools + 1;
    for (int l = 0; l < u->levels; l++) {
        u->channels[l] = 32 << l > 320 ? 320 : 32 << l;
        u->res_blocks[l] = blocks[l];
    }
}

/* the model of planner p for its configuration (p->u) */
static int remodel(planner *p, const ts_optim_cfg *oc)
{
    ts_unet_destroy(&p->m);
    return ts_unet_create(&p->u, ts_optim_state_count(oc), &p->m);
}

/* With the topology chosen (model.channels not given): nnU-Net's initial box, clipped to the median shape;
 * while batch 2 does not fit, the axis with the largest patch / median ratio shrinks by the current
 * 2^(levels-1), the topology following the patch; the patch rounded up to multiples of 2^(levels-1). */
static int fit_patch_topology(planner *p, const ts_optim_cfg *oc, const double target[3], const double med[3],
                              double budget, int64_t patch[3])
{
    double want[3], mb = 0;
    initial_box(target, med, want);
    for (;;) {
        int64_t raw[3];
        for (int d = 0; d < 3; d++) raw[d] = (int64_t)want[d];
        topology(raw, &p->u);
        const int64_t div = (int64_t)1 << (p->u.levels - 1);
        for (int d = 0; d < 3; d++) patch[d] = ((int64_t)ceil(want[d] / (double)div)) * div;
        TS_TRY(remodel(p, oc));
        TS_TRY(mem_of(p, patch, 2, &mb));
        if (mb <= budget) return 0;
        int ax = -1;
        double worst = -1;
        for (int d = 0; d < 3; d++)
            if (want[d] > TS_PLAN_MIN_FEATURE && want[d] / med[d] > worst) {
                worst = want[d] / med[d];
                ax = d;
            }
        if (ax < 0)
            return TS_ERR(TS_ERR_ARG, "plan-data: the smallest patch (%lldx%lldx%lld voxels, batch 2, %d levels) needs "
                          "about %.0f MiB per rank, more than the %.0f MiB budget (--mem-mb): raise it, or give "
                          "model.channels", (long long)patch[0], (long long)patch[1], (long long)patch[2],
                          p->u.levels, mb, budget);
        want[ax] = want[ax] - (double)div > TS_PLAN_MIN_FEATURE ? want[ax] - (double)div : TS_PLAN_MIN_FEATURE;
    }
}

/* the patch: nnU-Net's initial box, clipped and rounded; then shrunk until batch 2 fits */
static int fit_patch(planner *p, const double target[3], const double med[3], int64_t div, double budget,
                     int64_t patch[3])
{
    double box[3], mb = 0;
    initial_box(target, med, box);
    for (int d = 0; d < 3; d++) {
        patch[d] = ((int64_t)ceil(box[d] / (double)div)) * div;
        if (patch[d] < div) patch[d] = div;
    }
    for (;;) {
        TS_TRY(mem_of(p, patch, 2, &mb));
        if (mb <= budget) return 0;
        int ax = -1;
        double worst = -1;
        for (int d = 0; d < 3; d++)
            if (patch[d] > div && patch[d] / med[d] > worst) {
                worst = patch[d] / med[d];
                ax = d;
            }
        if (ax < 0)
            return TS_ERR(TS_ERR_ARG, "plan-data: the smallest patch (%lld^3 voxels, batch 2) needs about %.0f MiB per "
                          "rank, more than the %.0f MiB budget (--mem-mb): raise it or use fewer model.channels or levels",
                          (long long)div, mb, budget);
        patch[ax] -= div;
    }
}

int ts_plan_data_run(const ts_config *cfg, const ts_fingerprint *fp, double budget_mb, ts_plan_data *out)
{
    int err = 0;
    planner p;
    ts_optim_cfg oc;
    int64_t pf;
    memset(&p, 0, sizeof p);
    memset(out, 0, sizeof *out);
    out->budget_mb = budget_mb;
    TS_CHECK(ts_fp_target_spacing(fp->n, fp->spacing_orig, fp->shape_crop, out->target, &out->aniso_axis));
    double voxels;
    out->stored = fp->prep.spacing[0] > 0 || fp->prep.downsample > 1;
    median_shape(fp, out->target, out->stored, out->grid, out->median_shape, &voxels);
    TS_CHECK(ts_unet_cfg_from_config(cfg, &p.u));
    TS_CHECK(ts_optim_cfg_from_config(cfg, &oc));
    TS_CHECK(ts_config_get_int(cfg, "data.prefetch", &pf));
    p.u.in_channels = fp->C;
    p.u.classes = fp->K;
    p.prefetch = (int)pf;
    p.process_mb = ts_train_rss_mb();
    { /* the spatial augmentation's read box, bounded by the largest volume on the planned grid */
        ts_loader_opts lo;
        TS_CHECK(ts_loader_opts_from_config(cfg, &lo));
        TS_CHECK(ts_config_get_str(cfg, "data.aug_2d", &p.aug_2d));
        p.patch = lo.patch;
        for (int64_t i = 0; i < fp->n; i++)
            for (int d = 0; d < 3; d++) {
                const double e = out->stored ? (double)fp->shape[3 * i + d]
                                             : ceil((double)fp->shape_crop[3 * i + d] * fp->spacing_orig[3 * i + d] /
                                                    out->target[d]);
                if (e > (double)p.vol[d]) p.vol[d] = (int64_t)e;
            }
    }
    out->topology = !ts_config_given(cfg, "model.channels");
    if (out->topology) { /* nnU-Net's: the levels follow the patch */
        TS_CHECK(fit_patch_topology(&p, &oc, out->grid, out->median_shape, budget_mb, out->patch));
    } else {
        const int64_t div = (int64_t)1 << (p.u.levels - 1);
        TS_CHECK(ts_unet_create(&p.u, ts_optim_state_count(&oc), &p.m));
        TS_CHECK(fit_patch(&p, out->grid, out->median_shape, div, budget_mb, out->patch));
    }
    out->levels = p.u.levels;
    out->resenc = p.u.arch == TS_ARCH_RESENC;
    for (int l = 0; l < p.u.levels; l++) {
        out->channels[l] = p.u.channels[l];
        out->res_blocks[l] = p.u.res_blocks[l];
    }
    /* the largest batch that fits (memory grows with the batch) */
    int b = 2;
    double mb = 0;
    TS_CHECK(mem_of(&p, out->patch, b, &out->mem_mb));
    while (b < 1024) {
        TS_CHECK(mem_of(&p, out->patch, b + 1, &mb));
        if (mb > budget_mb) break;
        b++;
    }
    out->batch_mem = b;
    const double pv = (double)out->patch[0] * (double)out->patch[1] * (double)out->patch[2];
    out->batch_cap = (int)round(0.05 * voxels / pv);
    if (out->batch_cap < 2) out->batch_cap = 2;
    out->batch = b < out->batch_cap ? b : out->batch_cap;
    TS_CHECK(mem_of(&p, out->patch, out->batch, &out->mem_mb));
    int nct = 0;
    for (int c = 0; c < fp->C; c++) nct += fp->fi.voxels > 0 && !strcmp(fp->prep.modality[c], "CT");
    if (nct == 0 || nct == fp->C) {
        snprintf(out->norm, sizeof out->norm, "%s", nct ? "ct" : "foreground");
    } else { /* nnU-Net's normalisation per modality: a mode per channel */
        size_t at = 0;
        for (int c = 0; c < fp->C && at < sizeof out->norm; c++)
            at += (size_t)snprintf(out->norm + at, sizeof out->norm - at, "%s%s", c ? "," : "",
                                   !strcmp(fp->prep.modality[c], "CT") ? "ct" : "foreground");
    }
cleanup:
    ts_unet_destroy(&p.m);
    return err;
}
