# tests/core: unit tests of src/core and the collectives' pure helpers
check_PROGRAMS += tests/core/test_core
tests_core_test_core_LDADD = $(TS_LIBS)
TESTS += tests/core/test_core
EXTRA_DIST += tests/tap.h
# per-phase timers and counters, the analytic model cost
check_PROGRAMS += tests/core/test_perf
tests_core_test_perf_LDADD = $(TS_LIBS)
TESTS += tests/core/test_perf
