#!/bin/sh
# checkpoint directories on 2 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 2 "$TS_BUILDDIR/tests/train/test_ckpt"
