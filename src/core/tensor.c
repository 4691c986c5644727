/* Tensor storage and shape helpers; see tensor.h. Owns ts_tensor's
 * allocation, views, shape checks, copies (with float conversions) and the
 * channels-first <-> channels-last moves; no layer arithmetic, no MPI. */
#include "tsbuild.h"
#include "src/core/tensor.h"
#include "src/core/device.h"
#include "src/core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ts_tensor_alloc(ts_tensor *t, ts_dtype dtype, int ndim, const int64_t *shape)
{
    memset(t, 0, sizeof *t);
    if (ndim < 0 || ndim > TS_MAX_DIMS) return TS_ERR(TS_ERR_ARG, "tensor with %d dims (max %d)", ndim, TS_MAX_DIMS);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return TS_ERR(TS_ERR_ARG, "tensor dim %d is negative (%lld)", i, (long long)shape[i]);
        t->shape[i] = shape[i];
    }
    size_t bytes = ts_tensor_bytes(t);
    t->data = TS_ALIGNED_ALLOC(bytes);
    if (!t->data) return TS_ERR_NOMEM;
    memset(t->data, 0, bytes);
    t->owns = 1;
    return 0;
}

void ts_tensor_free(ts_tensor *t)
{
    if (!t) return;
    if (t->owns == 1 && !t->device) free(t->data);
    if (t->owns == 2) ts_device_free_host(t->data); /* page-locked (ts_tensor_alloc_pinned) */
    if (t->owns && t->device) ts_device_free(t->data);
    memset(t, 0, sizeof *t);
}

ts_tensor ts_tensor_view(void *data, ts_dtype dtype, int ndim, const int64_t *shape)
{
    ts_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.ndim = ndim < 0 ? 0 : ndim > TS_MAX_DIMS ? TS_MAX_DIMS : ndim;
    for (int i = 0; i < t.ndim; i++) t.shape[i] = shape[i];
    return t;
}

int64_t ts_tensor_numel(const ts_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t ts_tensor_bytes(const ts_tensor *t) { return (size_t)ts_tensor_numel(t) * ts_dtype_size(t->dtype); }

int ts_tensor_same_shape(const ts_tensor *a, const ts_tensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

const char *ts_tensor_shape_str(const ts_tensor *t, char *buf, size_t n)
{
    size_t l = 0;
    if (n == 0) return buf;
    l += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && l < n; i++)
        l += (size_t)snprintf(buf + l, n - l, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (l < n) snprintf(buf + l, n - l, "]");
    return buf;
}

int ts_tensor_check_shape(const ts_tensor *t, const char *what, int ndim, const int64_t *dims)
{
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        if (dims[i] >= 0 && dims[i] != t->shape[i]) ok = 0;
    if (ok) return 0;
    char got[128], want[128];
    size_t l = (size_t)snprintf(want, sizeof want, "[");
    for (int i = 0; i < ndim && l < sizeof want; i++)
        l += (size_t)(dims[i] >= 0 ? snprintf(want + l, sizeof want - l, "%s%lld", i ? ", " : "", (long long)dims[i])
                                   : snprintf(want + l, sizeof want - l, "%s*", i ? ", " : ""));
    if (l < sizeof want) snprintf(want + l, sizeof want - l, "]");
    return TS_ERR(TS_ERR_FORMAT, "%s has shape %s, expected %s", what, ts_tensor_shape_str(t, got, sizeof got), want);
}

int ts_tensor_reshape(const ts_tensor *t, int ndim, const int64_t *shape, ts_tensor *out)
{
    if (ndim < 0 || ndim > TS_MAX_DIMS) return TS_ERR(TS_ERR_ARG, "reshape to %d dims (max %d)", ndim, TS_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    if (n != ts_tensor_numel(t)) {
        char buf[128];
        return TS_ERR(TS_ERR_ARG, "cannot reshape %s (%lld elements) to %lld elements", ts_tensor_shape_str(t, buf, sizeof buf),
                      (long long)ts_tensor_numel(t), (long long)n);
    }
    ts_tensor v = ts_tensor_view(t->data, t->dtype, ndim, shape);
    v.device = t->device;
    *out = v;
    return 0;
}

void ts_tensor_zero(ts_tensor *t)
{
    if (t->data && !t->device) memset(t->data, 0, ts_tensor_bytes(t));
    if (t->data && t->device) ts_device_zero(t); /* queued on the compute stream; an error shows at the next sync */
}

int ts_tensor_fill(ts_tensor *t, float v)
{
    float *p = ts_tensor_f32(t);
    if (!p) return TS_ERR(TS_ERR_ARG, "fill: tensor is not float32 on the host");
    int64_t n = ts_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) p[i] = v;
    return 0;
}

static int is_float(ts_dtype d) { return d == TS_FLOAT32 || d == TS_FLOAT64 || d == TS_BFLOAT16; }

int ts_tensor_copy(ts_tensor *dst, const ts_tensor *src)
{
    char a[128], b[128];
    if (ts_tensor_numel(dst) != ts_tensor_numel(src) || dst->device || src->device)
        return TS_ERR(TS_ERR_ARG, "copy: %s to %s (element counts differ or device memory)",
                      ts_tensor_shape_str(src, a, sizeof a), ts_tensor_shape_str(dst, b, sizeof b));
    int64_t n = ts_tensor_numel(src);
    if (dst->dtype == src->dtype) {
        memcpy(dst->data, src->data, ts_tensor_bytes(src));
        return 0;
    }
    if (!is_float(dst->dtype) || !is_float(src->dtype))
        return TS_ERR(TS_ERR_ARG, "copy: cannot convert %s to %s", ts_dtype_name(src->dtype), ts_dtype_name(dst->dtype));
    for (int64_t i = 0; i < n; i++) {
        double v = src->dtype == TS_FLOAT32   ? ((const float *)src->data)[i]
                   : src->dtype == TS_FLOAT64 ? ((const double *)src->data)[i]
                                              : ts_bf16_to_f32(((const uint16_t *)src->data)[i]);
        if (dst->dtype == TS_FLOAT32) ((float *)dst->data)[i] = (float)v;
        else if (dst->dtype == TS_FLOAT64) ((double *)dst->data)[i] = v;
        else ((uint16_t *)dst->data)[i] = ts_f32_to_bf16((float)v);
    }
    return 0;
}

/* [N, A, B] -> [N, B, A] per batch entry: A = C and B = DHW or the reverse */
static void transpose_batched(const float *src, float *dst, int64_t n, int64_t a, int64_t b)
{
    for (int64_t i = 0; i < n; i++) {
        const float *s = src + i * a * b;
        float *d = dst + i * a * b;
        for (int64_t x0 = 0; x0 < a; x0 += 16)
            for (int64_t y = 0; y < b; y++)
                for (int64_t x = x0; x < a && x < x0 + 16; x++) d[y * a + x] = s[x * b + y];
    }
}

static int layout_check(const ts_tensor *src, const ts_tensor *dst, int to_last)
{
    char a[128], b[128];
    if (!ts_tensor_f32(src) || !ts_tensor_f32(dst) || src->ndim != 5 || dst->ndim != 5)
        return TS_ERR(TS_ERR_ARG, "layout change needs 5-d float32 host tensors");
    const int64_t *s = src->shape, *d = dst->shape;
    int ok = to_last ? (d[0] == s[0] && d[4] == s[1] && d[1] == s[2] && d[2] == s[3] && d[3] == s[4])
                     : (d[0] == s[0] && d[1] == s[4] && d[2] == s[1] && d[3] == s[2] && d[4] == s[3]);
    if (!ok)
        return TS_ERR(TS_ERR_ARG, "layout change: shapes %s and %s do not match", ts_tensor_shape_str(src, a, sizeof a),
                      ts_tensor_shape_str(dst, b, sizeof b));
    return 0;
}

int ts_tensor_to_channels_last(const ts_tensor *ncdhw, ts_tensor *ndhwc)
{
    TS_TRY(layout_check(ncdhw, ndhwc, 1));
    const int64_t *s = ncdhw->shape;
    transpose_batched(ncdhw->data, ndhwc->data, s[0], s[1], s[2] * s[3] * s[4]);
    return 0;
}

int ts_tensor_to_channels_first(const ts_tensor *ndhwc, ts_tensor *ncdhw)
{
    TS_TRY(layout_check(ndhwc, ncdhw, 0));
    const int64_t *s = ndhwc->shape;
    transpose_batched(ndhwc->data, ncdhw->data, s[0], s[1] * s[2] * s[3], s[4]);
    return 0;
}
