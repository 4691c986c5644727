/* Gradient buckets over the nonblocking allreduce, optionally compressed
 * (collectives/compress.c does the work on the progress thread), or
 * reduce-scatter and allgather when sharded (parallel.zero); see buckets.h.
 * Owns the buckets' ranges and progress; must not step an optimizer or choose
 * a path (src/train/gradpath.c) or a group (the layout's ts_coll is handed in). */
#include "tsbuild.h"
#include "src/parallel/buckets.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ts_dp {
    ts_coll *coll;
    float *grads;
    size_t n;
    int nb;           /* buckets; bucket k covers [lo[k], hi[k]), k = 0 is the tail */
    size_t *lo, *hi;
    ts_coll_req **req, **greq; /* reductions; gathers (sharded) */
    int sharded;
    int next;         /* next bucket to queue */
    double comm0;     /* progress-thread seconds at ts_dp_begin */
    ts_dp_compress comp;
    ts_compressor *z; /* NULL: plain float32 averages */
    int zstep;        /* this step's buckets go through z (warm-up over) */
    int64_t steps, zsteps;
    ts_compress_bytes total;
};

int ts_dp_create(ts_coll *coll, float *grads, size_t n, size_t bucket_floats, ts_dp **out)
{
    *out = NULL;
    if (bucket_floats == 0) return TS_ERR(TS_ERR_ARG, "gradient bucket of 0 floats");
    bucket_floats = (bucket_floats + 15) / 16 * 16; /* whole cache lines */
    ts_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return TS_ERR(TS_ERR_NOMEM, "dp");
    dp->coll = coll;
    dp->grads = grads;
    dp->n = n;
    dp->nb = n ? (int)((n + bucket_floats - 1) / bucket_floats) : 0;
    dp->lo = calloc((size_t)dp->nb + 1, sizeof *dp->lo);
    dp->hi = calloc((size_t)dp->nb + 1, sizeof *dp->hi);
    dp->req = calloc((size_t)dp->nb + 1, sizeof *dp->req);
    dp->greq = calloc((size_t)dp->nb + 1, sizeof *dp->greq);
    if (!dp->lo || !dp->hi || !dp->req || !dp->greq) {
        ts_dp_destroy(&dp);
        return TS_ERR(TS_ERR_NOMEM, "dp buckets");
    }
    for (int k = 0; k < dp->nb; k++) {
        dp->hi[k] = n - (size_t)k * bucket_floats;
        dp->lo[k] = dp->hi[k] > bucket_floats ? dp->hi[k] - bucket_floats : 0;
    }
    *out = dp;
    return 0;
}

void ts_dp_destroy(ts_dp **dpp)
{
    if (!dpp || !*dpp) return;
    ts_dp *dp = *dpp;
    for (int k = 0; dp->req && k < dp->nb; k++) ts_coll_wait(&dp->req[k]);
    ts_compressor_destroy(&dp->z);
    for (int k = 0; dp->greq && k < dp->nb; k++) ts_coll_wait(&dp->greq[k]);
    free(dp->greq);
    free(dp->lo);
    free(dp->hi);
    free(dp->req);
    free(dp);
    *dpp = NULL;
}

int ts_dp_buckets(const ts_dp *dp) { return dp->nb; }

/* the communicator whose progress thread runs this step's buckets */
static ts_coll *step_coll(const ts_dp *dp) { return dp->zstep && dp->comp.group ? dp->comp.group : dp->coll; }

void ts_dp_begin(ts_dp *dp)
{
    dp->next = 0;
    dp->zstep = dp->z && dp->steps >= dp->comp.warmup;
    dp->comm0 = ts_coll_async_seconds(step_coll(dp));
}

int ts_dp_ready(ts_dp *dp, size_t lo)
{
    if (ts_coll_size(dp->coll) == 1) return 0;
    while (dp->next < dp->nb && dp->lo[dp->next] >= lo) {
        int k = dp->next++;
        if (dp->sharded)
            TS_TRY(ts_coll_ireduce_scatter(dp->coll, TS_IN_PLACE, dp->grads + dp->lo[k], dp->hi[k] - dp->lo[k],
                                           TS_FLOAT32, TS_OP_AVG, &dp->req[k]));
        else if (dp->zstep)
            TS_TRY(ts_compress_iallreduce(dp->z, k, dp->grads + dp->lo[k], &dp->req[k]));
        else
            TS_TRY(ts_coll_iallreduce(dp->coll, TS_IN_PLACE, dp->grads + dp->lo[k], dp->hi[k] - dp->lo[k],
                                      TS_FLOAT32, TS_OP_AVG, &dp->req[k]));
    }
    return 0;
}

/* one step's bytes per rank: the compressor's, or the float32 allreduce's */
static void step_bytes(const ts_dp *dp, int compressed, ts_compress_bytes *b)
{
    if (compressed && dp->z) {
        ts_compressor_bytes(dp->z, -1, b);
        return;
    }
    const double p = ts_coll_size(dp->coll), n = (double)dp->n;
    b->fp32 += 4 * n;
    b->payload += 4 * n;
    b->wire_fp32 += 2 * (p - 1) / p * 4 * n;
    b->wire += 2 * (p - 1) / p * 4 * n;
}

int ts_dp_finish(ts_dp *dp, ts_dp_stats *st)
{
    int err = 0;
    if (ts_coll_size(dp->coll) == 1) return 0;
    const int early = dp->next;
    err = ts_dp_ready(dp, 0);
    double t = ts_time_now();
    for (int k = 0; k < dp->nb; k++) {
        int e = ts_coll_wait(&dp->req[k]);
        if (!err) err = e;
    }
    t = ts_time_now() - t;
    if (!err) {
        ts_compress_bytes b = {0, 0, 0, 0};
        step_bytes(dp, dp->zstep, &b);
        dp->total.fp32 += b.fp32;
        dp->total.payload += b.payload;
        dp->total.wire_fp32 += b.wire_fp32;
        dp->total.wire += b.wire;
        dp->steps++;
        dp->zsteps += dp->zstep;
    }
    if (st) {
        st->exposed_s += t;
        st->comm_s += ts_coll_async_seconds(step_coll(dp)) - dp->comm0;
        st->buckets += dp->nb;
        st->early += early;
    }
    return err;
}

/* ---- gradient compression ---- */

int ts_dp_compress_from_config(const ts_config *cfg, ts_dp_compress *out)
{
    const char *v;
    char why[512];
    double bmb;
    memset(out, 0, sizeof *out);
    TS_TRY(ts_config_get_str(cfg, "parallel.compress", &v));
    TS_TRY(ts_config_get_int(cfg, "parallel.compress_warmup", &out->warmup));
    TS_TRY(ts_config_get_float(cfg, "parallel.bucket_mb", &bmb));
    if (ts_compress_parse(v, &out->cfg, why, sizeof why))
        return TS_ERR(TS_ERR_CONFIG, "parallel.compress = '%s' (%s): %s", v, ts_config_source(cfg, "parallel.compress"),
                      why);
    /* with parallel.local_steps > 1 it is refused by ts_gradpath_choose (src/train/gradpath.c) */
    if (out->cfg.kind == TS_COMPRESS_TOPK && bmb * 1e6 / sizeof(float) >= 4294967295.0)
        return TS_ERR(TS_ERR_CONFIG, "parallel.compress = %s with parallel.bucket_mb = %g: top-k sends 32-bit indices "
                      "within a bucket, so a bucket holds at most 2^32 - 1 floats (parallel.bucket_mb < 17179)", v, bmb);
    return 0;
}

int ts_dp_set_compress(ts_dp *dp, const ts_dp_compress *c)
{
    ts_compressor_destroy(&dp->z);
    dp->comp = *c;
    dp->steps = dp->zsteps = 0;
    memset(&dp->total, 0, sizeof dp->total);
    ts_coll *g = c->group ? c->group : dp->coll;
    if (c->cfg.kind == TS_COMPRESS_NONE || ts_coll_size(g) == 1) return 0; /* no replicas: plain averages */
    size_t *len = TS_CALLOC((size_t)dp->nb + 1, sizeof *len);
    if (!len) return TS_ERR_NOMEM;
    for (int k = 0; k < dp->nb; k++) len[k] = dp->hi[k] - dp->lo[k];
    int err = ts_compressor_create(g, &c->cfg, dp->nb, len, &dp->z);
    free(len);
    if (!err && c->group) ts_compressor_set_inner(dp->z, c->inner);
    for (int k = 0; !err && k < dp->nb && c->bounds; k++) { /* the tensor starts inside each bucket */
        size_t b0 = 0, b1;
        while (b0 < c->nbounds && c->bounds[b0] <= dp->lo[k]) b0++;
        for (b1 = b0; b1 < c->nbounds && c->bounds[b1] < dp->hi[k]; b1++) {}
        if (b1 > b0) {
            size_t *rel = TS_MALLOC((b1 - b0) * sizeof *rel);
            if (!rel) return TS_ERR_NOMEM;
            for (size_t j = b0; j < b1; j++) rel[j - b0] = c->bounds[j] - dp->lo[k];
            err = ts_compressor_set_bounds(dp->z, k, rel, b1 - b0);
            free(rel);
        }
    }
    if (err) ts_compressor_destroy(&dp->z);
    return err;
}

void ts_dp_compress_get(const ts_dp *dp, ts_dp_compress_stats *st)
{
    memset(st, 0, sizeof *st);
    st->c = dp->comp;
    st->ranks = ts_coll_size(dp->comp.group ? dp->comp.group : dp->coll);
    st->pieces = dp->comp.group && dp->comp.inner ? ts_coll_size(dp->comp.inner) : 1;
    st->buckets = dp->nb;
    for (int k = 0; k < dp->nb; k++) st->compressed += dp->z && ts_compressor_segment(dp->z, k, NULL, NULL, NULL, NULL);
    st->steps = dp->steps;
    st->compressed_steps = dp->zsteps;
    if (st->ranks > 1) step_bytes(dp, 1, &st->step);
    st->total = dp->total;
    st->compress_s = dp->z ? ts_compressor_seconds(dp->z) : 0;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

void ts_dp_compress_describe(const ts_dp *dp, char *buf, size_t n)
{
    ts_dp_compress_stats st;
    char name[64];
    ts_dp_compress_get(dp, &st);
    ts_compress_name(&st.c.cfg, name, sizeof name);
    if (st.ranks == 1) {
        snprintf(buf, n, "gradient compression %s: one data-parallel replica, nothing is compressed", name);
        return;
    }
    const int fb = st.c.cfg.feedback && (st.c.cfg.kind == TS_COMPRESS_TOPK || st.c.cfg.kind == TS_COMPRESS_SIGN ||
                                         st.c.cfg.kind == TS_COMPRESS_POWERSGD);
    char pieces[128] = "";
    if (st.pieces > 1)
        snprintf(pieces, sizeof pieces, " (after an exact float32 average over each replica's %d spatial pieces)",
                 st.pieces);
    snprintf(buf, n, "gradient compression %s over %d replicas%s: %d of %d buckets compressed, %.0f bytes per rank and "
             "step instead of %.0f (%.1fx fewer; sent with ring-style exchanges %.1fx)%s; %lld warm-up steps "
             "uncompressed (parallel.compress_warmup)", name, st.ranks, pieces, st.compressed, st.buckets, st.step.payload, st.step.fp32,
             ratio(st.step.fp32, st.step.payload), ratio(st.step.wire_fp32, st.step.wire),
             fb ? "; error feedback: residuals are per rank and not checkpointed (a resume restarts them from zero)" : "",
             (long long)st.c.warmup);
}

int ts_dp_compress_json(const ts_dp *dp, MPI_Comm stages, char *buf, size_t n)
{
    ts_dp_compress_stats st;
    char name[64];
    ts_dp_compress_get(dp, &st);
    ts_compress_name(&st.c.cfg, name, sizeof name);
    double v[9] = {st.step.fp32, st.step.payload, st.step.wire_fp32, st.step.wire, st.total.fp32, st.total.payload,
                   st.total.wire_fp32, st.total.wire, st.compress_s};
    TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, v, 8, MPI_DOUBLE, MPI_SUM, stages));
    TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, v + 8, 1, MPI_DOUBLE, MPI_MAX, stages));
    const int fb = st.c.cfg.feedback && (st.c.cfg.kind == TS_COMPRESS_TOPK || st.c.cfg.kind == TS_COMPRESS_SIGN ||
                                         st.c.cfg.kind == TS_COMPRESS_POWERSGD);
    snprintf(buf, n,
             "\"compress\": {\"mode\": \"%s\", \"ranks\": %d, \"inner_ranks\": %d, \"error_feedback\": %s, \"residuals_checkpointed\": false, "
             "\"warmup_steps\": %lld, \"steps\": %lld, \"compressed_steps\": %lld, \"buckets\": %d, "
             "\"buckets_compressed\": %d, \"compress_s\": %.6f,\n    \"scope\": \"bytes per rank (summed over pipeline "
             "stages); bytes = the message a rank contributes, wire_bytes = what it sends with ring-style exchanges\",\n"
             "    \"per_step\": {\"fp32_bytes\": %.0f, \"bytes\": %.0f, \"ratio\": %.4f, \"wire_fp32_bytes\": %.0f, "
             "\"wire_bytes\": %.0f, \"wire_ratio\": %.4f},\n"
             "    \"total\": {\"fp32_bytes\": %.0f, \"bytes\": %.0f, \"ratio\": %.4f, \"wire_fp32_bytes\": %.0f, "
             "\"wire_bytes\": %.0f, \"wire_ratio\": %.4f}}",
             name, st.ranks, st.pieces, fb ? "true" : "false", (long long)st.c.warmup, (long long)st.steps,
             (long long)st.compressed_steps, st.buckets, st.compressed, v[8], v[0], v[1], ratio(v[0], v[1]), v[2], v[3],
             ratio(v[2], v[3]), v[4], v[5], ratio(v[4], v[5]), v[6], v[7], ratio(v[6], v[7]));
    return 0;
}
void ts_dp_set_sharded(ts_dp *dp, int on) { dp->sharded = on != 0; }

size_t ts_dp_shard(const ts_dp *dp, size_t *lo, size_t *len)
{
    const int p = dp->sharded ? ts_coll_size(dp->coll) : 1, r = dp->sharded ? ts_coll_rank(dp->coll) : 0;
    size_t total = 0;
    for (int k = 0; k < dp->nb; k++) {
        size_t o, l;
        ts_coll_block(dp->hi[k] - dp->lo[k], TS_FLOAT32, p, r, &o, &l);
        lo[k] = dp->lo[k] + o;
        len[k] = l;
        total += l;
    }
    return total;
}

int ts_dp_gather_start(ts_dp *dp, float *buf, int k)
{
    if (!dp->sharded || ts_coll_size(dp->coll) == 1) return 0;
    if (k < 0 || k >= dp->nb || dp->greq[k]) return TS_ERR(TS_ERR_INTERNAL, "dp: gather of bucket %d", k);
    return ts_coll_iallgather(dp->coll, buf + dp->lo[k], dp->hi[k] - dp->lo[k], TS_FLOAT32, &dp->greq[k]);
}

int ts_dp_gather_finish(ts_dp *dp)
{
    int err = 0;
    for (int k = 0; k < dp->nb; k++) {
        if (!dp->greq[k]) continue;
        int e = ts_coll_wait(&dp->greq[k]);
        if (!err) err = e;
    }
    return err;
}
