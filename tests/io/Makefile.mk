# tests/io: dataset schema, NIfTI import, converters, sampler, loader
TS_IO_TESTS = tests/io/dataset_np1.sh tests/io/dataset_np2.sh tests/io/dataset_np3.sh
check_PROGRAMS += tests/io/test_dataset
tests_io_test_dataset_SOURCES = tests/io/test_dataset.c
tests_io_test_dataset_LDADD = $(TS_LIBS)
TESTS += $(TS_IO_TESTS)
EXTRA_DIST += $(TS_IO_TESTS)
