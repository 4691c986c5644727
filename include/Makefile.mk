# include/: the installed headers, <tessera/NAME.h>, flat under
# $(includedir)/tessera. tessera.h (the umbrella) is written by hand and
# version.h by configure; every other one is generated at build time from the
# module header listed in TS_PUBLIC_HDRS (include/public-header.sh), so
# each declaration has one source (docs/library.md).
tesseraincludedir = $(includedir)/tessera
dist_tesserainclude_HEADERS = include/tessera/tessera.h
TS_GEN_HDRS = $(addprefix include/tessera/,$(notdir $(TS_PUBLIC_HDRS)))
nodist_tesserainclude_HEADERS = include/tessera/version.h $(TS_GEN_HDRS)
noinst_HEADERS += $(TS_PUBLIC_HDRS)
EXTRA_DIST += include/public-header.sh include/tessera/version.h.in tessera.pc.in
CLEANFILES += $(TS_GEN_HDRS) include/tessera/gen.stamp

$(TS_GEN_HDRS): include/tessera/gen.stamp
	@test -f $@ || { rm -f include/tessera/gen.stamp; $(MAKE) $(AM_MAKEFLAGS) include/tessera/gen.stamp; }
include/tessera/gen.stamp: $(TS_PUBLIC_HDRS) $(top_srcdir)/include/public-header.sh Makefile
	$(AM_V_GEN)$(MKDIR_P) include/tessera && \
	for h in $(TS_PUBLIC_HDRS); do \
		$(SHELL) $(top_srcdir)/include/public-header.sh $(top_srcdir) $$h include/tessera/`basename $$h` \
			$(TS_PUBLIC_HDRS) || exit 1; \
	done && touch $@

# tessera.pc is written at install time from the installation directories
# of that `make install` (so `make install prefix=DIR` gives a .pc for DIR).
pkgconfigdir = $(libdir)/pkgconfig
install-data-local:
	$(MKDIR_P) '$(DESTDIR)$(pkgconfigdir)'
	sed -e 's|@prefix[@]|$(prefix)|g' -e 's|@exec_prefix[@]|$(exec_prefix)|g' \
		-e 's|@libdir[@]|$(libdir)|g' -e 's|@includedir[@]|$(includedir)|g' \
		-e 's|@PACKAGE_VERSION[@]|$(PACKAGE_VERSION)|g' -e 's|@NIFTI_LIBS[@]|$(NIFTI_LIBS)|g' \
		-e 's|@PAPI_LIBS[@]|$(PAPI_LIBS)|g' -e 's|@CUDA_LIBS[@]|$(CUDA_LIBS)|g' \
		-e 's|@OPENMP_CFLAGS[@]|$(OPENMP_CFLAGS)|g' \
		$(srcdir)/tessera.pc.in > '$(DESTDIR)$(pkgconfigdir)/tessera.pc'
uninstall-local:
	rm -f '$(DESTDIR)$(pkgconfigdir)/tessera.pc'
