/* The layers' CUDA backend (internal to src/nn): the entry points that the
 * layer functions of layers.h call when their tensors live on the GPU, the
 * per-process cuDNN/cuBLAS context and the kernel launchers of
 * src/nn/cuda/nn_kernels.cu. Everything is queued on the engine's compute
 * stream (src/core/device.h) and ordered by it: a layer returns once its
 * work is queued; a host read of a result goes through ts_tensor_transfer.
 * Compiled only in CUDA builds (TS_HAVE_CUDA). */
#ifndef TS_NN_CUDA_NN_H
#define TS_NN_CUDA_NN_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/tensor.h"
#include "src/nn/layers.h"

/* ---- kernel launchers (nn_kernels.cu); stream is a cudaStream_t ---- */
/* wp[r][t][c] = w[r][c][flip ? taps-1-t : t] */
int ts_cuk_wpack(const float *w, float *wp, int rows, int cols, int taps, int flip, void *stream);
/* w[r][c][t] += wp[r][t][c] */
int ts_cuk_wunpack_add(const float *wp, float *w, int rows, int cols, int taps, void *stream);
/* y (bf16, or fp16 when fp16) = x rounded to nearest even */
int ts_cuk_to_half(const float *x, void *y, size_t n, int fp16, void *stream);
/* y = x rounded to bf16 (fp16 when fp16), kept in fp32 (y may be x) */
int ts_cuk_round_half(const float *x, float *y, size_t n, int fp16, void *stream);
/* y = (add ? y : 0) + x, x bf16 or fp16 */
int ts_cuk_from_half(const void *x, float *y, size_t n, int fp16, int add, void *stream);
/* Channels padded to cp for the half-precision convolutions of few
 * channels (conv_cudnn.c): y [nv][cp] (bf16, or fp16) = x [nv][c] rounded,
 * zeros in channels c .. cp-1; y [nv][c] = x [nv][cp]'s first c channels
 * widened; wp [rp][taps][cp] = w [rows][cols][taps] packed as
 * ts_cuk_wpack (no flip) with zero rows and channels past rows and cols;
 * w [rows][cols][taps] += wp [rows][taps][cp]'s first cols channels. */
int ts_cuk_to_half_pad(const float *x, int c, void *y, int cp, size_t nv, int fp16, void *stream);
int ts_cuk_from_half_slice(const void *x, int cp, float *y, int c, size_t nv, int fp16, void *stream);
int ts_cuk_wpack_pad(const float *w, float *wp, int rows, int cols, int taps, int rp, int cp, void *stream);
int ts_cuk_wunpack_add_pad(const float *wp, float *w, int rows, int cols, int taps, int cp, void *stream);
/* Transposed convolutions with kernel = stride k (conv_gemm.c): y
 * [N][D k][H k][W k][C] = z [M][taps][C] (M = N D H W input voxels, each
 * output voxel one entry of z: the tap of its offset in its input voxel's
 * k^3 block) + bias (NULL: none); dz [M][taps][C] = the entries of dy the
 * same way, as fp32 (type 0), bf16 (1) or fp16 (2). */
int ts_cuk_convt_scatter(const float *z, const float *bias, float *y, int N, int D, int H, int W, int C, int k,
                         void *stream);
/* col [mc][taps][C] (type 0 fp32, 1 bf16, 2 fp16) = for output voxels m0 ..
 * m0+mc-1 of a convolution of x [N][D][H][W][C] (kernel k, stride s,
 * padding p, output OD x OH x OW; voxels counted over N too) the input
 * value under each tap, 0 outside x */
int ts_cuk_im2col(const float *x, void *col, int type, int D, int H, int W, int C, int k, int s, int p, int OD, int OH,
                  int OW, size_t m0, size_t mc, void *stream);
int ts_cuk_convt_gather(const float *dy, void *dz, int type, int N, int D, int H, int W, int C, int k, void *stream);

int ts_cuk_relu(const float *x, float *y, size_t n, float slope, void *stream);
int ts_cuk_relu_backward(const float *y, const float *dy, float *dx, size_t n, float slope, void *stream);
/* y[i] += x[i] */
int ts_cuk_add(const float *x, float *y, size_t n, void *stream);
int ts_cuk_maxpool(const float *x, float *y, uint8_t *idx, int N, int D, int H, int W, int C, int k, void *stream);
int ts_cuk_maxpool_backward(const float *dy, const uint8_t *idx, float *dx, int N, int D, int H, int W, int C, int k,
                            void *stream);
/* per (n, c) of x [N][S][C], into device s1, s2 [N][C] (cleared first): mode 0 sums of x - ctr and its
 * square (ctr device [N][C] or NULL: 0), mode 1 sums of dy' and dy' (x - ctr), dy' = dy where mask > 0 (or
 * mask NULL), else slope dy (0 when slope is 0: the fused ReLU's or leaky ReLU's derivative) */
int ts_cuk_chan_sums(int mode, const float *x, const float *dy, const float *mask, float slope, const float *ctr, int N,
                     size_t S, int C, double *s1, double *s2, void *stream);
/* y = t = x scale[n][c] + shift[n][c]; if relu, t > 0 ? t : slope t (0 when slope is 0) */
int ts_cuk_chan_affine(const float *x, const float *scale, const float *shift, int N, size_t S, int C, int relu,
                       float slope, float *y, void *stream);
/* dx = dy' a + (x - ctr) b + k per (n, c), dy' as ts_cuk_chan_sums' */
int ts_cuk_norm_dx(const float *x, const float *dy, const float *mask, float slope, const float *ctr, const float *a,
                   const float *b, const float *k, int N, size_t S, int C, float *dx, void *stream);
/* The same three with the tiled kernels (TESSERA_CUDA_PASSES=tiled, layers_cuda.c; C > 256: the ones
 * above), and the concatenation of rows rows along the channels: back 0 y [rows][ca + cb] = [a, b]; back 1
 * a, b from y (either NULL: not written). Written without a GPU (nn_kernels.cu). */
int ts_cuk_chan_sums_tiled(int mode, const float *x, const float *dy, const float *mask, float slope,
                           const float *ctr, int N, size_t S, int C, double *s1, double *s2, void *stream);
int ts_cuk_chan_affine_tiled(const float *x, const float *scale, const float *shift, int N, size_t S, int C, int relu,
                             float slope, float *y, void *stream);
int ts_cuk_norm_dx_tiled(const float *x, const float *dy, const float *mask, float slope, const float *ctr,
                         const float *a, const float *b, const float *k, int N, size_t S, int C, float *dx,
                         void *stream);
int ts_cuk_concat(int back, float *y, float *a, float *b, int ca, int cb, size_t rows, void *stream);
/* Local. The norms with their per-channel arithmetic on the device (norm_kernels.cu;
 * TESSERA_CUDA_NORMSTATS=device, layers_cuda.c): x [N][S][C] in G groups of
 * C / G channels (batch norm: N = 1 with the batch folded into S, G = C;
 * instance norm G = C). Forward, train: two-pass moments per (n, g) in
 * double, save_mean and save_invstd [N][G], the running statistics (batch
 * norm: rmean, rvar non-NULL) updated with momentum and the unbiased
 * variance; !train (batch norm only): from rmean and rvar; then y =
 * the fused activation of x scale + shift (relu: t > 0 ? t : slope t, a
 * leaky ReLU where slope > 0). Backward: dbeta, dgamma (either NULL) += this
 * call's sums; dx (NULL: none) = the input gradient (train 0: eval batch
 * norm's, the statistics constant); mask (the forward's output with a
 * fused activation, else NULL) scales dy by slope (0 for a ReLU) where it is
 * <= 0. tiled: the tiled
 * passes. work: device scratch of ts_cuk_norm_work_bytes(N, C), the
 * caller's. Every pointer is device memory; queued on stream, nothing
 * synchronised; TS_ERR_ARG for sizes that are not a norm's, TS_ERR_CUDA if
 * a launch failed. Written without a GPU. */
size_t ts_cuk_norm_work_bytes(int N, int C);
int ts_cuk_norm_forward(const float *x, int N, size_t S, int C, int G, const float *gamma, const float *beta, float eps,
                        float momentum, int train, int relu, float slope, int tiled, float *rmean, float *rvar,
                        float *save_mean, float *save_invstd, float *y, void *work, void *stream);
int ts_cuk_norm_backward(const float *x, const float *dy, const float *mask, float slope, int N, size_t S, int C, int G,
                         const float *gamma, const float *save_mean, const float *save_invstd, int train, int tiled,
                         float *dgamma, float *dbeta, float *dx, void *work, void *stream);
/* count[256] (device, cleared first) = histogram of the labels; *at = first voxel of label t (~0 if none) */
int ts_cuk_label_hist(const uint8_t *y, size_t V, unsigned long long *count, void *stream);
int ts_cuk_label_first(const uint8_t *y, size_t V, int t, unsigned long long *at, void *stream);
/* cross-entropy over V voxels: *num (device, cleared first) = sum w[t] (lse - l[t]); dl += f w[t] (p - onehot) if dl */
int ts_cuk_ce(const float *l, const uint8_t *y, size_t V, int K, int ign, const float *w, float f, float *dl,
              double *num, void *stream);
/* soft Dice sums s [N][K][3] (cleared first) and the first bad voxel (~0 if none) */
int ts_cuk_dice_sums(const float *l, const uint8_t *y, int N, size_t S, int K, int ign, double *s,
                     unsigned long long *bad, void *stream);
/* dl += p (dp - <p, dp>), dp[k] = AB[n][k][0] + (k == t) AB[n][k][1] */
int ts_cuk_dice_grad(const float *l, const uint8_t *y, int N, size_t S, int K, int ign, const float *AB, float *dl,
                     void *stream);

/* ---- context (context.c) ---- */
/* The process's cuDNN and cuBLAS handles, bound to the compute stream of
 * the open device (opened on device 0 if none is). void * to keep cuDNN's
 * headers out of the callers that do not need them. */
int ts_cuda_nn_handles(void **cudnn, void **cublas, void **stream);
/* Grow-only device scratch, one buffer per slot (0 .. TS_CUDA_SLOTS-1):
 * valid until the next call for the same slot; stream-ordered reuse. */
enum { TS_CUDA_SLOT_WORKSPACE = 0, TS_CUDA_SLOT_W, TS_CUDA_SLOT_DW, TS_CUDA_SLOT_A, TS_CUDA_SLOT_B,
       TS_CUDA_SLOT_C, TS_CUDA_SLOT_D, TS_CUDA_SLOT_CAT, TS_CUDA_SLOT_CAT2,
       TS_CUDA_SLOT_SMALL, TS_CUDA_SLOT_SMALL2, TS_CUDA_SLOT_HALO, TS_CUDA_SLOT_SPLIT, TS_CUDA_SLOTS };
int ts_cuda_scratch(int slot, size_t bytes, void **p);
/* An opt-in path's switch: *state 0 off, 1 on, -1 not chosen yet: then on
 * when the environment variable env equals on (read once, kept in *state) */
int ts_cuda_switch(int *state, const char *env, const char *on);
/* The convolutions' precision: 0 fp32, 1 TF32, 2 bf16, 3 fp16 */
int ts_cuda_prec_code(void);
/* "cuDNN 9.19.0, cuBLAS 13.1.0" (the libraries loaded at run time) */
const char *ts_cuda_nn_versions(char *buf, size_t n);
/* Releases the handles and the scratch (waits for queued work first); the
 * next layer call creates them again. */
void ts_cuda_nn_release(void);

/* ---- convolutions through cuDNN (conv_cudnn.c); arguments as the host
 * functions of layers.h ---- */
/* Local, for tests: half-precision convolutions with channel counts that
 * are not multiples of 8 run on zero-padded copies (pad 1;
 * TESSERA_CUDA_FEWCH=pad on first use) or as fp32 on rounded operands
 * (pad 0, the default until the padded path has run on a GPU);
 * conv_cudnn.c's header says why. */
int ts_cuda_set_fewch(int pad);
int ts_cuda_conv3d_forward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, int pad,
                           ts_tensor *y);
int ts_cuda_conv3d_backward(const ts_tensor *x, const ts_tensor *w, int stride, int pad, const ts_tensor *dy,
                            ts_tensor *dx, ts_tensor *dw, ts_tensor *db);
int ts_cuda_conv3d_cat_forward(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_tensor *bias,
                               int stride, int pad, ts_tensor *y);
int ts_cuda_conv3d_cat_backward(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, int stride, int pad,
                                const ts_tensor *dy, ts_tensor *da, ts_tensor *db, ts_tensor *dw, ts_tensor *dbias);
int ts_cuda_convt3d_forward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, ts_tensor *y);
/* ---- a spatial split's convolutions on device tensors (conv_split.c): the
 * box and its halo's faces (host memory, as the exchange left them) made
 * one padded tensor on the device, convolved with padding 0; the input
 * gradient from the padded output gradient, cropped. b NULL: no
 * concatenation. The forward's INTERIOR part does nothing and its BORDER
 * part all of it (once the halo is there); no epilogue ---- */
int ts_cuda_conv3d_forward_split(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_tensor *bias,
                                 const ts_conv_split *s, ts_tensor *y);
int ts_cuda_conv3d_backward_split(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_conv_split *xs,
                                  const ts_conv_split *dys, const ts_tensor *dy, ts_tensor *da, ts_tensor *db,
                                  ts_tensor *dw, ts_tensor *dbias);
int ts_cuda_conv3d_s2_forward_split(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, const ts_halo *h,
                                    ts_tensor *y);
int ts_cuda_conv3d_s2_backward_split(const ts_tensor *x, const ts_tensor *w, const ts_halo *xh, const ts_halo *dyh,
                                     const ts_tensor *dy, ts_tensor *dx, ts_tensor *dw, ts_tensor *db);
int ts_cuda_halo_pack(const ts_tensor *a, const ts_tensor *b, unsigned mask, ts_tensor *dst);
/* halo_kernels.cu: dst = [a, b]'s layers for mask (ts_halo_send_floats's layout); P [N][D+2][H+2][W+2][ca+cb]
 * = [a, b] inside, the faces (device copies laid out as ts_halo's, NULL: zeros) around; a, b = X's interior */
int ts_cuk_halo_pack(const float *a, int ca, const float *b, int cb, int N, const int64_t dhw[3], unsigned mask,
                     float *dst, void *stream);
int ts_cuk_halo_pad(const float *a, int ca, const float *b, int cb, const float *const faces[3][2], const int on[3],
                    int N, const int64_t dhw[3], float *P, void *stream);
int ts_cuk_halo_crop(const float *X, int ca, int cb, int N, const int64_t dhw[3], float *a, float *b, void *stream);
/* ---- transposed convolutions with kernel = stride as cuBLAS GEMMs
 * (conv_gemm.c), called by the two above when ts_cuda_convt_gemm_fits ---- */
/* Local, for tests: 1 on (TESSERA_CUDA_CONVT=gemm on first use), 0 cuDNN
 * (the default until the GEMM path has run on a GPU) */
int ts_cuda_set_convt_gemm(int on);
/* 1 when the GEMM path is on and takes this call (k == stride, sizes within cuBLAS's int) */
int ts_cuda_convt_gemm_fits(const ts_tensor *x, const ts_tensor *w, int stride);
/* y = convt(x) + b (b may be NULL); shapes checked by the caller */
int ts_cuda_convt_gemm_forward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, ts_tensor *y);
/* dw += the weight gradient (dw may be NULL), then dx = the input gradient (dx may be NULL) */
int ts_cuda_convt_gemm_backward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *dy, ts_tensor *dx,
                                ts_tensor *dw);
/* Local, for tests: the weight gradient of conv3d (and of transposed convs
 * cuDNN runs) as im2col + GEMM: 1 on (TESSERA_CUDA_WGRAD=gemm on first
 * use), 0 cuDNN (the default until it has run on a GPU); chunk_bytes: the
 * im2col buffer's size (0: 256 MiB) */
int ts_cuda_set_wgrad_gemm(int on, size_t chunk_bytes);
int ts_cuda_wgrad_gemm_on(void);
/* w [K][C][k^3] += the weight gradient of the convolution of in [N][D][H][W][C]
 * (in3: D, H, W) to out [N][OD][OH][OW][K] (out3), kernel k, stride s, padding p */
int ts_cuda_wgrad_gemm(int N, int C, const int in3[3], int K, const int out3[3], int k, int s, int p, const float *in,
                       const float *out, float *w);
int ts_cuda_convt3d_backward(const ts_tensor *x, const ts_tensor *w, int stride, const ts_tensor *dy, ts_tensor *dx,
                             ts_tensor *dw, ts_tensor *db);


/* ---- the other layers (layers_cuda.c); arguments as layers.h ---- */
/* Local, for tests: the norms' passes over the voxels and the
 * concatenation through the tiled kernels of nn_kernels.cu (1;
 * TESSERA_CUDA_PASSES=tiled on first use) or the plain ones (0, the
 * default until the tiled ones have run on a GPU) */
int ts_cuda_set_passes(int on);
/* Local, for tests: the norms' per-channel arithmetic on the device
 * (1; TESSERA_CUDA_NORMSTATS=device on first use; norm_kernels.cu) where no
 * other rank shares the statistics, or on the host between the passes (0,
 * the default until the device chain has run on a GPU) */
int ts_cuda_set_normstats(int device);
int ts_cuda_relu_forward(const ts_tensor *x, float slope, ts_tensor *y);
int ts_cuda_relu_backward(const ts_tensor *y, float slope, const ts_tensor *dy, ts_tensor *dx);
int ts_cuda_add_inplace(ts_tensor *y, const ts_tensor *x);
int ts_cuda_maxpool3d_forward(const ts_tensor *x, int k, ts_tensor *y, ts_tensor *idx);
int ts_cuda_maxpool3d_backward(const ts_tensor *dy, const ts_tensor *idx, int k, ts_tensor *dx);
int ts_cuda_concat_forward(const ts_tensor *a, const ts_tensor *b, ts_tensor *y);
int ts_cuda_concat_backward(const ts_tensor *dy, ts_tensor *da, ts_tensor *db);
int ts_cuda_batchnorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, ts_tensor *running_mean,
                              ts_tensor *running_var, int train, const ts_norm_opts *o, ts_tensor *y,
                              ts_tensor *save_mean, ts_tensor *save_invstd);
int ts_cuda_batchnorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *save_mean,
                               const ts_tensor *save_invstd, int train, const ts_norm_opts *o, const ts_tensor *dy,
                               ts_tensor *dx, ts_tensor *dgamma, ts_tensor *dbeta);
int ts_cuda_groupnorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, const ts_norm_opts *o,
                              ts_tensor *y, ts_tensor *save_mean, ts_tensor *save_invstd);
int ts_cuda_groupnorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *save_mean,
                               const ts_tensor *save_invstd, const ts_norm_opts *o, const ts_tensor *dy, ts_tensor *dx,
                               ts_tensor *dgamma, ts_tensor *dbeta);
/* cross-entropy and soft Dice: loss (if not NULL) and dlogits += scale * gradient (if not NULL) */
int ts_cuda_softmax_ce(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale,
                       double *loss, ts_tensor *dlogits);
int ts_cuda_dice(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale, double *loss,
                 ts_tensor *dlogits);

#endif
