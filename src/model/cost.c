/* Analytic step cost of the UNet3D; see cost.h. Mirrors the layer order of
 * src/model/unet.c: per encoder level two (conv 3x3x3 -> norm -> ReLU)
 * blocks and a 2x max-pool below level 0; per decoder level a transposed
 * conv 2x2x2 stride 2, the concatenation with the skip, two blocks; the
 * 1x1x1 head; the loss. The first convolution has no input gradient.
 * A checkpointed level (model.checkpoint_levels) keeps only its blocks'
 * outputs, holds the rest in a recompute scratch shared with the other
 * checkpointed levels (the largest level's), and in backward runs its
 * convolutions, its blocks' first norms and the max-pool or transposed
 * conv before each block once more (those two twice), with the halo
 * exchanges of those convolutions. The residual encoder (model.arch =
 * resenc) counts its stem, residual blocks (two 3x3x3 convs, a 1x1x1 skip
 * conv where channels or stride change) instead of the plain encoder, and
 * deep supervision its heads ds{l}. */
#include "tsbuild.h"
#include "src/model/cost.h"
#include "src/core/error.h"

#include <string.h>

/* a convolution's bytes (float32): forward reads x and w and writes y, the
 * weight gradient reads x and dy and writes dw, the input gradient reads dy
 * and w and writes dx (dgrad 0: not run); in, out: elements of x and y;
 * wts: of w. Into b (the step) and, recomputed in backward, r (NULL: not) */
static void conv_bytes(double *b, double *r, double in, double out, double wts, int dgrad)
{
    const double t = 4.0 * (in + out + wts);
    b[TS_PROF_CONV_FWD] += t;
    b[TS_PROF_CONV_WGRAD] += t;
    if (dgrad) b[TS_PROF_CONV_DGRAD] += t;
    if (r) r[TS_PROF_CONV_FWD] += t;
}

/* the residual encoder's level l (v voxels times the batch; face: a box's
 * halo voxels per sample at level l): the stem at level 0, then the
 * residual blocks (conv1, conv2 and, where channels or stride change, the
 * 1x1x1 skip), no pool; with the level checkpointed, only each block's
 * output kept and the rest recomputed (work into rw). On a split each 3x3x3 conv
 * exchanges its input's faces in forward (a strided conv1's at level l-1:
 * 4 face) and its output gradient's in backward (where an input gradient
 * is needed) */
static void resenc_level(const ts_unet_cfg *u, int l, double v, double face, int n, double *w, double *rw,
                         double *rb, ts_unet_cost *c)
{
    const int co = u->channels[l], ck = (int)(u->ckpt_levels >> l & 1u);
    for (int j = -1; j < u->res_blocks[l]; j++) {
        if (j < 0 && l > 0) continue;
        const int ci = j < 0 ? u->in_channels : j > 0 ? co : l ? u->channels[l - 1] : co;
        const int nconv = j < 0 ? 1 : ci != co || (l > 0 && j == 0) ? 3 : 2;
        for (int i = 0; i < nconv; i++) {
            const int cc = i == 1 ? co : ci, k3 = i == 2 ? 1 : 27;
            const double f = 2.0 * k3 * cc * co * v;
            w[TS_PROF_CONV_FWD] += f;
            w[TS_PROF_CONV_WGRAD] += f;
            if (j >= 0) w[TS_PROF_CONV_DGRAD] += f; /* the stem's input gradient is not needed */
            const int strided = l > 0 && j == 0 && i != 1; /* conv1 and the skip of a level's first block */
            conv_bytes(c->bytes, ck && j >= 0 ? rb : NULL, cc * v * (strided ? 8 : 1), co * v, (double)k3 * cc * co,
                       j >= 0);
            c->params += (double)k3 * cc * co + co + 2.0 * co;
            if (u->norm == TS_NORM_BATCH) c->buffers += 2.0 * co;
            w[TS_PROF_NORM] += 2 * co * v;
            w[TS_PROF_OTHER] += 2 * co * v;
            /* checkpointed (the blocks, not the stem): only conv2's normalised output, the block's output, is
             * kept; conv1, norm1, conv2 and the skip's conv and norm run again in backward */
            const int again = ck && j >= 0;
            c->act_elems += again ? (i == 1 ? co * v : 0) : 2 * co * v;
            if (k3 == 27) c->halo_elems += (cc * (l > 0 && j == 0 && i == 0 ? 4 : 1) + (j >= 0 ? co : 0)) * face * n;
            c->convs++;
            c->norms++;
            if (again) {
                rw[TS_PROF_CONV_FWD] += f;
                if (i != 1) rw[TS_PROF_NORM] += co * v;
                if (k3 == 27) c->halo_elems += cc * (l > 0 && j == 0 && i == 0 ? 4 : 1) * face * n;
                c->convs_recomputed++;
                c->norms_recomputed += i != 1;
            }
        }
        if (j >= 0) w[TS_PROF_OTHER] += 2 * co * v; /* the sum with the skip and its act */
    }
}

/* plain encoder level l: max-pool from level l-1 (l > 0), conv(cin -> co), conv(co -> co); with ck, the
 * recomputation's work in rw and the scratch it needs */
static void plain_level(const ts_unet_cfg *u, int l, int ck, double v, double face, int n, double *w, double *rw,
                        double *rb, ts_unet_cost *c, double *scratch_in, double *scratch_y)
{
    const int co = u->channels[l], cin_e = l == 0 ? u->in_channels : u->channels[l - 1];
    if (ck) { /* the scratch: a block's first-conv input or second-conv output; its first conv's and
               * norm's outputs */
        const double in = (l > 0 && cin_e > co ? cin_e : co) * v;
        if (in > *scratch_in) *scratch_in = in;
        if (co * v > *scratch_y) *scratch_y = co * v;
    }
    for (int i = 0; i < 2; i++) {
        const int ci = i ? co : cin_e;
        const double f = 2.0 * 27 * ci * co * v;
        w[TS_PROF_CONV_FWD] += f;
        w[TS_PROF_CONV_WGRAD] += f;
        if (l > 0 || i > 0) w[TS_PROF_CONV_DGRAD] += f;
        conv_bytes(c->bytes, ck ? rb : NULL, ci * v, co * v, 27.0 * ci * co, l > 0 || i > 0);
        c->params += 27.0 * ci * co + co + 2.0 * co;
        if (u->norm == TS_NORM_BATCH) c->buffers += 2.0 * co;
        w[TS_PROF_NORM] += 2 * co * v; /* forward and backward pass over the conv output */
        w[TS_PROF_OTHER] += 2 * co * v;
        c->act_elems += ck ? (i ? co * v : 0) : 2 * co * v; /* conv output and normalised, activated copy */
        c->halo_elems += 2.0 * ci * face * n; /* input faces, forward; gradient faces, backward */
        c->convs++;
        c->norms++;
        if (ck) {
            rw[TS_PROF_CONV_FWD] += f;
            if (i == 0) rw[TS_PROF_NORM] += co * v;
            c->halo_elems += ci * face * n;
            c->convs_recomputed++;
            c->norms_recomputed += i == 0;
        }
    }
    if (l > 0) { /* max-pool from level l-1 */
        w[TS_PROF_POOL] += 2.0 * u->channels[l - 1] * v * 8;
        if (ck) rw[TS_PROF_POOL] += 2.0 * u->channels[l - 1] * v * 8; /* its forward, twice */
        else c->act_elems += u->channels[l - 1] * v;
    }
}

int ts_unet_cost_of(const ts_unet_cfg *u, int n, const int64_t dhw[3], const int split[3], ts_unet_cost *c)
{
    memset(c, 0, sizeof *c);
    const int L = u->levels;
    const int64_t div = (int64_t)1 << (L - 1);
    for (int d = 0; d < 3; d++)
        if (dhw[d] < div || dhw[d] % div)
            return TS_ERR(TS_ERR_CONFIG, "box %lldx%lldx%lld: every edge must be a multiple of %lld for %d levels",
                          (long long)dhw[0], (long long)dhw[1], (long long)dhw[2], (long long)div, L);
    double *w = c->work, rw[TS_PROF_COUNT] = {0}; /* rw: the recomputation's work */
    double rb[TS_PROF_COUNT] = {0};                /* and its convolutions' bytes */
    double scratch_in = 0, scratch_y = 0;          /* the recompute scratch: first-conv input / second-conv output, conv outputs */
    double scratch_r = 0, scratch_s = 0;           /* the residual encoder's: conv2's output; the skip's two */
    for (int l = 0; l < L; l++) {
        const int ck = (int)(u->ckpt_levels >> l & 1u);
        const double D = (double)(dhw[0] >> l), H = (double)(dhw[1] >> l), W = (double)(dhw[2] >> l);
        const double v = D * H * W * n;
        /* a box's faces: one voxel thick, per split axis two of them */
        const double face = (split && split[0] ? 2 * H * W : 0) + (split && split[1] ? 2 * D * W : 0) +
                            (split && split[2] ? 2 * D * H : 0);
        const int co = u->channels[l];
        /* the share of the level's voxels more than one voxel from a split face */
        const double inner = (split && split[0] ? (D > 2 ? (D - 2) / D : 0) : 1) *
                             (split && split[1] ? (H > 2 ? (H - 2) / H : 0) : 1) *
                             (split && split[2] ? (W > 2 ? (W - 2) / W : 0) : 1);
        const double conv0 = w[TS_PROF_CONV_FWD] + w[TS_PROF_CONV_DGRAD];
        if (u->arch == TS_ARCH_RESENC) { /* stem (level 0), residual blocks; no pool */
            resenc_level(u, l, v, face, n, w, rw, rb, c);
            if (ck) { /* the scratch: conv1's, norm1's (as scratch_y), conv2's outputs; the skip's two where a block
                       * has one (every level but 0: the stem gives level 0's channels) */
                if (co * v > scratch_y) scratch_y = co * v;
                if (co * v > scratch_r) scratch_r = co * v;
                if (l > 0 && co * v > scratch_s) scratch_s = co * v;
            }
        } else {
            plain_level(u, l, ck, v, face, n, w, rw, rb, c, &scratch_in, &scratch_y);
        }
        if (l > 0 && ts_unet_ds_weight(u, l) > 0) { /* deep supervision head ds{l} and its loss */
            const double f = 2.0 * co * u->classes * v;
            w[TS_PROF_CONV_FWD] += f;
            w[TS_PROF_CONV_WGRAD] += f;
            w[TS_PROF_CONV_DGRAD] += f;
            conv_bytes(c->bytes, NULL, co * v, (double)u->classes * v, (double)co * u->classes, 1);
            c->params += (double)co * u->classes + u->classes;
            w[TS_PROF_LOSS] += 2.0 * u->classes * v;
            c->act_elems += 2.0 * u->classes * v;
        }
        if (l < L - 1) { /* decoder level l: up from l+1, concat, two convs */
            const int cu = u->channels[l + 1];
            const double vin = v / 8, f = 2.0 * 8 * cu * co * vin;
            w[TS_PROF_CONVT] += 3 * f;
            c->bytes[TS_PROF_CONVT] += 3 * 4.0 * (cu * vin + co * v + 8.0 * cu * co);
            if (ck) rb[TS_PROF_CONVT] += 2 * 4.0 * (cu * vin + co * v + 8.0 * cu * co);
            c->params += 8.0 * cu * co + co;
            if (ck) rw[TS_PROF_CONVT] += 2 * f; /* its forward, twice */
            else c->act_elems += co * v;
            for (int i = 0; i < 2; i++) {
                const int ci = i ? co : 2 * co;
                const double g = 2.0 * 27 * ci * co * v;
                w[TS_PROF_CONV_FWD] += g;
                w[TS_PROF_CONV_WGRAD] += g;
                w[TS_PROF_CONV_DGRAD] += g;
                conv_bytes(c->bytes, ck ? rb : NULL, ci * v, co * v, 27.0 * ci * co, 1);
                c->params += 27.0 * ci * co + co + 2.0 * co;
                if (u->norm == TS_NORM_BATCH) c->buffers += 2.0 * co;
                w[TS_PROF_NORM] += 2 * co * v;
                w[TS_PROF_OTHER] += 2 * co * v;
                c->act_elems += ck ? (i ? co * v : 0) : 2 * co * v;
                c->halo_elems += 2.0 * ci * face * n;
                c->convs++;
                c->norms++;
                if (ck) {
                    rw[TS_PROF_CONV_FWD] += g;
                    if (i == 0) rw[TS_PROF_NORM] += co * v;
                    c->halo_elems += ci * face * n;
                    c->convs_recomputed++;
                    c->norms_recomputed += i == 0;
                }
            }
        }
        if (face > 0) c->conv_interior_flops += inner * (w[TS_PROF_CONV_FWD] + w[TS_PROF_CONV_DGRAD] - conv0);
        if (l == 0) { /* head and loss */
            const double f = 2.0 * co * u->classes * v;
            w[TS_PROF_CONV_FWD] += f;
            w[TS_PROF_CONV_WGRAD] += f;
            w[TS_PROF_CONV_DGRAD] += f;
            conv_bytes(c->bytes, NULL, co * v, (double)u->classes * v, (double)co * u->classes, 1);
            c->params += (double)co * u->classes + u->classes;
            w[TS_PROF_LOSS] += 2.0 * u->classes * v;
            w[TS_PROF_OTHER] += (double)u->in_channels * v; /* input layout conversion */
            c->act_elems += 2.0 * u->classes * v;
            w[TS_PROF_HALO] += 0;
        }
    }
    w[TS_PROF_HALO] = c->halo_elems;
    /* forward FLOPs: conv forward + one third of the transposed convs' */
    c->flops_forward = w[TS_PROF_CONV_FWD] + w[TS_PROF_CONVT] / 3;
    c->flops_backward = w[TS_PROF_CONV_WGRAD] + w[TS_PROF_CONV_DGRAD] + 2 * w[TS_PROF_CONVT] / 3;
    c->flops_recompute = rw[TS_PROF_CONV_FWD] + rw[TS_PROF_CONVT];
    c->act_elems += scratch_in + 2 * scratch_y + scratch_r + 2 * scratch_s;
    for (int k = 0; k < TS_PROF_COUNT; k++) w[k] += rw[k];
    /* the memory-bound kinds' bytes per element of work (cost.h); the convolutions' recomputed bytes */
    static const double per[TS_PROF_COUNT] = {[TS_PROF_NORM] = 16, [TS_PROF_POOL] = 5, [TS_PROF_LOSS] = 12,
                                              [TS_PROF_HALO] = 8, [TS_PROF_OTHER] = 8};
    for (int k = 0; k < TS_PROF_COUNT; k++) c->bytes[k] += rb[k] + per[k] * w[k];
    return 0;
}
