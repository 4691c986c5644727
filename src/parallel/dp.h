/* Data parallelism: gradient buckets reduced while backward runs. The
 * gradient region of the arena is cut into buckets (default 25 MB) from its
 * end, because backward finishes the last layers first; as backward reports
 * that gradients from offset lo on are final, every bucket inside [lo, n)
 * is queued on the collectives' progress thread (nonblocking allreduce,
 * average over the data-parallel group), so communication overlaps the rest
 * of backward. The optimizer waits only at ts_dp_finish. */
#ifndef TS_PARALLEL_DP_H
#define TS_PARALLEL_DP_H

#include <stddef.h>

#include "collectives/coll.h"

typedef struct ts_dp ts_dp;

typedef struct ts_dp_stats {
    double exposed_s; /* time the caller waited in ts_dp_finish */
    double comm_s;    /* time the progress thread spent reducing buckets */
    int buckets;      /* buckets reduced */
} ts_dp_stats;

/* Local. grads: n floats owned by the caller (the arena's gradient region),
 * reduced in place over coll's ranks. bucket_floats > 0. */
int ts_dp_create(ts_coll *coll, float *grads, size_t n, size_t bucket_floats, ts_dp **out);
void ts_dp_destroy(ts_dp **dp);
/* Local. Starts a step: no bucket is in flight. */
void ts_dp_begin(ts_dp *dp);
/* Collective in call order (every rank reports the same offsets in the
 * same order): gradients [lo, n) are final; queues the buckets inside. */
int ts_dp_ready(ts_dp *dp, size_t lo);
/* Collective: queues what is left, waits for every bucket; gradients are
 * then averaged over the group. Adds this step's figures to *st if given. */
int ts_dp_finish(ts_dp *dp, ts_dp_stats *st);
/* Local. Number of buckets. */
int ts_dp_buckets(const ts_dp *dp);

#endif
