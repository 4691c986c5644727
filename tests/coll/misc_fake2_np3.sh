#!/bin/sh
# unequal fake nodes (2 + 1): hierarchical refuses, the rest works
. "$TS_SRCDIR/tests/mpi/lib.sh"
TESSERA_RANKS_PER_NODE=2 ts_mpirun 3 "$TS_BUILDDIR/tests/coll/test_coll_misc"
