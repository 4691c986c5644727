#!/bin/sh
# gradient compression (bf16, fp16, topk, sign, powersgd) on 3 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 3 "$TS_BUILDDIR/tests/coll/test_compress"
