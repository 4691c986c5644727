# src/train: training: the trainer loop, the stepper, the gradient path, synthetic batches, run directory and metrics
libtessera_la_SOURCES += src/train/step.c src/train/synthetic.c src/train/run.c src/train/trainer.c src/train/trainer_setup.c \
	src/train/trainer_ckpt.c src/train/trainer_eval.c src/train/grad_dump.c src/train/emergency.c src/train/gradpath.c
# public headers: installed as <tessera/NAME.h> (include/Makefile.mk, docs/library.md)
TS_PUBLIC_HDRS += src/train/step.h src/train/synthetic.h src/train/trainer.h
noinst_HEADERS += src/train/run.h src/train/grad_dump.h src/train/emergency.h src/train/trainer_impl.h src/train/gradpath.h
