/* What src/nn/cuda/context.c gives the GEMM convolutions and the layers
 * (conv_gemm.c, layers_cuda.c), for the CUDA emulator (tests/nn/
 * cuda_emu_rt.h): dummy handles and grow-only scratch per slot in host
 * memory, under the emulator's names (tests/nn/kernels_emu.h); the switches
 * and the precision code are src/nn/cuda/switches.c itself. */
#include "tsbuild.h"
#include "tests/nn/kernels_emu.h"
#include "src/core/error.h"
#include "src/nn/cuda/cuda_nn.h"
#include "src/nn/cuda/cublas_lib.h"

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

/* the emulator's cuBLAS: the GEMM and its messages (conv_gemm.c's calls;
 * the handles above are dummies, so no create or destroy) */
int ts_cublas_lib_open(const ts_cublas_lib **lib)
{
    static const ts_cublas_lib l = {.gemm_ex = cublasGemmEx, .status_string = cublasGetStatusString};
    *lib = &l;
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

