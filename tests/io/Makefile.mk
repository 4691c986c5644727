# tests/io: dataset schema, NIfTI import, converters, sampler, loader
TS_IO_TESTS = tests/io/dataset_np1.sh tests/io/dataset_np2.sh tests/io/dataset_np3.sh \
	tests/io/convert_ch2.sh tests/io/msd.sh tests/io/loader.sh tests/io/bad_input.sh tests/io/units.sh \
	tests/io/subbox_np2.sh tests/io/subbox_np4.sh tests/io/hardening.sh tests/io/augment_spatial.sh \
	tests/io/dump_patch.sh tests/io/fg_norm.sh
check_PROGRAMS += tests/io/test_dataset tests/io/test_sampler tests/io/mkmsd tests/io/test_sampler_unit \
	tests/io/test_loader tests/io/mkbad tests/io/test_units tests/io/test_resample tests/io/test_subbox \
	tests/io/test_augment_spatial
tests_io_test_dataset_SOURCES = tests/io/test_dataset.c
tests_io_test_dataset_LDADD = $(TS_LIBS)
tests_io_test_sampler_SOURCES = tests/io/test_sampler.c
tests_io_test_sampler_LDADD = $(TS_LIBS)
tests_io_test_sampler_unit_SOURCES = tests/io/test_sampler_unit.c
tests_io_test_sampler_unit_LDADD = $(TS_LIBS)
tests_io_test_loader_SOURCES = tests/io/test_loader.c
tests_io_test_loader_LDADD = $(TS_LIBS)
tests_io_test_subbox_SOURCES = tests/io/test_subbox.c
tests_io_test_subbox_LDADD = $(TS_LIBS)
tests_io_test_augment_spatial_SOURCES = tests/io/test_augment_spatial.c
tests_io_test_augment_spatial_LDADD = $(TS_LIBS)
tests_io_mkbad_SOURCES = tests/io/mkbad.c
tests_io_mkbad_LDADD = $(TS_LIBS)
tests_io_test_units_SOURCES = tests/io/test_units.c
tests_io_test_units_LDADD = $(TS_LIBS)
tests_io_mkmsd_SOURCES = tests/io/mkmsd.c
tests_io_mkmsd_LDADD = $(TS_LIBS)
tests_io_test_resample_LDADD = $(TS_LIBS)
TESTS += $(TS_IO_TESTS) tests/io/test_sampler_unit tests/io/test_resample
EXTRA_DIST += $(TS_IO_TESTS) tests/io/lib_io.sh tests/io/check_nifti.py tests/io/check_msd.py \
	jobs/bench/io_vs_dd.sh jobs/bench/loader_vs_step.sh configs/labelmaps/aal-3class.txt configs/labelmaps/aal-hemispheres.txt
# the dataset fingerprint, preprocessing at conversion, data.norm = ct (io/fingerprint.c, io/preprocess.c)
check_PROGRAMS += tests/io/test_fingerprint
tests_io_test_fingerprint_LDADD = $(TS_LIBS)
TESTS += tests/io/fingerprint.sh tests/io/test_fingerprint tests/io/norm_modality.sh
EXTRA_DIST += tests/io/fingerprint.sh tests/io/fingerprint_make.py tests/io/fingerprint_check.py \
	tests/io/norm_modality.sh
