/* the CUDA emulator in the place of cuBLAS (tests/nn/cuda_emu_rt.h) */
#include "tests/nn/cuda_emu_rt.h"
