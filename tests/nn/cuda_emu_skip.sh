#!/bin/sh
# tests/nn/test_cuda_emu in a tree configured without a C++17 compiler that has
# <ucontext.h>, or without python3 (configure's "CUDA emulator" check): skipped, saying why
echo "1..0 # SKIP the CUDA emulator's test (tests/nn/test_cuda_emu) needs a C++17 compiler with <ucontext.h> and python3; configure found neither or one (install g++ and python3, then configure again)"
