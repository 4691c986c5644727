# tests/nn: layer kernels against naive references; finite-difference gradient checks
check_PROGRAMS += tests/nn/test_layers
tests_nn_test_layers_SOURCES = tests/nn/test_layers.c
tests_nn_test_layers_LDADD = $(TS_LIBS)
TESTS += tests/nn/test_layers
