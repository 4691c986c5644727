/* The CUDA emulator in the place of NCCL (a build configured
 * --with-cuda=emu; tests/nn/cuda_emu_nccl.c): communicators and the
 * collectives collectives/ calls, carried out at once by MPI on the
 * emulated device memory (host memory). */
#ifndef TS_TESTS_NN_EMU_NCCL_H
#define TS_TESTS_NN_EMU_NCCL_H

#include <stddef.h>

#include "tests/nn/cuda_emu_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsemu_nccl_comm *ncclComm_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
} ncclResult_t;
typedef enum {
    ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
    ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9
} ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct {
    size_t size;
    unsigned magic, version;
    int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {sizeof(ncclConfig_t), 0xcafebeef, 0, 1}

const char *ncclGetErrorString(ncclResult_t r);
const char *ncclGetLastError(ncclComm_t c);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *c, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *c, int nranks, ncclUniqueId id, int rank, ncclConfig_t *cfg);
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r);
ncclResult_t ncclCommFinalize(ncclComm_t c);
ncclResult_t ncclCommDestroy(ncclComm_t c);
ncclResult_t ncclCommAbort(ncclComm_t c);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s);
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t s);
ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
