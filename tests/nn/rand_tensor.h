/* The tests of tests/nn: float32 tensors of uniform random values from one
 * generator per test program (rng, seeded by its main with ts_rng_init).
 * mk(ndim, shape, lo, hi) exits the test on allocation failure;
 * MK(lo, hi, d0, d1, ...) spells the shape inline. */
#ifndef TS_TESTS_NN_RAND_TENSOR_H
#define TS_TESTS_NN_RAND_TENSOR_H

#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/core/tensor.h"

#include <stdio.h>
#include <stdlib.h>

static ts_rng rng;

static ts_tensor mk(int ndim, const int64_t *shape, float lo, float hi)
{
    ts_tensor t;
    if (ts_tensor_alloc(&t, TS_FLOAT32, ndim, shape)) {
        fprintf(stderr, "alloc: %s\n", ts_err_message());
        exit(1);
    }
    float *p = t.data;
    for (int64_t i = 0; i < ts_tensor_numel(&t); i++) p[i] = lo + (hi - lo) * ts_rng_uniformf(&rng);
    return t;
}
#define MK(lo, hi, ...) mk(sizeof((int64_t[]){__VA_ARGS__}) / 8, (int64_t[]){__VA_ARGS__}, lo, hi)

#endif
