#!/bin/sh
# GPU buffers on 2 faked nodes of one rank: hierarchical is an NCCL
# communicator of one rank per node and the host-staged MPI allreduce
# between them, so it runs on a machine with one GPU, where nccl (both ranks
# in one NCCL communicator) must be refused on both ranks; with two GPUs
# nccl runs too. Skipped without a GPU.
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_use_gpus
TESSERA_RANKS_PER_NODE=1 ts_mpirun 2 "$TS_BUILDDIR/tests/coll/test_device"
