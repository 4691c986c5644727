#!/bin/sh
# GPU buffers on 1 rank: nccl, hierarchical (an NCCL communicator of one
# rank) and auto, every dtype and op; skipped without a GPU
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_use_gpus
ts_mpirun 1 "$TS_BUILDDIR/tests/coll/test_device"
