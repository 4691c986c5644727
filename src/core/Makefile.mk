# src/core: errors, logging, config, RNG streams, timers and per-phase counters, launch checks, dtypes,
# fault injection and the watchdog
libtessera_la_SOURCES += src/core/error.c src/core/log.c src/core/config.c \
	src/core/dtype.c src/core/rng.c src/core/timer.c src/core/counters.c src/core/perf.c src/core/launch.c \
	src/core/tensor.c src/core/fault.c src/core/watchdog.c src/core/path.c \
	src/core/device.c
# public headers: installed as <tessera/NAME.h> (include/Makefile.mk, docs/library.md)
TS_PUBLIC_HDRS += src/core/error.h src/core/log.h src/core/config.h src/core/dtype.h src/core/rng.h \
	src/core/perf.h src/core/tensor.h
noinst_HEADERS += src/core/timer.h src/core/counters.h src/core/launch.h src/core/fault.h src/core/watchdog.h \
	src/core/path.h src/core/device.h src/core/cuda_launch.h
# the library version at run time (<tessera/version.h>)
libtessera_la_SOURCES += src/core/version.c
