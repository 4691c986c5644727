/* The layers other than the convolutions on device tensors: ReLU, max-pool,
 * concatenation, batch/group/instance norm (fused ReLU or leaky ReLU) and the
 * two losses, with the host functions' arguments, conventions and group
 * synchronisation (the same sync calls, in the same order, with the same
 * payloads as the CPU's, so that the ranks of a group agree).
 * The passes over the voxels run as kernels (nn_kernels.cu); the
 * per-channel arithmetic (a few hundred values) runs on the host between
 * them, on copies made through the compute stream. Statistics are
 * two-pass (sum, then centred sums) in double, not the CPU's exact
 * fixed-point sums: results match the CPU's to rounding (tests/nn/
 * test_layers_cuda.c), not bit for bit.
 * Owns no convolution (conv_cudnn.c) and no device selection. */
#include "tsbuild.h"
#include "src/nn/cuda/cuda_nn.h"
#include "src/nn/layers.h"
#include "src/core/error.h"

#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int d2h(void *h, const void *d, size_t bytes)
{
    void *s = NULL;
    TS_TRY(ts_cuda_nn_handles(NULL, NULL, &s));
    cudaError_t e = cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)s);
    if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)s);
    if (e != cudaSuccess) return TS_ERR(TS_ERR_CUDA, "copying %zu bytes from the GPU: %s", bytes, cudaGetErrorString(e));
    return 0;
}

static int h2d(void *d, const void *h, size_t bytes)
{
    void *s = NULL;
    TS_TRY(ts_cuda_nn_handles(NULL, NULL, &s));
    /* from pageable memory the call returns once h has been read: h may be freed after */
    cudaError_t e = cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, (cudaStream_t)s);
    if (e != cudaSuccess) return TS_ERR(TS_ERR_CUDA, "copying %zu bytes to the GPU: %s", bytes, cudaGetErrorString(e));
    return 0;
}

static int dev_f32(const ts_tensor *t, const char *who)
{
    if (t && (!t->device || t->dtype != TS_FLOAT32))
        return TS_ERR(TS_ERR_ARG, "%s: every tensor of a GPU layer call must be float32 in device memory", who);
    return 0;
}

static int stream(void **s) { return ts_cuda_nn_handles(NULL, NULL, s); }

/* ------------------------------------------------------------------ ReLU */
int ts_cuda_relu_forward(const ts_tensor *x, float slope, ts_tensor *y)
{
    void *s;
    TS_TRY(dev_f32(x, "relu"));
    TS_TRY(dev_f32(y, "relu"));
    if (ts_tensor_numel(x) != ts_tensor_numel(y)) return TS_ERR(TS_ERR_ARG, "relu: input and output sizes differ");
    TS_TRY(stream(&s));
    return ts_cuk_relu(x->data, y->data, (size_t)ts_tensor_numel(x), slope, s);
}

int ts_cuda_relu_backward(const ts_tensor *y, float slope, const ts_tensor *dy, ts_tensor *dx)
{
    void *s;
    TS_TRY(dev_f32(y, "relu backward"));
    TS_TRY(dev_f32(dy, "relu backward"));
    TS_TRY(dev_f32(dx, "relu backward"));
    if (ts_tensor_numel(y) != ts_tensor_numel(dy) || ts_tensor_numel(dy) != ts_tensor_numel(dx))
        return TS_ERR(TS_ERR_ARG, "relu backward: output, gradients must be of the same size");
    TS_TRY(stream(&s));
    return ts_cuk_relu_backward(y->data, dy->data, dx->data, (size_t)ts_tensor_numel(y), slope, s);
}

int ts_cuda_add_inplace(ts_tensor *y, const ts_tensor *x)
{
    void *s;
    TS_TRY(dev_f32(x, "add"));
    TS_TRY(dev_f32(y, "add"));
    if (ts_tensor_numel(x) != ts_tensor_numel(y)) return TS_ERR(TS_ERR_ARG, "add: the two tensors differ in size");
    TS_TRY(stream(&s));
    return ts_cuk_add(x->data, y->data, (size_t)ts_tensor_numel(x), s);
}

/* -------------------------------------------------------------- max-pool */
static int pool_shapes(const ts_tensor *x, int k, const ts_tensor *y, const ts_tensor *idx)
{
    TS_TRY(dev_f32(x, "maxpool3d"));
    TS_TRY(dev_f32(y, "maxpool3d"));
    if (!idx->device || idx->dtype != TS_UINT8) return TS_ERR(TS_ERR_ARG, "maxpool3d: indices must be uint8 on the GPU");
    if (k < 1 || k > 6 || x->ndim != 5) return TS_ERR(TS_ERR_ARG, "maxpool3d: kernel %d (1..6) on a 5-d input", k);
    for (int i = 1; i <= 3; i++)
        if (x->shape[i] % k) return TS_ERR(TS_ERR_ARG, "maxpool3d: edge %lld not divisible by %d", (long long)x->shape[i], k);
    const int64_t ys[5] = {x->shape[0], x->shape[1] / k, x->shape[2] / k, x->shape[3] / k, x->shape[4]};
    TS_TRY(ts_tensor_check_shape(y, "maxpool3d output", 5, ys));
    return ts_tensor_check_shape(idx, "maxpool3d indices", 5, ys);
}

int ts_cuda_maxpool3d_forward(const ts_tensor *x, int k, ts_tensor *y, ts_tensor *idx)
{
    void *s;
    TS_TRY(pool_shapes(x, k, y, idx));
    TS_TRY(stream(&s));
    return ts_cuk_maxpool(x->data, y->data, idx->data, (int)x->shape[0], (int)x->shape[1], (int)x->shape[2],
                          (int)x->shape[3], (int)x->shape[4], k, s);
}

int ts_cuda_maxpool3d_backward(const ts_tensor *dy, const ts_tensor *idx, int k, ts_tensor *dx)
{
    void *s;
    TS_TRY(pool_shapes(dx, k, dy, idx));
    TS_TRY(stream(&s));
    return ts_cuk_maxpool_backward(dy->data, idx->data, dx->data, (int)dx->shape[0], (int)dx->shape[1],
                                   (int)dx->shape[2], (int)dx->shape[3], (int)dx->shape[4], k, s);
}

/* The tiled kernels of the memory-bound passes (norm sums, affine maps and
 * input gradients, concatenation; nn_kernels.cu): 1 on
 * (TESSERA_CUDA_PASSES=tiled on first use), 0 the plain kernels and
 * cudaMemcpy2DAsync (the default until the tiled ones have run on a GPU) */
static int passes_tiled = -1;
static int tiled(void) { return ts_cuda_switch(&passes_tiled, "TESSERA_CUDA_PASSES", "tiled"); }
int ts_cuda_set_passes(int on)
{
    passes_tiled = on != 0;
    return 0;
}

/* The norms' per-channel arithmetic on the device (norm_kernels.cu), where
 * no other rank shares the statistics: 1 on (TESSERA_CUDA_NORMSTATS=device
 * on first use), 0 the host round trips (the default until the device
 * chain has run on a GPU) */
static int normstats_dev = -1;
int ts_cuda_set_normstats(int device)
{
    normstats_dev = device != 0;
    return 0;
}
static int dev_stats(const ts_norm_opts *o)
{
    return !o->sync && ts_cuda_switch(&normstats_dev, "TESSERA_CUDA_NORMSTATS", "device");
}
/* the device chain's scratch (slot SMALL) and the stream */
static int chain_work(int N, int C, void **work, void **s)
{
    TS_TRY(stream(s));
    return ts_cuda_scratch(TS_CUDA_SLOT_SMALL, ts_cuk_norm_work_bytes(N, C), work);
}
static float *data_or_null(const ts_tensor *t) { return t ? t->data : NULL; }

/* --------------------------------------------------------- concatenation */
/* rows of width wa/wb (floats) of src (pitch ws) to dst (pitch wd) at offset off */
static int strided(float *dst, size_t wd, const float *src, size_t wsrc, size_t w, size_t rows)
{
    void *s;
    if (!w || !rows) return 0;
    TS_TRY(stream(&s));
    cudaError_t e = cudaMemcpy2DAsync(dst, wd * 4, src, wsrc * 4, w * 4, rows, cudaMemcpyDeviceToDevice, (cudaStream_t)s);
    if (e != cudaSuccess) return TS_ERR(TS_ERR_CUDA, "concatenation on the GPU: %s", cudaGetErrorString(e));
    return 0;
}

int ts_cuda_concat_forward(const ts_tensor *a, const ts_tensor *b, ts_tensor *y)
{
    TS_TRY(dev_f32(a, "concat"));
    TS_TRY(dev_f32(b, "concat"));
    TS_TRY(dev_f32(y, "concat"));
    const int nd = a->ndim;
    int ok = nd >= 1 && b->ndim == nd && y->ndim == nd;
    for (int i = 0; ok && i < nd - 1; i++) ok = a->shape[i] == b->shape[i] && a->shape[i] == y->shape[i];
    if (!ok || y->shape[nd - 1] != a->shape[nd - 1] + b->shape[nd - 1])
        return TS_ERR(TS_ERR_ARG, "concat: shapes do not match [a, b] along the channels");
    const size_t ca = (size_t)a->shape[nd - 1], cb = (size_t)b->shape[nd - 1], rows = (size_t)(ts_tensor_numel(y) / (int64_t)(ca + cb ? ca + cb : 1));
    if (tiled() && ca + cb <= INT_MAX) {
        void *s;
        TS_TRY(stream(&s));
        return ts_cuk_concat(0, y->data, a->data, b->data, (int)ca, (int)cb, rows, s);
    }
    TS_TRY(strided(y->data, ca + cb, a->data, ca, ca, rows));
    return strided((float *)y->data + ca, ca + cb, b->data, cb, cb, rows);
}

int ts_cuda_concat_backward(const ts_tensor *dy, ts_tensor *da, ts_tensor *db)
{
    TS_TRY(dev_f32(dy, "concat backward"));
    TS_TRY(dev_f32(da, "concat backward"));
    TS_TRY(dev_f32(db, "concat backward"));
    if (!da && !db) return 0;
    const int nd = dy->ndim;
    const size_t cy = (size_t)dy->shape[nd - 1], rows = (size_t)(ts_tensor_numel(dy) / (int64_t)(cy ? cy : 1));
    const size_t ca = da ? (size_t)da->shape[da->ndim - 1] : cy - (size_t)db->shape[db->ndim - 1];
    if ((da && (size_t)ts_tensor_numel(da) != rows * ca) ||
        (db && (size_t)ts_tensor_numel(db) != rows * (cy - ca)) || ca > cy)
        return TS_ERR(TS_ERR_ARG, "concat backward: gradient shapes do not match");
    if (tiled() && cy <= INT_MAX) {
        void *s;
        TS_TRY(stream(&s));
        return ts_cuk_concat(1, dy->data, da ? da->data : NULL, db ? db->data : NULL, (int)ca, (int)(cy - ca), rows, s);
    }
    if (da) TS_TRY(strided(da->data, ca, dy->data, cy, ca, rows));
    if (db) TS_TRY(strided(db->data, cy - ca, (const float *)dy->data + ca, cy, cy - ca, rows));
    return 0;
}

/* ------------------------------------------------------------------ norms
 * Shared by batch norm (N = 1, the batch folded into S, G = C) and group
 * norm (instance norm: G = C): x [N][S][C], statistics per (n, g). */
typedef struct nd {
    int N, C, G, cg;
    size_t S;
} nd;

/* per-(n, c) sums on the device, downloaded: mode 0 moments around ctr
 * (device [N][C] or NULL), mode 1 gradient sums (dy through the fused
 * activation: slope dy where mask <= 0) */
static int sums(int mode, const nd *d, const float *x, const float *dy, const float *mask, float slope,
                const float *ctr, double *s1, double *s2)
{
    void *s, *buf;
    const size_t nc = (size_t)d->N * d->C;
    TS_TRY(stream(&s));
    TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_SMALL, 2 * nc * sizeof(double), &buf));
    TS_TRY((tiled() ? ts_cuk_chan_sums_tiled : ts_cuk_chan_sums)(mode, x, dy, mask, slope, ctr, d->N, d->S, d->C, buf,
                                                                 (double *)buf + nc, s));
    double *h = malloc(2 * nc * sizeof(double));
    if (!h) return TS_ERR(TS_ERR_NOMEM, "norm sums");
    const int err = d2h(h, buf, 2 * nc * sizeof(double));
    if (!err) {
        memcpy(s1, h, nc * sizeof(double));
        if (s2) memcpy(s2, h + nc, nc * sizeof(double));
    }
    free(h);
    return err;
}

/* per-(n, c) float arrays to the device (slot SMALL2, k arrays of N*C) */
static int up_arrays(const float *h, size_t n, void **d)
{
    TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_SMALL2, n * sizeof(float), d));
    return h2d(*d, h, n * sizeof(float));
}

/* mean and variance per (n, g) over the group's ranks: two passes */
static int stats(const nd *d, const float *x, const ts_norm_opts *o, double *mean, double *var, double *count)
{
    int err = 0;
    const size_t nc = (size_t)d->N * d->C, ng = (size_t)d->N * d->G;
    double *s1 = calloc(2 * nc, sizeof(double)), *t = calloc(2 * ng + 1, sizeof(double));
    float *ctr = malloc(nc * sizeof(float));
    void *dctr = NULL;
    if (!s1 || !t || !ctr) TS_FAIL(TS_ERR_NOMEM, "norm statistics");
    TS_CHECK(sums(0, d, x, NULL, NULL, 0.0f, NULL, s1, NULL));
    for (size_t i = 0; i < nc; i++) t[i / d->C * d->G + i % d->C / d->cg] += s1[i];
    t[ng] = (double)d->S;
    if (o->sync) TS_CHECK(o->sync(o->sync_ctx, t, (int)ng + 1, TS_SYNC_SUM));
    *count = t[ng] * d->cg;
    for (size_t j = 0; j < ng; j++) mean[j] = t[j] / *count;
    for (size_t i = 0; i < nc; i++) ctr[i] = (float)mean[i / d->C * d->G + i % d->C / d->cg];
    TS_CHECK(up_arrays(ctr, nc, &dctr));
    TS_CHECK(sums(0, d, x, NULL, NULL, 0.0f, dctr, s1, s1 + nc));
    memset(t, 0, (2 * ng + 1) * sizeof(double));
    for (size_t i = 0; i < nc; i++) {
        const size_t j = i / d->C * d->G + i % d->C / d->cg;
        t[j] += s1[i];
        t[ng + j] += s1[nc + i];
    }
    if (o->sync) TS_CHECK(o->sync(o->sync_ctx, t, (int)(2 * ng), TS_SYNC_SUM));
    for (size_t j = 0; j < ng; j++) {
        const double m1 = t[j] / *count; /* the centre is the float-rounded mean: correct by the first moment */
        mean[j] = ctr[j / d->G * d->C + j % d->G * d->cg] + m1;
        var[j] = fmax(t[ng + j] / *count - m1 * m1, 0.0);
    }
cleanup:
    free(s1);
    free(t);
    free(ctr);
    return err;
}

static int vec(const ts_tensor *t, int64_t n, const char *what)
{
    if (!t) return 0;
    TS_TRY(dev_f32(t, what));
    if (ts_tensor_numel(t) != n) return TS_ERR(TS_ERR_ARG, "%s: %lld values expected", what, (long long)n);
    return 0;
}

static int get(const ts_tensor *t, float *h) { return d2h(h, t->data, ts_tensor_bytes(t)); }
static int put(ts_tensor *t, const float *h) { return h2d(t->data, h, ts_tensor_bytes(t)); }

/* scale/shift per (n, c) uploaded, then y = act(x scale + shift) (relu: the fused ReLU, leaky where slope > 0) */
static int affine(const nd *d, const float *x, const float *scsh, int relu, float slope, float *y)
{
    void *s, *dev;
    const size_t nc = (size_t)d->N * d->C;
    TS_TRY(stream(&s));
    TS_TRY(up_arrays(scsh, 2 * nc, &dev));
    return (tiled() ? ts_cuk_chan_affine_tiled : ts_cuk_chan_affine)(x, dev, (const float *)dev + nc, d->N, d->S, d->C,
                                                                     relu, slope, y, s);
}

/* dx from a, b, k and the centre per (n, c) (host arrays, uploaded together) */
static int norm_dx(const nd *d, const float *x, const float *dy, const float *mask, float slope, const float *ctr_abk,
                   float *dx)
{
    void *s, *dev;
    const size_t nc = (size_t)d->N * d->C;
    TS_TRY(stream(&s));
    TS_TRY(up_arrays(ctr_abk, 4 * nc, &dev));
    const float *p = dev;
    return (tiled() ? ts_cuk_norm_dx_tiled : ts_cuk_norm_dx)(x, dy, mask, slope, p, p + nc, p + 2 * nc, p + 3 * nc, d->N,
                                                             d->S, d->C, dx, s);
}

/* dgamma += dg, dbeta += db (host values) */
static int add_vec(ts_tensor *t, const double *v, const float *mul, int C, int N)
{
    if (!t) return 0;
    float *h = malloc((size_t)C * sizeof(float));
    if (!h) return TS_ERR_NOMEM;
    int err = get(t, h);
    for (int n = 0; !err && n < N; n++)
        for (int c = 0; c < C; c++) h[c] += (float)(v[(size_t)n * C + c] * (mul ? mul[(size_t)n * C + c] : 1.0f));
    if (!err) err = put(t, h);
    free(h);
    return err;
}

/* the fused activation's negative slope: 0 for a ReLU (or none), > 0 a leaky ReLU (ts_norm_opts.slope) */
static float slope_of(const ts_norm_opts *o) { return o->relu ? o->slope : 0.0f; }

int ts_cuda_batchnorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, ts_tensor *running_mean,
                              ts_tensor *running_var, int train, const ts_norm_opts *o, ts_tensor *y,
                              ts_tensor *save_mean, ts_tensor *save_invstd)
{
    int err = 0;
    TS_TRY(dev_f32(x, "batchnorm"));
    TS_TRY(dev_f32(y, "batchnorm"));
    if (x->ndim < 2 || !ts_tensor_same_shape(x, y)) return TS_ERR(TS_ERR_ARG, "batchnorm: output must have the input's shape");
    const int C = (int)x->shape[x->ndim - 1];
    const nd d = {1, C, C, 1, (size_t)(ts_tensor_numel(x) / C)};
    TS_TRY(vec(gamma, C, "batchnorm weight"));
    TS_TRY(vec(beta, C, "batchnorm bias"));
    TS_TRY(vec(running_mean, C, "batchnorm running_mean"));
    TS_TRY(vec(running_var, C, "batchnorm running_var"));
    TS_TRY(vec(save_mean, C, "batchnorm saved mean"));
    TS_TRY(vec(save_invstd, C, "batchnorm saved invstd"));
    if (!gamma || !beta || !save_mean || !save_invstd)
        return TS_ERR(TS_ERR_ARG, "batchnorm: weight, bias and saved statistics are required");
    if (!train && (!running_mean || !running_var)) return TS_ERR(TS_ERR_ARG, "batchnorm: eval mode needs the running statistics");
    if (train && !o->sync && d.S < 2) return TS_ERR(TS_ERR_ARG, "batchnorm: training needs more than one value per channel");
    if (dev_stats(o)) {
        void *work, *st;
        const int run = running_mean && running_var; /* train updates them only when both are given */
        TS_TRY(chain_work(1, C, &work, &st));
        return ts_cuk_norm_forward(x->data, 1, d.S, C, C, gamma->data, beta->data, o->eps, o->momentum, train, o->relu,
                                   slope_of(o), tiled(), run ? running_mean->data : NULL, run ? running_var->data : NULL,
                                   save_mean->data, save_invstd->data, y->data, work, st);
    }
    double *s = calloc(3 * (size_t)C, sizeof(double));
    float *h = malloc(8 * (size_t)C * sizeof(float));
    if (!s || !h) TS_FAIL(TS_ERR_NOMEM, "batchnorm statistics");
    float *g = h, *b = h + C, *rm = h + 2 * C, *rv = h + 3 * C, *mean = h + 4 * C, *inv = h + 5 * C, *sc = h + 6 * C;
    TS_CHECK(get(gamma, g));
    TS_CHECK(get(beta, b));
    if (train) {
        TS_CHECK(stats(&d, x->data, o, s, s + C, s + 2 * C));
        const double Mt = s[2 * C];
        if (o->sync && Mt < 2)
            TS_FAIL(TS_ERR_ARG, "batchnorm: training needs more than one value per channel (the group has %.0f)", Mt);
        if (running_mean && running_var) {
            TS_CHECK(get(running_mean, rm));
            TS_CHECK(get(running_var, rv));
        }
        for (int c = 0; c < C; c++) {
            mean[c] = (float)s[c];
            inv[c] = (float)(1.0 / sqrt(s[C + c] + o->eps));
            if (!running_mean || !running_var) continue;
            rm[c] = (float)((1.0 - o->momentum) * rm[c] + o->momentum * s[c]);
            rv[c] = (float)((1.0 - o->momentum) * rv[c] + o->momentum * s[C + c] * Mt / (Mt - 1));
        }
        if (running_mean && running_var) {
            TS_CHECK(put(running_mean, rm));
            TS_CHECK(put(running_var, rv));
        }
    } else {
        TS_CHECK(get(running_mean, rm));
        TS_CHECK(get(running_var, rv));
        for (int c = 0; c < C; c++) {
            mean[c] = rm[c];
            inv[c] = (float)(1.0 / sqrt((double)rv[c] + o->eps));
        }
    }
    for (int c = 0; c < C; c++) {
        sc[c] = g[c] * inv[c];
        sc[C + c] = b[c] - mean[c] * sc[c];
    }
    TS_CHECK(put(save_mean, mean));
    TS_CHECK(put(save_invstd, inv));
    TS_CHECK(affine(&d, x->data, sc, o->relu, slope_of(o), y->data));
cleanup:
    free(s);
    free(h);
    return err;
}

int ts_cuda_batchnorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *save_mean,
                               const ts_tensor *save_invstd, int train, const ts_norm_opts *o, const ts_tensor *dy,
                               ts_tensor *dx, ts_tensor *dgamma, ts_tensor *dbeta)
{
    int err = 0;
    TS_TRY(dev_f32(x, "batchnorm backward"));
    TS_TRY(dev_f32(dy, "batchnorm backward"));
    TS_TRY(dev_f32(dx, "batchnorm backward"));
    TS_TRY(dev_f32(y, "batchnorm backward"));
    if (x->ndim < 2 || !ts_tensor_same_shape(x, dy) || (dx && !ts_tensor_same_shape(x, dx)))
        return TS_ERR(TS_ERR_ARG, "batchnorm backward: gradients must have the input's shape");
    if (o->relu && (!y || !ts_tensor_same_shape(x, y)))
        return TS_ERR(TS_ERR_ARG, "batchnorm backward: the fused ReLU needs the forward output");
    const int C = (int)x->shape[x->ndim - 1];
    const nd d = {1, C, C, 1, (size_t)(ts_tensor_numel(x) / C)};
    TS_TRY(vec(gamma, C, "batchnorm weight"));
    TS_TRY(vec(save_mean, C, "batchnorm saved mean"));
    TS_TRY(vec(save_invstd, C, "batchnorm saved invstd"));
    TS_TRY(vec(dgamma, C, "batchnorm weight gradient"));
    TS_TRY(vec(dbeta, C, "batchnorm bias gradient"));
    if (!gamma || !save_mean || !save_invstd)
        return TS_ERR(TS_ERR_ARG, "batchnorm backward: weight and saved statistics are required");
    const float *mask = o->relu ? y->data : NULL;
    if (dev_stats(o)) {
        void *work, *st;
        TS_TRY(chain_work(1, C, &work, &st));
        return ts_cuk_norm_backward(x->data, dy->data, mask, slope_of(o), 1, d.S, C, C, gamma->data, save_mean->data,
                                    save_invstd->data, train, tiled(), data_or_null(dgamma), data_or_null(dbeta),
                                    data_or_null(dx), work, st);
    }
    double *s = calloc(2 * (size_t)C + 1, sizeof(double));
    float *h = malloc(7 * (size_t)C * sizeof(float));
    if (!s || !h) TS_FAIL(TS_ERR_NOMEM, "batchnorm backward");
    float *g = h, *mean = h + C, *inv = h + 2 * C, *cabk = h + 3 * C;
    TS_CHECK(get(gamma, g));
    TS_CHECK(get(save_mean, mean));
    TS_CHECK(get(save_invstd, inv));
    TS_CHECK(sums(1, &d, x->data, dy->data, mask, slope_of(o), save_mean->data, s, s + C));
    TS_CHECK(add_vec(dgamma, s + C, inv, C, 1));
    TS_CHECK(add_vec(dbeta, s, NULL, C, 1));
    double Mt = (double)d.S;
    if (o->sync && train && dx) {
        s[2 * C] = (double)d.S;
        TS_CHECK(o->sync(o->sync_ctx, s, 2 * C + 1, TS_SYNC_SUM));
        Mt = s[2 * C];
    }
    if (dx) {
        for (int c = 0; c < C; c++) {
            const double scale = (double)g[c] * inv[c];
            cabk[c] = mean[c];
            cabk[C + c] = (float)scale;
            cabk[2 * C + c] = train ? (float)(-scale * inv[c] * inv[c] * s[C + c] / Mt) : 0.0f;
            cabk[3 * C + c] = train ? (float)(-scale * s[c] / Mt) : 0.0f;
        }
        TS_CHECK(norm_dx(&d, x->data, dy->data, mask, slope_of(o), cabk, dx->data));
    }
cleanup:
    free(s);
    free(h);
    return err;
}

static int gn_dims(const ts_tensor *x, const ts_tensor *y, int groups, nd *d)
{
    TS_TRY(dev_f32(x, "groupnorm"));
    TS_TRY(dev_f32(y, "groupnorm"));
    if (x->ndim < 3 || !ts_tensor_same_shape(x, y)) return TS_ERR(TS_ERR_ARG, "groupnorm: input must be [N, ..., C], output alike");
    d->N = (int)x->shape[0];
    d->C = (int)x->shape[x->ndim - 1];
    d->S = (size_t)(ts_tensor_numel(x) / ((int64_t)d->N * d->C));
    if (groups < 1 || d->C % groups) return TS_ERR(TS_ERR_ARG, "groupnorm: %d groups do not divide %d channels", groups, d->C);
    d->G = groups;
    d->cg = d->C / groups;
    return 0;
}

int ts_cuda_groupnorm_forward(const ts_tensor *x, const ts_tensor *gamma, const ts_tensor *beta, const ts_norm_opts *o,
                              ts_tensor *y, ts_tensor *save_mean, ts_tensor *save_invstd)
{
    int err = 0;
    nd d;
    TS_TRY(gn_dims(x, y, o->groups, &d));
    const size_t nc = (size_t)d.N * d.C, ng = (size_t)d.N * d.G;
    TS_TRY(vec(gamma, d.C, "groupnorm weight"));
    TS_TRY(vec(beta, d.C, "groupnorm bias"));
    TS_TRY(vec(save_mean, (int64_t)ng, "groupnorm saved mean"));
    TS_TRY(vec(save_invstd, (int64_t)ng, "groupnorm saved invstd"));
    if (!gamma || !beta || !save_mean || !save_invstd)
        return TS_ERR(TS_ERR_ARG, "groupnorm: weight, bias and saved statistics are required");
    if (dev_stats(o)) {
        void *work, *st;
        TS_TRY(chain_work(d.N, d.C, &work, &st));
        return ts_cuk_norm_forward(x->data, d.N, d.S, d.C, d.G, gamma->data, beta->data, o->eps, o->momentum, 1,
                                   o->relu, slope_of(o), tiled(), NULL, NULL, save_mean->data, save_invstd->data,
                                   y->data, work, st);
    }
    double *s = calloc(2 * ng, sizeof(double)), cnt = 0;
    float *h = malloc((2 * d.C + 2 * ng + 2 * nc) * sizeof(float));
    if (!s || !h) TS_FAIL(TS_ERR_NOMEM, "groupnorm statistics");
    float *g = h, *b = h + d.C, *mean = b + d.C, *inv = mean + ng, *sc = inv + ng;
    TS_CHECK(get(gamma, g));
    TS_CHECK(get(beta, b));
    TS_CHECK(stats(&d, x->data, o, s, s + ng, &cnt));
    for (size_t j = 0; j < ng; j++) {
        mean[j] = (float)s[j];
        inv[j] = (float)(1.0 / sqrt(s[ng + j] + o->eps));
    }
    for (size_t i = 0; i < nc; i++) {
        const size_t c = i % d.C, j = i / d.C * d.G + c / d.cg;
        sc[i] = g[c] * inv[j];
        sc[nc + i] = b[c] - mean[j] * g[c] * inv[j];
    }
    TS_CHECK(put(save_mean, mean));
    TS_CHECK(put(save_invstd, inv));
    TS_CHECK(affine(&d, x->data, sc, o->relu, slope_of(o), y->data));
cleanup:
    free(s);
    free(h);
    return err;
}

int ts_cuda_groupnorm_backward(const ts_tensor *x, const ts_tensor *y, const ts_tensor *gamma, const ts_tensor *save_mean,
                               const ts_tensor *save_invstd, const ts_norm_opts *o, const ts_tensor *dy, ts_tensor *dx,
                               ts_tensor *dgamma, ts_tensor *dbeta)
{
    int err = 0;
    nd d;
    TS_TRY(gn_dims(x, dy, o->groups, &d));
    TS_TRY(dev_f32(dx, "groupnorm backward"));
    TS_TRY(dev_f32(y, "groupnorm backward"));
    if (dx && !ts_tensor_same_shape(dx, x)) return TS_ERR(TS_ERR_ARG, "groupnorm: input gradient must be shaped like the input");
    if (o->relu && (!y || !ts_tensor_same_shape(y, x)))
        return TS_ERR(TS_ERR_ARG, "groupnorm backward: the fused ReLU needs the forward output");
    const size_t nc = (size_t)d.N * d.C, ng = (size_t)d.N * d.G;
    TS_TRY(vec(gamma, d.C, "groupnorm weight"));
    TS_TRY(vec(save_mean, (int64_t)ng, "groupnorm saved mean"));
    TS_TRY(vec(save_invstd, (int64_t)ng, "groupnorm saved invstd"));
    TS_TRY(vec(dgamma, d.C, "groupnorm weight gradient"));
    TS_TRY(vec(dbeta, d.C, "groupnorm bias gradient"));
    const float *mask = o->relu ? y->data : NULL;
    if (dev_stats(o)) {
        void *work, *st;
        TS_TRY(chain_work(d.N, d.C, &work, &st));
        return ts_cuk_norm_backward(x->data, dy->data, mask, slope_of(o), d.N, d.S, d.C, d.G, gamma->data, save_mean->data,
                                    save_invstd->data, 1, tiled(), data_or_null(dgamma), data_or_null(dbeta),
                                    data_or_null(dx), work, st);
    }
    double *s = calloc(2 * nc + 1, sizeof(double));
    float *h = malloc((d.C + 2 * ng + 5 * nc) * sizeof(float));
    void *dctr = NULL;
    if (!s || !h) TS_FAIL(TS_ERR_NOMEM, "groupnorm backward");
    float *g = h, *mean = h + d.C, *inv = mean + ng, *ivc = inv + ng, *cabk = ivc + nc;
    TS_CHECK(get(gamma, g));
    TS_CHECK(get(save_mean, mean));
    TS_CHECK(get(save_invstd, inv));
    for (size_t i = 0; i < nc; i++) {
        const size_t j = i / d.C * d.G + i % d.C / d.cg;
        cabk[i] = mean[j];
        ivc[i] = inv[j];
    }
    TS_CHECK(up_arrays(cabk, nc, &dctr));
    TS_CHECK(sums(1, &d, x->data, dy->data, mask, slope_of(o), dctr, s, s + nc));
    TS_CHECK(add_vec(dgamma, s + nc, ivc, d.C, d.N));
    TS_CHECK(add_vec(dbeta, s, NULL, d.C, d.N));
    if (!dx) goto cleanup;
    double St = (double)d.S;
    if (o->sync) {
        s[2 * nc] = (double)d.S;
        TS_CHECK(o->sync(o->sync_ctx, s, (int)(2 * nc + 1), TS_SYNC_SUM));
        St = s[2 * nc];
    }
    const double m = St * d.cg;
    for (int n = 0; n < d.N; n++)
        for (int gi = 0; gi < d.G; gi++) {
            const double iv = inv[n * d.G + gi];
            double A = 0, B = 0;
            for (int c = gi * d.cg; c < (gi + 1) * d.cg; c++) {
                const size_t i = (size_t)n * d.C + c;
                A += (double)g[c] * s[i];
                B += (double)g[c] * s[nc + i] * iv;
            }
            for (int c = gi * d.cg; c < (gi + 1) * d.cg; c++) {
                const size_t i = (size_t)n * d.C + c;
                cabk[nc + i] = (float)(g[c] * iv);
                cabk[2 * nc + i] = (float)(-iv * iv * B / m);
                cabk[3 * nc + i] = (float)(-iv * A / m);
            }
        }
    TS_CHECK(norm_dx(&d, x->data, dy->data, mask, slope_of(o), cabk, dx->data));
cleanup:
    free(s);
    free(h);
    return err;
}

/* ---------------------------------------------------------------- losses */
static int loss_shapes(const ts_tensor *logits, const ts_tensor *labels, const char *who, size_t *V, int *K, int *N)
{
    int ok = logits->device && labels->device && logits->dtype == TS_FLOAT32 && labels->dtype == TS_UINT8 &&
             logits->ndim >= 2 && labels->ndim == logits->ndim - 1;
    for (int i = 0; ok && i < labels->ndim; i++) ok = labels->shape[i] == logits->shape[i];
    if (!ok)
        return TS_ERR(TS_ERR_ARG, "%s: logits (float32, classes last) and labels (uint8) on the GPU do not match", who);
    *K = (int)logits->shape[logits->ndim - 1];
    *V = (size_t)ts_tensor_numel(labels);
    *N = (int)logits->shape[0];
    if (*K < 1 || *K > 256) return TS_ERR(TS_ERR_ARG, "%s: %d classes (1..256)", who, *K);
    return 0;
}

/* the first voxel holding label t (for the message) */
static long long first_voxel(const ts_tensor *labels, int t)
{
    void *s, *d;
    unsigned long long at = 0;
    if (stream(&s) || ts_cuda_scratch(TS_CUDA_SLOT_SMALL, sizeof at, &d) ||
        ts_cuk_label_first(labels->data, (size_t)ts_tensor_numel(labels), t, d, s) || d2h(&at, d, sizeof at))
        return -1;
    return (long long)at;
}

/* cross-entropy: the CPU's protocol (softmax_ce.c): denominator and error flags, then the numerator */
int ts_cuda_softmax_ce(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale,
                       double *loss, ts_tensor *dlogits)
{
    size_t V = 0;
    int K = 1, N = 1, err = 0, label_err = 0;
    double den = 0, num = 0;
    void *s = NULL, *dev = NULL;
    const int ign = o ? o->ignore_index : -1;
    const float *w = o ? o->class_weights : NULL;
    err = loss_shapes(logits, labels, "cross-entropy", &V, &K, &N);
    if (!err && dlogits && (dev_f32(dlogits, "cross-entropy") || !ts_tensor_same_shape(dlogits, logits)))
        err = TS_ERR(TS_ERR_ARG, "cross-entropy: the logit gradient must be float32 on the GPU shaped like the logits");
    if (!err) err = stream(&s);
    if (!err) err = ts_cuda_scratch(TS_CUDA_SLOT_SMALL, 256 * sizeof(unsigned long long) + 256 * sizeof(float) + 8, &dev);
    unsigned long long count[256];
    if (!err) err = ts_cuk_label_hist(labels->data, V, dev, s);
    if (!err) err = d2h(count, dev, sizeof count);
    for (int t = 0; !err && t < 256; t++) {
        if (!count[t] || t == ign) continue;
        if (t >= K) {
            label_err = 1;
            err = TS_ERR(TS_ERR_ARG, "cross-entropy: label %d at voxel %lld is not a class (0..%d) nor the ignore index", t,
                         first_voxel(labels, t), K - 1);
            break;
        }
        den += (double)count[t] * (w ? w[t] : 1.0f);
    }
    if (o && o->sync) {
        double t[3] = {err ? 0.0 : den, label_err ? 1.0 : 0.0, err && !label_err ? 1.0 : 0.0};
        TS_TRY(o->sync(o->sync_ctx, t, 3, TS_SYNC_SUM));
        if (err) return err;
        if (t[1] > 0)
            return TS_ERR(TS_ERR_ARG, "cross-entropy: a label on another rank of the group is not a class (0..%d) nor the "
                                      "ignore index", K - 1);
        if (t[2] > 0) return TS_ERR(TS_ERR_REMOTE, "cross-entropy: another rank of the group failed");
        den = t[0];
    }
    if (err) return err;
    if (den <= 0) {
        if (loss) *loss = 0;
        return 0;
    }
    float *dw = NULL;
    double *dnum = (double *)dev;
    if (w) {
        dw = (float *)((char *)dev + 8);
        err = h2d(dw, w, (size_t)K * sizeof(float));
    }
    if (!err) err = ts_cuk_ce(logits->data, labels->data, V, K, ign, dw, (float)(scale / den), dlogits ? dlogits->data : NULL,
                              dnum, s);
    if (!err) err = d2h(&num, dnum, sizeof num);
    if (o && o->sync && loss) {
        double t[2] = {err ? 0.0 : num, err ? 1.0 : 0.0};
        TS_TRY(o->sync(o->sync_ctx, t, 2, TS_SYNC_SUM));
        if (err) return err;
        if (t[1] > 0) return TS_ERR(TS_ERR_REMOTE, "cross-entropy: another rank of the group failed");
        num = t[0];
    }
    if (err) return err;
    if (loss) *loss = num / den;
    return 0;
}

/* soft Dice: the CPU's protocol (dice.c): per (n, k) sums with two error flags, then the gradient */
int ts_cuda_dice(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale, double *loss,
                 ts_tensor *dlogits)
{
    size_t V = 0;
    int K = 1, N = 1, err = 0, label_err = 0;
    void *s = NULL, *dev = NULL;
    const int ign = o ? o->ignore_index : -1;
    TS_TRY(loss_shapes(logits, labels, "dice", &V, &K, &N));
    if (dlogits && (dev_f32(dlogits, "dice") || !ts_tensor_same_shape(dlogits, logits)))
        return TS_ERR(TS_ERR_ARG, "dice: the logit gradient must be float32 on the GPU shaped like the logits");
    const size_t S = V / (size_t)N, ns = (size_t)N * 3 * K;
    const int sync = o && o->sync;
    if (sync && ns + 2 > INT_MAX) return TS_ERR(TS_ERR_UNSUPPORTED, "dice: %zu sums to synchronise", ns);
    double *sm = calloc(ns + 2, sizeof(double));
    float *AB = malloc((size_t)N * K * 2 * sizeof(float));
    if (!sm || !AB) TS_FAIL(TS_ERR_NOMEM, "dice sums");
    unsigned long long bad = 0;
    err = stream(&s);
    if (!err) err = ts_cuda_scratch(TS_CUDA_SLOT_SMALL, (ns + 1) * sizeof(double), &dev);
    if (!err) err = ts_cuk_dice_sums(logits->data, labels->data, N, S, K, ign, dev, (unsigned long long *)((double *)dev + ns), s);
    if (!err) err = d2h(sm, dev, ns * sizeof(double));
    if (!err) err = d2h(&bad, (double *)dev + ns, sizeof bad);
    if (!err && bad != ~0ull) {
        label_err = 1;
        unsigned char t = 0;
        d2h(&t, (const uint8_t *)labels->data + bad, 1);
        err = TS_ERR(TS_ERR_ARG, "dice: label %d at voxel %llu is not a class (0..%d) nor the ignore index", t, bad, K - 1);
    }
    if (sync) {
        sm[ns] = label_err ? 1.0 : 0.0;
        sm[ns + 1] = err && !label_err ? 1.0 : 0.0;
        const int e = o->sync(o->sync_ctx, sm, (int)(ns + 2), TS_SYNC_SUM);
        if (!err && e) err = e;
        else if (!err && sm[ns] > 0)
            err = TS_ERR(TS_ERR_ARG, "dice: a label on another rank of the group is not a class (0..%d) nor the ignore index",
                         K - 1);
        else if (!err && sm[ns + 1] > 0)
            err = TS_ERR(TS_ERR_REMOTE, "dice: another rank of the group failed");
    }
    if (err) goto cleanup;
    const double smooth = o ? o->dice_smooth : 1e-5;
    double acc = 0;
    for (size_t i = 0; i < (size_t)N * K; i++) {
        const double den = sm[3 * i + 1] + sm[3 * i + 2] + smooth, num = 2.0 * sm[3 * i] + smooth,
                     c = scale / (double)((size_t)N * K);
        acc += 1.0 - num / den;
        AB[2 * i] = (float)(c * num / (den * den));
        AB[2 * i + 1] = (float)(-c * 2.0 / den);
    }
    if (loss) *loss = acc / (double)((size_t)N * K);
    if (dlogits) {
        void *dab = NULL;
        TS_CHECK(up_arrays(AB, (size_t)N * K * 2, &dab));
        TS_CHECK(ts_cuk_dice_grad(logits->data, labels->data, N, S, K, ign, dab, dlogits->data, s));
    }
cleanup:
    free(sm);
    free(AB);
    return err;
}
