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

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <sys/socket.h>
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
    volatile int saving;    /* the end hook: 1 running (the node's other ranks run theirs), 2 done */
    char op[40], comm[24];
} slot;

/* Another node, as the watchdog probes it when a wait times out: its
 * leader (node-local rank 0) listens on a TCP port on every address it
 * has; a node that accepts no connection within PROBE_S on any of them is
 * lost or cut off (its processes killed, its link down) */
#define MAX_ADDRS 4
#define PROBE_S 2.0
typedef struct node_info {
    char name[64];
    uint32_t addr[MAX_ADDRS]; /* IPv4, network order; 0: none */
    int port;                 /* 0: no listener */
    int first, count;         /* its world ranks, as a list in node_ranks[first .. first + count) */
} node_info;

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
    int listen_fd;          /* the node leader's probe listener, else -1 */
    int nnodes, mynode;
    node_info *nodes;       /* every node (nnodes) */
    int *node_ranks;        /* world ranks grouped by node */
    ts_watchdog_end_fn on_end; /* run before the job is ended (emergency state), or NULL */
    char lost[256];         /* the nodes the last probe found lost: "n2 (ranks 2, 3)" */
    struct sigaction old_abrt; /* SIGABRT's action before the watchdog's */
} w;

/* SIGABRT while the end hook is set: the MPI library aborts a rank whose
 * node-local peer died in the middle of a transfer (UCX's cross-memory
 * copy finds the process gone). The handler only flags it and waits; the
 * watchdog thread checks that a peer is really gone (a rank of the node
 * ended, or a node that does not answer) and then ends the job as for a
 * lost peer (the hook writes this rank's state, exit status from the
 * hook); otherwise it lets the abort go on. */
static volatile sig_atomic_t aborting, abort_go;

static void on_abort(int sig)
{
    if (!w.on || !w.on_end || pthread_equal(pthread_self(), w.th)) abort_go = 1;
    aborting = 1;
    for (int i = 0; i < 400 && !abort_go; i++) { /* at most 40 s: the thread ends the process before */
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    sigaction(SIGABRT, &w.old_abrt, NULL);
    raise(sig);
}

void ts_watchdog_on_end(ts_watchdog_end_fn fn)
{
    w.on_end = fn;
}

void ts_watch_set_step(int64_t step)
{
    if (w.on) w.slots[w.me].step = step;
}

void ts_watch_enter(const char *op, const char *comm, size_t bytes)
{
    if (!w.on || !pthread_equal(pthread_self(), w.owner)) return;
    slot *s = &w.slots[w.me];
    if (s->depth > 0) { /* the outer wait stands */
        s->depth++;
        return;
    }
    /* what and since when first, then the depth that makes the watchdog's thread read them (it once saw
     * depth 1 with since still 0 and reported a wait of the machine's uptime at start-up) */
    snprintf(s->op, sizeof s->op, "%s", op ? op : "?");
    snprintf(s->comm, sizeof s->comm, "%s", comm ? comm : "");
    s->bytes = bytes;
    s->since = ts_time_now();
    __atomic_store_n(&s->depth, 1, __ATOMIC_RELEASE);
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
    const char *p = strrchr(buf, ')'); /* "pid (comm) S ppid pgrp session tty_nr tpgid flags ..." */
    if (!p || !p[1] || !p[2]) return 0;
    if (p[2] == 'Z' || p[2] == 'X') return 1;
    /* exiting (PF_EXITING in flags): killed and tearing down, not yet a
     * zombie; its memory can already be gone (a peer's cross-memory copy
     * fails), and on a loaded node the rest of the exit can take a while */
    unsigned long flags = 0;
    return sscanf(p + 3, "%*d %*d %*d %*d %*d %lu", &flags) == 1 && (flags & 0x4ul);
}

/* ---- probing the other nodes over the network (node_info above) ---- */

/* a listener on every address, an ephemeral port (*port), close-on-exec, nonblocking */
static int probe_listen(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (fd < 0) return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

/* this machine's IPv4 addresses but loopback (at most MAX_ADDRS) */
static void my_addrs(uint32_t *out)
{
    struct ifaddrs *ifs = NULL;
    int n = 0;
    memset(out, 0, sizeof(uint32_t) * MAX_ADDRS);
    if (getifaddrs(&ifs) != 0) return;
    for (struct ifaddrs *i = ifs; i && n < MAX_ADDRS; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        const uint32_t a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
        if ((ntohl(a) >> 24) == 127) continue;
        out[n++] = a;
    }
    freeifaddrs(ifs);
}

/* Collective on w.world: the node table (every node's name, its leader's
 * listener and addresses, its ranks). A node whose leader has no listener
 * (no socket here) has port 0 and is not probed. */
static int gather_nodes(int rank, int size)
{
    typedef struct {
        int leader, port;
        uint32_t addr[MAX_ADDRS];
        char host[64];
    } rec;
    rec mine;
    memset(&mine, 0, sizeof mine);
    mine.leader = rank;
    TS_MPI_TRY(MPI_Bcast(&mine.leader, 1, MPI_INT, 0, w.node));
    gethostname(mine.host, sizeof mine.host - 1);
    w.listen_fd = -1;
    if (w.me == 0) {
        w.listen_fd = probe_listen(&mine.port);
        if (w.listen_fd >= 0) my_addrs(mine.addr);
    }
    rec *all = calloc((size_t)size, sizeof *all);
    w.nodes = calloc((size_t)size, sizeof *w.nodes);
    w.node_ranks = calloc((size_t)size, sizeof *w.node_ranks);
    if (!all || !w.nodes || !w.node_ranks) {
        free(all);
        return TS_ERR(TS_ERR_NOMEM, "watchdog node table");
    }
    int rc = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, w.world);
    if (rc != MPI_SUCCESS) {
        free(all);
        return ts_err_mpi(rc, __FILE__, __LINE__, "MPI_Allgather (watchdog node table)");
    }
    w.nnodes = 0;
    int k = 0;
    for (int r = 0; r < size; r++) { /* nodes in the order of their leaders; ranks grouped */
        if (all[r].leader != r) continue;
        node_info *n = &w.nodes[w.nnodes];
        snprintf(n->name, sizeof n->name, "%s", all[r].host[0] ? all[r].host : "?");
        memcpy(n->addr, all[r].addr, sizeof n->addr);
        n->port = all[r].port;
        n->first = k;
        for (int q = 0; q < size; q++)
            if (all[q].leader == r) w.node_ranks[k++] = q;
        n->count = k - n->first;
        if (r == all[rank].leader) w.mynode = w.nnodes;
        w.nnodes++;
    }
    free(all);
    return 0;
}

/* alive[j] = 1 if node j's listener accepted a connection within PROBE_S on any address */
static void probe_nodes(int *alive)
{
    int fds[64 * MAX_ADDRS], owner[64 * MAX_ADDRS], n = 0;
    for (int j = 0; j < w.nnodes; j++) alive[j] = j == w.mynode || w.nodes[j].port == 0; /* not probed: assumed */
    for (int j = 0; j < w.nnodes && n + MAX_ADDRS <= (int)(sizeof fds / sizeof *fds); j++) {
        if (alive[j]) continue;
        for (int a = 0; a < MAX_ADDRS && w.nodes[j].addr[a]; a++) {
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
            if (fd < 0) continue;
            struct sockaddr_in sa;
            memset(&sa, 0, sizeof sa);
            sa.sin_family = AF_INET;
            sa.sin_port = htons((uint16_t)w.nodes[j].port);
            sa.sin_addr.s_addr = w.nodes[j].addr[a];
            if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) alive[j] = 1;
            if (alive[j] || errno != EINPROGRESS) {
                close(fd);
                continue;
            }
            fds[n] = fd;
            owner[n++] = j;
        }
    }
    const double t0 = ts_time_now();
    int left = n;
    struct pollfd p[64 * MAX_ADDRS];
    for (int i = 0; i < n; i++) p[i] = (struct pollfd){fds[i], POLLOUT, 0};
    while (left > 0) {
        const int ms = (int)((PROBE_S - (ts_time_now() - t0)) * 1000);
        if (ms <= 0 || poll(p, (nfds_t)n, ms) <= 0) break;
        for (int i = 0; i < n; i++) {
            if (p[i].fd < 0 || !p[i].revents) continue;
            int e = 1;
            socklen_t len = sizeof e;
            if (getsockopt(p[i].fd, SOL_SOCKET, SO_ERROR, &e, &len) == 0 && e == 0) alive[owner[i]] = 1;
            close(p[i].fd);
            p[i].fd = -1;
            left--;
        }
    }
    for (int i = 0; i < n; i++)
        if (p[i].fd >= 0) close(p[i].fd);
}

/* " node n2 (ranks 2, 3) does not answer ...;" for every other node that
 * does not answer, or that they all do */
static size_t report_nodes(char *msg, size_t l, size_t cap)
{
    if (w.nnodes < 2 || l >= cap) return l;
    int alive[64];
    const int nn = w.nnodes < 64 ? w.nnodes : 64;
    probe_nodes(alive);
    int lost = 0;
    for (int j = 0; j < nn && l < cap; j++) {
        if (alive[j]) continue;
        const node_info *n = &w.nodes[j];
        lost++;
        const size_t l0 = l;
        l += (size_t)snprintf(msg + l, cap - l, " node %s (rank%s", n->name, n->count > 1 ? "s" : "");
        for (int i = 0; i < n->count && i < 16 && l < cap; i++)
            l += (size_t)snprintf(msg + l, cap - l, "%s %d", i ? "," : "", w.node_ranks[n->first + i]);
        if (l < cap) {
            size_t k = strlen(w.lost);
            snprintf(w.lost + k, sizeof w.lost - k, "%s%.*s%s)", k ? ", " : "", (int)(l - l0 - 6), msg + l0 + 6,
                     n->count > 16 ? ", ..." : ""); /* "n2 (ranks 2, 3)" */
            l += (size_t)snprintf(msg + l, cap - l, "%s) does not answer over the network within %.0f s: lost, or "
                                  "its link is down;", n->count > 16 ? ", ..." : "", PROBE_S);
        }
    }
    if (!lost && l < cap) l += (size_t)snprintf(msg + l, cap - l, " the other %d node(s) answer;", nn - 1);
    return l;
}

static void report(const char *why, double waited)
{
    const slot *me = &w.slots[w.me];
    char msg[4096];
    size_t l = (size_t)snprintf(msg, sizeof msg,
                                "tessera: error (rank %d): node %s: watchdog: %s after %.0f s in %s (%s, %zu bytes) at "
                                "step %lld;", me->world_rank, w.nodes ? w.nodes[w.mynode].name : "?", why, waited,
                                me->op, me->comm[0] ? me->comm : "-", me->bytes, (long long)me->step);
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
    l = report_nodes(msg, l, sizeof msg);
    if (l < sizeof msg) snprintf(msg + l, sizeof msg - l, " ending the job\n");
    fputs(msg, stderr);
    fflush(stderr);
}

/* The end: the hook (each rank writes what it holds; the node's other ranks see `saving` and run theirs at
 * once), then, after the node's ranks are done or 30 s, every rank of the node is killed */
static void end_job(const char *why, double waited)
{
    static int ending; /* the main thread (after an MPI error) and the watchdog's may both come: one goes on */
    if (__atomic_exchange_n(&ending, 1, __ATOMIC_SEQ_CST))
        for (;;) pause(); /* the other ends the process */
    slot *me = &w.slots[w.me];
    int status = 1;
    report(why, waited);
    if (w.on_end) {
        char lost[256];
        snprintf(lost, sizeof lost, "%s", w.lost);
        for (int i = 0; i < w.nlocal; i++) /* a dead rank of this node */
            if (i != w.me && pid_ended(w.slots[i].pid)) {
                size_t k = strlen(lost);
                snprintf(lost + k, sizeof lost - k, "%srank %d", k ? ", " : "", w.slots[i].world_rank);
            }
        me->saving = 1;
        status = w.on_end(why, lost, waited);
        me->saving = 2;
        const double t0 = ts_time_now();
        for (int busy = 1; busy && ts_time_now() - t0 < 30;) {
            busy = 0;
            for (int i = 0; i < w.nlocal; i++)
                if (i != w.me && !pid_ended(w.slots[i].pid) && w.slots[i].saving != 2) busy = 1;
            if (busy) usleep(50000);
        }
    }
    /* MPI_Abort can block behind the stuck wait (MPICH's lock), and a hung peer may ignore
     * SIGTERM: the node's ranks are ended directly; the launcher then ends the rest of the job
     * (or, without its clean-up, the other nodes' watchdogs do) */
    for (int i = 0; i < w.nlocal; i++) /* (a rank done saving exits by itself, with its status) */
        if (i != w.me && w.slots[i].pid > 0 && !(w.on_end && w.slots[i].saving == 2)) kill(w.slots[i].pid, SIGKILL);
    if (!w.on_end) kill(getpid(), SIGKILL);
    _exit(status);
}

/* a rank of this node ended (waiting up to wait_s for one to), or a node does not answer */
static int peer_gone(double wait_s)
{
    const double t0 = ts_time_now();
    for (;;) {
        for (int i = 0; i < w.nlocal; i++)
            if (i != w.me && pid_ended(w.slots[i].pid)) return 1;
        if (ts_time_now() - t0 >= wait_s) break;
        usleep(100000);
    }
    char scratch[1024];
    w.lost[0] = '\0';
    report_nodes(scratch, 0, sizeof scratch);
    const int lost = w.lost[0] != '\0';
    w.lost[0] = '\0'; /* (end_job's report probes again and names them) */
    return lost;
}

int ts_watchdog_end_if_peer_gone(const char *why)
{
    if (!w.on || !w.on_end || !peer_gone(2.0)) return 0;
    const slot *me = &w.slots[w.me];
    end_job(why, me->depth > 0 ? ts_time_now() - me->since : 0);
    return 1; /* (not reached: end_job exits) */
}

static void *watch(void *arg)
{
    (void)arg;
    while (!w.stop_thread) {
        usleep(250000);
        if (w.listen_fd >= 0) /* the probes of other nodes' watchdogs: the kernel answered them, drain the queue */
            for (int c; (c = accept(w.listen_fd, NULL, NULL)) >= 0;) close(c);
        const slot *me = &w.slots[w.me];
        if (aborting && !abort_go) { /* the MPI library aborts this rank: a lost peer, or not (a peer
                                      * killed may take a moment to be seen ending on a loaded node) */
            if (peer_gone(5.0))
                end_job("the MPI library aborted this rank (a peer gone in the middle of a transfer)",
                        me->depth > 0 ? ts_time_now() - me->since : 0);
            abort_go = 1; /* no peer is gone: the abort is this rank's own */
            continue;
        }
        if (w.on_end) /* a rank of this node is ending the job: this one saves what it holds too, waiting or not */
            for (int i = 0; i < w.nlocal; i++)
                if (i != w.me && w.slots[i].saving != 0)
                    end_job("another rank of this node lost a peer", me->depth > 0 ? ts_time_now() - me->since : 0);
        if (__atomic_load_n(&me->depth, __ATOMIC_ACQUIRE) <= 0) continue;
        const double waited = ts_time_now() - me->since;
        const char *why = NULL;
        if (waited > w.timeout) why = "no progress (fault.timeout)";
        else if (w.stop && *w.stop && waited > w.grace) why = "stop requested (a signal) while waiting";
        else
            for (int i = 0; i < w.nlocal; i++)
                if (i != w.me && pid_ended(w.slots[i].pid) && waited > 1.0)
                    why = "a rank of this node died";
        if (why && me->depth > 0) end_job(why, waited);
    }
    return NULL;
}

static void free_nodes(void)
{
    if (w.listen_fd >= 0) close(w.listen_fd);
    w.listen_fd = -1;
    free(w.nodes);
    free(w.node_ranks);
    w.nodes = NULL;
    w.node_ranks = NULL;
    w.nnodes = 0;
}

int ts_watchdog_start(MPI_Comm world, double timeout_s, volatile sig_atomic_t *stop, double grace_s)
{
    int err = 0, rank, size;
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
    TS_MPI(MPI_Comm_size(world, &size));
    w.listen_fd = -1;
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
    TS_CHECK(gather_nodes(rank, size));
    w.timeout = timeout_s;
    w.grace = grace_s;
    w.stop = stop;
    w.owner = pthread_self();
    w.on = 1;
    if (pthread_create(&w.th, NULL, watch, NULL) != 0) {
        w.on = 0;
        TS_FAIL(TS_ERR_INTERNAL, "cannot start the watchdog thread");
    }
    {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_abort;
        sigemptyset(&sa.sa_mask);
        aborting = abort_go = 0;
        sigaction(SIGABRT, &sa, &w.old_abrt);
    }
    return 0;
cleanup:
    free_nodes();
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
    sigaction(SIGABRT, &w.old_abrt, NULL);
    w.stop_thread = 1;
    pthread_join(w.th, NULL);
    w.on = 0;
    free_nodes();
    MPI_Win_free(&w.win);
    MPI_Comm_free(&w.node);
    MPI_Comm_free(&w.world);
}
