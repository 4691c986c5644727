# src/train: trainer loop, sliding-window evaluation and inference, metrics, run directory
libtessera_la_SOURCES += src/train/window.c src/train/run.c src/train/evaluate.c src/train/step.c src/train/pipeline.c src/train/synthetic.c src/train/trainer.c src/train/trainer_ckpt.c src/train/trainer_eval.c src/train/trainer_setup.c src/train/plan.c src/train/plan_report.c src/train/plan_auto.c src/train/bench_step.c src/train/bench_io.c src/train/bench_layouts.c src/train/model_run.c src/train/surface.c src/train/mirror.c src/train/infer.c src/train/infer_list.c src/train/infer_metrics.c src/train/infer_prep.c src/train/grad_dump.c src/train/emergency.c
# public headers: installed as <tessera/NAME.h> (include/Makefile.mk, docs/library.md)
TS_PUBLIC_HDRS += src/train/step.h src/train/pipeline.h src/train/synthetic.h src/train/trainer.h src/train/infer.h
noinst_HEADERS += src/train/grad_dump.h src/train/emergency.h src/train/bench_step.h src/train/bench_io.h src/train/bench_layouts.h src/train/model_run.h src/train/window.h src/train/run.h src/train/evaluate.h src/train/plan.h src/train/plan_auto.h src/train/surface.h src/train/infer_impl.h src/train/trainer_impl.h
# tessera plan-data: patch and batch from a dataset's fingerprint
libtessera_la_SOURCES += src/train/plan_data.c
noinst_HEADERS += src/train/plan_data.h
