/* Data parallelism: gradient buckets reduced while backward runs. The
 * gradient region of the arena is cut into buckets (default 25 MB) from its
 * end, because backward finishes the last layers first; as backward reports
 * that gradients from offset lo on are final, every bucket inside [lo, n)
 * is queued on the collectives' progress thread (nonblocking allreduce,
 * average over the data-parallel group), so communication overlaps the rest
 * of backward. The optimizer waits only at ts_dp_finish. Optionally the
 * buckets are compressed (collectives/compress.h: bf16, fp16, top-k, sign,
 * PowerSGD), still on the progress thread, with per-bucket state that lives
 * as long as the ts_dp (docs/parallelism.md).
 * Sharded (parallel.zero = 1, docs/parallelism.md): buckets are
 * reduce-scattered instead, each rank keeps the average of its block of
 * every bucket (its shard, which it steps), and the updated blocks are
 * all-gathered back bucket by bucket (ts_dp_gather_start). */
#ifndef TS_PARALLEL_BUCKETS_H
#define TS_PARALLEL_BUCKETS_H

#include <stddef.h>

#include "collectives/coll.h"
#include "collectives/compress.h"

typedef struct ts_dp ts_dp;

typedef struct ts_dp_stats {
    double exposed_s; /* time the caller waited in ts_dp_finish */
    double comm_s;    /* time the progress thread spent reducing buckets */
    int buckets;      /* buckets reduced */
    int early;        /* of them, queued while backward ran (before ts_dp_finish) */
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

/* ---- gradient compression ---- */
typedef struct ts_dp_compress {
    ts_compress_cfg cfg; /* TS_COMPRESS_NONE: plain float32 averages */
    int64_t warmup;      /* the first steps of this ts_dp are reduced uncompressed (parallel.compress_warmup) */
    /* Two-level groups (borrowed; both NULL: compression over the dp's whole group): the compressed
     * averaging runs over `group` (the replicas) after an exact float32 average over `inner` (the
     * replica's spatial pieces); group x inner must be the dp's group (ts_compressor_set_inner). */
    ts_coll *group, *inner;
    /* Where tensors start, in floats from the ts_dp's first gradient, ascending (borrowed; may be
     * NULL): sign's scale groups do not straddle them (ts_compressor_set_bounds). */
    const size_t *bounds;
    size_t nbounds;
} ts_dp_compress;

/* Local. Reads parallel.compress and parallel.compress_warmup (the keys are
 * declared with the layout's, src/parallel/layout.c); a bad value is
 * TS_ERR_CONFIG naming the key, where it was set and why, alike on every
 * rank. Whether compression combines with the other gradient paths is
 * ts_gradpath_choose's (src/train/gradpath.c). */
int ts_dp_compress_from_config(const ts_config *cfg, ts_dp_compress *out);
/* Local. Compresses the buckets from the next step on (fresh state: zero
 * residuals, PowerSGD's seeded Q); TS_COMPRESS_NONE switches it off. Every
 * rank of the group must set the same. With a group of one rank nothing is
 * sent and nothing is compressed. No step may be in flight. */
int ts_dp_set_compress(ts_dp *dp, const ts_dp_compress *c);

typedef struct ts_dp_compress_stats {
    ts_dp_compress c;
    int ranks;                  /* replicas compression runs over */
    int pieces;                 /* ranks averaged exactly first within a replica (1: none) */
    int buckets, compressed;    /* buckets, and those sent compressed (the others are too small to gain) */
    int64_t steps, compressed_steps; /* steps reduced since ts_dp_set_compress (or creation); compressed ones */
    ts_compress_bytes step;     /* one compressed step, per rank (float32 figures without compression) */
    ts_compress_bytes total;    /* summed over the steps, warm-up included */
    double compress_s;          /* compressing and decompressing (progress thread) */
} ts_dp_compress_stats;
/* Local. */
void ts_dp_compress_get(const ts_dp *dp, ts_dp_compress_stats *st);
/* Local. One line for people: the mode, bytes per rank and step, the ratio. */
void ts_dp_compress_describe(const ts_dp *dp, char *buf, size_t n);
/* Collective on stages (the pipeline group; MPI_COMM_SELF without one):
 * the perf.json member `"compress": {...}` into buf, the byte figures
 * summed over the stages (each reduces its own parameters). */
int ts_dp_compress_json(const ts_dp *dp, MPI_Comm stages, char *buf, size_t n);

#endif
