/* The per-thread scratch of the CPU convolution kernels (conv_impl.h,
 * ts_nn_scratch): one cached buffer per slot and calling thread, grown
 * when a call needs more, freed by ts_nn_scratch_release (which also drops
 * the thread's cached Winograd weights). */
#include "tsbuild.h"
#include "src/nn/conv_impl.h"
#include "src/nn/layers.h"
#include "src/core/error.h"

#include <stdlib.h>

#define SCRATCH_SLOTS 4
static _Thread_local struct {
    void *p;
    size_t n;
} scratch[SCRATCH_SLOTS];

size_t ts_nn_scratch_alloc_size(size_t bytes) { return (bytes + bytes / 4 + 4095) & ~(size_t)4095; }

void *ts_nn_scratch(int slot, size_t bytes)
{
    if (slot < 0 || slot >= SCRATCH_SLOTS) return NULL;
    if (scratch[slot].n < bytes) {
        free(scratch[slot].p);
        const size_t n = ts_nn_scratch_alloc_size(bytes);
        scratch[slot].p = TS_ALIGNED_ALLOC(n);
        scratch[slot].n = scratch[slot].p ? n : 0;
    }
    return scratch[slot].p;
}

void ts_nn_release_scratch(void) { ts_nn_scratch_release(); }

void ts_nn_scratch_release(void)
{
    ts_nn_winograd_release();
    for (int i = 0; i < SCRATCH_SLOTS; i++) {
        free(scratch[i].p);
        scratch[i].p = NULL;
        scratch[i].n = 0;
    }
}
