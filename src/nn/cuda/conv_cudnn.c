/* conv3d and transposed conv3d on the GPU through cuDNN's convolution API:
 * channels-last activations (cuDNN's NHWC format, NDHWC in 3D) as on the
 * CPU, weights kept in PyTorch's layout in the arena and packed per call
 * into cuDNN's channels-last filter layout (a small kernel; the packed
 * weight gradient is added back the same way). The algorithm of each
 * (direction, shape, precision) is chosen once by measurement
 * (cudnnFind*Algorithm) and cached for the process.
 * Precision (ts_nn_conv_precision, read once per call): fp32 with or
 * without TF32 (ts_nn_tf32); bf16 and fp16 stage the operands through
 * half-precision copies, convolve with fp32 accumulation and widen the
 * results to fp32 (the weight gradient is rounded to the half type by
 * cuDNN before it is widened, as PyTorch's autocast does). The bias and its
 * gradient stay fp32. A half-precision convolution whose input or output
 * channels are not a multiple of 8 (the first level's 1 input channel, the
 * head's classes): cuDNN 9's half-precision NDHWC algorithms for such
 * channel counts gave wrong results on an H200 (legacy API; tensor cores
 * need multiples of 8 there in any case). By default it runs as fp32
 * without TF32 on operands rounded to the half type, its results rounded
 * the same way: correct on the H200 (2026-12-04) but on CUDA cores (the
 * first level's one-channel convolution then doubled the step's backward).
 * With TESSERA_CUDA_FEWCH=pad (ts_cuda_set_fewch) it runs on copies with
 * the channels padded to multiples of 8 with zeros (the staging kernels
 * pad and slice as they convert; the padding adds only zero products, so
 * the results are those of the unpadded convolution): written on
 * 2026-12-05 without a GPU, not yet run on one, so not the default until
 * it has (tests/nn/test_layers_cuda checks both; jobs/gpu/check.sh times
 * both).
 * A transposed convolution is the data gradient of the convolution that
 * maps its output space to its input space: its forward is cuDNN's
 * backward-data, its input gradient cuDNN's forward, its weight gradient
 * cuDNN's backward-filter with the roles of input and output swapped.
 * With TESSERA_CUDA_CONVT=gemm, those whose kernel equals their stride run
 * as cuBLAS GEMMs instead, and with TESSERA_CUDA_WGRAD=gemm every weight
 * gradient runs as im2col + GEMM (conv_gemm.c; opt-in until they have run
 * on a GPU).
 * Owns no device selection (src/core/device.c) and no handles (context.c). */
#include "tsbuild.h"
#include "src/nn/cuda/cuda_nn.h"
#include "src/nn/layers.h"
#include "src/core/error.h"

#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdlib.h>
#include <string.h>

#define DNN(call)                                                                                               \
    do {                                                                                                        \
        cudnnStatus_t s_ = (call);                                                                              \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                                       \
            err = TS_ERR(TS_ERR_CUDA, "%s: %s", #call, cudnnGetErrorString(s_));                               \
            goto done;                                                                                          \
        }                                                                                                       \
    } while (0)
#define TRYD(expr)                                                                                              \
    do {                                                                                                        \
        if ((err = (expr)) != 0) goto done;                                                                     \
    } while (0)

/* One convolution as cuDNN sees it: input [N, C, D, H, W] (stored NDHWC),
 * filter [K, C, k, k, k] (stored K, k, k, k, C), output [N, K, OD, OH, OW]. */
typedef struct cgeom {
    int n, c, in[3], k_out, out[3], k, stride, pad;
} cgeom;

typedef struct descs {
    cudnnTensorDescriptor_t x, y, bias, yf; /* yf: fp32 output (bias add, bias gradient) */
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnDataType_t dt;
    int half, fp16;
} descs;

enum { DIR_FWD = 0, DIR_BWD_DATA, DIR_BWD_FILTER };

/* ---- the algorithm cache: (direction, geometry, precision) -> algorithm ---- */
typedef struct algo_entry {
    int dir, prec;
    cgeom g;
    int algo;
    cudnnMathType_t math; /* the math type cuDNN measured the algorithm with: set before running it */
    size_t ws;
} algo_entry;
#define ALGO_CACHE 512
static algo_entry cache[ALGO_CACHE];
static int ncache;

static void destroy(descs *d)
{
    if (d->x) cudnnDestroyTensorDescriptor(d->x);
    if (d->y) cudnnDestroyTensorDescriptor(d->y);
    if (d->yf) cudnnDestroyTensorDescriptor(d->yf);
    if (d->bias) cudnnDestroyTensorDescriptor(d->bias);
    if (d->w) cudnnDestroyFilterDescriptor(d->w);
    if (d->conv) cudnnDestroyConvolutionDescriptor(d->conv);
    memset(d, 0, sizeof *d);
}

/* few-channel half convolutions: 1 padded to multiples of 8, 0 the fp32
 * fallback (the default); -1 not chosen yet (TESSERA_CUDA_FEWCH=pad on first use) */
static int fewch_pad = -1;

int ts_cuda_set_fewch(int pad)
{
    fewch_pad = pad != 0;
    return 0;
}

static int fewch(void) { return ts_cuda_switch(&fewch_pad, "TESSERA_CUDA_FEWCH", "pad"); }

static int round8(int c) { return (c + 7) / 8 * 8; }

/* The precision a convolution of g runs at, from the asked one (ts_cuda_prec_code),
 * and the geometry it runs on (*gp): half precision with channel counts
 * that are not multiples of 8 runs padded (gp's channels rounded up to
 * multiples of 8), or, with the fallback, as fp32 without TF32 on rounded
 * operands (*rnd: 1 bf16, 2 fp16; else 0). */
static int run_prec(const cgeom *g, int *rnd, cgeom *gp)
{
    const int p = ts_cuda_prec_code();
    *rnd = 0;
    *gp = *g;
    if (p >= 2 && (g->c % 8 || g->k_out % 8)) {
        if (fewch()) {
            gp->c = round8(g->c);
            gp->k_out = round8(g->k_out);
            return p;
        }
        *rnd = p == 3 ? 2 : 1;
        return 0;
    }
    return p;
}

/* src rounded to the half type in an fp32 copy (slot), or src itself when rnd is 0 */
static int rounded(int rnd, const float *src, size_t n, int slot, void *stream, const float **out)
{
    if (!rnd) {
        *out = src;
        return 0;
    }
    void *p = NULL;
    TS_TRY(ts_cuda_scratch(slot, n * sizeof(float), &p));
    TS_TRY(ts_cuk_round_half(src, p, n, rnd == 2, stream));
    *out = p;
    return 0;
}

static int setup(const cgeom *g, int prec, descs *d)
{
    int err = 0;
    memset(d, 0, sizeof *d);
    d->half = prec >= 2;
    d->fp16 = prec == 3;
    d->dt = prec == 2 ? CUDNN_DATA_BFLOAT16 : prec == 3 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
    const int xd[5] = {g->n, g->c, g->in[0], g->in[1], g->in[2]};
    const int yd[5] = {g->n, g->k_out, g->out[0], g->out[1], g->out[2]};
    const int wd[5] = {g->k_out, g->c, g->k, g->k, g->k};
    const int bd[5] = {1, g->k_out, 1, 1, 1};
    const int pad[3] = {g->pad, g->pad, g->pad}, str[3] = {g->stride, g->stride, g->stride}, dil[3] = {1, 1, 1};
    DNN(cudnnCreateTensorDescriptor(&d->x));
    DNN(cudnnCreateTensorDescriptor(&d->y));
    DNN(cudnnCreateTensorDescriptor(&d->yf));
    DNN(cudnnCreateTensorDescriptor(&d->bias));
    DNN(cudnnCreateFilterDescriptor(&d->w));
    DNN(cudnnCreateConvolutionDescriptor(&d->conv));
    DNN(cudnnSetTensorNdDescriptorEx(d->x, CUDNN_TENSOR_NHWC, d->dt, 5, xd));
    DNN(cudnnSetTensorNdDescriptorEx(d->y, CUDNN_TENSOR_NHWC, d->dt, 5, yd));
    DNN(cudnnSetTensorNdDescriptorEx(d->yf, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 5, yd));
    DNN(cudnnSetTensorNdDescriptorEx(d->bias, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 5, bd));
    DNN(cudnnSetFilterNdDescriptor(d->w, d->dt, CUDNN_TENSOR_NHWC, 5, wd));
    DNN(cudnnSetConvolutionNdDescriptor(d->conv, 3, pad, str, dil, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DNN(cudnnSetConvolutionMathType(d->conv, prec == 0 ? CUDNN_FMA_MATH
                                             : prec == 1 ? CUDNN_DEFAULT_MATH
                                                         : CUDNN_TENSOR_OP_MATH));
    return 0;
done:
    destroy(d);
    return err;
}

static algo_entry *cached(int dir, int prec, const cgeom *g)
{
    for (int i = 0; i < ncache; i++)
        if (cache[i].dir == dir && cache[i].prec == prec && !memcmp(&cache[i].g, g, sizeof *g)) return &cache[i];
    return NULL;
}

/* The fastest algorithm that cuDNN's measurement found for this direction,
 * geometry and precision; measured once (cudnnFind* allocates its own
 * buffers, so it writes none of the caller's tensors). The descriptor's
 * math type is then set to the one the algorithm was measured with: Find
 * may answer with an algorithm measured under another math type than the
 * descriptor's (FMA for a half-precision shape of few channels where the
 * descriptor asks for tensor ops), and running it under the descriptor's
 * is refused (CUDNN_STATUS_BAD_PARAM; seen on an H200, cuDNN 9). */
static int choose(cudnnHandle_t h, int dir, int prec, const cgeom *g, const descs *d, int *algo, size_t *ws)
{
    int err = 0, got = 0;
    algo_entry *e = cached(dir, prec, g);
    if (!e) {
        int a = -1;
        size_t w = 0;
        cudnnMathType_t mt = CUDNN_DEFAULT_MATH;
        if (dir == DIR_FWD) {
            cudnnConvolutionFwdAlgoPerf_t p[8];
            DNN(cudnnFindConvolutionForwardAlgorithm(h, d->x, d->w, d->conv, d->y, 8, &got, p));
            for (int i = 0; i < got && a < 0; i++)
                if (p[i].status == CUDNN_STATUS_SUCCESS) a = (int)p[i].algo, w = p[i].memory, mt = p[i].mathType;
        } else if (dir == DIR_BWD_DATA) {
            cudnnConvolutionBwdDataAlgoPerf_t p[8];
            DNN(cudnnFindConvolutionBackwardDataAlgorithm(h, d->w, d->y, d->conv, d->x, 8, &got, p));
            for (int i = 0; i < got && a < 0; i++)
                if (p[i].status == CUDNN_STATUS_SUCCESS) a = (int)p[i].algo, w = p[i].memory, mt = p[i].mathType;
        } else {
            cudnnConvolutionBwdFilterAlgoPerf_t p[8];
            DNN(cudnnFindConvolutionBackwardFilterAlgorithm(h, d->x, d->y, d->conv, d->w, 8, &got, p));
            for (int i = 0; i < got && a < 0; i++)
                if (p[i].status == CUDNN_STATUS_SUCCESS) a = (int)p[i].algo, w = p[i].memory, mt = p[i].mathType;
        }
        if (a < 0)
            return TS_ERR(TS_ERR_UNSUPPORTED,
                          "cuDNN has no %s algorithm for a %dx%dx%d convolution of %d -> %d channels "
                          "(stride %d, padding %d, precision code %d)",
                          dir == DIR_FWD ? "forward" : dir == DIR_BWD_DATA ? "backward-data" : "backward-filter", g->k,
                          g->k, g->k, g->c, g->k_out, g->stride, g->pad, prec);
        if (prec == 0 && mt == CUDNN_TENSOR_OP_MATH) mt = CUDNN_FMA_MATH; /* TF32 off stays off */
        static algo_entry one; /* the cache full: this call's answer only */
        e = ncache < ALGO_CACHE ? &cache[ncache++] : &one;
        *e = (algo_entry){dir, prec, *g, a, mt, w};
    }
    DNN(cudnnSetConvolutionMathType(d->conv, e->math));
    *algo = e->algo;
    *ws = e->ws;
    return 0;
done:
    return err;
}

/* ---- shape checks (the host versions' rules, for device tensors) ---- */
static int on_device(const ts_tensor *t, const char *what)
{
    if (!t) return 0;
    if (!t->device || t->dtype != TS_FLOAT32)
        return TS_ERR(TS_ERR_ARG, "%s: every tensor of a GPU layer call must be float32 in device memory", what);
    return 0;
}

/* conv3d: x [N, D, H, W, Cin], w [Cout, Cin, k, k, k] -> geometry, y checked */
static int conv_geom(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, int pad,
                     const ts_tensor *y, const char *yname, cgeom *g)
{
    TS_TRY(on_device(x, "conv3d"));
    TS_TRY(on_device(w, "conv3d"));
    TS_TRY(on_device(b, "conv3d"));
    TS_TRY(on_device(y, "conv3d"));
    TS_TRY(ts_tensor_check_shape(x, "conv3d input", 5, (const int64_t[]){-1, -1, -1, -1, -1}));
    TS_TRY(ts_tensor_check_shape(w, "conv3d weight", 5, (const int64_t[]){-1, x->shape[4], -1, -1, -1}));
    const int k = (int)w->shape[2];
    if (w->shape[3] != k || w->shape[4] != k || k < 1)
        return TS_ERR(TS_ERR_ARG, "conv3d: only cubic kernels (weight has kernel %lldx%lldx%lld)",
                      (long long)w->shape[2], (long long)w->shape[3], (long long)w->shape[4]);
    if (stride < 1 || pad < 0) return TS_ERR(TS_ERR_ARG, "conv3d: stride %d, padding %d", stride, pad);
    const int64_t cout = w->shape[0];
    if (b) TS_TRY(ts_tensor_check_shape(b, "conv3d bias", 1, &cout));
    int64_t od[3];
    for (int i = 0; i < 3; i++) {
        od[i] = ts_conv_out_size(x->shape[1 + i], k, stride, pad);
        if (od[i] < 1)
            return TS_ERR(TS_ERR_ARG, "conv3d: input edge %lld too small for kernel %d, padding %d",
                          (long long)x->shape[1 + i], k, pad);
    }
    TS_TRY(ts_tensor_check_shape(y, yname, 5, (const int64_t[]){x->shape[0], od[0], od[1], od[2], cout}));
    *g = (cgeom){(int)x->shape[0], (int)x->shape[4], {(int)x->shape[1], (int)x->shape[2], (int)x->shape[3]},
                 (int)cout, {(int)od[0], (int)od[1], (int)od[2]}, k, stride, pad};
    return 0;
}

/* convt3d: x [N, D, H, W, Cin], w [Cin, Cout, k, k, k], y [N, (D-1)s+k, ..., Cout]:
 * the geometry of the convolution from y's space (C = Cout) to x's (K = Cin) */
static int convt_geom(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, const ts_tensor *y,
                      const char *yname, cgeom *g)
{
    TS_TRY(on_device(x, "convt3d"));
    TS_TRY(on_device(w, "convt3d"));
    TS_TRY(on_device(b, "convt3d"));
    TS_TRY(on_device(y, "convt3d"));
    TS_TRY(ts_tensor_check_shape(x, "convt3d input", 5, (const int64_t[]){-1, -1, -1, -1, -1}));
    TS_TRY(ts_tensor_check_shape(w, "convt3d weight", 5, (const int64_t[]){x->shape[4], -1, -1, -1, -1}));
    const int k = (int)w->shape[2];
    if (w->shape[3] != k || w->shape[4] != k || k < 1 || stride < 1)
        return TS_ERR(TS_ERR_ARG, "convt3d: cubic kernels and stride >= 1 only");
    const int64_t cout = w->shape[1];
    if (b) TS_TRY(ts_tensor_check_shape(b, "convt3d bias", 1, &cout));
    int64_t od[3];
    for (int i = 0; i < 3; i++) od[i] = (x->shape[1 + i] - 1) * stride + k;
    TS_TRY(ts_tensor_check_shape(y, yname, 5, (const int64_t[]){x->shape[0], od[0], od[1], od[2], cout}));
    *g = (cgeom){(int)x->shape[0], (int)cout, {(int)od[0], (int)od[1], (int)od[2]}, (int)x->shape[4],
                 {(int)x->shape[1], (int)x->shape[2], (int)x->shape[3]}, k, stride, 0};
    return 0;
}

static size_t in_elems(const cgeom *g) { return (size_t)g->n * g->c * g->in[0] * g->in[1] * g->in[2]; }
static size_t out_elems(const cgeom *g) { return (size_t)g->n * g->k_out * g->out[0] * g->out[1] * g->out[2]; }
static size_t w_elems(const cgeom *g) { return (size_t)g->k_out * g->c * g->k * g->k * g->k; }

static size_t in_vox(const cgeom *g) { return (size_t)g->n * g->in[0] * g->in[1] * g->in[2]; }
static size_t out_vox(const cgeom *g) { return (size_t)g->n * g->out[0] * g->out[1] * g->out[2]; }

/* src (fp32, nv voxels of c channels) as the operand of the precision:
 * itself, or a half copy in slot with cp channels (zeros past c) */
static int operand(const descs *d, const float *src, size_t nv, int c, int cp, int slot, void *stream,
                   const void **out)
{
    if (!d->half) {
        *out = src;
        return 0;
    }
    void *p = NULL;
    TS_TRY(ts_cuda_scratch(slot, nv * cp * 2, &p));
    if (c == cp) TS_TRY(ts_cuk_to_half(src, p, nv * c, d->fp16, stream));
    else TS_TRY(ts_cuk_to_half_pad(src, c, p, cp, nv, d->fp16, stream));
    *out = p;
    return 0;
}

/* a result buffer of the precision: dst itself, or a half buffer in slot
 * (nv voxels of cp channels) to widen afterwards (widen) */
static int result(const descs *d, float *dst, size_t nv, int cp, int slot, void **out)
{
    if (!d->half) {
        *out = dst;
        return 0;
    }
    return ts_cuda_scratch(slot, nv * cp * 2, out);
}

/* the half result h (nv voxels of cp channels) widened into dst's c channels */
static int widen(const descs *d, const void *h, float *dst, size_t nv, int c, int cp, void *stream)
{
    if (c == cp) return ts_cuk_from_half(h, dst, nv * c, d->fp16, 0, stream);
    return ts_cuk_from_half_slice(h, cp, dst, c, nv, d->fp16, stream);
}

/* The packed filter of w ([K][C][taps] in PyTorch's order for g's K and C)
 * as the precision's operand, on gp's channels (zeros past g's). */
static int packed_filter(const cgeom *g, const cgeom *gp, const descs *d, const float *w, void *stream,
                         const void **out)
{
    float *wp = NULL;
    const int taps = g->k * g->k * g->k;
    TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_W, w_elems(gp) * sizeof(float), (void **)&wp));
    if (gp->c == g->c && gp->k_out == g->k_out) TS_TRY(ts_cuk_wpack(w, wp, g->k_out, g->c, taps, 0, stream));
    else TS_TRY(ts_cuk_wpack_pad(w, wp, g->k_out, g->c, taps, gp->k_out, gp->c, stream));
    if (!d->half) {
        *out = wp;
        return 0;
    }
    void *h = NULL;
    TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_D, w_elems(gp) * 2, &h));
    TS_TRY(ts_cuk_to_half(wp, h, w_elems(gp), d->fp16, stream));
    *out = h;
    return 0;
}

/* ---- the three directions on one geometry ----
 * fwd:       out  = conv(in, w)           (beta 0)
 * bwd_data:  in  = conv^T(out, w)         (beta 0)
 * bwd_filt:  w   += dconv/dw (in, out)    (accumulated, PyTorch's layout) */
static int run_fwd(const cgeom *g, const float *in, const float *w, float *out)
{
    int err = 0, algo = 0;
    size_t ws = 0;
    void *h = NULL, *stream = NULL, *wsp = NULL, *o = NULL;
    const void *xi = NULL, *wi = NULL;
    descs d;
    int rnd = 0;
    cgeom gp;
    const int prec = run_prec(g, &rnd, &gp);
    TS_TRY(ts_cuda_nn_handles(&h, NULL, &stream));
    TS_TRY(setup(&gp, prec, &d));
    TRYD(choose(h, DIR_FWD, prec, &gp, &d, &algo, &ws));
    TRYD(ts_cuda_scratch(TS_CUDA_SLOT_WORKSPACE, ws, &wsp));
    TRYD(rounded(rnd, in, in_elems(g), TS_CUDA_SLOT_A, stream, &in));
    TRYD(operand(&d, in, in_vox(g), g->c, gp.c, TS_CUDA_SLOT_A, stream, &xi));
    TRYD(packed_filter(g, &gp, &d, w, stream, &wi));
    if (rnd) TRYD(ts_cuk_round_half(wi, (float *)wi, w_elems(g), rnd == 2, stream)); /* the packed scratch copy */
    TRYD(result(&d, out, out_vox(g), gp.k_out, TS_CUDA_SLOT_C, &o));
    const float one = 1, zero = 0;
    DNN(cudnnConvolutionForward(h, &one, d.x, xi, d.w, wi, d.conv, (cudnnConvolutionFwdAlgo_t)algo, wsp, ws, &zero,
                                d.y, o));
    if (d.half) TRYD(widen(&d, o, out, out_vox(g), g->k_out, gp.k_out, stream));
    if (rnd) TRYD(ts_cuk_round_half(out, out, out_elems(g), rnd == 2, stream));
done:
    destroy(&d);
    return err;
}

static int run_bwd_data(const cgeom *g, const float *out, const float *w, float *in)
{
    int err = 0, algo = 0;
    size_t ws = 0;
    void *h = NULL, *stream = NULL, *wsp = NULL, *o = NULL;
    const void *dyi = NULL, *wi = NULL;
    descs d;
    int rnd = 0;
    cgeom gp;
    const int prec = run_prec(g, &rnd, &gp);
    TS_TRY(ts_cuda_nn_handles(&h, NULL, &stream));
    TS_TRY(setup(&gp, prec, &d));
    TRYD(choose(h, DIR_BWD_DATA, prec, &gp, &d, &algo, &ws));
    TRYD(ts_cuda_scratch(TS_CUDA_SLOT_WORKSPACE, ws, &wsp));
    TRYD(rounded(rnd, out, out_elems(g), TS_CUDA_SLOT_B, stream, &out));
    TRYD(operand(&d, out, out_vox(g), g->k_out, gp.k_out, TS_CUDA_SLOT_B, stream, &dyi));
    TRYD(packed_filter(g, &gp, &d, w, stream, &wi));
    if (rnd) TRYD(ts_cuk_round_half(wi, (float *)wi, w_elems(g), rnd == 2, stream)); /* the packed scratch copy */
    TRYD(result(&d, in, in_vox(g), gp.c, TS_CUDA_SLOT_C, &o));
    const float one = 1, zero = 0;
    DNN(cudnnConvolutionBackwardData(h, &one, d.w, wi, d.y, dyi, d.conv, (cudnnConvolutionBwdDataAlgo_t)algo, wsp, ws,
                                     &zero, d.x, o));
    if (d.half) TRYD(widen(&d, o, in, in_vox(g), g->c, gp.c, stream));
    if (rnd) TRYD(ts_cuk_round_half(in, in, in_elems(g), rnd == 2, stream));
done:
    destroy(&d);
    return err;
}

static int run_bwd_filter(const cgeom *g, const float *in, const float *out, float *w)
{
    int err = 0, algo = 0;
    size_t ws = 0;
    void *h = NULL, *stream = NULL, *wsp = NULL, *dwp = NULL, *dwh = NULL;
    const void *xi = NULL, *dyi = NULL;
    descs d;
    int rnd = 0;
    cgeom gp;
    if (ts_cuda_wgrad_gemm_on()) /* im2col + cuBLAS instead (conv_gemm.c; opt-in) */
        return ts_cuda_wgrad_gemm(g->n, g->c, g->in, g->k_out, g->out, g->k, g->stride, g->pad, in, out, w);
    const int prec = run_prec(g, &rnd, &gp), taps = g->k * g->k * g->k;
    TS_TRY(ts_cuda_nn_handles(&h, NULL, &stream));
    TS_TRY(setup(&gp, prec, &d));
    TRYD(choose(h, DIR_BWD_FILTER, prec, &gp, &d, &algo, &ws));
    TRYD(ts_cuda_scratch(TS_CUDA_SLOT_WORKSPACE, ws, &wsp));
    TRYD(rounded(rnd, in, in_elems(g), TS_CUDA_SLOT_A, stream, &in));
    TRYD(rounded(rnd, out, out_elems(g), TS_CUDA_SLOT_B, stream, &out));
    TRYD(operand(&d, in, in_vox(g), g->c, gp.c, TS_CUDA_SLOT_A, stream, &xi));
    TRYD(operand(&d, out, out_vox(g), g->k_out, gp.k_out, TS_CUDA_SLOT_B, stream, &dyi));
    /* the gradient of gp's filter [K'][taps][C'], fp32 */
    TRYD(ts_cuda_scratch(TS_CUDA_SLOT_DW, w_elems(&gp) * sizeof(float), &dwp));
    if (d.half) TRYD(ts_cuda_scratch(TS_CUDA_SLOT_D, w_elems(&gp) * 2, &dwh));
    const float one = 1, zero = 0;
    DNN(cudnnConvolutionBackwardFilter(h, &one, d.x, xi, d.y, dyi, d.conv, (cudnnConvolutionBwdFilterAlgo_t)algo, wsp,
                                       ws, &zero, d.w, d.half ? dwh : dwp));
    if (d.half) TRYD(ts_cuk_from_half(dwh, dwp, w_elems(&gp), d.fp16, 0, stream));
    if (rnd) TRYD(ts_cuk_round_half(dwp, dwp, w_elems(g), rnd == 2, stream));
    if (gp.c == g->c) TRYD(ts_cuk_wunpack_add(dwp, w, g->k_out, g->c, taps, stream)); /* (rows past K unread) */
    else TRYD(ts_cuk_wunpack_add_pad(dwp, w, g->k_out, g->c, taps, gp.c, stream));
done:
    destroy(&d);
    return err;
}

/* the bias over g's output channels (fp32): grad 0, out += bias; grad 1,
 * bias += the sum of out (a gradient dy) over N, D, H, W */
static int bias_op(const cgeom *g, int grad, const float *src, float *dst)
{
    int err = 0;
    void *h = NULL;
    descs d;
    TS_TRY(ts_cuda_nn_handles(&h, NULL, NULL));
    TS_TRY(setup(g, 0, &d));
    const float one = 1;
    if (grad) DNN(cudnnConvolutionBackwardBias(h, &one, d.yf, src, &one, d.bias, dst));
    else DNN(cudnnAddTensor(h, &one, d.bias, src, &one, d.yf, dst));
done:
    destroy(&d);
    return err;
}

/* ---- layers.h's conv3d and convt3d on device tensors ---- */
int ts_cuda_conv3d_forward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, int pad,
                           ts_tensor *y)
{
    cgeom g;
    TS_TRY(conv_geom(x, w, b, stride, pad, y, "conv3d output", &g));
    TS_TRY(run_fwd(&g, x->data, w->data, y->data));
    if (b) TS_TRY(bias_op(&g, 0, b->data, y->data));
    return 0;
}

int ts_cuda_conv3d_backward(const ts_tensor *x, const ts_tensor *w, int stride, int pad, const ts_tensor *dy,
                            ts_tensor *dx, ts_tensor *dw, ts_tensor *db)
{
    cgeom g;
    TS_TRY(conv_geom(x, w, db, stride, pad, dy, "conv3d output gradient", &g));
    if (dx) {
        TS_TRY(on_device(dx, "conv3d"));
        TS_TRY(ts_tensor_check_shape(dx, "conv3d input gradient", 5, x->shape));
    }
    if (dw) {
        TS_TRY(on_device(dw, "conv3d"));
        TS_TRY(ts_tensor_check_shape(dw, "conv3d weight gradient", 5, w->shape));
    }
    /* the weight gradient first: dx may be x itself */
    if (dw) TS_TRY(run_bwd_filter(&g, x->data, dy->data, dw->data));
    if (db) TS_TRY(bias_op(&g, 1, dy->data, db->data));
    if (dx) TS_TRY(run_bwd_data(&g, dy->data, w->data, dx->data));
    return 0;
}

int ts_cuda_convt3d_forward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, int stride, ts_tensor *y)
{
    cgeom g;
    TS_TRY(convt_geom(x, w, b, stride, y, "convt3d output", &g));
    if (ts_cuda_convt_gemm_fits(x, w, stride)) return ts_cuda_convt_gemm_forward(x, w, b, y);
    /* y's space is the convolution's input: y = conv^T(x) */
    TS_TRY(run_bwd_data(&g, x->data, w->data, y->data));
    if (b) {
        cgeom gb = g; /* the bias is over y's channels: y as an "output" of C channels */
        gb.k_out = g.c;
        memcpy(gb.out, g.in, sizeof gb.out);
        TS_TRY(bias_op(&gb, 0, b->data, y->data));
    }
    return 0;
}

int ts_cuda_convt3d_backward(const ts_tensor *x, const ts_tensor *w, int stride, const ts_tensor *dy, ts_tensor *dx,
                             ts_tensor *dw, ts_tensor *db)
{
    cgeom g;
    TS_TRY(convt_geom(x, w, db, stride, dy, "convt3d output gradient", &g));
    if (dx) {
        TS_TRY(on_device(dx, "convt3d"));
        TS_TRY(ts_tensor_check_shape(dx, "convt3d input gradient", 5, x->shape));
    }
    if (dw) {
        TS_TRY(on_device(dw, "convt3d"));
        TS_TRY(ts_tensor_check_shape(dw, "convt3d weight gradient", 5, w->shape));
    }
    const int gemm = ts_cuda_convt_gemm_fits(x, w, stride);
    /* the convolution's input is dy's space, its output x's space */
    if (gemm) TS_TRY(ts_cuda_convt_gemm_backward(x, w, dy, dx, dw)); /* dw, then dx */
    else if (dw) TS_TRY(run_bwd_filter(&g, dy->data, x->data, dw->data));
    if (db) {
        cgeom gb = g;
        gb.k_out = g.c;
        memcpy(gb.out, g.in, sizeof gb.out);
        TS_TRY(bias_op(&gb, 1, dy->data, db->data));
    }
    if (dx && !gemm) TS_TRY(run_fwd(&g, dy->data, w->data, dx->data));
    return 0;
}

/* ---- conv3d over the concatenation [a, b]: concatenated on the device
 * (strided copies), then as conv3d; the input gradient is split back ---- */
static int cat_copy(const ts_tensor *a, const ts_tensor *b, float *ab, int split, ts_tensor *da, ts_tensor *db)
{
    void *stream = NULL;
    TS_TRY(ts_cuda_nn_handles(NULL, NULL, &stream));
    const size_t ca = (size_t)a->shape[4], cb = (size_t)b->shape[4], c = ca + cb;
    const size_t vox = (size_t)(ts_tensor_numel(a) / (int64_t)(ca ? ca : 1));
    const float *sa = split ? ab : a->data, *sb = split ? ab + ca : b->data;
    float *ta = split ? (da ? da->data : NULL) : ab, *tb = split ? (db ? db->data : NULL) : ab + ca;
    cudaError_t e = cudaSuccess;
    if (ta && ca)
        e = cudaMemcpy2DAsync(ta, (split ? ca : c) * 4, sa, (split ? c : ca) * 4, ca * 4, vox, cudaMemcpyDeviceToDevice,
                              (cudaStream_t)stream);
    if (e == cudaSuccess && tb && cb)
        e = cudaMemcpy2DAsync(tb, (split ? cb : c) * 4, sb, (split ? c : cb) * 4, cb * 4, vox,
                              cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
    if (e != cudaSuccess) return TS_ERR(TS_ERR_CUDA, "concatenating on the GPU: %s", cudaGetErrorString(e));
    return 0;
}

static int cat_view(const ts_tensor *a, const ts_tensor *b, int slot, ts_tensor *ab)
{
    TS_TRY(on_device(a, "conv3d over a concatenation"));
    TS_TRY(on_device(b, "conv3d over a concatenation"));
    if (a->ndim != 5 || b->ndim != 5) return TS_ERR(TS_ERR_ARG, "conv3d over a concatenation: inputs must be 5-d");
    for (int i = 0; i < 4; i++)
        if (a->shape[i] != b->shape[i])
            return TS_ERR(TS_ERR_ARG, "conv3d over a concatenation: inputs differ before the channels");
    const int64_t sh[5] = {a->shape[0], a->shape[1], a->shape[2], a->shape[3], a->shape[4] + b->shape[4]};
    *ab = ts_tensor_view(NULL, TS_FLOAT32, 5, sh);
    ab->device = 1;
    return ts_cuda_scratch(slot, ts_tensor_bytes(ab), &ab->data);
}

int ts_cuda_conv3d_cat_forward(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_tensor *bias,
                               int stride, int pad, ts_tensor *y)
{
    ts_tensor ab;
    /* its own slot: the conv's staging (slots A..D) must not overwrite it */
    TS_TRY(cat_view(a, b, TS_CUDA_SLOT_CAT, &ab));
    TS_TRY(cat_copy(a, b, ab.data, 0, NULL, NULL));
    return ts_cuda_conv3d_forward(&ab, w, bias, stride, pad, y);
}

int ts_cuda_conv3d_cat_backward(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, int stride, int pad,
                                const ts_tensor *dy, ts_tensor *da, ts_tensor *db, ts_tensor *dw, ts_tensor *dbias)
{
    ts_tensor ab, dab;
    if (da) TS_TRY(on_device(da, "conv3d over a concatenation"));
    if (db) TS_TRY(on_device(db, "conv3d over a concatenation"));
    TS_TRY(cat_view(a, b, TS_CUDA_SLOT_CAT, &ab));
    TS_TRY(cat_copy(a, b, ab.data, 0, NULL, NULL));
    if (da || db) TS_TRY(cat_view(a, b, TS_CUDA_SLOT_CAT2, &dab));
    TS_TRY(ts_cuda_conv3d_backward(&ab, w, stride, pad, dy, da || db ? &dab : NULL, dw, dbias));
    if (da || db) TS_TRY(cat_copy(a, b, dab.data, 1, da, db));
    return 0;
}
