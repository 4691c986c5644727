#!/bin/sh
# gradient compression (bf16, fp16, topk, sign, powersgd) on 2 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 2 "$TS_BUILDDIR/tests/coll/test_compress"
