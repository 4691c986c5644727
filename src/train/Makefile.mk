# src/train: trainer loop, sliding-window evaluation, metrics, run directory
libtessera_a_SOURCES += src/train/window.c src/train/run.c src/train/evaluate.c src/train/step.c src/train/pipeline.c src/train/synthetic.c src/train/trainer.c src/train/plan.c src/train/surface.c
nobase_pkginclude_HEADERS += src/train/window.h src/train/run.h src/train/evaluate.h src/train/step.h src/train/pipeline.h src/train/synthetic.h src/train/trainer.h src/train/plan.h src/train/surface.h
