/* Gradient compression for data-parallel averaging: a compressed
 * replacement for `allreduce(AVG)` of float32 vectors, with the state that
 * lossy schemes carry between calls (error-feedback residuals, PowerSGD's
 * warm-started Q). Usable alone, like the rest of collectives/:
 *
 *   ts_compress_cfg cc;  ts_compress_parse("topk:0.01", &cc, why, sizeof why);  // local
 *   ts_compressor *z;  ts_compressor_create(coll, &cc, nseg, lens, &z);         // local
 *   ts_compress_allreduce(z, seg, buf);   // collective: buf = mean over ranks of the decompressed messages
 *   ts_compressor_destroy(&z);
 *
 * A compressor serves nseg segments (the trainer's gradient buckets), each
 * of a fixed length, reduced over the ranks of coll. Per call on segment s:
 *   none      plain float32 allreduce (AVG)
 *   bf16      cast to bfloat16, allreduce (SUM, float32 inside a rank), / p
 *   fp16      x / p cast to float16, allreduce (SUM), back to float32
 *   topk:R    error feedback; this rank's k = ceil(R n) largest |x| as
 *             (uint32 index, float32 value) pairs, allgathered, summed, / p
 *   sign      error feedback on both sides (1-bit Adam's compressed
 *             allreduce): signs and one scale (root mean square) per group of at
 *             most 256 elements (cut at tensor starts, see
 *             ts_compressor_set_bounds) of each p-th chunk, all-to-all, each rank averages
 *             its chunk and compresses it again (its own residual),
 *             allgather
 *   powersgd:R error feedback; the segment as an m x c matrix M (m =
 *             ceil(sqrt n)): P = M Q, allreduce P, orthogonalise P,
 *             Q = M^T P, allreduce Q, result P Q^T; Q warm-starts the next
 *             call (Vogels et al., NeurIPS 2019)
 * docs/parallelism.md gives costs and the bytes formulas. A segment whose
 * compressed message would not be smaller than its float32 form (tiny
 * segments) is reduced uncompressed. Every rank ends with bit-identical
 * results. A non-finite input on any rank makes the result non-finite on
 * every rank and resets that rank's residual of the segment (so that a
 * skipped step does not poison later ones). */
#ifndef TS_COLLECTIVES_COMPRESS_H
#define TS_COLLECTIVES_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/coll.h"

typedef enum {
    TS_COMPRESS_NONE = 0,
    TS_COMPRESS_BF16,
    TS_COMPRESS_FP16,
    TS_COMPRESS_TOPK,
    TS_COMPRESS_SIGN,
    TS_COMPRESS_POWERSGD,
} ts_compress_kind;

typedef struct ts_compress_cfg {
    ts_compress_kind kind;
    double ratio;  /* topk: fraction of each segment's elements sent, 0 < ratio <= 1 */
    int rank;      /* powersgd: the rank r, 1 <= r <= 1024 */
    int feedback;  /* error feedback for topk, sign, powersgd: 1 (what ts_compress_parse sets) or 0 */
    uint64_t seed; /* powersgd: seed of the initial Q (must be the same on every rank) */
    int group;     /* sign: elements per scale (0: TS_COMPRESS_SIGN_GROUP) */
} ts_compress_cfg;

/* sign: one scale (root mean square) per this many elements by default */
#define TS_COMPRESS_SIGN_GROUP 256

/* Local. Parses "none", "bf16", "fp16", "topk:RATIO", "sign",
 * "powersgd:RANK" into *out (feedback on, seed 0). Returns 0, or
 * TS_ERR_CONFIG with the reason in why (no error recorded: the caller names
 * the key). */
int ts_compress_parse(const char *s, ts_compress_cfg *out, char *why, size_t n);
/* Local. The canonical spelling ("topk:0.01", "powersgd:4", ...). */
void ts_compress_name(const ts_compress_cfg *c, char *buf, size_t n);

typedef struct ts_compressor ts_compressor;

/* Local. A compressor over coll's ranks (borrowed: it must outlive the
 * compressor) for nseg segments of len[s] floats each (len copied). State
 * starts at zero (residuals) and at the seeded random Q (powersgd), the
 * same on every rank for the same arguments. Errors: TS_ERR_ARG (bad cfg,
 * a topk segment of 2^32 floats or more), TS_ERR_NOMEM. */
int ts_compressor_create(ts_coll *coll, const ts_compress_cfg *cfg, int nseg, const size_t *len, ts_compressor **out);
/* Local. Waits for nothing: no operation may be in flight. NULL is fine. */
void ts_compressor_destroy(ts_compressor **z);

/* Collective on coll's ranks, in the same order everywhere. buf holds the
 * segment's len[seg] floats; on return it holds the average over ranks of
 * every rank's decompressed message (bit-identical on every rank), and the
 * segment's state is updated. */
int ts_compress_allreduce(ts_compressor *z, int seg, float *buf);
/* Collective. The same, queued on coll's progress thread (compression,
 * messages and decompression all run there); buf and the compressor must
 * stay untouched until ts_coll_wait(req). Operations on one compressor run
 * in call order; do not mix with ts_compress_allreduce while some are in
 * flight. */
int ts_compress_iallreduce(ts_compressor *z, int seg, float *buf, ts_coll_req **req);

/* Local. Two-level groups (data parallelism over replicas whose gradients
 * are themselves split, e.g. spatial pieces): each call first averages the
 * segment exactly in float32 over inner's ranks, then runs the compressed
 * averaging over coll's ranks, so the result is the average over coll x
 * inner and only the reduction over coll is lossy. inner is borrowed (it
 * must outlive the compressor) and used only by this compressor, on its
 * main channel, from whichever thread runs the calls. NULL: none. */
void ts_compressor_set_inner(ts_compressor *z, ts_coll *inner);

/* Local. Where tensors start inside segment seg (nb ascending offsets in
 * (0, len)): sign's scale groups (at most 256 elements each) then never
 * straddle two tensors, whose gradients can differ in scale by orders of
 * magnitude. Other kinds ignore it. Before the segment's first call, the
 * same on every rank. Errors: TS_ERR_ARG, TS_ERR_NOMEM. */
int ts_compressor_set_bounds(ts_compressor *z, int seg, const size_t *bounds, size_t nb);

/* Local. Zeroes every residual and restarts Q from its seed. */
void ts_compressor_reset(ts_compressor *z);

/* Bytes of one call on a segment, per rank. */
typedef struct ts_compress_bytes {
    double fp32;      /* the float32 vector this rank would contribute (4 n) */
    double payload;   /* its compressed message (padding included) */
    double wire_fp32; /* bytes a rank sends for the float32 ring allreduce: 2 (P-1)/P 4n over the P
                         ranks of coll x inner */
    double wire;      /* bytes a rank sends for the compressed exchange (ring-style allreduce or
                         allgather, pairwise all-to-all; plus the float32 ring allreduce over inner's
                         q ranks, 2 (q-1)/q 4n); docs/parallelism.md has the formulas */
} ts_compress_bytes;
/* Local. Adds segment seg's figures (or all segments' when seg < 0) to *b. */
void ts_compressor_bytes(const ts_compressor *z, int seg, ts_compress_bytes *b);
/* Local. Seconds spent compressing and decompressing (not in messages) so
 * far, on whichever thread ran the calls; read after the waits. */
double ts_compressor_seconds(const ts_compressor *z);

/* Local, for tests and reports. The segment's error-feedback residual
 * (len floats; NULL without feedback); for sign also this rank's server
 * residual: *srv (NULL otherwise) of *srv_len floats for elements from
 * *srv_off. */
const float *ts_compressor_residual(const ts_compressor *z, int seg, const float **srv, size_t *srv_off, size_t *srv_len);
/* Local. How a segment is sent: 1 if compressed, 0 if sent uncompressed
 * (too small to gain); powersgd's matrix rows x cols and rank (0 otherwise);
 * topk's k. Any pointer may be NULL. */
int ts_compressor_segment(const ts_compressor *z, int seg, size_t *rows, size_t *cols, int *rank, size_t *k);

#endif
