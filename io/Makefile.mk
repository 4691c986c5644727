# io/: dataset schema, HDF5 reader/writer, NIfTI import, converters, synthetic
# phantoms, distributed sampler, patches and augmentation, prefetching loader
libtessera_la_SOURCES += io/h5.c io/dataset.c io/dataset_read.c io/writer.c io/writer_stats.c io/synth.c io/nifti.c io/labelmap.c io/convert.c io/sampler.c io/patch.c io/augment.c io/loader.c io/checkpoint.c io/resample.c io/augment_spatial.c
libtessera_la_SOURCES += io/fingerprint.c io/preprocess.c
# public headers: installed as <tessera/NAME.h> (include/Makefile.mk, docs/library.md)
TS_PUBLIC_HDRS += io/augment_spatial.h io/dataset.h io/writer.h io/synth.h io/nifti.h io/sampler.h io/patch.h io/augment.h io/loader.h \
	io/checkpoint.h
noinst_HEADERS += io/h5.h io/labelmap.h io/convert.h io/resample.h
noinst_HEADERS += io/fingerprint.h io/preprocess.h
# private to the two halves of the reader and of the writer
noinst_HEADERS += io/dataset_impl.h io/writer_impl.h
