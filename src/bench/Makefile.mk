# src/bench: the step, data-path and peak benchmarks (`tessera bench step`, its --layouts, `bench io`, `bench peak`, `bench infer`)
libtessera_la_SOURCES += src/bench/bench_step.c src/bench/bench_io.c src/bench/bench_layouts.c src/bench/bench_json.c src/bench/bench_peak.c src/bench/bench_infer.c
noinst_HEADERS += src/bench/bench_step.h src/bench/bench_io.h src/bench/bench_layouts.h src/bench/bench_json.h src/bench/bench_peak.h src/bench/bench_infer.h
