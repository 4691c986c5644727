/* The CUDA emulator's NCCL (tests/nn/emu_include/nccl.h), for a build
 * configured --with-cuda=emu: a communicator is an MPI communicator of its
 * members, each collective one MPI call on the emulated device memory
 * (host memory), done when it returns. ncclCommInitRank learns its
 * members as NCCL does, from the unique id alone: each member leaves its
 * MPI_COMM_WORLD rank in a folder named by the id (under TMPDIR), waits
 * for all nranks, and the members create their communicator with
 * MPI_Comm_create_group. Like NCCL, two members on one device are refused
 * (ncclInvalidUsage). bf16 and fp16 are reduced in fp32 and rounded once. */
#include "tsbuild.h"

#include <nccl.h>

#include <mpi.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "src/core/dtype.h"

struct tsemu_nccl_comm {
    MPI_Comm comm;
    int rank, size;
    char last[256];
};

static char last_error[256];

static ncclResult_t fail(struct tsemu_nccl_comm *c, ncclResult_t r, const char *fmt, const char *what)
{
    snprintf(c ? c->last : last_error, sizeof last_error, fmt, what);
    return r;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

const char *ncclGetLastError(ncclComm_t c) { return c ? c->last : last_error; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static unsigned serial;
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    snprintf(id->internal, sizeof id->internal, "%ld-%ld-%ld-%u", (long)getpid(), (long)t.tv_sec, (long)t.tv_nsec,
             serial++);
    return ncclSuccess;
}

static void id_dir(const ncclUniqueId *id, char *dir, size_t n)
{
    const char *tmp = getenv("TMPDIR");
    char safe[129];
    size_t k = 0;
    for (; k < 128 && id->internal[k]; k++)
        safe[k] = (id->internal[k] >= '0' && id->internal[k] <= '9') || id->internal[k] == '-' ? id->internal[k] : '_';
    safe[k] = 0;
    snprintf(dir, n, "%s/tsemu-nccl-%s", tmp && *tmp ? tmp : "/tmp", safe);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, ncclConfig_t *cfg)
{
    (void)cfg; /* blocking or not: the emulator's calls are done when they return */
    if (!out || nranks < 1 || rank < 0 || rank >= nranks) return fail(NULL, ncclInvalidArgument, "%s", "ncclCommInitRank: arguments");
    *out = NULL;
    struct tsemu_nccl_comm *c = calloc(1, sizeof *c);
    int *members = calloc((size_t)nranks * 2, sizeof *members);
    if (!c || !members) {
        free(c);
        free(members);
        return fail(NULL, ncclSystemError, "%s", "ncclCommInitRank: out of memory");
    }
    int world, dev = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    cudaGetDevice(&dev);
    char dir[512], path[600], host[128] = "";
    gethostname(host, sizeof host - 1);
    id_dir(&id, dir, sizeof dir);
    if (mkdir(dir, 0700) && errno != EEXIST) {
        free(c);
        free(members);
        return fail(NULL, ncclSystemError, "ncclCommInitRank: mkdir %s", dir);
    }
    snprintf(path, sizeof path, "%s/%d", dir, rank);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "%d %d %s\n", world, dev, host) < 0 || fclose(f)) {
        free(c);
        free(members);
        return fail(NULL, ncclSystemError, "ncclCommInitRank: writing %s", path);
    }
    char (*hosts)[128] = calloc((size_t)nranks, sizeof *hosts);
    if (!hosts) {
        free(c);
        free(members);
        return fail(NULL, ncclSystemError, "%s", "ncclCommInitRank: out of memory");
    }
    for (int r = 0; r < nranks; r++) { /* every member's world rank and device, waiting up to 60 s */
        snprintf(path, sizeof path, "%s/%d", dir, r);
        int got = 0;
        for (int spin = 0; spin < 60000 && !got; spin++) {
            FILE *g = fopen(path, "r");
            char h[128] = "";
            if (g) {
                got = fscanf(g, "%d %d %127s", &members[2 * r], &members[2 * r + 1], h) == 3;
                fclose(g);
                if (got) memcpy(hosts[r], h, sizeof h);
            }
            if (!got) usleep(1000);
        }
        if (!got) {
            free(c);
            free(members);
            free(hosts);
            return fail(NULL, ncclRemoteError, "ncclCommInitRank: a member never arrived in %s", dir);
        }
    }
    int dup = 0;
    for (int r = 0; r < nranks && !dup; r++)
        for (int q = 0; q < r && !dup; q++) dup = members[2 * r + 1] == members[2 * q + 1] && !strcmp(hosts[r], hosts[q]);
    free(hosts);
    if (dup) {
        free(c);
        free(members);
        return fail(NULL, ncclInvalidUsage, "%s", "Duplicate GPU detected (the CUDA emulator: two ranks on one device of "
                    "one host)");
    }
    MPI_Group wg, g;
    int *ranks = malloc((size_t)nranks * sizeof *ranks);
    for (int r = 0; ranks && r < nranks; r++) ranks[r] = members[2 * r];
    int tag = 0;
    for (size_t k = 0; k < sizeof id.internal && id.internal[k]; k++) tag = (tag * 31 + id.internal[k]) & 0x3fff;
    int ok = ranks && MPI_Comm_group(MPI_COMM_WORLD, &wg) == MPI_SUCCESS &&
             MPI_Group_incl(wg, nranks, ranks, &g) == MPI_SUCCESS &&
             MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &c->comm) == MPI_SUCCESS;
    free(ranks);
    free(members);
    if (!ok) {
        free(c);
        return fail(NULL, ncclSystemError, "%s", "ncclCommInitRank: MPI_Comm_create_group");
    }
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    MPI_Barrier(c->comm); /* every member has read the folder: the first removes it */
    if (rank == 0) {
        for (int r = 0; r < nranks; r++) {
            snprintf(path, sizeof path, "%s/%d", dir, r);
            unlink(path);
        }
        rmdir(dir);
    }
    c->rank = rank;
    c->size = nranks;
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *c, int nranks, ncclUniqueId id, int rank)
{
    return ncclCommInitRankConfig(c, nranks, id, rank, NULL);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r)
{
    if (!c || !r) return ncclInvalidArgument;
    *r = ncclSuccess;
    return ncclSuccess;
}

static ncclResult_t release(ncclComm_t c)
{
    if (!c) return ncclInvalidArgument;
    MPI_Comm_free(&c->comm);
    free(c);
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t c) { return c ? ncclSuccess : ncclInvalidArgument; }
ncclResult_t ncclCommDestroy(ncclComm_t c) { return release(c); }
ncclResult_t ncclCommAbort(ncclComm_t c) { return release(c); }
ncclResult_t ncclGroupStart(void) { return ncclSuccess; } /* each call below is done when it returns */
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

static int mpi_type(ncclDataType_t t, MPI_Datatype *m, size_t *bytes)
{
    switch (t) {
    case ncclInt8: *m = MPI_INT8_T; *bytes = 1; return 1;
    case ncclUint8: *m = MPI_UINT8_T; *bytes = 1; return 1;
    case ncclInt32: *m = MPI_INT32_T; *bytes = 4; return 1;
    case ncclUint32: *m = MPI_UINT32_T; *bytes = 4; return 1;
    case ncclInt64: *m = MPI_INT64_T; *bytes = 8; return 1;
    case ncclUint64: *m = MPI_UINT64_T; *bytes = 8; return 1;
    case ncclFloat32: *m = MPI_FLOAT; *bytes = 4; return 1;
    case ncclFloat64: *m = MPI_DOUBLE; *bytes = 8; return 1;
    case ncclFloat16: case ncclBfloat16: *m = MPI_FLOAT; *bytes = 2; return 1; /* widened below */
    }
    return 0;
}

static int mpi_op(ncclRedOp_t op, MPI_Op *m)
{
    switch (op) {
    case ncclSum: case ncclAvg: *m = MPI_SUM; return 1;
    case ncclProd: *m = MPI_PROD; return 1;
    case ncclMax: *m = MPI_MAX; return 1;
    case ncclMin: *m = MPI_MIN; return 1;
    }
    return 0;
}

static int half(ncclDataType_t t) { return t == ncclFloat16 || t == ncclBfloat16; }

static void widen(ncclDataType_t t, const void *src, float *dst, size_t n)
{
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = t == ncclBfloat16 ? ts_bf16_to_f32(s[i]) : ts_f16_to_f32(s[i]);
}

static void narrow(ncclDataType_t t, const float *src, void *dst, size_t n, double scale)
{
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) {
        const float v = (float)(src[i] * scale);
        d[i] = t == ncclBfloat16 ? ts_f32_to_bf16(v) : ts_f32_to_f16(v);
    }
}

/* the average after the sum, in the buffer's own type */
static void average(ncclDataType_t t, void *p, size_t n, int size)
{
    if (t == ncclFloat32)
        for (size_t i = 0; i < n; i++) ((float *)p)[i] /= (float)size;
    else if (t == ncclFloat64)
        for (size_t i = 0; i < n; i++) ((double *)p)[i] /= size;
    else if (t == ncclInt32)
        for (size_t i = 0; i < n; i++) ((int32_t *)p)[i] /= size;
    else if (t == ncclInt64)
        for (size_t i = 0; i < n; i++) ((int64_t *)p)[i] /= size;
}

/* one reduction: kind 0 allreduce (count elements), 1 reduce-scatter (count per rank) */
static ncclResult_t reduce(int kind, const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t c)
{
    MPI_Datatype mt;
    MPI_Op mo;
    size_t bytes;
    if (!c) return ncclInvalidArgument;
    if (!mpi_type(t, &mt, &bytes) || !mpi_op(op, &mo)) return fail(c, ncclInvalidArgument, "%s", "reduction: type or op");
    if (count > (size_t)1 << 30) return fail(c, ncclInvalidArgument, "%s", "reduction: count over the emulator's 2^30");
    const size_t in_n = kind ? count * (size_t)c->size : count;
    int rc;
    if (half(t)) {
        float *a = malloc((in_n + count) * sizeof *a);
        if (!a) return fail(c, ncclSystemError, "%s", "out of memory");
        widen(t, send, a, in_n);
        rc = kind ? MPI_Reduce_scatter_block(a, a + in_n, (int)count, MPI_FLOAT, mo, c->comm)
                  : MPI_Allreduce(MPI_IN_PLACE, a, (int)count, MPI_FLOAT, mo, c->comm);
        if (rc == MPI_SUCCESS) narrow(t, kind ? a + in_n : a, recv, count, op == ncclAvg ? 1.0 / c->size : 1.0);
        free(a);
    } else {
        const void *s = !kind && send == recv ? MPI_IN_PLACE : send;
        void *tmp = NULL;
        if (kind && (const char *)recv + count * bytes > (const char *)send &&
            (const char *)recv < (const char *)send + in_n * bytes) { /* in place: recv is a part of send */
            if (!(tmp = malloc(in_n * bytes))) return fail(c, ncclSystemError, "%s", "out of memory");
            memcpy(tmp, send, in_n * bytes);
            s = tmp;
        }
        rc = kind ? MPI_Reduce_scatter_block(s, recv, (int)count, mt, mo, c->comm)
                  : MPI_Allreduce(s, recv, (int)count, mt, mo, c->comm);
        free(tmp);
        if (rc == MPI_SUCCESS && op == ncclAvg) average(t, recv, count, c->size);
    }
    return rc == MPI_SUCCESS ? ncclSuccess : fail(c, ncclSystemError, "%s", "MPI under the emulated NCCL failed");
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s)
{
    (void)s;
    return reduce(0, send, recv, count, t, op, c);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t s)
{
    (void)s;
    return reduce(1, send, recv, recvcount, t, op, c);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t s)
{
    MPI_Datatype mt;
    size_t bytes;
    (void)s;
    if (!c || !mpi_type(t, &mt, &bytes)) return ncclInvalidArgument;
    if (sendcount * bytes > (size_t)1 << 30) return fail(c, ncclInvalidArgument, "%s", "allgather: over the emulator's 1 GiB");
    const char *in = send;
    /* in place when send is recv's own part */
    const int inplace = in == (const char *)recv + (size_t)c->rank * sendcount * bytes;
    const int rc = MPI_Allgather(inplace ? MPI_IN_PLACE : send, (int)(sendcount * bytes), MPI_BYTE, recv,
                                 (int)(sendcount * bytes), MPI_BYTE, c->comm);
    return rc == MPI_SUCCESS ? ncclSuccess : fail(c, ncclSystemError, "%s", "MPI under the emulated NCCL failed");
}
