# tests/fuzz: fuzz targets for the readers of hostile input (docs/testing.md).
# `make check` replays each target's seed corpus and committed crashers with
# the normal build (tests/fuzz/regress.sh). `make fuzz` builds the libFuzzer
# targets with clang, ASan and UBSan against the library sources, in
# fuzz-build/; tests/fuzz/run.sh SECONDS builds and runs them.
TS_FUZZ_TARGETS = config nifti dataset json
check_PROGRAMS += tests/fuzz/replay_config tests/fuzz/replay_nifti tests/fuzz/replay_dataset tests/fuzz/replay_json
tests_fuzz_replay_config_SOURCES = tests/fuzz/fuzz_config.c tests/fuzz/replay.c
tests_fuzz_replay_config_LDADD = $(TS_LIBS)
tests_fuzz_replay_nifti_SOURCES = tests/fuzz/fuzz_nifti.c tests/fuzz/replay.c
tests_fuzz_replay_nifti_LDADD = $(TS_LIBS)
tests_fuzz_replay_dataset_SOURCES = tests/fuzz/fuzz_dataset.c tests/fuzz/replay.c
tests_fuzz_replay_dataset_LDADD = $(TS_LIBS)
tests_fuzz_replay_json_SOURCES = tests/fuzz/fuzz_json.c tests/fuzz/replay.c
tests_fuzz_replay_json_LDADD = $(TS_LIBS)
TESTS += tests/fuzz/regress.sh
EXTRA_DIST += tests/fuzz/regress.sh tests/fuzz/run.sh tests/fuzz/fuzz_common.h tests/fuzz/corpus \
	tests/fuzz/regressions tests/fuzz/dict/config.dict tests/fuzz/dict/json.dict \
	tests/fuzz/make_corpus.py tests/sanitizers/lsan.supp

# ---- make fuzz: clang + libFuzzer + ASan + UBSan ----
FUZZ_CC = clang
FUZZ_DIR = fuzz-build
FUZZ_SAN = -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS = -g -O1 -fno-omit-frame-pointer -std=gnu11 -fopenmp $(TS_ARCH_CFLAGS) -Wno-unknown-pragmas \
	-Wno-unknown-warning-option -Wno-unknown-attributes -Wno-unused-command-line-argument
# MPICH's wrapper with clang underneath: MPI's include and library flags
FUZZ_MPICC = env MPICH_CC=$(FUZZ_CC) $(MPICC)
# C sources rebuilt here; CUDA objects (with --with-cuda) come from the normal build
fuzz_lib_objs = $(patsubst %.c,$(FUZZ_DIR)/%.o,$(filter %.c,$(libtessera_la_SOURCES)))
fuzz_cuda_objs = $(patsubst %.cu,%.o,$(filter %.cu,$(libtessera_la_SOURCES)))
fuzz_hdrs = $(addprefix $(srcdir)/,$(TS_PUBLIC_HDRS) $(noinst_HEADERS) tests/fuzz/fuzz_common.h) tsbuild.h
fuzz_libs = $(HDF5_LIBS) $(BLAS_LIBS) $(INIH_LIBS) $(CJSON_LIBS) $(NIFTI_LIBS) $(ZLIB_LIBS) $(PAPI_LIBS) $(CUDA_LIBS) \
	-lm -lpthread

$(FUZZ_DIR)/%.o: $(srcdir)/%.c $(fuzz_hdrs)
	@$(MKDIR_P) $(@D)
	$(AM_V_CC)$(FUZZ_MPICC) $(DEFS) $(AM_CPPFLAGS) $(FUZZ_CFLAGS) $(FUZZ_SAN) -fsanitize=fuzzer-no-link -c -o $@ $<
$(FUZZ_DIR)/libtessera-fuzz.a: $(fuzz_lib_objs) $(fuzz_cuda_objs)
	$(AM_V_AR)rm -f $@ && $(AR) cr $@ $(fuzz_lib_objs) $(fuzz_cuda_objs) && $(RANLIB) $@
$(FUZZ_DIR)/fuzz_%: $(FUZZ_DIR)/tests/fuzz/fuzz_%.o $(FUZZ_DIR)/libtessera-fuzz.a
	$(AM_V_CCLD)$(FUZZ_MPICC) $(FUZZ_CFLAGS) $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $< $(FUZZ_DIR)/libtessera-fuzz.a $(fuzz_libs)

fuzz: $(addprefix $(FUZZ_DIR)/fuzz_,$(TS_FUZZ_TARGETS))
	@echo "fuzz targets in $(FUZZ_DIR)/: $(addprefix fuzz_,$(TS_FUZZ_TARGETS)) (run them with tests/fuzz/run.sh SECONDS)"
clean-fuzz:
	rm -rf $(FUZZ_DIR)
.PHONY: fuzz clean-fuzz
clean-local: clean-fuzz
.PRECIOUS: $(FUZZ_DIR)/tests/fuzz/%.o
