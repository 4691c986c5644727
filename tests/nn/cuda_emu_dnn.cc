/* The CUDA emulator's cuDNN (tests/nn/emu_include/cudnn.h): the legacy
 * convolution API as src/nn/cuda/conv_cudnn.c uses it, computed in double
 * on the CPU from the operands' stored values (fp32, bf16, fp16), the
 * result rounded once to the output's type. Descriptors are checked as
 * cuDNN checks them (sizes that agree, 5-D NHWC, a workspace as large as
 * the algorithm search asked for); fp32 operands under a math type that
 * allows tensor cores are rounded to TF32 first, as an A100 or later does.
 * What conv_cudnn.c does not use (NCHW, groups, dilation, convolution
 * mode, double) is refused with CUDNN_STATUS_NOT_SUPPORTED. Built only in
 * a build configured --with-cuda=emu. */
#include <cudnn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/dtype.h"

struct cudnnContext {
    cudaStream_t stream;
};
struct cudnnTensorStruct {
    int set, fmt, dt, dims[5];
};
struct cudnnFilterStruct {
    int set, fmt, dt, dims[5];
};
struct cudnnConvolutionStruct {
    int set, pad[3], stride[3], math;
};

namespace {

enum { WS_BYTES = 4096 }; /* the workspace every algorithm asks for: conv_cudnn.c must pass it */

double get(const void *p, int dt, size_t i)
{
    if (dt == CUDNN_DATA_FLOAT) return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    return dt == CUDNN_DATA_BFLOAT16 ? ts_bf16_to_f32(h) : ts_f16_to_f32(h);
}

void put(void *p, int dt, size_t i, double v)
{
    if (dt == CUDNN_DATA_FLOAT) ((float *)p)[i] = (float)v;
    else if (dt == CUDNN_DATA_BFLOAT16) ((uint16_t *)p)[i] = ts_f32_to_bf16((float)v);
    else ((uint16_t *)p)[i] = ts_f32_to_f16((float)v);
}

/* TF32: 10 bits of mantissa, rounded to nearest even */
double tf32(double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
    memcpy(&f, &u, 4);
    return f;
}

bool half_type(int dt) { return dt == CUDNN_DATA_HALF || dt == CUDNN_DATA_BFLOAT16; }
bool type_ok(int dt) { return dt == CUDNN_DATA_FLOAT || half_type(dt); }

/* a convolution's three descriptors agree: x (N,C,D,H,W), w (K,C,k,k,k), y (N,K,D',H',W') */
cudnnStatus_t geometry(const cudnnTensorStruct *x, const cudnnFilterStruct *w, const cudnnConvolutionStruct *c,
                       const cudnnTensorStruct *y)
{
    if (!x || !w || !c || !y || !x->set || !w->set || !c->set || !y->set) return CUDNN_STATUS_BAD_PARAM;
    if (x->dt != w->dt || x->dt != y->dt) return CUDNN_STATUS_BAD_PARAM;
    if (x->dims[0] != y->dims[0] || x->dims[1] != w->dims[1] || y->dims[1] != w->dims[0]) return CUDNN_STATUS_BAD_PARAM;
    for (int a = 0; a < 3; a++)
        if (y->dims[2 + a] != (x->dims[2 + a] + 2 * c->pad[a] - w->dims[2 + a]) / c->stride[a] + 1 ||
            x->dims[2 + a] + 2 * c->pad[a] < w->dims[2 + a])
            return CUDNN_STATUS_BAD_PARAM;
    return CUDNN_STATUS_SUCCESS;
}

bool tensor_cores(const cudnnConvolutionStruct *c, int dt)
{
    return dt == CUDNN_DATA_FLOAT && c->math != CUDNN_FMA_MATH;
}

/* the NHWC offsets */
size_t xoff(const cudnnTensorStruct *t, int n, int z, int y, int x, int ch)
{
    const int *d = t->dims;
    return ((((size_t)n * d[2] + z) * d[3] + y) * d[4] + x) * d[1] + ch;
}
size_t woff(const cudnnFilterStruct *w, int k, int a, int b, int c, int ch)
{
    const int *d = w->dims;
    return ((((size_t)k * d[2] + a) * d[3] + b) * d[4] + c) * d[1] + ch;
}

cudnnStatus_t workspace(const void *ws, size_t bytes)
{
    if (bytes < WS_BYTES || !ws) return CUDNN_STATUS_BAD_PARAM;
    memset((void *)ws, 0xff, WS_BYTES); /* as if the algorithm used it */
    return CUDNN_STATUS_SUCCESS;
}

template <typename P> int find(int want, int *got, P *p, const cudnnConvolutionStruct *c)
{
    if (want < 1 || !got || !p) return 0;
    /* an algorithm that fails first (as cuDNN lists the ones it could not run), then the one that runs */
    memset(p, 0, sizeof *p * (want < 2 ? 1 : 2));
    int k = 0;
    if (want >= 2) {
        p[k].algo = (decltype(p[k].algo))1;
        p[k].status = CUDNN_STATUS_NOT_SUPPORTED;
        p[k].time = -1;
        k++;
    }
    p[k].algo = (decltype(p[k].algo))0;
    p[k].status = CUDNN_STATUS_SUCCESS;
    p[k].memory = WS_BYTES;
    p[k].mathType = (cudnnMathType_t)c->math;
    p[k].determinism = CUDNN_DETERMINISTIC;
    *got = k + 1;
    return 1;
}

/* the convolution's inner loop: calls f(x index, w index, y index) for every tap inside the volume */
template <typename F>
void each_tap(const cudnnTensorStruct *x, const cudnnFilterStruct *w, const cudnnConvolutionStruct *c,
              const cudnnTensorStruct *y, int n, int k, int oz, int oy, int ox, F f)
{
    for (int a = 0; a < w->dims[2]; a++) {
        const int iz = oz * c->stride[0] - c->pad[0] + a;
        if (iz < 0 || iz >= x->dims[2]) continue;
        for (int b = 0; b < w->dims[3]; b++) {
            const int iy = oy * c->stride[1] - c->pad[1] + b;
            if (iy < 0 || iy >= x->dims[3]) continue;
            for (int e = 0; e < w->dims[4]; e++) {
                const int ix = ox * c->stride[2] - c->pad[2] + e;
                if (ix < 0 || ix >= x->dims[4]) continue;
                for (int ch = 0; ch < x->dims[1]; ch++)
                    f(xoff(x, n, iz, iy, ix, ch), woff(w, k, a, b, e, ch), xoff(y, n, oz, oy, ox, k));
            }
        }
    }
}

template <typename F> void each_out(const cudnnTensorStruct *y, F f)
{
    for (int n = 0; n < y->dims[0]; n++)
        for (int z = 0; z < y->dims[2]; z++)
            for (int yy = 0; yy < y->dims[3]; yy++)
                for (int xx = 0; xx < y->dims[4]; xx++)
                    for (int k = 0; k < y->dims[1]; k++) f(n, z, yy, xx, k);
}

size_t elems(const int *d) { return (size_t)d[0] * d[1] * d[2] * d[3] * d[4]; }

/* dst = alpha acc + beta dst, over n elements of type dt */
void blend(void *dst, int dt, const double *acc, size_t n, const void *alpha, const void *beta)
{
    const double al = *(const float *)alpha, be = *(const float *)beta;
    for (size_t i = 0; i < n; i++) put(dst, dt, i, al * acc[i] + (be != 0 ? be * get(dst, dt, i) : 0.0));
}

double *zeros(size_t n) { return (double *)calloc(n ? n : 1, sizeof(double)); }

template <typename S> cudnnStatus_t set5(S *d, int fmt, int dt, int nd, const int *dims)
{
    if (!d || nd != 5 || !dims) return CUDNN_STATUS_BAD_PARAM;
    if (fmt != CUDNN_TENSOR_NHWC || !type_ok(dt)) return CUDNN_STATUS_NOT_SUPPORTED;
    for (int i = 0; i < 5; i++)
        if (dims[i] < 1) return CUDNN_STATUS_BAD_PARAM;
    d->fmt = fmt;
    d->dt = dt;
    memcpy(d->dims, dims, sizeof d->dims);
    d->set = 1;
    return CUDNN_STATUS_SUCCESS;
}

/* The three convolutions over one geometry (x, w, y descriptors): to TO_Y, y = alpha conv(x, w) + beta y;
 * TO_X, dx = alpha (the transposed convolution of dy with w) + beta dx; TO_W, dw = alpha (x correlated with dy)
 * + beta dw. px, pw, py are the three tensors' data; out is the one written (one of them). */
enum { TO_Y, TO_X, TO_W };
cudnnStatus_t conv_op(int to, cudnnHandle_t h, const void *alpha, const void *beta, const cudnnTensorStruct *x,
                      const cudnnFilterStruct *w, const cudnnConvolutionStruct *c, const cudnnTensorStruct *y, int algo,
                      void *ws, size_t ws_bytes, const void *px, const void *pw, const void *py, void *out)
{
    cudnnStatus_t s = geometry(x, w, c, y);
    if (s || !h || !alpha || !beta || !px || !pw || !py) return s ? s : CUDNN_STATUS_BAD_PARAM;
    if (algo != 0) return CUDNN_STATUS_NOT_SUPPORTED;
    if ((s = workspace(ws, ws_bytes))) return s;
    const size_t n = to == TO_Y ? elems(y->dims) : to == TO_X ? elems(x->dims) : elems(w->dims);
    double *acc = zeros(n);
    if (!acc) return CUDNN_STATUS_NOT_INITIALIZED;
    const bool tc = tensor_cores(c, x->dt);
    const int dt = x->dt;
    const auto r = [&](double v) { return tc ? tf32(v) : v; }; /* an operand as the math type reads it */
    each_out(y, [&](int b, int z, int yy, int xx, int k) {
        each_tap(x, w, c, y, b, k, z, yy, xx, [&](size_t xi, size_t wi, size_t yi) {
            if (to == TO_Y) acc[yi] += r(get(px, dt, xi)) * r(get(pw, dt, wi));
            else if (to == TO_X) acc[xi] += r(get(py, dt, yi)) * r(get(pw, dt, wi));
            else acc[wi] += r(get(px, dt, xi)) * r(get(py, dt, yi));
        });
    });
    blend(out, to == TO_Y ? y->dt : to == TO_X ? x->dt : w->dt, acc, n, alpha, beta);
    free(acc);
    return CUDNN_STATUS_SUCCESS;
}

} // namespace

extern "C" {

size_t cudnnGetVersion(void) { return 90000; }

const char *cudnnGetErrorString(cudnnStatus_t s)
{
    return s == CUDNN_STATUS_SUCCESS       ? "CUDNN_STATUS_SUCCESS"
           : s == CUDNN_STATUS_BAD_PARAM     ? "CUDNN_STATUS_BAD_PARAM (the CUDA emulator)"
           : s == CUDNN_STATUS_NOT_SUPPORTED ? "CUDNN_STATUS_NOT_SUPPORTED (the CUDA emulator)"
                                             : "CUDNN_STATUS_NOT_INITIALIZED";
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *h)
{
    if (!h) return CUDNN_STATUS_BAD_PARAM;
    *h = (cudnnHandle_t)calloc(1, sizeof **h);
    return *h ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_INITIALIZED;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h)
{
    free(h);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s)
{
    if (!h) return CUDNN_STATUS_BAD_PARAM;
    h->stream = s;
    return CUDNN_STATUS_SUCCESS;
}

#define TS_EMU_DESC(Create, Destroy, T)                    \
    cudnnStatus_t Create(T *d)                             \
    {                                                      \
        if (!d) return CUDNN_STATUS_BAD_PARAM;             \
        *d = (T)calloc(1, sizeof **d);                     \
        return *d ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_INITIALIZED; \
    }                                                      \
    cudnnStatus_t Destroy(T d)                             \
    {                                                      \
        free(d);                                           \
        return CUDNN_STATUS_SUCCESS;                       \
    }
TS_EMU_DESC(cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor, cudnnTensorDescriptor_t)
TS_EMU_DESC(cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor, cudnnFilterDescriptor_t)
TS_EMU_DESC(cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor, cudnnConvolutionDescriptor_t)
#undef TS_EMU_DESC

cudnnStatus_t cudnnSetTensorNdDescriptorEx(cudnnTensorDescriptor_t d, cudnnTensorFormat_t f, cudnnDataType_t t,
                                           int nd, const int dims[])
{
    return set5(d, f, t, nd, dims);
}

cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t, cudnnTensorFormat_t f, int nd,
                                         const int dims[])
{
    return set5(d, f, t, nd, dims);
}

cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t d, int n, const int pad[],
                                              const int stride[], const int dil[], cudnnConvolutionMode_t mode,
                                              cudnnDataType_t t)
{
    if (!d || n != 3 || !pad || !stride || !dil) return CUDNN_STATUS_BAD_PARAM;
    if (mode != CUDNN_CROSS_CORRELATION || t != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
    for (int a = 0; a < 3; a++) {
        if (pad[a] < 0 || stride[a] < 1 || dil[a] < 1) return CUDNN_STATUS_BAD_PARAM;
        if (dil[a] != 1) return CUDNN_STATUS_NOT_SUPPORTED;
        d->pad[a] = pad[a];
        d->stride[a] = stride[a];
    }
    d->set = 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m)
{
    if (!d || (m != CUDNN_DEFAULT_MATH && m != CUDNN_TENSOR_OP_MATH && m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&
               m != CUDNN_FMA_MATH))
        return CUDNN_STATUS_BAD_PARAM;
    d->math = m;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                   cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t c,
                                                   cudnnTensorDescriptor_t y, int want, int *got,
                                                   cudnnConvolutionFwdAlgoPerf_t *p)
{
    const cudnnStatus_t s = geometry(x, w, c, y);
    if (!h || s) return h ? s : CUDNN_STATUS_BAD_PARAM;
    return find(want, got, p, c) ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(cudnnHandle_t h, cudnnFilterDescriptor_t w,
                                                        cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t c,
                                                        cudnnTensorDescriptor_t dx, int want, int *got,
                                                        cudnnConvolutionBwdDataAlgoPerf_t *p)
{
    const cudnnStatus_t s = geometry(dx, w, c, dy);
    if (!h || s) return h ? s : CUDNN_STATUS_BAD_PARAM;
    return find(want, got, p, c) ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                          cudnnTensorDescriptor_t dy, cudnnConvolutionDescriptor_t c,
                                                          cudnnFilterDescriptor_t dw, int want, int *got,
                                                          cudnnConvolutionBwdFilterAlgoPerf_t *p)
{
    const cudnnStatus_t s = geometry(x, dw, c, dy);
    if (!h || s) return h ? s : CUDNN_STATUS_BAD_PARAM;
    return find(want, got, p, c) ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

/* An algorithm measured under tensor-op math, run under FMA math (or the
 * reverse) is refused by cuDNN 9 (conv_cudnn.c's choose() sets the math
 * type it was measured with); the emulator's algorithm 0 runs under any. */
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t xd, const void *x,
                                      cudnnFilterDescriptor_t wd, const void *w, cudnnConvolutionDescriptor_t c,
                                      cudnnConvolutionFwdAlgo_t algo, void *ws, size_t ws_bytes, const void *beta,
                                      cudnnTensorDescriptor_t yd, void *y)
{
    return conv_op(TO_Y, h, alpha, beta, xd, wd, c, yd, (int)algo, ws, ws_bytes, x, w, y, y);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha, cudnnFilterDescriptor_t wd,
                                           const void *w, cudnnTensorDescriptor_t dyd, const void *dy,
                                           cudnnConvolutionDescriptor_t c, cudnnConvolutionBwdDataAlgo_t algo,
                                           void *ws, size_t ws_bytes, const void *beta, cudnnTensorDescriptor_t dxd,
                                           void *dx)
{
    return conv_op(TO_X, h, alpha, beta, dxd, wd, c, dyd, (int)algo, ws, ws_bytes, dx, w, dy, dx);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t xd,
                                             const void *x, cudnnTensorDescriptor_t dyd, const void *dy,
                                             cudnnConvolutionDescriptor_t c, cudnnConvolutionBwdFilterAlgo_t algo,
                                             void *ws, size_t ws_bytes, const void *beta, cudnnFilterDescriptor_t dwd,
                                             void *dw)
{
    return conv_op(TO_W, h, alpha, beta, xd, dwd, c, dyd, (int)algo, ws, ws_bytes, x, dw, dy, dw);
}

/* db (1,K,1,1,1) = alpha sum over N, D, H, W of dy + beta db */
cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t dyd,
                                           const void *dy, const void *beta, cudnnTensorDescriptor_t dbd, void *db)
{
    if (!h || !alpha || !beta || !dy || !db || !dyd || !dbd || !dyd->set || !dbd->set) return CUDNN_STATUS_BAD_PARAM;
    const int K = dyd->dims[1];
    if (dbd->dims[0] != 1 || dbd->dims[1] != K || dbd->dims[2] * dbd->dims[3] * dbd->dims[4] != 1)
        return CUDNN_STATUS_BAD_PARAM;
    double *acc = zeros((size_t)K);
    if (!acc) return CUDNN_STATUS_NOT_INITIALIZED;
    const size_t n = elems(dyd->dims);
    for (size_t i = 0; i < n; i++) acc[i % (size_t)K] += get(dy, dyd->dt, i);
    blend(db, dbd->dt, acc, (size_t)K, alpha, beta);
    free(acc);
    return CUDNN_STATUS_SUCCESS;
}

/* c = alpha a + beta c, a broadcast over the dimensions where it is 1 */
cudnnStatus_t cudnnAddTensor(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t ad, const void *a,
                             const void *beta, cudnnTensorDescriptor_t cd, void *c)
{
    if (!h || !alpha || !beta || !a || !c || !ad || !cd || !ad->set || !cd->set) return CUDNN_STATUS_BAD_PARAM;
    for (int i = 0; i < 5; i++)
        if (ad->dims[i] != 1 && ad->dims[i] != cd->dims[i]) return CUDNN_STATUS_BAD_PARAM;
    const double al = *(const float *)alpha, be = *(const float *)beta;
    const int *d = cd->dims;
    for (int n = 0; n < d[0]; n++)
        for (int z = 0; z < d[2]; z++)
            for (int y = 0; y < d[3]; y++)
                for (int x = 0; x < d[4]; x++)
                    for (int k = 0; k < d[1]; k++) {
                        const size_t ci = xoff(cd, n, z, y, x, k);
                        const size_t ai = xoff(ad, ad->dims[0] > 1 ? n : 0, ad->dims[2] > 1 ? z : 0,
                                               ad->dims[3] > 1 ? y : 0, ad->dims[4] > 1 ? x : 0, ad->dims[1] > 1 ? k : 0);
                        put(c, cd->dt, ci, al * get(a, ad->dt, ai) + be * get(c, cd->dt, ci));
                    }
    return CUDNN_STATUS_SUCCESS;
}

} // extern "C"
