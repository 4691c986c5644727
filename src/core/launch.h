/* How this job was launched: rank, size and node-local rank from MPI
 * (MPI_Comm_split_type), cross-checked with what the launcher and the
 * scheduler asked for (PMI_SIZE from mpiexec / srun --mpi=pmi2,
 * SLURM_STEP_NUM_TASKS from srun, OMPI_COMM_WORLD_SIZE from Open MPI's
 * mpirun, SLURM_NTASKS / PBS_NP of the allocation), the job's ID
 * (SLURM_JOB_ID, PBS_JOBID) and how often it was requeued. Recorded in
 * perf.json and the run directory (docs/scaling.md). */
#ifndef TS_CORE_LAUNCH_H
#define TS_CORE_LAUNCH_H

#include <mpi.h>
#include <stddef.h>

typedef struct ts_launch {
    int rank, size;             /* in the world communicator */
    int local_rank, local_size; /* on this node (MPI_COMM_TYPE_SHARED) */
    int nodes;                  /* distinct nodes */
    int threads;                /* OMP_NUM_THREADS (0: unset) */
    int threads_auto;           /* ts_launch_split_cpus: the threads it set per rank (0: none set) */
    int cpu_first, cpu_last;    /* ... and the CPUs this rank was bound to (-1: not bound) */
    char binding[160];          /* ... and every local rank's, in local-rank order: "0-7 8-15" ("" if none) */
    char scheduler[16];         /* "slurm", "pbs" or "none" */
    char job_id[64];            /* SLURM_JOB_ID / PBS_JOBID, "" outside a job */
    char array_id[64];          /* "JOB_TASK" of a job array, else "" */
    char job_name[128];         /* SLURM_JOB_NAME / PBS_JOBNAME */
    int restarts;               /* SLURM_RESTART_COUNT (times requeued), PBS_RUN_COUNT - 1 */
    char launcher[48];          /* "mpiexec/PMI", "srun", "mpirun (Open MPI)", "none (singleton)" */
    int expected;               /* tasks the launcher started (0: unknown) */
    char expected_from[40];     /* the variable that said so */
    int allocated;              /* tasks of the allocation (0: unknown) */
    char allocated_from[40];
    char host[64];
} ts_launch;

/* Collective on world. Fills l and checks it: a world whose size differs
 * from what the launcher started (srun --mpi=none -n 2 gives two 1-rank
 * worlds; Open MPI's mpirun starting an MPICH program does too) is
 * TS_ERR_CONFIG with a message naming the variables and the fix; not
 * agreed (each such world is its own job). A world of 1 rank inside an
 * allocation of N > 1 tasks outside any launcher is only noted in
 * *warning (may be NULL). The result is also kept for ts_launch_current. */
int ts_launch_detect(MPI_Comm world, ts_launch *l, char *warning, size_t nwarning);
/* Collective on world, after ts_launch_detect (l): ranks of a node that
 * share one CPU set (a launch that binds nothing: mpiexec's default) while
 * OMP_NUM_THREADS is unset would each start a thread per CPU of it, so N
 * ranks oversubscribe the node N times. Each such rank instead binds
 * itself to its own contiguous share of the set (local rank r of n: CPUs
 * r*c/n .. (r+1)*c/n - 1 of its c, in CPU-number order, so that a share
 * stays on one socket where the numbering follows them) and runs that
 * many OpenMP threads; with fewer CPUs than ranks, one thread each and no
 * binding. Nothing changes with OMP_NUM_THREADS set, with ranks bound by
 * the launcher (their sets differ), with one rank per node, or with
 * TESSERA_BIND=none. Records the choice in l (threads_auto, cpu_first,
 * cpu_last) and in what ts_launch_current returns. Call before the first
 * OpenMP parallel region (the threads inherit the binding). */
int ts_launch_split_cpus(MPI_Comm world, ts_launch *l);
/* Local. What the last ts_launch_detect found (zeros before it). */
const ts_launch *ts_launch_current(void);
/* Local. l as a JSON object (no trailing newline) into buf. */
void ts_launch_json(const ts_launch *l, char *buf, size_t n);

/* Collective on MPI_COMM_WORLD: MPI_Finalize, guarded. MPICH 4.0.x and
 * 4.1.x over UCX can hang in it between nodes (see launch.c): there, on more
 * than one node, the process exits with status after a barrier and, under
 * Hydra, its PMI finalize, without MPI_Finalize (TESSERA_FINALIZE=call|skip
 * overrides); a finalize that has not
 * returned after TESSERA_FINALIZE_GRACE seconds (default 20) exits with
 * status. Call it once every rank has finished its work and agreed on the
 * status. Returns status when MPI_Finalize returns. */
int ts_mpi_finalize(int status);

#endif
