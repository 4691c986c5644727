# examples/: small programs that use libtessera as a user would. They are not
# built against the tree: `make check` installs the library into a prefix in
# the build tree (tests/lib/prefix) and tests/lib/examples.sh builds each one
# there with nothing but `pkg-config --cflags --libs tessera` (and
# --static), runs it on 1 and 2 ranks and checks its result (docs/library.md).
TS_EXAMPLES = examples/allreduce.c examples/train_loop.c examples/dataset_nifti.c
EXTRA_DIST += $(TS_EXAMPLES) tests/lib/examples.sh tests/lib/api_doc.py
TESTS += tests/lib/examples.sh
AM_TESTS_ENVIRONMENT += TS_CC='$(CC)'; TS_PREFIX='$(abs_top_builddir)/tests/lib/prefix'; \
	TS_EXAMPLES='$(TS_EXAMPLES)'; export TS_CC TS_PREFIX TS_EXAMPLES;
# the installation the examples are built against, made before the tests run
check_DATA = tests/lib/prefix.stamp
tests/lib/prefix.stamp: libtessera.la $(nodist_tesserainclude_HEADERS) $(dist_tesserainclude_HEADERS) $(srcdir)/tessera.pc.in
	$(AM_V_GEN)rm -rf tests/lib/prefix && \
	$(MAKE) $(AM_MAKEFLAGS) install prefix='$(abs_top_builddir)/tests/lib/prefix' >/dev/null && \
	touch $@
clean-local: clean-examples-prefix
clean-examples-prefix:
	rm -rf tests/lib/prefix tests/lib/prefix.stamp
.PHONY: clean-examples-prefix
