/* Channel concatenation of two channels-last tensors (the U-Net's skip
 * connection: upsampled first, skip second). Backward splits the gradient.
 * Local: no MPI, allocates nothing. */
#include "tsbuild.h"
#include "src/nn/layers.h"
#ifdef TS_HAVE_CUDA
#include "src/nn/cuda/cuda_nn.h"
#endif
#include "src/core/error.h"

#include <string.h>

static int cat_shapes(const ts_tensor *a, const ts_tensor *b, const ts_tensor *y)
{
    char s1[96], s2[96], s3[96];
    if (!ts_tensor_f32(y) || (a && !ts_tensor_f32(a)) || (b && !ts_tensor_f32(b)))
        return TS_ERR(TS_ERR_ARG, "concat: tensors must be float32");
    int ok = a && b && a->ndim == y->ndim && b->ndim == y->ndim && y->ndim >= 1 &&
             a->shape[y->ndim - 1] + b->shape[y->ndim - 1] == y->shape[y->ndim - 1];
    for (int i = 0; ok && i < y->ndim - 1; i++) ok = a->shape[i] == y->shape[i] && b->shape[i] == y->shape[i];
    if (!ok)
        return TS_ERR(TS_ERR_ARG, "concat: %s and %s do not concatenate to %s along the last dim",
                      a ? ts_tensor_shape_str(a, s1, sizeof s1) : "-", b ? ts_tensor_shape_str(b, s2, sizeof s2) : "-",
                      ts_tensor_shape_str(y, s3, sizeof s3));
    return 0;
}

int ts_concat_forward(const ts_tensor *a, const ts_tensor *b, ts_tensor *y)
{
#ifdef TS_HAVE_CUDA
    if (a->device) return ts_cuda_concat_forward(a, b, y);
#endif
    TS_TRY(cat_shapes(a, b, y));
    const int64_t ca = a->shape[a->ndim - 1], cb = b->shape[b->ndim - 1], v = ts_tensor_numel(a) / (ca ? ca : 1);
    const float *pa = a->data, *pb = b->data;
    float *py = y->data;
#pragma omp parallel for schedule(dynamic, 1024)
    for (int64_t i = 0; i < v; i++) {
        memcpy(py + i * (ca + cb), pa + i * ca, (size_t)ca * sizeof(float));
        memcpy(py + i * (ca + cb) + ca, pb + i * cb, (size_t)cb * sizeof(float));
    }
    return 0;
}

int ts_concat_backward(const ts_tensor *dy, ts_tensor *da, ts_tensor *db)
{
#ifdef TS_HAVE_CUDA
    if (dy->device) return ts_cuda_concat_backward(dy, da, db);
#endif
    if (!da && !db) return 0;
    if (!da || !db) { /* shapes from the one given */
        const ts_tensor *g = da ? da : db;
        const int64_t cg = g->shape[g->ndim - 1], cy = dy->shape[dy->ndim - 1];
        if (!ts_tensor_f32(g) || !ts_tensor_f32(dy) || g->ndim != dy->ndim || cg > cy ||
            ts_tensor_numel(g) / (cg ? cg : 1) != ts_tensor_numel(dy) / (cy ? cy : 1))
            return TS_ERR(TS_ERR_ARG, "concat backward: gradient shapes do not match");
        const int64_t v = ts_tensor_numel(dy) / (cy ? cy : 1), off = da ? 0 : cy - cg;
        const float *pd = dy->data;
        float *pg = g->data;
#pragma omp parallel for schedule(dynamic, 1024)
        for (int64_t i = 0; i < v; i++) memcpy(pg + i * cg, pd + i * cy + off, (size_t)cg * sizeof(float));
        return 0;
    }
    TS_TRY(cat_shapes(da, db, dy));
    const int64_t ca = da->shape[da->ndim - 1], cb = db->shape[db->ndim - 1], v = ts_tensor_numel(da) / (ca ? ca : 1);
    const float *py = dy->data;
    float *pa = da->data, *pb = db->data;
#pragma omp parallel for schedule(dynamic, 1024)
    for (int64_t i = 0; i < v; i++) {
        memcpy(pa + i * ca, py + i * (ca + cb), (size_t)ca * sizeof(float));
        memcpy(pb + i * cb, py + i * (ca + cb) + ca, (size_t)cb * sizeof(float));
    }
    return 0;
}
