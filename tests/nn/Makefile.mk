# tests/nn: layer kernels against naive references; finite-difference gradient checks
EXTRA_DIST += tests/nn/rand_tensor.h
check_PROGRAMS += tests/nn/test_layers
tests_nn_test_layers_SOURCES = tests/nn/test_layers.c
tests_nn_test_layers_LDADD = $(TS_LIBS)
TESTS += tests/nn/test_layers
# split-volume layers (halo convolutions, norms and losses with sync) against the whole volume
check_PROGRAMS += tests/nn/test_split
tests_nn_test_split_SOURCES = tests/nn/test_split.c
tests_nn_test_split_LDADD = $(TS_LIBS)
TESTS += tests/nn/test_split
# the AVX-512 kernels and their vector helpers meet only inlined (a build without -march=native)
TESTS += tests/nn/vector_abi.sh
EXTRA_DIST += tests/nn/vector_abi.sh
# the bf16 variant chosen at run time and TESSERA_BF16_ISA
TESTS += tests/nn/bf16_isa.sh
EXTRA_DIST += tests/nn/bf16_isa.sh
# benchmarks, built on request: make tests/nn/bench_conv tests/nn/bench_step_prec
EXTRA_PROGRAMS = tests/nn/bench_conv tests/nn/bench_step_prec
tests_nn_bench_conv_SOURCES = tests/nn/bench_conv.c
tests_nn_bench_conv_LDADD = $(TS_LIBS)
tests_nn_bench_step_prec_SOURCES = tests/nn/bench_step_prec.c
tests_nn_bench_step_prec_LDADD = $(TS_LIBS)
CLEANFILES += tests/nn/bench_conv tests/nn/bench_step_prec
# the layers on the GPU against the CPU (skips, saying why, without CUDA or without a GPU)
check_PROGRAMS += tests/nn/test_layers_cuda
tests_nn_test_layers_cuda_SOURCES = tests/nn/test_layers_cuda.c
tests_nn_test_layers_cuda_LDADD = $(TS_LIBS)
TESTS += tests/nn/test_layers_cuda
# the Winograd convolution forward against a naive double-precision convolution
check_PROGRAMS += tests/nn/test_winograd
tests_nn_test_winograd_SOURCES = tests/nn/test_winograd.c
tests_nn_test_winograd_LDADD = $(TS_LIBS)
TESTS += tests/nn/test_winograd
# the GPU kernels of src/nn/cuda/*.cu, the GEMM convolutions (conv_gemm.c) and the
# other layers' host side (layers_cuda.c) on
# the CPU under a CUDA emulator (every build, no GPU or CUDA needed):
# cuda_emu.py rewrites each .cu into C++ against cuda_emu.h; emu_include/
# stands in for <cuda_runtime.h> and <cublas_v2.h>; every function is renamed
# ts_* -> tsemu_* (kernels_emu.h, included first) so that a CUDA build's
# libtessera does not clash; linked by MPI's C compiler driver with libstdc++
if TS_CUDA_EMU_FULL
# A build configured --with-cuda=emu (docs/testing.md, "The GPU engine under
# the emulator"): libtessera itself holds the emulator (the kernels'
# scheduler and the runtime, cuBLAS, cuDNN and NCCL over MPI) and the .cu
# files rewritten by cuda_emu.py --full (Makefile.am), so that the GPU
# tests and `tessera train.engine=cuda` run on the CPU. libtessera is linked
# by the C compiler driver with libstdc++ (CUDA_LIBS; Makefile.am). test_cuda_emu
# (each kernel on its own) belongs to the other builds.
libtessera_la_SOURCES += tests/nn/cuda_emu.cc tests/nn/cuda_emu_runtime.cc tests/nn/cuda_emu_dnn.cc \
	tests/nn/cuda_emu_nccl.c
TESTS += tests/nn/cuda_emu_skip.sh
else
if TS_CUDA_EMU
check_PROGRAMS += tests/nn/test_cuda_emu
tests_nn_test_cuda_emu_SOURCES = tests/nn/test_cuda_emu.c tests/nn/cuda_emu.cc tests/nn/cuda_emu.h \
	tests/nn/cuda_emu_rt.h tests/nn/cuda_emu_context.c src/nn/cuda/switches.c src/nn/cuda/conv_gemm.c \
	src/nn/cuda/layers_cuda.c
TS_EMU_CC = tests/nn/nn_kernels_emu.cc tests/nn/norm_kernels_emu.cc tests/nn/optim_kernels_emu.cc \
	tests/nn/halo_kernels_emu.cc
nodist_tests_nn_test_cuda_emu_SOURCES = $(TS_EMU_CC)
tests_nn_test_cuda_emu_CPPFLAGS = -I$(top_srcdir)/tests/nn/emu_include -include tests/nn/kernels_emu.h $(AM_CPPFLAGS)
tests_nn_test_cuda_emu_LDADD = $(TS_LIBS) -lstdc++
tests_nn_test_cuda_emu_LINK = $(LINK)
TESTS += tests/nn/test_cuda_emu
CLEANFILES += $(TS_EMU_CC) tests/nn/kernels_emu.h
tests/nn/kernels_emu.h: $(top_srcdir)/src/nn/cuda/nn_kernels.cu $(top_srcdir)/src/nn/cuda/norm_kernels.cu \
		$(top_srcdir)/src/optim/cuda/optim_kernels.cu $(top_srcdir)/src/nn/cuda/halo_kernels.cu \
		$(top_srcdir)/src/nn/cuda/conv_gemm.c $(top_srcdir)/src/nn/cuda/layers_cuda.c $(top_srcdir)/tests/nn/cuda_emu.py
	$(AM_V_GEN)$(MKDIR_P) tests/nn && $(PYTHON3) $(top_srcdir)/tests/nn/cuda_emu.py $@ \
	$(top_srcdir)/src/nn/cuda/nn_kernels.cu tests/nn/nn_kernels_emu.cc \
	$(top_srcdir)/src/nn/cuda/norm_kernels.cu tests/nn/norm_kernels_emu.cc \
	$(top_srcdir)/src/optim/cuda/optim_kernels.cu tests/nn/optim_kernels_emu.cc \
	$(top_srcdir)/src/nn/cuda/halo_kernels.cu tests/nn/halo_kernels_emu.cc \
	--c $(top_srcdir)/src/nn/cuda/conv_gemm.c --c $(top_srcdir)/src/nn/cuda/layers_cuda.c
$(TS_EMU_CC): tests/nn/kernels_emu.h
$(tests_nn_test_cuda_emu_OBJECTS): tests/nn/kernels_emu.h
else
# no C++17 compiler with <ucontext.h>, or no python3: the test says so and skips
TESTS += tests/nn/cuda_emu_skip.sh
endif
endif
EXTRA_DIST += tests/nn/cuda_emu_runtime.cc tests/nn/cuda_emu_dnn.cc tests/nn/cuda_emu_nccl.c tests/nn/emu_include/cudnn.h \
	tests/nn/emu_include/nccl.h
EXTRA_DIST += tests/nn/cuda_emu.py tests/nn/emu_include/cuda_runtime.h tests/nn/emu_include/cublas_v2.h \
	tests/nn/cuda_emu_skip.sh tests/nn/test_cuda_emu.c tests/nn/cuda_emu.cc tests/nn/cuda_emu.h tests/nn/cuda_emu_rt.h \
	tests/nn/cuda_emu_context.c
