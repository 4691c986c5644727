/* Tensors: a dtype, a shape (row-major, up to 8 dims) and storage on the
 * host (64-byte aligned) or a device. A ts_tensor is a small value: views
 * are copies of the struct that do not own their storage. Layers take
 * tensors with explicit shapes; the parameter arena hands out views. */
#ifndef TS_CORE_TENSOR_H
#define TS_CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "src/core/dtype.h"

#define TS_MAX_DIMS 8

typedef struct ts_tensor {
    void *data;
    ts_dtype dtype;
    int ndim;
    int64_t shape[TS_MAX_DIMS];
    int device; /* 0: host memory; 1: GPU memory */
    int owns;   /* 1: ts_tensor_free releases data; 2: page-locked host data (src/core/device.h) */
} ts_tensor;

/* Local. Allocates zeroed host storage for the shape; t owns it. */
int ts_tensor_alloc(ts_tensor *t, ts_dtype dtype, int ndim, const int64_t *shape);
/* Local. Releases owned storage and clears t; safe on views and zeroed tensors. */
void ts_tensor_free(ts_tensor *t);
/* Local. A non-owning view of data with the given shape. */
ts_tensor ts_tensor_view(void *data, ts_dtype dtype, int ndim, const int64_t *shape);

/* Local. Element count and bytes (0 dims = scalar = 1 element). */
int64_t ts_tensor_numel(const ts_tensor *t);
size_t ts_tensor_bytes(const ts_tensor *t);
/* Local. 1 if both shapes are equal. */
int ts_tensor_same_shape(const ts_tensor *a, const ts_tensor *b);
/* Local. Writes "[2, 1, 64, 64, 64]" into buf. */
const char *ts_tensor_shape_str(const ts_tensor *t, char *buf, size_t n);
/* Local. Checks ndim and each dim (-1 = any); the message names what. */
int ts_tensor_check_shape(const ts_tensor *t, const char *what, int ndim, const int64_t *dims);

/* Local. A view of t with a new shape of the same element count (t keeps
 * ownership); TS_ERR_ARG if the counts differ. */
int ts_tensor_reshape(const ts_tensor *t, int ndim, const int64_t *shape, ts_tensor *out);
/* Local. Sets every element to zero (a device tensor: queued on the
 * compute stream) / to v (float32 host tensors for fill). */
void ts_tensor_zero(ts_tensor *t);
int ts_tensor_fill(ts_tensor *t, float v);
/* Local. Copies src into dst (same shape; float32, bfloat16 and float64
 * convert among each other, bfloat16 rounding to nearest even); other dtypes
 * must match exactly. */
int ts_tensor_copy(ts_tensor *dst, const ts_tensor *src);
/* Local. Layout changes between PyTorch's channels-first [N, C, D, H, W]
 * and tessera's channels-last activations [N, D, H, W, C] (float32). */
int ts_tensor_to_channels_last(const ts_tensor *ncdhw, ts_tensor *ndhwc);
int ts_tensor_to_channels_first(const ts_tensor *ndhwc, ts_tensor *ncdhw);
/* Local. Typed element pointer for float32 host tensors (NULL otherwise). */
static inline float *ts_tensor_f32(const ts_tensor *t)
{
    return t->dtype == TS_FLOAT32 && !t->device ? (float *)t->data : (float *)0;
}

#endif
