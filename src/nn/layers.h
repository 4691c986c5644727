/* Layers of 3D convolutional networks as forward/backward pairs on the CPU.
 * Activations are float32, channels-last [N, D, H, W, C] ("NDHWC"); weights
 * keep PyTorch's layout so that the parameter arena, files and checkpoints
 * match PyTorch. Every function is local (no MPI), uses OpenMP threads,
 * checks the shapes it is given and returns 0 or a TS_ERR_* code.
 * Conventions: input gradients (dx) are overwritten; parameter gradients
 * (dw, db, dgamma, dbeta) are accumulated (+=) so that micro-batches and
 * the model's arena can add into them; a NULL gradient is not computed.
 * Scratch memory (packed weights, input slabs, partial sums) is cached per
 * calling thread and reused across calls (ts_nn_release_scratch frees it). */
#ifndef TS_NN_LAYERS_H
#define TS_NN_LAYERS_H

#include <stdint.h>

#include "src/core/tensor.h"

/* Local. Frees the calling thread's cached scratch memory. */
void ts_nn_release_scratch(void);

/* Output edge of a convolution or pooling: (in + 2 pad - k) / stride + 1. */
static inline int64_t ts_conv_out_size(int64_t in, int k, int stride, int pad)
{
    return (in + 2 * pad - k) / stride + 1;
}

/* ---- conv3d: cubic kernel k, any stride, zero padding pad ----
 * x [N, D, H, W, Cin], w [Cout, Cin, k, k, k], b [Cout] or NULL,
 * y [N, OD, OH, OW, Cout] with OD = ts_conv_out_size(D, k, stride, pad). */
int ts_conv3d_forward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, int pad,
                      ts_tensor *y);
/* dy like y; dx like x (overwritten; may be x itself: the weight gradient is
 * taken first), dw like w and db like b (accumulated). */
int ts_conv3d_backward(const ts_tensor *x, const ts_tensor *w, int stride, int pad, const ts_tensor *dy,
                       ts_tensor *dx, ts_tensor *dw, ts_tensor *db);

/* ---- conv3d over a channel concatenation [a, b] (the U-Net decoder's first
 * conv on [upsampled, skip]) without forming it: the same as
 * ts_concat_forward then ts_conv3d_forward, with w [Cout, Ca + Cb, k, k, k].
 * Backward writes the input gradient's two parts to da and db (either may
 * be the forward input itself; the weight gradient is taken first). */
int ts_conv3d_cat_forward(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_tensor *bias,
                          int stride, int pad, ts_tensor *y);
int ts_conv3d_cat_backward(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, int stride, int pad,
                           const ts_tensor *dy, ts_tensor *da, ts_tensor *db, ts_tensor *dw, ts_tensor *dbias);

/* ---- transposed conv3d (PyTorch ConvTranspose3d, padding 0) ----
 * x [N, D, H, W, Cin], w [Cin, Cout, k, k, k], b [Cout] or NULL,
 * y [N, (D-1) stride + k, ..., Cout]. The U-Net uses k = stride = 2. */
int ts_convt3d_forward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, ts_tensor *y);
int ts_convt3d_backward(const ts_tensor *x, const ts_tensor *w, int stride, const ts_tensor *dy, ts_tensor *dx,
                        ts_tensor *dw, ts_tensor *db);

/* ---- max-pool 3d, kernel = stride = k (2 in the U-Net), k <= 6 ----
 * x [N, D, H, W, C] with D, H, W divisible by k; y [N, D/k, H/k, W/k, C];
 * idx (uint8, like y) receives the position of each maximum in its window
 * (first maximum on ties, a later NaN replaces, as PyTorch), which backward
 * uses. */
int ts_maxpool3d_forward(const ts_tensor *x, int k, ts_tensor *y, ts_tensor *idx);
int ts_maxpool3d_backward(const ts_tensor *dy, const ts_tensor *idx, int k, ts_tensor *dx);

/* ---- batch norm over N, D, H, W per channel (PyTorch BatchNorm3d) ----
 * train = 1: normalises with the batch statistics (biased variance), updates
 * running_mean/var with momentum (unbiased variance, as PyTorch) when they
 * are not NULL, and stores mean and 1/sqrt(var + eps) per channel in
 * save_mean/save_invstd [C] for backward. train = 0: uses the running
 * statistics (and still fills save_* with them). gamma/beta [C]. y may be x. */
typedef struct ts_norm_opts {
    float eps;      /* 1e-5 */
    float momentum; /* 0.1, batch norm only */
    int groups;     /* group norm only: groups dividing C */
    int relu;       /* 1: fused ReLU: forward writes max(0, norm(x)); backward
                     * takes that output y and passes dy only where y > 0 */
    /* batch norm only, may be NULL: sums n doubles over the ranks that share
     * the statistics (synchronised batch norm); must be called in the same
     * order on every rank of the group; returns 0 or an error */
    int (*sync)(void *ctx, double *buf, int n);
    void *sync_ctx;
} ts_norm_opts;
int ts_batchnorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, ts_tensor *running_mean,
                         ts_tensor *running_var, int train, const ts_norm_opts *o, ts_tensor *y,
                         ts_tensor *save_mean, ts_tensor *save_invstd);
/* x is the forward input, y the forward output (used only with o->relu; may
 * be NULL otherwise); train selects the batch-statistics or the affine (eval)
 * backward. dx may alias dy or x. */
int ts_batchnorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *save_mean,
                          const ts_tensor *save_invstd, int train, const ts_norm_opts *o, const ts_tensor *dy,
                          ts_tensor *dx, ts_tensor *dgamma, ts_tensor *dbeta);

/* ---- group norm (PyTorch GroupNorm): statistics per sample and group of
 * C/groups channels over D, H, W; affine per channel. save_* [N * groups].
 * Backward arguments as for batch norm. */
int ts_groupnorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, const ts_norm_opts *o,
                         ts_tensor *y, ts_tensor *save_mean, ts_tensor *save_invstd);
int ts_groupnorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *save_mean,
                          const ts_tensor *save_invstd, const ts_norm_opts *o, const ts_tensor *dy, ts_tensor *dx,
                          ts_tensor *dgamma, ts_tensor *dbeta);
/* ---- instance norm = group norm with one channel per group (PyTorch
 * InstanceNorm3d(affine=True), statistics always from the input). */
int ts_instancenorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, const ts_norm_opts *o,
                            ts_tensor *y, ts_tensor *save_mean, ts_tensor *save_invstd);
int ts_instancenorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *save_mean,
                             const ts_tensor *save_invstd, const ts_norm_opts *o, const ts_tensor *dy, ts_tensor *dx,
                             ts_tensor *dgamma, ts_tensor *dbeta);

/* ---- ReLU (slope 0) and leaky ReLU (slope > 0), any shape ----
 * y may be x (in place). Backward takes the forward output y (its sign is
 * the input's sign); dx may alias dy. */
int ts_relu_forward(const ts_tensor *x, float slope, ts_tensor *y);
int ts_relu_backward(const ts_tensor *y, float slope, const ts_tensor *dy, ts_tensor *dx);

/* ---- concatenation along channels (the last dim): y = [a, b] ---- */
int ts_concat_forward(const ts_tensor *a, const ts_tensor *b, ts_tensor *y);
/* da, db overwritten; either may be NULL. */
int ts_concat_backward(const ts_tensor *dy, ts_tensor *da, ts_tensor *db);

/* ---- losses on logits [N, D, H, W, K] and labels [N, D, H, W] (uint8) ----
 * Softmax cross-entropy, PyTorch's reduction='mean': sum over voxels whose
 * label is not ignore_index of w[label] * -log softmax[label], divided by the
 * sum of those w[label] (w = 1 without class weights). ignore_index < 0 or
 * > 255 ignores nothing. A label >= K that is not ignored is an error. */
typedef struct ts_loss_opts {
    int ignore_index;           /* -1: none */
    const float *class_weights; /* [K] or NULL */
    float dice_smooth;          /* soft Dice smoothing (1e-5) */
} ts_loss_opts;
int ts_softmax_ce_forward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, double *loss);
/* dlogits += scale * dloss/dlogits (scale 1 for the plain loss). */
int ts_softmax_ce_backward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale,
                           ts_tensor *dlogits);
/* Both in one softmax pass (what a training step uses). */
int ts_softmax_ce_forward_backward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale,
                                   double *loss, ts_tensor *dlogits);
/* Soft Dice (MONAI DiceLoss(softmax=True, to_onehot_y=True) semantics): p =
 * softmax(logits), g = one-hot(label), per sample n and class c
 * dice = (2 sum p g + s) / (sum p + sum g + s) over the voxels whose label is
 * not ignored; loss = mean over n and c of (1 - dice). */
int ts_dice_forward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, double *loss);
int ts_dice_backward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale,
                     ts_tensor *dlogits);
/* Both, sharing the statistics pass. */
int ts_dice_forward_backward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale,
                             double *loss, ts_tensor *dlogits);

#endif
