/* Sliding-window inference geometry: windows of the patch size tiling a
 * D x H x W volume with a given overlap (evenly spaced, the last one flush
 * with the border; one padded window along an axis shorter than the patch),
 * Gaussian importance weights (sigma = edge / 8, as nnU-Net) and the
 * extraction and accumulation loops. Local and allocation-free. */
#ifndef TS_INFER_WINDOW_H
#define TS_INFER_WINDOW_H

#include <stddef.h>
#include <stdint.h>

typedef struct ts_window_plan {
    int64_t vol[3], win[3];
    int64_t n[3];      /* windows along each axis */
    int64_t count;     /* n[0] * n[1] * n[2] */
} ts_window_plan;

/* overlap in [0, 1): fraction of the window shared with its neighbour. */
int ts_window_plan_make(const int64_t vol[3], const int64_t win[3], double overlap, ts_window_plan *p);
/* Origin (may extend past the volume when it is shorter than the window)
 * of window idx, 0 <= idx < count. */
void ts_window_origin(const ts_window_plan *p, int64_t idx, int64_t origin[3]);
/* Gaussian weights over the window, max 1, floored at 1e-3 so borders of
 * the volume keep a finite weight. w holds win[0]*win[1]*win[2] floats. */
void ts_window_gaussian(const int64_t win[3], float *w);
/* Copies the window at origin of vol [C, D, H, W] into out [C, wd, wh, ww],
 * zero outside the volume. */
void ts_window_extract(const ts_window_plan *p, const int64_t origin[3], const float *vol, int C, float *out);
/* the most classes the accumulation takes (model.classes' own limit) */
#define TS_WINDOW_MAX_CLASSES 256

/* acc [K, D, H, W] += w * softmax(logits) for the window at origin, where
 * logits are channels-last [wd, wh, ww, K]; wsum [D, H, W] += w (wsum NULL:
 * not kept; the argmax of acc needs no weight sum, probabilities do). K <=
 * TS_WINDOW_MAX_CLASSES. The softmax's exponentials are a polynomial
 * within 2 ulp of expf (vectorised), not libm's. */
void ts_window_accumulate(const ts_window_plan *p, const int64_t origin[3], const float *logits, int K,
                          const float *w, float *acc, float *wsum);

/* The same for the box [lo, lo + size) of every window (spatial
 * parallelism: each rank of a group predicts its box): out [C, size...],
 * logits [size..., K]; w is still the whole window's weights. */
void ts_window_extract_box(const ts_window_plan *p, const int64_t origin[3], const int64_t lo[3], const int64_t size[3],
                           const float *vol, int C, float *out);
void ts_window_accumulate_box(const ts_window_plan *p, const int64_t origin[3], const int64_t lo[3],
                              const int64_t size[3], const float *logits, int K, const float *w, float *acc,
                              float *wsum);

#endif
