# src/bench: the step and data-path benchmarks (`tessera bench step`, its --layouts, `bench io`)
libtessera_la_SOURCES += src/bench/bench_step.c src/bench/bench_io.c src/bench/bench_layouts.c src/bench/bench_json.c
noinst_HEADERS += src/bench/bench_step.h src/bench/bench_io.h src/bench/bench_layouts.h src/bench/bench_json.h
