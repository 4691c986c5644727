#!/bin/sh
# reduce-scatter, allgather, bcast on 5 ranks in fake nodes of 2, 2 and 1
. "$TS_SRCDIR/tests/mpi/lib.sh"
TESSERA_RANKS_PER_NODE=2 ts_mpirun 5 "$TS_BUILDDIR/tests/coll/test_collectives"
