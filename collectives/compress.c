/* Gradient compression: compressed averaging of float32 segments with the
 * state lossy schemes need (see compress.h). Costs for a segment of n
 * floats on p ranks (α latency, β per byte sent, γ per element computed),
 * with the ring-style algorithms a network would use:
 *   none       2(p-1)α + 2(p-1)/p·4n·β + nγ
 *   bf16/fp16  2(p-1)α + 2(p-1)/p·2n·β + nγ           (2× fewer bytes)
 *   topk:R     (p-1)α + (p-1)·8k·β + (n + pk)γ, k = ⌈Rn⌉ (payload 4n/8k;
 *              the allgather's bytes grow with p)
 *   sign       2(p-1)α + 2(p-1)·(n/8p + n/64p)·β + 4nγ (1 bit and a
 *              float32 scale per 256 elements: ~28× fewer bytes)
 *   powersgd:r 4(p-1)α + 2(p-1)/p·4(m+c)r·β + 6nrγ   (M is m × c, m·c ≥ n)
 * References: Seide et al. 2014 and Karimireddy et al. 2019 (error
 * feedback); Tang et al. 2021 (1-bit Adam's compressed allreduce: worker and
 * server residuals); Vogels, Karimireddy and Jaggi, NeurIPS 2019 (PowerSGD).
 * Each call runs on one thread (the caller's, or the progress thread for
 * ts_compress_iallreduce) on one channel, so it needs no locks. */
#include "tsbuild.h"
#include "collectives/compress.h"
#include "collectives/coll_impl.h"
#include "src/core/timer.h"
#include "src/core/watchdog.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIGN_UNIT 512 /* sign chunks are whole multiples of 512 elements: 64 bytes of bits */
#define TOPK_HIST 65536

typedef struct seg {
    struct ts_compressor *z;
    int index;
    size_t n;
    int plain;     /* sent as float32 (compression would not be smaller) */
    float *e;      /* worker residual, n floats (NULL: no feedback) */
    size_t k, kpad; /* topk: elements sent, and the block's padded length (multiple of 8) */
    size_t chunk, blk, hdr; /* sign: elements per chunk, bytes per chunk message, bytes of its scales */
    size_t group;  /* sign: at most this many elements per scale */
    size_t *gs, *g0; /* sign: chunk j's groups start at gs[g0[j] .. g0[j+1]) (offsets in the chunk) */
    float *es;     /* sign: server residual of this rank's chunk */
    size_t rows, cols; /* powersgd: the matrix */
    int r;
    float *q;      /* powersgd: cols x r, row-major */
    float *buf;    /* the segment's vector while a queued call is in flight */
} seg;

struct ts_compressor {
    ts_coll *coll;
    ts_coll *inner; /* averaged over exactly first (ts_compressor_set_inner); NULL: none */
    ts_compress_cfg cfg;
    int p, me, nseg;
    seg *s;
    unsigned char *scratch;
    size_t scratch_bytes;
    MPI_Request *reqs; /* all-to-all requests */
    int nreqs;
    double compute_s, comm_s; /* comm_s: this call's time in messages (compute = total - comm) */
};

/* ---- names ---- */

int ts_compress_parse(const char *s, ts_compress_cfg *out, char *why, size_t n)
{
    memset(out, 0, sizeof *out);
    out->feedback = 1;
    const char *colon = s ? strchr(s, ':') : NULL;
    const size_t head = colon ? (size_t)(colon - s) : (s ? strlen(s) : 0);
    const char *arg = colon ? colon + 1 : NULL;
#define IS(name) (head == strlen(name) && !strncmp(s, name, head))
    if (!s || !*s) {
        snprintf(why, n, "empty value");
        return TS_ERR_CONFIG;
    }
    if (IS("none") || IS("bf16") || IS("fp16") || IS("sign")) {
        if (arg) {
            snprintf(why, n, "'%.*s' takes no parameter", (int)head, s);
            return TS_ERR_CONFIG;
        }
        out->kind = IS("none") ? TS_COMPRESS_NONE
                  : IS("bf16") ? TS_COMPRESS_BF16
                  : IS("fp16") ? TS_COMPRESS_FP16
                               : TS_COMPRESS_SIGN;
        return 0;
    }
    if (IS("topk")) {
        char *end = NULL;
        errno = 0;
        double r = arg && *arg ? strtod(arg, &end) : NAN;
        if (!arg || !*arg || *end || errno || !(r > 0 && r <= 1)) {
            snprintf(why, n, "topk needs a ratio in (0, 1] after the colon, the fraction of elements sent (e.g. "
                             "topk:0.01), not '%s'", arg ? arg : "");
            return TS_ERR_CONFIG;
        }
        out->kind = TS_COMPRESS_TOPK;
        out->ratio = r;
        return 0;
    }
    if (IS("powersgd")) {
        char *end = NULL;
        errno = 0;
        long r = arg && *arg ? strtol(arg, &end, 10) : 0;
        if (!arg || !*arg || *end || errno || r < 1 || r > 1024) {
            snprintf(why, n, "powersgd needs an integer rank from 1 to 1024 after the colon (e.g. powersgd:4), "
                             "not '%s'", arg ? arg : "");
            return TS_ERR_CONFIG;
        }
        out->kind = TS_COMPRESS_POWERSGD;
        out->rank = (int)r;
        return 0;
    }
#undef IS
    snprintf(why, n, "unknown compression '%s' (known: none, bf16, fp16, topk:RATIO, sign, powersgd:RANK)", s);
    return TS_ERR_CONFIG;
}

void ts_compress_name(const ts_compress_cfg *c, char *buf, size_t n)
{
    switch (c->kind) {
    case TS_COMPRESS_BF16: snprintf(buf, n, "bf16"); break;
    case TS_COMPRESS_FP16: snprintf(buf, n, "fp16"); break;
    case TS_COMPRESS_TOPK: snprintf(buf, n, "topk:%g", c->ratio); break;
    case TS_COMPRESS_SIGN: snprintf(buf, n, "sign"); break;
    case TS_COMPRESS_POWERSGD: snprintf(buf, n, "powersgd:%d", c->rank); break;
    default: snprintf(buf, n, "none"); break;
    }
}

/* ---- creation ---- */

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* PowerSGD's first Q: standard normal entries from the seed and the
 * segment, identical on every rank */
static void init_q(const ts_compressor *z, seg *s)
{
    uint64_t st = z->cfg.seed ^ (0x51ed27a3c0ffeeull * (uint64_t)(s->index + 1));
    const size_t m = s->cols * (size_t)s->r;
    for (size_t i = 0; i < m; i += 2) {
        double u1 = ((double)(splitmix(&st) >> 11) + 0.5) / 9007199254740992.0;
        double u2 = (double)(splitmix(&st) >> 11) / 9007199254740992.0;
        double rad = sqrt(-2.0 * log(u1));
        s->q[i] = (float)(rad * cos(2 * M_PI * u2));
        if (i + 1 < m) s->q[i + 1] = (float)(rad * sin(2 * M_PI * u2));
    }
}

static void chunk_range(const seg *s, int j, size_t *lo, size_t *len)
{
    size_t a = (size_t)j * s->chunk, b = a + s->chunk;
    if (a > s->n) a = s->n;
    if (b > s->n) b = s->n;
    *lo = a;
    *len = b - a;
}

/* sign: the scale groups of every chunk (at most s->group elements, never
 * across one of the nb ascending bounds), the message layout, and whether it
 * gains; returns the scratch bytes needed (0: plain) or TS_ERR_NOMEM */
static int sign_layout(ts_compressor *z, seg *s, const size_t *bounds, size_t nb, size_t *need)
{
    const size_t p = (size_t)z->p, G = s->group;
    size_t total = 0, most = 0;
    *need = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t k = 0, bi = 0;
        for (int j = 0; j < z->p; j++) {
            size_t lo, len;
            chunk_range(s, j, &lo, &len);
            if (pass) s->g0[j] = k;
            size_t cnt = 0;
            for (size_t g = 0; g < len;) {
                if (pass) s->gs[k] = g;
                k++;
                cnt++;
                size_t end = g + G < len ? g + G : len;
                while (bi < nb && bounds[bi] <= lo + g) bi++;
                if (bi < nb && bounds[bi] < lo + end) end = bounds[bi] - lo;
                g = end;
            }
            if (cnt > most) most = cnt;
        }
        if (pass) {
            s->g0[p] = k;
        } else {
            total = k;
            free(s->gs);
            free(s->g0);
            s->gs = TS_MALLOC((total + 1) * sizeof *s->gs);
            s->g0 = TS_MALLOC((p + 1) * sizeof *s->g0);
            if (!s->gs || !s->g0) return TS_ERR(TS_ERR_NOMEM, "sign groups");
        }
    }
    s->hdr = (most * sizeof(float) + 63) / 64 * 64; /* scales, whole cache lines */
    s->blk = s->hdr + s->chunk / 8;
    s->plain = p * s->blk >= 4 * s->n;
    *need = s->plain ? 0 : 2 * p * s->blk;
    return 0;
}

/* sets up segment s's layout and returns the scratch bytes it needs */
static size_t plan_segment(ts_compressor *z, seg *s)
{
    const size_t n = s->n, p = (size_t)z->p;
    const ts_compress_kind kind = z->cfg.kind;
    s->plain = kind == TS_COMPRESS_NONE || n == 0;
    if (s->plain) return 0;
    switch (kind) {
    case TS_COMPRESS_BF16:
    case TS_COMPRESS_FP16:
        return 2 * n;
    case TS_COMPRESS_TOPK: {
        size_t k = (size_t)ceil(z->cfg.ratio * (double)n);
        if (k < 1) k = 1;
        if (k > n) k = n;
        s->k = k;
        s->kpad = (k + 7) / 8 * 8;
        if (8 * s->kpad >= 4 * n) { /* indices and values would not be smaller */
            s->plain = 1;
            return 0;
        }
        return TOPK_HIST * sizeof(uint32_t) + p * 8 * s->kpad;
    }
    case TS_COMPRESS_SIGN: {
        size_t c = (n + p - 1) / p;
        c = (c + SIGN_UNIT - 1) / SIGN_UNIT * SIGN_UNIT;
        s->chunk = c;
        s->group = z->cfg.group ? (size_t)z->cfg.group : TS_COMPRESS_SIGN_GROUP;
        return 1; /* the layout (sign_layout) says how much */
    }
    case TS_COMPRESS_POWERSGD: {
        size_t m = (size_t)ceil(sqrt((double)n));
        while (m * m < n) m++;
        while (m > 1 && (m - 1) * (m - 1) >= n) m--;
        size_t c = (n + m - 1) / m;
        size_t r = (size_t)z->cfg.rank;
        if (r > m) r = m;
        if (r > c) r = c;
        s->rows = m;
        s->cols = c;
        s->r = (int)r;
        if ((m + c) * r >= n) {
            s->plain = 1;
            return 0;
        }
        return m * r * sizeof(float);
    }
    default:
        return 0;
    }
}

int ts_compressor_create(ts_coll *coll, const ts_compress_cfg *cfg, int nseg, const size_t *len, ts_compressor **out)
{
    int err = 0;
    *out = NULL;
    if (nseg < 0 || (nseg > 0 && !len)) return TS_ERR(TS_ERR_ARG, "compressor: %d segments", nseg);
    if (cfg->kind == TS_COMPRESS_TOPK && !(cfg->ratio > 0 && cfg->ratio <= 1))
        return TS_ERR(TS_ERR_ARG, "compressor: topk ratio %g is not in (0, 1]", cfg->ratio);
    if (cfg->kind == TS_COMPRESS_POWERSGD && (cfg->rank < 1 || cfg->rank > 1024))
        return TS_ERR(TS_ERR_ARG, "compressor: powersgd rank %d is not in 1..1024", cfg->rank);
    if ((unsigned)cfg->kind > TS_COMPRESS_POWERSGD) return TS_ERR(TS_ERR_ARG, "compressor: kind %d", (int)cfg->kind);
    ts_compressor *z = TS_CALLOC(1, sizeof *z);
    if (!z) return TS_ERR_NOMEM;
    z->coll = coll;
    z->cfg = *cfg;
    z->p = ts_coll_size(coll);
    z->me = ts_coll_rank(coll);
    z->nseg = nseg;
    z->s = TS_CALLOC((size_t)(nseg ? nseg : 1), sizeof *z->s);
    if (!z->s) TS_FAIL(TS_ERR_NOMEM, "compressor segments");
    const int fb = cfg->feedback && (cfg->kind == TS_COMPRESS_TOPK || cfg->kind == TS_COMPRESS_SIGN ||
                                     cfg->kind == TS_COMPRESS_POWERSGD);
    size_t need = 0;
    for (int i = 0; i < nseg; i++) {
        seg *s = &z->s[i];
        s->z = z;
        s->index = i;
        s->n = len[i];
        if (cfg->kind == TS_COMPRESS_TOPK && len[i] >= ((size_t)1 << 32))
            TS_FAIL(TS_ERR_ARG, "compressor: topk segment %d holds %zu floats; indices are 32-bit (at most 2^32 - 1 "
                    "floats per segment: use smaller buckets)", i, len[i]);
        size_t b = plan_segment(z, s);
        if (!s->plain && cfg->kind == TS_COMPRESS_SIGN) TS_CHECK(sign_layout(z, s, NULL, 0, &b));
        if (b > need) need = b;
        if (s->plain) continue;
        if (fb) {
            s->e = TS_CALLOC(s->n, sizeof *s->e);
            if (!s->e) TS_FAIL(TS_ERR_NOMEM, "compression residual of %zu floats", s->n);
        }
        if (fb && cfg->kind == TS_COMPRESS_SIGN) {
            s->es = TS_CALLOC(s->chunk, sizeof *s->es);
            if (!s->es) TS_FAIL(TS_ERR_NOMEM, "sign server residual");
        }
        if (cfg->kind == TS_COMPRESS_POWERSGD) {
            s->q = TS_MALLOC(s->cols * (size_t)s->r * sizeof *s->q);
            if (!s->q) TS_FAIL(TS_ERR_NOMEM, "PowerSGD Q");
            init_q(z, s);
        }
    }
    if (need) {
        z->scratch = TS_ALIGNED_ALLOC(need);
        if (!z->scratch) TS_FAIL(TS_ERR_NOMEM, "compression scratch of %zu bytes", need);
        z->scratch_bytes = need;
    }
    if (cfg->kind == TS_COMPRESS_SIGN) {
        z->nreqs = 2 * z->p;
        z->reqs = TS_CALLOC((size_t)z->nreqs, sizeof *z->reqs);
        if (!z->reqs) TS_FAIL(TS_ERR_NOMEM, "requests");
    }
    *out = z;
    return 0;
cleanup:
    ts_compressor_destroy(&z);
    return err;
}

void ts_compressor_destroy(ts_compressor **zp)
{
    if (!zp || !*zp) return;
    ts_compressor *z = *zp;
    for (int i = 0; z->s && i < z->nseg; i++) {
        free(z->s[i].e);
        free(z->s[i].es);
        free(z->s[i].q);
        free(z->s[i].gs);
        free(z->s[i].g0);
    }
    free(z->s);
    free(z->scratch);
    free(z->reqs);
    free(z);
    *zp = NULL;
}

void ts_compressor_set_inner(ts_compressor *z, ts_coll *inner) { z->inner = inner; }

int ts_compressor_set_bounds(ts_compressor *z, int i, const size_t *bounds, size_t nb)
{
    if (i < 0 || i >= z->nseg) return TS_ERR(TS_ERR_ARG, "compressor: segment %d of %d", i, z->nseg);
    seg *s = &z->s[i];
    for (size_t k = 0; k < nb; k++)
        if (bounds[k] == 0 || bounds[k] >= s->n || (k && bounds[k] <= bounds[k - 1]))
            return TS_ERR(TS_ERR_ARG, "compressor: bound %zu (%zu) is not ascending inside segment %d of %zu floats", k,
                          bounds[k], i, s->n);
    if (z->cfg.kind != TS_COMPRESS_SIGN || s->plain) return 0;
    size_t need;
    TS_TRY(sign_layout(z, s, bounds, nb, &need));
    if (need > z->scratch_bytes) {
        unsigned char *b = TS_ALIGNED_ALLOC(need);
        if (!b) return TS_ERR(TS_ERR_NOMEM, "compression scratch of %zu bytes", need);
        free(z->scratch);
        z->scratch = b;
        z->scratch_bytes = need;
    }
    return 0;
}

void ts_compressor_reset(ts_compressor *z)
{
    for (int i = 0; i < z->nseg; i++) {
        seg *s = &z->s[i];
        if (s->e) memset(s->e, 0, s->n * sizeof *s->e);
        if (s->es) memset(s->es, 0, s->chunk * sizeof *s->es);
        if (s->q) init_q(z, s);
    }
}

/* ---- helpers ---- */

/* a collective on channel ch (the caller's main channel or the progress thread's) */
static int chan_run(ts_compressor *z, ts_chan *ch, ts_coll_kind kind, void *buf, size_t count, ts_dtype dt, ts_op op)
{
    ts_coll_args a = {.kind = kind, .recvbuf = buf, .count = count, .dt = dt, .op = op};
    double t = ts_time_now();
    int rc = ts_coll_dispatch(z->coll, ch, &a, -1);
    z->comm_s += ts_time_now() - t;
    return rc;
}

/* x += e (when e), then 1 if every x is finite */
static int add_residual(float *restrict x, const float *restrict e, size_t n)
{
    int bad = 0;
    if (e)
        for (size_t i = 0; i < n; i++) x[i] += e[i];
    for (size_t i = 0; i < n; i++) bad |= !isfinite(x[i]);
    return !bad;
}

/* ---- bf16 / fp16 ---- */

static int run_half(ts_compressor *z, ts_chan *ch, seg *s, float *x)
{
    uint16_t *h = (uint16_t *)z->scratch;
    const size_t n = s->n;
    const float p = (float)z->p;
    if (z->cfg.kind == TS_COMPRESS_BF16) { /* bfloat16 has float32's range: sum, then divide */
        for (size_t i = 0; i < n; i++) h[i] = ts_f32_to_bf16(x[i]);
        TS_TRY(chan_run(z, ch, TS_COLL_ALLREDUCE, h, n, TS_BFLOAT16, TS_OP_SUM));
        for (size_t i = 0; i < n; i++) x[i] = ts_bf16_to_f32(h[i]) / p;
    } else { /* float16 overflows at 65504: divide first (as PyTorch's fp16 hook) */
        for (size_t i = 0; i < n; i++) h[i] = ts_f32_to_f16(x[i] / p);
        TS_TRY(chan_run(z, ch, TS_COLL_ALLREDUCE, h, n, TS_FLOAT16, TS_OP_SUM));
        for (size_t i = 0; i < n; i++) x[i] = ts_f16_to_f32(h[i]);
    }
    return 0;
}

/* ---- topk ---- */

static inline uint32_t abs_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return u & 0x7fffffffu; /* non-negative floats order like their bit patterns */
}

/* The bit pattern t of the k-th largest |x| (1 <= k <= n, x finite) by two
 * 16-bit histogram passes; *eq gets how many elements equal to t belong to
 * the k largest (those above t all do). */
static uint32_t kth_largest_abs(const float *x, size_t n, size_t k, uint32_t *hist, size_t *eq)
{
    memset(hist, 0, TOPK_HIST * sizeof *hist);
    for (size_t i = 0; i < n; i++) hist[abs_bits(x[i]) >> 16]++;
    size_t need = k;
    int hi = TOPK_HIST - 1;
    for (; hi > 0 && hist[hi] < need; hi--) need -= hist[hi];
    memset(hist, 0, TOPK_HIST * sizeof *hist);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = abs_bits(x[i]);
        if ((int)(u >> 16) == hi) hist[u & 0xffffu]++;
    }
    int lo = TOPK_HIST - 1;
    for (; lo > 0 && hist[lo] < need; lo--) need -= hist[lo];
    *eq = need;
    return ((uint32_t)hi << 16) | (uint32_t)lo;
}

static int run_topk(ts_compressor *z, ts_chan *ch, seg *s, float *x)
{
    const size_t n = s->n, kp = s->kpad;
    const int p = z->p;
    uint32_t *hist = (uint32_t *)z->scratch;
    uint32_t *all = hist + TOPK_HIST; /* p blocks of [kpad indices, kpad values] */
    uint32_t *idx = all + (size_t)z->me * 2 * kp;
    float *val = (float *)(idx + kp);
    double t0 = ts_time_now();
    const int ok = add_residual(x, s->e, n);
    size_t got = 0;
    if (ok) {
        size_t eq;
        const uint32_t t = kth_largest_abs(x, n, s->k, hist, &eq);
        for (size_t i = 0; i < n; i++) {
            const uint32_t u = abs_bits(x[i]);
            int take = u > t || (u == t && eq > 0);
            if (take) {
                if (u == t) eq--;
                idx[got] = (uint32_t)i;
                val[got++] = x[i];
            }
            if (s->e) s->e[i] = take ? 0.0f : x[i];
        }
    } else { /* non-finite input: every rank's result becomes non-finite; this rank's residual restarts */
        if (s->e) memset(s->e, 0, n * sizeof *s->e);
        for (; got < s->k; got++) {
            idx[got] = (uint32_t)(got % n);
            val[got] = NAN;
        }
    }
    for (; got < kp; got++) {
        idx[got] = 0;
        val[got] = 0.0f;
    }
    z->compute_s += ts_time_now() - t0;
    TS_TRY(chan_run(z, ch, TS_COLL_ALLGATHER, all, (size_t)p * 2 * kp, TS_INT32, TS_OP_SUM));
    t0 = ts_time_now();
    memset(x, 0, n * sizeof *x);
    for (int q = 0; q < p; q++) { /* rank order: the same sums everywhere */
        const uint32_t *qi = all + (size_t)q * 2 * kp;
        const float *qv = (const float *)(qi + kp);
        for (size_t j = 0; j < kp; j++) {
            if (qi[j] >= n)
                return TS_ERR(TS_ERR_MISMATCH, "topk: rank %d sent index %u for a segment of %zu floats (segment "
                                               "lengths differ between ranks?)", q, qi[j], n);
            x[qi[j]] += qv[j];
        }
    }
    for (size_t i = 0; i < n; i++) x[i] /= (float)p;
    z->compute_s += ts_time_now() - t0;
    return 0;
}

/* ---- sign (1-bit, compressed allreduce with worker and server residuals) ---- */

/* a group's scale: its root mean square, so that scale x signs keeps the
 * group's l2 norm (DeepSpeed's 1-bit Adam does the same; mean |y|, the
 * l2-closest scale, converged visibly worse on the synthetic task:
 * docs/performance.md) */
static float rms(const float *y, size_t len, int ok)
{
    if (!ok) return NAN;
    if (!len) return 0.0f;
    double q = 0;
    for (size_t i = 0; i < len; i++) q += (double)y[i] * y[i];
    return (float)sqrt(q / (double)len);
}

/* packs y[0..len), chunk j of segment s, into a chunk message b: per
 * group its scale (rms, NaN when !ok), then one bit per element (1:
 * y >= 0); r (may be NULL) gets y - decompressed */
static void sign_pack(const seg *s, int j, unsigned char *b, const float *y, size_t len, int ok, float *r)
{
    memset(b, 0, s->blk);
    float *sc = (float *)b;
    unsigned char *bits = b + s->hdr;
    const size_t *gs = s->gs + s->g0[j], ng = s->g0[j + 1] - s->g0[j];
    for (size_t gi = 0; gi < ng; gi++) {
        const size_t a0 = gs[gi], a1 = gi + 1 < ng ? gs[gi + 1] : len;
        const float a = rms(y + a0, a1 - a0, ok);
        sc[gi] = a;
        for (size_t i = a0; i < a1; i++) {
            const int pos = y[i] >= 0.0f;
            bits[i >> 3] |= (unsigned char)(pos << (i & 7));
            if (r) r[i] = y[i] - (pos ? a : -a);
        }
    }
}

/* out[0..len) (+)= chunk j's message b decompressed */
static void sign_unpack(const seg *s, int j, const unsigned char *b, float *out, size_t len, int add)
{
    const float *sc = (const float *)b;
    const unsigned char *bits = b + s->hdr;
    const size_t *gs = s->gs + s->g0[j], ng = s->g0[j + 1] - s->g0[j];
    for (size_t gi = 0; gi < ng; gi++) {
        const size_t a0 = gs[gi], a1 = gi + 1 < ng ? gs[gi + 1] : len;
        const float a = sc[gi];
        for (size_t i = a0; i < a1; i++) {
            const float v = (bits[i >> 3] >> (i & 7)) & 1 ? a : -a;
            out[i] = add ? out[i] + v : v;
        }
    }
}

/* chunk q of every rank's message to rank q: pairwise exchange on ch */
static int alltoall(ts_compressor *z, ts_chan *ch, const unsigned char *send, unsigned char *recv, size_t blk)
{
    double t = ts_time_now();
    int nr = 0;
    for (int q = 0; q < z->p; q++) {
        if (q == z->me) {
            memcpy(recv + (size_t)q * blk, send + (size_t)q * blk, blk);
            continue;
        }
        TS_MPI_TRY(MPI_Irecv(recv + (size_t)q * blk, (int)blk, MPI_BYTE, q, TS_TAG_A2A, ch->comm, &z->reqs[nr++]));
        TS_MPI_TRY(MPI_Isend(send + (size_t)q * blk, (int)blk, MPI_BYTE, q, TS_TAG_A2A, ch->comm, &z->reqs[nr++]));
    }
    int rc = ts_p2p_waitall(z->reqs, nr);
    z->comm_s += ts_time_now() - t;
    return rc;
}

static int run_sign(ts_compressor *z, ts_chan *ch, seg *s, float *x)
{
    const int p = z->p;
    const size_t blk = s->blk;
    unsigned char *A = z->scratch, *B = A + (size_t)p * blk;
    if (blk > INT_MAX) return TS_ERR(TS_ERR_UNSUPPORTED, "sign: a chunk message of %zu bytes (use smaller buckets)", blk);
    double t0 = ts_time_now();
    /* worker: signs and a scale per chunk, residual e = x - decompressed */
    const int ok = add_residual(x, s->e, s->n);
    if (!ok && s->e) memset(s->e, 0, s->n * sizeof *s->e);
    for (int j = 0; j < p; j++) {
        size_t lo, len;
        chunk_range(s, j, &lo, &len);
        sign_pack(s, j, A + (size_t)j * blk, x + lo, len, ok, s->e && ok ? s->e + lo : NULL);
    }
    z->compute_s += ts_time_now() - t0;
    TS_TRY(alltoall(z, ch, A, B, blk));
    /* server: the average of every rank's decompressed chunk `me`, compressed again */
    t0 = ts_time_now();
    size_t lo, len;
    chunk_range(s, z->me, &lo, &len);
    float *y = x + lo; /* this chunk of x was packed already: reuse it */
    memset(y, 0, len * sizeof *y);
    for (int q = 0; q < p; q++) sign_unpack(s, z->me, B + (size_t)q * blk, y, len, 1);
    for (size_t i = 0; i < len; i++) y[i] /= (float)p;
    const int ok2 = add_residual(y, s->es, len);
    if (!ok2 && s->es) memset(s->es, 0, s->chunk * sizeof *s->es);
    sign_pack(s, z->me, A + (size_t)z->me * blk, y, len, ok2, ok2 ? s->es : NULL);
    z->compute_s += ts_time_now() - t0;
    TS_TRY(chan_run(z, ch, TS_COLL_ALLGATHER, A, (size_t)p * blk / 4, TS_INT32, TS_OP_SUM));
    /* every chunk, decompressed */
    t0 = ts_time_now();
    for (int q = 0; q < p; q++) {
        chunk_range(s, q, &lo, &len);
        sign_unpack(s, q, A + (size_t)q * blk, x + lo, len, 0);
    }
    z->compute_s += ts_time_now() - t0;
    return 0;
}

/* ---- powersgd ---- */

/* x is the m x c matrix of the segment, row-major, zero past n */
static void mat_xq(const float *x, size_t n, size_t m, size_t c, const float *q, int r, float *P)
{
    for (size_t i = 0; i < m; i++) {
        float *pr = P + i * (size_t)r;
        for (int t = 0; t < r; t++) pr[t] = 0.0f;
        const size_t lo = i * c, hi = lo + c < n ? lo + c : n;
        for (size_t j = lo; j < hi; j++) {
            const float xv = x[j], *qr = q + (j - lo) * (size_t)r;
            for (int t = 0; t < r; t++) pr[t] += xv * qr[t];
        }
    }
}

static void mat_xtp(const float *x, size_t n, size_t m, size_t c, const float *P, int r, float *q)
{
    memset(q, 0, c * (size_t)r * sizeof *q);
    for (size_t i = 0; i < m; i++) {
        const float *pr = P + i * (size_t)r;
        const size_t lo = i * c, hi = lo + c < n ? lo + c : n;
        for (size_t j = lo; j < hi; j++) {
            const float xv = x[j];
            float *qr = q + (j - lo) * (size_t)r;
            for (int t = 0; t < r; t++) qr[t] += xv * pr[t];
        }
    }
}

static void mat_pqt(float *x, size_t n, size_t m, size_t c, const float *P, const float *q, int r)
{
    for (size_t i = 0; i < m; i++) {
        const float *pr = P + i * (size_t)r;
        const size_t lo = i * c, hi = lo + c < n ? lo + c : n;
        for (size_t j = lo; j < hi; j++) {
            const float *qr = q + (j - lo) * (size_t)r;
            float v = 0.0f;
            for (int t = 0; t < r; t++) v += pr[t] * qr[t];
            x[j] = v;
        }
    }
}

/* modified Gram-Schmidt on P's r columns (double sums); a column with no
 * component left becomes zero */
static void orthogonalize(float *P, size_t m, int r)
{
    for (int j = 0; j < r; j++) {
        for (int k = 0; k < j; k++) {
            double d = 0;
            for (size_t i = 0; i < m; i++) d += (double)P[i * (size_t)r + (size_t)j] * P[i * (size_t)r + (size_t)k];
            for (size_t i = 0; i < m; i++) P[i * (size_t)r + (size_t)j] -= (float)d * P[i * (size_t)r + (size_t)k];
        }
        double nn = 0;
        for (size_t i = 0; i < m; i++) nn += (double)P[i * (size_t)r + (size_t)j] * P[i * (size_t)r + (size_t)j];
        const float f = nn > 0 && isfinite(nn) ? (float)(1.0 / sqrt(nn)) : (nn == 0 ? 0.0f : NAN);
        for (size_t i = 0; i < m; i++) P[i * (size_t)r + (size_t)j] *= f;
    }
}

static int run_powersgd(ts_compressor *z, ts_chan *ch, seg *s, float *x)
{
    const size_t n = s->n, m = s->rows, c = s->cols;
    const int r = s->r;
    float *P = (float *)z->scratch;
    double t0 = ts_time_now();
    const int ok = add_residual(x, s->e, n);
    mat_xq(x, n, m, c, s->q, r, P);
    z->compute_s += ts_time_now() - t0;
    TS_TRY(chan_run(z, ch, TS_COLL_ALLREDUCE, P, m * (size_t)r, TS_FLOAT32, TS_OP_AVG));
    t0 = ts_time_now();
    orthogonalize(P, m, r);
    mat_xtp(x, n, m, c, P, r, s->q);
    z->compute_s += ts_time_now() - t0;
    TS_TRY(chan_run(z, ch, TS_COLL_ALLREDUCE, s->q, c * (size_t)r, TS_FLOAT32, TS_OP_AVG));
    t0 = ts_time_now();
    if (s->e) memcpy(s->e, x, n * sizeof *x);
    mat_pqt(x, n, m, c, P, s->q, r);
    if (s->e)
        for (size_t i = 0; i < n; i++) s->e[i] -= x[i];
    int qok = 1; /* the averaged Q is the same everywhere: every rank restarts it alike */
    for (size_t i = 0; i < c * (size_t)r; i++) qok &= isfinite(s->q[i]) != 0;
    if (!qok) init_q(z, s);
    if (!ok && s->e) memset(s->e, 0, n * sizeof *s->e); /* non-finite input: this rank's residual restarts */
    z->compute_s += ts_time_now() - t0;
    return 0;
}

/* ---- entry points ---- */

static int run_segment(ts_compressor *z, ts_chan *ch, seg *s, float *x)
{
    if (z->inner && ts_coll_size(z->inner) > 1) { /* the exact level first (float32, on inner's own channel) */
        ts_coll_args a = {.kind = TS_COLL_ALLREDUCE, .recvbuf = x, .count = s->n, .dt = TS_FLOAT32, .op = TS_OP_AVG};
        double t = ts_time_now();
        int rc = ts_coll_dispatch(z->inner, &z->inner->main, &a, -1);
        z->comm_s += ts_time_now() - t;
        TS_TRY(rc);
    }
    if (s->plain) return chan_run(z, ch, TS_COLL_ALLREDUCE, x, s->n, TS_FLOAT32, TS_OP_AVG);
    switch (z->cfg.kind) {
    case TS_COMPRESS_BF16:
    case TS_COMPRESS_FP16: {
        double t = ts_time_now(), c0 = z->comm_s;
        int rc = run_half(z, ch, s, x);
        z->compute_s += ts_time_now() - t - (z->comm_s - c0);
        return rc;
    }
    case TS_COMPRESS_TOPK: return run_topk(z, ch, s, x);
    case TS_COMPRESS_SIGN: return run_sign(z, ch, s, x);
    case TS_COMPRESS_POWERSGD: return run_powersgd(z, ch, s, x);
    default: return TS_ERR(TS_ERR_INTERNAL, "compressor kind %d", (int)z->cfg.kind);
    }
}

static int task(ts_coll *c, ts_chan *ch, void *ctx)
{
    (void)c;
    seg *s = ctx;
    return run_segment(s->z, ch, s, s->buf);
}

int ts_compress_allreduce(ts_compressor *z, int i, float *buf)
{
    if (i < 0 || i >= z->nseg) return TS_ERR(TS_ERR_ARG, "compressor: segment %d of %d", i, z->nseg);
    ts_watch_enter("compressed allreduce", "collective", z->s[i].n * sizeof(float));
    int rc = run_segment(z, &z->coll->main, &z->s[i], buf);
    ts_watch_leave();
    return rc;
}

int ts_compress_iallreduce(ts_compressor *z, int i, float *buf, ts_coll_req **req)
{
    *req = NULL;
    if (i < 0 || i >= z->nseg) return TS_ERR(TS_ERR_ARG, "compressor: segment %d of %d", i, z->nseg);
    z->s[i].buf = buf;
    return ts_coll_enqueue_task(z->coll, task, &z->s[i], req);
}

/* ---- figures ---- */

static void seg_bytes(const ts_compressor *z, const seg *s, ts_compress_bytes *b)
{
    const double n = (double)s->n, p = z->p, ring = 2.0 * (p - 1) / p;
    const double q = z->inner ? ts_coll_size(z->inner) : 1, all = p * q;
    double pay = 4 * n, wire;
    b->fp32 += 4 * n;
    b->wire_fp32 += 2.0 * (all - 1) / all * 4 * n;
    b->wire += 2.0 * (q - 1) / q * 4 * n; /* the exact level */
    if (s->plain) {
        wire = ring * 4 * n;
    } else {
        switch (z->cfg.kind) {
        case TS_COMPRESS_BF16:
        case TS_COMPRESS_FP16:
            pay = 2 * n;
            wire = ring * pay;
            break;
        case TS_COMPRESS_TOPK:
            pay = 8.0 * (double)s->kpad;
            wire = (p - 1) * pay;
            break;
        case TS_COMPRESS_SIGN:
            pay = p * (double)s->blk;
            wire = 2 * (p - 1) * (double)s->blk;
            break;
        case TS_COMPRESS_POWERSGD:
            pay = 4.0 * (double)(s->rows + s->cols) * s->r;
            wire = ring * pay;
            break;
        default:
            wire = ring * pay;
            break;
        }
    }
    b->payload += pay;
    b->wire += wire;
}

void ts_compressor_bytes(const ts_compressor *z, int i, ts_compress_bytes *b)
{
    for (int k = 0; k < z->nseg; k++)
        if (i < 0 || k == i) seg_bytes(z, &z->s[k], b);
}

double ts_compressor_seconds(const ts_compressor *z) { return z->compute_s; }

const float *ts_compressor_residual(const ts_compressor *z, int i, const float **srv, size_t *srv_off, size_t *srv_len)
{
    if (srv) *srv = NULL;
    if (srv_off) *srv_off = 0;
    if (srv_len) *srv_len = 0;
    if (i < 0 || i >= z->nseg) return NULL;
    const seg *s = &z->s[i];
    if (s->es) {
        size_t lo, len;
        chunk_range(s, z->me, &lo, &len);
        if (srv) *srv = s->es;
        if (srv_off) *srv_off = lo;
        if (srv_len) *srv_len = len;
    }
    return s->e;
}

int ts_compressor_segment(const ts_compressor *z, int i, size_t *rows, size_t *cols, int *rank, size_t *k)
{
    if (i < 0 || i >= z->nseg) return 0;
    const seg *s = &z->s[i];
    if (rows) *rows = s->rows;
    if (cols) *cols = s->cols;
    if (rank) *rank = s->r;
    if (k) *k = s->k;
    return !s->plain;
}
