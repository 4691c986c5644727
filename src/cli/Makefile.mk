# src/cli: the tessera command
tessera_SOURCES += src/cli/train.c src/cli/infer.c src/cli/main.c src/cli/info.c src/cli/bench.c src/cli/bench_coll.c src/cli/model.c src/cli/bench_step.c \
	src/cli/convert.c src/cli/synth.c src/cli/bench_io.c src/cli/plan.c
tessera_SOURCES += src/cli/plan_data.c src/cli/bench_peak.c src/cli/bench_infer.c
noinst_HEADERS += src/cli/cli.h src/cli/engine.h
