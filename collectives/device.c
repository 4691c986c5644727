/* Device buffers: queries, a rank's GPU, allocation, the channel's GPU state
 * and NCCL communicators (non-blocking, waits bounded by a deadline, errors
 * agreed) and the flat `nccl` allreduce. Without CUDA nothing is a device
 * buffer and device calls report TS_ERR_UNSUPPORTED. Host-side CUDA and NCCL
 * calls only: kernels are in collectives/cuda/kernels.cu behind device.h. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"
#include "collectives/device.h"

#include <stdlib.h>
#include <string.h>

#ifdef TS_HAVE_CUDA
#include "collectives/device_impl.h"
#include "src/core/fault.h"
#include "src/core/timer.h"
#include "src/core/watchdog.h"

#define DEADLINE_DEFAULT_S 120.0 /* fault.timeout's default, where no watchdog runs */
#define DEADLINE_SHARE 0.8       /* of it, for the GPU work of one call */

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

static int chan_gpu(const ts_chan *ch)
{
    int n = ts_coll_device_count();
    return n > 0 ? ch->topo.real_local_rank % n : -1;
}

int ts_coll_gpu(const ts_coll *c) { return chan_gpu(&c->main); }

int ts_coll_device_alloc(size_t bytes, int gpu, void **p)
{
    *p = NULL;
    if (gpu < 0) return TS_ERR(TS_ERR_UNSUPPORTED, "no GPU visible to this rank");
    cudaError_t e = cudaSetDevice(gpu);
    if (e == cudaSuccess) e = cudaMalloc(p, bytes ? bytes : 64);
    if (e != cudaSuccess)
        return TS_ERR(TS_ERR_CUDA, "cudaMalloc(%zu) on GPU %d: %s", bytes, gpu, cudaGetErrorString(e));
    return 0;
}

void ts_coll_device_free(void *p)
{
    if (p) cudaFree(p);
}

double ts_nccl_deadline(void)
{
    double t = ts_watchdog_timeout();
    return ts_time_now() + DEADLINE_SHARE * (t > 0 ? t : DEADLINE_DEFAULT_S);
}

/* ---- errors: each names the rank, the step and the library's message ---- */

static int nccl_fail(ncclComm_t comm, ncclResult_t r, const char *what)
{
    const char *last = ncclGetLastError(comm);
    return TS_ERR(TS_ERR_CUDA, "rank %d: %s: NCCL: %s%s%s", ts_err_rank(), what, ncclGetErrorString(r),
                  last && *last ? ": " : "", last ? last : "");
}

static int cuda_fail(cudaError_t e, const char *what)
{
    return TS_ERR(TS_ERR_CUDA, "rank %d: %s: CUDA: %s", ts_err_rank(), what, cudaGetErrorString(e));
}

static int late(const char *what)
{
    double t = ts_watchdog_timeout();
    return TS_ERR(TS_ERR_CUDA,
                  "rank %d: %s: not finished by the deadline (%.0f s: %.0f%% of fault.timeout%s); "
                  "NCCL communicator aborted", ts_err_rank(), what, DEADLINE_SHARE * (t > 0 ? t : DEADLINE_DEFAULT_S),
                  100 * DEADLINE_SHARE, t > 0 ? "" : "'s default, no watchdog running");
}

static void comm_abort(ncclComm_t *comm)
{
    if (*comm) ncclCommAbort(*comm);
    *comm = NULL;
}

/* ---- the channel's state ---- */

static void state_free(ts_nccl *s)
{
    if (!s) return;
    if (s->host) cudaFreeHost(s->host);
    if (s->have_event) {
        cudaEventDestroy(s->ready);
        cudaEventDestroy(s->after);
    }
    if (s->have_stream) cudaStreamDestroy(s->stream);
    free(s);
}

/* finalise a communicator, polling with a deadline; abort when that fails */
static void comm_close(ncclComm_t *comm)
{
    if (!*comm) return;
    const double deadline = ts_nccl_deadline();
    ncclResult_t r = ncclCommFinalize(*comm);
    for (unsigned spins = 0; r == ncclInProgress && ts_time_now() < deadline; spins++) {
        ts_coll_relax(spins, 1);
        if (ncclCommGetAsyncError(*comm, &r) != ncclSuccess) r = ncclInternalError;
    }
    if (r == ncclSuccess) {
        ncclCommDestroy(*comm);
        *comm = NULL;
    } else {
        comm_abort(comm);
    }
}

void ts_nccl_chan_free(ts_chan *ch)
{
    ts_nccl *s = ch->nccl;
    if (!s) return;
    cudaSetDevice(s->gpu);
    comm_close(&s->flat);
    comm_close(&s->node);
    state_free(s);
    ch->nccl = NULL;
}

int ts_nccl_state(ts_chan *ch, ts_nccl **out)
{
    ts_nccl *s = ch->nccl;
    if (s) {
        cudaError_t e = cudaSetDevice(s->gpu); /* (the progress thread's current device too) */
        if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice");
        *out = s;
        return 0;
    }
    int lerr = 0;
    cudaError_t e = cudaSuccess;
    s = calloc(1, sizeof *s);
    if (!s) lerr = TS_ERR(TS_ERR_NOMEM, "GPU state");
    else if ((s->gpu = chan_gpu(ch)) < 0) lerr = TS_ERR(TS_ERR_CUDA, "rank %d has no GPU for NCCL", ts_err_rank());
    else if ((e = cudaSetDevice(s->gpu)) != cudaSuccess) lerr = cuda_fail(e, "cudaSetDevice");
    if (!lerr) {
        e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
        s->have_stream = e == cudaSuccess;
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming);
        if (e == cudaSuccess && (e = cudaEventCreateWithFlags(&s->after, cudaEventDisableTiming)) != cudaSuccess)
            cudaEventDestroy(s->ready);
        s->have_event = s->have_stream && e == cudaSuccess;
        if (e != cudaSuccess) lerr = cuda_fail(e, "the communication stream");
    }
    int err = ts_err_agree(ch->comm, lerr);
    if (err) {
        state_free(s);
        return err;
    }
    ch->nccl = s;
    *out = s;
    return 0;
}

int ts_nccl_host(ts_nccl *s, size_t bytes)
{
    if (bytes <= s->host_bytes) return 0;
    if (s->host) cudaFreeHost(s->host);
    s->host = NULL;
    s->host_bytes = 0;
    cudaError_t e = cudaMallocHost(&s->host, bytes);
    if (e != cudaSuccess) {
        s->host = NULL;
        return TS_ERR(TS_ERR_CUDA, "rank %d: %zu bytes of pinned host staging: %s", ts_err_rank(), bytes,
                      cudaGetErrorString(e));
    }
    s->host_bytes = bytes;
    return 0;
}

/* ---- one GPU per rank ---- */

typedef struct gpu_id {
    char host[MPI_MAX_PROCESSOR_NAME + 1];
    char bus[32];
    int gpu, rank;
} gpu_id;

static int cmp_gpu(const void *x, const void *y)
{
    const gpu_id *a = x, *b = y;
    int c = strcmp(a->host, b->host);
    if (!c) c = strcmp(a->bus, b->bus);
    return c ? c : a->rank - b->rank;
}

/* Collective on comm: 0 when its ranks use distinct GPUs; else the same
 * error on every rank, naming the first GPU (in sorted order) that several
 * share. NCCL itself would refuse them inside ncclCommInitRank. */
static int gpus_distinct(const ts_nccl *s, MPI_Comm comm, const char *what)
{
    int err = 0, size, rank, len = 0;
    gpu_id me;
    memset(&me, 0, sizeof me);
    TS_MPI_TRY(MPI_Comm_size(comm, &size));
    TS_MPI_TRY(MPI_Comm_rank(comm, &rank));
    TS_MPI_TRY(MPI_Get_processor_name(me.host, &len));
    me.gpu = s->gpu;
    me.rank = rank;
    if (cudaDeviceGetPCIBusId(me.bus, (int)sizeof me.bus, s->gpu) != cudaSuccess) {
        cudaGetLastError();
        snprintf(me.bus, sizeof me.bus, "device %d", s->gpu);
    }
    gpu_id *all = TS_MALLOC(sizeof *all * (size_t)size);
    if (!all) return TS_ERR_NOMEM; /* a few KiB per rank: every rank fails alike */
    TS_MPI(MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, comm));
    qsort(all, (size_t)size, sizeof *all, cmp_gpu);
    for (int i = 0, j; i < size && !err; i = j) {
        for (j = i + 1; j < size && !strcmp(all[i].host, all[j].host) && !strcmp(all[i].bus, all[j].bus); j++)
            ;
        if (j - i > 1)
            err = TS_ERR(TS_ERR_UNSUPPORTED,
                         "%s: %d ranks share GPU %d (PCI %s) on node %s; NCCL needs one GPU per rank "
                         "(start at most as many ranks per node as it has GPUs)",
                         what, j - i, all[i].gpu, all[i].bus, all[i].host);
    }
cleanup:
    free(all);
    return err;
}

int ts_nccl_comm(ts_chan *ch, ts_nccl *s, MPI_Comm comm, ncclComm_t *slot, double deadline, const char *what)
{
    int rank, size, lerr;
    ncclUniqueId id;
    ncclComm_t nc = NULL;
    memset(&id, 0, sizeof id);
    TS_MPI_TRY(MPI_Comm_rank(comm, &rank));
    TS_MPI_TRY(MPI_Comm_size(comm, &size));
    lerr = gpus_distinct(s, comm, what);
    if (!lerr && rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) lerr = nccl_fail(NULL, r, what);
    }
    TS_TRY(ts_err_agree(ch->comm, lerr));
    TS_MPI_TRY(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, comm));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* initialisation and calls return at once; completion is polled below */
    ncclResult_t r = ncclCommInitRankConfig(&nc, size, id, rank, &cfg);
    if (r == ncclSuccess || r == ncclInProgress) {
        lerr = ts_nccl_enqueued(ch, &nc, r, deadline, what);
    } else {
        lerr = nccl_fail(nc, r, what);
        comm_abort(&nc);
    }
    int err = ts_err_agree(ch->comm, lerr);
    if (err) {
        comm_abort(&nc);
        return err;
    }
    *slot = nc;
    return 0;
}

/* the producer stream of ts_coll_device_order_after (NULL: none) */
static void *volatile order_stream;

void ts_coll_device_order_after(void *stream) { order_stream = stream; }

int ts_nccl_after_caller(ts_nccl *s)
{
    cudaStream_t p = (cudaStream_t)order_stream;
    cudaError_t e = cudaEventRecord(s->ready, 0);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s->stream, s->ready, 0);
    /* a non-blocking stream's work is not ordered by the default stream's event */
    if (e == cudaSuccess && p) e = cudaEventRecord(s->after, p);
    if (e == cudaSuccess && p) e = cudaStreamWaitEvent(s->stream, s->after, 0);
    return e == cudaSuccess ? 0 : cuda_fail(e, "ordering after the caller's work");
}

int ts_nccl_enqueued(ts_chan *ch, ncclComm_t *comm, ncclResult_t r, double deadline, const char *what)
{
    for (unsigned spins = 0; r == ncclInProgress; spins++) {
        if (ts_time_now() > deadline) {
            int err = late(what);
            comm_abort(comm);
            return err;
        }
        ts_coll_relax(spins, ch->shm.oversub);
        ncclResult_t q = ncclCommGetAsyncError(*comm, &r);
        if (q != ncclSuccess) r = q;
    }
    if (r == ncclSuccess) return 0;
    int err = nccl_fail(*comm, r, what);
    comm_abort(comm);
    return err;
}

int ts_nccl_wait(ts_chan *ch, ts_nccl *s, ncclComm_t *comm, double deadline, const char *what)
{
    /* TESSERA_FAULT (src/core/fault.h): this rank's NCCL calls of a step report NCCL's remote error, or never
     * complete, as when a peer's process or the network is gone */
    const int64_t step = ts_fault_step();
    const int inj_err = ts_fault_at(TS_FAULT_NCCL, step, NULL), inj_hang = ts_fault_at(TS_FAULT_HANG, step, "nccl");
    for (unsigned spins = 0;; spins++) {
        ncclResult_t ar = ncclSuccess, q = ncclCommGetAsyncError(*comm, &ar);
        if (q != ncclSuccess) ar = q;
        if (inj_hang && ar == ncclSuccess) ar = ncclInProgress;
        if (inj_err) {
            int err = TS_ERR(TS_ERR_CUDA, "rank %d: %s: NCCL: %s (injected by TESSERA_FAULT at step %lld)", ts_err_rank(),
                             what, ncclGetErrorString(ncclRemoteError), (long long)step);
            comm_abort(comm);
            return err;
        }
        if (ar != ncclSuccess && ar != ncclInProgress) {
            int err = nccl_fail(*comm, ar, what);
            comm_abort(comm);
            return err;
        }
        cudaError_t e = cudaStreamQuery(s->stream);
        if (e == cudaSuccess && ar == ncclSuccess) return 0;
        if (e != cudaSuccess && e != cudaErrorNotReady) {
            int err = cuda_fail(e, what);
            comm_abort(comm);
            return err;
        }
        if (ts_time_now() > deadline) {
            int err = late(what);
            comm_abort(comm);
            return err;
        }
        ts_coll_relax(spins, ch->shm.oversub);
    }
}

int ts_nccl_agree(ts_chan *ch, ncclComm_t *comm, int err)
{
    err = ts_err_agree(ch->comm, err);
    if (err) comm_abort(comm);
    return err;
}

/* ---- the flat algorithm ---- */

/* nccl: one NCCL allreduce over every rank of the channel (NCCL picks ring
 * or tree, NVLink or the network); AVG is a SUM, then a division on the
 * GPU, so the bits are those of every other algorithm. Needs one GPU per
 * rank. Cost: NCCL's, about 2(p-1)/p·n·β + 2(p-1)·α for its ring. */
int ts_allreduce_nccl(ts_chan *ch, const ts_coll_args *a)
{
    const double deadline = ts_nccl_deadline();
    ts_nccl *s = NULL;
    if (a->count == 0) return 0;
    TS_TRY(ts_nccl_state(ch, &s));
    if (!s->flat) TS_TRY(ts_nccl_comm(ch, s, ch->comm, &s->flat, deadline, "nccl"));
    int lerr = ts_nccl_after_caller(s);
    if (!lerr) {
        ncclResult_t r = ncclAllReduce(a->sendbuf, a->recvbuf, a->count, ts_nccl_type(a->dt), ts_nccl_op(a->op),
                                       s->flat, s->stream);
        lerr = ts_nccl_enqueued(ch, &s->flat, r, deadline, "nccl allreduce");
    }
    if (!lerr && a->op == TS_OP_AVG) lerr = ts_coll_device_avg(a->recvbuf, a->count, a->dt, ch->topo.size, s->stream);
    if (!lerr) lerr = ts_nccl_wait(ch, s, &s->flat, deadline, "nccl allreduce");
    return ts_nccl_agree(ch, &s->flat, lerr);
}

#else /* no CUDA */

int ts_coll_is_device(const void *p)
{
    (void)p;
    return 0;
}
int ts_coll_device_count(void) { return 0; }
int ts_coll_gpu(const ts_coll *c)
{
    (void)c;
    return -1;
}
void ts_nccl_chan_free(ts_chan *ch) { (void)ch; }
void ts_coll_device_order_after(void *stream) { (void)stream; }
int ts_coll_device_alloc(size_t bytes, int gpu, void **p)
{
    (void)bytes;
    (void)gpu;
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
int ts_coll_device_avg(void *p, size_t n, ts_dtype dt, int nranks, void *stream)
{
    (void)p; (void)n; (void)dt; (void)nranks; (void)stream;
    return TS_ERR(TS_ERR_UNSUPPORTED, "this build has no CUDA (configure --with-cuda)");
}
#endif
