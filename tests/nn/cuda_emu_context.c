/* What src/nn/cuda/context.c gives the GEMM convolutions (conv_gemm.c),
 * for the CUDA emulator (tests/nn/cuda_emu_rt.h): dummy handles, grow-only
 * scratch per slot in host memory, the opt-in switches and the precision
 * code, under the emulator's names (tests/nn/kernels_emu.h). */
#include "tsbuild.h"
#include "tests/nn/kernels_emu.h"
#include "src/core/error.h"
#include "src/nn/cuda/cuda_nn.h"

#include <stdlib.h>
#include <string.h>

static char handle_bytes[2];
static void *slots[TS_CUDA_SLOTS];
static size_t slot_bytes[TS_CUDA_SLOTS];

int ts_cuda_nn_handles(void **cudnn, void **cublas, void **stream)
{
    if (cudnn) *cudnn = &handle_bytes[0];
    if (cublas) *cublas = &handle_bytes[1];
    if (stream) *stream = NULL; /* the default stream */
    return 0;
}

int ts_cuda_scratch(int slot, size_t bytes, void **p)
{
    if (slot < 0 || slot >= TS_CUDA_SLOTS) return TS_ERR(TS_ERR_ARG, "scratch slot %d", slot);
    if (bytes > slot_bytes[slot]) {
        free(slots[slot]);
        if (!(slots[slot] = malloc(bytes))) return TS_ERR(TS_ERR_NOMEM, "emulated scratch of %zu bytes", bytes);
        memset(slots[slot], 0xff, bytes); /* NaN until written, as fresh device memory is not zero */
        slot_bytes[slot] = bytes;
    }
    *p = slots[slot];
    return 0;
}

int ts_cuda_switch(int *state, const char *env, const char *on)
{
    if (*state < 0) {
        const char *e = getenv(env);
        *state = e && !strcmp(e, on);
    }
    return *state;
}

int ts_cuda_prec_code(void)
{
    const ts_precision p = ts_nn_conv_precision();
    return p == TS_PREC_FP32 ? (ts_nn_tf32() ? 1 : 0) : p == TS_PREC_BF16 ? 2 : 3;
}
