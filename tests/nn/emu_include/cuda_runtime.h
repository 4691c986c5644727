/* the CUDA emulator in the place of the CUDA runtime (tests/nn/cuda_emu_rt.h) */
#include "tests/nn/cuda_emu_rt.h"
