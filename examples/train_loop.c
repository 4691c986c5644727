/* examples/train_loop.c: a training loop of one's own over the engine: a
 * 3D U-Net, its loss, SGD and the data-parallel stepper (gradients averaged
 * over all ranks while backward runs) on random batches (ts_synthetic_batch,
 * the data `tessera train` uses when data.path is unset). It prints the
 * loss, the mean over ranks, per step, the way `tessera train` logs it in
 * metrics.jsonl: with the same config the two agree (tests/lib/examples.sh).
 * Checks that the loss went down. Arguments: none (the built-in config
 * below), a config file, or --print-config.
 * Build: mpicc train_loop.c $(pkg-config --cflags --libs tessera) */
#include <tessera/tessera.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char config[] = "[model]\nchannels = 4,8\nclasses = 2\nnorm = group\ngroups = 2\n"
                             "[data]\npatch = 16\n"
                             "[train]\nbatch = 2\nsteps = 12\nlr = 0.05\nmomentum = 0.9\nseed = 3\n";

/* Every call below returns 0 or a TS_ERR_* code; collective calls fail on every rank together. */
#define CHECK(call) do { if ((err = (call)) != 0) { fprintf(stderr, "%s: %s\n", #call, ts_err_message()); goto done; } } while (0)

int main(int argc, char **argv)
{
    int provided, rank, err = 0, bad = 0;
    if (argc > 1 && !strcmp(argv[1], "--print-config")) return fputs(config, stdout) == EOF;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided); /* the stepper's progress thread */
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    static const ts_cfg_key *const tables[] = {ts_model_config_keys, ts_optim_config_keys, ts_io_config_keys,
                                               ts_train_config_keys, ts_layout_config_keys, ts_coll_config_keys, NULL};
    ts_config *cfg = NULL;
    ts_unet *m = NULL;
    ts_coll *coll = NULL;
    ts_stepper *s = NULL;
    float *img = NULL;
    uint8_t *lab = NULL;
    ts_unet_cfg u;
    ts_optim opt = {0};
    int64_t steps, batch, seed;
    double bucket_mb, first = 0, loss = 0;
    CHECK(ts_config_create(tables, &cfg));
    CHECK(argc > 1 ? ts_config_load_file(cfg, argv[1]) : ts_config_load_string(cfg, config, "train_loop.c"));
    CHECK(ts_unet_cfg_from_config(cfg, &u));
    CHECK(ts_optim_cfg_from_config(cfg, &opt.cfg));
    CHECK(ts_config_get_int(cfg, "train.steps", &steps));
    CHECK(ts_config_get_int(cfg, "train.batch", &batch));
    CHECK(ts_config_get_int(cfg, "train.seed", &seed));
    CHECK(ts_config_get_float(cfg, "parallel.bucket_mb", &bucket_mb));
    opt.cfg.total_steps = steps; /* the schedule's length */

    CHECK(ts_unet_create(&u, ts_optim_state_count(&opt.cfg), &m)); /* parameters, gradients, optimizer state */
    CHECK(ts_unet_init(m, (uint64_t)seed));                         /* the same seed everywhere: identical replicas */
    CHECK(ts_coll_create(MPI_COMM_WORLD, NULL, &coll));             /* collective; duplicates MPI_COMM_WORLD */
    CHECK(ts_stepper_create(m, &opt, coll, bucket_mb, 0, NULL, &s));
    CHECK(ts_unet_setup(m, (int)batch, (int)u.patch[0], (int)u.patch[1], (int)u.patch[2]));
    const int64_t nv = u.patch[0] * u.patch[1] * u.patch[2], lo[3] = {0, 0, 0};
    img = malloc(sizeof *img * (size_t)(batch * u.in_channels * nv));
    lab = malloc((size_t)(batch * nv));
    if (!img || !lab) MPI_Abort(MPI_COMM_WORLD, 1);
    int64_t si[5] = {batch, u.in_channels, u.patch[0], u.patch[1], u.patch[2]}, sl[4] = {batch, u.patch[0], u.patch[1], u.patch[2]};
    ts_tensor image = ts_tensor_view(img, TS_FLOAT32, 5, si), label = ts_tensor_view(lab, TS_UINT8, 4, sl);

    for (int64_t step = 0; step < steps; step++) {
        /* this replica's batch of the step: replica = rank, as in `tessera train` */
        ts_synthetic_batch((uint64_t)seed, rank, step, (int)batch, u.in_channels, u.classes, u.patch, lo, u.patch, img, lab);
        CHECK(ts_stepper_micro(s, &image, &label, 1, 1, &loss)); /* forward, loss, backward; buckets go out */
        CHECK(ts_stepper_update(s, 1));                          /* wait for the averaged gradients; SGD */
        CHECK(ts_coll_allreduce(coll, TS_IN_PLACE, &loss, 1, TS_FLOAT64, TS_OP_AVG));
        if (rank == 0) printf("step %lld loss %.9g\n", (long long)step + 1, loss);
        if (step == 0) first = loss;
    }
    bad = !(loss < first); /* the check: training moved the weights the right way */
    if (rank == 0) printf("loss %.6f -> %.6f over %lld steps: %s\n", first, loss, (long long)steps, bad ? "NOT decreasing" : "decreasing");
done:
    ts_stepper_destroy(&s);
    ts_coll_destroy(&coll);
    ts_unet_destroy(&m);
    ts_config_destroy(&cfg);
    free(img);
    free(lab);
    MPI_Finalize();
    return err || bad ? 1 : 0;
}
