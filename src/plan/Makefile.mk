# src/plan: the planner: performance model (`tessera plan`), parallel.layout = auto, `tessera plan-data`
libtessera_la_SOURCES += src/plan/plan.c src/plan/plan_report.c src/plan/plan_auto.c src/plan/plan_data.c
noinst_HEADERS += src/plan/plan.h src/plan/plan_auto.h src/plan/plan_data.h
