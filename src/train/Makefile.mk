# src/train: trainer loop, sliding-window evaluation, metrics, run directory
libtessera_a_SOURCES += src/train/window.c
nobase_pkginclude_HEADERS += src/train/window.h
