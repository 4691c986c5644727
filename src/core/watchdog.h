/* The watchdog: no job hangs silently. Every blocking wait of tessera
 * (collectives, halo and pipeline messages, shared-memory waits, error
 * agreement) is bracketed by ts_watch_enter / ts_watch_leave; a thread per
 * rank looks at the bracket twice a second, and when a wait has lasted
 * longer than the deadline (fault.timeout) it prints the operation, its
 * communicator, bytes and training step, and what the other ranks of its
 * node are doing (their operation and step, or that their process is
 * gone), then ends the job: it kills the node's ranks (MPI_Abort can block
 * behind the stuck wait; the launcher then ends the other nodes', or their
 * own watchdogs do). A peer process on the node that
 * has died ends the job at once; a stop request (SIGTERM) while a rank
 * waits ends it after `grace` seconds instead of the deadline. Other
 * nodes are probed over the network when the deadline passes: each node's
 * leader listens on a TCP port, and the message names the nodes (and their
 * ranks) whose leader does not accept a connection within 2 s. */
#ifndef TS_CORE_WATCHDOG_H
#define TS_CORE_WATCHDOG_H

#include <mpi.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* Collective on world: a node-shared status table, the thread. timeout_s
 * > 0. stop (may be NULL): the flag a stop signal sets. Calling it again
 * changes the deadline only (local). */
int ts_watchdog_start(MPI_Comm world, double timeout_s, volatile sig_atomic_t *stop, double grace_s);
/* Local: the deadline from now on (e.g. raised after warm-up to a multiple of the step time). */
void ts_watchdog_set_timeout(double timeout_s);
double ts_watchdog_timeout(void);
/* Collective on the world given to start. Stops the thread, frees the table. */
void ts_watchdog_stop(void);

/* Local, cheap (no lock, no system call), callable from any thread; the
 * calls nest (an inner wait inside an outer one keeps the outer's start).
 * op: a static string naming the wait ("allreduce", "halo", "pipeline
 * recv", ...); comm: a static name of the group ("dp x sp", "spatial"). */
void ts_watch_enter(const char *op, const char *comm, size_t bytes);
void ts_watch_leave(void);
/* A blocking MPI call (or any call that can wait for other ranks) bracketed
 * for the watchdog: TS_MPI(TS_WATCHED("bad-step agreement", MPI_Allreduce(...))).
 * Evaluates to the call's return code. */
static inline int ts_watched_rc(int rc)
{
    ts_watch_leave();
    return rc;
}
#define TS_WATCHED(op, call) (ts_watch_enter((op), "world", 0), ts_watched_rc(call))
/* Local. fn runs on the watchdog's thread when it ends the job, after the
 * report and before the node's ranks are killed, with why, the lost
 * nodes and ranks ("n2 (ranks 2, 3)", may be "") and how long the rank
 * had been waiting (0: not waiting); it must not use MPI. The
 * process then exits with the status fn returns (without fn: killed).
 * The node's other ranks run theirs too (at once, waiting or not), and the
 * ranks are killed when all are done or after 30 s. NULL: none. */
typedef int (*ts_watchdog_end_fn)(const char *why, const char *lost, double waited_s);
void ts_watchdog_on_end(ts_watchdog_end_fn fn);
/* Local, main thread. After an MPI error: if the end hook is set and a
 * peer is gone (a rank of this node ended, or a node that does not answer;
 * up to 2 s are given for a dying peer's process to end), ends the job as
 * the watchdog does (the report, the hook writes this rank's state, the
 * exit status from the hook) and never returns; else returns 0 (the error
 * is this rank's own). why names the error. */
int ts_watchdog_end_if_peer_gone(const char *why);
/* Local. The training step shown in reports (1-based; 0 outside training). */
void ts_watch_set_step(int64_t step);

#endif
