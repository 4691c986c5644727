# tests/train: trainer pieces
check_PROGRAMS += tests/train/test_window
tests_train_test_window_LDADD = $(TS_LIBS)
TESTS += tests/train/test_window
