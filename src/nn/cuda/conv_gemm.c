/* Convolution products as cuBLAS GEMMs on device tensors: transposed
 * convolutions whose kernel equals their stride, and the weight gradient of
 * any convolution as im2col + GEMM (below).
 *
 * Transposed convolutions whose kernel equals their stride (the U-Net's
 * 2x2x2 stride-2 upsampling) as cuBLAS GEMMs on device tensors. Each input
 * voxel then owns a k^3 block of output voxels that no other input voxel
 * touches, so with M the input voxels, J = k^3 Cout and the weights packed
 * to wp [Cin][taps][Cout] (ts_cuk_wpack):
 *   forward   z [M][J] = x [M][Cin] wp [Cin][J], y = z scattered (+ bias);
 *   backward  dz [M][J] = dy gathered;  dwp [Cin][J] = x^T dz (added back
 *             into w's layout);  dx [M][Cin] = dz wp^T.
 * cuDNN's backward-data for these shapes ran at about 1.3 TFLOP/s on an
 * H200 (docs/gpu.md); these are plain GEMMs of k = Cin, J and M.
 * Precision as conv_cudnn.c: fp32 (TF32 when ts_nn_tf32), or bf16/fp16
 * operands with fp32 accumulation and fp32 results; the weight gradient is
 * rounded to the half type before it is added, as cuDNN's path does.
 * Written on 2026-12-05 without a GPU: opt-in (TESSERA_CUDA_CONVT=gemm or
 * ts_cuda_set_convt_gemm; TESSERA_CUDA_WGRAD=gemm or ts_cuda_set_wgrad_gemm)
 * until tests/nn/test_layers_cuda and jobs/gpu/check.sh have run them on
 * one. Every cuBLAS and CUDA status is checked. */
#include "tsbuild.h"
#include "src/nn/cuda/cuda_nn.h"
#include "src/nn/layers.h"
#include "src/nn/cuda/cublas_lib.h"
#include "src/core/error.h"

#include <cuda_runtime.h>
#include <limits.h>

static int gemm_on = -1; /* -1: not chosen yet (TESSERA_CUDA_CONVT on first use) */

int ts_cuda_set_convt_gemm(int on)
{
    gemm_on = on != 0;
    return 0;
}

static int on(void) { return ts_cuda_switch(&gemm_on, "TESSERA_CUDA_CONVT", "gemm"); }

/* the sizes of one call: x [N, D, H, W, Cin], w [Cin, Cout, k, k, k] */
typedef struct tg {
    int n, d, h, w, cin, cout, k;
    size_t m, j; /* input voxels, taps * Cout */
} tg;

static tg sizes(const ts_tensor *x, const ts_tensor *w)
{
    tg g = {(int)x->shape[0], (int)x->shape[1], (int)x->shape[2], (int)x->shape[3], (int)x->shape[4],
            (int)w->shape[1], (int)w->shape[2], 0, 0};
    g.m = (size_t)g.n * g.d * g.h * g.w;
    g.j = (size_t)g.k * g.k * g.k * g.cout;
    return g;
}

int ts_cuda_convt_gemm_fits(const ts_tensor *x, const ts_tensor *w, int stride)
{
    if (!on() || x->ndim != 5 || w->ndim != 5 || w->shape[2] != stride) return 0;
    const tg g = sizes(x, w);
    return g.m > 0 && g.j > 0 && g.m <= INT_MAX && g.j <= INT_MAX && g.cin > 0;
}

/* C (fp32, column-major m x n, ldc) = op(A) op(B) (+ C when beta is 1), A and
 * B of the precision's operand type */
static int gemm(void *blas, int p, int ta, int tb, size_t m, size_t n, size_t k, const void *a, size_t lda,
                const void *b, size_t ldb, float beta, float *c, size_t ldc)
{
    const cudaDataType_t ab = p == 2 ? CUDA_R_16BF : p == 3 ? CUDA_R_16F : CUDA_R_32F;
    const cublasComputeType_t ct = p == 1 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const float one = 1;
    const ts_cublas_lib *l;
    TS_TRY(ts_cublas_lib_open(&l)); /* opened already: the handle blas came from it */
    const cublasStatus_t s = l->gemm_ex((cublasHandle_t)blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          (int)m, (int)n, (int)k, &one, a, ab, (int)lda, b, ab, (int)ldb, &beta, c,
                                          CUDA_R_32F, (int)ldc, ct, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return TS_ERR(TS_ERR_CUDA, "convolution GEMM (%zu x %zu x %zu, precision code %d): %s", m, n, k, p,
                      l->status_string(s));
    return 0;
}

/* src (fp32, n values) as the precision's operand: itself or a half copy in slot */
static int operand(int p, const float *src, size_t n, int slot, void *stream, const void **out)
{
    if (p < 2) {
        *out = src;
        return 0;
    }
    void *h = NULL;
    TS_TRY(ts_cuda_scratch(slot, n * 2, &h));
    TS_TRY(ts_cuk_to_half(src, h, n, p == 3, stream));
    *out = h;
    return 0;
}

/* the packed weights wp [Cin][taps][Cout] as the precision's operand */
static int packed(const tg *g, int p, const float *w, void *stream, const void **out)
{
    float *wp = NULL;
    const size_t n = (size_t)g->cin * g->j;
    TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_W, n * sizeof(float), (void **)&wp));
    TS_TRY(ts_cuk_wpack(w, wp, g->cin, g->cout, g->k * g->k * g->k, 0, stream));
    return operand(p, wp, n, TS_CUDA_SLOT_D, stream, out);
}

int ts_cuda_convt_gemm_forward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, ts_tensor *y)
{
    void *blas = NULL, *stream = NULL, *z = NULL;
    const void *xo = NULL, *wo = NULL;
    const tg g = sizes(x, w);
    const int p = ts_cuda_prec_code();
    TS_TRY(ts_cuda_nn_handles(NULL, &blas, &stream));
    TS_TRY(operand(p, x->data, g.m * g.cin, TS_CUDA_SLOT_A, stream, &xo));
    TS_TRY(packed(&g, p, w->data, stream, &wo));
    TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_C, g.m * g.j * sizeof(float), &z));
    /* row-major z [M][J] = x [M][Cin] wp [Cin][J]: column-major z^T = wp^T x^T */
    TS_TRY(gemm(blas, p, 0, 0, g.j, g.m, (size_t)g.cin, wo, g.j, xo, (size_t)g.cin, 0.0f, z, g.j));
    return ts_cuk_convt_scatter(z, b ? b->data : NULL, y->data, g.n, g.d, g.h, g.w, g.cout, g.k, stream);
}

int ts_cuda_convt_gemm_backward(const ts_tensor *x, const ts_tensor *w, const ts_tensor *dy, ts_tensor *dx,
                                ts_tensor *dw)
{
    void *blas = NULL, *stream = NULL, *dz = NULL;
    const tg g = sizes(x, w);
    const int p = ts_cuda_prec_code(), taps = g.k * g.k * g.k;
    if (!dx && !dw) return 0;
    TS_TRY(ts_cuda_nn_handles(NULL, &blas, &stream));
    TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_B, g.m * g.j * (p < 2 ? sizeof(float) : 2), &dz));
    TS_TRY(ts_cuk_convt_gather(dy->data, dz, p < 2 ? 0 : p - 1, g.n, g.d, g.h, g.w, g.cout, g.k, stream));
    if (dw) { /* first: dx may be x itself */
        const void *xo = NULL;
        float *dwp = NULL;
        TS_TRY(operand(p, x->data, g.m * g.cin, TS_CUDA_SLOT_A, stream, &xo));
        TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_DW, (size_t)g.cin * g.j * sizeof(float), (void **)&dwp));
        /* row-major dwp [Cin][J] = x^T dz: column-major dwp^T = dz^T x */
        TS_TRY(gemm(blas, p, 0, 1, g.j, (size_t)g.cin, g.m, dz, g.j, xo, (size_t)g.cin, 0.0f, dwp, g.j));
        if (p >= 2) TS_TRY(ts_cuk_round_half(dwp, dwp, (size_t)g.cin * g.j, p == 3, stream));
        TS_TRY(ts_cuk_wunpack_add(dwp, dw->data, g.cin, g.cout, taps, stream));
    }
    if (dx) {
        const void *wo = NULL;
        TS_TRY(packed(&g, p, w->data, stream, &wo));
        /* row-major dx [M][Cin] = dz [M][J] wp^T: column-major dx^T = wp dz^T, wp's
         * column-major view being wp^T (J x Cin) */
        TS_TRY(gemm(blas, p, 1, 0, (size_t)g.cin, g.m, g.j, wo, g.j, dz, g.j, 0.0f, dx->data, (size_t)g.cin));
    }
    return 0;
}

/* ---- the weight gradient of a convolution as im2col + GEMM ----
 * With Mo the output voxels, K = taps C and col [Mo][taps][C] the input
 * values under each tap (ts_cuk_im2col), dwp [OC][taps][C] = dy^T col, in
 * chunks of output voxels (col's chunk at most col_bytes), accumulated in
 * fp32 by the GEMM (beta 1 after the first chunk), then rounded to the half
 * type (bf16/fp16) and added into w's layout (ts_cuk_wunpack_add). */
static size_t col_bytes = (size_t)256 << 20;
static int wgrad_on = -1;

int ts_cuda_set_wgrad_gemm(int v, size_t chunk_bytes)
{
    wgrad_on = v != 0;
    col_bytes = chunk_bytes ? chunk_bytes : (size_t)256 << 20;
    return 0;
}

int ts_cuda_wgrad_gemm_on(void) { return ts_cuda_switch(&wgrad_on, "TESSERA_CUDA_WGRAD", "gemm"); }

int ts_cuda_wgrad_gemm(int N, int C, const int in3[3], int K, const int out3[3], int k, int s, int p, const float *in,
                       const float *out, float *w)
{
    void *blas = NULL, *stream = NULL, *col = NULL;
    const void *dyo = NULL;
    float *dwp = NULL;
    const int pr = ts_cuda_prec_code(), taps = k * k * k;
    const size_t elt = pr < 2 ? sizeof(float) : 2, kk = (size_t)taps * C;
    const size_t mo = (size_t)N * out3[0] * out3[1] * out3[2];
    if (kk == 0 || K <= 0 || mo == 0) return 0; /* nothing to add */
    if (kk > INT_MAX) return TS_ERR(TS_ERR_ARG, "weight gradient GEMM: %d taps x %d channels (over cuBLAS's int)", taps, C);
    size_t mc = col_bytes / (kk * elt);
    if (mc < 1) mc = 1;
    if (mc > mo) mc = mo;
    if (mc > INT_MAX) mc = INT_MAX;
    TS_TRY(ts_cuda_nn_handles(NULL, &blas, &stream));
    TS_TRY(operand(pr, out, mo * K, TS_CUDA_SLOT_B, stream, &dyo));
    TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_A, mc * kk * elt, &col));
    TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_DW, (size_t)K * kk * sizeof(float), (void **)&dwp));
    for (size_t m0 = 0; m0 < mo; m0 += mc) {
        const size_t n = mo - m0 < mc ? mo - m0 : mc;
        TS_TRY(ts_cuk_im2col(in, col, pr < 2 ? 0 : pr - 1, in3[0], in3[1], in3[2], C, k, s, p, out3[0], out3[1],
                             out3[2], m0, n, stream));
        /* row-major dwp [K][kk] += dy[m0..]^T col: column-major dwp^T = col^T dy, dy's
         * column-major view being dy^T (OC x n) */
        TS_TRY(gemm(blas, pr, 0, 1, kk, (size_t)K, n, col, kk, (const char *)dyo + m0 * K * elt, (size_t)K,
                    m0 ? 1.0f : 0.0f, dwp, kk));
    }
    if (pr >= 2) TS_TRY(ts_cuk_round_half(dwp, dwp, (size_t)K * kk, pr == 3, stream));
    return ts_cuk_wunpack_add(dwp, w, K, C, taps, stream);
}
