/* The GPU backend's settings that need no CUDA call: the opt-in paths'
 * switches (TESSERA_CUDA_* read once) and the convolutions' precision code.
 * Apart from context.c (handles, scratch) so that the CUDA emulator's test
 * (tests/nn/test_cuda_emu) compiles this very file. */
#include "tsbuild.h"
#include "src/nn/cuda/cuda_nn.h"
#include "src/nn/layers.h"

#include <stdlib.h>
#include <string.h>

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
