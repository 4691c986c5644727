/* Pipeline parallelism: the schedules (GPipe: all forwards, then all
 * backwards; 1F1B: after a warm-up of forwards, one forward and one
 * backward in turn, so at most P - s micro-batches are in flight on stage
 * s), the cut of a layer sequence into stages balanced by cost, and the
 * nonblocking point-to-point messages between stages with their waiting
 * time (the bubble). Model-agnostic: the caller (src/parallel/pipeline.c) maps
 * its layers' boundary tensors onto messages. docs/parallelism.md has the
 * picture. */
#ifndef TS_PARALLEL_PIPE_H
#define TS_PARALLEL_PIPE_H

#include <mpi.h>
#include <stddef.h>

typedef enum { TS_PIPE_GPIPE = 0, TS_PIPE_1F1B } ts_pipe_kind;

typedef struct ts_pipe_op {
    int backward; /* 0: forward, 1: backward */
    int mb;       /* micro-batch */
} ts_pipe_op;

/* Local. The 2M operations of stage s (0 <= s < P) in order. 1F1B needs
 * M >= P (TS_ERR_CONFIG naming the keys otherwise). */
int ts_pipe_schedule(ts_pipe_kind k, int P, int s, int M, ts_pipe_op *ops);
/* Local. The most micro-batches whose activations stage s holds at once:
 * M for GPipe, min(M, P - s) for 1F1B. */
int ts_pipe_in_flight(ts_pipe_kind k, int P, int s, int M);
/* The idle fraction of a step of an ideal pipeline: (P - 1) / (M + P - 1). */
double ts_pipe_bubble(int P, int M);
/* Local. Parses "gpipe" / "1f1b". */
int ts_pipe_kind_parse(const char *s, ts_pipe_kind *k);
/* Local. The name parallel.schedule gives k: "gpipe" or "1f1b". */
const char *ts_pipe_kind_name(ts_pipe_kind k);

/* Local. Cuts n units of the given costs into P contiguous non-empty
 * stages minimising the most expensive stage; first[0..P] receives the
 * first unit of each stage (first[P] = n). P > n is TS_ERR_CONFIG. */
int ts_pipe_partition(const double *cost, int n, int P, int *first);

/* Point-to-point between stages: a set of nonblocking messages started
 * together and waited for together, with the time spent waiting. */
typedef struct ts_pipe_msgs {
    MPI_Request req[64];
    int n;
    double wait_s; /* accumulated seconds in ts_pipe_wait */
    double post_s; /* accumulated seconds posting */
    size_t bytes;  /* accumulated bytes sent */
} ts_pipe_msgs;

/* Local. Posts a receive / a send of n floats with peer and tag on comm
 * into m (at most 64 outstanding). */
int ts_pipe_irecv(ts_pipe_msgs *m, float *buf, size_t n, int peer, int tag, MPI_Comm comm);
int ts_pipe_isend(ts_pipe_msgs *m, const float *buf, size_t n, int peer, int tag, MPI_Comm comm);
/* Local. Progresses m's messages (MPI_Testall); empties m when all are done. */
void ts_pipe_test(ts_pipe_msgs *m);
/* Local. Waits for every message of m and empties it; the wait is timed. */
int ts_pipe_wait(ts_pipe_msgs *m);
/* Local. Cancels the receives of m that have not matched (receives posted
 * ahead for work an error cut short) and empties it; sends are waited for. */
void ts_pipe_cancel(ts_pipe_msgs *m);

#endif
