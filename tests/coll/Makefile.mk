# tests/coll: collectives correctness (MPI, under timeouts)
check_PROGRAMS += tests/coll/test_allreduce tests/coll/test_collectives tests/coll/test_coll_misc tests/coll/test_compress \
	tests/coll/test_device
tests_coll_test_allreduce_LDADD = $(TS_LIBS)
tests_coll_test_collectives_LDADD = $(TS_LIBS)
tests_coll_test_coll_misc_LDADD = $(TS_LIBS)
tests_coll_test_compress_LDADD = $(TS_LIBS)
tests_coll_test_device_LDADD = $(TS_LIBS)
TS_COLL_TESTS = \
	tests/coll/allreduce_np1.sh tests/coll/allreduce_np2.sh tests/coll/allreduce_np3.sh \
	tests/coll/allreduce_np4.sh tests/coll/allreduce_np5.sh tests/coll/allreduce_np6.sh \
	tests/coll/allreduce_np7.sh tests/coll/allreduce_np8.sh \
	tests/coll/allreduce_fake2_np4.sh tests/coll/allreduce_fake2_np6.sh \
	tests/coll/collectives_np1.sh tests/coll/collectives_np3.sh tests/coll/collectives_np4.sh \
	tests/coll/collectives_fake2_np5.sh \
	tests/coll/misc_np1.sh tests/coll/misc_np2.sh tests/coll/misc_np3.sh \
	tests/coll/misc_fake2_np4.sh tests/coll/misc_fake2_np3.sh \
	tests/coll/compress_np2.sh tests/coll/compress_np3.sh tests/coll/compress_np4.sh \
	tests/coll/device_np1.sh tests/coll/device_np2.sh tests/coll/device_fake1_np2.sh tests/coll/device_cli_np2.sh
TESTS += $(TS_COLL_TESTS)
EXTRA_DIST += $(TS_COLL_TESTS) tests/coll/common.h
