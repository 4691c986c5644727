/* Gradient buckets over the nonblocking allreduce (or reduce-scatter and
 * allgather when sharded); see dp.h. */
#include "tsbuild.h"
#include "src/parallel/dp.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <stdlib.h>

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
    for (int k = 0; dp->greq && k < dp->nb; k++) ts_coll_wait(&dp->greq[k]);
    free(dp->greq);
    free(dp->lo);
    free(dp->hi);
    free(dp->req);
    free(dp);
    *dpp = NULL;
}

int ts_dp_buckets(const ts_dp *dp) { return dp->nb; }

void ts_dp_begin(ts_dp *dp)
{
    dp->next = 0;
    dp->comm0 = ts_coll_async_seconds(dp->coll);
}

int ts_dp_ready(ts_dp *dp, size_t lo)
{
    if (ts_coll_size(dp->coll) == 1) return 0;
    while (dp->next < dp->nb && dp->lo[dp->next] >= lo) {
        int k = dp->next++;
        if (dp->sharded)
            TS_TRY(ts_coll_ireduce_scatter(dp->coll, TS_IN_PLACE, dp->grads + dp->lo[k], dp->hi[k] - dp->lo[k],
                                           TS_FLOAT32, TS_OP_AVG, &dp->req[k]));
        else
            TS_TRY(ts_coll_iallreduce(dp->coll, TS_IN_PLACE, dp->grads + dp->lo[k], dp->hi[k] - dp->lo[k], TS_FLOAT32,
                                      TS_OP_AVG, &dp->req[k]));
    }
    return 0;
}

int ts_dp_finish(ts_dp *dp, ts_dp_stats *st)
{
    int err = 0;
    if (ts_coll_size(dp->coll) == 1) return 0;
    err = ts_dp_ready(dp, 0);
    double t = ts_time_now();
    for (int k = 0; k < dp->nb; k++) {
        int e = ts_coll_wait(&dp->req[k]);
        if (!err) err = e;
    }
    t = ts_time_now() - t;
    if (st) {
        st->exposed_s += t;
        st->comm_s += ts_coll_async_seconds(dp->coll) - dp->comm0;
        st->buckets += dp->nb;
    }
    return err;
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
