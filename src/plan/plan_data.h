/* `tessera plan-data`: nnU-Net's experiment planning from a dataset's
 * fingerprint (io/fingerprint.h): the target spacing (median, anisotropy
 * rule), the median shape at that spacing, and a patch size and batch that
 * fit a memory budget by the memory plan `tessera train` checks against
 * run.mem_limit_mb (ts_train_memory_plan). */
#ifndef TS_PLAN_PLAN_DATA_H
#define TS_PLAN_PLAN_DATA_H

#include <stdint.h>

#include "io/fingerprint.h"
#include "src/core/config.h"
#include "src/model/unet.h"

typedef struct ts_plan_data {
    double target[3];       /* target spacing, D, H, W (mm) */
    int aniso_axis;         /* the axis the anisotropy rule set, or -1 */
    int stored;             /* 1: the dataset is resampled already (convert --spacing or --downsample): the
                             * patch is planned for its stored grid, not the target spacing */
    double grid[3];         /* the spacing the patch is planned for (target, or the stored median) */
    double median_shape[3]; /* median over the samples of the cropped scan's shape on that grid */
    int64_t patch[3];       /* proposed data.patch (multiples of 2^(levels-1)) */
    int batch;              /* proposed train.batch */
    int batch_cap;          /* nnU-Net's cap: a batch covers at most 5 % of the dataset's voxels (at least 2) */
    int batch_mem;          /* the largest batch the budget holds for that patch */
    double mem_mb;          /* memory plan of patch x batch per rank (MiB) */
    double budget_mb;
    int levels;
    int topology;           /* 1: model.channels was not given: the levels and channels below are proposed */
    int channels[TS_UNET_MAX_LEVELS]; /* model.channels (proposed, or the config's) */
    int resenc;             /* model.arch = resenc: res_blocks proposed with the levels */
    int res_blocks[TS_UNET_MAX_LEVELS];
    /* proposed data.norm: ct when every channel is CT, foreground when none
     * is, else one per channel (ct for CT, foreground for the others) */
    char norm[16 * TS_IO_MAX_CHANNELS];
} ts_plan_data;

/* Local. Plans for the model of cfg (model.*, optimizer state, data.prefetch;
 * model.in_channels and model.classes taken from the dataset) within
 * budget_mb per rank, nnU-Net's way, on the grid training will see (the
 * target spacing; the stored grid when the dataset was resampled at
 * conversion): the initial patch is a 256^3-voxel box
 * shaped like 1 / target spacing, clipped to the median shape and rounded up
 * to multiples of 2^(levels-1); while batch 2 does not fit, the axis with
 * the largest patch / median shape ratio shrinks by 2^(levels-1); then the
 * batch is the largest that fits, capped at 5 % of the dataset's voxels and
 * at least 2. Without model.channels in cfg the network's depth follows the
 * patch, as nnU-Net's planner does: pooling while every axis keeps at least
 * 4 voxels (isotropic pooling, the model's), 32 features doubling per level
 * up to 320, residual blocks 1, 3, 4, 6, ... for model.arch = resenc; the
 * patch shrinks with the topology recomputed. Errors: the budget does not
 * hold the smallest patch at batch 2 (naming what it needs), a bad model
 * config. */
int ts_plan_data_run(const ts_config *cfg, const ts_fingerprint *fp, double budget_mb, ts_plan_data *out);

#endif
