/* Max-pool 3d with kernel = stride = k on channels-last activations; the
 * argmax per output element (position in its window; first maximum on ties,
 * a later NaN replaces, as in PyTorch) is kept as uint8 for backward.
 * Local: no MPI, allocates nothing (the caller holds the argmax). */
#pragma GCC optimize("O3")
#include "tsbuild.h"
#include "src/nn/layers.h"
#ifdef TS_HAVE_CUDA
#include "src/nn/cuda/cuda_nn.h"
#endif
#include "src/core/error.h"

#include <math.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int v16i __attribute__((vector_size(64)));

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
typedef int v8i __attribute__((vector_size(32)));
typedef uint8_t b16 __attribute__((vector_size(16)));
typedef uint8_t b8 __attribute__((vector_size(8)));

/* max over the k^3 window rows v[t] (t = 0..nt-1) of channels [c, c+L)
 * (max16: 16 lanes, max8: 8 for the 8-channel levels): a later value wins
 * if it is larger or NaN (PyTorch's rule) */
#define MAXN(name, V, VU, VI, L)                                                                                        \
    static inline void name(const float *const *v, int nt, int64_t c, float *m, uint8_t *ix)                            \
    {                                                                                                                    \
        V mv = *(const VU *)(v[0] + c);                                                                                  \
        VI iv = (VI){0};                                                                                                 \
        for (int t = 1; t < nt; t++) {                                                                                   \
            const V x = *(const VU *)(v[t] + c);                                                                         \
            const VI gt = (x > mv) | (x != x);                                                                           \
            mv = (V)(((VI)x & gt) | ((VI)mv & ~gt));                                                                     \
            iv = (iv & ~gt) | (gt & t);                                                                                  \
        }                                                                                                                \
        *(VU *)(m + c) = mv;                                                                                             \
        const BV b = __builtin_convertvector(iv, BV); /* narrowed in registers, one store */                            \
        memcpy(ix + c, &b, sizeof b);                                                                                    \
    }
#define BV b16
MAXN(max16, v16, v16u, v16i, 16)
#undef BV
#define BV b8
MAXN(max8, v8, v8u, v8i, 8)
#undef BV
#undef MAXN

static int pool_shapes(const ts_tensor *x, int k, const ts_tensor *y, const ts_tensor *idx, const char *xname)
{
    if (k < 1 || k * k * k > 216) return TS_ERR(TS_ERR_ARG, "maxpool3d: kernel %d (1..6)", k);
    if (!ts_tensor_f32(x) || !ts_tensor_f32(y) || idx->dtype != TS_UINT8 || !idx->data)
        return TS_ERR(TS_ERR_ARG, "maxpool3d: float32 %s and output, uint8 indices", xname);
    TS_TRY(ts_tensor_check_shape(x, xname, 5, (const int64_t[]){-1, -1, -1, -1, -1}));
    for (int i = 1; i <= 3; i++)
        if (x->shape[i] % k)
            return TS_ERR(TS_ERR_ARG, "maxpool3d: %s edge %lld not divisible by %d", xname, (long long)x->shape[i], k);
    const int64_t want[5] = {x->shape[0], x->shape[1] / k, x->shape[2] / k, x->shape[3] / k, x->shape[4]};
    TS_TRY(ts_tensor_check_shape(y, "maxpool3d output", 5, want));
    TS_TRY(ts_tensor_check_shape(idx, "maxpool3d indices", 5, want));
    return 0;
}

int ts_maxpool3d_forward(const ts_tensor *x, int k, ts_tensor *y, ts_tensor *idx)
{
#ifdef TS_HAVE_CUDA
    if (x->device) return ts_cuda_maxpool3d_forward(x, k, y, idx);
#endif
    TS_TRY(pool_shapes(x, k, y, idx, "maxpool3d input"));
    const int64_t H = x->shape[2], W = x->shape[3], C = x->shape[4];
    const int64_t OD = y->shape[1], OH = y->shape[2], OW = y->shape[3], rows = y->shape[0] * OD * OH;
    const float *px = x->data;
    float *py = y->data;
    uint8_t *pi = idx->data;
#pragma omp parallel for schedule(dynamic, 8)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = r / (OD * OH), od = r / OH % OD, oh = r % OH;
        for (int64_t ow = 0; ow < OW; ow++) {
            float *m = py + (r * OW + ow) * C;
            uint8_t *ix = pi + (r * OW + ow) * C;
            const float *v[216];
            int nt = 0;
            for (int kd = 0; kd < k; kd++)
                for (int kh = 0; kh < k; kh++)
                    for (int kw = 0; kw < k; kw++)
                        v[nt++] = px + ((((n * x->shape[1] + od * k + kd) * H + oh * k + kh) * W) + ow * k + kw) * C;
            int64_t c = 0;
            for (; c + 16 <= C; c += 16) max16(v, nt, c, m, ix);
            if (c + 8 <= C) {
                max8(v, nt, c, m, ix);
                c += 8;
            }
            for (; c < C; c++) {
                float mx = v[0][c];
                int at = 0;
                for (int t = 1; t < nt; t++)
                    if (v[t][c] > mx || isnan(v[t][c])) {
                        mx = v[t][c];
                        at = t;
                    }
                m[c] = mx;
                ix[c] = (uint8_t)at;
            }
        }
    }
    return 0;
}

int ts_maxpool3d_backward(const ts_tensor *dy, const ts_tensor *idx, int k, ts_tensor *dx)
{
#ifdef TS_HAVE_CUDA
    if (dy->device) return ts_cuda_maxpool3d_backward(dy, idx, k, dx);
#endif
    TS_TRY(pool_shapes(dx, k, dy, idx, "maxpool3d input gradient"));
    const int64_t H = dx->shape[2], W = dx->shape[3], C = dx->shape[4];
    const int64_t OD = dy->shape[1], OH = dy->shape[2], OW = dy->shape[3], rows = dy->shape[0] * OD * OH;
    const float *pg = dy->data;
    const uint8_t *pi = idx->data;
    float *pd = dx->data;
#pragma omp parallel for schedule(dynamic, 8)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = r / (OD * OH), od = r / OH % OD, oh = r % OH;
        for (int64_t ow = 0; ow < OW; ow++) {
            const float *g = pg + (r * OW + ow) * C;
            const uint8_t *ix = pi + (r * OW + ow) * C;
            float *d[216];
            int nt = 0;
            for (int kd = 0; kd < k; kd++)
                for (int kh = 0; kh < k; kh++)
                    for (int kw = 0; kw < k; kw++)
                        d[nt++] = pd + ((((n * dx->shape[1] + od * k + kd) * H + oh * k + kh) * W) + ow * k + kw) * C;
            /* the indices widened once per block of channels, in registers (bytes set one by one into a
             * vector went through memory: a stall on store forwarding at every tap) */
            int64_t c = 0;
            for (; c + 16 <= C; c += 16) {
                b16 b;
                memcpy(&b, ix + c, sizeof b);
                const v16i iv = __builtin_convertvector(b, v16i), gv = (v16i) * (const v16u *)(g + c);
                for (int t = 0; t < nt; t++) *(v16u *)(d[t] + c) = (v16)(gv & (iv == t));
            }
            if (c + 8 <= C) {
                b8 b;
                memcpy(&b, ix + c, sizeof b);
                const v8i iv = __builtin_convertvector(b, v8i), gv = (v8i) * (const v8u *)(g + c);
                for (int t = 0; t < nt; t++) *(v8u *)(d[t] + c) = (v8)(gv & (iv == t));
                c += 8;
            }
            for (; c < C; c++)
                for (int t = 0; t < nt; t++) d[t][c] = ix[c] == t ? g[c] : 0.0f;
        }
    }
    return 0;
}
