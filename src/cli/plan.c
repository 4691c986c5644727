/* tessera plan CONFIG --nodes N --ranks-per-node R [...]: predicts step
 * time, exposed communication, memory per rank and parallel efficiency of
 * every dp x pp x sp layout on a machine of N nodes (src/train/plan.h),
 * names each layout's bottleneck and recommends the fastest that fits;
 * --curve prints the best layout's efficiency from 1 node to N. Runs on
 * rank 0 only (other ranks wait). */
#include "tsbuild.h"
#include "collectives/model.h"
#include "src/cli/cli.h"
#include "src/core/error.h"
#include "src/model/cost.h"
#include "src/optim/optim.h"
#include "src/train/plan.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void help(void)
{
    printf(
        "usage: tessera plan CONFIG [section.key=value ...] --nodes N --ranks-per-node R\n"
        "         [--net GBps,latency_us] [--gpus-per-node G [--gpu-tflops T] [--gpu-mem-gb M] [--link-GBps L]]\n"
        "         [--threads T] [--cores-per-node C] [--global-batch B] [--mem-per-rank-mb M]\n"
        "         [--calib FILE] [--tuning FILE] [--layout dp,pp,sp] [--curve] [--top K] [--json FILE]\n\n"
        "Predicts, for every dp x pp x sp layout of N x R ranks, the step time, the communication not hidden\n"
        "by compute, the memory per rank and the parallel efficiency of training the config's UNet3D, names\n"
        "each layout's bottleneck and recommends the fastest layout that fits in memory. The model\n"
        "(docs/scaling.md): the work of every layer kind from the model's shape over rates calibrated on this\n"
        "machine (--calib FILE from `tessera bench step CONFIG --calibrate FILE` on one rank; without it\n"
        "plan runs 2 steps of the config here first), each rank getting C / (R x T) of a core when ranks\n"
        "outnumber cores (--cores-per-node, default this machine's when N = 1, else R x T); collectives from\n"
        "the alpha-beta fits of `tessera bench coll --tune FILE` inside a node (--tuning, default coll.tuning\n"
        "or TESSERA_COLL_TUNING; else shared-memory defaults) and a hierarchical allreduce over a network of\n"
        "--net GB/s per node and latency in us between nodes (default 12.5,2: 100 Gb/s InfiniBand); the\n"
        "pipeline bubble (pp - 1) / m of a stage's work for m micro-batches of train.batch samples per\n"
        "replica (parallel.pp, as tessera train runs them); 90%% of\n"
        "halo transfers hidden behind compute. GPUs: --gpus-per-node G puts a rank on each GPU, convolutions\n"
        "at --gpu-tflops (default 50), other layers 20x one CPU rank, NVLink at --link-GBps (default 200),\n"
        "--gpu-mem-gb (default 80). The global batch (--global-batch, default train.batch x N x R) is the\n"
        "same for every layout: batch per replica = B / dp. Efficiency = (one rank's time for the global\n"
        "batch / ranks) / step time. --layout predicts one layout; --curve adds the best layout at 1, 2, 4, ... N\n"
        "nodes; --json FILE writes {\"layouts\": [{\"layout\", \"dp\", \"pp\", \"sp\", \"step_ms\", \"comm_ms\",\n"
        "\"mem_per_rank_mb\", \"efficiency\", \"bottleneck\", ...}, ...], \"best\", \"curve\", \"machine\", \"assumptions\"},\n"
        "layouts best first (feasible before infeasible).\n");
}

static int parse_int(const char *opt, const char *v, int lo, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > 1 << 24) return TS_ERR(TS_ERR_ARG, "plan: %s '%s' is not a count >= %d", opt, v, lo);
    *out = (int)x;
    return 0;
}
static int parse_num(const char *opt, const char *v, double *out)
{
    char *end;
    double x = strtod(v, &end);
    if (*end || !(x > 0)) return TS_ERR(TS_ERR_ARG, "plan: %s '%s' is not a positive number", opt, v);
    *out = x;
    return 0;
}

static void layout_name(const ts_plan_layout *l, char *b, size_t n)
{
    snprintf(b, n, "dp=%d pp=%d sp=%d", l->dp, l->pp, l->sp);
}

static void print_layout(const ts_plan_layout *l)
{
    char name[64];
    layout_name(l, name, sizeof name);
    if (!l->feasible) {
        printf("  %-22s  -- %s\n", name, l->why);
        return;
    }
    printf("  %-22s %10.1f %9.1f %9.1f %10.0f %7.1f%%  %s%s\n", name, l->step_s * 1e3, l->compute_s * 1e3,
           l->comm_s * 1e3, l->mem_mb, l->efficiency * 100, l->bottleneck, l->runnable ? "" : " [not trainable in this version]");
}

static cJSON *layout_json(const ts_plan_layout *l)
{
    char name[64];
    layout_name(l, name, sizeof name);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "layout", name);
    cJSON_AddNumberToObject(o, "dp", l->dp);
    cJSON_AddNumberToObject(o, "pp", l->pp);
    cJSON_AddNumberToObject(o, "sp", l->sp);
    cJSON_AddBoolToObject(o, "feasible", l->feasible);
    if (!l->feasible) {
        cJSON_AddStringToObject(o, "why", l->why);
        return o;
    }
    cJSON_AddBoolToObject(o, "trainable_now", l->runnable);
    cJSON_AddNumberToObject(o, "step_ms", l->step_s * 1e3);
    cJSON_AddNumberToObject(o, "comm_ms", l->comm_s * 1e3);
    cJSON_AddNumberToObject(o, "mem_per_rank_mb", l->mem_mb);
    cJSON_AddNumberToObject(o, "efficiency", l->efficiency);
    cJSON_AddNumberToObject(o, "samples_per_s", l->samples_per_s);
    cJSON_AddNumberToObject(o, "compute_ms", l->compute_s * 1e3);
    cJSON_AddNumberToObject(o, "bubble_ms", l->bubble_s * 1e3);
    cJSON_AddNumberToObject(o, "optimizer_ms", l->opt_s * 1e3);
    cJSON_AddNumberToObject(o, "grad_allreduce_ms", l->grad_s * 1e3);
    cJSON_AddNumberToObject(o, "grad_exposed_ms", l->grad_exposed_s * 1e3);
    cJSON_AddNumberToObject(o, "halo_ms", l->halo_s * 1e3);
    cJSON_AddNumberToObject(o, "spatial_sums_ms", l->sums_s * 1e3);
    cJSON_AddNumberToObject(o, "pipeline_p2p_ms", l->p2p_s * 1e3);
    cJSON_AddNumberToObject(o, "batch_per_replica", l->batch);
    cJSON_AddNumberToObject(o, "microbatches", l->micro);
    cJSON *b = cJSON_AddArrayToObject(o, "box");
    for (int d = 0; d < 3; d++) cJSON_AddItemToArray(b, cJSON_CreateNumber((double)l->box[d]));
    cJSON_AddStringToObject(o, "bottleneck", l->bottleneck);
    return o;
}

int ts_cli_plan(int argc, char **argv)
{
    int err = 0, nover = 0, nodes = 0, rpn = 0, gpn = 0, threads = 0, cores = 0, gbatch = 0, top = 12, curve = 0;
    int lay[3] = {0, 0, 0};
    double net_bw = 12.5, net_lat = 2.0, gpu_tf = 50, gpu_mem = 80, link = 200, mem_limit = 0;
    const char *cfgpath = NULL, *json = NULL, *calib_path = NULL, *tuning = NULL;
    char **over = calloc((size_t)argc + 1, sizeof *over);
    ts_config *cfg = NULL;
    ts_coll_fit *fits = NULL;
    ts_plan_layout *ls = NULL;
    cJSON *root = NULL;
    int nfits = 0, nl = 0, together = 0;
    if (!over) return TS_ERR(TS_ERR_NOMEM, "arguments");
    if (ts_cli_wants_help(argc, argv)) {
        if (ts_cli_rank() == 0) help();
        goto cleanup;
    }
    int lerr = 0;
    for (int i = 1; i < argc && !lerr; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = a[0] == '-' && strcmp(a, "--curve") != 0;
        if (takes && !v) {
            lerr = TS_ERR(TS_ERR_ARG, "plan: %s needs a value", a);
            break;
        }
        if (!strcmp(a, "--nodes")) lerr = parse_int(a, v, 1, &nodes);
        else if (!strcmp(a, "--ranks-per-node")) lerr = parse_int(a, v, 1, &rpn);
        else if (!strcmp(a, "--gpus-per-node")) lerr = parse_int(a, v, 1, &gpn);
        else if (!strcmp(a, "--threads")) lerr = parse_int(a, v, 1, &threads);
        else if (!strcmp(a, "--cores-per-node")) lerr = parse_int(a, v, 1, &cores);
        else if (!strcmp(a, "--global-batch")) lerr = parse_int(a, v, 1, &gbatch);
        else if (!strcmp(a, "--top")) lerr = parse_int(a, v, 1, &top);
        else if (!strcmp(a, "--gpu-tflops")) lerr = parse_num(a, v, &gpu_tf);
        else if (!strcmp(a, "--gpu-mem-gb")) lerr = parse_num(a, v, &gpu_mem);
        else if (!strcmp(a, "--link-GBps")) lerr = parse_num(a, v, &link);
        else if (!strcmp(a, "--mem-per-rank-mb")) lerr = parse_num(a, v, &mem_limit);
        else if (!strcmp(a, "--calib")) calib_path = v;
        else if (!strcmp(a, "--tuning")) tuning = v;
        else if (!strcmp(a, "--json")) json = v;
        else if (!strcmp(a, "--curve")) curve = 1;
        else if (!strcmp(a, "--net")) {
            if (sscanf(v, "%lf,%lf", &net_bw, &net_lat) != 2 || !(net_bw > 0) || !(net_lat >= 0))
                lerr = TS_ERR(TS_ERR_ARG, "plan: --net '%s': GBps,latency_us (e.g. 12.5,2)", v);
        } else if (!strcmp(a, "--layout")) {
            if (sscanf(v, "%d,%d,%d", &lay[0], &lay[1], &lay[2]) != 3 || lay[0] < 1 || lay[1] < 1 || lay[2] < 1)
                lerr = TS_ERR(TS_ERR_ARG, "plan: --layout '%s': dp,pp,sp", v);
        } else if (a[0] != '-' && strchr(a, '=')) {
            over[nover++] = argv[i];
            takes = 0;
        } else if (a[0] != '-' && !cfgpath) {
            cfgpath = a;
            takes = 0;
        } else {
            lerr = TS_ERR(TS_ERR_ARG, "plan: unexpected argument '%s' (see tessera plan --help)", a);
        }
        if (takes) i++;
    }
    if (!lerr && !cfgpath) lerr = TS_ERR(TS_ERR_ARG, "plan: no CONFIG given (see tessera plan --help)");
    if (!lerr && !nodes) lerr = TS_ERR(TS_ERR_ARG, "plan: --nodes N is required");
    if (!lerr && !rpn && !gpn) lerr = TS_ERR(TS_ERR_ARG, "plan: --ranks-per-node R (or --gpus-per-node G) is required");
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, lerr));
    TS_CHECK(ts_cli_load_config(cfgpath, nover, over, MPI_COMM_WORLD, &cfg));
    together = 1; /* from here the other ranks wait for rank 0's answer at the end */
    if (ts_cli_rank() != 0) goto cleanup; /* the model is local: rank 0 answers */
    /* the job */
    ts_plan_job job;
    memset(&job, 0, sizeof job);
    ts_optim_cfg oc;
    int64_t batch, micro, accum;
    TS_CHECK(ts_unet_cfg_from_config(cfg, &job.u));
    TS_CHECK(ts_optim_cfg_from_config(cfg, &oc));
    TS_CHECK(ts_config_get_int(cfg, "train.batch", &batch));
    TS_CHECK(ts_config_get_int(cfg, "train.accum", &accum));
    TS_CHECK(ts_config_get_int(cfg, "parallel.microbatches", &micro));
    job.nstate = ts_optim_state_count(&oc);
    job.micro_batch = (int)batch;
    (void)micro;
    job.prefetch = ts_config_isset(cfg, "data.path") ? 2 : 0;
    /* the machine */
    ts_plan_machine m;
    memset(&m, 0, sizeof m);
    m.nodes = nodes;
    m.gpus_per_node = gpn;
    m.ranks_per_node = rpn ? rpn : gpn;
    if (gpn && rpn && rpn != gpn) TS_FAIL(TS_ERR_ARG, "plan: with --gpus-per-node, ranks per node = GPUs per node");
    m.threads = threads ? threads : getenv("OMP_NUM_THREADS") ? atoi(getenv("OMP_NUM_THREADS")) : 1;
    if (m.threads < 1) m.threads = 1;
    long here = sysconf(_SC_NPROCESSORS_ONLN);
    m.cores_per_node = cores ? cores : nodes == 1 && !gpn && here > 0 ? (int)here : m.ranks_per_node * m.threads;
    m.net_GBps = net_bw;
    m.net_latency_us = net_lat;
    m.gpu_tflops = gpu_tf;
    m.gpu_mem_gb = gpu_mem;
    m.link_GBps = link;
    m.mem_per_rank_mb = mem_limit;
    m.halo_hidden = 0.9;
    TS_CHECK(ts_config_get_float(cfg, "parallel.bucket_mb", &m.bucket_mb));
    job.global_batch = gbatch ? gbatch : (int)(batch * accum) * nodes * m.ranks_per_node;
    /* collectives: the tuning table's fits */
    if (!tuning && ts_config_isset(cfg, "coll.tuning")) TS_CHECK(ts_config_get_str(cfg, "coll.tuning", &tuning));
    if (!tuning) tuning = getenv("TESSERA_COLL_TUNING");
    if (tuning) TS_CHECK(ts_coll_model_load(tuning, &fits, &nfits));
    m.fits = fits;
    m.nfits = nfits;
    /* compute rates */
    ts_plan_calib cal;
    if (calib_path) {
        TS_CHECK(ts_plan_calib_load(calib_path, &cal));
    } else {
        printf("plan: no --calib: calibrating here (2 steps of the config on this rank, %d thread%s) ...\n", m.threads,
               m.threads > 1 ? "s" : "");
        fflush(stdout);
        TS_CHECK(ts_plan_calibrate(cfg, 2, &cal));
    }
    printf("tessera plan: %s on %d node%s x %d rank%s per node (%d ranks, %d thread%s each, %d cores per node%s)\n",
           cfgpath, nodes, nodes > 1 ? "s" : "", m.ranks_per_node, m.ranks_per_node > 1 ? "s" : "",
           nodes * m.ranks_per_node, m.threads, m.threads > 1 ? "s" : "", m.cores_per_node,
           gpn ? ", a GPU per rank" : "");
    printf("  global batch %d, patch %lldx%lldx%lld, network %.1f GB/s and %.1f us between nodes\n", job.global_batch,
           (long long)job.u.patch[0], (long long)job.u.patch[1], (long long)job.u.patch[2], net_bw, net_lat);
    printf("  compute rates: %s; collectives: %s\n", cal.what,
           nfits ? tuning : "no tuning table with models (shared-memory defaults; `tessera bench coll --tune FILE`)");
    if (lay[0]) {
        nl = 1;
        ls = calloc(1, sizeof *ls);
        if (!ls) TS_FAIL(TS_ERR_NOMEM, "layout");
        ts_plan_predict(&job, &cal, &m, lay[0], lay[1], lay[2], ls);
    } else {
        TS_CHECK(ts_plan_layouts(&job, &cal, &m, &ls, &nl));
    }
    printf("\n  %-22s %10s %9s %9s %10s %8s  %s\n", "layout", "step ms", "compute", "comm", "MiB/rank", "effic.",
           "bottleneck");
    int shown = 0, nfeas = 0;
    for (int i = 0; i < nl; i++) nfeas += ls[i].feasible;
    for (int i = 0; i < nl && shown < top; i++, shown++) print_layout(&ls[i]);
    if (nl > shown) printf("  ... %d more (--top, --json)\n", nl - shown);
    const ts_plan_layout *best = NULL;
    for (int i = 0; i < nl && !best; i++)
        if (ls[i].feasible && ls[i].runnable) best = &ls[i];
    if (nfeas && ls[0].feasible && !ls[0].runnable && best)
        printf("\n  fastest: dp=%d pp=%d sp=%d (%.1f ms; not trainable in this version)",
               ls[0].dp, ls[0].pp, ls[0].sp, ls[0].step_s * 1e3);
    if (best)
        printf("\nrecommended: parallel.dp=%d parallel.pp=%d parallel.sp=%d: %.1f ms per step, %.1f samples/s, "
               "efficiency %.0f%%, %.0f MiB per rank; bottleneck: %s\n",
               best->dp, best->pp, best->sp, best->step_s * 1e3, best->samples_per_s, best->efficiency * 100,
               best->mem_mb, best->bottleneck);
    else
        printf("\nno layout fits: %s\n", nl ? ls[0].why : "none");
    root = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(root, "layouts");
    for (int i = 0; i < nl; i++) cJSON_AddItemToArray(arr, layout_json(&ls[i]));
    if (best) cJSON_AddItemToObject(root, "best", layout_json(best));
    if (curve) { /* the best runnable layout at 1, 2, 4, ... nodes, same batch per rank */
        printf("\n  %6s %7s  %-22s %10s %8s %12s\n", "nodes", "ranks", "best layout", "step ms", "effic.", "samples/s");
        cJSON *cv = cJSON_AddArrayToObject(root, "curve");
        for (int nn = 1; nn <= nodes; nn = nn * 2 > nodes && nn < nodes ? nodes : nn * 2) {
            ts_plan_machine mm = m;
            ts_plan_job jj = job;
            ts_plan_layout *cl = NULL;
            int cn = 0;
            mm.nodes = nn;
            jj.global_batch = gbatch ? gbatch : (int)(batch * accum) * nn * m.ranks_per_node;
            TS_CHECK(ts_plan_layouts(&jj, &cal, &mm, &cl, &cn));
            const ts_plan_layout *b = NULL;
            for (int i = 0; i < cn && !b; i++)
                if (cl[i].feasible && cl[i].runnable) b = &cl[i];
            if (b) {
                char name[64];
                layout_name(b, name, sizeof name);
                printf("  %6d %7d  %-22s %10.1f %7.1f%% %12.2f\n", nn, nn * m.ranks_per_node, name, b->step_s * 1e3,
                       b->efficiency * 100, b->samples_per_s);
                cJSON *e = layout_json(b);
                cJSON_AddNumberToObject(e, "nodes", nn);
                cJSON_AddNumberToObject(e, "global_batch", jj.global_batch);
                cJSON_AddItemToArray(cv, e);
            }
            free(cl);
            if (nn == nodes) break;
        }
    }
    cJSON *mj = cJSON_AddObjectToObject(root, "machine");
    cJSON_AddNumberToObject(mj, "nodes", nodes);
    cJSON_AddNumberToObject(mj, "ranks_per_node", m.ranks_per_node);
    cJSON_AddNumberToObject(mj, "threads", m.threads);
    cJSON_AddNumberToObject(mj, "cores_per_node", m.cores_per_node);
    cJSON_AddNumberToObject(mj, "gpus_per_node", gpn);
    cJSON_AddNumberToObject(mj, "net_GBps", net_bw);
    cJSON_AddNumberToObject(mj, "net_latency_us", net_lat);
    cJSON_AddNumberToObject(mj, "global_batch", job.global_batch);
    cJSON *as = cJSON_AddObjectToObject(root, "assumptions");
    cJSON_AddStringToObject(as, "compute", cal.what);
    cJSON_AddStringToObject(as, "collectives", nfits ? tuning : "defaults");
    cJSON_AddNumberToObject(as, "halo_hidden_fraction", m.halo_hidden);
    cJSON_AddNumberToObject(as, "bucket_mb", m.bucket_mb);
    if (gpn) cJSON_AddNumberToObject(as, "gpu_tflops", gpu_tf);
    if (json) {
        char *txt = cJSON_Print(root);
        FILE *f = txt ? fopen(json, "w") : NULL;
        int bad = !f || fprintf(f, "%s\n", txt) < 0;
        if (f && fclose(f)) bad = 1;
        free(txt);
        if (bad) TS_FAIL(TS_ERR_IO, "%s: cannot write", json);
    }
cleanup:
    cJSON_Delete(root);
    free(ls);
    free(fits);
    ts_config_destroy(&cfg);
    free(over);
    if (together) err = ts_err_agree(MPI_COMM_WORLD, err);
    return err;
}
