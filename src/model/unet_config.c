/* Config keys of the model, the loss and the data patch, and their
 * validation into a ts_unet_cfg (errors name the key). Owns that key table
 * (model.*, data.patch, and train.loss, batch, seed, precision, engine and the
 * loss's options); builds no model and allocates nothing. */
#include "tsbuild.h"
#include "src/model/unet.h"
#include "src/core/error.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const ts_cfg_key ts_model_config_keys[] = {
    {"model.channels", TS_CFG_INTLIST, "16,32,64,128", "1:4096", "channels per level (the number of entries is the number of levels, at most 8)"},
    {"model.in_channels", TS_CFG_INT, "1", "1:4096", "input image channels"},
    {"model.classes", TS_CFG_INT, "2", "2:256", "classes K (labels 0..K-1)"},
    {"model.arch", TS_CFG_ENUM, "unet", "unet|resenc", "unet: the plain UNet3D (two conv blocks per encoder level, "
     "max-pool); resenc: nnU-Net's residual encoder (a stem conv, model.res_blocks residual blocks per level, strided "
     "convs between levels) with the plain decoder"},
    {"model.res_blocks", TS_CFG_INTLIST, "1,3,4,6,6,6,6,6", "1:8", "resenc: residual blocks per encoder level (one "
     "entry per level of model.channels at least; nnU-Net ResEnc M/L: 1,3,4,6,6,6)"},
    {"model.deep_supervision", TS_CFG_BOOL, "false", NULL, "auxiliary 1x1x1 heads ds1..ds{L-3} on the decoder levels "
     "below full resolution; loss = sum of each level's loss against the labels downsampled (nearest), weights "
     "1/2^l with the lowest decoder level's set to 0, normalised (nnU-Net); needs at least 4 levels"},
    {"model.norm", TS_CFG_ENUM, "batch", "batch|group|instance", "normalisation after each conv"},
    {"model.act", TS_CFG_ENUM, "relu", "relu|leaky_relu", "activation after each norm (nnU-Net: leaky_relu)"},
    {"model.leaky_slope", TS_CFG_FLOAT, "0.01", "0:1", "leaky ReLU: negative slope (nnU-Net and PyTorch: 0.01)"},
    {"model.groups", TS_CFG_INT, "8", "1:4096", "group norm: groups (must divide every level's channels)"},
    {"model.norm_eps", TS_CFG_FLOAT, "1e-5", "0:1", "epsilon of the norms"},
    {"model.bn_momentum", TS_CFG_FLOAT, "0.1", "0:1", "batch norm: running-statistics momentum (PyTorch convention)"},
    {"model.checkpoint_levels", TS_CFG_STRING, "none", NULL,
     "levels whose encoder and decoder blocks are recomputed in backward instead of kept: none, all, or a comma "
     "list such as 0,1 (level 0 = full resolution)"},
    {"data.patch", TS_CFG_INTLIST, "64", "1:65536", "patch edge, or D,H,W; divisible by 2^(levels-1)"},
    {"train.batch", TS_CFG_INT, "2", "1:65536", "micro-batch per rank"},
    {"train.seed", TS_CFG_INT, "0", "0:", "seed of initialisation and random data"},
    {"train.loss", TS_CFG_ENUM, "ce", "ce|dice|ce+dice", "cross-entropy (mean over voxels), soft Dice, or their sum"},
    {"train.ignore_index", TS_CFG_INT, "-1", "-1:255", "label value excluded from the loss (-1: none)"},
    {"train.class_weights", TS_CFG_STRING, NULL, NULL, "cross-entropy class weights: K comma-separated positive numbers"},
    {"train.precision", TS_CFG_ENUM, "fp32", "fp32|bf16|fp16", "convolutions' operands: fp32; bf16 (AVX512-BF16 "
     "where the CPU has it, else emulated); fp16 (rounded to IEEE half, fp32 arithmetic: fp16 numerics, not speed; "
     "with dynamic loss scaling in training). Sums, weights, norms, loss and optimizer stay fp32"},
    {"train.engine", TS_CFG_ENUM, "auto", "auto|cpu|cuda", "where the layers run: cpu; cuda (cuDNN/cuBLAS on this "
     "rank's GPU, local rank % GPUs; not the residual encoder on a spatial split so far; the plain UNet3D data "
     "parallel equal to the CPU on an H200 on 2026-12-04, at a fraction of PyTorch's speed; the residual encoder, "
     "pipelines and spatial splits checked under the CPU's CUDA emulator only: docs/gpu.md); auto: cuda where a GPU "
     "is found and the run is one it runs, else cpu"},
    {"train.conv", TS_CFG_ENUM, "direct", "direct|winograd", "3x3x3 convolutions on the CPU with at least 16 "
     "input and 16 output channels (no spatial split): direct; winograd: fp32: their forward, input gradient and "
     "(48+ channels in and out, 256+ 2x2x2 tiles) weight gradient as Winograd F(2x2x2, 3x3x3) convolutions (64 "
     "instead of 216 multiplications per 2x2x2 outputs; results within about 1e-6 of the direct ones, not the same "
     "bits); bf16: those with 64+ channels in and out together (the weight gradient also 256+ tiles), bf16 "
     "products (errors about 2.5-3x the direct bf16 kernels'); docs/engine.md"},
    {"train.tf32", TS_CFG_BOOL, "true", NULL, "train.engine = cuda, train.precision = fp32: the convolutions may use "
     "TF32 tensor cores (10-bit products, fp32 sums; PyTorch's cudnn.allow_tf32); false: fp32 products"},
    {NULL, 0, NULL, NULL, NULL},
};

int ts_unet_parse_checkpoint_levels(const char *s, int levels, const char *src, unsigned *mask)
{
    *mask = 0;
    if (!strcmp(s, "none")) return 0;
    if (!strcmp(s, "all")) {
        *mask = (1u << levels) - 1;
        return 0;
    }
    const char *p = s;
    do {
        while (*p == ' ') p++;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        while (*end == ' ') end++;
        if (end == p || errno || (*end && *end != ','))
            return TS_ERR(TS_ERR_CONFIG, "model.checkpoint_levels = '%s' (%s): expected none, all, or a comma list of "
                          "levels 0..%d", s, src, levels - 1);
        if (v < 0 || v >= levels)
            return TS_ERR(TS_ERR_CONFIG, "model.checkpoint_levels = '%s' (%s): level %ld does not exist: the %d levels of "
                          "model.channels are 0..%d (0 = full resolution)", s, src, v, levels, levels - 1);
        if (*mask >> v & 1u)
            return TS_ERR(TS_ERR_CONFIG, "model.checkpoint_levels = '%s' (%s): level %ld is listed twice", s, src, v);
        *mask |= 1u << v;
        p = *end ? end + 1 : end;
    } while (*p || p[-1] == ',');
    return 0;
}

const char *ts_unet_checkpoint_str(unsigned mask, char *buf, size_t n)
{
    size_t k = 0;
    if (n) buf[0] = 0;
    if (!mask) snprintf(buf, n, "none");
    for (int l = 0; l < TS_UNET_MAX_LEVELS && k < n; l++)
        if (mask >> l & 1) k += (size_t)snprintf(buf + k, n - k, "%s%d", k ? "," : "", l);
    return buf;
}

double ts_unet_ds_weight(const ts_unet_cfg *u, int l)
{
    if (!u->deep_supervision) return l == 0;
    const int n = u->levels - 1; /* decoder outputs: levels 0 .. L-2 */
    if (l < 0 || l >= n) return 0;
    double sum = 0;
    for (int i = 0; i < n - 1; i++) sum += 1.0 / (double)(1 << i);
    return l == n - 1 ? 0 : 1.0 / (double)(1 << l) / sum;
}

int ts_unet_is_plain(const ts_unet_cfg *u) { return u->arch == TS_ARCH_UNET && !u->deep_supervision; }

int ts_unet_check_input(const ts_unet_cfg *u, const int64_t dhw[3], const char *what)
{
    const int64_t f = (int64_t)1 << (u->levels - 1);
    for (int i = 0; i < 3; i++)
        if (dhw[i] < f || dhw[i] % f)
            return TS_ERR(TS_ERR_ARG,
                          "%s: size %lldx%lldx%lld: every edge must be a positive multiple of 2^(levels-1) = %lld "
                          "for the %d levels of model.channels",
                          what, (long long)dhw[0], (long long)dhw[1], (long long)dhw[2], (long long)f, u->levels);
    return 0;
}

int ts_unet_cfg_from_config(const ts_config *cfg, ts_unet_cfg *u)
{
    int64_t ch[TS_UNET_MAX_LEVELS + 1], v;
    int n;
    const char *s;
    double f;
    memset(u, 0, sizeof *u);
    if (ts_config_get_intlist(cfg, "model.channels", ch, TS_UNET_MAX_LEVELS + 1, &n) || n > TS_UNET_MAX_LEVELS)
        return TS_ERR(TS_ERR_CONFIG, "model.channels (%s): 1 to %d levels", ts_config_source(cfg, "model.channels"),
                      TS_UNET_MAX_LEVELS);
    u->levels = n;
    for (int i = 0; i < n; i++) u->channels[i] = (int)ch[i];
    TS_TRY(ts_config_get_int(cfg, "model.in_channels", &v));
    u->in_channels = (int)v;
    TS_TRY(ts_config_get_int(cfg, "model.classes", &v));
    u->classes = (int)v;
    TS_TRY(ts_config_get_str(cfg, "model.norm", &s));
    u->norm = !strcmp(s, "batch") ? TS_NORM_BATCH : !strcmp(s, "group") ? TS_NORM_GROUP : TS_NORM_INSTANCE;
    TS_TRY(ts_config_get_int(cfg, "model.groups", &v));
    u->groups = (int)v;
    if (u->norm == TS_NORM_GROUP)
        for (int i = 0; i < n; i++)
            if (u->channels[i] % u->groups)
                return TS_ERR(TS_ERR_CONFIG,
                              "model.groups = %d (%s) does not divide model.channels entry %d (level %d, %s): group "
                              "norm needs every level's channels to be a multiple of the groups",
                              u->groups, ts_config_source(cfg, "model.groups"), u->channels[i], i,
                              ts_config_source(cfg, "model.channels"));
    TS_TRY(ts_config_get_float(cfg, "model.norm_eps", &f));
    u->eps = (float)f;
    TS_TRY(ts_config_get_float(cfg, "model.bn_momentum", &f));
    u->momentum = (float)f;
    int np;
    if (ts_config_get_intlist(cfg, "data.patch", u->patch, 3, &np) || (np != 1 && np != 3))
        return TS_ERR(TS_ERR_CONFIG, "data.patch (%s): one edge or D,H,W", ts_config_source(cfg, "data.patch"));
    if (np == 1) u->patch[1] = u->patch[2] = u->patch[0];
    {
        char what[160];
        snprintf(what, sizeof what, "data.patch (%s)", ts_config_source(cfg, "data.patch"));
        TS_TRY(ts_unet_check_input(u, u->patch, what));
    }
    TS_TRY(ts_config_get_str(cfg, "model.checkpoint_levels", &s));
    TS_TRY(ts_unet_parse_checkpoint_levels(s, n, ts_config_source(cfg, "model.checkpoint_levels"), &u->ckpt_levels));
    TS_TRY(ts_config_get_str(cfg, "model.arch", &s));
    u->arch = !strcmp(s, "resenc") ? TS_ARCH_RESENC : TS_ARCH_UNET;
    {
        int64_t rb[TS_UNET_MAX_LEVELS + 1];
        int nb;
        if (ts_config_get_intlist(cfg, "model.res_blocks", rb, TS_UNET_MAX_LEVELS + 1, &nb) ||
            (u->arch == TS_ARCH_RESENC && nb < n))
            return TS_ERR(TS_ERR_CONFIG, "model.res_blocks (%s): one entry (1..%d) per level, %d levels in "
                          "model.channels (%s)", ts_config_source(cfg, "model.res_blocks"), TS_UNET_MAX_RES_BLOCKS, n,
                          ts_config_source(cfg, "model.channels"));
        for (int i = 0; i < n; i++) u->res_blocks[i] = i < nb ? (int)rb[i] : 1;
    }
    TS_TRY(ts_config_get_bool(cfg, "model.deep_supervision", &u->deep_supervision));
    if (u->deep_supervision && n < 4)
        return TS_ERR(TS_ERR_CONFIG, "model.deep_supervision (%s) needs at least 4 levels in model.channels (%s has "
                      "%d): nnU-Net's weights give the lowest decoder output weight 0, so below 4 levels only the "
                      "full-resolution output would be left", ts_config_source(cfg, "model.deep_supervision"),
                      ts_config_source(cfg, "model.channels"), n);
    TS_TRY(ts_config_get_str(cfg, "model.act", &s));
    u->act = !strcmp(s, "leaky_relu") ? TS_ACT_LEAKY : TS_ACT_RELU;
    TS_TRY(ts_config_get_float(cfg, "model.leaky_slope", &f));
    u->slope = (float)f;
    TS_TRY(ts_config_get_str(cfg, "train.loss", &s));
    u->loss = !strcmp(s, "ce") ? TS_LOSS_CE : !strcmp(s, "dice") ? TS_LOSS_DICE : TS_LOSS_CE_DICE;
    TS_TRY(ts_config_get_str(cfg, "train.precision", &s));
    u->precision = !strcmp(s, "bf16") ? TS_PREC_BF16 : !strcmp(s, "fp16") ? TS_PREC_FP16 : TS_PREC_FP32;
    TS_TRY(ts_config_get_str(cfg, "train.engine", &s));
    u->engine = !strcmp(s, "cuda") ? TS_ENGINE_CUDA : !strcmp(s, "cpu") ? TS_ENGINE_CPU : TS_ENGINE_AUTO;
    TS_TRY(ts_config_get_bool(cfg, "train.tf32", &u->tf32));
    TS_TRY(ts_config_get_str(cfg, "train.conv", &s));
    u->conv_winograd = !strcmp(s, "winograd");
    TS_TRY(ts_config_get_int(cfg, "train.ignore_index", &v));
    u->ignore_index = (int)v;
    if (u->ignore_index >= 0 && u->ignore_index < u->classes)
        return TS_ERR(TS_ERR_CONFIG, "train.ignore_index = %d (%s) is one of the %d classes", u->ignore_index,
                      ts_config_source(cfg, "train.ignore_index"), u->classes);
    if (ts_config_isset(cfg, "train.class_weights")) {
        TS_TRY(ts_config_get_str(cfg, "train.class_weights", &s));
        const char *p = s;
        int k = 0;
        while (*p) {
            char *end;
            errno = 0;
            double w = strtod(p, &end);
            if (end == p || errno || !isfinite(w) || w <= 0 || k >= u->classes)
                return TS_ERR(TS_ERR_CONFIG, "train.class_weights = '%s' (%s): needs %d positive numbers (model.classes)",
                              s, ts_config_source(cfg, "train.class_weights"), u->classes);
            u->class_weights[k++] = (float)w;
            p = end;
            while (*p == ',' || *p == ' ') p++;
        }
        if (k != u->classes)
            return TS_ERR(TS_ERR_CONFIG, "train.class_weights = '%s' (%s): %d values for %d classes (model.classes)", s,
                          ts_config_source(cfg, "train.class_weights"), k, u->classes);
        u->weighted = 1;
    }
    return 0;
}
