/* tessera train CONFIG [section.key=value ...]: data-parallel training
 * under mpiexec or srun (src/train/trainer.c). Owns the table of every
 * config key (ts_cli_all_keys), loading a config for any command and the
 * stop signals; the loop is the trainer's, a layout = auto choice the planner's. */
#include "tsbuild.h"
#include "collectives/coll.h"
#include "io/loader.h"
#include "src/bench/bench_layouts.h"
#include "src/cli/cli.h"
#include "src/core/error.h"
#include "src/model/unet.h"
#include "src/optim/loss_scale.h"
#include "src/optim/optim.h"
#include "src/parallel/layout.h"
#include "src/plan/plan_auto.h"
#include "src/train/trainer.h"

#include <libgen.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* every config key of tessera: any command accepts any config file */
const ts_cfg_key *const ts_cli_all_keys[] = {ts_model_config_keys, ts_optim_config_keys, ts_io_config_keys,
                                             ts_train_config_keys, ts_layout_config_keys, ts_coll_config_keys, ts_loss_scale_config_keys,
                                             NULL};

int ts_cli_load_config(const char *path, int nover, char **over, MPI_Comm comm, ts_config **out)
{
    int err = 0;
    ts_config *c = NULL;
    *out = NULL;
    err = ts_config_create(ts_cli_all_keys, &c);
    if (!err && path) err = ts_config_load_file(c, path);
    for (int i = 0; !err && i < nover; i++) err = ts_config_set_arg(c, over[i]);
    TS_CHECK(ts_err_agree(comm, err));
    TS_CHECK(ts_config_check_ranks(c, comm));
    *out = c;
    return 0;
cleanup:
    ts_config_destroy(&c);
    return err;
}

static void help(void)
{
    printf("usage: mpiexec.mpich -n N tessera train CONFIG [section.key=value ...]\n"
           "       srun tessera train CONFIG [section.key=value ...]\n\n"
           "Runs on the CPU, or with train.engine = cuda on GPUs (the plain UNet3D data parallel checked on\n"
           "an H200, not yet fast; the residual encoder, pipelines and spatial splits checked under the CPU's\n"
           "CUDA emulator only: docs/gpu.md). There the host keeps the master copy of the parameters and\n"
           "optimizer state; TESSERA_CUDA_STATE=device keeps them, the gradients and their reduction on the\n"
           "GPU (written without a GPU and checked under the CPU's CUDA emulator only).\n"
           "Trains the config's 3D U-Net on a grid of parallel.dp data-parallel replicas x parallel.pp\n"
           "pipeline stages x parallel.sp spatial pieces (= ranks): every replica trains its own samples;\n"
           "the network's layer units are cut into pp stages (parallel.pp_cut, auto: balanced by a timing\n"
           "pass) that pass parallel.microbatches micro-batches along with parallel.schedule = gpipe or\n"
           "1f1b; every spatial group splits each sample's volume into boxes (parallel.sp_dims, auto: depth\n"
           "first) and exchanges halos; gradient buckets are averaged by a communication thread while\n"
           "backward runs; global batch = train.batch x micro-batches (train.accum, or parallel.microbatches\n"
           "with a pipeline) x dp. The layout is printed and written to grid.json (and the cut to\n"
           "pipeline.json); run.mem_limit_mb checks the memory plan per rank at start (docs/parallelism.md).\n"
           "Writes the run directory (run.dir, default runs/<config name>): config.ini, metrics.jsonl,\n"
           "perf.json and ckpt/step-<N>/; ckpt.resume=auto continues from the newest checkpoint there.\n"
           "Without data.path the model trains on random data of the configured patch (for timing).\n"
           "SIGTERM or SIGUSR1 (e.g. `#SBATCH --signal=USR1@120`) on any rank: every rank finishes the step,\n"
           "a checkpoint is written and the command exits with status 75 and an error saying so; rerun it to\n"
           "resume (jobs/slurm/train.sbatch and jobs/pbs/train.pbs requeue the job on status 75).\n"
           "perf.json: every phase's time and counters (perf.papi_events) on every rank, min/mean/max/imbalance,\n"
           "IPC and GFLOP/s where they can be derived, the job ID; launches.jsonl: one line per start\n"
           "(docs/scaling.md). A world of 1 rank where srun or mpiexec started N tasks is refused.\n"
           "\nconfig keys:\n");
    ts_config *c = NULL;
    if (!ts_config_create(ts_cli_all_keys, &c)) ts_config_print_help(c, stdout);
    ts_config_destroy(&c);
}

/* parallel.layout other than given: the planner's table and the layout taken */
static void print_choice(const ts_config *cfg, const ts_plan_choice *c, int chosen)
{
    const char *v = "";
    ts_config_get_str(cfg, "parallel.layout", &v);
    printf("parallel.layout = %s: %d layout(s) of %d node(s) x %d rank(s) fit, global batch %d; rates from %s\n", v, c->n,
           c->nodes, c->ranks_per_node, c->global_batch, c->calib);
    printf("  %-22s %9s %6s %13s %10s %10s\n", "layout", "batch/rep", "micro", "predicted ms", "mem MiB", "timed ms");
    for (int i = 0; i < c->n; i++) {
        const ts_plan_layout *l = &c->layouts[i];
        char name[64], timed[32] = "-";
        snprintf(name, sizeof name, "dp %d x pp %d x sp %d", l->dp, l->pp, l->sp);
        if (c->measured_s && c->measured_s[i] > 0) snprintf(timed, sizeof timed, "%.1f", c->measured_s[i] * 1e3);
        printf("  %-22s %9d %6d %13.1f %10.0f %10s%s\n", name, l->batch, l->micro, l->step_s * 1e3, l->mem_mb, timed,
               i == chosen ? "   <- taken" : "");
    }
    if (c->measured_s)
        printf("  predictions within parallel.layout_tie = %g of the fastest were timed (1 warm-up, 2 steps each, in "
               "order then in reverse, each layout's faster kept); the fastest timed is taken\n", c->tie);
    fflush(stdout);
}

/* set by SIGTERM / SIGUSR1: the trainer checkpoints and stops at the end of the step */
static volatile sig_atomic_t stop_requested;
static void on_stop(int sig)
{
    (void)sig;
    stop_requested = 1;
}

int ts_cli_train(int argc, char **argv)
{
    int err = 0, nover = 0;
    const char *path = NULL;
    char **over = NULL, name[256] = "run";
    ts_config *cfg = NULL;
    if (ts_cli_wants_help(argc, argv)) {
        if (ts_cli_rank() == 0) help();
        return 0;
    }
    over = calloc((size_t)argc, sizeof *over);
    if (!over) return TS_ERR(TS_ERR_NOMEM, "arguments");
    int lerr = 0;
    for (int i = 1; i < argc && !lerr; i++) {
        if (argv[i][0] != '-' && strchr(argv[i], '=')) over[nover++] = argv[i];
        else if (!path && argv[i][0] != '-') path = argv[i];
        else lerr = TS_ERR(TS_ERR_ARG, "train: unexpected argument '%s' (see tessera train --help)", argv[i]);
    }
    if (!lerr && !path) lerr = TS_ERR(TS_ERR_ARG, "train: no CONFIG given (see tessera train --help)");
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    {
        char *tmp = strdup(path); /* basename may modify its argument */
        if (!tmp) TS_FAIL(TS_ERR_NOMEM, "arguments");
        snprintf(name, sizeof name, "%s", basename(tmp)); /* a file name: at most NAME_MAX (255) */
        free(tmp);
        char *dot = strrchr(name, '.');
        if (dot && dot != name) *dot = '\0';
    }
    TS_CHECK(ts_cli_load_config(path, nover, over, MPI_COMM_WORLD, &cfg));
    {
        ts_plan_choice pc;
        int chosen;
        err = ts_plan_layout_resolve(cfg, MPI_COMM_WORLD, ts_bench_step_measure, NULL, &pc, &chosen);
        if (!err && chosen >= 0 && ts_cli_rank() == 0) print_choice(cfg, &pc, chosen);
        ts_plan_choice_free(&pc);
        TS_CHECK(err);
    }
    struct sigaction sa, old_term, old_usr1;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGUSR1, &sa, &old_usr1);
    err = ts_train_run(cfg, MPI_COMM_WORLD, name, &stop_requested);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGUSR1, &old_usr1, NULL);
    if (err) goto cleanup;
cleanup:
    ts_config_destroy(&cfg);
    free(over);
    return err;
}
