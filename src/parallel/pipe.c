/* Pipeline schedules, balanced cuts and stage-to-stage messages; see
 * pipe.h. 1F1B is PipeDream-Flush (Narayanan et al., 2021): stage s runs
 * min(P - 1 - s, M) warm-up forwards, then alternates forward k + w and
 * backward k, then the remaining backwards; its bubble equals GPipe's,
 * (P - 1) / (M + P - 1) of a step, but it holds at most P - s micro-batches'
 * activations instead of M. */
#include "tsbuild.h"
#include "src/parallel/pipe.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/core/timer.h"
#include "src/core/watchdog.h"
#include "src/core/launch.h"
#include "collectives/coll.h"

#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* 1 when the node runs more threads than CPUs: waits then yield the CPU to
 * the stage they wait for (MPI's wait spins; docs/performance.md, "More
 * ranks than cores"). Decided once, locally: point-to-point needs no
 * agreement. */
static int yield_cpu(void)
{
    static int y = -1;
    if (y < 0) {
        int threads = 1;
#ifdef _OPENMP
        threads = omp_get_max_threads();
#endif
        y = ts_coll_oversubscribed(ts_launch_current()->local_size, threads);
    }
    return y;
}

int ts_pipe_kind_parse(const char *s, ts_pipe_kind *k)
{
    if (!strcmp(s, "gpipe")) *k = TS_PIPE_GPIPE;
    else if (!strcmp(s, "1f1b")) *k = TS_PIPE_1F1B;
    else return TS_ERR(TS_ERR_CONFIG, "parallel.schedule = '%s': gpipe or 1f1b", s);
    return 0;
}

int ts_pipe_schedule(ts_pipe_kind k, int P, int s, int M, ts_pipe_op *ops)
{
    if (P < 1 || s < 0 || s >= P || M < 1) return TS_ERR(TS_ERR_ARG, "pipeline schedule: stage %d of %d, %d micro-batches", s, P, M);
    int n = 0;
    if (k == TS_PIPE_GPIPE) {
        for (int i = 0; i < M; i++) ops[n++] = (ts_pipe_op){0, i};
        for (int i = 0; i < M; i++) ops[n++] = (ts_pipe_op){1, i};
        return 0;
    }
    if (M < P)
        return TS_ERR(TS_ERR_CONFIG, "parallel.schedule = 1f1b needs parallel.microbatches >= parallel.pp, but %d < %d "
                                     "(use more micro-batches, or parallel.schedule = gpipe)", M, P);
    const int w = P - 1 - s < M ? P - 1 - s : M;
    int f = 0, b = 0;
    for (; f < w; f++) ops[n++] = (ts_pipe_op){0, f};
    while (f < M) {
        ops[n++] = (ts_pipe_op){0, f++};
        ops[n++] = (ts_pipe_op){1, b++};
    }
    while (b < M) ops[n++] = (ts_pipe_op){1, b++};
    return 0;
}

int ts_pipe_in_flight(ts_pipe_kind k, int P, int s, int M)
{
    if (k == TS_PIPE_GPIPE) return M;
    return P - s < M ? P - s : M;
}

double ts_pipe_bubble(int P, int M) { return (double)(P - 1) / (double)(M + P - 1); }

int ts_pipe_partition(const double *cost, int n, int P, int *first)
{
    enum { NMAX = 64 };
    if (P < 1 || n < 1 || n > NMAX) return TS_ERR(TS_ERR_ARG, "pipeline cut: %d units, %d stages", n, P);
    if (P > n)
        return TS_ERR(TS_ERR_CONFIG, "parallel.pp = %d stages, but the model has only %d layer units to cut between "
                                     "(%d cut points): use parallel.pp <= %d", P, n, n - 1, n);
    /* best[p][i]: the smallest possible most-expensive stage cutting units [0, i) into p stages */
    double best[NMAX + 1][NMAX + 1], pre[NMAX + 1];
    int arg[NMAX + 1][NMAX + 1];
    pre[0] = 0;
    for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + cost[i];
    for (int i = 0; i <= n; i++) best[1][i] = pre[i];
    for (int p = 2; p <= P; p++)
        for (int i = p; i <= n; i++) {
            best[p][i] = -1;
            for (int j = p - 1; j < i; j++) { /* the last stage is [j, i) */
                const double c = best[p - 1][j] > pre[i] - pre[j] ? best[p - 1][j] : pre[i] - pre[j];
                if (best[p][i] < 0 || c < best[p][i]) {
                    best[p][i] = c;
                    arg[p][i] = j;
                }
            }
        }
    first[P] = n;
    for (int p = P, i = n; p >= 2; p--) {
        i = arg[p][i];
        first[p - 1] = i;
    }
    first[0] = 0;
    return 0;
}

static int post(ts_pipe_msgs *m, float *buf, size_t n, int peer, int tag, MPI_Comm comm, int send)
{
    if (m->n >= 64) return TS_ERR(TS_ERR_INTERNAL, "pipeline: more than 64 messages in flight");
    if (n > 0x7fffffff) return TS_ERR(TS_ERR_UNSUPPORTED, "pipeline message of %zu floats (above INT_MAX)", n);
    const double t0 = ts_time_now();
    int rc = send ? MPI_Isend(buf, (int)n, MPI_FLOAT, peer, tag, comm, &m->req[m->n])
                  : MPI_Irecv(buf, (int)n, MPI_FLOAT, peer, tag, comm, &m->req[m->n]);
    m->post_s += ts_time_now() - t0;
    if (rc != MPI_SUCCESS) return ts_err_mpi(rc, __FILE__, __LINE__, send ? "MPI_Isend (pipeline)" : "MPI_Irecv (pipeline)");
    m->n++;
    if (send) m->bytes += n * sizeof(float);
    return 0;
}

int ts_pipe_irecv(ts_pipe_msgs *m, float *buf, size_t n, int peer, int tag, MPI_Comm comm)
{
    return post(m, buf, n, peer, tag, comm, 0);
}

int ts_pipe_isend(ts_pipe_msgs *m, const float *buf, size_t n, int peer, int tag, MPI_Comm comm)
{
    return post(m, (float *)buf, n, peer, tag, comm, 1);
}

void ts_pipe_test(ts_pipe_msgs *m)
{
    if (m->n == 0) return;
    MPI_Status st[64];
    int flag = 0;
    const double t0 = ts_time_now();
    if (MPI_Testall(m->n, m->req, &flag, st) == MPI_SUCCESS && flag) m->n = 0; /* all done (requests freed) */
    m->post_s += ts_time_now() - t0;
}

int ts_pipe_wait(ts_pipe_msgs *m)
{
    if (m->n == 0) return 0;
    MPI_Status st[64];
    const double t0 = ts_time_now();
    ts_fault_point("pipeline");
    ts_watch_enter("pipeline messages", "pipeline", 0);
    int rc = ts_coll_waitall_mpi(m->req, m->n, st, yield_cpu());
    ts_watch_leave();
    m->wait_s += ts_time_now() - t0;
    m->n = 0;
    if (rc != MPI_SUCCESS) return ts_err_mpi(rc, __FILE__, __LINE__, "MPI_Waitall (pipeline)");
    return 0;
}

void ts_pipe_cancel(ts_pipe_msgs *m)
{
    if (m->n == 0) return;
    MPI_Status st[64];
    for (int i = 0; i < m->n; i++) MPI_Cancel(&m->req[i]);
    MPI_Waitall(m->n, m->req, st);
    m->n = 0;
}

const char *ts_pipe_kind_name(ts_pipe_kind k) { return k == TS_PIPE_GPIPE ? "gpipe" : "1f1b"; }
