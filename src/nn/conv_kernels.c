/* The convolution kernels of src/nn (gather, tgather, wgrad; see
 * conv_impl.h). Portable C with GCC vector extensions: 16-float vectors
 * become one AVX-512 register with -march=native; without AVX-512 clang
 * keeps each in two 256-bit registers, GCC 12 in memory (3 % of the peak:
 * docs/engine.md, "CPU kernels"). Cost per output voxel: k^3 * C * OC
 * multiply-adds; the micro-kernels keep WB voxels x NV vectors of
 * accumulators in registers and load each packed weight vector once per
 * WB voxels. */
#include "src/nn/kernel_opt.h" /* first: the optimisation pragma */
#include "tsbuild.h"
#include "src/nn/conv_impl.h"
#include "src/nn/norm_impl.h"
#include "src/nn/layers.h"
#include "src/core/error.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));

#define AI static inline __attribute__((always_inline))

#pragma GCC diagnostic ignored "-Wpsabi" /* always inlined: no call whose ABI could differ */
AI v16 vld(const float *p) { return *(const v16u *)p; }
AI void vst(float *p, v16 v) { *(v16u *)p = v; }

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }
/* vectors per micro-tile for `lanes` (a multiple of 16) remaining output channels */
static inline int nv_for(int lanes) { return lanes >= 64 ? 4 : lanes >= 32 ? 2 : 1; }
static inline size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Rows of output per work item: few rows per slab so that it stays in L2,
 * at least 32 items where possible (for load balance). Independent of the
 * thread count, so that the weight gradient's summation order is too. */
static int row_block(const ts_conv_geom *g)
{
    int hb = 8;
    while (hb > 1 && (size_t)g->N * g->OD * ((g->OH + hb - 1) / hb) < 32) hb /= 2;
    return imin(hb, g->OH);
}

/* The face of h on side hi (0: lo) of dim d, NULL where none is given (a
 * dim that is not split, or the global border). */
static inline const float *halo_face(const ts_halo *h, int d, int hi)
{
    return h && h->on[d] ? (hi ? h->hi[d] : h->lo[d]) : NULL;
}

/* How a slab is stored: fp32 (bf16 0; f16 1: values rounded through
 * IEEE half), or bf16 with pairs of channels (vpair 0: the gather's layout,
 * voxel = ceil(C/2) pairs, an odd channel's partner zero) or pairs of
 * columns (vpair 1: the weight gradient's layout, see ts_bf16_wg_args; the
 * row must be zeroed first). nat: the bf16 variant. */
typedef struct slab_fmt {
    int bf16, vpair, nat, s, f16;
} slab_fmt;

static const slab_fmt FMT_F32 = {0, 0, 0, 1, 0};
static const slab_fmt FMT_F16 = {0, 0, 0, 1, 1};

/* n floats rounded through fp16 */
static inline void put_f16(float *d, const float *a, size_t n)
{
    for (size_t i = 0; i < n; i++) d[i] = ts_nn_fp16_round(a[i]);
}

/* Elements (floats or pairs) of one slab row of CS columns of C channels. */
static inline size_t slab_row_n(const slab_fmt *f, int CS, int C)
{
    if (!f->bf16) return (size_t)CS * C;
    if (!f->vpair) return (size_t)CS * ((C + 1) / 2);
    return (size_t)((CS + 2 * f->s - 1) / (2 * f->s)) * f->s * C;
}

/* Zero columns col0 .. col0+n-1 of a slab row (voxel-pair rows are zeroed whole first). */
static inline void row_zero(const slab_fmt *f, void *dst, int C, int col0, int n)
{
    if (n <= 0) return;
    if (!f->bf16) memset((float *)dst + (size_t)col0 * C, 0, (size_t)n * C * sizeof(float));
    else if (!f->vpair) memset((uint16_t *)dst + (size_t)col0 * (C + (C & 1)), 0, (size_t)n * (C + (C & 1)) * sizeof(uint16_t));
}

/* Columns col0 .. col0+n-1 from n voxels: channels [0, ca) at a + v ca and
 * [ca, C) at b + v (C - ca) (b NULL: all C from a). */
static inline void row_put(const slab_fmt *f, void *dst, int C, int col0, int n, const float *a, int ca, const float *b)
{
    if (n <= 0) return;
    if (f->bf16) {
        ts_nn_bf16_put(f->nat, f->vpair, f->s, C, C, dst, col0, n, a, b ? ca : C, b);
    } else if (f->f16) {
        float *d = (float *)dst + (size_t)col0 * C;
        if (!b) {
            put_f16(d, a, (size_t)n * C);
        } else {
            const int cb = C - ca;
            for (int v = 0; v < n; v++) {
                put_f16(d + (size_t)v * C, a + (size_t)v * ca, (size_t)ca);
                put_f16(d + (size_t)v * C + ca, b + (size_t)v * cb, (size_t)cb);
            }
        }
    } else if (!b) {
        memcpy((float *)dst + (size_t)col0 * C, a, (size_t)n * C * sizeof(float));
    } else if (ca % 8 == 0 && (C - ca) % 8 == 0) { /* interleaved in eights: fixed-size copies, no libc call */
        float *d = (float *)dst + (size_t)col0 * C;
        const int cb = C - ca;
        for (int v = 0; v < n; v++) {
            for (int j = 0; j < ca; j += 8) memcpy(d + (size_t)v * C + j, a + (size_t)v * ca + j, 8 * sizeof(float));
            for (int j = 0; j < cb; j += 8) memcpy(d + (size_t)v * C + ca + j, b + (size_t)v * cb + j, 8 * sizeof(float));
        }
    } else { /* interleave the two sources per voxel */
        float *d = (float *)dst + (size_t)col0 * C;
        const int cb = C - ca;
        for (int v = 0; v < n; v++) {
            memcpy(d + (size_t)v * C, a + (size_t)v * ca, (size_t)ca * sizeof(float));
            memcpy(d + (size_t)v * C + ca, b + (size_t)v * cb, (size_t)cb * sizeof(float));
        }
    }
}

/* A slab row at plane id, row ih of sample n that lies outside the box along
 * D or H (3x3x3, stride 1, padding 1: CS = W + 2 columns, iw = -1 .. W):
 * from the D face at id = -1 / D (which holds the H and W edges), else from
 * the H face at ih = -1 / H (which holds the W edges); zeros where no face
 * covers it (a NULL face, an unsplit dim, or a row past the halo that a
 * partial row block stages but never reads). */
static void fill_halo_row(const slab_fmt *f, const ts_conv_geom *g, const ts_halo *h, int n, int id, int ih, int CS,
                          void *dst)
{
    const int C = g->C, e1 = h->on[1] ? 1 : 0, e2 = h->on[2] ? 1 : 0;
    const size_t wc = (size_t)(g->W + 2 * e2) * C; /* floats of one face row */
    const float *src = NULL;
    if (id == -1 || id == g->D) {
        const float *fc = halo_face(h, 0, id == g->D);
        if (fc && ih >= -e1 && ih < g->H + e1) src = fc + ((size_t)n * (g->H + 2 * e1) + (size_t)(ih + e1)) * wc;
    } else if (id >= 0 && id < g->D && (ih == -1 || ih == g->H)) {
        const float *fc = halo_face(h, 1, ih == g->H);
        if (fc) src = fc + ((size_t)n * g->D + id) * wc;
    }
    if (!src) {
        row_zero(f, dst, C, 0, CS);
    } else if (e2) { /* the face row holds columns -1 .. W */
        row_put(f, dst, C, 0, CS, src, C, NULL);
    } else {
        row_zero(f, dst, C, 0, 1);
        row_put(f, dst, C, 1, g->W, src, C, NULL);
        row_zero(f, dst, C, g->W + 1, CS - g->W - 1);
    }
}

/* Slab row at input plane id, row ih of sample n: CS columns from iw = -p,
 * zero outside the input, or taken from x.halo's faces there (only rows and
 * the two edge columns outside the box differ: the inner loops stay the
 * same). */
static inline void fill_row(const slab_fmt *f, const ts_conv_geom *g, ts_conv_src x, int n, int id, int ih, int CS,
                            void *dst)
{
    const int C = g->C;
    const int lo = imin(g->p, CS), hi = imax(lo, imin(CS, g->p + g->W));
    const ts_halo *h = x.halo;
    const int out = id < 0 || id >= g->D || ih < 0 || ih >= g->H;
    if (f->vpair && (out || f->s != 1)) {
        memset(dst, 0, slab_row_n(f, CS, C) * sizeof(uint32_t));
    } else if (f->vpair) { /* stride 1: pair j holds columns 2j, 2j + 1 (C words); the puts below write every
                            * word of the pairs inside [lo, hi): zero the others (and the edges' halves) */
        const size_t np = slab_row_n(f, CS, C) / (size_t)C, p0 = (size_t)lo / 2 + (lo & 1), p1 = (size_t)hi / 2;
        memset(dst, 0, (p0 < np ? p0 : np) * C * sizeof(uint32_t));
        if (p1 < np) memset((uint32_t *)dst + p1 * C, 0, (np - p1) * C * sizeof(uint32_t));
    }
    if (out) {
        if (h) fill_halo_row(f, g, h, n, id, ih, CS, dst);
        else row_zero(f, dst, C, 0, CS);
        return;
    }
    const size_t vox = ((size_t)n * g->D + id) * g->H + ih; /* row index */
    row_zero(f, dst, C, 0, lo);
    if (!x.b) {
        row_put(f, dst, C, lo, hi - lo, x.a + (vox * g->W + (size_t)(lo - g->p)) * C, C, NULL);
    } else {
        const int ca = x.ca, cb = C - x.ca;
        row_put(f, dst, C, lo, hi - lo, x.a + (vox * g->W + (size_t)(lo - g->p)) * ca, ca,
                x.b + (vox * g->W + (size_t)(lo - g->p)) * cb);
    }
    row_zero(f, dst, C, hi, CS - hi);
    /* W faces [N][D][H][C]: columns -1 and W of the row (p = 1, CS = W + 2) */
    const float *wlo = halo_face(h, 2, 0), *whi = halo_face(h, 2, 1);
    if (wlo) row_put(f, dst, C, 0, 1, wlo + vox * C, C, NULL);
    if (whi) row_put(f, dst, C, g->W + 1, 1, whi + vox * C, C, NULL);
}

/* A ring of KP slab planes (each R rows of CS columns in format f) that
 * follows a work unit's items along D: an item whose input planes start
 * `shift` planes after the previous item's (same sample and rows) stages
 * only its last `shift` planes. plane[i] is input plane id0 + i. */
typedef struct slab_ring {
    int n, oh0, id0, start; /* what is staged (n -1: nothing) */
    int KP;
    size_t pn; /* elements of one plane */
    uint32_t *base;
    const uint32_t **plane;
    /* fp32 with at most 8 output channels: each staged plane also as column
     * pairs (pair_rows), ppn floats a plane; pbase NULL: none */
    float *pbase;
    const float **pplane;
    size_t ppn;
} slab_ring;

static void pair_rows(const float *src, float *dst, int rows, int CS, int C);

static void ring_stage(slab_ring *rg, const slab_fmt *f, const ts_conv_geom *g, ts_conv_src x, int n, int id0, int oh0,
                       int R, int CS)
{
    int keep = 0;
    if (rg->n == n && rg->oh0 == oh0 && id0 > rg->id0 && id0 - rg->id0 < rg->KP) {
        keep = rg->KP - (id0 - rg->id0);
        rg->start = (rg->start + id0 - rg->id0) % rg->KP;
    } else {
        rg->start = 0;
    }
    const size_t row = slab_row_n(f, CS, g->C);
    for (int i = 0; i < rg->KP; i++) {
        const int slot = (rg->start + i) % rg->KP;
        uint32_t *pl = rg->base + (size_t)slot * rg->pn;
        float *pp = rg->pbase ? rg->pbase + (size_t)slot * rg->ppn : NULL;
        rg->plane[i] = pl;
        if (pp) rg->pplane[i] = pp;
        if (i >= keep) {
            for (int r = 0; r < R; r++) fill_row(f, g, x, n, id0 + i, oh0 * g->s - g->p + r, CS, pl + (size_t)r * row);
            if (pp) pair_rows((const float *)pl, pp, R, CS, f->bf16 ? (g->C + 1) / 2 : g->C);
        }
    }
    rg->n = n;
    rg->oh0 = oh0;
    rg->id0 = id0;
}

/* ------------------------------------------------------------------ gather */

typedef struct {
    const float *const *pl;  /* slab plane kd (input plane od s - p + kd) */
    size_t rstride;          /* floats between slab rows */
    int k, s, C, ocp;
    const float *wp, *bias; /* bias padded to ocp or NULL */
    /* 3x3x3 stride 1 with at most 8 output channels (see pair_rows): the
     * slab planes as column pairs, and the weights and bias with each
     * channel's value in two lanes; ppl NULL: not this path */
    const float *const *ppl;
    const float *wq, *bq;
    size_t prs; /* floats between pair-slab rows */
} gc_args;

typedef struct {
    const float *const *planes; /* slab plane i: input plane od s - p + i (slab_ring) */
    size_t rstride;
    int k, s, C;
    const float *gy; /* np planes x nr rows of OW voxels x ldg floats */
    int ldg, nr, OW, np;
    float *dw; /* [k^3][C][ocp] */
    int ocp;
} wg_args;

#include "src/nn/conv_tiles.h"

int ts_nn_gather(const ts_conv_geom *g, const float *x, const float *wp, const float *bias, float *y)
{
    return ts_nn_gather2(g, (ts_conv_src){x, NULL, g->C, NULL}, wp, bias, (ts_conv_dst){y, NULL, g->OC, NULL}, NULL);
}

/* the progress hooks of sch (see conv_impl.h); the caller is thread 0 */

#include "src/nn/conv_pairs.h"

/* the 3x3x3 stride-1 runs with C (channels a voxel) a constant where it is
 * 1, 16, 32 or 64: the tiles' 18 input offsets i * C become immediates instead
 * of registers spilled to the stack (conv_bf16_variant.h does the same) */
#define GK3_CONST(nv, cc)                                                                                               \
    __attribute__((flatten)) static void gk3_run_##nv##_c##cc(const gc_args *a, int r, int OW, int oc, int yo, int nco, \
                                                              float *yr, int ldy)                                     \
    {                                                                                                                   \
        gc_args b = *a;                                                                                                 \
        b.C = cc;                                                                                                       \
        gk3_run_##nv(&b, r, OW, oc, yo, nco, yr, ldy);                                                                 \
    }
GK3_CONST(1, 1)
GK3_CONST(1, 16)
GK3_CONST(1, 32)
GK3_CONST(1, 64)
GK3_CONST(2, 16)
GK3_CONST(2, 32)
GK3_CONST(2, 64)
#undef GK3_CONST

static void gk3_run(const gc_args *a, int nv, int r, int OW, int oc, int yo, int nco, float *yr, int ldy)
{
#define GK3_C(nv)                                                                                                       \
    (a->C == 16   ? gk3_run_##nv##_c16(a, r, OW, oc, yo, nco, yr, ldy)                                                  \
     : a->C == 32 ? gk3_run_##nv##_c32(a, r, OW, oc, yo, nco, yr, ldy)                                                  \
     : a->C == 64 ? gk3_run_##nv##_c64(a, r, OW, oc, yo, nco, yr, ldy)                                                  \
                  : gk3_run_##nv(a, r, OW, oc, yo, nco, yr, ldy))
    if (nv == 2) GK3_C(2);
    else if (a->C == 1) gk3_run_1_c1(a, r, OW, oc, yo, nco, yr, ldy); /* the first layer's one channel */
    else GK3_C(1);
#undef GK3_C
}

/* one output row: channel tiles from oc0 to oc1 (global channel index for
 * the weights) written at channel yo0 of rows of ldy floats */
static void gather_row(const gc_args *a, int k3s1, int r, int OW, int oc0, int oc1, int OC, float *yr, int yo0, int ldy)
{
    if (a->ppl && k3s1 && oc0 == 0 && oc1 == OC) {
        gq_row_any(a, r, OW, OC, yr, yo0, ldy);
        return;
    }
    for (int oc = oc0; oc < oc1;) {
        const int lanes = ts_nn_pad16(oc1) - oc, yo = yo0 + oc - oc0;
        if (k3s1) { /* 3x3x3, stride 1: broadcasts shared across kw */
            const int nv = lanes >= 32 ? 2 : 1, nco = imin(16 * nv, imin(oc1, OC) - oc);
            gk3_run(a, nv, r, OW, oc, yo, nco, yr, ldy);
            oc += 16 * nv;
        } else {
            const int nv = nv_for(lanes), nco = imin(16 * nv, imin(oc1, OC) - oc);
            if (nv == 4) gc_run_4(a, r * a->s, OW, oc, yo, nco, yr, ldy);
            else if (nv == 2) gc_run_2(a, r * a->s, OW, oc, yo, nco, yr, ldy);
            else gc_run_1(a, r * a->s, OW, oc, yo, nco, yr, ldy);
            oc += 16 * nv;
        }
    }
}

/* ep (NULL: nothing) on a row of n voxels of C channels, the epilogue's
 * channels c0 .. c0 + C - 1: norm_impl.h's affine map and relu.c's leaky
 * ReLU, the same arithmetic as those passes; pat (NULL: none) the affine
 * map's 16-lane pattern of the whole output (C dividing 16, c0 = 0) */
static void epilogue(const ts_conv_ep *ep, const float *pat, float *y, int n, int C, int c0, float *acc)
{
    if (!ep) return;
    const int act = ep->act != TS_EP_NONE;
    const float slope = ep->act == TS_EP_LEAKY ? ep->slope : 0.0f;
    if (pat) ts_nn_affine_run16(y, pat, pat + 16, (size_t)n * C, act, slope, y);
    else if (ep->scale) ts_nn_affine_run(y, ep->scale + c0, ep->shift + c0, (size_t)n, C, act, slope, y);
    else if (act)
        for (size_t i = 0; i < (size_t)n * C; i++) y[i] = ts_nn_act1(y[i], 1, slope);
    if (acc) ts_nn_amax_run(y, (size_t)n, C, acc + c0); /* ep->amax: this thread's maxima of the row's sample */
}

/* One output row into y (split or not, see ts_conv_dst) with the fp32
 * tiles (ab NULL) or the bf16 ones: row index `row`, tile row r. */
static void out_row(const gc_args *a, const ts_bf16_gc_args *ab, int nat, const ts_conv_geom *g, int k3s1, int r,
                    size_t row, ts_conv_dst y, const float *pat, float *rowbuf, float *acc)
{
#define ROW(oc0_, oc1_, yr_, ldy_)                                                                                         \
    (ab ? ts_nn_bf16_gather_row(nat, ab, k3s1, r, g->OW, oc0_, oc1_, g->OC, yr_, 0, ldy_)                             \
        : gather_row(a, k3s1, r, g->OW, oc0_, oc1_, g->OC, yr_, 0, ldy_))
    if (!y.b) {
        ROW(0, g->OC, y.a + row * g->OW * g->OC, g->OC);
        epilogue(y.ep, pat, y.a + row * g->OW * g->OC, g->OW, g->OC, 0, acc);
    } else if (y.ca % 16 == 0) {
        const int cb = g->OC - y.ca;
        ROW(0, y.ca, y.a + row * g->OW * y.ca, y.ca);
        ROW(y.ca, g->OC, y.b + row * g->OW * cb, cb);
        epilogue(y.ep, NULL, y.a + row * g->OW * y.ca, g->OW, y.ca, 0, acc);
        epilogue(y.ep, NULL, y.b + row * g->OW * cb, g->OW, cb, y.ca, acc);
    } else {
        const int cb = g->OC - y.ca;
        ROW(0, g->OC, rowbuf, g->OC);
        epilogue(y.ep, pat, rowbuf, g->OW, g->OC, 0, acc);
        for (int w = 0; w < g->OW; w++) {
            memcpy(y.a + (row * g->OW + w) * y.ca, rowbuf + (size_t)w * g->OC, (size_t)y.ca * sizeof(float));
            memcpy(y.b + (row * g->OW + w) * cb, rowbuf + (size_t)w * g->OC + y.ca, (size_t)cb * sizeof(float));
        }
    }
#undef ROW
}

/* Runs of output planes along D for the ring drivers: units of (sample, row
 * block, run of L planes), about 16 units per thread; single planes where
 * consecutive planes share no input plane (k <= s). */
typedef struct gather_runs {
    int nhb, dorder, L, nrun;
    long units;
} gather_runs;

static gather_runs runs_of(const ts_conv_geom *g, int hb, int nt)
{
    gather_runs u;
    u.nhb = (g->OH + hb - 1) / hb;
    const long cols = (long)g->N * u.nhb, runs = (16L * nt + cols - 1) / cols;
    u.dorder = g->k > g->s;
    u.L = u.dorder ? imax(1, (int)((g->OD + runs - 1) / runs)) : 1;
    u.nrun = (g->OD + u.L - 1) / u.L;
    u.units = cols * u.nrun;
    return u;
}

/* The gather driver of every precision (fp32, fp16-rounded, bf16): the items (sample, output
 * plane, block of rows) taken in runs along D, a ring of slab planes
 * (slab_ring) staging each input plane of a run once; with at most 8
 * output channels (3x3x3, stride 1, fp32 or bf16) each staged plane is also paired
 * for the voxel-pair tiles. Every output voxel is computed as in any other
 * order: the results do not depend on the runs. */
static int gather_impl(const slab_fmt *f, const ts_conv_geom *g, ts_conv_src x, const void *wp, const float *bias,
                       ts_conv_dst y, const ts_conv_sched *sch)
{
    int err = 0;
    size_t nam = 0;
    float *tam = NULL; /* see below */
    const int ocp = ts_nn_pad16(g->OC), hb = row_block(g), nt = ts_nn_nthreads();
    const int R = (hb - 1) * g->s + g->k, CS = (g->OW - 1) * g->s + g->k;
    if (g->k > 8) TS_FAIL(TS_ERR_UNSUPPORTED, "conv kernel size %d (at most 8)", g->k);
    const int amx = f->bf16 && f->nat == 2, k3s1 = g->k == 3 && g->s == 1; /* AMX: no pair planes, a margin */
    const size_t rs = slab_row_n(f, CS, g->C), amx_n = amx ? TS_NN_AMX_MARGIN(g->s, (g->C + 1) / 2) : 0;
    const size_t slab_n = round16((size_t)g->k * R * rs + amx_n);
    /* a split output whose split is not a multiple of 16 goes through a row buffer */
    const size_t row_n = !y.b || y.ca % 16 == 0 ? 0 : round16((size_t)g->OW * g->OC);
    /* at most 8 output channels, 3x3x3 stride 1: voxel pairs (fp32, bf16; AMX's own); cw: words a voxel */
    const int pairs = !f->f16 && !f->vpair && !amx && k3s1 && g->OC <= 8, amxp = amx && k3s1 && g->OC <= 8;
    const int cw = f->bf16 ? (g->C + 1) / 2 : g->C;
    const size_t ppn = (size_t)2 * R * CS * cw, pq_n = pairs ? round16((size_t)g->k * ppn) : 0;
    const size_t per = slab_n + row_n + pq_n, wq_n = pairs ? round16((size_t)27 * cw * 16) + 16 : amxp ? (size_t)576 * cw : 0;
    float *bp = NULL, *slabs = ts_nn_scratch(0, (per * nt + ocp + wq_n) * sizeof(float));
    if (!slabs) TS_FAIL(TS_ERR_NOMEM, "conv input slabs");
    if (bias) {
        bp = slabs + per * nt;
        memset(bp, 0, (size_t)ocp * sizeof(float));
        memcpy(bp, bias, (size_t)g->OC * sizeof(float));
    }
    float *wq = pairs || amxp ? slabs + per * nt + ocp : NULL, *bq = pairs ? wq + wq_n - 16 : NULL;
    if (pairs) pair_weights(wp, bias, cw, ocp, g->OC, wq, bq); /* bf16 pairs copied as 32-bit words */
    if (amxp) ts_nn_amx_pair_weights(wp, cw, ocp, g->OC, (uint32_t *)wq);
    const gather_runs gr = runs_of(g, hb, nt);
    /* the epilogue's affine pattern, once for all rows (see epilogue) */
    float pat[32];
    const float *patp = NULL;
    if (y.ep && y.ep->scale && g->OC <= 16 && 16 % g->OC == 0) {
        ts_nn_affine_pattern(y.ep->scale, y.ep->shift, g->OC, pat, pat + 16);
        patp = pat;
    }
    /* the epilogue's maxima (ts_conv_ep.amax): per thread, then into ep->amax */
    nam = y.ep && y.ep->amax ? (size_t)g->N * g->OC : 0;
    tam = nam ? TS_CALLOC(nam * (size_t)nt, sizeof(float)) : NULL;
    if (nam && !tam) TS_FAIL(TS_ERR_NOMEM, "conv epilogue maxima");
    /* which items read a non-NULL face (see ts_conv_part) */
    const ts_conv_part part = sch ? sch->part : TS_CONV_ALL;
    const int fd0 = halo_face(x.halo, 0, 0) != NULL, fd1 = halo_face(x.halo, 0, 1) != NULL;
    const int fh0 = halo_face(x.halo, 1, 0) != NULL, fh1 = halo_face(x.halo, 1, 1) != NULL;
    const int fw = halo_face(x.halo, 2, 0) || halo_face(x.halo, 2, 1);
    /* thread 0 runs the hooks on entry (it may find no item left: the other
     * threads can take them all) and after each item it completes */
#pragma omp parallel
    {
        const int tid = ts_nn_thread_id();
        float *slab = slabs + per * tid, *rowbuf = slab + slab_n;
        const uint32_t *plane[8], *bpl[8];
        const float *pl[8], *ppl[8];
        slab_ring ring = {-1, 0, 0, 0, g->k, R * rs, (uint32_t *)slab, plane, pairs ? rowbuf + row_n : NULL, ppl, ppn};
        if (tid == 0) ts_nn_run_hooks(sch);
#pragma omp for schedule(dynamic, 1)
        for (long u = 0; u < gr.units; u++) {
            const int n = (int)(u / ((long)gr.nhb * gr.nrun));
            const int oh0 = (int)(gr.dorder ? u / gr.nrun % gr.nhb : u % gr.nhb) * hb;
            const int od0 = (int)(gr.dorder ? u % gr.nrun : u / gr.nhb % gr.nrun) * gr.L;
            const int nr = imin(hb, g->OH - oh0);
            ring.n = -1;
            for (int od = od0; od < imin(od0 + gr.L, g->OD); od++) {
                if (part != TS_CONV_ALL) {
                    const int border = fw || (fd0 && od == 0) || (fd1 && od == g->OD - 1) || (fh0 && oh0 == 0) ||
                                       (fh1 && oh0 + nr == g->OH);
                    if (border != (part == TS_CONV_BORDER)) continue;
                }
                ring_stage(&ring, f, g, x, n, od * g->s - g->p, oh0, R, CS);
                const size_t row = ((size_t)n * g->OD + od) * g->OH + oh0;
                float *acc = tam ? tam + nam * tid + (size_t)n * g->OC : NULL;
                if (f->bf16) {
                    for (int i = 0; i < g->k; i++) bpl[i] = (const uint32_t *)ppl[i];
                    const ts_bf16_gc_args b = {plane, rs, g->k, g->s, cw, ocp, wp, bp, pairs ? bpl : NULL,
                                               (const uint32_t *)wq, bq, (size_t)2 * CS * cw};
                    for (int r = 0; r < nr; r++) out_row(NULL, &b, f->nat, g, k3s1, r, row + r, y, patp, rowbuf, acc);
                } else {
                    for (int i = 0; i < g->k; i++) pl[i] = (const float *)plane[i];
                    const gc_args a = {pl, rs, g->k, g->s, g->C, ocp, wp, bp, pairs ? ppl : NULL, wq, bq,
                                       (size_t)2 * CS * cw};
                    for (int r = 0; r < nr; r++) out_row(&a, NULL, 0, g, k3s1, r, row + r, y, patp, rowbuf, acc);
                }
                if (tid == 0) ts_nn_run_hooks(sch);
            }
        }
    }
    for (size_t i = 0; i < nam; i++)
        for (int t = 0; t < nt; t++) y.ep->amax[i] = fmaxf(y.ep->amax[i], tam[nam * (size_t)t + i]);
cleanup:
    free(tam);
    return err;
}

int ts_nn_gather2(const ts_conv_geom *g, ts_conv_src x, const float *wp, const float *bias, ts_conv_dst y,
                  const ts_conv_sched *sch)
{
    return gather_impl(&FMT_F32, g, x, wp, bias, y, sch);
}

int ts_nn_gather2_fp16(const ts_conv_geom *g, ts_conv_src x, const float *wp, const float *bias, ts_conv_dst y,
                       const ts_conv_sched *sch)
{
    return gather_impl(&FMT_F16, g, x, wp, bias, y, sch);
}

int ts_nn_gather2_bf16(const ts_conv_geom *g, ts_conv_src x, const uint32_t *wp, const float *bias, ts_conv_dst y,
                       const ts_conv_sched *sch)
{
    const slab_fmt f = {1, 0, ts_nn_bf16_native(), g->s, 0};
    return gather_impl(&f, g, x, wp, bias, y, sch);
}

/* ----------------------------------------------------------------- tgather */

/* first i >= 0 with i*s + off >= 0, and one past the last with i*s + off < lim, clamped to [0, n) */
static void tap_range(int s, int off, int lim, int n, int *lo, int *hi)
{
    int l = off >= 0 ? 0 : (-off + s - 1) / s;
    int h = lim - 1 - off < 0 ? 0 : (lim - 1 - off) / s + 1;
    *lo = imin(l, n);
    *hi = imax(*lo, imin(h, n));
}

/* Output rows a thread takes at a time in the transposed gathers: about
 * 256 KiB of output (a row is a fraction of a microsecond of work: taken 4
 * at a time, the shared loop counter's traffic between the cores cost more
 * than the rows; 64^3 x 16 bf16 forward 2.46 -> 1.2 ms on 2 threads), at
 * least 16 takes a thread where the rows allow. */
static int trow_chunk(const ts_conv_geom *g, long rows)
{
    long c = (65536L + (long)g->OW * g->OC - 1) / ((long)g->OW * g->OC);
    const long most = rows / (16L * ts_nn_nthreads());
    if (c > most) c = most;
    return c < 1 ? 1 : (int)c;
}

/* k = s = 2, padding 0 (the U-Net's up-convolutions): each output voxel
 * takes one tap, so each output row is one input row times the two kw taps
 * of its (kd, kh), written by the tg2 tiles (bf16: tg2b) from the bias: no
 * initialising pass, and each broadcast feeds both taps. The same sums in
 * the same order as the general loop of tgather_impl. */
static int tgather_k2(const ts_conv_geom *g, const float *x, const uint32_t *xb, int nat, const void *wp,
                      const float *bias, float *y)
{
    const int ocp = ts_nn_pad16(g->OC), OC = g->OC, C = xb ? (g->C + 1) / 2 : g->C;
    float *b = TS_ALIGNED_ALLOC((size_t)ocp * sizeof(float));
    if (!b) return TS_ERR(TS_ERR_NOMEM, "transposed conv bias");
    for (int oc = 0; oc < ocp; oc++) b[oc] = bias && oc < OC ? bias[oc] : 0.0f;
    const long rows = (long)g->N * g->OD * g->OH;
    const int chunk = trow_chunk(g, rows);
#pragma omp parallel for schedule(dynamic, chunk)
    for (long it = 0; it < rows; it++) {
        const int n = (int)(it / ((long)g->OD * g->OH)), od = (int)(it / g->OH % g->OD), oh = (int)(it % g->OH);
        const size_t xrow = (((size_t)n * g->D + od / 2) * g->H + oh / 2) * (size_t)g->W * C;
        const size_t t = (size_t)(((od & 1) * 2 + (oh & 1)) * 2) * C * ocp; /* tap (kd, kh, 0) */
        float *yr = y + (size_t)it * g->OW * OC;
        if (xb) {
            ts_nn_bf16_tgather_k2_row(nat, xb + xrow, (const uint32_t *)wp + t, b, C, ocp, g->W, OC, yr);
            continue;
        }
        const float *xr = x + xrow, *wr = (const float *)wp + t;
        for (int oc0 = 0; oc0 < ocp;) {
            const int nv = nv_for(ocp - oc0), nco = imin(16 * nv, OC - oc0);
            if (nv == 4) tg2_run_4(xr, wr, b, C, ocp, g->W, oc0, nco, yr, OC);
            else if (nv == 2) tg2_run_2(xr, wr, b, C, ocp, g->W, oc0, nco, yr, OC);
            else tg2_run_1(xr, wr, b, C, ocp, g->W, oc0, nco, yr, OC);
            oc0 += 16 * nv;
        }
    }
    free(b);
    return 0;
}

/* The transposed gather for both precisions: xb (bf16) NULL: x and wp
 * fp32; else xb holds x as channel pairs ([N][D][H][W][ceil(C/2)]) and wp
 * pairs. */
static int tgather_impl(const ts_conv_geom *g, const float *x, const uint32_t *xb, int nat, const void *wp,
                        const float *bias, float *y)
{
    const int ocp = ts_nn_pad16(g->OC), k = g->k, s = g->s, p = g->p, OC = g->OC;
    if (k == 2 && s == 2 && p == 0) return tgather_k2(g, x, xb, nat, wp, bias, y);
    const int C = xb ? (g->C + 1) / 2 : g->C; /* elements (floats or pairs) per input voxel */
    const long rows = (long)g->N * g->OD * g->OH;
    const int chunk = trow_chunk(g, rows);
#pragma omp parallel for schedule(dynamic, chunk)
    for (long it = 0; it < rows; it++) {
        const int n = (int)(it / ((long)g->OD * g->OH)), od = (int)(it / g->OH % g->OD), oh = (int)(it % g->OH);
        float *yr = y + (size_t)it * g->OW * OC;
        for (int ow = 0; ow < g->OW; ow++)
            for (int oc = 0; oc < OC; oc++) yr[(size_t)ow * OC + oc] = bias ? bias[oc] : 0.0f;
        for (int kd = 0; kd < k; kd++) {
            const int nd = od + p - kd;
            if (nd < 0 || nd % s || nd / s >= g->D) continue;
            for (int kh = 0; kh < k; kh++) {
                const int nh = oh + p - kh;
                if (nh < 0 || nh % s || nh / s >= g->H) continue;
                const size_t xrow = (((size_t)n * g->D + nd / s) * g->H + nh / s) * (size_t)g->W * C;
                for (int kw = 0; kw < k; kw++) {
                    /* ow = iw*s + kw - p */
                    const int off = kw - p;
                    int lo, hi;
                    tap_range(s, off, g->OW, g->W, &lo, &hi);
                    const size_t t = (size_t)((kd * k + kh) * k + kw) * C * ocp;
                    if (xb) {
                        ts_nn_bf16_tgather_tap(nat, xb + xrow, (const uint32_t *)wp + t, C, ocp, s, off, lo, hi, OC, yr);
                        continue;
                    }
                    const float *xr = x + xrow, *wr = (const float *)wp + t;
                    for (int oc0 = 0; oc0 < ocp;) {
                        const int nv = nv_for(ocp - oc0), nco = imin(16 * nv, OC - oc0);
                        if (nv == 4) tg_run_4(xr, wr, C, ocp, s, off, lo, hi, oc0, nco, yr, OC);
                        else if (nv == 2) tg_run_2(xr, wr, C, ocp, s, off, lo, hi, oc0, nco, yr, OC);
                        else tg_run_1(xr, wr, C, ocp, s, off, lo, hi, oc0, nco, yr, OC);
                        oc0 += 16 * nv;
                    }
                }
            }
        }
    }
    return 0;
}

int ts_nn_tgather(const ts_conv_geom *g, const float *x, const float *wp, const float *bias, float *y)
{
    return tgather_impl(g, x, NULL, 0, wp, bias, y);
}

/* x rounded through fp16 first (scratch slot 3), then as fp32 */
int ts_nn_tgather_fp16(const ts_conv_geom *g, const float *x, const float *wp, const float *bias, float *y)
{
    const size_t n = (size_t)g->N * g->D * g->H * g->W * g->C;
    float *xr = ts_nn_scratch(3, n * sizeof(float) + 64);
    if (!xr) return TS_ERR(TS_ERR_NOMEM, "transposed conv fp16 input");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += 4096) put_f16(xr + i, x + i, n - i < 4096 ? n - i : 4096);
    return tgather_impl(g, xr, NULL, 0, wp, bias, y);
}

/* x converted to channel pairs first (scratch slot 3), then as above */
int ts_nn_tgather_bf16(const ts_conv_geom *g, const float *x, const uint32_t *wp, const float *bias, float *y)
{
    const int nat = ts_nn_bf16_native(), Cq = (g->C + 1) / 2;
    const long rows = (long)g->N * g->D * g->H;
    const size_t slack = nat == 2 ? TS_NN_AMX_MARGIN(1, Cq) : 0; /* an AMX tile's rows past the last input row */
    uint32_t *xb = ts_nn_scratch(3, ((size_t)rows * g->W * Cq + slack) * sizeof(uint32_t) + 64);
    if (!xb) return TS_ERR(TS_ERR_NOMEM, "transposed conv bf16 input");
    const slab_fmt f = {1, 0, nat, 1, 0};
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++)
        row_put(&f, xb + (size_t)r * g->W * Cq, g->C, 0, g->W, x + (size_t)r * g->W * g->C, g->C, NULL);
    return tgather_impl(g, NULL, xb, nat, wp, bias, y);
}

/* ------------------------------------------------------------------- wgrad */

/* Work items are split into a fixed number of contiguous chunks (it depends on
 * the shapes, not on the threads), each summed into its own buffer and the
 * buffers added in order: results are identical for any thread count and
 * schedule, and threads take chunks dynamically (a preempted thread does not
 * hold the others up). */
int ts_nn_wgrad(const ts_conv_geom *g, const float *x, const float *gy, float *dwp)
{
    return ts_nn_wgrad2(g, (ts_conv_src){x, NULL, g->C, NULL}, gy, dwp, NULL, NULL);
}

/* One input channel (the first layer), 3x3x3 stride 1, ocp 16, fp32: all
 * 27 taps at once, 27 independent sums (wk3_1x1, one (kd, kh) at a time,
 * has three and waits on the FMA's latency), each tap's sum in wk3_1x1's
 * order (rows, then voxels, the same expression): the same bits */
static void wk3_c1(const wg_args *a)
{
    const int ldg = a->ldg, OW = a->OW;
    float *dw = a->dw; /* [27][1][16] */
    v16 acc[27];
#pragma GCC unroll 27
    for (int t = 0; t < 27; t++) acc[t] = *(v16 *)(dw + (size_t)t * 16);
    for (int q = 0; q < a->np * a->nr; q++) {
        const int pl = q / a->nr, r = q % a->nr;
        const float *xr[9];
#pragma GCC unroll 9
        for (int p = 0; p < 9; p++) xr[p] = a->planes[pl + p / 3] + (size_t)(r + p % 3) * a->rstride;
        const float *gr = a->gy + (size_t)q * OW * ldg;
        v16 m1 = (v16){0}, m2 = (v16){0};
        for (int jx = 0; jx < OW + 2; jx++) {
            const v16 g0 = jx < OW ? vld(gr + (size_t)jx * ldg) : (v16){0};
#pragma GCC unroll 9
            for (int p = 0; p < 9; p++) {
                const float x = xr[p][jx];
                acc[3 * p] += x * g0;
                acc[3 * p + 1] += x * m1;
                acc[3 * p + 2] += x * m2;
            }
            m2 = m1;
            m1 = g0;
        }
    }
#pragma GCC unroll 27
    for (int t = 0; t < 27; t++) *(v16 *)(dw + (size_t)t * 16) = acc[t];
}

/* The weight-gradient driver for both precisions. The items run along D
 * within a unit (sample, row block, then planes; where k <= s: planes, then
 * row blocks) so that a ring of slab planes keeps the planes that
 * consecutive items share (each input plane staged once per run of items,
 * not k / s times). bf16 (f->bf16, f->vpair): the slab holds pairs of
 * columns and each item's output-gradient rows are staged as voxel pairs
 * (ts_bf16_wg_args). Chunks and groups, hence the independence of the
 * thread count, are the same in both. */
/* long-function: the weight-gradient loop nest of both precisions; its OpenMP region shares the staging buffers */
static int wgrad_impl(const slab_fmt *f, const ts_conv_geom *g, ts_conv_src x, const float *gy, float *dwp, float *db,
                      const ts_conv_sched *sch)
{
    int err = 0;
    double *dbs = NULL;
    const int ocp = ts_nn_pad16(g->OC), nt = ts_nn_nthreads(), k = g->k, k3s1 = k == 3 && g->s == 1 && g->p == 1;
    /* an item: P planes x hb rows of output, at least 512 voxels where the
     * layer allows (each weight tile sums that many voxels in registers) */
    int hb = row_block(g), P = 1;
    const int target = 512;
    while (hb < g->OH && hb * g->OW < target) hb *= 2;
    if (hb >= g->OH) {
        hb = g->OH;
        while (P < g->OD && P * hb * g->OW < target) P++;
    }
    const int R = (hb - 1) * g->s + k, CS = (g->OW - 1) * g->s + k, KP = (P - 1) * g->s + k;
    const size_t rs = slab_row_n(f, CS, g->C);
    const int amx = f->bf16 && f->nat == 2 && g->C >= 8; /* AMX from 8 channels (fewer: mostly empty tiles) */
    const size_t slab_n = round16((size_t)KP * R * rs + (amx ? 16 : 0)), dw_n = (size_t)k * k * k * g->C * ocp;
    const size_t gt_n = amx ? round16(ts_nn_amx_wgrad_scratch(P * hb, ocp, g->OW)) : 0;
    const int padg = g->OC % 16 != 0 || f->f16; /* fp16: the rows are rounded as they are padded */
    /* fp32, 3x3x3 stride 1, 2 to 8 output channels: the voxel-pair tiles (conv_pairs.h) on pair planes */
    const int wpair = !f->bf16 && !f->f16 && k3s1 && g->OC <= 8 && g->C > 1;
    const size_t pq_n = wpair ? round16((size_t)KP * R * CS * 2 * g->C) : 0;
    /* bf16: nm pairs per staged row after one zero entry; fp32: rows padded
     * to ocp where OC is not; then the ring's plane pointers (both) */
    const int nm = g->OW / 2 + 2;
    const size_t gpad_n = f->bf16 ? round16(((size_t)P * hb * nm + 1) * ocp + (size_t)KP * 2)
                                  : (padg ? (size_t)P * hb * g->OW * ocp : 0) + round16((size_t)KP * 4);
    const int nhb = (g->OH + hb - 1) / hb, npb = (g->OD + P - 1) / P, dorder = k > g->s;
    const long items = (long)g->N * npb * nhb;
    /* chunks: up to 16, fewer for large weights (at most ~1M floats of partial sums, at least 2) */
    long nch = items < 16 ? items : 16;
    while (nch > 2 && (size_t)nch * dw_n > ((size_t)1 << 20)) nch--;
    /* 2, 4 or a multiple of 4: the units below come in whole rounds for 2 or 4 threads (9 chunks on 2 threads
     * left one idle for a ninth of the call) */
    if (nch > 4) nch &= ~3L;
    else if (nch == 3) nch = 2;
    float *slabs = ts_nn_scratch(0, ((slab_n + gpad_n + pq_n + gt_n) * nt + dw_n * nch) * sizeof(float));
    if (!slabs) TS_FAIL(TS_ERR_NOMEM, "conv weight-gradient scratch");
    float *gpads = slabs + slab_n * nt, *pqs = gpads + gpad_n * nt, *gts = pqs + pq_n * nt, *dws = gts + gt_n * nt;
    /* db: the sums of each chunk's items (group 0 of the chunk), added in chunk order below */
    dbs = db ? TS_CALLOC((size_t)nch * g->OC, sizeof(double)) : NULL;
    if (db && !dbs) TS_FAIL(TS_ERR_NOMEM, "conv bias-gradient sums");
    /* with more threads than chunks, a chunk's taps are split into G groups
     * of (kd, kh) pairs: work units (chunk, group) write disjoint parts of
     * the chunk's sums, so the summation order stays the same */
    int G = 1;
    if (nch < 2 * nt) G = nch * k < 2 * nt ? k * k : k;
    const long units = nch * G;
#pragma omp parallel
    {
        const int tid = ts_nn_thread_id();
        float *slab = slabs + slab_n * tid, *gpad = gpads + gpad_n * tid;
        float bacc[256]; /* ts_nn_item_bias's block sums */
        /* bf16: the staged pairs (one zero entry first), fp32: the padded rows where OC is not a multiple
         * of 16; the ring's plane pointers after them */
        uint32_t *gb = (uint32_t *)gpad + ocp;
        const size_t gused = f->bf16 ? ((size_t)P * hb * nm + 1) * ocp : padg ? (size_t)P * hb * g->OW * ocp : 0;
        slab_ring ring = {-1, 0, 0, 0, KP, R * rs, (uint32_t *)slab, (const uint32_t **)(gpad + gused), wpair ? pqs + pq_n * tid : NULL,
                          (const float **)(gpad + gused) + KP, (size_t)R * CS * 2 * g->C};
        if (tid == 0) ts_nn_run_hooks(sch); /* on entry, and after each item of thread 0 */
#pragma omp for schedule(dynamic, 1)
        for (long u = 0; u < units; u++) {
            const long ch = u / G;
            const int grp = (int)(u % G), pairs = k * k / G, p0 = grp * pairs; /* (kd, kh) pairs p0 .. p0+pairs-1 */
            const size_t tap_n = (size_t)g->C * ocp * k;                    /* floats of one (kd, kh) pair */
            float *dw = dws + dw_n * ch;
            memset(dw + tap_n * p0, 0, tap_n * pairs * sizeof(float));
            ring.n = -1;
            for (long it = ch * items / nch; it < (ch + 1) * items / nch; it++) {
                /* along D where consecutive items share planes (k > s), else plane by plane */
                const int n = (int)(it / ((long)npb * nhb));
                const int oh0 = (int)(dorder ? it / npb % nhb : it % nhb) * hb, od = (int)(dorder ? it % npb : it / nhb % npb) * P;
                const int nr = imin(hb, g->OH - oh0), np = imin(P, g->OD - od);
                ring_stage(&ring, f, g, x, n, od * g->s - g->p, oh0, R, CS);
                if (dbs && grp == 0) /* the item's rows are contiguous: one plane's rows, or whole planes */
                    ts_nn_item_bias(gy + (((size_t)n * g->OD + od) * g->OH + oh0) * (size_t)g->OW * g->OC,
                              (size_t)np * nr * g->OW, g->OC, bacc, dbs + (size_t)ch * g->OC);
                if (f->bf16) {
                    if (g->OC == ocp) { /* the puts write every word of each row's first OW / 2 pairs: zero the
                                         * leading entry and the rest of each row */
                        const size_t z0 = (size_t)g->OW / 2;
                        memset(gpad, 0, (size_t)ocp * sizeof(uint32_t));
                        for (int q = 0; q < np * nr; q++)
                            memset(gb + ((size_t)q * nm + z0) * ocp, 0, (nm - z0) * ocp * sizeof(uint32_t));
                    } else {
                        memset(gpad, 0, ((size_t)P * hb * nm + 1) * ocp * sizeof(uint32_t));
                    }
                    for (int q = 0; q < np * nr; q++) {
                        const float *src = gy + (((size_t)n * g->OD + od + q / nr) * g->OH + oh0 + q % nr) * (size_t)g->OW * g->OC;
                        ts_nn_bf16_put(f->nat, 1, 1, g->OC, ocp, gb + (size_t)q * nm * ocp, 0, g->OW, src, g->OC, NULL);
                    }
                    const ts_bf16_wg_args b = {ring.plane, rs, k, g->s, g->C, gb, nm, (g->OW + 1) / 2, g->OW / 2 + 1,
                                               (CS + 1) / 2, nr, np, dw, ocp};
                    if (amx) ts_nn_amx_wgrad_item(&b, p0, pairs, (uint32_t *)(gts + gt_n * tid));
                    else if (k3s1 && ocp == 16 && g->C == 1 && pairs == 9) ts_nn_bf16_wgrad_c1(f->nat, &b);
                    else
                        for (int pr = p0; pr < p0 + pairs; pr++) ts_nn_bf16_wgrad_pair(f->nat, &b, pr / k, pr % k, k3s1);
                    if (tid == 0) ts_nn_run_hooks(sch);
                    continue;
                }
                /* rows of the item are contiguous: one plane's rows, or whole planes */
                const float *gr = gy + (((size_t)n * g->OD + od) * g->OH + oh0) * (size_t)g->OW * g->OC;
                int ldg = g->OC;
                if (wpair) { /* the rows as voxel pairs, then the pair tiles of each (kd, kh) */
                    const int nmp = (g->OW + 1) / 2;
                    for (int q = 0; q < np * nr; q++) wq_stage(gr + (size_t)q * g->OW * g->OC, g->OW, g->OC, gpad + (size_t)q * nmp * 16);
                    const wg_args a = {ring.pplane, (size_t)CS * 2 * g->C, k, 1, g->C, gpad, 16, nr, g->OW, np, dw, ocp};
                    for (int pr = p0; pr < p0 + pairs; pr++) wq_pair(&a, pr / 3, pr % 3);
                    if (tid == 0) ts_nn_run_hooks(sch);
                    continue;
                }
                if (padg) { /* fp32: each voxel's OC floats and zeros up to ocp, whole vectors (no pass to zero) */
                    if (f->f16) memset(gpad, 0, gused * sizeof(float)); /* not the ring's plane pointers after them */
                    for (size_t v = 0; v < (size_t)np * nr * g->OW; v++) {
                        if (f->f16) put_f16(gpad + v * ocp, gr + v * g->OC, (size_t)g->OC);
                        else
                            for (int c = 0; c < ocp; c += 16) *(v16u *)(gpad + v * ocp + c) = ts_nn_vld_part(gr + v * g->OC + c, g->OC - c);
                    }
                    gr = gpad;
                    ldg = ocp;
                }
                wg_args a = {(const float *const *)ring.plane, (size_t)CS * g->C, k, g->s, g->C, gr, ldg, nr, g->OW, np, dw, ocp};
                if (k3s1 && ocp == 16 && g->C == 1 && pairs == 9) { /* the first layer: every tap at once */
                    wk3_c1(&a);
                    if (tid == 0) ts_nn_run_hooks(sch);
                    continue;
                }
                for (int pr = p0; pr < p0 + pairs; pr++) {
                    const int kd = pr / k, kh = pr % k;
                    if (k3s1 && ocp == 16) { /* 3x3x3 stride 1, one output vector: the three kw taps together */
                        wk3_run_1(&a, kd, kh, 0);
                        continue;
                    }
                    for (int kw = 0; kw < k; kw++)
                        for (int oc0 = 0; oc0 < ocp;) {
                            const int nv = nv_for(ocp - oc0);
                            if (nv == 4) wg_run_4(&a, kd, kh, kw, oc0);
                            else if (nv == 2) wg_run_2(&a, kd, kh, kw, oc0);
                            else wg_run_1(&a, kd, kh, kw, oc0);
                            oc0 += 16 * nv;
                        }
                }
                if (tid == 0) ts_nn_run_hooks(sch);
            }
        }
    }
    for (int oc = 0; dbs && oc < g->OC; oc++) {
        double t = 0;
        for (long c = 0; c < nch; c++) t += dbs[(size_t)c * g->OC + oc];
        db[oc] += (float)t;
    }
    /* fixed-order reduction of the chunk sums, unpadded: 0 + chunk 0 + chunk 1 ... per value */
    const size_t rows = (size_t)k * k * k * g->C;
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        float *out = dwp + r * g->OC;
        for (int oc = 0; oc < g->OC; oc++) out[oc] = 0;
        for (long c = 0; c < nch; c++) {
            const float *src = dws + dw_n * c + r * ocp;
            for (int oc = 0; oc < g->OC; oc++) out[oc] += src[oc];
        }
    }
cleanup:
    free(dbs);
    return err;
}

int ts_nn_wgrad2(const ts_conv_geom *g, ts_conv_src x, const float *gy, float *dwp, float *db, const ts_conv_sched *sch)
{
    return wgrad_impl(&FMT_F32, g, x, gy, dwp, db, sch);
}

int ts_nn_wgrad2_fp16(const ts_conv_geom *g, ts_conv_src x, const float *gy, float *dwp, float *db,
                      const ts_conv_sched *sch)
{
    return wgrad_impl(&FMT_F16, g, x, gy, dwp, db, sch);
}

int ts_nn_wgrad2_bf16(const ts_conv_geom *g, ts_conv_src x, const float *gy, float *dwp, float *db,
                      const ts_conv_sched *sch)
{
    const slab_fmt f = {1, 1, ts_nn_bf16_native(), g->s, 0};
    return wgrad_impl(&f, g, x, gy, dwp, db, sch);
}
