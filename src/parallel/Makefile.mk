# src/parallel: process grid, data-parallel gradient buckets
libtessera_a_SOURCES += src/parallel/grid.c src/parallel/dp.c
nobase_pkginclude_HEADERS += src/parallel/grid.h src/parallel/dp.h
