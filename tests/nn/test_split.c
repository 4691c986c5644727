/* Layers of a spatially split volume against the same layers on the whole
 * volume, without MPI. Convolutions: a global tensor is cut into boxes, each
 * box gets its halo faces built from the global tensor (zeros beyond the
 * volume, following the layouts of layers.h), and the split forward (ALL;
 * INTERIOR then BORDER), backward (dw and db summed over the boxes, dx per
 * box) and the concatenation variants are compared with ts_conv3d_* on the
 * whole volume. Group/instance norm and the losses with o->sync: the ranks
 * are threads whose sync sums through a barrier in rank order. */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/nn/conv_impl.h" /* ts_nn_bf16_select_isa */
#include "src/nn/layers.h"
#include "tests/tap.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "tests/nn/rand_tensor.h" /* rng, mk, MK */

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* max |a - b| / max |b| */
static double rel_err(const float *a, const float *b, int64_t n)
{
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return d / fmax(s, 1e-30);
}

/* ------------------------------------------------------ volumes and boxes */

/* A global channels-last volume [N][G0][G1][G2][C] of elements of vb bytes
 * (all channels of a voxel). */
typedef struct {
    int N, G[3];
    size_t vb;
    const void *p;
} vol_t;

typedef struct {
    int lo[3], hi[3];
} box_t;

/* cuts of the global volume: nb[d] boxes along d, boundaries cut[d][0 .. nb[d]] */
typedef struct {
    int nb[3];
    int cut[3][6];
} split_t;

static int nboxes(const split_t *s) { return s->nb[0] * s->nb[1] * s->nb[2]; }

static box_t box_at(const split_t *s, int i)
{
    const int c[3] = {i / (s->nb[1] * s->nb[2]), i / s->nb[2] % s->nb[1], i % s->nb[2]};
    box_t b;
    for (int d = 0; d < 3; d++) {
        b.lo[d] = s->cut[d][c[d]];
        b.hi[d] = s->cut[d][c[d] + 1];
    }
    return b;
}

static const void *vox(const vol_t *v, int n, int d, int h, int w)
{
    return (const char *)v->p + ((((size_t)n * v->G[0] + d) * v->G[1] + h) * v->G[2] + w) * v->vb;
}

/* the box of v, copied to out ([N][box][vb]) */
static void box_copy(const vol_t *v, const box_t *b, void *out)
{
    char *o = out;
    const size_t rb = (size_t)(b->hi[2] - b->lo[2]) * v->vb;
    for (int n = 0; n < v->N; n++)
        for (int d = b->lo[0]; d < b->hi[0]; d++)
            for (int h = b->lo[1]; h < b->hi[1]; h++, o += rb) memcpy(o, vox(v, n, d, h, b->lo[2]), rb);
}

/* the box of a float volume with C channels as a new tensor */
static ts_tensor box_tensor(const vol_t *v, const box_t *b, int C)
{
    ts_tensor t = MK(0, 0, v->N, b->hi[0] - b->lo[0], b->hi[1] - b->lo[1], b->hi[2] - b->lo[2], C);
    box_copy(v, b, t.data);
    return t;
}

/* voxel (n, d, h, w) of v or zeros outside the volume, into dst */
static void vox_or_zero(const vol_t *v, int n, int d, int h, int w, float *dst)
{
    if (d < 0 || d >= v->G[0] || h < 0 || h >= v->G[1] || w < 0 || w >= v->G[2]) memset(dst, 0, v->vb);
    else memcpy(dst, vox(v, n, d, h, w), v->vb);
}

/* The halo of box b of the float volume v, built as layers.h lays it out:
 * on[d] = split[d]; a face whose plane lies outside the volume is NULL, or
 * with zero_border a buffer of zeros (a NULL face and a zero face are the
 * same halo). Faces are malloc'ed (halo_free). */
static ts_halo halo_of(const vol_t *v, const box_t *b, const int split[3], int zero_border)
{
    ts_halo h;
    memset(&h, 0, sizeof h);
    const int64_t dhw[3] = {b->hi[0] - b->lo[0], b->hi[1] - b->lo[1], b->hi[2] - b->lo[2]};
    const int C = (int)(v->vb / sizeof(float));
    for (int d = 0; d < 3; d++) h.on[d] = split[d];
    const int e1 = split[1], e2 = split[2];
    for (int d = 0; d < 3; d++) {
        if (!split[d]) continue;
        for (int side = 0; side < 2; side++) {
            const int at = side ? b->hi[d] : b->lo[d] - 1; /* global index of the face's plane along d */
            if ((at < 0 || at >= v->G[d]) && !zero_border) continue;
            float *f = xmalloc((size_t)ts_halo_face_floats(dhw, h.on, d, v->N, C) * sizeof(float)), *o = f;
            for (int n = 0; n < v->N; n++) {
                if (d == 0)
                    for (int r = 0; r < dhw[1] + 2 * e1; r++)
                        for (int q = 0; q < dhw[2] + 2 * e2; q++, o += C)
                            vox_or_zero(v, n, at, b->lo[1] - e1 + r, b->lo[2] - e2 + q, o);
                else if (d == 1)
                    for (int i = 0; i < dhw[0]; i++)
                        for (int q = 0; q < dhw[2] + 2 * e2; q++, o += C)
                            vox_or_zero(v, n, b->lo[0] + i, at, b->lo[2] - e2 + q, o);
                else
                    for (int i = 0; i < dhw[0]; i++)
                        for (int j = 0; j < dhw[1]; j++, o += C) vox_or_zero(v, n, b->lo[0] + i, b->lo[1] + j, at, o);
            }
            if (side) h.hi[d] = f;
            else h.lo[d] = f;
        }
    }
    return h;
}

static void halo_free(ts_halo *h)
{
    for (int d = 0; d < 3; d++) {
        free(h->lo[d]);
        free(h->hi[d]);
        h->lo[d] = h->hi[d] = NULL;
    }
}

/* max |t - v restricted to b| and max |v restricted to b| */
static void box_diff(const ts_tensor *t, const vol_t *v, const box_t *b, double *diff, double *scale)
{
    const int C = (int)(v->vb / sizeof(float));
    const float *p = t->data;
    for (int n = 0; n < v->N; n++)
        for (int d = b->lo[0]; d < b->hi[0]; d++)
            for (int h = b->lo[1]; h < b->hi[1]; h++)
                for (int w = b->lo[2]; w < b->hi[2]; w++, p += C) {
                    const float *r = vox(v, n, d, h, w);
                    for (int c = 0; c < C; c++) {
                        *diff = fmax(*diff, fabs((double)p[c] - r[c]));
                        *scale = fmax(*scale, fabs((double)r[c]));
                    }
                }
}

/* ------------------------------------------------------------ progress hook */

/* counts calls; bad when two calls overlap or a call comes from another
 * thread than the one that called the layer */
typedef struct {
    atomic_int calls, inside, bad;
    pthread_t owner;
} hook_t;

static void hook_fn(void *ctx)
{
    hook_t *h = ctx;
    if (atomic_fetch_add(&h->inside, 1) != 0) atomic_store(&h->bad, 1);
    if (!pthread_equal(pthread_self(), h->owner)) atomic_store(&h->bad, 1);
    atomic_fetch_add(&h->calls, 1);
    for (volatile int i = 0; i < 2000; i++) {
    }
    atomic_fetch_sub(&h->inside, 1);
}

static void hook_init(hook_t *h)
{
    atomic_init(&h->calls, 0);
    atomic_init(&h->inside, 0);
    atomic_init(&h->bad, 0);
    h->owner = pthread_self();
}

/* ------------------------------------------------------------ split conv */

#define SENTINEL 0x7fa5a5a5u /* a NaN no kernel writes */

static int is_sentinel(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u == SENTINEL;
}

static void fill_sentinel(ts_tensor *t)
{
    const uint32_t u = SENTINEL;
    float f;
    memcpy(&f, &u, 4);
    ts_tensor_fill(t, f);
}

/* 1 where output voxel (od, oh, ow) of a box of dhw reads a non-NULL face */
static int reads_face(const ts_halo *h, const int64_t dhw[3], int od, int oh, int ow)
{
    const int o[3] = {od, oh, ow};
    for (int d = 0; d < 3; d++) {
        if (!h->on[d]) continue;
        if (o[d] == 0 && h->lo[d]) return 1;
        if (o[d] == dhw[d] - 1 && h->hi[d]) return 1;
    }
    return 0;
}

/* Conv over one tensor (cb == 0) or [a (ca), b (cb)] -> OC on a global volume
 * N x G cut by sp, compared with the unsplit conv. */
static void test_conv_split(const char *what, int N, const int G[3], const split_t *sp, int ca, int cb, int OC,
                            int zero_border)
{
    const int C = ca + cb, cat = cb > 0;
    const int split[3] = {sp->nb[0] > 1, sp->nb[1] > 1, sp->nb[2] > 1};
    ts_tensor A = MK(-1, 1, N, G[0], G[1], G[2], ca), B = MK(-1, 1, N, G[0], G[1], G[2], cat ? cb : 1);
    ts_tensor X = MK(0, 0, N, G[0], G[1], G[2], C), W = MK(-0.3f, 0.3f, OC, C, 3, 3, 3), bias = MK(-1, 1, OC);
    ts_tensor Y = MK(0, 0, N, G[0], G[1], G[2], OC), DY = MK(-1, 1, N, G[0], G[1], G[2], OC);
    ts_tensor DA = MK(0, 0, N, G[0], G[1], G[2], ca), DB = MK(0, 0, N, G[0], G[1], G[2], cat ? cb : 1);
    ts_tensor DW = MK(0, 0, OC, C, 3, 3, 3), Dbias = MK(0, 0, OC), dw = MK(0, 0, OC, C, 3, 3, 3), dbias = MK(0, 0, OC);
    int rc = 0;
    /* the whole volume */
    if (cat) {
        rc |= ts_concat_forward(&A, &B, &X);
        rc |= ts_conv3d_cat_forward(&A, &B, &W, &bias, 1, 1, &Y);
        rc |= ts_conv3d_cat_backward(&A, &B, &W, 1, 1, &DY, &DA, &DB, &DW, &Dbias);
    } else {
        rc |= ts_conv3d_forward(&A, &W, &bias, 1, 1, &Y);
        rc |= ts_conv3d_backward(&A, &W, 1, 1, &DY, &DA, &DW, &Dbias);
    }
    const vol_t vA = {N, {G[0], G[1], G[2]}, (size_t)ca * 4, A.data}, vB = {N, {G[0], G[1], G[2]}, (size_t)(cat ? cb : 1) * 4, B.data};
    const vol_t vX = {N, {G[0], G[1], G[2]}, (size_t)C * 4, cat ? X.data : A.data};
    const vol_t vY = {N, {G[0], G[1], G[2]}, (size_t)OC * 4, Y.data}, vDY = {N, {G[0], G[1], G[2]}, (size_t)OC * 4, DY.data};
    const vol_t vDA = {N, {G[0], G[1], G[2]}, (size_t)ca * 4, DA.data}, vDB = {N, {G[0], G[1], G[2]}, (size_t)(cat ? cb : 1) * 4, DB.data};
    double fd = 0, fs = 0, xd = 0, xs = 0;
    int part_bad = 0, interior_n = 0, border_n = 0, total_n = 0;
    hook_t hf, hx, hy;
    hook_init(&hf);
    hook_init(&hx);
    hook_init(&hy);
    for (int i = 0; i < nboxes(sp); i++) {
        const box_t b = box_at(sp, i);
        const int64_t dhw[3] = {b.hi[0] - b.lo[0], b.hi[1] - b.lo[1], b.hi[2] - b.lo[2]};
        ts_tensor a = box_tensor(&vA, &b, ca), bb = box_tensor(&vB, &b, cat ? cb : 1), dy = box_tensor(&vDY, &b, OC);
        ts_tensor y = MK(0, 0, N, dhw[0], dhw[1], dhw[2], OC), y1 = MK(0, 0, N, dhw[0], dhw[1], dhw[2], OC),
                  y2 = MK(0, 0, N, dhw[0], dhw[1], dhw[2], OC);
        ts_tensor da = MK(0, 0, N, dhw[0], dhw[1], dhw[2], ca), db = MK(0, 0, N, dhw[0], dhw[1], dhw[2], cat ? cb : 1);
        ts_halo hxh = halo_of(&vX, &b, split, zero_border), hyh = halo_of(&vDY, &b, split, zero_border);
        ts_conv_split s = {&hxh, TS_CONV_ALL, hook_fn, &hf, NULL}, si = {&hxh, TS_CONV_INTERIOR, NULL, NULL, NULL},
                      sb = {&hxh, TS_CONV_BORDER, NULL, NULL, NULL};
        ts_conv_split xsp = {&hxh, TS_CONV_ALL, hook_fn, &hx, NULL}, dysp = {&hyh, TS_CONV_ALL, hook_fn, &hy, NULL};
#define FWD(sp_, y_) (cat ? ts_conv3d_cat_forward_split(&a, &bb, &W, &bias, sp_, y_) : ts_conv3d_forward_split(&a, &W, &bias, sp_, y_))
        rc |= FWD(&s, &y);
        box_diff(&y, &vY, &b, &fd, &fs);
        /* interior then border into y1; border alone into y2 */
        fill_sentinel(&y1);
        fill_sentinel(&y2);
        rc |= FWD(&si, &y1);
        rc |= FWD(&sb, &y2);
        const float *p1 = y1.data, *p2 = y2.data;
        for (int n = 0; n < N; n++)
            for (int od = 0; od < dhw[0]; od++)
                for (int oh = 0; oh < dhw[1]; oh++)
                    for (int ow = 0; ow < dhw[2]; ow++) {
                        const size_t o = ((((size_t)n * dhw[0] + od) * dhw[1] + oh) * dhw[2] + ow) * OC;
                        const int in1 = !is_sentinel(p1[o]), in2 = !is_sentinel(p2[o]);
                        for (int c = 1; c < OC; c++) /* a voxel is written whole or not at all */
                            part_bad += (!is_sentinel(p1[o + c])) != in1 || (!is_sentinel(p2[o + c])) != in2;
                        part_bad += in1 + in2 != 1;                             /* exactly once */
                        part_bad += in1 && reads_face(&hxh, dhw, od, oh, ow); /* interior reads no face */
                        interior_n += in1;
                        border_n += in2;
                        total_n++;
                    }
        rc |= FWD(&sb, &y1);
        part_bad += memcmp(y1.data, y.data, (size_t)ts_tensor_numel(&y) * 4) != 0; /* identical to ALL */
#undef FWD
        /* backward as a caller takes it: dw (and db) first with dy's halo in flight, then dx */
        if (cat) {
            rc |= ts_conv3d_cat_backward_split(&a, &bb, &W, &xsp, &dysp, &dy, NULL, NULL, &dw, &dbias);
            rc |= ts_conv3d_cat_backward_split(&a, &bb, &W, &xsp, &dysp, &dy, &da, &db, NULL, NULL);
            box_diff(&db, &vDB, &b, &xd, &xs);
        } else {
            rc |= ts_conv3d_backward_split(&a, &W, &xsp, &dysp, &dy, NULL, &dw, &dbias);
            rc |= ts_conv3d_backward_split(&a, &W, &xsp, &dysp, &dy, &da, NULL, NULL);
        }
        box_diff(&da, &vDA, &b, &xd, &xs);
        halo_free(&hxh);
        halo_free(&hyh);
        ts_tensor *all[] = {&a, &bb, &dy, &y, &y1, &y2, &da, &db};
        for (size_t k = 0; k < sizeof all / sizeof *all; k++) ts_tensor_free(all[k]);
    }
    const double ef = fd / fmax(fs, 1e-30), ex = xd / fmax(xs, 1e-30);
    const double ew = rel_err(dw.data, DW.data, ts_tensor_numel(&DW)), eb = rel_err(dbias.data, Dbias.data, OC);
    const char *err = rc ? ts_err_message() : "";
    ts_ok(rc == 0 && ef < 1e-5, "%s: split forward = whole-volume forward, max rel err %.1e %s", what, ef, err);
    ts_ok(rc == 0 && part_bad == 0 && interior_n + border_n == total_n,
          "%s: INTERIOR (%d voxels) reads no face, BORDER (%d) the rest, each voxel once, INTERIOR+BORDER = ALL bitwise (%d wrong)",
          what, interior_n, border_n, part_bad);
    ts_ok(rc == 0 && ex < 1e-5 && ew < 1e-5 && eb < 1e-5,
          "%s: split backward: dx per box %.1e, dw summed over boxes %.1e, db %.1e", what, ex, ew, eb);
    ts_ok(atomic_load(&hf.calls) > 0 && atomic_load(&hx.calls) > 0 && atomic_load(&hy.calls) > 0 && !atomic_load(&hf.bad) &&
              !atomic_load(&hx.bad) && !atomic_load(&hy.bad),
          "%s: progress hooks called (forward %d, x halo %d, dy halo %d) by the calling thread only, never concurrently", what,
          atomic_load(&hf.calls), atomic_load(&hx.calls), atomic_load(&hy.calls));
    ts_tensor *all[] = {&A, &B, &X, &W, &bias, &Y, &DY, &DA, &DB, &DW, &Dbias, &dw, &dbias};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) ts_tensor_free(all[k]);
}

/* Without a halo the split functions are the plain ones (bitwise); shapes
 * other than 3x3x3 are refused when a halo is given. */
static void test_conv_no_halo(void)
{
    const int N = 2, D = 5, H = 6, Wd = 7, C = 20, OC = 36;
    ts_tensor x = MK(-1, 1, N, D, H, Wd, C), w = MK(-0.3f, 0.3f, OC, C, 3, 3, 3), b = MK(-1, 1, OC), dy = MK(-1, 1, N, D, H, Wd, OC);
    ts_tensor y1 = MK(0, 0, N, D, H, Wd, OC), y2 = MK(0, 0, N, D, H, Wd, OC), dx1 = MK(0, 0, N, D, H, Wd, C), dx2 = MK(0, 0, N, D, H, Wd, C);
    ts_tensor dw1 = MK(0, 0, OC, C, 3, 3, 3), dw2 = MK(0, 0, OC, C, 3, 3, 3), db1 = MK(0, 0, OC), db2 = MK(0, 0, OC);
    int rc = ts_conv3d_forward(&x, &w, &b, 1, 1, &y1);
    rc |= ts_conv3d_backward(&x, &w, 1, 1, &dy, &dx1, &dw1, &db1);
    ts_conv_split nohalo = {NULL, TS_CONV_ALL, NULL, NULL, NULL};
    rc |= ts_conv3d_forward_split(&x, &w, &b, NULL, &y2);
    int same = !memcmp(y1.data, y2.data, (size_t)ts_tensor_numel(&y1) * 4);
    fill_sentinel(&y2);
    rc |= ts_conv3d_forward_split(&x, &w, &b, &nohalo, &y2);
    same &= !memcmp(y1.data, y2.data, (size_t)ts_tensor_numel(&y1) * 4);
    /* no halo: every voxel is interior */
    fill_sentinel(&y2);
    nohalo.part = TS_CONV_INTERIOR;
    rc |= ts_conv3d_forward_split(&x, &w, &b, &nohalo, &y2);
    same &= !memcmp(y1.data, y2.data, (size_t)ts_tensor_numel(&y1) * 4);
    rc |= ts_conv3d_backward_split(&x, &w, NULL, &nohalo, &dy, &dx2, &dw2, &db2);
    same &= !memcmp(dx1.data, dx2.data, (size_t)ts_tensor_numel(&dx1) * 4);
    same &= !memcmp(dw1.data, dw2.data, (size_t)ts_tensor_numel(&dw1) * 4);
    same &= !memcmp(db1.data, db2.data, (size_t)OC * 4);
    ts_ok(rc == 0 && same, "split conv without a halo = ts_conv3d_forward/backward bitwise (s NULL, halo NULL, INTERIOR)");
    /* no halo: k = 1 (padding 1 grows the output) is served like ts_conv3d_forward */
    ts_tensor w1 = MK(-1, 1, OC, C, 1, 1, 1), yk1 = MK(0, 0, N, D + 2, H + 2, Wd + 2, OC), yk2 = MK(0, 0, N, D + 2, H + 2, Wd + 2, OC);
    rc = ts_conv3d_forward(&x, &w1, NULL, 1, 1, &yk1);
    rc |= ts_conv3d_forward_split(&x, &w1, NULL, NULL, &yk2);
    ts_ok(rc == 0 && !memcmp(yk1.data, yk2.data, (size_t)ts_tensor_numel(&yk1) * 4), "split conv without a halo, kernel 1: as ts_conv3d_forward");
    /* a halo with a 1x1x1 kernel, or a bad part / on[] */
    ts_halo h = {{1, 0, 0}, {NULL}, {NULL}};
    ts_conv_split s = {&h, TS_CONV_ALL, NULL, NULL, NULL};
    rc = ts_conv3d_forward_split(&x, &w1, NULL, &s, &yk2);
    int ok = rc == TS_ERR_ARG && strstr(ts_err_message(), "3x3x3");
    rc = ts_conv3d_backward_split(&x, &w1, &s, NULL, &yk2, NULL, NULL, NULL);
    ok &= rc == TS_ERR_ARG && strstr(ts_err_message(), "3x3x3");
    s.part = (ts_conv_part)7;
    ok &= ts_conv3d_forward_split(&x, &w, &b, &s, &y2) == TS_ERR_ARG;
    s.part = TS_CONV_ALL;
    h.on[2] = 2;
    ok &= ts_conv3d_forward_split(&x, &w, &b, &s, &y2) == TS_ERR_ARG;
    ts_ok(ok, "a halo needs 3x3x3 kernels, a valid part and on[d] in {0, 1}: TS_ERR_ARG");
    ts_tensor *all[] = {&x, &w, &b, &dy, &y1, &y2, &dx1, &dx2, &dw1, &dw2, &db1, &db2, &w1, &yk1, &yk2};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) ts_tensor_free(all[k]);
}

/* ------------------------------------------------ ranks as threads: sync */

#define MAXR 8

/* sums n doubles over R threads: each publishes its buffer, all sum in rank
 * order (identical results on every rank), a second barrier before anyone
 * overwrites its buffer */
typedef struct {
    int R;
    pthread_barrier_t bar;
    double *bufs[MAXR];
    int ns[MAXR];
    atomic_int mismatch;
} group_t;

typedef struct {
    group_t *g;
    int r, calls;
} rank_ctx;

static int sum_sync(void *ctx, double *buf, int n, int op)
{
    rank_ctx *rc = ctx;
    group_t *g = rc->g;
    g->bufs[rc->r] = buf;
    g->ns[rc->r] = n;
    rc->calls++;
    pthread_barrier_wait(&g->bar);
    int m = n;
    for (int r = 0; r < g->R; r++)
        if (g->ns[r] != n) {
            atomic_store(&g->mismatch, 1);
            m = g->ns[r] < m ? g->ns[r] : m;
        }
    double *t = xmalloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) t[i] = 0;
    for (int r = 0; r < g->R; r++)
        for (int i = 0; i < m; i++)
            t[i] = op == TS_SYNC_MAX ? (r == 0 || g->bufs[r][i] > t[i] ? g->bufs[r][i] : t[i]) : t[i] + g->bufs[r][i];
    pthread_barrier_wait(&g->bar);
    memcpy(buf, t, sizeof(double) * (size_t)n);
    free(t);
    return atomic_load(&g->mismatch) ? TS_ERR(TS_ERR_MISMATCH, "test sync: ranks sum different counts") : 0;
}

static void group_init(group_t *g, int R)
{
    memset(g, 0, sizeof *g);
    g->R = R;
    atomic_init(&g->mismatch, 0);
    pthread_barrier_init(&g->bar, NULL, (unsigned)R);
}

/* runs fn(args + r * stride) on R threads and joins them */
static void run_ranks(int R, void *(*fn)(void *), void *args, size_t stride)
{
    pthread_t th[MAXR];
    for (int r = 0; r < R; r++)
        if (pthread_create(&th[r], NULL, fn, (char *)args + (size_t)r * stride)) {
            fprintf(stderr, "pthread_create failed\n");
            exit(1);
        }
    for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
}

/* ------------------------------------------------ group and instance norm */

typedef struct {
    rank_ctx rc;
    int groups, relu, nosync;
    const ts_tensor *gamma, *beta;
    ts_tensor x, dy, y, dx, sm, si, dg, db;
    int err;
    char msg[256];
} norm_rank;

static void *norm_rank_run(void *p)
{
    norm_rank *r = p;
    ts_norm_opts o = {.eps = 1e-5f, .groups = r->groups, .relu = r->relu, .sync = r->nosync ? NULL : sum_sync, .sync_ctx = &r->rc};
    r->err = r->groups ? ts_groupnorm_forward(&r->x, r->gamma, r->beta, &o, &r->y, &r->sm, &r->si)
                       : ts_instancenorm_forward(&r->x, r->gamma, r->beta, &o, &r->y, &r->sm, &r->si);
    if (!r->err)
        r->err = r->groups ? ts_groupnorm_backward(&r->x, &r->y, r->gamma, r->beta, &r->sm, &r->si, &o, &r->dy, &r->dx, &r->dg, &r->db)
                           : ts_instancenorm_backward(&r->x, &r->y, r->gamma, r->beta, &r->sm, &r->si, &o, &r->dy, &r->dx, &r->dg, &r->db);
    snprintf(r->msg, sizeof r->msg, "%s", r->err ? ts_err_message() : "");
    return NULL;
}

/* group norm (groups > 0) or instance norm (0) over a volume cut by sp, one
 * rank per box, against the whole volume */
static void test_norm_split(const char *what, int N, const int G[3], const split_t *sp, int C, int groups, int relu)
{
    const int R = nboxes(sp), ns = N * (groups ? groups : C);
    ts_tensor X = MK(-1, 1, N, G[0], G[1], G[2], C), DY = MK(-1, 1, N, G[0], G[1], G[2], C), gamma = MK(0.5f, 1.5f, C),
              beta = MK(-1, 1, C);
    float *px = X.data;
    for (int64_t i = 0; i < ts_tensor_numel(&X); i++) px[i] = 3.0f + 0.5f * px[i] + 0.1f * (float)(i % C); /* mean far from 0 */
    ts_tensor Y = MK(0, 0, N, G[0], G[1], G[2], C), DX = MK(0, 0, N, G[0], G[1], G[2], C), SM = MK(0, 0, ns), SI = MK(0, 0, ns);
    ts_tensor DG = MK(0, 0, C), DB = MK(0, 0, C), dg = MK(0, 0, C), db = MK(0, 0, C);
    norm_rank rk[MAXR];
    group_t grp;
    group_init(&grp, R);
    norm_rank whole = {.groups = groups, .relu = relu, .nosync = 1, .gamma = &gamma, .beta = &beta, .x = X, .dy = DY,
                       .y = Y, .dx = DX, .sm = SM, .si = SI, .dg = DG, .db = DB};
    norm_rank_run(&whole);
    const vol_t vX = {N, {G[0], G[1], G[2]}, (size_t)C * 4, X.data}, vDY = {N, {G[0], G[1], G[2]}, (size_t)C * 4, DY.data};
    const vol_t vY = {N, {G[0], G[1], G[2]}, (size_t)C * 4, Y.data}, vDX = {N, {G[0], G[1], G[2]}, (size_t)C * 4, DX.data};
    for (int r = 0; r < R; r++) {
        const box_t b = box_at(sp, r);
        rk[r] = (norm_rank){.rc = {&grp, r, 0}, .groups = groups, .relu = relu, .gamma = &gamma, .beta = &beta};
        rk[r].x = box_tensor(&vX, &b, C);
        rk[r].dy = box_tensor(&vDY, &b, C);
        rk[r].y = MK(0, 0, N, b.hi[0] - b.lo[0], b.hi[1] - b.lo[1], b.hi[2] - b.lo[2], C);
        rk[r].dx = MK(0, 0, N, b.hi[0] - b.lo[0], b.hi[1] - b.lo[1], b.hi[2] - b.lo[2], C);
        rk[r].sm = MK(0, 0, ns);
        rk[r].si = MK(0, 0, ns);
        rk[r].dg = MK(0, 0, C);
        rk[r].db = MK(0, 0, C);
    }
    run_ranks(R, norm_rank_run, rk, sizeof rk[0]);
    double yd = 0, ys = 0, xd = 0, xs = 0, es = 0;
    int err = whole.err, calls_differ = 0;
    for (int r = 0; r < R; r++) {
        const box_t b = box_at(sp, r);
        err |= rk[r].err;
        box_diff(&rk[r].y, &vY, &b, &yd, &ys);
        box_diff(&rk[r].dx, &vDX, &b, &xd, &xs);
        es = fmax(es, fmax(rel_err(rk[r].sm.data, SM.data, ns), rel_err(rk[r].si.data, SI.data, ns)));
        for (int c = 0; c < C; c++) {
            ((float *)dg.data)[c] += ((float *)rk[r].dg.data)[c];
            ((float *)db.data)[c] += ((float *)rk[r].db.data)[c];
        }
        calls_differ += rk[r].rc.calls != rk[0].rc.calls;
    }
    const double ey = yd / fmax(ys, 1e-30), ex = xd / fmax(xs, 1e-30), eg = rel_err(dg.data, DG.data, C), eb = rel_err(db.data, DB.data, C);
    /* the forward statistics are exact sums (src/nn/norm_impl.h): y and the statistics bitwise the whole volume's */
    ts_ok(!err && ey == 0 && es == 0 && ex < 1e-5 && eg < 1e-5 && eb < 1e-5 && !calls_differ && !atomic_load(&grp.mismatch),
          "%s over %d ranks: y %.1e, statistics %.1e (both bitwise), dx %.1e, dgamma %.1e, dbeta %.1e (summed over ranks); %d syncs per rank %s",
          what, R, ey, es, ex, eg, eb, rk[0].rc.calls, err ? (whole.err ? whole.msg : rk[0].msg) : "");
    /* one rank with a sync: bitwise the results without */
    group_t one;
    group_init(&one, 1);
    norm_rank a = {.rc = {&one, 0, 0}, .groups = groups, .relu = relu, .gamma = &gamma, .beta = &beta, .x = X, .dy = DY,
                   .y = MK(0, 0, N, G[0], G[1], G[2], C), .dx = MK(0, 0, N, G[0], G[1], G[2], C), .sm = MK(0, 0, ns),
                   .si = MK(0, 0, ns), .dg = MK(0, 0, C), .db = MK(0, 0, C)};
    norm_rank_run(&a);
    const int same = !a.err && !memcmp(a.y.data, Y.data, (size_t)ts_tensor_numel(&Y) * 4) &&
                     !memcmp(a.dx.data, DX.data, (size_t)ts_tensor_numel(&DX) * 4) && !memcmp(a.sm.data, SM.data, (size_t)ns * 4) &&
                     !memcmp(a.si.data, SI.data, (size_t)ns * 4) && !memcmp(a.dg.data, DG.data, (size_t)C * 4) &&
                     !memcmp(a.db.data, DB.data, (size_t)C * 4);
    ts_ok(same && a.rc.calls == 3, "%s: a sync over one rank gives bitwise the results without sync (%d syncs)", what, a.rc.calls);
    ts_tensor *fa[] = {&a.y, &a.dx, &a.sm, &a.si, &a.dg, &a.db};
    for (size_t k = 0; k < sizeof fa / sizeof *fa; k++) ts_tensor_free(fa[k]);
    for (int r = 0; r < R; r++) {
        ts_tensor *all[] = {&rk[r].x, &rk[r].dy, &rk[r].y, &rk[r].dx, &rk[r].sm, &rk[r].si, &rk[r].dg, &rk[r].db};
        for (size_t k = 0; k < sizeof all / sizeof *all; k++) ts_tensor_free(all[k]);
    }
    pthread_barrier_destroy(&grp.bar);
    pthread_barrier_destroy(&one.bar);
    ts_tensor *all[] = {&X, &DY, &gamma, &beta, &Y, &DX, &SM, &SI, &DG, &DB, &dg, &db};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) ts_tensor_free(all[k]);
}

/* ---------------------------------------------------------------- losses */

typedef struct {
    rank_ctx rc;
    int dice, nosync;
    const ts_loss_opts *base;
    float scale;
    ts_tensor logits, labels, dl, dl2;
    double loss, loss_f;
    int err[3];
    char msg[3][256];
} loss_rank;

/* forward_backward, forward, backward (each rank makes the same calls) */
static void *loss_rank_run(void *p)
{
    loss_rank *r = p;
    ts_loss_opts o = *r->base;
    o.sync = r->nosync ? NULL : sum_sync;
    o.sync_ctx = &r->rc;
    r->err[0] = r->dice ? ts_dice_forward_backward(&r->logits, &r->labels, &o, r->scale, &r->loss, &r->dl)
                        : ts_softmax_ce_forward_backward(&r->logits, &r->labels, &o, r->scale, &r->loss, &r->dl);
    snprintf(r->msg[0], sizeof r->msg[0], "%s", r->err[0] ? ts_err_message() : "");
    r->err[1] = r->dice ? ts_dice_forward(&r->logits, &r->labels, &o, &r->loss_f)
                        : ts_softmax_ce_forward(&r->logits, &r->labels, &o, &r->loss_f);
    snprintf(r->msg[1], sizeof r->msg[1], "%s", r->err[1] ? ts_err_message() : "");
    r->err[2] = r->dice ? ts_dice_backward(&r->logits, &r->labels, &o, r->scale, &r->dl2)
                        : ts_softmax_ce_backward(&r->logits, &r->labels, &o, r->scale, &r->dl2);
    snprintf(r->msg[2], sizeof r->msg[2], "%s", r->err[2] ? ts_err_message() : "");
    return NULL;
}

/* Cross-entropy (dice 0) or Dice over a volume cut by sp against the whole
 * volume; with bad_rank >= 0 that rank's box holds a label K (not a class):
 * every rank must fail, that one with its own message. */
static void test_loss_split(const char *what, int dice, int N, const int G[3], const split_t *sp, int K,
                            const ts_loss_opts *base, int bad_rank)
{
    const int R = nboxes(sp);
    const float scale = 0.75f;
    ts_tensor L = MK(-3, 3, N, G[0], G[1], G[2], K), DL = MK(0, 0, N, G[0], G[1], G[2], K), LAB;
    ts_tensor_alloc(&LAB, TS_UINT8, 4, (int64_t[]){N, G[0], G[1], G[2]});
    uint8_t *lab = LAB.data;
    for (int64_t i = 0; i < ts_tensor_numel(&LAB); i++) lab[i] = (uint8_t)ts_rng_below(&rng, (uint64_t)K);
    if (bad_rank >= 0) { /* one voxel in the middle of that rank's box */
        const box_t b = box_at(sp, bad_rank);
        const int d = (b.lo[0] + b.hi[0]) / 2, h = (b.lo[1] + b.hi[1]) / 2, w = (b.lo[2] + b.hi[2]) / 2;
        lab[(((size_t)(N - 1) * G[0] + d) * G[1] + h) * G[2] + w] = (uint8_t)K;
    }
    loss_rank whole = {.dice = dice, .nosync = 1, .base = base, .scale = scale, .logits = L, .labels = LAB, .dl = DL,
                       .dl2 = MK(0, 0, N, G[0], G[1], G[2], K)};
    if (bad_rank < 0) loss_rank_run(&whole);
    const vol_t vL = {N, {G[0], G[1], G[2]}, (size_t)K * 4, L.data}, vLAB = {N, {G[0], G[1], G[2]}, 1, LAB.data};
    const vol_t vDL = {N, {G[0], G[1], G[2]}, (size_t)K * 4, DL.data};
    loss_rank rk[MAXR];
    group_t grp;
    group_init(&grp, R);
    for (int r = 0; r < R; r++) {
        const box_t b = box_at(sp, r);
        rk[r] = (loss_rank){.rc = {&grp, r, 0}, .dice = dice, .base = base, .scale = scale};
        rk[r].logits = box_tensor(&vL, &b, K);
        ts_tensor_alloc(&rk[r].labels, TS_UINT8, 4, (int64_t[]){N, b.hi[0] - b.lo[0], b.hi[1] - b.lo[1], b.hi[2] - b.lo[2]});
        box_copy(&vLAB, &b, rk[r].labels.data);
        rk[r].dl = MK(0, 0, N, b.hi[0] - b.lo[0], b.hi[1] - b.lo[1], b.hi[2] - b.lo[2], K);
        rk[r].dl2 = MK(0, 0, N, b.hi[0] - b.lo[0], b.hi[1] - b.lo[1], b.hi[2] - b.lo[2], K);
    }
    run_ranks(R, loss_rank_run, rk, sizeof rk[0]);
    if (bad_rank < 0) {
        double dd = 0, ds = 0, el = 0;
        int err = whole.err[0] | whole.err[1] | whole.err[2], differ = 0;
        for (int r = 0; r < R; r++) {
            const box_t b = box_at(sp, r);
            err |= rk[r].err[0] | rk[r].err[1] | rk[r].err[2];
            box_diff(&rk[r].dl, &vDL, &b, &dd, &ds);
            box_diff(&rk[r].dl2, &vDL, &b, &dd, &ds);
            el = fmax(el, fabs(rk[r].loss - whole.loss) / fabs(whole.loss));
            el = fmax(el, fabs(rk[r].loss_f - whole.loss) / fabs(whole.loss));
            differ += rk[r].loss != rk[0].loss || rk[r].loss_f != rk[0].loss_f;
        }
        const double ed = dd / fmax(ds, 1e-30);
        ts_ok(!err && el < 1e-6 && ed < 1e-5 && !differ && !atomic_load(&grp.mismatch),
              "%s over %d ranks: loss %.7f (whole %.7f, rel %.1e, the same on every rank), dlogits %.1e %s", what, R, rk[0].loss,
              whole.loss, el, ed, err ? rk[0].msg[0] : "");
        /* one rank with a sync: bitwise the results without */
        group_t one;
        group_init(&one, 1);
        loss_rank a = {.rc = {&one, 0, 0}, .dice = dice, .base = base, .scale = scale, .logits = L, .labels = LAB,
                       .dl = MK(0, 0, N, G[0], G[1], G[2], K), .dl2 = MK(0, 0, N, G[0], G[1], G[2], K)};
        loss_rank_run(&a);
        const size_t nb = (size_t)ts_tensor_numel(&L) * 4;
        ts_ok(!(a.err[0] | a.err[1] | a.err[2]) && a.loss == whole.loss && a.loss_f == whole.loss_f &&
                  !memcmp(a.dl.data, DL.data, nb) && !memcmp(a.dl2.data, whole.dl2.data, nb),
              "%s: a sync over one rank gives bitwise the results without sync", what);
        ts_tensor_free(&a.dl);
        ts_tensor_free(&a.dl2);
        pthread_barrier_destroy(&one.bar);
    } else {
        int ok = 1;
        for (int r = 0; r < R; r++)
            for (int c = 0; c < 3; c++) {
                char want[64];
                snprintf(want, sizeof want, "label %d at voxel", K);
                ok &= rk[r].err[c] == TS_ERR_ARG && strstr(rk[r].msg[c], r == bad_rank ? want : "another rank") != NULL;
                if (!ok) {
                    ts_diag("rank %d call %d: error %d: %s", r, c, rk[r].err[c], rk[r].msg[c]);
                    break;
                }
            }
        ts_ok(ok, "%s: a label %d on rank %d of %d: every rank fails with TS_ERR_ARG (that rank: %s; the others: %s)", what, K,
              bad_rank, R, rk[bad_rank].msg[0], rk[(bad_rank + 1) % R].msg[0]);
    }
    for (int r = 0; r < R; r++) {
        ts_tensor *all[] = {&rk[r].logits, &rk[r].labels, &rk[r].dl, &rk[r].dl2};
        for (size_t k = 0; k < sizeof all / sizeof *all; k++) ts_tensor_free(all[k]);
    }
    pthread_barrier_destroy(&grp.bar);
    ts_tensor *all[] = {&L, &DL, &LAB, &whole.dl2};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++) ts_tensor_free(all[k]);
}

int main(void)
{
    alarm(600); /* a rank left waiting in a sync is a failure, not a stuck test */
    ts_rng_init(&rng, 4242, 0, 0);
#ifdef _OPENMP
    if (omp_get_max_threads() < 3) omp_set_num_threads(3); /* more threads than cores: concurrent hooks would show */
#endif
    /* a global volume of 12x10x9 cut into 2x2x3 boxes (odd sizes) */
    const int g1[3] = {12, 10, 9};
    const split_t dhw = {{2, 2, 3}, {{0, 5, 12}, {0, 6, 10}, {0, 3, 5, 9}}};
    const split_t d_only = {{3, 1, 1}, {{0, 4, 5, 12}, {0, 10}, {0, 9}}};
    const split_t dh = {{2, 2, 1}, {{0, 7, 12}, {0, 3, 10}, {0, 9}}};
    test_conv_split("conv 3->5, N=1, 12x10x9 in 2x2x3 boxes (D, H, W)", 1, g1, &dhw, 3, 0, 5, 0);
    test_conv_split("conv 16->16, N=2, 12x10x9 in 3 boxes along D (one of 1 plane)", 2, g1, &d_only, 16, 0, 16, 0);
    test_conv_split("conv 20->36, N=2, 12x10x9 in 2x2 boxes (D, H)", 2, g1, &dh, 20, 0, 36, 0);
    test_conv_split("conv 20->36, N=1, 12x10x9 in 2x2x3 boxes, zero faces at the border", 1, g1, &dhw, 20, 0, 36, 1);
    /* boxes with several row blocks (interior items along H) */
    const int g2[3] = {16, 20, 12};
    const split_t dh2 = {{2, 2, 1}, {{0, 8, 16}, {0, 10, 20}, {0, 12}}};
    test_conv_split("conv 16->16, N=2, 16x20x12 in 2x2 boxes (D, H)", 2, g2, &dh2, 16, 0, 16, 0);
    const split_t w1 = {{1, 2, 3}, {{0, 16}, {0, 9, 20}, {0, 1, 4, 12}}};
    test_conv_split("conv 3->5, N=1, 16x20x12 in 1x2x3 boxes (H, W; a box 1 column wide)", 1, g2, &w1, 3, 0, 5, 0);
    /* over a concatenation: faces hold a's then b's channels */
    test_conv_split("conv over [a 4, b 12] -> 16, N=2, 12x10x9 in 2x2x3 boxes", 2, g1, &dhw, 4, 12, 16, 0);
    test_conv_split("conv over [a 3, b 5] -> 20, N=1, 12x10x9 in 2x2 boxes (D, H)", 1, g1, &dh, 3, 5, 20, 0);
    test_conv_split("conv over [a 16, b 16] -> 16, N=1, 12x10x9 in 3 boxes along D", 1, g1, &d_only, 16, 16, 16, 0);
    test_conv_no_halo();
    /* the same in bf16 (split and whole volume both bf16: the same rounded
     * operands, only the summation differs), in each bf16 variant */
    const char *isas[3] = {"emulated", "avx512bf16", "amx"};
    for (int v = 0; v < 3; v++) {
        if (ts_nn_bf16_select_isa(isas[v])) {
            ts_diag("no %s here (CPU, build or kernel): its bf16 split convolutions are not tested",
                    v == 1 ? "AVX512-BF16" : "AMX-BF16");
            continue;
        }
        char what[160];
        ts_nn_set_conv_precision(TS_PREC_BF16);
        snprintf(what, sizeof what, "bf16 (%s) conv 3->5, N=1, 12x10x9 in 2x2x3 boxes (D, H, W)", isas[v]);
        test_conv_split(what, 1, g1, &dhw, 3, 0, 5, 0);
        snprintf(what, sizeof what, "bf16 (%s) conv 16->16, N=2, 16x20x12 in 2x2 boxes (D, H)", isas[v]);
        test_conv_split(what, 2, g2, &dh2, 16, 0, 16, 0);
        snprintf(what, sizeof what, "bf16 (%s) conv 20->36, N=1, 12x10x9 in 2x2x3 boxes, zero faces at the border", isas[v]);
        test_conv_split(what, 1, g1, &dhw, 20, 0, 36, 1);
        snprintf(what, sizeof what, "bf16 (%s) conv 3->5, N=1, 16x20x12 in 1x2x3 boxes (H, W; a box 1 column wide)", isas[v]);
        test_conv_split(what, 1, g2, &w1, 3, 0, 5, 0);
        snprintf(what, sizeof what, "bf16 (%s) conv over [a 4, b 12] -> 16, N=2, 12x10x9 in 2x2x3 boxes", isas[v]);
        test_conv_split(what, 2, g1, &dhw, 4, 12, 16, 0);
        snprintf(what, sizeof what, "bf16 (%s) conv over [a 3, b 5] -> 20, N=1, 12x10x9 in 2x2 boxes (D, H)", isas[v]);
        test_conv_split(what, 1, g1, &dh, 3, 5, 20, 0);
        snprintf(what, sizeof what, "bf16 (%s) conv over [a 16, b 16] -> 16, N=1, 12x10x9 in 3 boxes along D", isas[v]);
        test_conv_split(what, 1, g1, &d_only, 16, 16, 16, 0);
        ts_nn_set_conv_precision(TS_PREC_FP32);
    }
    ts_nn_bf16_select_isa("auto");
    /* fp16: halo faces rounded like the box's own values */
    ts_nn_set_conv_precision(TS_PREC_FP16);
    test_conv_split("fp16 conv 3->5, N=1, 12x10x9 in 2x2x3 boxes (D, H, W)", 1, g1, &dhw, 3, 0, 5, 0);
    test_conv_split("fp16 conv 16->16, N=2, 16x20x12 in 2x2 boxes (D, H)", 2, g2, &dh2, 16, 0, 16, 0);
    test_conv_split("fp16 conv over [a 4, b 12] -> 16, N=2, 12x10x9 in 2x2x3 boxes", 2, g1, &dhw, 4, 12, 16, 0);
    test_conv_split("fp16 conv 20->36, N=1, 12x10x9 in 2x2x3 boxes, zero faces at the border", 1, g1, &dhw, 20, 0, 36, 1);
    ts_nn_set_conv_precision(TS_PREC_FP32);
    /* norms: 6 ranks (2x3 boxes), 3 ranks along D, 4 ranks along D, H and W */
    const int gn[3] = {6, 7, 5};
    const split_t n6 = {{2, 3, 1}, {{0, 2, 6}, {0, 2, 3, 7}, {0, 5}}};
    const split_t n3 = {{3, 1, 1}, {{0, 1, 3, 6}, {0, 7}, {0, 5}}};
    const split_t n4 = {{2, 1, 2}, {{0, 3, 6}, {0, 7}, {0, 2, 5}}};
    test_norm_split("group norm (3 groups of 2 channels), N=2", 2, gn, &n6, 6, 3, 0);
    test_norm_split("group norm (2 groups of 10 channels) with fused ReLU, N=1", 1, gn, &n3, 20, 2, 1);
    test_norm_split("instance norm, N=2", 2, gn, &n4, 5, 0, 0);
    test_norm_split("instance norm with fused ReLU, N=1", 1, gn, &n6, 16, 0, 1);
    /* losses */
    const float cw[4] = {0.5f, 1.0f, 2.0f, 1.5f};
    const ts_loss_opts plain = {-1, NULL, 1e-5f, NULL, NULL}, weighted = {2, cw, 1e-5f, NULL, NULL};
    test_loss_split("cross-entropy", 0, 2, gn, &n6, 4, &plain, -1);
    test_loss_split("cross-entropy (class weights, ignore 2)", 0, 1, gn, &n4, 4, &weighted, -1);
    test_loss_split("soft dice", 1, 2, gn, &n6, 4, &plain, -1);
    test_loss_split("soft dice (ignore 2)", 1, 2, gn, &n3, 3, &weighted, -1);
    test_loss_split("cross-entropy", 0, 2, gn, &n6, 4, &plain, 4);
    test_loss_split("soft dice", 1, 2, gn, &n4, 4, &weighted, 1);
    return ts_done();
}
