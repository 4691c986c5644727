# tests/train: trainer pieces, and tessera train / infer end to end
check_PROGRAMS += tests/train/test_window tests/train/test_ckpt tests/train/test_plan tests/train/test_surface tests/train/test_infer
tests_train_test_infer_LDADD = $(TS_LIBS)
tests_train_test_surface_LDADD = $(TS_LIBS)
tests_train_test_plan_LDADD = $(TS_LIBS)
tests_train_test_window_LDADD = $(TS_LIBS)
tests_train_test_ckpt_LDADD = $(TS_LIBS)
TESTS += tests/train/test_window tests/train/test_plan tests/train/test_surface tests/train/test_infer tests/train/surface.sh tests/train/infer.sh tests/train/infer_prep.sh tests/train/folds.sh tests/train/plan_cli.sh tests/train/ckpt_np2.sh tests/train/train.sh tests/train/spatial.sh tests/train/pipeline.sh tests/train/faults.sh tests/train/localsgd.sh tests/train/compress.sh tests/train/perf_np2.sh tests/train/precision.sh tests/train/act_checkpoint.sh tests/train/zero.sh tests/train/med_model.sh tests/train/pipeline_variants.sh tests/train/eval_surface.sh tests/train/grad_equiv.sh
EXTRA_DIST += tests/train/robustness_variants.py tests/train/lib_train.sh tests/train/lib_grads.sh tests/train/grad_compare.py tests/train/grad_equiv.sh tests/train/infer.sh tests/train/infer_prep.sh tests/train/infer_prep.py tests/train/infer_ref.py tests/train/folds.sh tests/train/surface.sh tests/train/surface_ref.py tests/train/perf_np2.sh tests/train/plan_cli.sh tests/train/ckpt_np2.sh tests/train/train.sh tests/train/spatial.sh tests/train/pipeline.sh tests/train/faults.sh tests/train/localsgd.sh tests/train/compress.sh tests/train/compare_runs.py tests/train/precision.sh tests/train/act_checkpoint.sh tests/train/zero.sh tests/train/med_model.sh tests/train/pipeline_variants.sh tests/train/eval_surface.sh tests/train/grad_equiv.sh
