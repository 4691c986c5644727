/* tessera model init | run: fresh weights for a config, and one forward
 * (optionally one optimizer step) on tensors from HDF5 files, so that
 * tessera can be compared with another implementation (PyTorch) on the same
 * weights and inputs. One rank. */
#include "tsbuild.h"
#include "collectives/coll.h"
#include "src/cli/cli.h"
#include "src/cli/engine.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/infer/model_run.h"
#include "src/model/unet.h"
#include "src/model/weights.h"
#include "src/optim/optim.h"

#include <stdlib.h>
#include <string.h>

int ts_cli_engine_config(const char *path, int nover, char **over, ts_config **out)
{
    int err = 0;
    ts_config *c = NULL;
    TS_CHECK(ts_config_create(ts_cli_all_keys, &c)); /* any tessera config file works */
    if (path) TS_CHECK(ts_config_load_file(c, path));
    for (int i = 0; i < nover; i++) TS_CHECK(ts_config_set_arg(c, over[i]));
    *out = c;
    return 0;
cleanup:
    ts_config_destroy(&c);
    return err;
}

static void help(void)
{
    static const ts_cfg_key *const tables[] = {ts_model_config_keys, ts_optim_config_keys, NULL};
    printf("usage: tessera model init CONFIG --out WEIGHTS.h5 [--seed S] [section.key=value ...]\n"
           "       tessera model run CONFIG weights=WEIGHTS.h5 input=X.h5 output=Y.h5 [--eval] [--train-step]\n"
           "                         [section.key=value ...]\n\n"
           "init writes freshly initialised parameters and buffers (PyTorch's default initialisation) of the\n"
           "config's UNet3D to /params/<name> (seed: --seed, else train.seed).\n"
           "run loads /params from WEIGHTS.h5, reads /image [N, C, D, H, W] (float32) and, if present,\n"
           "/label [N, D, H, W] (uint8) from X.h5, runs one forward (batch norm in train mode unless --eval)\n"
           "and writes /logits [N, K, D, H, W] and /loss (scalar, when labels are given) to Y.h5. With\n"
           "--train-step it also runs backward and one step of the config's optimizer and writes the\n"
           "gradients (/grads/<name>) and the updated parameters and buffers (/params/<name>).\n"
           "File layouts: docs/formats-weights.md. Runs on one rank.\n\nconfig keys:\n");
    ts_config *c = NULL;
    if (!ts_config_create(tables, &c)) ts_config_print_help(c, stdout);
    ts_config_destroy(&c);
}

static int model_init(int argc, char **argv)
{
    int err = 0, nover = 0;
    const char *cfgpath = NULL, *out = NULL;
    char **over = calloc((size_t)argc, sizeof *over);
    long long seed = -1;
    ts_config *cfg = NULL;
    ts_unet *m = NULL;
    if (!over) TS_FAIL(TS_ERR_NOMEM, "arguments");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            char *end;
            seed = strtoll(argv[++i], &end, 10);
            if (*end || seed < 0) TS_FAIL(TS_ERR_ARG, "model init: --seed '%s' is not a non-negative integer", argv[i]);
        } else if (strchr(argv[i], '=') && argv[i][0] != '-') over[nover++] = argv[i];
        else if (!cfgpath && argv[i][0] != '-') cfgpath = argv[i];
        else TS_FAIL(TS_ERR_ARG, "model init: unexpected argument '%s' (see --help)", argv[i]);
    }
    if (!cfgpath) TS_FAIL(TS_ERR_ARG, "model init: no CONFIG given");
    if (!out) TS_FAIL(TS_ERR_ARG, "model init: --out WEIGHTS.h5 is required");
    TS_CHECK(ts_cli_engine_config(cfgpath, nover, over, &cfg));
    ts_unet_cfg u;
    TS_CHECK(ts_unet_cfg_from_config(cfg, &u));
    if (seed < 0) {
        int64_t s;
        TS_CHECK(ts_config_get_int(cfg, "train.seed", &s));
        seed = s;
    }
    TS_CHECK(ts_unet_create(&u, 0, &m));
    TS_CHECK(ts_unet_init(m, (uint64_t)seed));
    TS_CHECK(ts_weights_save(ts_unet_arena(m), out));
    ts_log(TS_LOG_INFO, "wrote %d tensors (%lld parameters) to %s", ts_unet_arena(m)->n,
           (long long)ts_arena_count(ts_unet_arena(m)), out);
cleanup:
    ts_unet_destroy(&m);
    ts_config_destroy(&cfg);
    free(over);
    return err;
}

static int model_run(int argc, char **argv)
{
    int err = 0, nover = 0, have_loss = 0;
    const char *cfgpath = NULL;
    ts_model_run_opts o = {0};
    char **over = calloc((size_t)argc, sizeof *over);
    ts_config *cfg = NULL;
    double loss = 0;
    if (!over) TS_FAIL(TS_ERR_NOMEM, "arguments");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--eval")) o.eval = 1;
        else if (!strcmp(a, "--train-step")) o.train_step = 1;
        else if (!strncmp(a, "weights=", 8)) o.weights = a + 8;
        else if (!strncmp(a, "input=", 6)) o.input = a + 6;
        else if (!strncmp(a, "output=", 7)) o.output = a + 7;
        else if (strchr(a, '=') && a[0] != '-') over[nover++] = argv[i];
        else if (!cfgpath && a[0] != '-') cfgpath = a;
        else TS_FAIL(TS_ERR_ARG, "model run: unexpected argument '%s' (see --help)", a);
    }
    if (!cfgpath) TS_FAIL(TS_ERR_ARG, "model run: no CONFIG given");
    if (!o.weights || !o.input || !o.output) TS_FAIL(TS_ERR_ARG, "model run: weights=, input= and output= are required");
    if (o.eval && o.train_step) TS_FAIL(TS_ERR_ARG, "model run: --train-step runs the forward in train mode; drop --eval");
    TS_CHECK(ts_cli_engine_config(cfgpath, nover, over, &cfg));
    TS_CHECK(ts_model_run_file(cfg, &o, &loss, &have_loss));
    if (have_loss) ts_log(TS_LOG_INFO, "loss %.7g", loss);
cleanup:
    ts_config_destroy(&cfg);
    free(over);
    return err;
}

int ts_cli_model(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || ts_cli_wants_help(argc, argv)) {
        if (ts_cli_rank() == 0) help();
        return argc < 2 ? TS_ERR(TS_ERR_ARG, "model: init or run?") : 0;
    }
    if (ts_cli_size() != 1) /* every rank reports the same error */
        return TS_ERR(TS_ERR_UNSUPPORTED, "model %s runs on one rank (got %d): start it without mpiexec or with -n 1",
                      argv[1], ts_cli_size());
    if (!strcmp(argv[1], "init")) return model_init(argc - 1, argv + 1);
    if (!strcmp(argv[1], "run")) return model_run(argc - 1, argv + 1);
    return TS_ERR(TS_ERR_ARG, "model: unknown sub-command '%s' (init, run)", argv[1]);
}
