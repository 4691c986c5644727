#!/bin/sh
# GPU buffers on 2 ranks of one node: with one GPU nccl and hierarchical
# refuse on both ranks ("2 ranks share GPU 0 ..."); with two GPUs both run,
# with counts that 2 ranks do not divide. Skipped without a GPU.
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_use_gpus
ts_mpirun 2 "$TS_BUILDDIR/tests/coll/test_device"
