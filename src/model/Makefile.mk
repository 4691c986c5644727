# src/model: parameter arena, the UNet3D, weights files
libtessera_a_SOURCES += src/model/arena.c src/model/unet.c src/model/unet_config.c src/model/weights.c src/model/cost.c
nobase_pkginclude_HEADERS += src/model/arena.h src/model/unet.h src/model/weights.h src/model/cost.h
