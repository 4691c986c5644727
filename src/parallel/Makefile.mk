# src/parallel: grid, gradient buckets, spatial split (halo exchange), pipeline schedules, the layout;
# the model on them (pipeline stages, split hooks)
libtessera_la_SOURCES += src/parallel/grid.c src/parallel/buckets.c src/parallel/spatial.c src/parallel/pipe.c src/parallel/layout.c \
	src/parallel/pipeline.c src/parallel/split_model.c
# public headers: installed as <tessera/NAME.h> (include/Makefile.mk, docs/library.md)
TS_PUBLIC_HDRS += src/parallel/grid.h src/parallel/buckets.h src/parallel/spatial.h src/parallel/pipe.h src/parallel/layout.h \
	src/parallel/pipeline.h src/parallel/split_model.h
