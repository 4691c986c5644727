#!/bin/sh
# The golden cases of tests/model/golden.sh on the GPU engine
# (train.engine = cuda, fp32 with TF32 off): PyTorch's logits, loss,
# gradients and parameters after one step, every case (the residual encoder
# and deep supervision included), within golden_compare's 1e-4 of each
# tensor's scale. Where a GPU is visible (a real one, or the CPU's CUDA
# emulator of a build configured --with-cuda=emu, docs/testing.md); skipped
# elsewhere, saying why.
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_use_gpus
if ! ts_mpirun 1 "$TS_BUILDDIR/tessera" info 2>&1 | grep -q '^GPU 0:'; then
    echo "1..0 # SKIP no GPU is visible here (a build with CUDA on a GPU machine, or one configured --with-cuda=emu, runs it)"
    exit 0
fi
golden_args="train.engine=cuda train.tf32=false"
. "$TS_SRCDIR/tests/model/golden.sh"
