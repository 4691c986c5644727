/* The watchdog; see watchdog.h. The status table is an MPI-3 shared window
 * on the node (one slot per node-local rank, plain stores, read without
 * locks: a report may see a slot mid-update, which only blurs a message).
 * Only the thread that started the watchdog (the main thread) records its
 * waits: background threads (the collectives' progress thread, the loader)
 * have their own ways to finish. */
#include "tsbuild.h"
#include "src/core/watchdog.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <errno.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct slot {
    int pid, world_rank;
    volatile int depth;     /* nesting of the current wait; 0 = not waiting */
    volatile int64_t step;
    volatile double since;  /* start of the outermost wait (this process's clock) */
    volatile size_t bytes;
    char op[40], comm[24];
} slot;

static struct {
    int on;
    MPI_Comm world, node;
    MPI_Win win;
    slot *slots; /* node-local ranks' slots */
    int nlocal, me;
    pthread_t owner, th;
    volatile int stop_thread;
    volatile double timeout, grace;
    volatile sig_atomic_t *stop;
} w;

void ts_watch_set_step(int64_t step)
{
    if (w.on) w.slots[w.me].step = step;
}

void ts_watch_enter(const char *op, const char *comm, size_t bytes)
{
    if (!w.on || !pthread_equal(pthread_self(), w.owner)) return;
    slot *s = &w.slots[w.me];
    if (s->depth++ > 0) return; /* the outer wait stands */
    snprintf(s->op, sizeof s->op, "%s", op ? op : "?");
    snprintf(s->comm, sizeof s->comm, "%s", comm ? comm : "");
    s->bytes = bytes;
    s->since = ts_time_now();
}

void ts_watch_leave(void)
{
    if (!w.on || !pthread_equal(pthread_self(), w.owner)) return;
    slot *s = &w.slots[w.me];
    if (s->depth > 0) s->depth--;
}

/* 1 if process pid has ended: gone, or a zombie its parent has not reaped
 * yet (a launcher without clean-up keeps it so; kill(pid, 0) still succeeds) */
static int pid_ended(pid_t pid)
{
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0; /* no /proc: only the check above */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return p && (p[2] == 'Z' || p[2] == 'X');
}

static void report(const char *why, double waited)
{
    const slot *me = &w.slots[w.me];
    char msg[4096];
    size_t l = (size_t)snprintf(msg, sizeof msg,
                                "tessera: error (rank %d): watchdog: %s after %.0f s in %s (%s, %zu bytes) at step %lld;",
                                me->world_rank, why, waited, me->op, me->comm[0] ? me->comm : "-", me->bytes,
                                (long long)me->step);
    for (int i = 0; i < w.nlocal && l < sizeof msg; i++) {
        if (i == w.me) continue;
        const slot *o = &w.slots[i];
        if (pid_ended(o->pid))
            l += (size_t)snprintf(msg + l, sizeof msg - l, " rank %d is gone (process %d ended);", o->world_rank, o->pid);
        else if (o->depth > 0)
            l += (size_t)snprintf(msg + l, sizeof msg - l, " rank %d waits in %s at step %lld;", o->world_rank, o->op,
                                  (long long)o->step);
        else
            l += (size_t)snprintf(msg + l, sizeof msg - l, " rank %d has not arrived (working at step %lld);",
                                  o->world_rank, (long long)o->step);
    }
    if (l < sizeof msg)
        snprintf(msg + l, sizeof msg - l, "%s ending the job\n",
                 w.nlocal < 2 ? " other ranks are on other nodes (not visible here);" : "");
    fputs(msg, stderr);
    fflush(stderr);
}

static void *watch(void *arg)
{
    (void)arg;
    while (!w.stop_thread) {
        usleep(250000);
        const slot *me = &w.slots[w.me];
        if (me->depth <= 0) continue;
        const double waited = ts_time_now() - me->since;
        const char *why = NULL;
        if (waited > w.timeout) why = "no progress (fault.timeout)";
        else if (w.stop && *w.stop && waited > w.grace) why = "stop requested (a signal) while waiting";
        else
            for (int i = 0; i < w.nlocal; i++)
                if (i != w.me && pid_ended(w.slots[i].pid) && waited > 1.0)
                    why = "a rank of this node died";
        if (why && me->depth > 0) {
            report(why, waited);
            /* MPI_Abort can block behind the stuck wait (MPICH's lock), and a hung peer may ignore
             * SIGTERM: the node's ranks are ended directly; the launcher then ends the rest of the job
             * (or, without its clean-up, the other nodes' watchdogs do) */
            for (int i = 0; i < w.nlocal; i++)
                if (i != w.me && w.slots[i].pid > 0) kill(w.slots[i].pid, SIGKILL);
            kill(getpid(), SIGKILL);
            _exit(1);
        }
    }
    return NULL;
}

int ts_watchdog_start(MPI_Comm world, double timeout_s, volatile sig_atomic_t *stop, double grace_s)
{
    int err = 0, rank;
    if (timeout_s <= 0) return TS_ERR(TS_ERR_ARG, "fault.timeout = %g must be > 0", timeout_s);
    if (w.on) { /* already watching: only the settings change */
        w.timeout = timeout_s;
        w.grace = grace_s;
        w.stop = stop;
        return 0;
    }
    memset(&w, 0, sizeof w);
    w.world = w.node = MPI_COMM_NULL;
    w.win = MPI_WIN_NULL;
    TS_MPI(MPI_Comm_dup(world, &w.world));
    TS_MPI(MPI_Comm_rank(world, &rank));
    TS_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &w.node));
    TS_MPI(MPI_Comm_rank(w.node, &w.me));
    TS_MPI(MPI_Comm_size(w.node, &w.nlocal));
    {
        slot *mine;
        TS_MPI(MPI_Win_allocate_shared(sizeof(slot), sizeof(slot), MPI_INFO_NULL, w.node, &mine, &w.win));
        MPI_Aint sz;
        int du;
        TS_MPI(MPI_Win_shared_query(w.win, 0, &sz, &du, &w.slots));
        memset(mine, 0, sizeof *mine);
        mine->pid = (int)getpid();
        mine->world_rank = rank;
    }
    TS_MPI(MPI_Barrier(w.node)); /* every slot filled before anyone reads them */
    w.timeout = timeout_s;
    w.grace = grace_s;
    w.stop = stop;
    w.owner = pthread_self();
    w.on = 1;
    if (pthread_create(&w.th, NULL, watch, NULL) != 0) {
        w.on = 0;
        TS_FAIL(TS_ERR_INTERNAL, "cannot start the watchdog thread");
    }
    return 0;
cleanup:
    if (w.win != MPI_WIN_NULL) MPI_Win_free(&w.win);
    if (w.node != MPI_COMM_NULL) MPI_Comm_free(&w.node);
    if (w.world != MPI_COMM_NULL) MPI_Comm_free(&w.world);
    return err;
}

void ts_watchdog_set_timeout(double timeout_s)
{
    if (timeout_s > 0) w.timeout = timeout_s;
}
double ts_watchdog_timeout(void) { return w.on ? w.timeout : 0; }

void ts_watchdog_stop(void)
{
    if (!w.on) return;
    w.stop_thread = 1;
    pthread_join(w.th, NULL);
    w.on = 0;
    MPI_Win_free(&w.win);
    MPI_Comm_free(&w.node);
    MPI_Comm_free(&w.world);
}
