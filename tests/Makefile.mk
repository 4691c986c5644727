# tests/: unit tests (TAP programs) and MPI wrappers (tests/mpi/*.sh)
include tests/core/Makefile.mk
include tests/coll/Makefile.mk
include tests/parallel/Makefile.mk
include tests/train/Makefile.mk
include tests/io/Makefile.mk
EXTRA_DIST += tests/mpi/lib.sh
include tests/nn/Makefile.mk
include tests/lib/Makefile.mk
TESTS += tests/cli/coll_cli.sh tests/cli/bench_peak.sh tests/cli/bind.sh tests/cli/cuda_libs.sh
EXTRA_DIST += tests/cli/coll_cli.sh tests/cli/tap.sh tests/cli/bench_peak.sh tests/cli/bind.sh tests/cli/cuda_libs.sh
include tests/model/Makefile.mk
include tests/jobs/Makefile.mk
include tests/fuzz/Makefile.mk
