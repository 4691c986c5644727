/* The UNet3D's activation buffers (memory plan in unet_impl.h): per slot the
 * tensors of the stage's units and those it receives, the recompute scratch
 * of checkpointed levels, a split's halos and the backward's gradient
 * buffers (in device memory on the GPU engine, with its host staging);
 * freeing them, and their bytes (a dry run counts them for
 * ts_unet_plan_bytes). It runs no layer and touches no parameter. */
#include "tsbuild.h"
#include "src/model/unet_impl.h"
#include "src/core/device.h"

#include <stdlib.h>
#include <string.h>

static void halo_free(ts_halo *h)
{
    for (int d = 0; d < 3; d++) {
        free(h->lo[d]);
        free(h->hi[d]);
    }
    memset(h, 0, sizeof *h);
}

/* face buffers (zeroed) where the split has neighbours, for a box of n x dhw with C channels */
static int halo_alloc(ts_unet *m, ts_halo *h, int64_t n, const int64_t dhw[3], int C)
{
    if (!m->split_on) return 0;
    if (!m->dry) {
        memset(h, 0, sizeof *h);
        memcpy(h->on, m->split.on, sizeof h->on);
    }
    for (int d = 0; d < 3; d++)
        for (int side = 0; side < 2; side++) {
            if (!m->split.nbr[d][side]) continue;
            const size_t floats = (size_t)ts_halo_face_floats(dhw, m->split.on, d, n, C);
            if (m->dry) {
                m->dry_bytes += floats * sizeof(float);
                continue;
            }
            float *f = TS_CALLOC(floats ? floats : 1, sizeof(float));
            if (!f) return TS_ERR(TS_ERR_NOMEM, "halo faces");
            if (side) h->hi[d] = f;
            else h->lo[d] = f;
            m->halo_bytes += floats * sizeof(float);
        }
    return 0;
}

static void bacts_free(bacts *b)
{
    for (int i = 0; i < 2; i++) {
        ts_tensor_free(&b->y[i]);
        ts_tensor_free(&b->a[i]);
        ts_tensor_free(&b->smean[i]);
        ts_tensor_free(&b->sinv[i]);
        halo_free(&b->xh[i]);
    }
}

static void cacts_free(cacts *c)
{
    ts_tensor_free(&c->y);
    ts_tensor_free(&c->a);
    ts_tensor_free(&c->smean);
    ts_tensor_free(&c->sinv);
    halo_free(&c->xh);
}

void ts_unet_free_acts(ts_unet *m)
{
    for (int k = 0; m->slots && k < m->nslots; k++) {
        slot *s = &m->slots[k];
        ts_tensor_free(&s->x);
        ts_tensor_free(&s->logits);
        ts_tensor_free(&s->dlogits);
        for (int l = 0; l < L_MAX; l++) {
            ts_tensor_free(&s->pool[l]);
            ts_tensor_free(&s->pidx[l]);
            ts_tensor_free(&s->up[l]);
            bacts_free(&s->enc[l]);
            bacts_free(&s->dec[l]);
            for (int j = 0; j < TS_UNET_MAX_RES_BLOCKS; j++) {
                cacts_free(&s->rb[l][j].c1);
                cacts_free(&s->rb[l][j].c2);
                cacts_free(&s->rb[l][j].sk);
            }
            ts_tensor_free(&s->dsl[l]);
            ts_tensor_free(&s->dsd[l]);
            ts_tensor_free(&s->dslab[l]);
        }
        ts_tensor_free(&s->lab);
        cacts_free(&s->stem);
        for (int t = 0; t < 5 * L_MAX; t++) ts_tensor_free(&s->rx[t]);
    }
    free(m->slots);
    m->slots = NULL;
    for (int l = 0; l < L_MAX; l++) {
        halo_free(&m->gh[l]);
        ts_tensor_free(&m->gin[l]);
        ts_tensor_free(&m->dskip[l]);
        ts_tensor_free(&m->rg[l]);
    }
    ts_tensor_free(&m->sx);
    ts_tensor_free(&m->sy);
    for (int r = 0; r < RS_N; r++) ts_tensor_free(&m->rs[r]);
    ts_tensor_free(&m->rsidx);
    if (m->hx.data) ts_device_upload_wait(); /* no copy still reads the staging buffers (an error: reported there) */
    ts_tensor_free(&m->hx);
    ts_tensor_free(&m->hlab);
    ts_tensor_free(&m->hlab0);
    ts_tensor_free(&m->hlogits);
    ts_tensor_free(&m->dpack);
    ts_tensor_free(&m->hpack);
    m->halo_bytes = 0;
    m->n = 0;
}

/* allocates t (in device memory on the GPU engine), or with m->dry only counts its bytes */
static int talloc(ts_unet *m, ts_tensor *t, ts_dtype dt, int nd, const int64_t *shape)
{
    if (!m->dry) return m->device ? ts_tensor_alloc_device(t, dt, nd, shape) : ts_tensor_alloc(t, dt, nd, shape);
    size_t b = ts_dtype_size(dt);
    for (int i = 0; i < nd; i++) b *= (size_t)shape[i];
    m->dry_bytes += b;
    return 0;
}

static int alloc5(ts_unet *m, ts_tensor *t, ts_dtype dt, int64_t n, int64_t d, int64_t h, int64_t w, int64_t c)
{
    return talloc(m, t, dt, 5, (const int64_t[]){n, d, h, w, c});
}

/* t as a view of recompute buffer r (RS_*, or RS_N: the pool indices), or
 * allocated when the level is not checkpointed; the scratch is counted once
 * (alloc_scratch) */
static int alloc_or_view(ts_unet *m, int view, int r, ts_tensor *t, ts_dtype dt, int64_t n, int64_t d, int64_t h,
                         int64_t w, int64_t c)
{
    if (!view) return alloc5(m, t, dt, n, d, h, w, c);
    if (!m->dry) {
        *t = ts_tensor_view(r < RS_N ? m->rs[r].data : m->rsidx.data, dt, 5, (const int64_t[]){n, d, h, w, c});
        t->device = m->device;
    }
    return 0;
}

/* The recompute scratch of the checkpointed levels whose units this stage
 * holds, as large as the largest level needs: RS_IN the pool output (enc
 * l > 0), up{l}'s output (dec l) or the second conv's output; RS_Y0 the
 * first conv's output; RS_A0 the first norm's (unless it leaves the stage);
 * the pool indices. */
static int alloc_scratch(ts_unet *m, int64_t n, int64_t d, int64_t h, int64_t w)
{
    const ts_unet_cfg *c = &m->cfg;
    const int L = c->levels;
    int64_t need[RS_N] = {0}, nidx = 0;
#define NEED(k, v) (k) = (k) > (v) ? (k) : (v)
    for (int l = 0; l < L; l++) {
        if (!ck(m, l)) continue;
        const int64_t v = n * (d >> l) * (h >> l) * (w >> l), cl = c->channels[l];
        if (resenc(m)) /* a block of the level: its conv outputs, first norm's, skip's (the stem is kept) */
            for (int j = 0; j < c->res_blocks[l]; j++) {
                if (!here(m, U_RB(m, l, j))) continue;
                NEED(need[RS_Y0], cl * v);
                NEED(need[RS_A0], cl * v);
                NEED(need[RS_Y1], cl * v);
                if (m->rb[l][j].skip) {
                    NEED(need[RS_SY], cl * v);
                    NEED(need[RS_SA], cl * v);
                }
            }
        for (int enc = resenc(m) ? 0 : 1; enc >= 0; enc--) {
            if (!enc && l == L - 1) break; /* the bottom level has no decoder block */
            const int u0 = enc ? U_E(m, l, 0) : U_D(m, l, 0);
            const int64_t cin = enc ? (l ? c->channels[l - 1] : 0) : cl; /* the image stays in the slot */
            if (here(m, u0)) {
                NEED(need[RS_IN], cin * v);
                NEED(need[RS_Y0], cl * v);
                if (here(m, u0 + 1)) NEED(need[RS_A0], cl * v);
                if (enc && l) NEED(nidx, cin * v);
            }
            if (here(m, u0 + 1)) NEED(need[RS_IN], cl * v);
        }
    }
#undef NEED
    for (int r = 0; r < RS_N; r++)
        if (need[r]) TS_TRY(talloc(m, &m->rs[r], TS_FLOAT32, 1, &need[r]));
    if (nidx) TS_TRY(talloc(m, &m->rsidx, TS_UINT8, 1, &nidx));
    return 0;
}

/* the activations of conv i of a block (its output y, the norm's a, the saved statistics, the input's halo); on
 * a checkpointed level y and the first norm's a (if it stays on the stage) are views of the recompute scratch */
static int alloc_half(ts_unet *m, const block *b, bacts *x, int i, int64_t n, int64_t d, int64_t h, int64_t w)
{
    const int64_t ns = m->cfg.norm == TS_NORM_BATCH ? b->cout : m->cfg.norm == TS_NORM_GROUP ? n * m->cfg.groups : n * b->cout;
    const int64_t dhw[3] = {d, h, w};
    const int c = ck(m, b->level);
    {
        TS_TRY(alloc_or_view(m, c, i ? RS_IN : RS_Y0, &x->y[i], TS_FLOAT32, n, d, h, w, b->cout));
        TS_TRY(alloc_or_view(m, c && i == 0 && here(m, U_B(m, b, 1)), RS_A0, &x->a[i], TS_FLOAT32, n, d, h, w, b->cout));
        TS_TRY(talloc(m, &x->smean[i], TS_FLOAT32, 1, &ns));
        TS_TRY(talloc(m, &x->sinv[i], TS_FLOAT32, 1, &ns));
        TS_TRY(halo_alloc(m, &x->xh[i], n, dhw, i ? b->cout : b->cin));
    }
    return 0;
}

/* a cnorm's activations for an output of n x d x h x w (and a 3x3x3 conv's input halo on a split); y and a
 * are views of recompute scratch ry and ra where those are >= 0 (a checkpointed level) */
static int alloc_cacts(ts_unet *m, const cnorm *p, cacts *x, int64_t n, int64_t d, int64_t h, int64_t w, int ry,
                       int ra)
{
    const int64_t ns = m->cfg.norm == TS_NORM_BATCH ? p->cout : m->cfg.norm == TS_NORM_GROUP ? n * m->cfg.groups : n * p->cout;
    const int64_t s = p->stride, in[3] = {d * s, h * s, w * s};
    if (p->k == 3) TS_TRY(halo_alloc(m, &x->xh, n, in, p->cin));
    TS_TRY(alloc_or_view(m, ry >= 0, ry, &x->y, TS_FLOAT32, n, d, h, w, p->cout));
    TS_TRY(alloc_or_view(m, ra >= 0, ra, &x->a, TS_FLOAT32, n, d, h, w, p->cout));
    TS_TRY(talloc(m, &x->smean, TS_FLOAT32, 1, &ns));
    return talloc(m, &x->sinv, TS_FLOAT32, 1, &ns);
}

/* the residual encoder's activations in a slot: the stem and the blocks of the stage's units */
static int alloc_resenc(ts_unet *m, slot *s, int64_t n, int64_t d, int64_t h, int64_t w)
{
    const ts_unet_cfg *c = &m->cfg;
    if (here(m, U_E(m, 0, 0))) {
        TS_TRY(alloc5(m, &s->x, TS_FLOAT32, n, d, h, w, c->in_channels));
        TS_TRY(alloc_cacts(m, &m->stem, &s->stem, n, d, h, w, -1, -1)); /* kept, checkpointed or not */
    }
    for (int l = 0; l < c->levels; l++)
        for (int j = 0; j < c->res_blocks[l]; j++) {
            const rblock *r = &m->rb[l][j];
            if (!here(m, U_RB(m, l, j))) continue;
            racts *x = &s->rb[l][j];
            const int k = ck(m, l); /* checkpointed: only the block's output c2.a (and statistics, halos) kept */
            TS_TRY(alloc_cacts(m, &r->c1, &x->c1, n, d >> l, h >> l, w >> l, k ? RS_Y0 : -1, k ? RS_A0 : -1));
            TS_TRY(alloc_cacts(m, &r->c2, &x->c2, n, d >> l, h >> l, w >> l, k ? RS_Y1 : -1, -1));
            if (r->skip)
                TS_TRY(alloc_cacts(m, &r->sk, &x->sk, n, d >> l, h >> l, w >> l, k ? RS_SY : -1, k ? RS_SA : -1));
        }
    return 0;
}

/* On a split, the scratch of the residual encoder's strided 3x3x3 convs
 * (shared by the levels and the slots): sx, a level l-1 input with one
 * more voxel along each dim ([N, D+1, H+1, W+1, C]: the low halo in front
 * in forward and the weight gradient; the input gradient's box and its
 * upper halo in backward), sy, a level l output gradient with its upper
 * halo voxel ([N, D/2+1, ...]). */
static int alloc_strided(ts_unet *m, int64_t n, int64_t d, int64_t h, int64_t w)
{
    int64_t nx = 0, ny = 0;
    for (int l = 1; l < m->cfg.levels; l++) {
        const int64_t a = n * ((d >> (l - 1)) + 1) * ((h >> (l - 1)) + 1) * ((w >> (l - 1)) + 1) * m->cfg.channels[l - 1];
        const int64_t b = n * ((d >> l) + 1) * ((h >> l) + 1) * ((w >> l) + 1) * m->cfg.channels[l];
        if (a > nx) nx = a;
        if (b > ny) ny = b;
    }
    if (nx) TS_TRY(talloc(m, &m->sx, TS_FLOAT32, 1, &nx));
    if (ny) TS_TRY(talloc(m, &m->sy, TS_FLOAT32, 1, &ny));
    return 0;
}

/* one slot: the activations of the stage's units and the tensors it receives */
static int alloc_slot(ts_unet *m, slot *s, int64_t n, int64_t d, int64_t h, int64_t w)
{
    const ts_unet_cfg *c = &m->cfg;
    const int L = c->levels;
    if (resenc(m)) TS_TRY(alloc_resenc(m, s, n, d, h, w));
    for (int l = 0; l < L; l++) {
        const int64_t dl = d >> l, hl = h >> l, wl = w >> l;
        if (m->dsw[l] >= 0) { /* deep supervision: logits (ds{l}'s stage), their gradient, the labels (the head's) */
            if (here(m, U_D(m, l, 1))) TS_TRY(alloc5(m, &s->dsl[l], TS_FLOAT32, n, dl, hl, wl, c->classes));
            if (here(m, U_D(m, l, 1)) || here(m, U_H(m)))
                TS_TRY(alloc5(m, &s->dsd[l], TS_FLOAT32, n, dl, hl, wl, c->classes));
            if (here(m, U_H(m))) TS_TRY(talloc(m, &s->dslab[l], TS_UINT8, 4, (const int64_t[]){n, dl, hl, wl}));
        }
        if (resenc(m)) { /* the encoder is allocated above */
        } else if (here(m, U_E(m, l, 0))) {
            if (l == 0) TS_TRY(alloc5(m, &s->x, TS_FLOAT32, n, d, h, w, c->in_channels));
            else {
                TS_TRY(alloc_or_view(m, ck(m, l), RS_IN, &s->pool[l], TS_FLOAT32, n, dl, hl, wl, c->channels[l - 1]));
                TS_TRY(alloc_or_view(m, ck(m, l), RS_N, &s->pidx[l], TS_UINT8, n, dl, hl, wl, c->channels[l - 1]));
            }
        }
        for (int i = 0; i < 2 && !resenc(m); i++)
            if (here(m, U_E(m, l, i))) TS_TRY(alloc_half(m, &m->enc[l], &s->enc[l], i, n, dl, hl, wl));
        if (l < L - 1) {
            if (here(m, U_D(m, l, 0)))
                TS_TRY(alloc_or_view(m, ck(m, l), RS_IN, &s->up[l], TS_FLOAT32, n, dl, hl, wl, c->channels[l]));
            for (int i = 0; i < 2; i++)
                if (here(m, U_D(m, l, i))) TS_TRY(alloc_half(m, &m->dec[l], &s->dec[l], i, n, dl, hl, wl));
        }
    }
    if (here(m, U_H(m))) {
        TS_TRY(alloc5(m, &s->logits, TS_FLOAT32, n, d, h, w, c->classes));
        TS_TRY(alloc5(m, &s->dlogits, TS_FLOAT32, n, d, h, w, c->classes));
        if (m->device) TS_TRY(talloc(m, &s->lab, TS_UINT8, 4, (const int64_t[]){n, d, h, w}));
    }
    /* tensors made on another stage and used here (once each, whatever the edges) */
    ts_unet_edge e[TS_UNET_MAX_EDGES];
    int got[5 * L_MAX] = {0};
    for (int i = 0, ne = ts_unet_edges(m, e); i < ne; i++) {
        if (here(m, e[i].producer) || !here(m, e[i].consumer) || got[e[i].tensor]++) continue;
        const int l = tensor_level(m, e[i].tensor);
        TS_TRY(alloc5(m, &s->rx[e[i].tensor], TS_FLOAT32, n, d >> l, h >> l, w >> l,
                      e[i].kind == TS_EDGE_DS ? c->classes : c->channels[l]));
    }
    return 0;
}

int ts_unet_setup(ts_unet *m, int n, int d, int h, int w)
{
    int err = 0;
    if (m->dry) {
        m->dry_bytes = 0;
    } else {
        if (m->slots && m->n == n && m->d == d && m->h == h && m->w == w) return 0;
        ts_unet_free_acts(m);
    }
    const ts_unet_cfg *c = &m->cfg;
    const int L = c->levels;
    TS_CHECK(ts_unet_check_input(c, (const int64_t[]){d, h, w}, "input"));
    if (n < 1) TS_FAIL(TS_ERR_ARG, "unet: batch of %d samples", n);
    if (!m->dry) {
        m->slots = TS_CALLOC((size_t)m->nslots, sizeof *m->slots);
        if (!m->slots) TS_FAIL(TS_ERR_NOMEM, "unet slots");
    }
    TS_CHECK(alloc_scratch(m, n, d, h, w)); /* before the slots, whose views point into it */
    for (int k = 0; k < m->nslots; k++) {
        slot dummy;
        TS_CHECK(alloc_slot(m, m->dry ? &dummy : &m->slots[k], n, d, h, w));
    }
    /* backward scratch: the gradient buffers of the levels this stage touches */
    for (int l = 0; l < L; l++) {
        const int64_t dl = d >> l, hl = h >> l, wl = w >> l;
        const int e = here(m, U_E(m, l, 0)) || here(m, U_E(m, l, 1)),
                  dd = l < L - 1 && (here(m, U_D(m, l, 0)) || here(m, U_D(m, l, 1)));
        const int next = l + 1 < L && here(m, U_NEXT(m, l)); /* consumes enc l's output along the encoder */
        const int gin = e || dd || next || (l > 0 && here(m, U_D(m, l - 1, 0))) || (l == 0 && here(m, U_H(m)));
        if (gin) TS_CHECK(alloc5(m, &m->gin[l], TS_FLOAT32, n, dl, hl, wl, c->channels[l]));
        const int ds = m->dsw[l] >= 0 && here(m, U_D(m, l, 1)); /* the ds{l} head's input gradient passes there */
        if (l < L - 1 && (here(m, U_E(m, l, 1)) || here(m, U_D(m, l, 0)) || ds))
            TS_CHECK(alloc5(m, &m->dskip[l], TS_FLOAT32, n, dl, hl, wl, c->channels[l]));
        if (e || dd) TS_CHECK(halo_alloc(m, &m->gh[l], n, (const int64_t[]){dl, hl, wl}, c->channels[l]));
        if (resenc(m) && (e || next)) TS_CHECK(alloc5(m, &m->rg[l], TS_FLOAT32, n, dl, hl, wl, c->channels[l]));
    }
    if (resenc(m) && m->split_on && !m->device) /* the GPU pads its boxes in its scratch (conv_split.c) */
        TS_CHECK(alloc_strided(m, n, d, h, w));
    if (m->dry) return 0;
    if (m->device) { /* page-locked host staging of the image, the labels (and downsampled: level 1 is the largest) and
                      * the logits: copied up without stalling the stream (ts_tensor_upload_async) */
        TS_CHECK(ts_tensor_alloc_pinned(&m->hx, TS_FLOAT32, 5, (const int64_t[]){n, d, h, w, c->in_channels}));
        TS_CHECK(ts_tensor_alloc_pinned(&m->hlogits, TS_FLOAT32, 5, (const int64_t[]){n, d, h, w, c->classes}));
        TS_CHECK(ts_tensor_alloc_pinned(&m->hlab0, TS_UINT8, 4, (const int64_t[]){n, d, h, w}));
        if (c->deep_supervision)
            TS_CHECK(ts_tensor_alloc_pinned(&m->hlab, TS_UINT8, 4, (const int64_t[]){n, d >> 1, h >> 1, w >> 1}));
    }
    m->n = n;
    m->d = d;
    m->h = h;
    m->w = w;
    return 0;
cleanup:
    if (!m->dry) ts_unet_free_acts(m);
    return err;
}

int ts_unet_plan_bytes(ts_unet *m, int n, int d, int h, int w, size_t *bytes)
{
    m->dry = 1;
    int err = ts_unet_setup(m, n, d, h, w);
    m->dry = 0;
    *bytes = m->dry_bytes;
    return err;
}

int ts_unet_plan_bytes_split(ts_unet *m, const ts_unet_split *split, int n, int d, int h, int w, size_t *bytes)
{
    /* the dry run reads only the split's dims and neighbours: swap them in, not the buffers */
    const ts_unet_split keep = m->split;
    const int keep_on = m->split_on;
    m->split_on = split != NULL;
    if (split) m->split = *split;
    int err = ts_unet_plan_bytes(m, n, d, h, w, bytes);
    m->split = keep;
    m->split_on = keep_on;
    return err;
}

/* bytes t owns (views of the recompute scratch count there) */
static size_t own(const ts_tensor *t) { return t->owns ? ts_tensor_bytes(t) : 0; }

static size_t bacts_bytes(const bacts *b)
{
    size_t s = 0;
    for (int i = 0; i < 2; i++) s += own(&b->y[i]) + own(&b->a[i]) + own(&b->smean[i]) + own(&b->sinv[i]);
    return s;
}

static size_t cacts_bytes(const cacts *c) { return own(&c->y) + own(&c->a) + own(&c->smean) + own(&c->sinv); }

static size_t one_slot_bytes(const slot *x)
{
    size_t s = own(&x->x) + own(&x->logits) + own(&x->dlogits) + own(&x->lab) + cacts_bytes(&x->stem);
    for (int l = 0; l < L_MAX; l++) {
        s += own(&x->pool[l]) + own(&x->pidx[l]) + own(&x->up[l]) + bacts_bytes(&x->enc[l]) + bacts_bytes(&x->dec[l]);
        s += own(&x->dsl[l]) + own(&x->dsd[l]) + own(&x->dslab[l]);
        for (int j = 0; j < TS_UNET_MAX_RES_BLOCKS; j++)
            s += cacts_bytes(&x->rb[l][j].c1) + cacts_bytes(&x->rb[l][j].c2) + cacts_bytes(&x->rb[l][j].sk);
    }
    for (int t = 0; t < 5 * L_MAX; t++) s += own(&x->rx[t]);
    return s;
}

size_t ts_unet_slot_bytes(const ts_unet *m) { return m->slots ? one_slot_bytes(&m->slots[0]) : 0; }

size_t ts_unet_recompute_bytes(const ts_unet *m)
{
    size_t s = own(&m->rsidx);
    for (int r = 0; r < RS_N; r++) s += own(&m->rs[r]);
    return s;
}

size_t ts_unet_activation_bytes(const ts_unet *m)
{
    size_t s = m->halo_bytes + ts_unet_recompute_bytes(m) + own(&m->sx) + own(&m->sy);
    for (int k = 0; m->slots && k < m->nslots; k++) s += one_slot_bytes(&m->slots[k]);
    for (int l = 0; l < L_MAX; l++) s += own(&m->gin[l]) + own(&m->dskip[l]) + own(&m->rg[l]);
    return s;
}
