# src/parallel: process grid, data-parallel gradient buckets, spatial decomposition (halo exchange)
libtessera_la_SOURCES += src/parallel/grid.c src/parallel/dp.c src/parallel/spatial.c src/parallel/pipe.c src/parallel/layout.c
# public headers: installed as <tessera/NAME.h> (include/Makefile.mk, docs/library.md)
TS_PUBLIC_HDRS += src/parallel/grid.h src/parallel/dp.h src/parallel/spatial.h src/parallel/pipe.h src/parallel/layout.h
