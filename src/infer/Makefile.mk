# src/infer: running a model: sliding window, evaluation, mirroring, surface metrics, `tessera infer`, `model run`
libtessera_la_SOURCES += src/infer/window.c src/infer/evaluate.c src/infer/mirror.c src/infer/surface.c \
	src/infer/infer.c src/infer/infer_list.c src/infer/infer_metrics.c src/infer/infer_prep.c src/infer/model_run.c
# public headers: installed as <tessera/NAME.h> (include/Makefile.mk, docs/library.md)
TS_PUBLIC_HDRS += src/infer/infer.h
noinst_HEADERS += src/infer/window.h src/infer/evaluate.h src/infer/surface.h src/infer/infer_impl.h src/infer/model_run.h
