/* Winograd F(2x2x2, 3x3x3) for the few-output-channel 3x3x3 convolutions
 * (at most 8 output channels from 16 or more input channels: the first
 * level of a small UNet, 16 -> 8), fp32, forward and input gradient
 * (ts_nn_winograd_narrow, conv_impl.h; docs/engine.md, "Winograd
 * convolution"). winograd.c puts 16 output channels in a vector: with 8,
 * half of its products are zeros. Here one 16-lane vector holds two tiles
 * side by side along W (a tile pair), lane 2 c + h channel c of tile h:
 *   - each input row is staged doubled, column j interleaved with column
 *     j + 2 per channel, so that a tile pair's 4x4x4 block reads as one of
 *     16-lane voxels and winograd.c's input transform (in_tile) runs on it
 *     unchanged;
 *   - the products broadcast the pair's two values of a channel (one 64-bit
 *     broadcast) against the transformed weights with each output channel
 *     in two neighbouring lanes, M[xi][pair][2 oc + h];
 *   - the output transform (out_tile) runs on those vectors and each of its
 *     8 results is split back into the two tiles' 8 channels.
 * An item's pairs go through the transforms and products in blocks of at
 * most NB_MAX, so that a block's V and M stay near the core.
 * The sums are winograd.c's, term for term and in the same order: the
 * results are the same bits as ts_nn_winograd's (tests/nn/test_winograd). */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/nn/conv_impl.h"
#include "src/nn/norm_impl.h" /* ts_nn_act16: the epilogue's activation */
#include "src/nn/winograd_impl.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
typedef double v8d __attribute__((vector_size(64)));

int ts_nn_winograd_narrow_fits(const ts_conv_geom *g) { return g->C >= 16 && g->OC <= 8; }

static atomic_long calls;
long ts_nn_winograd_narrow_calls(void) { return atomic_load(&calls); }

/* The tiling into work items: one sample, one pair of planes, nr row pairs
 * x nc tiles along W (nc even but at the volume's end: tw/2 tile pairs a
 * row), at most about 4096 / (2 cq + 16) pairs an item */
#define NB_MAX 14 /* tile pairs a block: the largest products kernel */
typedef struct nplan {
    int C, OC, cq, D, H, W, TD, TH, TW, tw, rp, nrb, ncb, SR, SC, nb;
    size_t row_n, slab_n, v_n, m_n, per; /* floats: a source row, the doubled slab, a block's V and M, all four */
    long items;
} nplan;

static nplan plan_of(const ts_conv_geom *g)
{
    nplan p;
    p.C = g->C, p.OC = g->OC, p.cq = (g->C + 7) & ~7, p.D = g->D, p.H = g->H, p.W = g->W;
    p.TD = (p.D + 1) / 2, p.TH = (p.H + 1) / 2, p.TW = (p.W + 1) / 2;
    const int pcap = imax(8, 4096 / (2 * p.cq + 16)); /* tile pairs an item */
    p.tw = imin((p.TW + 1) & ~1, 2 * pcap), p.rp = imin(p.TH, imax(1, pcap / (p.tw / 2)));
    p.nrb = (p.TH + p.rp - 1) / p.rp, p.ncb = (p.TW + p.tw - 1) / p.tw;
    p.SR = 2 * p.rp + 2, p.SC = 2 * p.tw;
    const int P = p.rp * (p.tw / 2);
    p.nb = imin(P, NB_MAX); /* tile pairs a block: V and M of one block, the products in one kernel call */
    p.row_n = (size_t)(2 * p.tw + 2) * p.cq, p.slab_n = (size_t)4 * p.SR * p.SC * 2 * p.cq;
    /* a block's points one vector more than its pairs apart */
    p.v_n = (size_t)64 * (p.nb * 2 * p.cq + 16), p.m_n = (size_t)64 * (p.nb * 16 + 16);
    p.per = p.row_n + p.slab_n + p.v_n + p.m_n;
    p.items = (long)g->N * p.TD * p.nrb * p.ncb;
    return p;
}

size_t ts_nn_winograd_narrow_scratch(const ts_conv_geom *g, int nthreads, size_t *slot1)
{
    const nplan p = plan_of(g);
    *slot1 = (size_t)64 * p.cq * 16 * sizeof(float);
    return p.per * (size_t)nthreads * sizeof(float);
}

/* U2[xi][c][2 oc + h] = U[xi][c][oc] for both h (zeros past OC and C) */
static void weights2(const float *w, int flip, int C, int OC, int cq, float *U2)
{
    for (int c = 0; c < cq; c++) {
        v16 u[64];
        wt_chan(w, flip, C, OC, c, 0, u);
        for (int xi = 0; xi < 64; xi++)
            vst(U2 + ((size_t)xi * cq + c) * 16,
                __builtin_shufflevector(u[xi], u[xi], 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
    }
}

/* m[i][:] = sum over c < C of (v[i v2 + 2 c], v[i v2 + 2 c + 1]) u[c][:],
 * TB tile pairs in registers (the pair's two values broadcast to the even
 * and the odd lanes) */
#define DEF_NG(TB)                                                                                                   \
    static void ng_##TB(const float *v, int v2, const float *u, int C, float *m)                                     \
    {                                                                                                                \
        v16 a[TB];                                                                                                   \
        _Pragma("GCC unroll 16") for (int i = 0; i < TB; i++) a[i] = (v16){0};                                      \
        for (int c = 0; c < C; c++) {                                                                                \
            const v16 uc = vld(u + 16 * c);                                                                          \
            _Pragma("GCC unroll 16") for (int i = 0; i < TB; i++)                                                    \
            {                                                                                                        \
                double d;                                                                                            \
                memcpy(&d, v + (size_t)i * v2 + 2 * c, sizeof d);                                                    \
                a[i] += (v16)(v8d){d, d, d, d, d, d, d, d} * uc;                                                     \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("GCC unroll 16") for (int i = 0; i < TB; i++) vst(m + 16 * i, a[i]);                                \
    }
DEF_NG(1) DEF_NG(2) DEF_NG(3) DEF_NG(4) DEF_NG(5) DEF_NG(6) DEF_NG(7) DEF_NG(8) DEF_NG(9) DEF_NG(10) DEF_NG(11)
DEF_NG(12) DEF_NG(13) DEF_NG(14)
typedef void (*ng_fn)(const float *, int, const float *, int, float *);
static const ng_fn NGS[14] = {ng_1, ng_2, ng_3, ng_4, ng_5, ng_6, ng_7, ng_8, ng_9, ng_10, ng_11, ng_12, ng_13, ng_14};

/* item it's sample n, plane pair tz, first row pair ty0 and tile tx0, row pairs nr, tiles nc, pairs per row npi */
typedef struct nitem {
    int n, tz, ty0, tx0, nr, nc, npi;
} nitem;

static nitem item_of(const nplan *p, long it)
{
    nitem i;
    i.n = (int)(it / ((long)p->TD * p->nrb * p->ncb)), i.tz = (int)(it / ((long)p->nrb * p->ncb) % p->TD);
    i.ty0 = (int)(it / p->ncb % p->nrb) * p->rp, i.tx0 = (int)(it % p->ncb) * p->tw;
    i.nr = imin(p->rp, p->TH - i.ty0), i.nc = imin(p->tw, p->TW - i.tx0), i.npi = (i.nc + 1) / 2;
    return i;
}

/* channels k .. k + 7 of voxel vox of x (ca channels in x.a, the cb others in x.b) */
static inline const float *chan8(ts_conv_src x, size_t vox, int ca, int cb, int k)
{
    return k < ca ? x.a + vox * ca + k : x.b + vox * cb + (k - ca);
}

/* The item's input: each row (planes z0 .. z0 + 3, rows h0 .. h0 + 2 nr +
 * 1; columns w0 .. w0 + 4 npi + 1, zeros outside the volume and past C)
 * doubled into the slab S (column j: lane 2 c + h of channel block k from
 * column j + 2 h), straight from x where C and the concatenation's split
 * are multiples of 8, else through a copy of the row in R (cq channels) */
static void item_input(const nplan *p, ts_conv_src x, const nitem *i, float *R, float *S)
{
    const int C = p->C, cq = p->cq, D = p->D, H = p->H, W = p->W, SR = p->SR, SC = p->SC;
    const int cb = x.b ? C - x.ca : 0, ca = x.b ? x.ca : C;
    const int z0 = 2 * i->tz - 1, h0 = 2 * i->ty0 - 1, w0 = 2 * i->tx0 - 1, nd = 4 * i->npi, ncol = nd + 2;
    const size_t sr = (size_t)SC * 2 * cq, spl = (size_t)SR * sr;
    const int whole = C % 8 == 0 && ca % 8 == 0;
    for (int zz = 0; zz < 4; zz++)
        for (int r = 0; r < 2 * i->nr + 2; r++) {
            float *dst = S + zz * spl + r * sr;
            const int z = z0 + zz, h = h0 + r;
            if (z < 0 || z >= D || h < 0 || h >= H) {
                memset(dst, 0, (size_t)nd * 2 * cq * sizeof(float));
                continue;
            }
            const size_t row = ((size_t)i->n * D + z) * H + h;
            if (whole) { /* blocks of 8 channels inside one input: doubled straight from it */
                for (int j = 0; j < nd; j++)
                    for (int k = 0; k < C; k += 8) {
                        v8 a = {0}, b = {0};
                        if (w0 + j >= 0 && w0 + j < W) a = *(const v8u *)chan8(x, row * W + w0 + j, ca, cb, k);
                        if (w0 + j + 2 < W) b = *(const v8u *)chan8(x, row * W + w0 + j + 2, ca, cb, k);
                        vst(dst + (size_t)j * 2 * cq + 2 * k,
                            __builtin_shufflevector(a, b, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15));
                    }
                continue;
            }
            const int j0 = imax(0, -w0), j1 = imin(ncol, W - w0);
            memset(R, 0, (size_t)j0 * cq * sizeof(float));
            for (int j = j0; j < j1; j++) {
                const size_t vox = row * W + w0 + j;
                float *d = R + (size_t)j * cq;
                memcpy(d, x.a + vox * ca, (size_t)ca * sizeof(float));
                if (cb) memcpy(d + ca, x.b + vox * cb, (size_t)cb * sizeof(float));
                memset(d + C, 0, (size_t)(cq - C) * sizeof(float));
            }
            if (j1 < ncol) memset(R + (size_t)imax(j1, 0) * cq, 0, (size_t)(ncol - imax(j1, 0)) * cq * sizeof(float));
            for (int j = 0; j < nd; j++)
                for (int k = 0; k < cq; k += 8) {
                    const v8 a = *(const v8u *)(R + (size_t)j * cq + k), b = *(const v8u *)(R + (size_t)(j + 2) * cq + k);
                    vst(dst + (size_t)j * 2 * cq + 2 * k,
                        __builtin_shufflevector(a, b, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15));
                }
        }
}

/* tile pairs q0 .. q0 + nb - 1 of the item (row-major) transformed from the slab into V[xi][q - q0][2 cq] */
static void pairs_input(const nplan *p, const nitem *i, const float *S, int q0, int nb, float *V, size_t vs)
{
    const int cq = p->cq;
    const size_t sr = (size_t)p->SC * 2 * cq, spl = (size_t)p->SR * sr;
    for (int q = q0; q < q0 + nb; q++) {
        const float *s = S + (size_t)2 * (q / i->npi) * sr + (size_t)4 * (q % i->npi) * 2 * cq;
        for (int k = 0; k < cq; k += 8) {
            const ptdst d = {V + (size_t)(q - q0) * 2 * cq + 2 * k, NULL, NULL, NULL, vs};
            in_tile(s + 2 * k, sr, spl, 2 * cq, &d, 0);
        }
    }
}

/* The epilogue's constants for both tiles' lanes (lane l: output channel l % 8) */
typedef struct nep {
    float b[16], s[16], h[16]; /* bias, scale, shift (zeros, ones, zeros past OC) */
    int sc, act;
    float slope;
} nep;

/* Block q0 .. q0 + nb - 1 of the item's pairs: A^T M A (M [xi][q - q0][16],
 * points ms floats apart), split into the pair's two tiles, + bias, the
 * epilogue, stored into y (OC channels) where inside the item and volume */
static void block_output(const nplan *p, const nitem *i, int q0, int nb, const float *M, size_t ms, const nep *e, float *y)
{
    const int D = p->D, H = p->H, W = p->W, OC = p->OC;
    for (int q = q0; q < q0 + nb; q++) {
        const int od = 2 * i->tz, oh = 2 * (i->ty0 + q / i->npi);
        v16 o[2][2][2];
        out_tile(M + (size_t)(q - q0) * 16, ms, o);
        for (int z = 0; z < 2 && od + z < D; z++)
            for (int yy = 0; yy < 2 && oh + yy < H; yy++)
                for (int xx = 0; xx < 2; xx++) {
                    const v16 t = o[z][yy][xx];
                    v16 v = __builtin_shufflevector(t, t, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
                    v = v + vld(e->b);
                    if (e->sc) v = v * vld(e->s) + vld(e->h);
                    if (e->act) v = ts_nn_act16(v, 1, e->slope);
                    for (int h = 0; h < 2; h++) {
                        const int tc = 2 * (q % i->npi) + h, ow = 2 * (i->tx0 + tc) + xx;
                        if (tc >= i->nc || ow >= W) continue;
                        const size_t vox = (((size_t)i->n * D + od + z) * H + oh + yy) * W + ow;
                        ts_nn_vst_part(y + vox * OC,
                                       h ? __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7) : v,
                                       OC);
                    }
                }
    }
}

int ts_nn_winograd_narrow(const ts_conv_geom *g, ts_conv_src x, const float *w, int flip, const float *bias, ts_conv_dst y)
{
    const ts_conv_ep *ep = y.ep;
    int err = 0;
    if (!ts_nn_winograd_narrow_fits(g) || y.b || (ep && ep->amax))
        TS_FAIL(TS_ERR_ARG,
                "narrow Winograd convolution: %d -> %d channels%s (16+ in, at most 8 out, one output tensor, no maxima)",
                g->C, g->OC, y.b ? ", split output" : "");
    const nplan p = plan_of(g);
    const int C = p.C, OC = p.OC, cq = p.cq;
    const int nt = ts_nn_nthreads();
    float *U2 = ts_nn_scratch(1, (size_t)64 * cq * 16 * sizeof(float));
    float *bufs = ts_nn_scratch(0, p.per * nt * sizeof(float));
    if (!U2 || !bufs) TS_FAIL(TS_ERR_NOMEM, "narrow Winograd convolution scratch (%d -> %d channels)", C, OC);
    weights2(w, flip, C, OC, cq, U2);
    atomic_fetch_add(&calls, 1);
    nep e = {.sc = ep && ep->scale, .act = ep && ep->act != TS_EP_NONE};
    e.slope = ep && ep->act == TS_EP_LEAKY ? ep->slope : 0.0f;
    for (int l = 0; l < 16; l++) {
        const int oc = l % 8;
        e.b[l] = bias && oc < OC ? bias[oc] : 0.0f;
        e.s[l] = e.sc && oc < OC ? ep->scale[oc] : 1.0f;
        e.h[l] = e.sc && oc < OC ? ep->shift[oc] : 0.0f;
    }
    const size_t vs = (size_t)p.nb * 2 * cq + 16, ms = (size_t)p.nb * 16 + 16;
#pragma omp parallel
    {
        const int tid = ts_nn_thread_id();
        float *R = bufs + p.per * tid, *S = R + p.row_n, *V = S + p.slab_n, *M = V + p.v_n;
#pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < p.items; it++) {
            const nitem i = item_of(&p, it);
            const int P = i.nr * i.npi;
            item_input(&p, x, &i, R, S);
            for (int q0 = 0; q0 < P; q0 += p.nb) {
                const int nb = imin(p.nb, P - q0);
                pairs_input(&p, &i, S, q0, nb, V, vs);
                for (int xi = 0; xi < 64; xi++)
                    NGS[nb - 1](V + xi * vs, 2 * cq, U2 + (size_t)xi * cq * 16, C, M + xi * ms);
                block_output(&p, &i, q0, nb, M, ms, &e, y.a);
            }
        }
    }
cleanup:
    return err;
}
