#!/bin/sh
# tests/nn/test_cuda_emu where it is not built, saying why: a tree configured
# without a C++17 compiler that has <ucontext.h>, or without python3
# (configure's "CUDA emulator" check), or one configured --with-cuda=emu,
# whose libtessera holds the emulator itself (the GPU tests run against it)
if grep -q 'cuda=emu' "${TS_BUILDDIR:-.}/tsbuild.h" 2>/dev/null; then
    echo "1..0 # SKIP tests/nn/test_cuda_emu is not built --with-cuda=emu: this libtessera holds the emulator itself, and the GPU tests (tests/nn/test_layers_cuda, tests/coll/device_*.sh, tests/train/engine_emu.sh) run against it"
else
    echo "1..0 # SKIP the CUDA emulator's test (tests/nn/test_cuda_emu) needs a C++17 compiler with <ucontext.h> and python3; configure found neither or one (install g++ and python3, then configure again)"
fi
