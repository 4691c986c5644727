/* `tessera plan` as calls (src/plan/plan.h): the job and machine of a
 * request, the ranked layouts, the scaling curve and the JSON report over
 * the performance model of plan.c. Owns the report; the predictions are
 * plan.c's, the printing src/cli/plan.c's. */
#include "tsbuild.h"
#include "src/plan/plan.h"
#include "src/core/error.h"
#include "src/optim/optim.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void ts_plan_request_default(ts_plan_request *q)
{
    memset(q, 0, sizeof *q);
    q->net_GBps = 12.5;
    q->net_latency_us = 2.0;
    q->gpu_tflops = 50;
    q->gpu_mem_gb = 80;
    q->link_GBps = 200;
}

static int machine_setup(const ts_config *cfg, const ts_plan_request *q, ts_plan_machine *m)
{
    memset(m, 0, sizeof *m);
    m->nodes = q->nodes;
    m->gpus_per_node = q->gpus_per_node;
    m->ranks_per_node = q->ranks_per_node ? q->ranks_per_node : q->gpus_per_node;
    if (q->gpus_per_node && q->ranks_per_node && q->ranks_per_node != q->gpus_per_node)
        return TS_ERR(TS_ERR_ARG, "plan: with --gpus-per-node, ranks per node = GPUs per node");
    const char *omp = getenv("OMP_NUM_THREADS");
    m->threads = q->threads ? q->threads : omp ? atoi(omp) : 1;
    if (m->threads < 1) m->threads = 1;
    long here = sysconf(_SC_NPROCESSORS_ONLN);
    m->cores_per_node = q->cores_per_node > 0 ? q->cores_per_node
                        : q->nodes == 1 && !q->gpus_per_node && here > 0 ? (double)here
                                                                        : (double)m->ranks_per_node * m->threads;
    m->net_GBps = q->net_GBps;
    m->net_latency_us = q->net_latency_us;
    snprintf(m->net_from, sizeof m->net_from, "%s", q->net_given ? "--net" : "the default (100 Gb/s InfiniBand)");
    m->gpu_tflops = q->gpu_tflops;
    m->gpu_mem_gb = q->gpu_mem_gb;
    m->link_GBps = q->link_GBps;
    m->mem_per_rank_mb = q->mem_per_rank_mb;
    m->halo_hidden = 0.9;
    return ts_config_get_float(cfg, "parallel.bucket_mb", &m->bucket_mb);
}

/* the link between nodes from the tuning table: an allreduce of 2 ranks on 2
 * nodes (bench coll --tune on jobs/cluster's 2 x 1, or 2 nodes of a real
 * machine) sends the message across the link once each way in 2 latencies,
 * so its fitted alpha and beta are the link's latency and seconds per byte;
 * the algorithm fastest at 64 MiB (the one bandwidth-bound runs use) */
static void net_from_fits(ts_plan_machine *m, const char *tuning)
{
    const ts_coll_fit *best = NULL;
    double tb = 0;
    for (int i = 0; i < m->nfits; i++) {
        const ts_coll_fit *f = &m->fits[i];
        if (strcmp(f->op, "allreduce") || f->nodes != 2 || f->ranks != 2 || !(f->beta_s > 0)) continue;
        double t = ts_coll_model_time(f, 2, 64.0 * 1048576);
        if (!best || t < tb) best = f, tb = t;
    }
    if (!best) return;
    double L, B;
    ts_coll_model_shape("allreduce", best->algo, 2, &L, &B);
    m->net_latency_us = best->alpha_s * (L > 0 ? L / 2 : 1) * 1e6; /* per message: 2 of them per allreduce */
    m->net_GBps = 1e-9 / (best->beta_s * (B > 0 ? B : 1));    /* the message crosses once per direction */
    snprintf(m->net_from, sizeof m->net_from, "the 2-node fit of %s in %s", best->algo, tuning);
}

int ts_plan_report_setup(const ts_config *cfg, const ts_plan_request *q, ts_plan_report *r)
{
    memset(r, 0, sizeof *r);
    if (q->nodes < 1 || (q->ranks_per_node < 1 && q->gpus_per_node < 1))
        return TS_ERR(TS_ERR_ARG, "plan: nodes and ranks per node (or GPUs per node) must be at least 1");
    ts_plan_job *job = &r->job;
    ts_optim_cfg oc;
    TS_TRY(ts_unet_cfg_from_config(cfg, &job->u));
    TS_TRY(ts_optim_cfg_from_config(cfg, &oc));
    TS_TRY(ts_config_get_int(cfg, "train.batch", &r->batch));
    TS_TRY(ts_config_get_int(cfg, "train.accum", &r->accum));
    int64_t micro; /* read (a key of the job) though the model takes m from the layout */
    TS_TRY(ts_config_get_int(cfg, "parallel.microbatches", &micro));
    job->nstate = ts_optim_state_count(&oc);
    job->micro_batch = (int)r->batch;
    job->prefetch = ts_config_isset(cfg, "data.path") ? 2 : 0;
    TS_TRY(machine_setup(cfg, q, &r->machine));
    job->global_batch = q->global_batch ? q->global_batch : (int)(r->batch * r->accum) * q->nodes * r->machine.ranks_per_node;
    /* collectives: the tuning table's fits */
    const char *tuning = q->tuning;
    if (!tuning && ts_config_isset(cfg, "coll.tuning")) TS_TRY(ts_config_get_str(cfg, "coll.tuning", &tuning));
    if (!tuning) tuning = getenv("TESSERA_COLL_TUNING");
    if (tuning) {
        snprintf(r->tuning, sizeof r->tuning, "%s", tuning);
        TS_TRY(ts_coll_model_load(tuning, &r->fits, &r->nfits));
    }
    r->machine.fits = r->fits;
    r->machine.nfits = r->nfits;
    if (!q->net_given) net_from_fits(&r->machine, r->tuning);
    /* compute rates */
    if (q->calib) TS_TRY(ts_plan_calib_load(q->calib, &r->cal));
    else r->calibrate = 1;
    return 0;
}

static const ts_plan_layout *best_runnable(const ts_plan_layout *l, int n)
{
    for (int i = 0; i < n; i++)
        if (l[i].feasible && l[i].runnable) return &l[i];
    return NULL;
}

/* the best runnable layout at 1, 2, 4, ... nodes, same batch per rank */
static int curve(const ts_plan_request *q, ts_plan_report *r)
{
    int n = 0;
    for (int nn = 1; nn <= q->nodes; nn = nn * 2 > q->nodes && nn < q->nodes ? q->nodes : nn * 2) {
        n++;
        if (nn == q->nodes) break;
    }
    r->curve = TS_CALLOC((size_t)n, sizeof *r->curve);
    if (!r->curve) return TS_ERR(TS_ERR_NOMEM, "plan: curve");
    for (int nn = 1; nn <= q->nodes; nn = nn * 2 > q->nodes && nn < q->nodes ? q->nodes : nn * 2) {
        ts_plan_machine mm = r->machine;
        ts_plan_job jj = r->job;
        ts_plan_layout *cl = NULL;
        int cn = 0;
        mm.nodes = nn;
        jj.global_batch = q->global_batch ? q->global_batch : (int)(r->batch * r->accum) * nn * r->machine.ranks_per_node;
        TS_TRY(ts_plan_layouts(&jj, &r->cal, &mm, &cl, &cn));
        const ts_plan_layout *b = best_runnable(cl, cn);
        if (b) {
            ts_plan_curve_point *pt = &r->curve[r->ncurve++];
            pt->nodes = nn;
            pt->ranks = nn * r->machine.ranks_per_node;
            pt->global_batch = jj.global_batch;
            pt->best = *b;
        }
        free(cl);
        if (nn == q->nodes) break;
    }
    return 0;
}

int ts_plan_report_run(const ts_config *cfg, const ts_plan_request *q, ts_plan_report *r)
{
    if (r->calibrate) TS_TRY(ts_plan_calibrate(cfg, 2, &r->cal));
    if (q->layout[0] > 0 && q->layout[1] > 0 && q->layout[2] > 0) {
        r->nlayouts = 1;
        r->layouts = calloc(1, sizeof *r->layouts);
        if (!r->layouts) return TS_ERR(TS_ERR_NOMEM, "layout");
        ts_plan_predict(&r->job, &r->cal, &r->machine, q->layout[0], q->layout[1], q->layout[2], r->layouts);
    } else {
        TS_TRY(ts_plan_layouts(&r->job, &r->cal, &r->machine, &r->layouts, &r->nlayouts));
    }
    for (int i = 0; i < r->nlayouts; i++) r->nfeasible += r->layouts[i].feasible;
    r->best = best_runnable(r->layouts, r->nlayouts);
    return q->curve ? curve(q, r) : 0;
}

static cJSON *layout_json(const ts_plan_layout *l)
{
    char name[64];
    snprintf(name, sizeof name, "dp=%d pp=%d sp=%d", l->dp, l->pp, l->sp);
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

int ts_plan_report_write_json(const char *path, const ts_plan_request *q, const ts_plan_report *r)
{
    const ts_plan_machine *m = &r->machine;
    cJSON *root = cJSON_CreateObject();
    if (!root) return TS_ERR(TS_ERR_NOMEM, "plan: JSON");
    cJSON *arr = cJSON_AddArrayToObject(root, "layouts");
    for (int i = 0; i < r->nlayouts; i++) cJSON_AddItemToArray(arr, layout_json(&r->layouts[i]));
    if (r->best) cJSON_AddItemToObject(root, "best", layout_json(r->best));
    if (q->curve) {
        cJSON *cv = cJSON_AddArrayToObject(root, "curve");
        for (int i = 0; i < r->ncurve; i++) {
            cJSON *e = layout_json(&r->curve[i].best);
            cJSON_AddNumberToObject(e, "nodes", r->curve[i].nodes);
            cJSON_AddNumberToObject(e, "global_batch", r->curve[i].global_batch);
            cJSON_AddItemToArray(cv, e);
        }
    }
    cJSON *mj = cJSON_AddObjectToObject(root, "machine");
    cJSON_AddNumberToObject(mj, "nodes", q->nodes);
    cJSON_AddNumberToObject(mj, "ranks_per_node", m->ranks_per_node);
    cJSON_AddNumberToObject(mj, "threads", m->threads);
    cJSON_AddNumberToObject(mj, "cores_per_node", m->cores_per_node);
    cJSON_AddNumberToObject(mj, "gpus_per_node", q->gpus_per_node);
    cJSON_AddNumberToObject(mj, "net_GBps", m->net_GBps);
    cJSON_AddNumberToObject(mj, "net_latency_us", m->net_latency_us);
    cJSON_AddStringToObject(mj, "net_from", m->net_from);
    cJSON_AddNumberToObject(mj, "global_batch", r->job.global_batch);
    cJSON *as = cJSON_AddObjectToObject(root, "assumptions");
    cJSON_AddStringToObject(as, "compute", r->cal.what);
    cJSON_AddStringToObject(as, "collectives", r->nfits ? r->tuning : "defaults");
    cJSON_AddNumberToObject(as, "halo_hidden_fraction", m->halo_hidden);
    cJSON_AddNumberToObject(as, "bucket_mb", m->bucket_mb);
    if (q->gpus_per_node) cJSON_AddNumberToObject(as, "gpu_tflops", q->gpu_tflops);
    char *txt = cJSON_Print(root);
    FILE *f = txt ? fopen(path, "w") : NULL;
    int bad = !f || fprintf(f, "%s\n", txt) < 0;
    if (f && fclose(f)) bad = 1;
    free(txt);
    cJSON_Delete(root);
    return bad ? TS_ERR(TS_ERR_IO, "%s: cannot write", path) : 0;
}

void ts_plan_report_free(ts_plan_report *r)
{
    free(r->layouts);
    free(r->fits);
    free(r->curve);
    memset(r, 0, sizeof *r);
}
