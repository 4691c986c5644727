/* tessera plan CONFIG --nodes N --ranks-per-node R [...]: the arguments and
 * the table of the planner (src/plan/plan.h: the model, the layouts, the
 * curve, the JSON). Runs on rank 0 only (other ranks wait). */
#include "tsbuild.h"
#include "src/cli/cli.h"
#include "src/core/error.h"
#include "src/plan/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        "machine (--calib FILE from `tessera bench step CONFIG --calibrate FILE` on one rank: the patch and\n"
        "the boxes of sp 2, 4, 8, each box's rates used for the boxes near its size; without it plan runs 2\n"
        "steps of the config here first), each rank getting C / (R x T) of a core when ranks outnumber\n"
        "cores (--cores-per-node, a fraction where nodes share cores, as jobs/cluster's do; default this\n"
        "machine's when N = 1, else R x T); collectives from the alpha-beta fits of `tessera bench coll\n"
        "--tune FILE` (--tuning, default coll.tuning or TESSERA_COLL_TUNING; else shared-memory defaults):\n"
        "inside a node, and across nodes the fits measured on that many nodes, else a hierarchical\n"
        "allreduce over a network of --net GB/s per node and latency in us between nodes (default: the\n"
        "table's fit of 2 ranks on 2 nodes when it has one, else 12.5,2: 100 Gb/s InfiniBand); the\n"
        "pipeline bubble (pp - 1) / m of a stage's work for m micro-batches of train.batch samples per\n"
        "replica (parallel.pp, as tessera train runs them); halo transfers hidden behind the convolutions'\n"
        "interiors, at most 90%%. GPUs: --gpus-per-node G puts a rank on each GPU, convolutions\n"
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

static int parse(int argc, char **argv, ts_plan_request *q, const char **cfgpath, char **over, int *nover,
                 const char **json, int *top)
{
    int lerr = 0, *lay = q->layout;
    for (int i = 1; i < argc && !lerr; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = a[0] == '-' && strcmp(a, "--curve") != 0;
        if (takes && !v) {
            lerr = TS_ERR(TS_ERR_ARG, "plan: %s needs a value", a);
            break;
        }
        if (!strcmp(a, "--nodes")) lerr = parse_int(a, v, 1, &q->nodes);
        else if (!strcmp(a, "--ranks-per-node")) lerr = parse_int(a, v, 1, &q->ranks_per_node);
        else if (!strcmp(a, "--gpus-per-node")) lerr = parse_int(a, v, 1, &q->gpus_per_node);
        else if (!strcmp(a, "--threads")) lerr = parse_int(a, v, 1, &q->threads);
        else if (!strcmp(a, "--cores-per-node")) lerr = parse_num(a, v, &q->cores_per_node);
        else if (!strcmp(a, "--global-batch")) lerr = parse_int(a, v, 1, &q->global_batch);
        else if (!strcmp(a, "--top")) lerr = parse_int(a, v, 1, top);
        else if (!strcmp(a, "--gpu-tflops")) lerr = parse_num(a, v, &q->gpu_tflops);
        else if (!strcmp(a, "--gpu-mem-gb")) lerr = parse_num(a, v, &q->gpu_mem_gb);
        else if (!strcmp(a, "--link-GBps")) lerr = parse_num(a, v, &q->link_GBps);
        else if (!strcmp(a, "--mem-per-rank-mb")) lerr = parse_num(a, v, &q->mem_per_rank_mb);
        else if (!strcmp(a, "--calib")) q->calib = v;
        else if (!strcmp(a, "--tuning")) q->tuning = v;
        else if (!strcmp(a, "--json")) *json = v;
        else if (!strcmp(a, "--curve")) q->curve = 1;
        else if (!strcmp(a, "--net")) {
            if (sscanf(v, "%lf,%lf", &q->net_GBps, &q->net_latency_us) != 2 || !(q->net_GBps > 0) || !(q->net_latency_us >= 0))
                lerr = TS_ERR(TS_ERR_ARG, "plan: --net '%s': GBps,latency_us (e.g. 12.5,2)", v);
            q->net_given = 1;
        } else if (!strcmp(a, "--layout")) {
            if (sscanf(v, "%d,%d,%d", &lay[0], &lay[1], &lay[2]) != 3 || lay[0] < 1 || lay[1] < 1 || lay[2] < 1)
                lerr = TS_ERR(TS_ERR_ARG, "plan: --layout '%s': dp,pp,sp", v);
        } else if (a[0] != '-' && strchr(a, '=')) {
            over[(*nover)++] = argv[i];
            takes = 0;
        } else if (a[0] != '-' && !*cfgpath) {
            *cfgpath = a;
            takes = 0;
        } else {
            lerr = TS_ERR(TS_ERR_ARG, "plan: unexpected argument '%s' (see tessera plan --help)", a);
        }
        if (takes) i++;
    }
    if (!lerr && !*cfgpath) lerr = TS_ERR(TS_ERR_ARG, "plan: no CONFIG given (see tessera plan --help)");
    if (!lerr && !q->nodes) lerr = TS_ERR(TS_ERR_ARG, "plan: --nodes N is required");
    if (!lerr && !q->ranks_per_node && !q->gpus_per_node)
        lerr = TS_ERR(TS_ERR_ARG, "plan: --ranks-per-node R (or --gpus-per-node G) is required");
    return lerr;
}

static void print_header(const char *cfgpath, const ts_plan_request *q, const ts_plan_report *r)
{
    const ts_plan_machine *m = &r->machine;
    printf("tessera plan: %s on %d node%s x %d rank%s per node (%d ranks, %d thread%s each, %g cores per node%s)\n",
           cfgpath, q->nodes, q->nodes > 1 ? "s" : "", m->ranks_per_node, m->ranks_per_node > 1 ? "s" : "",
           q->nodes * m->ranks_per_node, m->threads, m->threads > 1 ? "s" : "", m->cores_per_node,
           q->gpus_per_node ? ", a GPU per rank" : "");
    printf("  global batch %d, patch %lldx%lldx%lld, network %.3g GB/s and %.1f us between nodes (%s)\n",
           r->job.global_batch, (long long)r->job.u.patch[0], (long long)r->job.u.patch[1], (long long)r->job.u.patch[2],
           m->net_GBps, m->net_latency_us, m->net_from);
    printf("  compute rates: %s; collectives: %s\n", r->cal.what,
           r->nfits ? r->tuning : "no tuning table with models (shared-memory defaults; `tessera bench coll --tune FILE`)");
}

static void print_layouts(const ts_plan_request *q, const ts_plan_report *r, int top)
{
    const ts_plan_layout *ls = r->layouts, *best = r->best;
    const int nl = r->nlayouts;
    printf("\n  %-22s %10s %9s %9s %10s %8s  %s\n", "layout", "step ms", "compute", "comm", "MiB/rank", "effic.",
           "bottleneck");
    int shown = 0;
    for (int i = 0; i < nl && shown < top; i++, shown++) print_layout(&ls[i]);
    if (nl > shown) printf("  ... %d more (--top, --json)\n", nl - shown);
    if (r->nfeasible && ls[0].feasible && !ls[0].runnable && best)
        printf("\n  fastest: dp=%d pp=%d sp=%d (%.1f ms; not trainable in this version)",
               ls[0].dp, ls[0].pp, ls[0].sp, ls[0].step_s * 1e3);
    if (best)
        printf("\nrecommended: parallel.dp=%d parallel.pp=%d parallel.sp=%d: %.1f ms per step, %.1f samples/s, "
               "efficiency %.0f%%, %.0f MiB per rank; bottleneck: %s\n",
               best->dp, best->pp, best->sp, best->step_s * 1e3, best->samples_per_s, best->efficiency * 100,
               best->mem_mb, best->bottleneck);
    else
        printf("\nno layout fits: %s\n", nl ? ls[0].why : "none");
    if (q->curve) {
        printf("\n  %6s %7s  %-22s %10s %8s %12s\n", "nodes", "ranks", "best layout", "step ms", "effic.", "samples/s");
        for (int i = 0; i < r->ncurve; i++) {
            const ts_plan_curve_point *c = &r->curve[i];
            char name[64];
            layout_name(&c->best, name, sizeof name);
            printf("  %6d %7d  %-22s %10.1f %7.1f%% %12.2f\n", c->nodes, c->ranks, name, c->best.step_s * 1e3,
                   c->best.efficiency * 100, c->best.samples_per_s);
        }
    }
}

int ts_cli_plan(int argc, char **argv)
{
    int err = 0, nover = 0, top = 12, together = 0;
    const char *cfgpath = NULL, *json = NULL;
    char **over = calloc((size_t)argc + 1, sizeof *over);
    ts_config *cfg = NULL;
    ts_plan_request q;
    ts_plan_report r;
    memset(&r, 0, sizeof r);
    ts_plan_request_default(&q);
    if (!over) return TS_ERR(TS_ERR_NOMEM, "arguments");
    if (ts_cli_wants_help(argc, argv)) {
        if (ts_cli_rank() == 0) help();
        goto cleanup;
    }
    TS_CHECK(ts_err_agree(MPI_COMM_WORLD, parse(argc, argv, &q, &cfgpath, over, &nover, &json, &top)));
    TS_CHECK(ts_cli_load_config(cfgpath, nover, over, MPI_COMM_WORLD, &cfg));
    together = 1; /* from here the other ranks wait for rank 0's answer at the end */
    if (ts_cli_rank() != 0) goto cleanup; /* the model is local: rank 0 answers */
    TS_CHECK(ts_plan_report_setup(cfg, &q, &r));
    if (r.calibrate) {
        printf("plan: no --calib: calibrating here (2 steps of the config on this rank, %d thread%s) ...\n",
               r.machine.threads, r.machine.threads > 1 ? "s" : "");
        fflush(stdout);
    }
    TS_CHECK(ts_plan_report_run(cfg, &q, &r));
    print_header(cfgpath, &q, &r);
    print_layouts(&q, &r, top);
    if (json) TS_CHECK(ts_plan_report_write_json(json, &q, &r));
cleanup:
    ts_plan_report_free(&r);
    ts_config_destroy(&cfg);
    free(over);
    if (together) err = ts_err_agree(MPI_COMM_WORLD, err);
    return err;
}
