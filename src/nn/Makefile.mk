# src/nn: layers with forward/backward (CPU kernels; the CUDA backend in src/nn/cuda)
libtessera_la_SOURCES += src/nn/conv_kernels.c src/nn/scratch.c src/nn/conv_bf16.c src/nn/conv_amx.c src/nn/conv3d.c src/nn/convt3d.c src/nn/maxpool3d.c \
	src/nn/norm_common.c src/nn/batchnorm.c src/nn/groupnorm.c src/nn/relu.c src/nn/concat.c \
	src/nn/softmax_ce.c src/nn/dice.c src/nn/peak.c src/nn/winograd.c src/nn/winograd_bf16.c src/nn/winograd_narrow.c src/nn/conv_pointwise.c src/nn/conv_bias.c
EXTRA_DIST += src/nn/gen_tiles.py
# public headers: installed as <tessera/NAME.h> (include/Makefile.mk, docs/library.md)
TS_PUBLIC_HDRS += src/nn/layers.h
noinst_HEADERS += src/nn/conv_impl.h src/nn/kernel_opt.h src/nn/conv_tiles.h src/nn/conv_pairs.h src/nn/conv_tiles_bf16.h src/nn/conv_bf16_variant.h src/nn/winograd_bf16_variant.h src/nn/winograd_impl.h \
	src/nn/norm_impl.h src/nn/loss_impl.h src/nn/peak.h
# the CUDA backend of the layers (cuDNN convolutions, device kernels): CUDA builds only
if HAVE_CUDA
libtessera_la_SOURCES += src/nn/cuda/context.c src/nn/cuda/switches.c src/nn/cuda/conv_cudnn.c src/nn/cuda/conv_gemm.c src/nn/cuda/layers_cuda.c src/nn/cuda/nn_kernels.cu src/nn/cuda/norm_kernels.cu \
	src/nn/cuda/conv_split.c src/nn/cuda/halo_kernels.cu
endif
EXTRA_DIST += src/nn/cuda/context.c src/nn/cuda/switches.c src/nn/cuda/conv_cudnn.c src/nn/cuda/conv_gemm.c src/nn/cuda/layers_cuda.c src/nn/cuda/nn_kernels.cu src/nn/cuda/norm_kernels.cu \
	src/nn/cuda/conv_split.c src/nn/cuda/halo_kernels.cu
noinst_HEADERS += src/nn/cuda/cuda_nn.h src/nn/cuda/cublas_lib.h
