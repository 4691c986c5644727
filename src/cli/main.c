/* tessera: entry point. Initialises MPI (MPI_THREAD_MULTIPLE), runs one
 * sub-command, and ends the job on every rank: a clean exit when all ranks
 * agree, MPI_Abort when some rank cannot reach the end (never a hang). */
#include "tsbuild.h"
#include "src/cli/cli.h"
#include "src/cli/engine.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/core/launch.h"
#include "src/core/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int ts_cli_convert(int argc, char **argv); /* src/cli/convert.c */
int ts_cli_synth(int argc, char **argv);   /* src/cli/synth.c */
int ts_cli_plan(int argc, char **argv);    /* src/cli/plan.c */
int ts_cli_plan_data(int argc, char **argv); /* src/cli/plan_data.c */

static const ts_cli_cmd commands[] = {
    {"info", "build options, MPI, ranks per node, counters, GPUs", ts_cli_info},
    {"bench", "benchmarks: `bench coll` (collectives, --tune), `bench step` (--calibrate), `bench io`", ts_cli_bench},
    {"model", "model init / model run: fresh weights; one forward (and optimizer step) on HDF5 files", ts_cli_model},
    {"convert", "NIfTI volumes or an MSD task folder to a (sharded) HDF5 dataset, in parallel", ts_cli_convert},
    {"synth", "synthetic 3D phantoms (shapes + smooth fields + noise) as a dataset", ts_cli_synth},
    {"train", "training of a 3D U-Net from a config on a dp x pp x sp grid (under mpiexec or srun)", ts_cli_train},
    {"infer", "sliding-window prediction of a NIfTI scan with a checkpoint; NIfTI mask out, Dice", ts_cli_infer},
    {"plan", "predicted step time, communication, memory and efficiency of dp/pp/sp layouts on N nodes", ts_cli_plan},
    {"plan-data", "a dataset's fingerprint; target spacing, patch and batch for a memory budget (nnU-Net's planner)",
     ts_cli_plan_data},
};
/* listed in --help until they exist (see README) */
static const char *const not_yet =
    "a GPU engine as fast as PyTorch, and the GPU for more than the plain data-parallel UNet3D:\n"
    "  train.engine = cuda (train, bench step, model run; the plain UNet3D, data parallel) ran\n"
    "  on an H200 on 2026-12-04 and matched PyTorch and the CPU (jobs/gpu/check.sh), at a\n"
    "  fraction of PyTorch's speed (7 against 93-99 samples/s, docs/gpu.md). tessera infer's\n"
    "  forwards on the GPU (the same engine), the residual encoder, pipelines and spatial splits\n"
    "  on the GPU and the state on the GPU (TESSERA_CUDA_STATE=device) are written and checked under\n"
    "  the CPU's CUDA emulator, not yet run on a GPU";

static int world_rank = 0, world_size = 1;
int ts_cli_rank(void) { return world_rank; }
int ts_cli_size(void) { return world_size; }

int ts_cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    }
    return 0;
}

int ts_cli_parse_bytes(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v < 0) return 1;
    double m = 1;
    if (*end == 'k' || *end == 'K') m = 1024.0, end++;
    else if (*end == 'm' || *end == 'M') m = 1048576.0, end++;
    else if (*end == 'g' || *end == 'G') m = 1073741824.0, end++;
    if (*end == 'i' && end[1] == 'B') end += 2;
    else if (*end == 'B') end++;
    if (*end) return 1;
    /* 2^63: the largest whole size a double converts to size_t exactly */
    if (!(v * m <= 9223372036854775808.0)) return 1;
    *out = (size_t)(v * m);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tessera [--version] [--help] COMMAND [ARGS]\n"
            "       mpiexec.mpich -n N tessera COMMAND [ARGS]   (or srun tessera ...)\n\n"
            "MPI-native training of 3D convolutional networks.\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nnot available yet in this version (see README.md):\n  %s", not_yet);
    fprintf(f, "\n\n`tessera COMMAND --help` describes a command. Environment: TESSERA_LOG=error|warn|info|debug,\n"
               "TESSERA_COLL_ALLREDUCE=<algorithm>, TESSERA_COLL_TUNING=<file>, TESSERA_RANKS_PER_NODE=k.\n");
}

/* Exit status of a command stopped on request (a signal before a time
 * limit) after writing the checkpoint that resumes it: EX_TEMPFAIL, which
 * the job scripts turn into a requeue (jobs/slurm/train.sbatch). */
#define TS_EXIT_STOPPED 75

/* Every rank reports its status; if all get here, all exit together with
 * the worst status (an error over a stop over success); if some rank never
 * arrives (it is stuck or gone), the others abort the job after a grace
 * period. */
static int finish(int err)
{
    int worst = err == TS_ERR_STOPPED ? 1 : err ? 2 : 0, done = 0;
    MPI_Request rq;
    if (MPI_Iallreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &rq) != MPI_SUCCESS)
        MPI_Abort(MPI_COMM_WORLD, 1);
    const char *g = getenv("TESSERA_EXIT_GRACE");
    double grace = g ? atof(g) : 30.0, waited = 0;
    struct timespec ts = {0, 2000000};
    while (!done && waited < grace) {
        MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
        if (!done) {
            nanosleep(&ts, NULL);
            waited += 0.002;
        }
    }
    if (!done) {
        fprintf(stderr, "tessera: rank %d: other ranks did not finish within %.0f s; aborting the job\n", world_rank,
                grace);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return ts_mpi_finalize(worst == 2 ? 1 : worst == 1 ? TS_EXIT_STOPPED : 0);
}

int main(int argc, char **argv)
{
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "tessera: MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    ts_err_set_rank(world_rank);
    ts_log_init(world_rank);
    if (provided < MPI_THREAD_MULTIPLE)
        ts_log_root(TS_LOG_WARN, "MPI provides thread level %d, not MPI_THREAD_MULTIPLE: nonblocking collectives "
                                 "are unavailable", provided);

    /* launch conventions: a world that does not match what the launcher
     * started is refused before any work (each such world is alone) */
    ts_launch launch;
    char warning[512];
    int err = ts_launch_detect(MPI_COMM_WORLD, &launch, warning, sizeof warning);
    if (err) {
        fprintf(stderr, "tessera: error (rank %d of %d, %s task %s): %s\n", world_rank, world_size, launch.launcher,
                getenv("SLURM_PROCID") ? getenv("SLURM_PROCID") : "?", ts_err_message());
        fflush(stderr);
        MPI_Finalize();
        return 1;
    }
    if (warning[0] && world_rank == 0) fprintf(stderr, "tessera: warning: %s\n", warning);
    /* OMP_NUM_THREADS unset, ranks of a node unbound: each its share of the node's CPUs */
    err = ts_err_agree(MPI_COMM_WORLD, ts_launch_split_cpus(MPI_COMM_WORLD, &launch));
    if (err) {
        fprintf(stderr, "tessera: error (rank %d): %s\n", world_rank, ts_err_message());
        return finish(err);
    }
    err = ts_err_agree(MPI_COMM_WORLD, ts_fault_init(world_rank)); /* TESSERA_FAULT (docs/testing.md) */
    if (err) {
        fprintf(stderr, "tessera: error (rank %d): %s\n", world_rank, ts_err_message());
        return finish(err);
    }
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (world_rank == 0) usage(stdout);
        if (argc < 2) err = TS_ERR(TS_ERR_ARG, "no command given");
    } else if (!strcmp(argv[1], "--version")) {
        if (world_rank == 0) printf("tessera %s (%s)\n", PACKAGE_VERSION, TS_BUILD_OPTIONS);
    } else {
        const ts_cli_cmd *cmd = NULL;
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (!strcmp(argv[1], commands[i].name)) cmd = &commands[i];
        if (cmd)
            err = cmd->run(argc - 1, argv + 1);
        else
            err = TS_ERR(TS_ERR_ARG, "unknown command '%s' (see tessera --help)", argv[1]);
    }
    if (err) {
        fprintf(stderr, "tessera: error (rank %d): %s\n", world_rank, ts_err_message());
        fflush(stderr);
    }
    return finish(err);
}
