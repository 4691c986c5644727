/* Winograd F(2x2x2, 3x3x3) for the 3x3x3, stride 1, padding 1 convolution
 * on channels-last fp32 data: the forward (ts_conv3d_winograd_forward and
 * ts_nn_set_winograd, layers.h), the input gradient (the same with the
 * flipped, transposed weights) and the weight gradient
 * (ts_nn_winograd_wgrad, at the end); docs/engine.md, "Winograd
 * convolution". Each
 * 2x2x2 block of outputs (a tile) is read from its 4x4x4 input block:
 *   V = B^T d B (per dim), M[xi] = sum_c V[xi][c] U[xi][c][:], y = A^T M A
 * with U = G w G^T the transformed weights, 64 transform points xi instead
 * of 27 taps per output voxel: 64 instead of 216 multiplications per tile
 * and channel pair. The transforms are additions (B, A: entries 0, +-1; G:
 * 0, +-1/2, 1). Not the same bits as the direct convolution (other sums in
 * another order): relative differences of about 1e-6 (tests/nn/test_winograd).
 *
 * A work item is a set of tiles: one sample, one pair of output planes, a
 * block of row pairs and of column pairs. Its input is staged (zero-padded,
 * channels padded to 16) in a slab, transformed into V[64][T][cp], multiplied
 * per transform point into M[64][T][op] by register-blocked micro-kernels
 * (tiles x 16-lane output-channel vectors, input channels broadcast), and M
 * transformed back into the outputs with the bias and the epilogue. Items
 * write disjoint outputs: the results do not depend on the threads (the
 * weight gradient sums fixed chunks of items in order, to the same end).
 * Where the convolution precision is bf16, V, U (and the weight gradient's
 * A dy A^T) leave their fp32 transforms rounded to bf16 words (put_pt) and
 * the products run in winograd_bf16.c; the rest is the same code. */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/nn/conv_impl.h"
#include "src/nn/norm_impl.h" /* ts_nn_act16: the epilogue's activation */
#include "src/nn/winograd_impl.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


/* The transformed weights: fp32 U[xi][c][op] (op: OC padded to 16 with
 * zeros), or with bf U[xi][k][op] as 32-bit words of bf16 pairs, channel
 * 2k in the low half and 2k + 1 (zero past C) in the high half, k <
 * (C + 1) / 2 (winograd_bf16.c's layout) */
static void weights(const float *w, int flip, int C, int OC, int op, int bf, void *Uv)
{
    const int nb = op / 16, K = bf ? (C + 1) / 2 : C;
    /* 16 output channels at a time, one per lane */
#pragma omp parallel for schedule(static)
    for (long it = 0; it < (long)K * nb; it++) {
        const int k = (int)(it / nb), oc0 = (int)(it % nb) * 16;
        v16 u[64];
        wt_chan(w, flip, C, OC, bf ? 2 * k : k, oc0, u);
        if (!bf) {
            for (int xi = 0; xi < 64; xi++) vst((float *)Uv + ((size_t)xi * C + k) * op + oc0, u[xi]);
            continue;
        }
        v16 h[64];
        wt_chan(w, flip, C, OC, 2 * k + 1, oc0, h);
        for (int xi = 0; xi < 64; xi++)
            *(v16iu *)((uint32_t *)Uv + ((size_t)xi * K + k) * op + oc0) = bf16_bits(u[xi]) | bf16_bits(h[xi]) << 16;
    }
}

int ts_nn_winograd_fits(const ts_conv_geom *g) { return g->C >= 16 && g->OC >= 16 && g->OC <= 2048; }

static atomic_int wino_on;

int ts_nn_set_winograd(int on)
{
    atomic_store(&wino_on, on != 0);
    return 0;
}

int ts_nn_winograd_on(void) { return atomic_load(&wino_on); }

/* Transformed weights cached per calling thread: one entry per weight
 * tensor (its address). Weights seen for the first time are transformed
 * into scratch and only a 64-bit hash of their bits is kept; seen again
 * with the same hash, they are transformed into the cache with a copy of
 * the weights they came from, and from then on used again only while the
 * weights are equal to the copy, bit for bit (a memcmp per call, far
 * cheaper than the transform; training's updates in place are seen). The
 * hash decides only whether to cache: what is cached is always transformed
 * from the weights of that call. Weights that change between calls (being
 * trained) are never cached (no transform or copy held per layer: training
 * needs only the scratch of one layer); weights found changed after being
 * cached lose their entry's memory likewise. At most CACHE_MAX bytes;
 * beyond that the oldest entry is dropped.
 * ts_nn_winograd_release (ts_nn_release_scratch) frees them. */
#define CACHE_N 64
#define CACHE_MAX ((size_t)1 << 30)
static _Thread_local struct wcache {
    const float *key;
    int C, OC, flip, bf;
    uint64_t hash; /* of the weights last seen, while not cached */
    float *copy;   /* [OC * C * 27]; NULL while not cached */
    void *U;       /* as weights() writes it; NULL while not cached */
    unsigned long used;
} cache[CACHE_N];
static _Thread_local unsigned long cache_clock;

void ts_nn_winograd_release(void)
{
    for (int i = 0; i < CACHE_N; i++) {
        free(cache[i].copy);
        free(cache[i].U);
        cache[i] = (struct wcache){0};
    }
}

/* the bytes of weights()' output: U of C -> OC channels, fp32 or bf16 pairs */
static size_t u_bytes(int C, int OC, int bf)
{
    return (size_t)64 * (bf ? (C + 1) / 2 : C) * ts_nn_pad16(OC) * sizeof(float);
}

static size_t cache_bytes(const struct wcache *e)
{
    return e->U ? (size_t)e->OC * e->C * 27 * sizeof(float) + u_bytes(e->C, e->OC, e->bf) : 0;
}

size_t ts_nn_winograd_cache_bytes(void)
{
    size_t n = 0;
    for (int i = 0; i < CACHE_N; i++) n += cache_bytes(&cache[i]);
    return n;
}

static void cache_drop(struct wcache *e)
{
    free(e->copy);
    free(e->U);
    e->copy = NULL;
    e->U = NULL;
}

/* a 64-bit hash of n floats' bits (four multiply-xorshift lanes) */
static uint64_t bits_hash(const float *w, size_t n)
{
    uint64_t h[4] = {0x9e3779b97f4a7c15u, 0xbf58476d1ce4e5b9u, 0x94d049bb133111ebu, 0x2545f4914f6cdd1du};
    const uint64_t k = 0xff51afd7ed558ccdu;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 4; j++) {
            uint64_t v;
            memcpy(&v, w + i + 2 * j, sizeof v);
            h[j] = (h[j] ^ v) * k;
            h[j] ^= h[j] >> 29;
        }
    uint64_t r = n;
    for (; i < n; i++) {
        uint32_t v;
        memcpy(&v, w + i, sizeof v);
        r = (r ^ v) * k;
    }
    for (int j = 0; j < 4; j++) r = (r ^ h[j]) * k, r ^= r >> 32;
    return r;
}

/* U transformed into this call's scratch */
static const void *scratch_U(const float *w, int flip, int C, int OC, int op, int bf)
{
    void *U = ts_nn_scratch(1, u_bytes(C, OC, bf));
    if (U) weights(w, flip, C, OC, op, bf, U);
    return U;
}

/* U of w (see weights): the cached one where w is unchanged, else
 * transformed into scratch, or into the cache where w is seen unchanged
 * for the second time and fits; NULL: out of memory */
static const void *transformed(const float *w, int flip, int C, int OC, int op, int bf)
{
    const size_t wn = (size_t)OC * C * 27, ub = u_bytes(C, OC, bf);
    struct wcache *e = NULL;
    for (int i = 0; i < CACHE_N; i++)
        if (cache[i].key == w && cache[i].C == C && cache[i].OC == OC && cache[i].flip == flip && cache[i].bf == bf)
            e = &cache[i];
    if (e && e->U && !memcmp(e->copy, w, wn * sizeof(float))) {
        e->used = ++cache_clock;
        return e->U;
    }
    const uint64_t h = bits_hash(w, wn);
    if (!e || e->U || e->hash != h) { /* new, changed since cached, or changed since last seen */
        if (!e) { /* a free entry, else the least recently used one */
            for (int i = 0; i < CACHE_N && !e; i++)
                if (!cache[i].key) e = &cache[i];
            if (!e) {
                e = &cache[0];
                for (int i = 1; i < CACHE_N; i++)
                    if (cache[i].used < e->used) e = &cache[i];
            }
        }
        cache_drop(e);
        *e = (struct wcache){w, C, OC, flip, bf, h, NULL, NULL, ++cache_clock};
        return scratch_U(w, flip, C, OC, op, bf);
    }
    /* the second call with these weights: cached, the oldest entries dropped until it fits */
    e->used = ++cache_clock;
    size_t total = wn * sizeof(float) + ub;
    for (int i = 0; i < CACHE_N; i++) total += cache_bytes(&cache[i]);
    while (total > CACHE_MAX) {
        struct wcache *old = NULL;
        for (int i = 0; i < CACHE_N; i++)
            if (cache[i].U && &cache[i] != e && (!old || cache[i].used < old->used)) old = &cache[i];
        if (!old) return scratch_U(w, flip, C, OC, op, bf); /* too large to cache at all */
        total -= cache_bytes(old);
        cache_drop(old);
    }
    e->copy = malloc(wn * sizeof(float));
    e->U = TS_ALIGNED_ALLOC(ub);
    if (!e->copy || !e->U) {
        cache_drop(e);
        return scratch_U(w, flip, C, OC, op, bf);
    }
    memcpy(e->copy, w, wn * sizeof(float));
    weights(w, flip, C, OC, op, bf, e->U);
    return e->U;
}

/* The micro-kernels: m[i][:] = (m[i][:] if acc, else 0) + sum over k < K
 * of v[i vi + k vk] u[k op + :] for rows i < TB and NV 16-lane vectors,
 * rows of m op floats apart. The forward takes rows = tiles, k = input
 * channels (vi = cp, vk = 1); the weight gradient rows = input channels,
 * k = tiles (vi = 1, vk = cp, accumulating). One function per (TB, NV),
 * array sizes constant, so that the accumulators stay in registers. */
#define DEF_GEMM(TB, NV)                                                                                             \
    static void gemm_##TB##x##NV(const float *v, size_t vi, size_t vk, const float *u, int op, int K, float *m,      \
                                 int acc)                                                                            \
    {                                                                                                                \
        v16 a[TB][NV];                                                                                               \
        _Pragma("GCC unroll 16") for (int i = 0; i < TB; i++) _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)  \
            a[i][j] = acc ? vld(m + (size_t)i * op + 16 * j) : (v16){0};                                             \
        for (int k = 0; k < K; k++) {                                                                                \
            const float *vr = v + (size_t)k * vk;                                                                    \
            v16 uc[NV];                                                                                              \
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) uc[j] = vld(u + (size_t)k * op + 16 * j);          \
            _Pragma("GCC unroll 16") for (int i = 0; i < TB; i++)                                                    \
            {                                                                                                        \
                const float x = vr[(size_t)i * vi];                                                                  \
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[i][j] += x * uc[j];                           \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("GCC unroll 16") for (int i = 0; i < TB; i++) _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)  \
            vst(m + (size_t)i * op + 16 * j, a[i][j]);                                                               \
    }
/* up to ts_nn_wino_blk's rows for each NV */
DEF_GEMM(1, 4) DEF_GEMM(2, 4) DEF_GEMM(3, 4) DEF_GEMM(4, 4) DEF_GEMM(5, 4) DEF_GEMM(6, 4)
DEF_GEMM(1, 2) DEF_GEMM(2, 2) DEF_GEMM(3, 2) DEF_GEMM(4, 2) DEF_GEMM(5, 2) DEF_GEMM(6, 2)
DEF_GEMM(7, 2) DEF_GEMM(8, 2) DEF_GEMM(9, 2) DEF_GEMM(10, 2) DEF_GEMM(11, 2) DEF_GEMM(12, 2)
DEF_GEMM(1, 1) DEF_GEMM(2, 1) DEF_GEMM(3, 1) DEF_GEMM(4, 1) DEF_GEMM(5, 1) DEF_GEMM(6, 1) DEF_GEMM(7, 1)
DEF_GEMM(8, 1) DEF_GEMM(9, 1) DEF_GEMM(10, 1) DEF_GEMM(11, 1) DEF_GEMM(12, 1) DEF_GEMM(13, 1) DEF_GEMM(14, 1)
DEF_GEMM(15, 1) DEF_GEMM(16, 1)

typedef void (*gemm_fn)(const float *, size_t, size_t, const float *, int, int, float *, int);
/* [nv index: 1, 2, 4][tb - 1] */
static const gemm_fn GEMMS[3][16] = {
    {gemm_1x1, gemm_2x1, gemm_3x1, gemm_4x1, gemm_5x1, gemm_6x1, gemm_7x1, gemm_8x1, gemm_9x1, gemm_10x1, gemm_11x1,
     gemm_12x1, gemm_13x1, gemm_14x1, gemm_15x1, gemm_16x1},
    {gemm_1x2, gemm_2x2, gemm_3x2, gemm_4x2, gemm_5x2, gemm_6x2, gemm_7x2, gemm_8x2, gemm_9x2, gemm_10x2, gemm_11x2,
     gemm_12x2},
    {gemm_1x4, gemm_2x4, gemm_3x4, gemm_4x4, gemm_5x4, gemm_6x4}};

/* M[xi] = V[xi] U[xi] for all 64 points: T tiles, C channels, op outputs;
 * the points vs (V) and ms (M) floats apart */
static void gemm(const float *V, int T, int cp, size_t vs, const float *U, int C, int op, float *M, size_t ms)
{
    for (int xi = 0; xi < 64; xi++) {
        const float *vx = V + (size_t)xi * vs, *ux = U + (size_t)xi * C * op;
        float *mx = M + (size_t)xi * ms;
        for (int oc0 = 0; oc0 < op;) {
            const ts_wino_blk b = ts_nn_wino_blk((op - oc0) / 16);
            for (int t = 0; t < T; t += b.rows)
                GEMMS[b.idx][imin(b.rows, T - t) - 1](vx + (size_t)t * cp, (size_t)cp, 1, ux + oc0, op, C,
                                                      mx + (size_t)t * op + oc0, 0);
            oc0 += 16 * b.nv;
        }
    }
}

/* mode 2 for a pair's first tile without a second one: (lo[pt], 0) */
static void put_lone(const ptdst *d)
{
    for (int pt = 0; pt < 64; pt++) *(v16iu *)(d->Wd + (size_t)pt * d->stride) = bf16_bits(vld(d->lo + 16 * pt));
}

/* The tiling of a geometry into work items (sets of tiles): one sample, one
 * pair of planes, nr row pairs x nc column pairs; V and M (or Y) of an item
 * within about 1 MiB, at least 16 tiles */
typedef struct wplan {
    int C, OC, cp, op, D, H, W, TD, TH, TW, tw, rp, nrb, ncb, T, SR, SC;
    size_t slab_n, v_n, m_n, per; /* floats: slab, V, M (or Y), all three */
    long items;
} wplan;

static wplan plan_of(const ts_conv_geom *g, int tmin)
{
    wplan p;
    p.C = g->C, p.OC = g->OC, p.cp = ts_nn_pad16(g->C), p.op = ts_nn_pad16(g->OC), p.D = g->D, p.H = g->H, p.W = g->W;
    p.TD = (p.D + 1) / 2, p.TH = (p.H + 1) / 2, p.TW = (p.W + 1) / 2;
    const int tcap = imax(tmin, 4096 / (p.cp + p.op));
    p.tw = imin(p.TW, tcap), p.rp = imin(p.TH, imax(1, tcap / p.tw));
    p.nrb = (p.TH + p.rp - 1) / p.rp, p.ncb = (p.TW + p.tw - 1) / p.tw, p.T = p.rp * p.tw;
    p.SR = 2 * p.rp + 2, p.SC = 2 * p.tw + 2;
    /* the transform points' rows of V and M one vector longer than their
     * tiles: not a multiple of 4 KiB apart (the transforms touch all 64) */
    p.slab_n = (size_t)4 * p.SR * p.SC * p.cp, p.v_n = (size_t)64 * (p.T * p.cp + 16);
    p.m_n = (size_t)64 * (p.T * p.op + 16);
    p.per = p.slab_n + p.v_n + p.m_n;
    p.items = (long)g->N * p.TD * p.nrb * p.ncb;
    return p;
}

typedef struct witem {
    int n, tz, ty0, tx0, nr, nc, nt; /* sample, plane pair, first row and column pair, counts, tiles */
} witem;

static witem item_of(const wplan *p, long it)
{
    witem i;
    i.n = (int)(it / ((long)p->TD * p->nrb * p->ncb)), i.tz = (int)(it / ((long)p->nrb * p->ncb) % p->TD);
    i.ty0 = (int)(it / p->ncb % p->nrb) * p->rp, i.tx0 = (int)(it % p->ncb) * p->tw;
    i.nr = imin(p->rp, p->TH - i.ty0), i.nc = imin(p->tw, p->TW - i.tx0), i.nt = i.nr * i.nc;
    return i;
}

/* an item's input blocks staged in the slab S (zeros outside the volume,
 * channels padded to cp) and transformed into V[xi][t][cp] (t = ry * nc +
 * tx; points vs elements apart): mode 0 floats, 1 bf16, 2 words of bf16
 * tile pairs V[xi][tp][cp] (tiles 2 tp and 2 tp + 1, the second zero past
 * the last tile) */
static void item_input(const wplan *p, ts_conv_src x, const witem *i, float *S, void *V, size_t vs, int mode)
{
    const int C = p->C, cp = p->cp, D = p->D, H = p->H, W = p->W, SR = p->SR, SC = p->SC;
    const int cb = x.b ? C - x.ca : 0, ca = x.b ? x.ca : C;
    const int z0 = 2 * i->tz - 1, h0 = 2 * i->ty0 - 1, w0 = 2 * i->tx0 - 1, ncol = 2 * i->nc + 2;
    /* planes z0 .. z0 + 3, rows h0 .. h0 + 2 nr + 1, columns w0 .. w0 + 2 nc + 1 */
    for (int zz = 0; zz < 4; zz++)
        for (int r = 0; r < 2 * i->nr + 2; r++) {
            float *dst = S + ((size_t)zz * SR + r) * SC * cp;
            const int z = z0 + zz, h = h0 + r;
            if (z < 0 || z >= D || h < 0 || h >= H) {
                memset(dst, 0, (size_t)ncol * cp * sizeof(float));
                continue;
            }
            const size_t row = ((size_t)i->n * D + z) * H + h;
            if (!cb && C == cp) { /* one copy of the row's voxels inside, zeros outside */
                const int j0 = imax(0, -w0), j1 = imin(ncol, W - w0);
                if (j0 > 0) memset(dst, 0, (size_t)j0 * cp * sizeof(float));
                memcpy(dst + (size_t)j0 * cp, x.a + (row * W + w0 + j0) * C, (size_t)(j1 - j0) * C * sizeof(float));
                if (j1 < ncol) memset(dst + (size_t)j1 * cp, 0, (size_t)(ncol - j1) * cp * sizeof(float));
                continue;
            }
            for (int j = 0; j < ncol; j++) {
                const int wv = w0 + j;
                float *d = dst + (size_t)j * cp;
                if (wv < 0 || wv >= W) {
                    memset(d, 0, (size_t)cp * sizeof(float));
                    continue;
                }
                const size_t vox = row * W + wv;
                memcpy(d, x.a + vox * ca, (size_t)ca * sizeof(float));
                if (cb) memcpy(d + ca, x.b + vox * cb, (size_t)cb * sizeof(float));
                if (cp > C) memset(d + C, 0, (size_t)(cp - C) * sizeof(float));
            }
        }
    const size_t sr = (size_t)SC * cp, spl = (size_t)SR * SC * cp;
#define TILE_AT(t) (S + (size_t)(2 * ((t) / i->nc)) * sr + (size_t)(2 * ((t) % i->nc)) * cp)
    if (mode == 2) { /* words of tile pairs (2 tp, 2 tp + 1) */
        float lo[64 * 16] __attribute__((aligned(64)));
        for (int tp = 0; tp < (i->nt + 1) / 2; tp++)
            for (int c0 = 0; c0 < cp; c0 += 16) {
                const ptdst first = {lo, NULL, NULL, NULL, 16};
                const ptdst d = {NULL, NULL, (uint32_t *)V + (size_t)tp * cp + c0, lo, vs};
                in_tile(TILE_AT(2 * tp) + c0, sr, spl, cp, &first, 0);
                if (2 * tp + 1 < i->nt) in_tile(TILE_AT(2 * tp + 1) + c0, sr, spl, cp, &d, 2);
                else put_lone(&d);
            }
        return;
    }
    for (int t = 0; t < i->nt; t++)
        for (int c0 = 0; c0 < cp; c0 += 16) { /* bf16: the points rounded as they leave the transform */
            const ptdst d = {(float *)V + (size_t)t * cp + c0, (uint16_t *)V + (size_t)t * cp + c0, NULL, NULL, vs};
            if (mode) in_tile(TILE_AT(t) + c0, sr, spl, cp, &d, 1);
            else in_tile(TILE_AT(t) + c0, sr, spl, cp, &d, 0);
        }
#undef TILE_AT
}

int ts_nn_winograd(const ts_conv_geom *g, ts_conv_src x, const float *w, int flip, const float *bias, ts_conv_dst y)
{
    const ts_conv_ep *ep = y.ep;
    int err = 0;
    float *tam = NULL;
    const wplan p = plan_of(g, 16);
    const int C = p.C, OC = p.OC, op = p.op, cp = p.cp, D = p.D, H = p.H, W = p.W;
    const int nt = ts_nn_nthreads();
    const int bf = ts_nn_conv_precision() == TS_PREC_BF16; /* bf16 products (winograd_bf16.c) */
    const void *U = transformed(w, flip, C, OC, op, bf);
    float *bufs = ts_nn_scratch(0, p.per * nt * sizeof(float));
    if (!U || !bufs) TS_FAIL(TS_ERR_NOMEM, "Winograd convolution scratch (%d -> %d channels)", C, OC);
    /* bias, scale and shift padded to op (zeros, ones) */
    float epbuf[3 * 2048], *bp = epbuf, *sp = NULL, *hp = NULL;
    if (op > 2048) TS_FAIL(TS_ERR_ARG, "Winograd convolution: %d output channels (at most 2048)", OC);
    for (int oc = 0; oc < op; oc++) bp[oc] = bias && oc < OC ? bias[oc] : 0.0f;
    if (ep && ep->scale) {
        sp = epbuf + op;
        hp = epbuf + 2 * op;
        for (int oc = 0; oc < op; oc++) sp[oc] = oc < OC ? ep->scale[oc] : 1.0f, hp[oc] = oc < OC ? ep->shift[oc] : 0.0f;
    }
    const int act = ep && ep->act != TS_EP_NONE;
    const float slope = ep && ep->act == TS_EP_LEAKY ? ep->slope : 0.0f;
    /* the epilogue's maxima (ts_conv_ep.amax): per thread over op lanes, then into ep->amax */
    const size_t nam = ep && ep->amax ? (size_t)g->N * op : 0;
    tam = nam ? TS_CALLOC(nam * (size_t)nt, sizeof(float)) : NULL;
    if (nam && !tam) TS_FAIL(TS_ERR_NOMEM, "Winograd epilogue maxima");
#pragma omp parallel
    {
        const int tid = ts_nn_thread_id();
        float *S = bufs + p.per * tid, *V = S + p.slab_n, *M = V + p.v_n;
#pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < p.items; it++) {
            const witem i = item_of(&p, it);
            const int n = i.n, tz = i.tz, ty0 = i.ty0, tx0 = i.tx0, nc = i.nc, nt_ = i.nt;
            float *acc = tam ? tam + nam * tid + (size_t)n * op : NULL;
            /* V's points apart: one vector more than the tiles (fp32), 32 half-words (bf16) */
            const size_t vs = (size_t)nt_ * cp + (bf ? 32 : 16), ms = (size_t)nt_ * op + 16;
            item_input(&p, x, &i, S, V, vs, bf);
            if (bf) ts_nn_wino_bf16_gemm((const uint16_t *)V, nt_, cp, vs, U, (C + 1) / 2, op, M, ms);
            else gemm(V, nt_, cp, vs, U, C, op, M, ms);
            /* outputs: A^T M A + bias, the epilogue */
            for (int t = 0; t < nt_; t++) {
                const int ry = t / nc, tx = t % nc;
                const int od = 2 * tz, oh = 2 * (ty0 + ry), ow = 2 * (tx0 + tx);
                for (int c0 = 0; c0 < op; c0 += 16) {
                    v16 o[2][2][2];
                    out_tile(M + (size_t)t * op + c0, ms, o);
                    const v16 b = vld(bp + c0);
                    const int nco = OC - c0;
                    v16 am = acc ? vld(acc + c0) : (v16){0};
                    for (int z = 0; z < 2 && od + z < D; z++)
                        for (int yy = 0; yy < 2 && oh + yy < H; yy++)
                            for (int xx = 0; xx < 2 && ow + xx < W; xx++) {
                                v16 v = o[z][yy][xx] + b;
                                if (sp) v = v * vld(sp + c0) + vld(hp + c0);
                                if (act) v = ts_nn_act16(v, 1, slope);
                                if (acc) am = ts_nn_max16(am, ts_nn_absinf16(v)); /* padded lanes: not read */
                                const size_t vox = (((size_t)n * D + od + z) * H + oh + yy) * W + ow + xx;
                                if (!y.b) { /* one output tensor */
                                    float *dst = y.a + vox * OC + c0;
                                    if (nco >= 16) vst(dst, v);
                                    else ts_nn_vst_part(dst, v, nco);
                                    continue;
                                }
                                /* split at y.ca: lanes below it to a, the others to b */
                                const int na = imin(imax(y.ca - c0, 0), imin(nco, 16)), ob = OC - y.ca;
                                if (na > 0) ts_nn_vst_part(y.a + vox * y.ca + c0, v, na);
                                if (na < imin(nco, 16)) {
                                    float t[16];
                                    memcpy(t, &v, sizeof t);
                                    memcpy(y.b + vox * ob + (c0 + na - y.ca), t + na,
                                           (size_t)(imin(nco, 16) - na) * sizeof(float));
                                }
                            }
                    if (acc) vst(acc + c0, am);
                }
            }
        }
    }
    for (int n = 0; n < g->N && nam; n++)
        for (int oc = 0; oc < OC; oc++)
            for (int t = 0; t < nt; t++)
                ep->amax[(size_t)n * OC + oc] = fmaxf(ep->amax[(size_t)n * OC + oc], tam[nam * (size_t)t + (size_t)n * op + oc]);
cleanup:
    free(tam);
    return err;
}

/* ------------------------------------------------------- weight gradient */

/* A = [1 0; 1 1; 1 -1; 0 -1] on two values */
#define AY(d0, d1, r0, r1, r2, r3)                                                                                   \
    do {                                                                                                             \
        const v16 d0_ = (d0), d1_ = (d1);                                                                            \
        r0 = d0_;                                                                                                    \
        r1 = d0_ + d1_;                                                                                              \
        r2 = d0_ - d1_;                                                                                              \
        r3 = -d1_;                                                                                                   \
    } while (0)

/* Y[xi][t][16 lanes] = A dy A^T (per dim) of one tile's 2x2x2 output
 * gradients g[z][y][x], to d (put_pt) */
AI void dy_tile(v16 g[2][2][2], const ptdst *d, int mode)
{
    v16 q[2][2][4], s[2][16];
    for (int z = 0; z < 2; z++)
        for (int y = 0; y < 2; y++) AY(g[z][y][0], g[z][y][1], q[z][y][0], q[z][y][1], q[z][y][2], q[z][y][3]);
    for (int z = 0; z < 2; z++)
        for (int x = 0; x < 4; x++) AY(q[z][0][x], q[z][1][x], s[z][x], s[z][4 + x], s[z][8 + x], s[z][12 + x]);
    for (int yx = 0; yx < 16; yx++) {
        v16 r0, r1, r2, r3;
        AY(s[0][yx], s[1][yx], r0, r1, r2, r3);
        put_pt(d, mode, yx, r0);
        put_pt(d, mode, 16 + yx, r1);
        put_pt(d, mode, 32 + yx, r2);
        put_pt(d, mode, 48 + yx, r3);
    }
}

/* G^T = [1 1/2 1/2 0; 0 1/2 -1/2 0; 0 1/2 1/2 1] on four values */
#define GT(u0, u1, u2, u3, k0, k1, k2)                                                                               \
    do {                                                                                                             \
        const v16 u1_ = (u1), u2_ = (u2), h_ = 0.5f * (u1_ + u2_);                                                   \
        k0 = (u0) + h_;                                                                                              \
        k1 = 0.5f * (u1_ - u2_);                                                                                     \
        k2 = h_ + (u3);                                                                                              \
    } while (0)

#ifndef WG_TMIN
#define WG_TMIN 64
#endif
#ifndef WG_CHUNKS
#define WG_CHUNKS 8
#endif
/* the weight gradient's chunks of items (see ts_nn_winograd_wgrad) */
static long wg_chunks(const ts_conv_geom *g, const wplan *p)
{
    const size_t du_n = (size_t)64 * p->C * p->op;
    const long tiles = (long)g->N * p->TD * p->TH * p->TW;
    long nch = tiles / 64 < WG_CHUNKS ? tiles / 64 : WG_CHUNKS;
    if (nch > p->items) nch = p->items;
    if (nch < 1) nch = 1;
    while (nch > 1 && (size_t)nch * du_n * sizeof(float) > ((size_t)96 << 20)) nch--;
    return nch;
}

int ts_nn_winograd_wgrad(const ts_conv_geom *g, ts_conv_src x, const float *gy, float *dwp, const ts_conv_sched *sch)
{
    int err = 0;
    /* longer sums per item than the forward's (each kernel call loads and
     * stores its dU block once per item) */
    const wplan p = plan_of(g, WG_TMIN);
    const int C = p.C, OC = p.OC, op = p.op, cp = p.cp, D = p.D, H = p.H, W = p.W;
    const int nt = ts_nn_nthreads(), bf = ts_nn_conv_precision() == TS_PREC_BF16; /* bf16 products */
    /* chunks of consecutive items, each summed into its own dU and the sums
     * added in chunk order: the same bits for any thread count; their number
     * from the shapes alone (one per 64 tiles, at most WG_CHUNKS, their sums
     * within 96 MiB where there are several) */
    const size_t du_n = (size_t)64 * C * op;
    const long nch = wg_chunks(g, &p);
    float *bufs = ts_nn_scratch(0, (p.per * nt + du_n * nch) * sizeof(float));
    if (!bufs) TS_FAIL(TS_ERR_NOMEM, "Winograd weight-gradient scratch (%d -> %d channels)", C, OC);
    float *dus = bufs + p.per * nt;
#pragma omp parallel
    {
        const int tid = ts_nn_thread_id();
        float *S = bufs + p.per * tid, *V = S + p.slab_n, *Y = V + p.v_n;
        if (tid == 0) ts_nn_run_hooks(sch);
#pragma omp for schedule(dynamic, 1)
        for (long ch = 0; ch < nch; ch++) {
            float *du = dus + du_n * ch;
            memset(du, 0, du_n * sizeof(float));
            for (long it = ch * p.items / nch; it < (ch + 1) * p.items / nch; it++) {
                const witem i = item_of(&p, it);
                /* the tiles' output gradients, zeros outside the volume */
#define GT_OF(t, c0, gt)                                                                                              \
    do {                                                                                                             \
        const int od = 2 * i.tz, oh = 2 * (i.ty0 + (t) / i.nc), ow = 2 * (i.tx0 + (t) % i.nc);                        \
        for (int z = 0; z < 2; z++)                                                                                  \
            for (int yy = 0; yy < 2; yy++)                                                                           \
                for (int xx = 0; xx < 2; xx++) {                                                                     \
                    const int in = od + z < D && oh + yy < H && ow + xx < W;                                          \
                    const size_t vox = (((size_t)i.n * D + od + z) * H + oh + yy) * W + ow + xx;                      \
                    gt[z][yy][xx] = in ? ts_nn_vld_part(gy + vox * OC + (c0), OC - (c0)) : (v16){0};                  \
                }                                                                                                    \
    } while (0)
                if (bf) { /* tile pairs: V[xi][tp][cp], Y[xi][tp][op] words of bf16 pairs (winograd_bf16.c) */
                    const int ntp = (i.nt + 1) / 2;
                    const size_t vs = (size_t)ntp * cp + 16, ys = (size_t)ntp * op + 16;
                    float lo[64 * 16] __attribute__((aligned(64)));
                    item_input(&p, x, &i, S, V, vs, 2);
                    for (int tp = 0; tp < ntp; tp++)
                        for (int c0 = 0; c0 < op; c0 += 16) {
                            const ptdst first = {lo, NULL, NULL, NULL, 16};
                            const ptdst d = {NULL, NULL, (uint32_t *)Y + (size_t)tp * op + c0, lo, ys};
                            v16 gt[2][2][2];
                            GT_OF(2 * tp, c0, gt);
                            dy_tile(gt, &first, 0);
                            if (2 * tp + 1 < i.nt) {
                                GT_OF(2 * tp + 1, c0, gt);
                                dy_tile(gt, &d, 2);
                            } else {
                                put_lone(&d);
                            }
                        }
                    ts_nn_wino_bf16_wgrad((const uint32_t *)V, vs, (const uint32_t *)Y, ys, C, cp, op, ntp, du);
                    if (tid == 0) ts_nn_run_hooks(sch);
                    continue;
                }
                const size_t vs = (size_t)i.nt * cp + 16, ys = (size_t)i.nt * op + 16;
                item_input(&p, x, &i, S, V, vs, 0);
                for (int t = 0; t < i.nt; t++)
                    for (int c0 = 0; c0 < op; c0 += 16) {
                        const ptdst d = {Y + (size_t)t * op + c0, NULL, NULL, NULL, ys};
                        v16 gt[2][2][2];
                        GT_OF(t, c0, gt);
                        dy_tile(gt, &d, 0);
                    }
#undef GT_OF
                /* dU[xi][c][op] += sum over the tiles of V[xi][t][c] Y[xi][t][:] */
                for (int xi = 0; xi < 64; xi++) {
                    const float *vx = V + (size_t)xi * vs, *yx = Y + (size_t)xi * ys;
                    float *dx = du + (size_t)xi * C * op;
                    for (int oc0 = 0; oc0 < op;) {
                        const ts_wino_blk b = ts_nn_wino_blk((op - oc0) / 16);
                        for (int c = 0; c < C; c += b.rows)
                            GEMMS[b.idx][imin(b.rows, C - c) - 1](vx + c, 1, (size_t)cp, yx + oc0, op, i.nt,
                                                                  dx + (size_t)c * op + oc0, 1);
                        oc0 += 16 * b.nv;
                    }
                }
                if (tid == 0) ts_nn_run_hooks(sch);
            }
        }
    }
    /* the chunks' sums in order, then dw = G^T dU G per dim, into dwp [27][C][OC] */
#pragma omp parallel for schedule(static)
    for (long cv = 0; cv < (long)C * (op / 16); cv++) {
        const int c = (int)(cv / (op / 16)), oc0 = (int)(cv % (op / 16)) * 16;
        v16 u[64];
        for (int xi = 0; xi < 64; xi++) {
            v16 sum = vld(dus + ((size_t)xi * C + c) * op + oc0);
            for (long ch = 1; ch < nch; ch++) sum += vld(dus + du_n * ch + ((size_t)xi * C + c) * op + oc0);
            u[xi] = sum;
        }
        v16 t1[4][4][3], t2[4][3][3], k[3][3][3];
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++) {
                const v16 *r = u + (a * 4 + b) * 4;
                GT(r[0], r[1], r[2], r[3], t1[a][b][0], t1[a][b][1], t1[a][b][2]);
            }
        for (int a = 0; a < 4; a++)
            for (int e = 0; e < 3; e++) GT(t1[a][0][e], t1[a][1][e], t1[a][2][e], t1[a][3][e], t2[a][0][e], t2[a][1][e], t2[a][2][e]);
        for (int b = 0; b < 3; b++)
            for (int e = 0; e < 3; e++) GT(t2[0][b][e], t2[1][b][e], t2[2][b][e], t2[3][b][e], k[0][b][e], k[1][b][e], k[2][b][e]);
        for (int tap = 0; tap < 27; tap++)
            ts_nn_vst_part(dwp + ((size_t)tap * C + c) * OC + oc0, k[tap / 9][tap / 3 % 3][tap % 3], OC - oc0);
    }
cleanup:
    return err;
}

/* What ts_nn_scratch holds after a layer's Winograd calls (see
 * conv_impl.h): slot 0 the per-thread item buffers (and the weight
 * gradient's chunk sums), slot 1 the transformed weights of a call that
 * does not use the cache; each as ts_nn_scratch allocates it */
size_t ts_nn_winograd_scratch_bytes(const ts_conv_geom *g, int nthreads, int wgrad)
{
    const size_t f = sizeof(float);
    ts_conv_geom t = *g; /* the input gradient's: the transposed geometry */
    t.C = g->OC, t.OC = g->C;
    size_t s0 = 0, s1 = 0;
    for (int k = 0; k < 2; k++) { /* the forward's geometry, then the input gradient's: the driver that takes it */
        const ts_conv_geom *q = k ? &t : g;
        size_t n0 = 0, n1 = 0;
        if (ts_nn_winograd_fits(q)) {
            const wplan p = plan_of(q, 16);
            n0 = p.per * nthreads * f, n1 = (size_t)64 * p.C * p.op * f;
        } else if (ts_nn_winograd_narrow_fits(q))
            n0 = ts_nn_winograd_narrow_scratch(q, nthreads, &n1);
        if (n0 > s0) s0 = n0;
        if (n1 > s1) s1 = n1;
    }
    if (wgrad && ts_nn_winograd_fits(g)) {
        const wplan pw = plan_of(g, WG_TMIN);
        const size_t w0 = (pw.per * nthreads + (size_t)64 * pw.C * pw.op * wg_chunks(g, &pw)) * f;
        if (w0 > s0) s0 = w0;
    }
    return ts_nn_scratch_alloc_size(s0) + ts_nn_scratch_alloc_size(s1);
}
