# tests/model: the UNet3D against PyTorch goldens (tests/golden), model and optimizer units, activation
# checkpointing, bad input
check_PROGRAMS += tests/model/golden_compare tests/model/test_optim tests/model/test_unet tests/model/test_ckpt
tests_model_test_unet_SOURCES = tests/model/test_unet.c
tests_model_test_unet_LDADD = $(TS_LIBS)
TESTS += tests/model/test_unet
tests_model_test_ckpt_SOURCES = tests/model/test_ckpt.c
tests_model_test_ckpt_LDADD = $(TS_LIBS)
TESTS += tests/model/test_ckpt
tests_model_test_optim_SOURCES = tests/model/test_optim.c
tests_model_test_optim_LDADD = $(TS_LIBS)
TESTS += tests/model/test_optim
tests_model_golden_compare_SOURCES = tests/model/golden_compare.c
tests_model_golden_compare_LDADD = $(TS_LIBS)
TESTS += tests/model/golden.sh tests/model/golden_gpu.sh tests/model/bad_input.sh
EXTRA_DIST += tests/model/golden.sh tests/model/golden_gpu.sh tests/model/bad_input.sh tests/golden
