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

/* ---- precision of the convolutions (mixed precision, as PyTorch's bf16
 * autocast for conv) ----
 * TS_PREC_FP32 (the default): fp32 throughout. TS_PREC_BF16: every conv3d,
 * conv3d over a concatenation, split (halo) conv3d and transposed conv3d,
 * forward and backward, rounds both operands of its products to bf16
 * (round to nearest even; fp32 denormals to zero as the hardware does):
 * forward x and w, input gradient dy and w, weight gradient x and dy; the
 * products are summed in fp32 and the results (y, dx, dw) stored in fp32;
 * the bias, its gradient (a sum of the fp32 dy) and everything outside the
 * convolutions stay fp32. Tensors in memory stay fp32: the rounding happens
 * as the kernels stage their inputs. Summation is deterministic for any
 * thread count, as in fp32; bf16 results differ from fp32 ones by the bf16
 * rounding of the operands (~1e-2 relative), and from the exact sum of the
 * rounded products by fp32 rounding (~1e-6).
 * TS_PREC_FP16: the same operands rounded to IEEE half instead (round to
 * nearest even, with half's range: magnitudes from 65520 up become inf,
 * below 2^-14 half's subnormals, below 2^-25 zero) and multiplied and summed
 * in fp32 by the fp32 kernels. No CPU here has an fp16 dot product: fp16
 * reproduces fp16 numerics (overflow, underflow, 11-bit operands) for loss
 * scaling, at about the fp32 speed, not faster.
 * ts_nn_set_conv_precision is local and process-wide (like PyTorch's
 * set_float32_matmul_precision): each conv call reads the setting once when
 * it starts, so a call made while another thread changes it runs entirely
 * in one precision or the other. Returns 0, or TS_ERR_ARG for an unknown
 * value (the setting is then unchanged). */
typedef enum { TS_PREC_FP32 = 0, TS_PREC_BF16, TS_PREC_FP16 } ts_precision;
int ts_nn_set_conv_precision(ts_precision p);
ts_precision ts_nn_conv_precision(void);
/* Local, process-wide. Whether fp32 convolutions on a GPU may use TF32
 * tensor cores (10-bit mantissa products, fp32 sums): on by default, as
 * PyTorch's torch.backends.cudnn.allow_tf32; off gives fp32 products (the
 * GPU layer tests turn it off). No effect on the CPU or on bf16/fp16. */
void ts_nn_set_tf32(int on);
int ts_nn_tf32(void);
/* Local, process-wide, off by default; read once by each conv call as the
 * precision. On: fp32 3x3x3, stride 1, padding 1 convolutions on the CPU
 * with at least 16 input and 16 output channels, without a halo and not
 * split into interior and border parts, run their forward and their input
 * gradient as Winograd F(2x2x2, 3x3x3) convolutions (src/nn/winograd.c,
 * docs/engine.md: within about 1e-6 of the direct convolution's results
 * relative to their scale, not the same bits), and their weight gradient
 * where they have 48+ channels in and out together and 256+ 2x2x2 tiles
 * (where it measured faster). In bf16 (ts_nn_set_conv_precision) those
 * with 64+ channels in and out together run with bf16 products and fp32
 * sums (src/nn/winograd_bf16.c): the forward and input gradient, and the
 * weight gradient where 256+ tiles; fp16 and every other shape stay direct.
 * The U-Net sets it at the start of
 * each forward and backward (train.conv, ts_unet_set_winograd). */
int ts_nn_set_winograd(int on);
int ts_nn_winograd_on(void);
/* Local. Which bf16 kernels run: "avx512bf16" (VDPBF16PS, chosen when the
 * CPU and OS support AVX512 F/BW/VL/BF16) or "emulated" (portable C with the
 * same rounding and summation order: bitwise the same results as long as no
 * partial sum is denormal). The environment variable
 * TESSERA_BF16_ISA=emulated, read on the first call, forces the emulation.
 * The string is static. */
const char *ts_nn_bf16_isa(void);

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

/* ---- convolutions of one box of a spatially split volume ----
 * A rank that holds the box of a larger volume convolves it (3x3x3, stride
 * 1, padding 1) with one-voxel halos: the voxels just outside its box,
 * which its neighbours hold. The box stays as it is ([N, D, H, W, C]); the
 * halo lives apart, one face buffer per side of each split dim, each face
 * including the halo's edges and corners (voxels outside the box along two
 * or three dims). With e1 = on[1], e2 = on[2] (1 where H / W are split):
 *   D faces (dim 0, planes id = -1 / D):  [N][H + 2 e1][W + 2 e2][C]
 *                                          rows ih = -e1 .. H+e1-1, columns iw = -e2 .. W+e2-1
 *   H faces (dim 1, rows ih = -1 / H):     [N][D][W + 2 e2][C]
 *                                          id = 0 .. D-1, columns iw = -e2 .. W+e2-1
 *   W faces (dim 2, columns iw = -1 / W):  [N][D][H][C]
 * A NULL face reads as zeros (the global border: PyTorch's zero padding),
 * and so must every face voxel that lies outside the global volume (a
 * corner past the border). C is the convolution's input channels; for the
 * concatenation [a, b] a face voxel holds a's channels then b's. */
typedef struct ts_halo {
    int on[3];            /* 1: the halo is given along dim d (D, H, W) */
    float *lo[3], *hi[3]; /* faces (layouts above); NULL = zeros */
} ts_halo;

/* Floats of one face of dim d for a box of dhw = (D, H, W) with C channels and N samples. */
static inline int64_t ts_halo_face_floats(const int64_t dhw[3], const int on[3], int d, int64_t N, int64_t C)
{
    const int64_t e1 = on[1] ? 2 : 0, e2 = on[2] ? 2 : 0;
    const int64_t v = d == 0 ? (dhw[1] + e1) * (dhw[2] + e2) : d == 1 ? dhw[0] * (dhw[2] + e2) : dhw[0] * dhw[1];
    return N * v * C;
}

/* What a box sends its neighbours in one exchange, packed: for each offset
 * o = (o0, o1, o2) (each -1, 0 or 1) whose bit i = 9 (o0 + 1) + 3 (o1 + 1)
 * + (o2 + 1) is set in mask, in increasing i, the box's layer towards o
 * (all of a dim where o's entry is 0, else its first or last plane), N
 * major, then D, H, W, then the channels of [a, b]. Floats of the whole
 * message for a box of dhw with C channels and N samples. */
static inline int64_t ts_halo_send_floats(const int64_t dhw[3], unsigned mask, int64_t N, int64_t C)
{
    int64_t t = 0;
    for (int i = 0; i < 27; i++)
        if (mask >> i & 1u)
            t += (i / 9 == 1 ? dhw[0] : 1) * (i / 3 % 3 == 1 ? dhw[1] : 1) * (i % 3 == 1 ? dhw[2] : 1);
    return t * N * C;
}
/* Local. Packs [a, b] (b NULL: a alone; device tensors, the GPU engine's
 * exchange: a host box is packed by the spatial group's exchange itself,
 * src/parallel/spatial.h) for the offsets of mask into dst, a device
 * float32 tensor of at least ts_halo_send_floats floats, in that layout. */
int ts_halo_pack(const ts_tensor *a, const ts_tensor *b, unsigned mask, ts_tensor *dst);

/* Which output voxels a call computes, so that a caller can compute the
 * interior while the halo is in flight: TS_CONV_ALL; TS_CONV_INTERIOR, the
 * voxels whose 3x3x3 neighbourhood reads no face buffer (non-NULL face of
 * h; a NULL face is zeros and always available); TS_CONV_BORDER, the rest.
 * INTERIOR then BORDER computes every voxel once. */
typedef enum { TS_CONV_ALL = 0, TS_CONV_INTERIOR, TS_CONV_BORDER } ts_conv_part;

/* An epilogue of a forward convolution, applied to each output row as the
 * kernel writes it (while it is in cache), instead of separate passes:
 * y = conv(x) + bias, then y * scale[c] + shift[c] per output channel
 * (scale NULL: none), then the activation: TS_EP_RELU max(0, y) (NaN and
 * -0 to 0), TS_EP_LEAKY y > 0 ? y : slope * y. The arithmetic is that of
 * ts_batchnorm_forward's affine map (with its fused ReLU) and
 * ts_relu_forward, so the bits equal the three passes'. Eval-mode batch
 * norm folds into scale and shift (ts_batchnorm_fold). */
typedef enum { TS_EP_NONE = 0, TS_EP_RELU, TS_EP_LEAKY } ts_conv_act;
typedef struct ts_conv_ep {
    const float *scale, *shift; /* [Cout] each, or both NULL */
    ts_conv_act act;
    float slope; /* TS_EP_LEAKY */
    /* NULL: none. Else [N][Cout]: amax[n * Cout + c] is raised to the
     * largest |y| (after the map above; +inf for a value that is not
     * finite) of sample n, channel c among the voxels the call writes, so
     * that the norm reading y needs no pass of its own for it
     * (ts_norm_opts.amax); the caller zeroes it before the first call (a
     * split's interior and border calls add to it). Host forward kernels:
     * the direct ones in every precision and Winograd. */
    float *amax;
} ts_conv_ep;

typedef struct ts_conv_split {
    const ts_halo *halo;         /* the input's halo; NULL: zero padding as ts_conv3d_* */
    ts_conv_part part;           /* forward only; backward computes all */
    void (*progress)(void *ctx); /* may be NULL: called by one thread between work items
                                  * (to progress messages in flight: MPI_Testall) */
    void *progress_ctx;
    const ts_conv_ep *ep;        /* forward only; NULL: none (host tensors only) */
} ts_conv_split;
/* (progress runs on the calling thread, OpenMP thread 0 of the kernel's
 * team, on entering its parallel loop and after each item that thread
 * completes: MPI_THREAD_FUNNELED is enough; do not call these functions from
 * inside a parallel region. With halo NULL there are no faces: INTERIOR
 * computes every voxel and BORDER none.) */

/* 3x3x3, stride 1, padding 1 on a box with halo (s may be NULL: no halo).
 * Same results as ts_conv3d_forward on the whole volume, restricted to the
 * box (up to summation order). y must be fully written by the parts called. */
int ts_conv3d_forward_split(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, const ts_conv_split *s,
                            ts_tensor *y);
int ts_conv3d_cat_forward_split(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_tensor *bias,
                                const ts_conv_split *s, ts_tensor *y);
/* Winograd F(2x2x2, 3x3x3) forward of a 3x3x3, stride 1, padding 1
 * convolution (float32 host tensors, no halo): y = ep(conv([x, x2]) + b),
 * x2 NULL for a single input; b and ep may be NULL. 64 instead of 216
 * multiplications per 2x2x2 outputs and channel pair; the transforms add.
 * Not the same bits as ts_conv3d_forward: relative differences of about
 * 1e-6 of the output's scale (docs/engine.md). Where the conv precision
 * is bf16 (ts_nn_set_conv_precision), bf16 products and fp32 sums at any
 * channel count; otherwise fp32. tessera infer uses it with conv=winograd. */
int ts_conv3d_winograd_forward(const ts_tensor *x, const ts_tensor *x2, const ts_tensor *w, const ts_tensor *b,
                               const ts_conv_ep *ep, ts_tensor *y);
/* Local. The scratch bytes (per process; the kernels' buffers on nthreads
 * threads, 0: those the kernels use) a Winograd layer of N samples of D x H x W voxels, C -> OC
 * channels, takes: forward and input gradient, and with wgrad the weight
 * gradient; 0 for channel counts no Winograd driver takes; for the memory
 * plan (src/train/trainer_setup.c). */
size_t ts_conv3d_winograd_scratch_bytes(int N, int D, int H, int W, int C, int OC, int nthreads, int wgrad);
/* Backward on the box: xs is the forward input's halo (for dw: the weight
 * gradient sums over the box's outputs, reading x's halo), dys the output
 * gradient's halo (for dx: the input gradient of the box's voxels gathers dy
 * over their neighbourhood, reading dy's halo). Either may be NULL (no
 * halo). The weight gradient is the box's share: summing it over the ranks
 * gives the whole volume's. Other arguments as ts_conv3d_backward /
 * ts_conv3d_cat_backward (pad 1, stride 1). */
int ts_conv3d_backward_split(const ts_tensor *x, const ts_tensor *w, const ts_conv_split *xs, const ts_conv_split *dys,
                             const ts_tensor *dy, ts_tensor *dx, ts_tensor *dw, ts_tensor *db);
int ts_conv3d_cat_backward_split(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_conv_split *xs,
                                 const ts_conv_split *dys, const ts_tensor *dy, ts_tensor *da, ts_tensor *db,
                                 ts_tensor *dw, ts_tensor *dbias);
/* (The progress hooks of xs and dys, where set, are called while the weight
 * gradient is computed: a caller takes dw first with dy's halo in flight,
 * waits for it, then takes dx.) */

/* 3x3x3, stride 2, padding 1 on a box with halo (the residual encoder's
 * downsampling on a split; even box edges at even offsets): forward reads
 * h's low faces, backward xh (the forward input's halo, for dw) and dyh
 * (the output gradient's, for dx: a box's last voxel is read by the next
 * box's first output). Device tensors only (the GPU engine): the model
 * grows a host box by its halo itself (src/model). Arguments otherwise as
 * ts_conv3d_forward / ts_conv3d_backward; any of dx, dw, db may be NULL. */
int ts_conv3d_s2_forward_split(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, const ts_halo *h, ts_tensor *y);
int ts_conv3d_s2_backward_split(const ts_tensor *x, const ts_tensor *w, const ts_halo *xh, const ts_halo *dyh,
                                const ts_tensor *dy, ts_tensor *dx, ts_tensor *dw, ts_tensor *db);

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
/* A reduction over the ranks that hold pieces of the same statistics: n
 * doubles in buf summed (TS_SYNC_SUM) or maximised (TS_SYNC_MAX) in place,
 * called in the same order on every rank of the group; 0 or an error. */
enum { TS_SYNC_SUM = 0, TS_SYNC_MAX = 1 };
typedef int (*ts_nn_sync_fn)(void *ctx, double *buf, int n, int op);

typedef struct ts_norm_opts {
    float eps;      /* 1e-5 */
    float momentum; /* 0.1, batch norm only */
    int groups;     /* group norm only: groups dividing C */
    int relu;       /* 1: fused ReLU: forward writes max(0, norm(x)); backward
                     * passes dy only where y > 0 (on the CPU: where the
                     * pre-activation t = x * scale + shift, recomputed
                     * from x, gamma, beta and the saved statistics with
                     * the forward's arithmetic, is > 0: the same voxels,
                     * without reading y; the GPU engine reads y) */
    float slope;    /* with relu, > 0: a fused leaky ReLU instead: forward
                     * t > 0 ? t : slope t, backward dy where t > 0, else
                     * slope dy (the GPU engine's too, where y > 0 stands
                     * for t > 0; relu.c's arithmetic: on the CPU the same
                     * bits as the separate pass) */
    /* may be NULL: reduces n doubles (op TS_SYNC_SUM or TS_SYNC_MAX) over
     * the ranks that share the statistics (batch norm: synchronised batch
     * norm and/or the pieces of a spatially split batch; group and instance
     * norm: the ranks holding pieces of the same samples); called in the
     * same order on every rank of the group, returns 0 or an error.
     * Parameter gradients (dgamma, dbeta) stay this rank's share; input
     * gradients use the group's sums. */
    ts_nn_sync_fn sync;
    void *sync_ctx;
    /* forward, host: NULL, or the largest |x| of each sample and channel,
     * [x's first dim][C], as a convolution's epilogue gives it
     * (ts_conv_ep.amax): the exact statistics' scale without a pass over
     * x for it (the same values, so the same bits) */
    const float *amax;
} ts_norm_opts;
int ts_batchnorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, ts_tensor *running_mean,
                         ts_tensor *running_var, int train, const ts_norm_opts *o, ts_tensor *y,
                         ts_tensor *save_mean, ts_tensor *save_invstd);
/* Eval-mode batch norm as a per-channel affine map y = x * scale + shift
 * (C = gamma's length; scale and shift [C]), with the arithmetic of
 * ts_batchnorm_forward's eval mode: for ts_conv_ep. */
int ts_batchnorm_fold(const ts_tensor *gamma, const ts_tensor *beta, const ts_tensor *running_mean,
                      const ts_tensor *running_var, double eps, float *scale, float *shift);
/* x is the forward input; with o->relu, beta (the forward's bias: the CPU
 * recomputes the ReLU's mask from x, one pass over the activations less in
 * each of the backward's two passes) and y the forward output (the GPU
 * engine's mask); either may be NULL where not used. train selects the
 * batch-statistics or the affine (eval) backward. dx may alias dy or x. */
int ts_batchnorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *beta,
                          const ts_tensor *save_mean, const ts_tensor *save_invstd, int train, const ts_norm_opts *o,
                          const ts_tensor *dy, ts_tensor *dx, ts_tensor *dgamma, ts_tensor *dbeta);

/* ---- group norm (PyTorch GroupNorm): statistics per sample and group of
 * C/groups channels over D, H, W; affine per channel. save_* [N * groups].
 * Backward arguments as for batch norm. */
int ts_groupnorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, const ts_norm_opts *o,
                         ts_tensor *y, ts_tensor *save_mean, ts_tensor *save_invstd);
int ts_groupnorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *beta,
                          const ts_tensor *save_mean, const ts_tensor *save_invstd, const ts_norm_opts *o,
                          const ts_tensor *dy, ts_tensor *dx, ts_tensor *dgamma, ts_tensor *dbeta);
/* ---- instance norm = group norm with one channel per group (PyTorch
 * InstanceNorm3d(affine=True), statistics always from the input). */
int ts_instancenorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, const ts_norm_opts *o,
                            ts_tensor *y, ts_tensor *save_mean, ts_tensor *save_invstd);
int ts_instancenorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *beta,
                             const ts_tensor *save_mean, const ts_tensor *save_invstd, const ts_norm_opts *o,
                             const ts_tensor *dy, ts_tensor *dx, ts_tensor *dgamma, ts_tensor *dbeta);

/* ---- ReLU (slope 0) and leaky ReLU (slope > 0), any shape ----
 * y may be x (in place). Backward takes the forward output y (its sign is
 * the input's sign); dx may alias dy. */
int ts_relu_forward(const ts_tensor *x, float slope, ts_tensor *y);
int ts_relu_backward(const ts_tensor *y, float slope, const ts_tensor *dy, ts_tensor *dx);
/* ---- y += x elementwise (float32, same element count; where two
 * gradients of one tensor meet, e.g. a skip's and the path's) ---- */
int ts_add_inplace(ts_tensor *y, const ts_tensor *x);

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
    /* may be NULL: sums n doubles over the ranks holding pieces of the same
     * samples (spatial parallelism), in the same order on every rank; the
     * loss and the gradient are then those of the whole samples (the
     * gradient restricted to this rank's voxels). A label error on one rank
     * is agreed through the same sums: every rank fails. */
    ts_nn_sync_fn sync; /* called with TS_SYNC_SUM */
    void *sync_ctx;
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
