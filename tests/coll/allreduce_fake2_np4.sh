#!/bin/sh
# allreduce matrix on 4 ranks split into fake nodes of 2: hierarchical across "nodes" and the
# automatic choice (the other algorithms do not look at nodes and run in allreduce_np4.sh)
. "$TS_SRCDIR/tests/mpi/lib.sh"
TS_TEST_TIMEOUT=${TS_TEST_TIMEOUT:-900}
TESSERA_RANKS_PER_NODE=2 ts_mpirun 4 "$TS_BUILDDIR/tests/coll/test_allreduce" hierarchical,auto
