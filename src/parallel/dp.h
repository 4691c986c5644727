/* Data parallelism: gradient buckets reduced while backward runs. The
 * gradient region of the arena is cut into buckets (default 25 MB) from its
 * end, because backward finishes the last layers first; as backward reports
 * that gradients from offset lo on are final, every bucket inside [lo, n)
 * is queued on the collectives' progress thread (nonblocking allreduce,
 * average over the data-parallel group), so communication overlaps the rest
 * of backward. The optimizer waits only at ts_dp_finish.
 * Sharded (parallel.zero = 1, docs/parallelism.md): buckets are
 * reduce-scattered instead, each rank keeps the average of its block of
 * every bucket (its shard, which it steps), and the updated blocks are
 * all-gathered back bucket by bucket (ts_dp_gather_start). */
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
/* Local. Sharded mode on or off (between steps): in it each bucket is
 * reduce-scattered (averaged) instead of allreduced, so after ts_dp_finish
 * this rank holds the average only of its block of every bucket (block r of
 * ts_coll_block over the bucket on rank r): its shard; the rest of the
 * gradients is scratch. */
void ts_dp_set_sharded(ts_dp *dp, int on);
/* Local. This rank's shard: for each bucket k (ts_dp_buckets entries),
 * lo[k] and len[k] relative to the gradients (the whole buckets when not
 * sharded or alone). Returns the shard's floats. */
size_t ts_dp_shard(const ts_dp *dp, size_t *lo, size_t *len);
/* Collective in call order (every rank the same k in the same order). buf:
 * n floats laid out as the gradients (the parameter region), in which each
 * rank's block of bucket k is current; queues its allgather on the progress
 * thread. buf's bucket stays untouched until ts_dp_gather_finish. */
int ts_dp_gather_start(ts_dp *dp, float *buf, int k);
/* Collective: waits for every gather started; then every rank holds every
 * block. Returns the first error. */
int ts_dp_gather_finish(ts_dp *dp);
/* Local. Number of buckets. */
int ts_dp_buckets(const ts_dp *dp);

#endif
