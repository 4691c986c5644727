# src/optim: SGD, AdamW, learning-rate schedules, gradient clipping, dynamic loss scaling
libtessera_a_SOURCES += src/optim/optim.c src/optim/sgd.c src/optim/adamw.c src/optim/schedule.c src/optim/loss_scale.c
nobase_pkginclude_HEADERS += src/optim/optim.h src/optim/loss_scale.h
