# src/model: parameter arena, the UNet3D, weights files
libtessera_la_SOURCES += src/model/arena.c src/model/unet.c src/model/unet_acts.c src/model/unet_forward.c \
	src/model/unet_backward.c src/model/unet_device.c src/model/unet_config.c src/model/weights.c src/model/cost.c
# public headers: installed as <tessera/NAME.h> (include/Makefile.mk, docs/library.md)
TS_PUBLIC_HDRS += src/model/arena.h src/model/unet.h src/model/weights.h
noinst_HEADERS += src/model/cost.h src/model/unet_impl.h
