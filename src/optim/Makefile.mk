# src/optim: SGD, AdamW, learning-rate schedules, gradient clipping
libtessera_a_SOURCES += src/optim/optim.c src/optim/sgd.c src/optim/adamw.c src/optim/schedule.c
nobase_pkginclude_HEADERS += src/optim/optim.h
