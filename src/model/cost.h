/* The analytic cost of one UNet3D training step, layer kind by layer kind,
 * from the model's config alone (no allocation): FLOPs of the convolutions
 * (a multiply-add is 2 FLOPs; forward, weight gradient and input gradient
 * each cost the forward's FLOPs), elements through the memory-bound layers,
 * parameters and stored activations. perf.json derives GFLOP/s from it;
 * `tessera plan` divides it by rates calibrated with `tessera bench step`
 * (docs/scaling.md). The kinds match ts_unet_prof (bench step --profile). */
#ifndef TS_MODEL_COST_H
#define TS_MODEL_COST_H

#include <stdint.h>

#include "src/model/unet.h"

typedef struct ts_unet_cost {
    /* work per TS_PROF_* kind: FLOPs for the convolution kinds (conv
     * forward includes the 1x1x1 head), elements for the others */
    double work[TS_PROF_COUNT];
    /* bytes each kind moves, an estimate for the roofline of `bench step
     * --profile`: a convolution reads its two operands and writes its
     * result once (input, weights, output; float32); the memory-bound
     * kinds per element of work: norm 16 (forward: two reads, one
     * write: the exact statistics' integer sums and the affine map, the
     * largest |x| taken in the conv's epilogue; backward: four reads,
     * one write: the gradient sums and the input gradient, each reading
     * x and dy, a fused ReLU's mask recomputed from x; per forward and
     * backward element pair), pool 5, loss 12, other 8 (a read and a
     * write), halo 8 (pack and unpack) */
    double bytes[TS_PROF_COUNT];
    double flops_forward;   /* all convolutions, transposed ones included */
    double flops_backward;  /* their weight and input gradients */
    double flops_recompute; /* forwards run again in backward for checkpointed levels (model.checkpoint_levels);
                             * not in flops_forward/backward (the model's FLOPs), in work[] (what runs) */
    double params;          /* learnable parameters */
    double buffers;         /* non-learnable (batch-norm running statistics) */
    double act_elems;       /* activation elements held for backward (with checkpointed levels: what they keep,
                             * plus their recompute scratch) */
    double halo_elems;      /* elements of the one-voxel faces a split box exchanges per step
                             * (each split axis: 2 faces per conv input, forward and backward, and
                             * once more per recomputed conv) */
    double conv_interior_flops; /* forward and input-gradient FLOPs of the convolutions at the voxels of a split
                                 * box whose 3x3x3 neighbourhood lies inside it: the work that runs while
                                 * the halo is in flight (0 unsplit) */
    int convs;              /* 3x3x3 convolutions (each exchanges halos under a split) */
    int norms;              /* normalisation layers (each reduces statistics over a spatial group) */
    int convs_recomputed;   /* of those, run again in backward (checkpointed levels) */
    int norms_recomputed;
} ts_unet_cost;

/* Local. The cost of forward, loss and backward of n samples of a box of
 * dhw voxels (a whole patch, or one rank's box of it: split[d] != 0 counts
 * halo faces along axis d). Errors: a box edge not divisible by
 * 2^(levels-1) (TS_ERR_CONFIG). */
int ts_unet_cost_of(const ts_unet_cfg *u, int n, const int64_t dhw[3], const int split[3], ts_unet_cost *c);

#endif
