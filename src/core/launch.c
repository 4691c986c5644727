/* Launch conventions; see launch.h. Owns what a job looks like from inside
 * (scheduler, job and array IDs, ranks, nodes, threads: ts_launch_detect,
 * collective on the world) and MPI_Finalize with a grace period
 * (ts_mpi_finalize). Reads environment variables, no config key. */
#define _GNU_SOURCE /* struct ucred, SO_PEERCRED */
#include "tsbuild.h"
#include "src/core/launch.h"
#include "src/core/error.h"

#include <math.h>
#include <poll.h>
#include <sys/socket.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static ts_launch current;

const ts_launch *ts_launch_current(void) { return &current; }

/* a positive integer environment variable, or 0 */
static int env_int(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    long x = strtol(v, &end, 10);
    return *end == '\0' && x > 0 && x < 1 << 30 ? (int)x : 0;
}

static void env_str(const char *name, char *out, size_t n)
{
    const char *v = getenv(name);
    snprintf(out, n, "%s", v ? v : "");
}

int ts_launch_detect(MPI_Comm world, ts_launch *l, char *warning, size_t nwarning)
{
    int err = 0;
    MPI_Comm node = MPI_COMM_NULL;
    memset(l, 0, sizeof *l);
    l->cpu_first = l->cpu_last = -1;
    if (warning && nwarning) warning[0] = '\0';
    TS_MPI(MPI_Comm_rank(world, &l->rank));
    TS_MPI(MPI_Comm_size(world, &l->size));
    TS_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, l->rank, MPI_INFO_NULL, &node));
    TS_MPI(MPI_Comm_rank(node, &l->local_rank));
    TS_MPI(MPI_Comm_size(node, &l->local_size));
    l->nodes = l->local_rank == 0;
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &l->nodes, 1, MPI_INT, MPI_SUM, world));
    l->threads = env_int("OMP_NUM_THREADS");
    if (gethostname(l->host, sizeof l->host - 1)) snprintf(l->host, sizeof l->host, "?");
    /* the scheduler */
    if (getenv("SLURM_JOB_ID")) {
        snprintf(l->scheduler, sizeof l->scheduler, "slurm");
        env_str("SLURM_JOB_ID", l->job_id, sizeof l->job_id);
        env_str("SLURM_JOB_NAME", l->job_name, sizeof l->job_name);
        if (getenv("SLURM_ARRAY_JOB_ID") && getenv("SLURM_ARRAY_TASK_ID"))
            snprintf(l->array_id, sizeof l->array_id, "%s_%s", getenv("SLURM_ARRAY_JOB_ID"), getenv("SLURM_ARRAY_TASK_ID"));
        l->restarts = env_int("SLURM_RESTART_COUNT");
        if ((l->allocated = env_int("SLURM_NTASKS"))) snprintf(l->allocated_from, sizeof l->allocated_from, "SLURM_NTASKS");
        else if ((l->allocated = env_int("SLURM_NPROCS")))
            snprintf(l->allocated_from, sizeof l->allocated_from, "SLURM_NPROCS");
    } else if (getenv("PBS_JOBID")) {
        snprintf(l->scheduler, sizeof l->scheduler, "pbs");
        env_str("PBS_JOBID", l->job_id, sizeof l->job_id);
        env_str("PBS_JOBNAME", l->job_name, sizeof l->job_name);
        const char *ai = getenv("PBS_ARRAY_INDEX") ? getenv("PBS_ARRAY_INDEX") : getenv("PBS_ARRAYID");
        if (ai) snprintf(l->array_id, sizeof l->array_id, "%s", ai);
        int rc = env_int("PBS_RUN_COUNT");
        l->restarts = rc > 0 ? rc - 1 : 0;
        if ((l->allocated = env_int("PBS_NP"))) snprintf(l->allocated_from, sizeof l->allocated_from, "PBS_NP");
    } else {
        snprintf(l->scheduler, sizeof l->scheduler, "none");
    }
    /* the launcher: PMI (MPICH's mpiexec, srun --mpi=pmi2) first: under
     * mpiexec inside Slurm, the srun step variables count hydra's proxies */
    if ((l->expected = env_int("PMI_SIZE"))) {
        snprintf(l->launcher, sizeof l->launcher, "PMI (mpiexec or srun --mpi=pmi2)");
        snprintf(l->expected_from, sizeof l->expected_from, "PMI_SIZE");
    } else if ((l->expected = env_int("OMPI_COMM_WORLD_SIZE"))) {
        snprintf(l->launcher, sizeof l->launcher, "mpirun (Open MPI)");
        snprintf(l->expected_from, sizeof l->expected_from, "OMPI_COMM_WORLD_SIZE");
    } else if (getenv("SLURM_STEP_ID") && (l->expected = env_int("SLURM_STEP_NUM_TASKS"))) {
        snprintf(l->launcher, sizeof l->launcher, "srun");
        snprintf(l->expected_from, sizeof l->expected_from, "SLURM_STEP_NUM_TASKS");
    } else if (getenv("PMIX_RANK")) {
        snprintf(l->launcher, sizeof l->launcher, "PMIx launcher");
    } else {
        snprintf(l->launcher, sizeof l->launcher, l->size == 1 ? "none (singleton)" : "unknown");
    }
    current = *l;
    if (l->expected > 0 && l->expected != l->size) {
        if (!strcmp(l->launcher, "mpirun (Open MPI)"))
            TS_FAIL(TS_ERR_CONFIG, "MPI sees a world of %d rank%s but Open MPI's mpirun started %d processes "
                    "(%s=%d): this tessera is built with MPICH, so each process is a job of its own; launch it with "
                    "mpiexec.mpich or srun", l->size, l->size == 1 ? "" : "s", l->expected, l->expected_from,
                    l->expected);
        TS_FAIL(TS_ERR_CONFIG, "MPI sees a world of %d rank%s but the launcher started %d tasks (%s=%d): the tasks "
                "did not connect into one MPI job (srun --mpi=none, or an MPI plugin MPICH does not speak), so each "
                "would train alone; use `srun --mpi=pmi2` or run `mpiexec.mpich` inside the allocation "
                "(jobs/slurm/*.sbatch do)", l->size, l->size == 1 ? "" : "s", l->expected, l->expected_from,
                l->expected);
    }
    if (l->size == 1 && l->expected == 0 && l->allocated > 1 && warning)
        snprintf(warning, nwarning, "running on 1 rank, but the job was allocated %d tasks (%s=%d): start tessera "
                 "with srun or mpiexec.mpich to use them", l->allocated, l->allocated_from, l->allocated);
cleanup:
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    return err;
}

int ts_launch_split_cpus(MPI_Comm world, ts_launch *l)
{
    int err = 0;
    MPI_Comm node = MPI_COMM_NULL;
    cpu_set_t mine, *all = NULL;
    l->threads_auto = 0;
    l->cpu_first = l->cpu_last = -1;
    l->binding[0] = '\0';
    const char *b = getenv("TESSERA_BIND");
    /* the same answer on every rank of a node: the environment is the launcher's */
    if (l->threads > 0 || l->local_size < 2 || (b && !strcmp(b, "none"))) goto cleanup;
    CPU_ZERO(&mine);
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_ZERO(&mine); /* (an empty set: nothing is split) */
    TS_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, l->rank, MPI_INFO_NULL, &node));
    all = malloc(sizeof *all * (size_t)l->local_size);
    if (!all) TS_FAIL(TS_ERR_NOMEM, "the node's CPU sets");
    TS_MPI(MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, node));
    const int n = CPU_COUNT(&mine);
    int same = n > 0;
    for (int r = 0; r < l->local_size; r++) same &= CPU_EQUAL(&all[r], &mine);
    if (!same) goto cleanup; /* bound by the launcher (or unreadable): left as they are */
    if (n < l->local_size) {
        l->threads_auto = 1;
    } else {
        int lo = (int)((long)l->local_rank * n / l->local_size), hi = (int)((long)(l->local_rank + 1) * n / l->local_size);
        cpu_set_t part;
        CPU_ZERO(&part);
        for (int c = 0, i = 0; c < CPU_SETSIZE && i < hi; c++)
            if (CPU_ISSET(c, &mine)) {
                if (i >= lo) {
                    CPU_SET(c, &part);
                    if (l->cpu_first < 0) l->cpu_first = c;
                    l->cpu_last = c;
                }
                i++;
            }
        if (sched_setaffinity(0, sizeof part, &part) != 0) l->cpu_first = l->cpu_last = -1; /* threads still split */
        l->threads_auto = hi - lo;
        /* every local rank's range, for tessera info */
        int fl[2] = {l->cpu_first, l->cpu_last}, *fls = malloc(sizeof(int) * 2 * (size_t)l->local_size);
        if (!fls) TS_FAIL(TS_ERR_NOMEM, "the node's CPU bindings");
        err = MPI_Allgather(fl, 2, MPI_INT, fls, 2, MPI_INT, node) == MPI_SUCCESS ? 0 : TS_ERR(TS_ERR_MPI, "MPI_Allgather of the CPU bindings");
        for (int r = 0; !err && r < l->local_size; r++) {
            const size_t k = strlen(l->binding);
            if (k + 24 >= sizeof l->binding) {
                snprintf(l->binding + k, sizeof l->binding - k, " ...");
                break;
            }
            if (fls[2 * r] == fls[2 * r + 1]) snprintf(l->binding + k, sizeof l->binding - k, "%s%d", r ? " " : "", fls[2 * r]);
            else snprintf(l->binding + k, sizeof l->binding - k, "%s%d-%d", r ? " " : "", fls[2 * r], fls[2 * r + 1]);
        }
        free(fls);
        if (err) goto cleanup;
    }
#ifdef _OPENMP
    omp_set_num_threads(l->threads_auto);
#endif
cleanup:
    free(all);
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    current.threads_auto = l->threads_auto;
    current.cpu_first = l->cpu_first;
    current.cpu_last = l->cpu_last;
    memcpy(current.binding, l->binding, sizeof current.binding);
    return err;
}

/* JSON string contents: quotes, backslashes and control characters escaped */
static void jstr(char *out, size_t n, const char *s)
{
    size_t k = 0;
    for (; *s && k + 7 < n; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[k++] = '\\';
            out[k++] = (char)c;
        } else if (c < 0x20) {
            k += (size_t)snprintf(out + k, n - k, "\\u%04x", c);
        } else {
            out[k++] = (char)c;
        }
    }
    out[k < n ? k : n - 1] = '\0';
}

void ts_launch_json(const ts_launch *l, char *buf, size_t n)
{
    char id[160], arr[160], name[300], host[160], lau[120];
    jstr(id, sizeof id, l->job_id);
    jstr(arr, sizeof arr, l->array_id);
    jstr(name, sizeof name, l->job_name);
    jstr(host, sizeof host, l->host);
    jstr(lau, sizeof lau, l->launcher);
    snprintf(buf, n,
             "{\"scheduler\": \"%s\", \"job_id\": \"%s\", \"array_id\": \"%s\", \"job_name\": \"%s\", "
             "\"restarts\": %d, \"launcher\": \"%s\", \"ranks\": %d, \"nodes\": %d, \"ranks_per_node\": %d, "
             "\"threads\": %d, \"threads_auto\": %d, \"cpu_first\": %d, \"cpu_last\": %d, \"launcher_tasks\": %d, "
             "\"allocated_tasks\": %d, \"host0\": \"%s\"}",
             l->scheduler, id, arr, name, l->restarts, lau, l->size, l->nodes, l->local_size, l->threads,
             l->threads_auto, l->cpu_first, l->cpu_last, l->expected, l->allocated, host);
}

/* MPI_Finalize of MPICH 4.0.x over UCX's TCP transport (Debian 12's MPICH
 * on Ethernet, and jobs/cluster) can hang: a rank still waiting for a peer
 * to acknowledge its endpoint's close while the peer already waits in the
 * PMI barrier that follows (MPICH fixed it in 4.2, pmodels/mpich#6596).
 * Ending a stuck rank after a grace period does not help: the exit of the
 * ranks in the PMI barrier releases the stuck one, which then enters the
 * barrier and makes Hydra write to a proxy that has gone (exit 255). So
 * with that MPICH on more than one node, ts_mpi_finalize does not call
 * MPI_Finalize: every rank has finished its work and agreed on the status,
 * a barrier says all are here (no message is in flight after it), stdio is
 * flushed and the process exits with the status. Under Hydra (mpiexec)
 * the rank first ends its PMI session itself (pmi_finalize below): a rank
 * whose PMI socket closes without that makes Hydra's proxy SIGKILL every
 * other rank of its node, and one still between the barrier and its exit
 * then ends by a signal with its last output lost and mpiexec exits
 * non-zero (7 of 129 runs of the cluster selftest's 8-rank grid, CI's
 * failure of 2026-12-04; 0 of 40 with it).
 * Slurm accepts a process that exits 0 without finalizing. TESSERA_FINALIZE=call|skip
 * overrides the choice. Any MPI_Finalize that has not returned after
 * TESSERA_FINALIZE_GRACE seconds (default 20) still ends the process with
 * that status. */
static int exit_status;
static void *finalize_guard(void *arg)
{
    const double grace = *(double *)arg;
    struct timespec ts = {(time_t)grace, (long)((grace - floor(grace)) * 1e9)};
    nanosleep(&ts, NULL);
    fprintf(stderr, "tessera: note: MPI_Finalize did not return within %.0f s (MPICH 4.0 over TCP); exiting with "
                    "status %d\n", grace, exit_status);
    fflush(stderr);
    _exit(exit_status);
    return NULL;
}

/* Local. Under Hydra (the parent process is its hydra_pmi_proxy, which
 * set PMI_FD): the PMI-1 finalize on the rank's PMI socket, what
 * MPI_Finalize sends last, so that the proxy takes the socket's close at
 * exit as normal. Waits up to 5 s for the acknowledgement. 0 when
 * acknowledged, -1 elsewhere or on any failure (the process exits all the
 * same). */
static int pmi_finalize(void)
{
    const char *p = getenv("PMI_FD");
    if (!p || !*p) return -1;
    char *end;
    const long fd = strtol(p, &end, 10);
    if (*end || fd < 0 || fd > 1 << 20) return -1;
    char path[64], comm[64] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", (int)getppid());
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    const int got = fgets(comm, sizeof comm, f) != NULL;
    fclose(f);
    if (!got || strncmp(comm, "hydra_pmi_proxy", 15)) return -1; /* Slurm's PMI-2 server speaks otherwise */
    /* still the proxy's end of the socket pair, not a descriptor reused since */
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (getsockopt((int)fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || cr.pid != getppid()) return -1;
    static const char cmd[] = "cmd=finalize\n";
    if (send((int)fd, cmd, sizeof cmd - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof cmd - 1)) return -1; /* a gone proxy: no SIGPIPE */
    char buf[128];
    size_t n = 0;
    struct pollfd q = {(int)fd, POLLIN, 0};
    while (n < sizeof buf - 1 && poll(&q, 1, 5000) == 1) {
        const ssize_t k = read((int)fd, buf + n, sizeof buf - 1 - n);
        if (k <= 0) break;
        n += (size_t)k;
        buf[n] = '\0';
        if (strchr(buf, '\n')) break;
    }
    buf[n] = '\0';
    return strncmp(buf, "cmd=finalize_ack", 16) ? -1 : 0;
}

/* Collective: 1 when MPI_Finalize is to be left out (see above). */
static int skip_finalize(void)
{
    const char *f = getenv("TESSERA_FINALIZE");
    if (f && !strcmp(f, "call")) return 0;
    if (f && !strcmp(f, "skip")) return 1;
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0, affected = 0;
    if (MPI_Get_library_version(v, &n) == MPI_SUCCESS) {
        const char *m = strstr(v, "MPICH Version:");
        int major = 0, minor = 0;
        if (m && sscanf(m + strlen("MPICH Version:"), " %d.%d", &major, &minor) == 2 && major == 4 && minor < 2 &&
            strstr(v, "ch4:ucx"))
            affected = 1;
    }
    /* every rank reads the same library, so all or none take the collective below; the node count is
     * ts_launch_detect's (agreed over the world), detected here where the program has not (the tests) */
    if (!affected) return 0;
    ts_launch l = current;
    if (!l.size && ts_launch_detect(MPI_COMM_WORLD, &l, NULL, 0)) return 0;
    return l.nodes > 1;
}

int ts_mpi_finalize(int status)
{
    static double grace;
    const char *g = getenv("TESSERA_FINALIZE_GRACE");
    grace = g && atof(g) > 0 ? atof(g) : 20.0;
    exit_status = status;
    pthread_t th;
    if (pthread_create(&th, NULL, finalize_guard, &grace) == 0) pthread_detach(th);
    if (skip_finalize()) {
        /* every rank has agreed on the status (the caller's contract): said once, before anything can
         * end a process, so that a launcher's complaint after it is known to come after the work */
        int me = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &me);
        if (me == 0) {
            fprintf(stderr, "tessera: note: every rank finished (exit status %d); ending without MPI_Finalize "
                            "(MPICH 4.0/4.1 over UCX on several nodes: it can hang there, docs/scaling.md)\n", status);
            fflush(stderr);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        fflush(NULL);
        (void)pmi_finalize();
        _exit(status);
    }
    MPI_Finalize();
    return status;
}
