/* cuBLAS opened at its first use (context.c). Linking libcublas put its
 * 540 MB of libcublasLt into every process at start-up, GPU or not: about
 * 0.35 s of static initialisers and page faults before main() on the CPU
 * machines (`tessera --version` 0.42 s), paid by every CPU run of a CUDA
 * build. So the CUDA build does not link cuBLAS; ts_cublas_lib dlopens
 * libcublas.so.<major of the headers built against> when the GPU engine
 * first needs it (the layers' context, `tessera info`) and resolves the
 * few functions the engine calls. In the emulator build (TS_CUDA_EMU_FULL)
 * the table points at the emulator's functions. Internal to src/nn/cuda. */
#ifndef TS_NN_CUDA_CUBLAS_LIB_H
#define TS_NN_CUDA_CUBLAS_LIB_H

#include <cublas_v2.h>

typedef struct ts_cublas_lib {
    __typeof__(cublasCreate) *create;
    __typeof__(cublasDestroy) *destroy;
    __typeof__(cublasSetStream) *set_stream;
    __typeof__(cublasGemmEx) *gemm_ex;
    __typeof__(cublasGetProperty) *get_property;
    __typeof__(cublasGetStatusString) *status_string;
} ts_cublas_lib;

/* *lib = the table, opening the library on the first call (thread-safe:
 * the first call is made with no other thread in the engine). Fails with
 * TS_ERR_CUDA naming the library file and the loader's message (not found,
 * a symbol missing) and *lib = NULL; later calls fail the same way. */
int ts_cublas_lib_open(const ts_cublas_lib **lib);

#endif
