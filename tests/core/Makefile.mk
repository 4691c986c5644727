# tests/core: unit tests of src/core and the collectives' pure helpers
check_PROGRAMS += tests/core/test_core
tests_core_test_core_LDADD = $(TS_LIBS)
TESTS += tests/core/test_core
EXTRA_DIST += tests/tap.h
