/* Tensor storage and shape helpers; see tensor.h. */
#include "tsbuild.h"
#include "src/core/tensor.h"
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
    if (t->owns && !t->device) free(t->data);
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
