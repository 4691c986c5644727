#!/bin/sh
# gradient compression (bf16, fp16, topk, sign, powersgd) on 4 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 4 "$TS_BUILDDIR/tests/coll/test_compress"
