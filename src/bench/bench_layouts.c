/* The layouts side by side (src/bench/bench_layouts.h). Owns the loop over
 * candidate layouts and the comparison of measured and predicted ranks.
 * Must not measure a step itself: each layout is one ts_bench_step_run. */
#include "tsbuild.h"
#include "src/bench/bench_layouts.h"
#include "src/bench/bench_json.h"
#include "src/core/error.h"
#include "src/train/trainer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the rows of list (NULL/"all": every feasible layout) */
static int pick_rows(const ts_plan_choice *c, const char *list, ts_bench_layouts_result *r)
{
    r->rows = TS_CALLOC((size_t)c->n + 1, sizeof *r->rows);
    if (!r->rows) return TS_ERR(TS_ERR_NOMEM, "bench step --layouts");
    if (!list || !strcmp(list, "all")) {
        for (int i = 0; i < c->n; i++) r->rows[r->n++].plan = c->layouts[i];
        return 0;
    }
    const char *p = list;
    while (*p) {
        int d, pp, s, used = 0;
        if (sscanf(p, "%d,%d,%d%n", &d, &pp, &s, &used) != 3 || used == 0)
            return TS_ERR(TS_ERR_ARG, "bench step --layouts '%s': expected all or D,P,S[:D,P,S...] at '%s'", list, p);
        int k = -1;
        for (int i = 0; i < c->n && k < 0; i++)
            if (c->layouts[i].dp == d && c->layouts[i].pp == pp && c->layouts[i].sp == s) k = i;
        if (k < 0)
            return TS_ERR(TS_ERR_CONFIG, "bench step --layouts: dp %d x pp %d x sp %d is not a feasible layout of %d "
                          "node(s) x %d rank(s) for this config (`tessera plan` says why)", d, pp, s, c->nodes,
                          c->ranks_per_node);
        if (r->n >= c->n) return TS_ERR(TS_ERR_ARG, "bench step --layouts '%s': a layout named twice", list);
        r->rows[r->n++].plan = c->layouts[k];
        p += used;
        if (*p == ':') p++;
        else if (*p) return TS_ERR(TS_ERR_ARG, "bench step --layouts '%s': expected ':' at '%s'", list, p);
    }
    return 0;
}

static void ranks_of(ts_bench_layouts_result *r)
{
    r->fastest = 0;
    for (int i = 0; i < r->n; i++) {
        ts_bench_layout_row *a = &r->rows[i];
        a->predicted_rank = a->measured_rank = 1;
        for (int j = 0; j < r->n; j++) {
            a->predicted_rank += r->rows[j].plan.step_s < a->plan.step_s;
            a->measured_rank += r->rows[j].step_s < a->step_s;
        }
        if (a->step_s < r->rows[r->fastest].step_s) r->fastest = i;
    }
    /* auto's rule: the rows predicted within the tie of the fastest prediction, the fastest measured of them */
    double pbest = r->rows[0].plan.step_s;
    for (int i = 1; i < r->n; i++)
        if (r->rows[i].plan.step_s < pbest) pbest = r->rows[i].plan.step_s;
    r->chosen = -1;
    r->tied = 0;
    for (int i = 0; i < r->n; i++) {
        if (r->rows[i].plan.step_s > pbest * (1 + r->choice.tie)) continue;
        r->tied++;
        if (r->chosen < 0 || r->rows[i].step_s < r->rows[r->chosen].step_s) r->chosen = i;
    }
    const double best = r->rows[r->fastest].step_s;
    r->chosen_over_best = best > 0 ? r->rows[r->chosen].step_s / best : 0;
}

int ts_bench_step_layouts(MPI_Comm comm, ts_config *cfg, const ts_bench_step_opts *o, const char *list,
                          const char *calib, ts_bench_layouts_result *r)
{
    int err = 0;
    memset(r, 0, sizeof *r);
    TS_CHECK(ts_plan_choose(cfg, comm, calib, &r->choice));
    TS_CHECK(ts_config_get_float(cfg, "parallel.layout_tie", &r->choice.tie));
    TS_CHECK(ts_err_agree(comm, pick_rows(&r->choice, list, r)));
    for (int i = 0; i < r->n; i++) {
        ts_bench_step_result one;
        memset(&one, 0, sizeof one);
        TS_CHECK(ts_plan_apply(cfg, &r->choice, &r->rows[i].plan, "bench step --layouts"));
        err = ts_bench_step_run(comm, cfg, o, &one);
        r->rows[i].step_s = one.step_s;
        r->rows[i].samples_per_s = one.samples_per_s;
        ts_bench_step_result_free(&one);
        if (err) {
            const ts_plan_layout *l = &r->rows[i].plan;
            TS_CHECK(TS_CTX(err, "bench step --layouts: dp %d x pp %d x sp %d", l->dp, l->pp, l->sp));
        }
    }
    ranks_of(r);
cleanup:
    return err;
}

void ts_bench_layouts_free(ts_bench_layouts_result *r)
{
    ts_plan_choice_free(&r->choice);
    free(r->rows);
    memset(r, 0, sizeof *r);
}

int ts_bench_layouts_write_json(const char *path, const ts_bench_layouts_result *r, const char *config)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return TS_ERR(TS_ERR_NOMEM, "bench step --layouts: JSON");
    cJSON_AddStringToObject(o, "config", config);
    cJSON_AddNumberToObject(o, "nodes", r->choice.nodes);
    cJSON_AddNumberToObject(o, "ranks_per_node", r->choice.ranks_per_node);
    cJSON_AddNumberToObject(o, "global_batch", r->choice.global_batch);
    cJSON_AddStringToObject(o, "rates_from", r->choice.calib);
    cJSON *a = cJSON_AddArrayToObject(o, "layouts");
    for (int i = 0; i < r->n; i++) {
        const ts_bench_layout_row *w = &r->rows[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "dp", w->plan.dp);
        cJSON_AddNumberToObject(e, "pp", w->plan.pp);
        cJSON_AddNumberToObject(e, "sp", w->plan.sp);
        cJSON_AddNumberToObject(e, "batch_per_replica", w->plan.batch);
        cJSON_AddNumberToObject(e, "microbatches", w->plan.micro);
        cJSON_AddNumberToObject(e, "predicted_step_ms", w->plan.step_s * 1e3);
        cJSON_AddNumberToObject(e, "predicted_rank", w->predicted_rank);
        cJSON_AddNumberToObject(e, "step_ms", w->step_s * 1e3);
        cJSON_AddNumberToObject(e, "measured_rank", w->measured_rank);
        cJSON_AddNumberToObject(e, "samples_per_s", w->samples_per_s);
        cJSON_AddItemToArray(a, e);
    }
    cJSON_AddNumberToObject(o, "tie", r->choice.tie);
    cJSON_AddNumberToObject(o, "tied", r->tied);
    cJSON_AddNumberToObject(o, "chosen", r->chosen);
    cJSON_AddNumberToObject(o, "fastest", r->fastest);
    cJSON_AddNumberToObject(o, "chosen_over_best", r->chosen_over_best);
    return ts_bench_json_write(o, path, "bench step --layouts");
}

int ts_bench_step_measure(void *ctx, MPI_Comm comm, ts_config *cfg, double *step_s)
{
    (void)ctx;
    ts_bench_step_opts o = {.steps = 2, .warmup = 1, .rounds = 1};
    ts_bench_step_result r;
    memset(&r, 0, sizeof r);
    o.rss0_mb = ts_train_rss_mb();
    int err = ts_bench_step_run(comm, cfg, &o, &r);
    *step_s = r.step_s;
    ts_bench_step_result_free(&r);
    return err;
}
