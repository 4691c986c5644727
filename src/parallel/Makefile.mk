# src/parallel: process grid, data-parallel gradient buckets, spatial decomposition (halo exchange)
libtessera_a_SOURCES += src/parallel/grid.c src/parallel/dp.c src/parallel/spatial.c src/parallel/pipe.c
nobase_pkginclude_HEADERS += src/parallel/grid.h src/parallel/dp.h src/parallel/spatial.h src/parallel/pipe.h
