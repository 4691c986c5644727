/* Random batches; see synthetic.h. Owns the keys of the voxels' Philox
 * streams (the header's comment); a function of its arguments only: no
 * state, no allocation, no MPI. */
#include "tsbuild.h"
#include "src/train/synthetic.h"
#include "src/core/rng.h"

void ts_synthetic_batch(uint64_t seed, int replica, int64_t step, int batch, int C, int classes, const int64_t patch[3],
                        const int64_t lo[3], const int64_t size[3], float *image, uint8_t *label)
{
    const int64_t nv = size[0] * size[1] * size[2];
    for (int b = 0; b < batch; b++) {
        /* the top bit keeps these streams apart from the parameter initialisation's (rank 0) */
        const uint32_t slot = (uint32_t)((int64_t)replica * batch + b) | 0x80000000u;
        for (int64_t z = 0; z < size[0]; z++)
            for (int c = 0; c <= C; c++) { /* C image channels, then the labels */
                ts_rng r;
                ts_rng_init(&r, seed, slot, (uint32_t)(((uint64_t)step * (uint64_t)patch[0] + (uint64_t)(lo[0] + z)) * (uint64_t)(C + 1) + (uint64_t)c));
                for (int64_t y = 0; y < lo[1] + size[1]; y++)
                    for (int64_t x = 0; x < patch[2]; x++) {
                        const int in = y >= lo[1] && x >= lo[2] && x < lo[2] + size[2];
                        const int64_t v = (z * size[1] + (y - lo[1])) * size[2] + (x - lo[2]);
                        if (c < C) {
                            const float f = (float)ts_rng_normal(&r);
                            if (in) image[((int64_t)b * C + c) * nv + v] = f;
                        } else {
                            const uint8_t t = (uint8_t)ts_rng_below(&r, (uint64_t)classes);
                            if (in) label[(int64_t)b * nv + v] = t;
                        }
                    }
            }
    }
}
