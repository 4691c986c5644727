/* Device-buffer queries, device allocation and the NCCL allreduce; compiled
 * with or without CUDA (without it, nothing is a device buffer and the
 * device calls report TS_ERR_UNSUPPORTED). Host-side CUDA runtime and NCCL
 * calls only: kernels live in collectives/cuda/kernels.cu behind device.h. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"
#include "collectives/device.h"

#include <stdlib.h>

#ifdef TS_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

typedef struct nccl_state {
    ncclComm_t comm;
    cudaStream_t stream;
} nccl_state;

int ts_coll_is_device(const void *p)
{
    struct cudaPointerAttributes at;
    if (!p) return 0;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free error of a host pointer */
        return 0;
    }
    return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

int ts_coll_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

int ts_coll_device_alloc(size_t bytes, int local_rank, void **p)
{
    int n = ts_coll_device_count();
    if (n == 0) return TS_ERR(TS_ERR_UNSUPPORTED, "no GPU visible to this rank");
    cudaError_t e = cudaSetDevice(local_rank % n);
    if (e == cudaSuccess) e = cudaMalloc(p, bytes ? bytes : 64);
    if (e != cudaSuccess) return TS_ERR(TS_ERR_CUDA, "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
    return 0;
}

void ts_coll_device_free(void *p)
{
    if (p) cudaFree(p);
}

void ts_nccl_chan_free(ts_chan *ch)
{
    nccl_state *s = ch->nccl;
    if (!s) return;
    ncclCommDestroy(s->comm);
    cudaStreamDestroy(s->stream);
    free(s);
    ch->nccl = NULL;
}

/* Collective on ch->comm: the NCCL communicator, made on first use. */
static int nccl_get(ts_chan *ch, nccl_state **out)
{
    if (ch->nccl) {
        *out = ch->nccl;
        return 0;
    }
    int err = 0, lerr = 0;
    ncclUniqueId id;
    nccl_state *s = calloc(1, sizeof *s);
    int n = ts_coll_device_count();
    if (!s) lerr = TS_ERR(TS_ERR_NOMEM, "nccl state");
    else if (n == 0) lerr = TS_ERR(TS_ERR_CUDA, "rank %d has no GPU for nccl", ch->topo.rank);
    else if (cudaSetDevice(ch->topo.local_rank % n) != cudaSuccess)
        lerr = TS_ERR(TS_ERR_CUDA, "cudaSetDevice(%d) failed", ch->topo.local_rank % n);
    else if (ch->topo.rank == 0 && ncclGetUniqueId(&id) != ncclSuccess)
        lerr = TS_ERR(TS_ERR_CUDA, "ncclGetUniqueId failed");
    TS_CHECK(ts_err_agree(ch->comm, lerr));
    TS_MPI(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, ch->comm));
    ncclResult_t r = ncclCommInitRank(&s->comm, ch->topo.size, id, ch->topo.rank);
    lerr = r != ncclSuccess ? TS_ERR(TS_ERR_CUDA, "ncclCommInitRank: %s", ncclGetErrorString(r)) : 0;
    if (!lerr && cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking) != cudaSuccess)
        lerr = TS_ERR(TS_ERR_CUDA, "cudaStreamCreate failed");
    TS_CHECK(ts_err_agree(ch->comm, lerr));
    ch->nccl = s;
    *out = s;
    return 0;
cleanup:
    free(s);
    return err;
}

int ts_allreduce_nccl(ts_chan *ch, const ts_coll_args *a)
{
    static const ncclDataType_t types[TS_DTYPE_COUNT] = {ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat16,
                                                         ncclInt32,   ncclInt64,   ncclUint8};
    static const ncclRedOp_t ops[TS_OP_COUNT] = {ncclSum, ncclAvg, ncclMax, ncclMin};
    nccl_state *s = NULL;
    TS_TRY(nccl_get(ch, &s));
    ncclDataType_t t = types[a->dt];
    ncclRedOp_t o = ops[a->op];
    if (a->op == TS_OP_AVG && (a->dt == TS_INT32 || a->dt == TS_INT64)) o = ncclSum; /* then divide below */
    ncclResult_t r = ncclAllReduce(a->sendbuf, a->recvbuf, a->count, t, o, s->comm, s->stream);
    if (r != ncclSuccess) return TS_ERR(TS_ERR_CUDA, "ncclAllReduce: %s", ncclGetErrorString(r));
    cudaError_t e = cudaStreamSynchronize(s->stream);
    if (e != cudaSuccess) return TS_ERR(TS_ERR_CUDA, "nccl allreduce: %s", cudaGetErrorString(e));
    if (o != ops[a->op]) return ts_coll_device_int_avg(a->recvbuf, a->count, a->dt, ch->topo.size);
    return 0;
}

#else /* no CUDA */

int ts_coll_is_device(const void *p)
{
    (void)p;
    return 0;
}
int ts_coll_device_count(void) { return 0; }
void ts_nccl_chan_free(ts_chan *ch) { (void)ch; }
int ts_coll_device_alloc(size_t bytes, int local_rank, void **p)
{
    (void)bytes;
    (void)local_rank;
    *p = NULL;
    return TS_ERR(TS_ERR_UNSUPPORTED, "this build has no CUDA (configure --with-cuda)");
}
void ts_coll_device_free(void *p) { (void)p; }
int ts_coll_device_fill(void *p, size_t n, ts_dtype dt, int rank, int seed)
{
    (void)p; (void)n; (void)dt; (void)rank; (void)seed;
    return TS_ERR(TS_ERR_UNSUPPORTED, "this build has no CUDA (configure --with-cuda)");
}
int ts_coll_device_wrong(const void *p, size_t n, ts_dtype dt, int nranks, int op, int seed, size_t *wrong)
{
    (void)p; (void)n; (void)dt; (void)nranks; (void)op; (void)seed; (void)wrong;
    return TS_ERR(TS_ERR_UNSUPPORTED, "this build has no CUDA (configure --with-cuda)");
}
#endif
