/* The UNet3D: parameter table, initialisation, activation buffers and the
 * forward/backward order (see unet.h). Memory plan per level l (c_l
 * channels): each conv block keeps its conv outputs y[0..1] (norm inputs)
 * and activations a[0..1]; the decoder keeps the upsampled tensor (its first
 * conv reads [upsampled, skip] without forming the concatenation). Backward
 * reuses the forward buffers for gradients where the
 * forward values are no longer needed (a norm's input gradient overwrites
 * its input y, a conv's input gradient overwrites its input after the
 * weight gradient is taken), plus per level one incoming-gradient buffer
 * gin[l] and the skip gradient dskip[l]. */
#include "tsbuild.h"
#include "src/model/unet.h"
#include "src/core/error.h"
#include "src/core/rng.h"
#include "src/core/timer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define L_MAX TS_UNET_MAX_LEVELS

typedef struct block {
    int cw[2], cb[2], nw[2], nb[2], rm[2], rv[2], nbt[2]; /* arena indices, -1 if absent */
    int cin, cout, level;
    ts_tensor y[2], a[2], smean[2], sinv[2];
    ts_halo xh[2]; /* split: conv i's input halo (kept for its weight gradient) */
} block;

struct ts_unet {
    ts_unet_cfg cfg;
    ts_arena *arena;
    float *init_bound; /* per arena entry: > 0 uniform bound, 0 zeros, -1 ones */
    block enc[L_MAX], dec[L_MAX];
    int upw[L_MAX], upb[L_MAX], headw, headb;
    int n, d, h, w; /* set-up shape (n = 0: none) */
    ts_tensor x, pool[L_MAX], pidx[L_MAX], up[L_MAX], logits, dlogits, gin[L_MAX], dskip[L_MAX];
    int train_forward; /* last forward was in train mode */
    int have_dlogits;
    double prof[TS_PROF_COUNT];
    void (*grad_hook)(void *ctx, int param); /* told when a parameter's gradient is final */
    void *grad_ctx;
    int (*norm_sync)(void *ctx, double *buf, int n); /* synchronised batch norm */
    void *norm_ctx;
    int split_on;        /* a spatial split is set */
    ts_unet_split split;
    ts_halo gh[L_MAX];   /* split: a conv output gradient's halo per level (channels[l]) */
    size_t halo_bytes;
    float loss_scale;
    int dry;           /* setup only counts bytes (ts_unet_plan_bytes) */
    size_t dry_bytes;
};

void ts_unet_set_grad_hook(ts_unet *m, void (*fn)(void *ctx, int param), void *ctx)
{
    m->grad_hook = fn;
    m->grad_ctx = ctx;
}

void ts_unet_set_norm_sync(ts_unet *m, int (*fn)(void *ctx, double *buf, int n), void *ctx)
{
    m->norm_sync = fn;
    m->norm_ctx = ctx;
}

static void free_acts(ts_unet *m);

static int same_split(const ts_unet_split *a, const ts_unet_split *b)
{
    for (int d = 0; d < 3; d++)
        if (a->on[d] != b->on[d] || a->nbr[d][0] != b->nbr[d][0] || a->nbr[d][1] != b->nbr[d][1]) return 0;
    return a->halo_start == b->halo_start && a->halo_progress == b->halo_progress && a->halo_wait == b->halo_wait &&
           a->sum == b->sum && a->ctx == b->ctx;
}

void ts_unet_set_split(ts_unet *m, const ts_unet_split *s)
{
    if ((s != NULL) == m->split_on && (!s || same_split(s, &m->split))) return; /* unchanged: keep the buffers */
    free_acts(m);
    m->split_on = s != NULL;
    if (s) m->split = *s;
    else memset(&m->split, 0, sizeof m->split);
}

void ts_unet_set_loss_scale(ts_unet *m, float f) { m->loss_scale = f; }
size_t ts_unet_halo_bytes(const ts_unet *m) { return m->halo_bytes; }

/* tells the hook that the gradients of arena entries a and b are final */
static void ready2(const ts_unet *m, int a, int b)
{
    if (!m->grad_hook) return;
    if (a >= 0) m->grad_hook(m->grad_ctx, a);
    if (b >= 0) m->grad_hook(m->grad_ctx, b);
}

/* runs call, adding its wall time to profile slot kind; returns on error */
#define TIMED(m, kind, call)                                   \
    do {                                                       \
        const double t0_ = ts_time_now();                      \
        TS_TRY(call);                                          \
        (m)->prof[kind] += ts_time_now() - t0_;                \
    } while (0)

const char *ts_unet_prof_name(int kind)
{
    static const char *const n[TS_PROF_COUNT] = {"conv forward", "conv weight grad", "conv input grad",
                                                 "transposed conv", "norm+relu", "max-pool", "loss",
                                                 "halo exchange", "other"};
    return kind >= 0 && kind < TS_PROF_COUNT ? n[kind] : "?";
}
const double *ts_unet_profile(const ts_unet *m) { return m->prof; }
void ts_unet_profile_reset(ts_unet *m) { memset(m->prof, 0, sizeof m->prof); }

static int add(ts_unet *m, const char *name, ts_param_kind kind, ts_dtype dt, int ndim, const int64_t *shape,
               float bound, int *idx)
{
    TS_TRY(ts_arena_add(m->arena, name, kind, dt, ndim, shape, idx));
    float *b = realloc(m->init_bound, sizeof(float) * (size_t)m->arena->n);
    if (!b) return TS_ERR(TS_ERR_NOMEM, "model table");
    m->init_bound = b;
    b[*idx] = bound;
    return 0;
}

static int add_block(ts_unet *m, const char *prefix, block *b, int cin, int cout, int level)
{
    char name[TS_PARAM_NAME_MAX];
    b->cin = cin;
    b->cout = cout;
    b->level = level;
    for (int i = 0; i < 2; i++) {
        const int ci = i ? cout : cin;
        const float bound = (float)(1.0 / sqrt((double)ci * 27));
        snprintf(name, sizeof name, "%s.conv%d.weight", prefix, i + 1);
        TS_TRY(add(m, name, TS_PARAM, TS_FLOAT32, 5, (const int64_t[]){cout, ci, 3, 3, 3}, bound, &b->cw[i]));
        snprintf(name, sizeof name, "%s.conv%d.bias", prefix, i + 1);
        TS_TRY(add(m, name, TS_PARAM, TS_FLOAT32, 1, (const int64_t[]){cout}, bound, &b->cb[i]));
        const int64_t c = cout;
        snprintf(name, sizeof name, "%s.norm%d.weight", prefix, i + 1);
        TS_TRY(add(m, name, TS_PARAM, TS_FLOAT32, 1, &c, -1, &b->nw[i]));
        snprintf(name, sizeof name, "%s.norm%d.bias", prefix, i + 1);
        TS_TRY(add(m, name, TS_PARAM, TS_FLOAT32, 1, &c, 0, &b->nb[i]));
        b->rm[i] = b->rv[i] = b->nbt[i] = -1;
        if (m->cfg.norm == TS_NORM_BATCH) {
            snprintf(name, sizeof name, "%s.norm%d.running_mean", prefix, i + 1);
            TS_TRY(add(m, name, TS_BUFFER, TS_FLOAT32, 1, &c, 0, &b->rm[i]));
            snprintf(name, sizeof name, "%s.norm%d.running_var", prefix, i + 1);
            TS_TRY(add(m, name, TS_BUFFER, TS_FLOAT32, 1, &c, -1, &b->rv[i]));
            snprintf(name, sizeof name, "%s.norm%d.num_batches_tracked", prefix, i + 1);
            TS_TRY(add(m, name, TS_BUFFER, TS_INT64, 0, NULL, 0, &b->nbt[i]));
        }
    }
    return 0;
}

int ts_unet_create(const ts_unet_cfg *cfg, int nstate, ts_unet **out)
{
    int err = 0;
    ts_unet *m = TS_CALLOC(1, sizeof *m);
    if (!m) return TS_ERR_NOMEM;
    m->cfg = *cfg;
    m->loss_scale = 1.0f;
    const int L = cfg->levels;
    char name[TS_PARAM_NAME_MAX];
    if (L < 1 || L > L_MAX) TS_FAIL(TS_ERR_ARG, "unet: %d levels (1..%d)", L, L_MAX);
    TS_CHECK(ts_arena_create(&m->arena));
    for (int l = 0; l < L; l++) {
        snprintf(name, sizeof name, "enc%d", l);
        TS_CHECK(add_block(m, name, &m->enc[l], l ? cfg->channels[l - 1] : cfg->in_channels, cfg->channels[l], l));
    }
    for (int l = L - 2; l >= 0; l--) {
        const int cin = cfg->channels[l + 1], cout = cfg->channels[l];
        const float bound = (float)(1.0 / sqrt((double)cout * 8)); /* PyTorch: fan_in from weight.size(1) */
        snprintf(name, sizeof name, "up%d.weight", l);
        TS_CHECK(add(m, name, TS_PARAM, TS_FLOAT32, 5, (const int64_t[]){cin, cout, 2, 2, 2}, bound, &m->upw[l]));
        snprintf(name, sizeof name, "up%d.bias", l);
        TS_CHECK(add(m, name, TS_PARAM, TS_FLOAT32, 1, (const int64_t[]){cout}, bound, &m->upb[l]));
        snprintf(name, sizeof name, "dec%d", l);
        TS_CHECK(add_block(m, name, &m->dec[l], 2 * cout, cout, l));
    }
    {
        const float bound = (float)(1.0 / sqrt((double)cfg->channels[0]));
        TS_CHECK(add(m, "head.weight", TS_PARAM, TS_FLOAT32, 5, (const int64_t[]){cfg->classes, cfg->channels[0], 1, 1, 1},
                     bound, &m->headw));
        TS_CHECK(add(m, "head.bias", TS_PARAM, TS_FLOAT32, 1, (const int64_t[]){cfg->classes}, bound, &m->headb));
    }
    TS_CHECK(ts_arena_alloc(m->arena, nstate));
    TS_CHECK(ts_unet_init(m, 0)); /* a defined state; callers re-initialise or load */
    *out = m;
    return 0;
cleanup:
    ts_unet_destroy(&m);
    return err;
}

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

static void free_acts(ts_unet *m)
{
    ts_tensor_free(&m->x);
    for (int l = 0; l < L_MAX; l++) {
        halo_free(&m->gh[l]);
        for (int i = 0; i < 2; i++) {
            halo_free(&m->enc[l].xh[i]);
            halo_free(&m->dec[l].xh[i]);
        }
    }
    m->halo_bytes = 0;
    ts_tensor_free(&m->logits);
    ts_tensor_free(&m->dlogits);
    for (int l = 0; l < L_MAX; l++) {
        ts_tensor *t[] = {&m->pool[l], &m->pidx[l], &m->up[l], &m->gin[l], &m->dskip[l]};
        for (size_t i = 0; i < sizeof t / sizeof *t; i++) ts_tensor_free(t[i]);
        for (int i = 0; i < 2; i++) {
            block *bs[] = {&m->enc[l], &m->dec[l]};
            for (int j = 0; j < 2; j++) {
                ts_tensor_free(&bs[j]->y[i]);
                ts_tensor_free(&bs[j]->a[i]);
                ts_tensor_free(&bs[j]->smean[i]);
                ts_tensor_free(&bs[j]->sinv[i]);
            }
        }
    }
    m->n = 0;
    m->have_dlogits = 0;
}

void ts_unet_destroy(ts_unet **m)
{
    if (!m || !*m) return;
    free_acts(*m);
    ts_arena_destroy(&(*m)->arena);
    free((*m)->init_bound);
    free(*m);
    *m = NULL;
    ts_nn_release_scratch(); /* this thread's cached layer scratch */
}

ts_arena *ts_unet_arena(ts_unet *m) { return m->arena; }
const ts_unet_cfg *ts_unet_config(const ts_unet *m) { return &m->cfg; }
const ts_tensor *ts_unet_logits(const ts_unet *m) { return &m->logits; }

int ts_unet_init(ts_unet *m, uint64_t seed)
{
    ts_arena *a = m->arena;
    for (int i = 0; i < a->n; i++) {
        ts_tensor t = ts_arena_value(a, i);
        const float b = m->init_bound[i];
        if (a->p[i].dtype == TS_INT64) {
            *(int64_t *)t.data = 0;
            continue;
        }
        float *p = t.data;
        ts_rng r;
        ts_rng_init(&r, seed, 0, (uint32_t)i);
        for (int64_t j = 0; j < a->p[i].numel; j++) p[j] = b > 0 ? (2.0f * ts_rng_uniformf(&r) - 1.0f) * b : b < 0 ? 1.0f : 0.0f;
    }
    return 0;
}

/* allocates t, or with m->dry only counts its bytes */
static int talloc(ts_unet *m, ts_tensor *t, ts_dtype dt, int nd, const int64_t *shape)
{
    if (!m->dry) return ts_tensor_alloc(t, dt, nd, shape);
    size_t b = ts_dtype_size(dt);
    for (int i = 0; i < nd; i++) b *= (size_t)shape[i];
    m->dry_bytes += b;
    return 0;
}

static int alloc5(ts_unet *m, ts_tensor *t, ts_dtype dt, int64_t n, int64_t d, int64_t h, int64_t w, int64_t c)
{
    return talloc(m, t, dt, 5, (const int64_t[]){n, d, h, w, c});
}

static int alloc_block(ts_unet *m, block *b, int64_t n, int64_t d, int64_t h, int64_t w)
{
    const int64_t ns = m->cfg.norm == TS_NORM_BATCH ? b->cout : m->cfg.norm == TS_NORM_GROUP ? n * m->cfg.groups : n * b->cout;
    const int64_t dhw[3] = {d, h, w};
    for (int i = 0; i < 2; i++) {
        TS_TRY(alloc5(m, &b->y[i], TS_FLOAT32, n, d, h, w, b->cout));
        TS_TRY(alloc5(m, &b->a[i], TS_FLOAT32, n, d, h, w, b->cout));
        TS_TRY(talloc(m, &b->smean[i], TS_FLOAT32, 1, &ns));
        TS_TRY(talloc(m, &b->sinv[i], TS_FLOAT32, 1, &ns));
        TS_TRY(halo_alloc(m, &b->xh[i], n, dhw, i ? b->cout : b->cin));
    }
    return 0;
}

int ts_unet_setup(ts_unet *m, int n, int d, int h, int w)
{
    int err = 0;
    if (m->dry) {
        m->dry_bytes = 0;
    } else {
        if (m->n == n && m->d == d && m->h == h && m->w == w) return 0;
        free_acts(m);
    }
    const ts_unet_cfg *c = &m->cfg;
    const int L = c->levels;
    TS_CHECK(ts_unet_check_input(c, (const int64_t[]){d, h, w}, "input"));
    if (n < 1) TS_FAIL(TS_ERR_ARG, "unet: batch of %d samples", n);
    TS_CHECK(alloc5(m, &m->x, TS_FLOAT32, n, d, h, w, c->in_channels));
    for (int l = 0; l < L; l++) {
        const int64_t dl = d >> l, hl = h >> l, wl = w >> l;
        TS_CHECK(alloc_block(m, &m->enc[l], n, dl, hl, wl));
        TS_CHECK(alloc5(m, &m->gin[l], TS_FLOAT32, n, dl, hl, wl, c->channels[l]));
        if (l > 0) {
            TS_CHECK(alloc5(m, &m->pool[l], TS_FLOAT32, n, dl, hl, wl, c->channels[l - 1]));
            TS_CHECK(alloc5(m, &m->pidx[l], TS_UINT8, n, dl, hl, wl, c->channels[l - 1]));
        }
        TS_CHECK(halo_alloc(m, &m->gh[l], n, (const int64_t[]){dl, hl, wl}, c->channels[l]));
        if (l < L - 1) {
            TS_CHECK(alloc_block(m, &m->dec[l], n, dl, hl, wl));
            TS_CHECK(alloc5(m, &m->up[l], TS_FLOAT32, n, dl, hl, wl, c->channels[l]));
            TS_CHECK(alloc5(m, &m->dskip[l], TS_FLOAT32, n, dl, hl, wl, c->channels[l]));
        }
    }
    TS_CHECK(alloc5(m, &m->logits, TS_FLOAT32, n, d, h, w, c->classes));
    TS_CHECK(alloc5(m, &m->dlogits, TS_FLOAT32, n, d, h, w, c->classes));
    if (m->dry) return 0;
    m->n = n;
    m->d = d;
    m->h = h;
    m->w = w;
    return 0;
cleanup:
    if (!m->dry) free_acts(m);
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

size_t ts_unet_activation_bytes(const ts_unet *m)
{
    size_t s = m->halo_bytes + ts_tensor_bytes(&m->x) + ts_tensor_bytes(&m->logits) + ts_tensor_bytes(&m->dlogits);
    for (int l = 0; l < L_MAX; l++) {
        s += ts_tensor_bytes(&m->pool[l]) + ts_tensor_bytes(&m->pidx[l]) + ts_tensor_bytes(&m->up[l]) +
             ts_tensor_bytes(&m->gin[l]) + ts_tensor_bytes(&m->dskip[l]);
        for (int i = 0; i < 2; i++) {
            const block *bs[] = {&m->enc[l], &m->dec[l]};
            for (int j = 0; j < 2; j++)
                s += ts_tensor_bytes(&bs[j]->y[i]) + ts_tensor_bytes(&bs[j]->a[i]) + ts_tensor_bytes(&bs[j]->smean[i]) +
                     ts_tensor_bytes(&bs[j]->sinv[i]);
        }
    }
    return s;
}

/* ------------------------------------------------------------ forward */

static ts_tensor V(const ts_unet *m, int i) { return ts_arena_value(m->arena, i); }
static ts_tensor G(const ts_unet *m, int i) { return ts_arena_grad(m->arena, i); }

/* norms with the ReLU that follows them fused */
static ts_norm_opts norm_opts(const ts_unet *m)
{
    ts_norm_opts o = {m->cfg.eps, m->cfg.momentum, m->cfg.groups, 1, NULL, NULL};
    if (m->cfg.norm == TS_NORM_BATCH && m->norm_sync) {
        o.sync = m->norm_sync;
        o.sync_ctx = m->norm_ctx;
    } else if (m->split_on) { /* the statistics of a sample are those of all its boxes */
        o.sync = m->split.sum;
        o.sync_ctx = m->split.ctx;
    }
    return o;
}

static void halo_progress(void *ctx)
{
    ts_unet *m = ctx;
    m->split.halo_progress(m->split.ctx);
}

/* starts the exchange of [a, b]'s halo into h (split only) */
static int halo_start(ts_unet *m, const ts_tensor *a, const ts_tensor *b, const ts_halo *h)
{
    const double t0 = ts_time_now();
    const int64_t dhw[3] = {a->shape[1], a->shape[2], a->shape[3]};
    int rc = m->split.halo_start(m->split.ctx, a->data, (int)a->shape[4], b ? b->data : NULL, b ? (int)b->shape[4] : 0,
                                 (int)a->shape[0], dhw, h);
    m->prof[TS_PROF_HALO] += ts_time_now() - t0;
    return rc;
}

static int halo_wait(ts_unet *m)
{
    const double t0 = ts_time_now();
    int rc = m->split.halo_wait(m->split.ctx);
    m->prof[TS_PROF_HALO] += ts_time_now() - t0;
    return rc;
}

/* a 3x3x3 conv of the block (on [in, in2] when in2): with a split, the
 * interior while the halo travels, then the border */
static int conv3_forward(ts_unet *m, ts_halo *h, const ts_tensor *in, const ts_tensor *in2, const ts_tensor *w,
                         const ts_tensor *bias, ts_tensor *y)
{
    if (!m->split_on) {
        if (in2) TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_cat_forward(in, in2, w, bias, 1, 1, y));
        else TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_forward(in, w, bias, 1, 1, y));
        return 0;
    }
    TS_TRY(halo_start(m, in, in2, h));
    ts_conv_split cs = {h, TS_CONV_INTERIOR, halo_progress, m};
    for (int part = 0; part < 2; part++) {
        if (part) {
            TS_TRY(halo_wait(m));
            cs.part = TS_CONV_BORDER;
        }
        if (in2) TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_cat_forward_split(in, in2, w, bias, &cs, y));
        else TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_forward_split(in, w, bias, &cs, y));
    }
    return 0;
}

/* in2 (decoder blocks): the block's input is the concatenation [in, in2] */
static int block_forward(ts_unet *m, block *b, const ts_tensor *in, const ts_tensor *in2, int train)
{
    const ts_norm_opts o = norm_opts(m);
    for (int i = 0; i < 2; i++) {
        ts_tensor w = V(m, b->cw[i]), bias = V(m, b->cb[i]), g = V(m, b->nw[i]), be = V(m, b->nb[i]);
        TS_TRY(conv3_forward(m, &b->xh[i], i ? &b->a[0] : in, i ? NULL : in2, &w, &bias, &b->y[i]));
        switch (m->cfg.norm) {
        case TS_NORM_BATCH: {
            ts_tensor rm = V(m, b->rm[i]), rv = V(m, b->rv[i]), nbt = V(m, b->nbt[i]);
            TIMED(m, TS_PROF_NORM,
                  ts_batchnorm_forward(&b->y[i], &g, &be, &rm, &rv, train, &o, &b->a[i], &b->smean[i], &b->sinv[i]));
            if (train) (*(int64_t *)nbt.data)++;
            break;
        }
        case TS_NORM_GROUP:
            TIMED(m, TS_PROF_NORM, ts_groupnorm_forward(&b->y[i], &g, &be, &o, &b->a[i], &b->smean[i], &b->sinv[i]));
            break;
        case TS_NORM_INSTANCE:
            TIMED(m, TS_PROF_NORM, ts_instancenorm_forward(&b->y[i], &g, &be, &o, &b->a[i], &b->smean[i], &b->sinv[i]));
            break;
        }
    }
    return 0;
}

/* the top activation of level l of the decoder path (input of up{l-1} or the head) */
static ts_tensor *top(ts_unet *m, int l) { return l == m->cfg.levels - 1 ? &m->enc[l].a[1] : &m->dec[l].a[1]; }

int ts_unet_forward(ts_unet *m, const ts_tensor *image, int train)
{
    const ts_unet_cfg *c = &m->cfg;
    const int L = c->levels;
    TS_TRY(ts_tensor_check_shape(image, "input image", 5, (const int64_t[]){-1, c->in_channels, -1, -1, -1}));
    if (image->dtype != TS_FLOAT32) return TS_ERR(TS_ERR_ARG, "input image must be float32");
    TS_TRY(ts_unet_setup(m, (int)image->shape[0], (int)image->shape[2], (int)image->shape[3], (int)image->shape[4]));
    m->have_dlogits = 0;
    TIMED(m, TS_PROF_OTHER, ts_tensor_to_channels_last(image, &m->x));
    for (int l = 0; l < L; l++) {
        if (l > 0) TIMED(m, TS_PROF_POOL, ts_maxpool3d_forward(&m->enc[l - 1].a[1], 2, &m->pool[l], &m->pidx[l]));
        TS_TRY(block_forward(m, &m->enc[l], l ? &m->pool[l] : &m->x, NULL, train));
    }
    for (int l = L - 2; l >= 0; l--) {
        ts_tensor w = V(m, m->upw[l]), b = V(m, m->upb[l]);
        TIMED(m, TS_PROF_CONVT, ts_convt3d_forward(top(m, l + 1), &w, &b, 2, &m->up[l]));
        TS_TRY(block_forward(m, &m->dec[l], &m->up[l], &m->enc[l].a[1], train)); /* on [up, skip] */
    }
    ts_tensor hw = V(m, m->headw), hb = V(m, m->headb);
    TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_forward(top(m, 0), &hw, &hb, 1, 0, &m->logits));
    m->train_forward = train;
    return 0;
}

int ts_unet_loss(ts_unet *m, const ts_tensor *labels, int with_grad, double *loss)
{
    const ts_unet_cfg *c = &m->cfg;
    if (!m->n) return TS_ERR(TS_ERR_ARG, "unet: loss before forward");
    TS_TRY(ts_tensor_check_shape(labels, "labels", 4, (const int64_t[]){m->n, m->d, m->h, m->w}));
    if (labels->dtype != TS_UINT8) return TS_ERR(TS_ERR_ARG, "labels must be uint8");
    ts_loss_opts o = {c->ignore_index, c->weighted ? c->class_weights : NULL, 1e-5f, NULL, NULL};
    if (m->split_on) { /* the loss of whole samples over their boxes */
        o.sync = m->split.sum;
        o.sync_ctx = m->split.ctx;
    }
    const float f = m->loss_scale;
    double total = 0, l, t0 = ts_time_now();
    if (with_grad) ts_tensor_zero(&m->dlogits);
    if (c->loss & TS_LOSS_CE) {
        if (with_grad) TS_TRY(ts_softmax_ce_forward_backward(&m->logits, labels, &o, f, &l, &m->dlogits));
        else TS_TRY(ts_softmax_ce_forward(&m->logits, labels, &o, &l));
        total += l;
    }
    if (c->loss & TS_LOSS_DICE) {
        if (with_grad) TS_TRY(ts_dice_forward_backward(&m->logits, labels, &o, f, &l, &m->dlogits));
        else TS_TRY(ts_dice_forward(&m->logits, labels, &o, &l));
        total += l;
    }
    m->have_dlogits = with_grad;
    m->prof[TS_PROF_LOSS] += ts_time_now() - t0;
    *loss = total;
    return 0;
}

/* ----------------------------------------------------------- backward */

/* Backward of conv i of block b on a split: dy (in y[i]) starts its halo
 * exchange, the weight gradient is taken while it travels (it reads the
 * input's halo kept from forward), then the input gradient (to dx, and dx2
 * for the second part of a concatenated input; dx NULL: not needed). */
static int conv3_backward_split(ts_unet *m, block *b, int i, ts_tensor *x, ts_tensor *x2, const ts_tensor *w,
                                ts_tensor *dx, ts_tensor *dx2, ts_tensor *dw, ts_tensor *db)
{
    ts_halo *gh = &m->gh[b->level];
    const ts_conv_split xs = {&b->xh[i], TS_CONV_ALL, halo_progress, m}, dys = {gh, TS_CONV_ALL, NULL, NULL};
    if (dx) TS_TRY(halo_start(m, &b->y[i], NULL, gh));
    if (x2) TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_cat_backward_split(x, x2, w, &xs, &dys, &b->y[i], NULL, NULL, dw, db));
    else TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward_split(x, w, &xs, &dys, &b->y[i], NULL, dw, db));
    ready2(m, b->cw[i], b->cb[i]);
    if (!dx) return 0;
    TS_TRY(halo_wait(m));
    if (x2) TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_cat_backward_split(x, x2, w, &xs, &dys, &b->y[i], dx, dx2, NULL, NULL));
    else TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward_split(x, w, &xs, &dys, &b->y[i], dx, NULL, NULL));
    return 0;
}

/* g holds d(a[1]) on entry and is used as scratch; the input gradient goes to dx (may be in, or NULL). */
/* in2, dx2: a decoder block's second input [in, in2] and its gradient */
static int block_backward(ts_unet *m, block *b, ts_tensor *in, ts_tensor *in2, ts_tensor *g, ts_tensor *dx,
                          ts_tensor *dx2)
{
    const ts_norm_opts o = norm_opts(m);
    for (int i = 1; i >= 0; i--) {
        ts_tensor gm = V(m, b->nw[i]), dgm = G(m, b->nw[i]), dbe = G(m, b->nb[i]);
        /* norm + ReLU backward; the input gradient overwrites the norm's input y[i] */
        switch (m->cfg.norm) {
        case TS_NORM_BATCH:
            TIMED(m, TS_PROF_NORM, ts_batchnorm_backward(&b->y[i], &b->a[i], &gm, &b->smean[i], &b->sinv[i],
                                                         m->train_forward, &o, g, &b->y[i], &dgm, &dbe));
            break;
        case TS_NORM_GROUP:
            TIMED(m, TS_PROF_NORM, ts_groupnorm_backward(&b->y[i], &b->a[i], &gm, &b->smean[i], &b->sinv[i], &o, g,
                                                         &b->y[i], &dgm, &dbe));
            break;
        case TS_NORM_INSTANCE:
            TIMED(m, TS_PROF_NORM, ts_instancenorm_backward(&b->y[i], &b->a[i], &gm, &b->smean[i], &b->sinv[i], &o, g,
                                                            &b->y[i], &dgm, &dbe));
            break;
        }
        ready2(m, b->nw[i], b->nb[i]);
        ts_tensor w = V(m, b->cw[i]), dw = G(m, b->cw[i]), db = G(m, b->cb[i]);
        ts_tensor *x = i ? &b->a[0] : in, *dxi = i ? g : dx;
        if (m->split_on) {
            TS_TRY(conv3_backward_split(m, b, i, x, i ? NULL : in2, &w, dxi, i ? NULL : dx2, &dw, &db));
            continue;
        }
        /* weight gradient first: dx may overwrite x */
        if (i == 0 && in2) {
            TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_cat_backward(in, in2, &w, 1, 1, &b->y[0], NULL, NULL, &dw, &db));
            ready2(m, b->cw[0], b->cb[0]);
            TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_cat_backward(in, in2, &w, 1, 1, &b->y[0], dx, dx2, NULL, NULL));
            continue;
        }
        TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward(x, &w, 1, 1, &b->y[i], NULL, &dw, &db));
        ready2(m, b->cw[i], b->cb[i]);
        if (dxi) TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward(x, &w, 1, 1, &b->y[i], dxi, NULL, NULL));
    }
    return 0;
}

int ts_unet_backward(ts_unet *m)
{
    const int L = m->cfg.levels;
    if (!m->have_dlogits) return TS_ERR(TS_ERR_ARG, "unet: backward without a loss gradient (call ts_unet_loss)");
    m->have_dlogits = 0; /* the forward buffers are consumed */
    ts_tensor hw = V(m, m->headw), dhw = G(m, m->headw), dhb = G(m, m->headb);
    TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward(top(m, 0), &hw, 1, 0, &m->dlogits, NULL, &dhw, &dhb));
    ready2(m, m->headw, m->headb);
    TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward(top(m, 0), &hw, 1, 0, &m->dlogits, &m->gin[0], NULL, NULL));
    for (int l = 0; l <= L - 2; l++) {
        /* the gradient of [up, skip]: the up part over up[l] itself, the skip part to dskip[l] */
        TS_TRY(block_backward(m, &m->dec[l], &m->up[l], &m->enc[l].a[1], &m->gin[l], &m->up[l], &m->dskip[l]));
        ts_tensor w = V(m, m->upw[l]), dw = G(m, m->upw[l]), db = G(m, m->upb[l]);
        TIMED(m, TS_PROF_CONVT, ts_convt3d_backward(top(m, l + 1), &w, 2, &m->up[l], &m->gin[l + 1], &dw, &db));
        ready2(m, m->upw[l], m->upb[l]);
    }
    for (int l = L - 1; l >= 0; l--) {
        TS_TRY(block_backward(m, &m->enc[l], l ? &m->pool[l] : &m->x, NULL, &m->gin[l], l ? &m->pool[l] : NULL, NULL));
        if (l > 0) {
            TIMED(m, TS_PROF_POOL, ts_maxpool3d_backward(&m->pool[l], &m->pidx[l], 2, &m->gin[l - 1]));
            const double t0 = ts_time_now();
            float *g = m->gin[l - 1].data;
            const float *s = m->dskip[l - 1].data;
            const int64_t n = ts_tensor_numel(&m->gin[l - 1]);
#pragma omp parallel for schedule(dynamic, 16384)
            for (int64_t i = 0; i < n; i++) g[i] += s[i];
            m->prof[TS_PROF_OTHER] += ts_time_now() - t0;
        }
    }
    return 0;
}
