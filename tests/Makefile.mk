# tests/: unit tests (TAP programs) and MPI wrappers (tests/mpi/*.sh)
include tests/core/Makefile.mk
include tests/coll/Makefile.mk
EXTRA_DIST += tests/mpi/lib.sh
