# tests/parallel: process grid, data-parallel buckets, spatial plan and halo exchange, the model variants on a
# spatial split (MPI, under timeouts)
check_PROGRAMS += tests/parallel/test_dp tests/parallel/test_spatial
tests_parallel_test_dp_LDADD = $(TS_LIBS)
tests_parallel_test_spatial_LDADD = $(TS_LIBS)
TS_PARALLEL_TESTS = tests/parallel/dp_np1.sh tests/parallel/dp_np2.sh tests/parallel/dp_np3.sh tests/parallel/dp_np4.sh \
	tests/parallel/spatial_np1.sh tests/parallel/spatial_np2.sh tests/parallel/spatial_np3.sh \
	tests/parallel/spatial_np4.sh tests/parallel/spatial_np6.sh tests/parallel/spatial_np8.sh \
	tests/parallel/spatial_variants.sh
TESTS += $(TS_PARALLEL_TESTS)
EXTRA_DIST += $(TS_PARALLEL_TESTS)
