# src/optim: SGD, AdamW, learning-rate schedules, gradient clipping, dynamic loss scaling
libtessera_la_SOURCES += src/optim/optim.c src/optim/sgd.c src/optim/adamw.c src/optim/schedule.c src/optim/loss_scale.c
# public headers: installed as <tessera/NAME.h> (include/Makefile.mk, docs/library.md)
TS_PUBLIC_HDRS += src/optim/optim.h src/optim/loss_scale.h
# the optimizer's device kernels (a state on the GPU, docs/gpu.md): CUDA builds only
if HAVE_CUDA
libtessera_la_SOURCES += src/optim/cuda/optim_kernels.cu
endif
EXTRA_DIST += src/optim/cuda/optim_kernels.cu
noinst_HEADERS += src/optim/cuda/optim_cuda.h
