/* The planner choosing a layout (src/plan/plan_auto.h). Owns the ranking
 * of a job's layouts on rank 0 and the configuration keys a chosen layout
 * sets. Must not create communicators: the run builds its layout from the
 * configuration this sets (src/parallel/layout.h). */
#include "tsbuild.h"
#include "src/plan/plan_auto.h"
#include "collectives/coll.h"
#include "src/core/error.h"
#include "src/core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* rank 0: the ranked layouts */
static int rank_layouts(const ts_config *cfg, const char *calib, ts_plan_choice *c)
{
    int err = 0;
    ts_plan_request q;
    ts_plan_report r;
    memset(&r, 0, sizeof r);
    ts_plan_request_default(&q);
    q.nodes = c->nodes;
    q.ranks_per_node = c->ranks_per_node;
    q.calib = calib;
    TS_CHECK(ts_plan_report_setup(cfg, &q, &r));
    TS_CHECK(ts_plan_report_run(cfg, &q, &r));
    c->layouts = TS_CALLOC((size_t)r.nlayouts + 1, sizeof *c->layouts);
    if (!c->layouts) TS_FAIL(TS_ERR_NOMEM, "plan: layouts");
    for (int i = 0; i < r.nlayouts; i++)
        if (r.layouts[i].feasible && r.layouts[i].runnable) c->layouts[c->n++] = r.layouts[i];
    c->global_batch = r.job.global_batch;
    c->micro_batch = r.job.micro_batch;
    snprintf(c->calib, sizeof c->calib, "%s", calib ? calib : "a 2-step timing pass of the config's model on rank 0");
    if (!c->n)
        TS_FAIL(TS_ERR_CONFIG, "parallel.layout = auto: no layout of %d node(s) x %d rank(s) fits (global batch %d, "
                "data.patch, the memory limit): `tessera plan` shows why each is refused", c->nodes, c->ranks_per_node,
                c->global_batch);
cleanup:
    ts_plan_report_free(&r);
    return err;
}

int ts_plan_choose(const ts_config *cfg, MPI_Comm comm, const char *calib, ts_plan_choice *out)
{
    int err = 0, lerr = 0, rank, node, nnodes, lrank, lsize;
    memset(out, 0, sizeof *out);
    TS_MPI(MPI_Comm_rank(comm, &rank));
    TS_CHECK(ts_coll_node_info(comm, &node, &nnodes, &lrank, &lsize));
    int mm[2] = {lsize, -lsize};
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_INT, MPI_MAX, comm));
    if (mm[0] != -mm[1])
        TS_FAIL(TS_ERR_CONFIG, "parallel.layout = auto: the nodes hold %d to %d ranks; the planner assumes the same "
                "number on every node (set parallel.dp, pp and sp)", -mm[1], mm[0]);
    out->nodes = nnodes;
    out->ranks_per_node = lsize;
    if (rank == 0) lerr = rank_layouts(cfg, calib, out);
    TS_CHECK(ts_err_agree(comm, lerr));
    int hdr[3] = {out->n, out->global_batch, out->micro_batch};
    TS_MPI(MPI_Bcast(hdr, 3, MPI_INT, 0, comm));
    if (rank != 0) {
        out->n = hdr[0];
        out->global_batch = hdr[1];
        out->micro_batch = hdr[2];
        out->layouts = TS_CALLOC((size_t)out->n + 1, sizeof *out->layouts);
        lerr = out->layouts ? 0 : TS_ERR(TS_ERR_NOMEM, "plan: layouts");
    }
    TS_CHECK(ts_err_agree(comm, lerr));
    TS_MPI(MPI_Bcast(out->layouts, (int)(sizeof *out->layouts * (size_t)out->n), MPI_BYTE, 0, comm));
    TS_MPI(MPI_Bcast(out->calib, (int)sizeof out->calib, MPI_CHAR, 0, comm));
cleanup:
    if (err) ts_plan_choice_free(out);
    return err;
}

void ts_plan_choice_free(ts_plan_choice *c)
{
    free(c->layouts);
    free(c->measured_s);
    memset(c, 0, sizeof *c);
}

static int set_int(ts_config *cfg, const char *key, long long v, const char *where)
{
    char s[32];
    snprintf(s, sizeof s, "%lld", v);
    return ts_config_set(cfg, key, s, where);
}

int ts_plan_apply(ts_config *cfg, const ts_plan_choice *c, const ts_plan_layout *l, const char *where)
{
    TS_TRY(set_int(cfg, "parallel.dp", l->dp, where));
    TS_TRY(set_int(cfg, "parallel.pp", l->pp, where));
    TS_TRY(set_int(cfg, "parallel.sp", l->sp, where));
    TS_TRY(ts_config_set(cfg, "parallel.sp_dims", "auto", where));
    TS_TRY(ts_config_set(cfg, "parallel.pp_cut", "auto", where));
    TS_TRY(set_int(cfg, "train.accum", 1, where));
    if (l->pp == 1) {
        TS_TRY(set_int(cfg, "train.batch", l->batch, where));
        return set_int(cfg, "parallel.microbatches", 1, where);
    }
    TS_TRY(set_int(cfg, "train.batch", c->micro_batch, where));
    TS_TRY(set_int(cfg, "parallel.microbatches", l->micro, where));
    return ts_config_set(cfg, "parallel.schedule", l->micro >= l->pp ? "1f1b" : "gpipe", where);
}

/* parallel.layout's forced layout on size ranks: dp/sp/pp or D,P,S (*forced = 1); auto (*forced = 0) */
static int forced_layout(const char *v, int size, int dps[3], int *forced)
{
    dps[0] = dps[1] = dps[2] = 1;
    *forced = 0;
    if (!strcmp(v, "auto")) return 0;
    *forced = 1;
    if (!strcmp(v, "dp")) dps[0] = size;
    else if (!strcmp(v, "pp")) dps[1] = size;
    else if (!strcmp(v, "sp")) dps[2] = size;
    else {
        int used = 0;
        if (sscanf(v, "%d,%d,%d%n", &dps[0], &dps[1], &dps[2], &used) != 3 || v[used] || dps[0] < 1 || dps[1] < 1 ||
            dps[2] < 1)
            return TS_ERR(TS_ERR_CONFIG, "parallel.layout = '%s': expected given, auto, dp, sp, pp or D,P,S", v);
    }
    if ((long)dps[0] * dps[1] * dps[2] != size)
        return TS_ERR(TS_ERR_CONFIG, "parallel.layout = %s: dp %d x pp %d x sp %d is not the job's %d ranks", v, dps[0],
                      dps[1], dps[2], size);
    return 0;
}

int ts_plan_tied(const ts_plan_choice *c, double tie)
{
    int k = 1;
    while (k < c->n && c->layouts[k].step_s <= c->layouts[0].step_s * (1 + tie)) k++;
    return c->n ? k : 0;
}

/* auto: the tied layouts timed, the fastest measured (index into c->layouts) */
static int break_tie(ts_config *cfg, MPI_Comm comm, ts_plan_measure_fn measure, void *ctx, ts_plan_choice *c, int *k)
{
    const int tied = ts_plan_tied(c, c->tie);
    *k = 0;
    if (tied < 2 || !measure) return 0;
    c->measured_s = TS_CALLOC((size_t)c->n, sizeof *c->measured_s);
    TS_TRY(ts_err_agree(comm, c->measured_s ? 0 : TS_ERR(TS_ERR_NOMEM, "parallel.layout = auto: timings")));
    /* Two passes, the second in reverse order (the last layout of the first
     * pass, just timed warm, is not timed again), each layout keeping its
     * faster time: the first layout timed pays the job's cold start, and in
     * a single pass it lost to it (2026-12-02, 128^3 on 4 ranks: dp 4 timed
     * first at 43.1 s against 22.7 and 28.3 s for the others, while bench
     * step --layouts measured it the fastest; docs/performance.md). */
    for (int j = 0; j < 2 * tied - 1; j++) {
        const int i = j < tied ? j : 2 * tied - 2 - j;
        double t = 0;
        TS_TRY(ts_plan_apply(cfg, c, &c->layouts[i], "parallel.layout = auto"));
        int err = measure(ctx, comm, cfg, &t);
        if (err) {
            const ts_plan_layout *l = &c->layouts[i];
            return TS_CTX(err, "parallel.layout = auto: timing dp %d x pp %d x sp %d", l->dp, l->pp, l->sp);
        }
        const ts_plan_layout *l = &c->layouts[i];
        ts_log_root(TS_LOG_INFO, "parallel.layout = auto: timing %d of %d, dp %d x pp %d x sp %d: %.1f ms", j + 1,
                    2 * tied - 1, l->dp, l->pp, l->sp, t * 1e3);
        if (j < tied || t < c->measured_s[i]) c->measured_s[i] = t;
    }
    for (int i = 1; i < tied; i++)
        if (c->measured_s[i] < c->measured_s[*k]) *k = i;
    return 0;
}

int ts_plan_layout_resolve(ts_config *cfg, MPI_Comm comm, ts_plan_measure_fn measure, void *ctx, ts_plan_choice *c,
                           int *chosen)
{
    static const char *const set_by_layout[] = {"parallel.dp", "parallel.pp", "parallel.sp", "parallel.sp_dims",
                                                "parallel.pp_cut", "parallel.microbatches"};
    const char *v, *calib;
    int size, dps[3], forced;
    memset(c, 0, sizeof *c);
    *chosen = -1;
    TS_TRY(ts_config_get_str(cfg, "parallel.layout", &v));
    if (!strcmp(v, "given")) return 0;
    TS_MPI_TRY(MPI_Comm_size(comm, &size));
    TS_TRY(forced_layout(v, size, dps, &forced));
    for (size_t k = 0; k < sizeof set_by_layout / sizeof *set_by_layout; k++)
        if (ts_config_given(cfg, set_by_layout[k])) {
            const char *val;
            TS_TRY(ts_config_get_str(cfg, set_by_layout[k], &val));
            return TS_ERR(TS_ERR_CONFIG, "parallel.layout = %s (%s) chooses %s; remove %s = %s (%s) or set "
                          "parallel.layout = given", v, ts_config_source(cfg, "parallel.layout"), set_by_layout[k],
                          set_by_layout[k], val, ts_config_source(cfg, set_by_layout[k]));
        }
    TS_TRY(ts_config_get_str(cfg, "parallel.layout_calib", &calib));
    TS_TRY(ts_plan_choose(cfg, comm, calib[0] ? calib : NULL, c));
    TS_TRY(ts_config_get_float(cfg, "parallel.layout_tie", &c->tie));
    int k = -1;
    if (!forced) TS_TRY(break_tie(cfg, comm, measure, ctx, c, &k));
    for (int i = 0; forced && i < c->n && k < 0; i++)
        if (c->layouts[i].dp == dps[0] && c->layouts[i].pp == dps[1] && c->layouts[i].sp == dps[2]) k = i;
    if (k < 0)
        return TS_ERR(TS_ERR_CONFIG, "parallel.layout = %s: dp %d x pp %d x sp %d is not a feasible layout for this "
                      "config on %d node(s) x %d rank(s) (global batch %d; `tessera plan` says why)", v, dps[0],
                      dps[1], dps[2], c->nodes, c->ranks_per_node, c->global_batch);
    *chosen = k;
    return ts_plan_apply(cfg, c, &c->layouts[k], forced ? "parallel.layout" : "parallel.layout = auto");
}
