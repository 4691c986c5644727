/* The UNet3D's structure (see unet.h): the parameter table (names, shapes,
 * initial bounds, the units that own them), create/destroy, initialisation,
 * hooks and settings, and the units, stages and edges of the pipeline. It
 * allocates no activation (unet_acts.c) and runs no layer (unet_forward.c,
 * unet_backward.c); the shared structures are in unet_impl.h. */
#include "tsbuild.h"
#include "src/model/unet_impl.h"
#include "src/core/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ts_unet_set_grad_hook(ts_unet *m, void (*fn)(void *ctx, int param), void *ctx)
{
    m->grad_hook = fn;
    m->grad_ctx = ctx;
}

void ts_unet_set_unit_hook(ts_unet *m, void (*fn)(void *ctx, int unit, int backward), void *ctx)
{
    m->unit_hook = fn;
    m->unit_ctx = ctx;
}

void ts_unet_set_norm_sync(ts_unet *m, ts_nn_sync_fn fn, void *ctx)
{
    m->norm_sync = fn;
    m->norm_ctx = ctx;
}

static int same_split(const ts_unet_split *a, const ts_unet_split *b)
{
    for (int d = 0; d < 3; d++)
        if (a->on[d] != b->on[d] || a->nbr[d][0] != b->nbr[d][0] || a->nbr[d][1] != b->nbr[d][1]) return 0;
    return a->halo_start == b->halo_start && a->halo_progress == b->halo_progress && a->halo_wait == b->halo_wait &&
           a->reduce == b->reduce && a->ctx == b->ctx;
}

void ts_unet_set_split(ts_unet *m, const ts_unet_split *s)
{
    if ((s != NULL) == m->split_on && (!s || same_split(s, &m->split))) return; /* unchanged: keep the buffers */
    ts_unet_free_acts(m);
    m->split_on = s != NULL;
    if (s) m->split = *s;
    else memset(&m->split, 0, sizeof m->split);
}

int ts_unet_set_checkpoint(ts_unet *m, unsigned levels)
{
    if (levels >> m->cfg.levels)
        return TS_ERR(TS_ERR_ARG, "unet: checkpointed levels 0x%x, but the model has levels 0..%d", levels, m->cfg.levels - 1);
    if (levels == m->ckpt) return 0;
    ts_unet_free_acts(m);
    m->ckpt = m->cfg.ckpt_levels = levels;
    return 0;
}

unsigned ts_unet_checkpoint(const ts_unet *m) { return m->ckpt; }

void ts_unet_set_loss_scale(ts_unet *m, float f) { m->loss_scale = f; }
void ts_unet_set_precision(ts_unet *m, ts_precision p) { m->cfg.precision = p; }
size_t ts_unet_halo_bytes(const ts_unet *m) { return m->halo_bytes; }

const char *ts_unet_prof_name(int kind)
{
    static const char *const n[TS_PROF_COUNT] = {"conv forward", "conv weight grad", "conv input grad",
                                                 "transposed conv", "norm+relu", "max-pool", "loss",
                                                 "halo exchange", "other"};
    return kind >= 0 && kind < TS_PROF_COUNT ? n[kind] : "?";
}
const double *ts_unet_profile(const ts_unet *m) { return m->prof; }
void ts_unet_profile_reset(ts_unet *m) { memset(m->prof, 0, sizeof m->prof); }
void ts_unet_set_profile_sync(ts_unet *m, int on) { m->prof_sync = on && m->device; }

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

/* unit_first[i]: the unit of conv i, whose parameters start here (-1: already started, e.g. by up{l}) */
static int add_block(ts_unet *m, const char *prefix, block *b, int cin, int cout, int level, const int unit_first[2])
{
    char name[TS_PARAM_NAME_MAX];
    b->enc = prefix[0] == 'e';
    b->cin = cin;
    b->cout = cout;
    b->level = level;
    for (int i = 0; i < 2; i++) {
        if (unit_first[i] >= 0) m->unit_param[unit_first[i]] = m->arena->n;
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

/* a conv (k = 3 or 1, with bias) named conv.weight/.bias and its norm named
 * norm.weight/... (running statistics for batch norm) */
static int add_cnorm(ts_unet *m, const char *conv, const char *norm, cnorm *p, int cin, int cout, int k, int stride,
                     int level)
{
    char name[TS_PARAM_NAME_MAX];
    p->level = level;
    p->cin = cin;
    p->cout = cout;
    p->k = k;
    p->stride = stride;
    const float bound = (float)(1.0 / sqrt((double)cin * k * k * k));
    const int64_t c = cout;
    snprintf(name, sizeof name, "%s.weight", conv);
    TS_TRY(add(m, name, TS_PARAM, TS_FLOAT32, 5, (const int64_t[]){cout, cin, k, k, k}, bound, &p->cw));
    snprintf(name, sizeof name, "%s.bias", conv);
    TS_TRY(add(m, name, TS_PARAM, TS_FLOAT32, 1, &c, bound, &p->cb));
    snprintf(name, sizeof name, "%s.weight", norm);
    TS_TRY(add(m, name, TS_PARAM, TS_FLOAT32, 1, &c, -1, &p->nw));
    snprintf(name, sizeof name, "%s.bias", norm);
    TS_TRY(add(m, name, TS_PARAM, TS_FLOAT32, 1, &c, 0, &p->nb));
    p->rm = p->rv = p->nbt = -1;
    if (m->cfg.norm == TS_NORM_BATCH) {
        snprintf(name, sizeof name, "%s.running_mean", norm);
        TS_TRY(add(m, name, TS_BUFFER, TS_FLOAT32, 1, &c, 0, &p->rm));
        snprintf(name, sizeof name, "%s.running_var", norm);
        TS_TRY(add(m, name, TS_BUFFER, TS_FLOAT32, 1, &c, -1, &p->rv));
        snprintf(name, sizeof name, "%s.num_batches_tracked", norm);
        TS_TRY(add(m, name, TS_BUFFER, TS_INT64, 0, NULL, 0, &p->nbt));
    }
    return 0;
}

/* The residual encoder's parameters: stem.{conv,norm}, then per level l
 * and block j enc{l}.block{j}.{conv1,norm1,conv2,norm2} and, where the
 * block changes channels or stride (the first block of levels l > 0),
 * enc{l}.block{j}.skip.{conv,norm}. Unit enc{l}.conv1 holds the stem and
 * the blocks but the last, enc{l}.conv2 the last block (U_RB). */
static int add_resenc(ts_unet *m)
{
    const ts_unet_cfg *cfg = &m->cfg;
    char a[TS_PARAM_NAME_MAX], b[TS_PARAM_NAME_MAX];
    for (int l = 0; l < cfg->levels; l++) {
        m->unit_param[U_E(m, l, 0)] = m->arena->n;
        if (l == 0) TS_TRY(add_cnorm(m, "stem.conv", "stem.norm", &m->stem, cfg->in_channels, cfg->channels[0], 3, 1, 0));
        for (int j = 0; j < cfg->res_blocks[l]; j++) {
            rblock *r = &m->rb[l][j];
            if (j == cfg->res_blocks[l] - 1) m->unit_param[U_E(m, l, 1)] = m->arena->n;
            const int cin = j ? cfg->channels[l] : l ? cfg->channels[l - 1] : cfg->channels[0];
            const int cout = cfg->channels[l], stride = l > 0 && j == 0 ? 2 : 1;
            for (int i = 1; i <= 2; i++) {
                snprintf(a, sizeof a, "enc%d.block%d.conv%d", l, j, i);
                snprintf(b, sizeof b, "enc%d.block%d.norm%d", l, j, i);
                TS_TRY(add_cnorm(m, a, b, i == 1 ? &r->c1 : &r->c2, i == 1 ? cin : cout, cout, 3, i == 1 ? stride : 1,
                                 l));
            }
            r->skip = cin != cout || stride != 1;
            if (r->skip) {
                snprintf(a, sizeof a, "enc%d.block%d.skip.conv", l, j);
                snprintf(b, sizeof b, "enc%d.block%d.skip.norm", l, j);
                TS_TRY(add_cnorm(m, a, b, &r->sk, cin, cout, 1, stride, l));
            }
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
    if (cfg->ckpt_levels >> L)
        TS_FAIL(TS_ERR_ARG, "unet: checkpointed levels 0x%x, but the model has levels 0..%d", cfg->ckpt_levels, L - 1);
    m->ckpt = cfg->ckpt_levels;
    TS_CHECK(ts_arena_create(&m->arena));
    m->u0 = 0;
    m->u1 = 4 * L - 1;
    m->nslots = 1;
    for (int l = 0; l < L_MAX; l++) m->dsw[l] = m->dsb[l] = -1;
    if (cfg->arch == TS_ARCH_RESENC) {
        for (int l = 0; l < L; l++)
            if (cfg->res_blocks[l] < 1 || cfg->res_blocks[l] > TS_UNET_MAX_RES_BLOCKS)
                TS_FAIL(TS_ERR_ARG, "unet: %d residual blocks at level %d (1..%d)", cfg->res_blocks[l], l,
                        TS_UNET_MAX_RES_BLOCKS);
        TS_CHECK(add_resenc(m));
    } else {
        for (int l = 0; l < L; l++) {
            snprintf(name, sizeof name, "enc%d", l);
            TS_CHECK(add_block(m, name, &m->enc[l], l ? cfg->channels[l - 1] : cfg->in_channels, cfg->channels[l], l,
                               (const int[]){U_E(m, l, 0), U_E(m, l, 1)}));
        }
    }
    if (cfg->deep_supervision && L < 4)
        TS_FAIL(TS_ERR_ARG, "unet: deep supervision needs at least 4 levels (%d)", L);
    for (int l = L - 2; l >= 0; l--) {
        const int cin = cfg->channels[l + 1], cout = cfg->channels[l];
        m->unit_param[U_D(m, l, 0)] = m->arena->n; /* up{l} belongs to dec l's first conv */
        const float bound = (float)(1.0 / sqrt((double)cout * 8)); /* PyTorch: fan_in from weight.size(1) */
        snprintf(name, sizeof name, "up%d.weight", l);
        TS_CHECK(add(m, name, TS_PARAM, TS_FLOAT32, 5, (const int64_t[]){cin, cout, 2, 2, 2}, bound, &m->upw[l]));
        snprintf(name, sizeof name, "up%d.bias", l);
        TS_CHECK(add(m, name, TS_PARAM, TS_FLOAT32, 1, (const int64_t[]){cout}, bound, &m->upb[l]));
        snprintf(name, sizeof name, "dec%d", l);
        TS_CHECK(add_block(m, name, &m->dec[l], 2 * cout, cout, l, (const int[]){-1, U_D(m, l, 1)}));
        if (l > 0 && ts_unet_ds_weight(cfg, l) > 0) { /* deep supervision head ds{l}, part of dec{l}.conv2's unit */
            const float bound = (float)(1.0 / sqrt((double)cout));
            snprintf(name, sizeof name, "ds%d.weight", l);
            TS_CHECK(add(m, name, TS_PARAM, TS_FLOAT32, 5, (const int64_t[]){cfg->classes, cout, 1, 1, 1}, bound,
                         &m->dsw[l]));
            snprintf(name, sizeof name, "ds%d.bias", l);
            TS_CHECK(add(m, name, TS_PARAM, TS_FLOAT32, 1, (const int64_t[]){cfg->classes}, bound, &m->dsb[l]));
        }
    }
    {
        const float bound = (float)(1.0 / sqrt((double)cfg->channels[0]));
        m->unit_param[U_H(m)] = m->arena->n;
        TS_CHECK(add(m, "head.weight", TS_PARAM, TS_FLOAT32, 5, (const int64_t[]){cfg->classes, cfg->channels[0], 1, 1, 1},
                     bound, &m->headw));
        TS_CHECK(add(m, "head.bias", TS_PARAM, TS_FLOAT32, 1, (const int64_t[]){cfg->classes}, bound, &m->headb));
    }
    m->unit_param[4 * L - 1] = m->arena->n;
    TS_CHECK(ts_arena_alloc(m->arena, nstate));
    TS_CHECK(ts_unet_init(m, 0)); /* a defined state; callers re-initialise or load */
    if (cfg->engine == TS_ENGINE_CUDA) { /* the parameter mirror; params go up before each forward */
        TS_CHECK(ts_arena_alloc_device(m->arena));
        m->ready = TS_CALLOC((size_t)m->arena->n, sizeof *m->ready);
        if (!m->ready) TS_FAIL(TS_ERR_NOMEM, "unet: %d gradient flags", m->arena->n);
        m->device = 1;
    }
    *out = m;
    return 0;
cleanup:
    ts_unet_destroy(&m);
    return err;
}

int ts_unet_clone(ts_unet *m, ts_unet **out)
{
    *out = NULL;
    if (m->device || m->split_on || m->u0 != 0 || m->u1 != 4 * m->cfg.levels - 1 || m->nslots != 1)
        return TS_ERR(TS_ERR_UNSUPPORTED, "unet: only a whole model on the CPU, without a split or stages, is cloned");
    ts_unet *c = NULL;
    TS_TRY(ts_unet_create(&m->cfg, 0, &c));
    for (int i = 0; i < m->arena->n; i++) { /* every entry: parameters and buffers */
        const ts_tensor a = ts_arena_value(m->arena, i), b = ts_arena_value(c->arena, i);
        memcpy(b.data, a.data, ts_tensor_bytes(&a));
    }
    c->winograd = m->winograd;
    c->fold_eval = m->fold_eval;
    c->loss_scale = m->loss_scale;
    *out = c;
    return 0;
}

void ts_unet_destroy(ts_unet **m)
{
    if (!m || !*m) return;
    ts_unet_free_acts(*m);
    ts_arena_destroy(&(*m)->arena);
    free((*m)->init_bound);
    free((*m)->ready);
    free(*m);
    *m = NULL;
    ts_nn_release_scratch(); /* this thread's cached layer scratch */
}

ts_arena *ts_unet_arena(ts_unet *m) { return m->arena; }
const ts_unet_cfg *ts_unet_config(const ts_unet *m) { return &m->cfg; }
const ts_tensor *ts_unet_logits(ts_unet *m) { return ts_unet_logits_slot(m, 0); }
const ts_tensor *ts_unet_logits_slot(ts_unet *m, int slot)
{
    static const ts_tensor none = {0};
    if (!m->slots || slot < 0 || slot >= m->nslots) return &none;
    return m->device ? ts_unet_device_logits(m, slot) : &m->slots[slot].logits;
}

int ts_unet_units(const ts_unet *m) { return 4 * m->cfg.levels - 1; }

const char *ts_unet_unit_name(const ts_unet *m, int u, char *buf, size_t n)
{
    const int L = m->cfg.levels;
    if (u < 0 || u > U_H(m)) snprintf(buf, n, "?");
    else if (u < 2 * L) snprintf(buf, n, "enc%d.conv%d", u / 2, u % 2 + 1);
    else if (u < U_H(m)) snprintf(buf, n, "dec%d.conv%d", L - 2 - (u - 2 * L) / 2, (u - 2 * L) % 2 + 1);
    else snprintf(buf, n, "head");
    return buf;
}

void ts_unet_unit_params(const ts_unet *m, int u, int *first, int *end)
{
    *first = m->unit_param[u];
    *end = m->unit_param[u + 1];
}

int ts_unet_set_stage(ts_unet *m, int u0, int u1, int slots)
{
    const int U = ts_unet_units(m);
    if (u0 < 0 || u1 > U || u0 >= u1 || slots < 1)
        return TS_ERR(TS_ERR_ARG, "unet: stage of units [%d, %d) of %d with %d slots", u0, u1, U, slots);
    if (m->u0 == u0 && m->u1 == u1 && m->nslots == slots) return 0;
    ts_unet_free_acts(m);
    m->u0 = u0;
    m->u1 = u1;
    m->nslots = slots;
    return 0;
}

void ts_unet_stage(const ts_unet *m, int *u0, int *u1, int *slots)
{
    *u0 = m->u0;
    *u1 = m->u1;
    *slots = m->nslots;
}

int ts_unet_edges(const ts_unet *m, ts_unet_edge *e)
{
    const int L = m->cfg.levels;
    int n = 0;
    for (int l = 0; l < L; l++) {
        if (!resenc(m) || res_mid(m, l))
            e[n++] = (ts_unet_edge){mid_tensor(m, 1, l), U_E(m, l, 0), U_E(m, l, 1), TS_EDGE_BLOCK};
        if (l + 1 < L) {
            e[n++] = (ts_unet_edge){l, U_E(m, l, 1), U_NEXT(m, l), TS_EDGE_POOL};
            e[n++] = (ts_unet_edge){l, U_E(m, l, 1), U_D(m, l, 0), TS_EDGE_SKIP};
        }
    }
    for (int l = L - 2; l >= 0; l--) {
        e[n++] = (ts_unet_edge){up_input(m, l), producer(m, up_input(m, l)), U_D(m, l, 0), TS_EDGE_UP};
        e[n++] = (ts_unet_edge){mid_tensor(m, 0, l), U_D(m, l, 0), U_D(m, l, 1), TS_EDGE_BLOCK};
        if (m->dsw[l] >= 0) e[n++] = (ts_unet_edge){ds_tensor(m, l), U_D(m, l, 1), U_H(m), TS_EDGE_DS};
    }
    e[n++] = (ts_unet_edge){head_input(m), producer(m, head_input(m)), U_H(m), TS_EDGE_HEAD};
    return n;
}

int ts_unet_edge_tensors(ts_unet *m, int k, const ts_unet_edge *e, ts_tensor **a, ts_tensor **g)
{
    if (!m->slots || k < 0 || k >= m->nslots) return TS_ERR(TS_ERR_ARG, "unet: slot %d (set up %d)", k, m->slots ? m->nslots : 0);
    if (!here(m, e->producer) && !here(m, e->consumer)) return TS_ERR(TS_ERR_ARG, "unet: edge does not touch this stage");
    *a = act(m, &m->slots[k], e->tensor);
    const int l = tensor_level(m, e->tensor);
    /* the gradient of the edge's consumer with respect to the tensor: where the backward (the loss for ds{l}'s
     * logits) writes it (consumer side) or reads it (producer side); the residual encoder's last block writes the
     * gradient of its input to rg[l] (resenc_backward) */
    *g = e->kind == TS_EDGE_SKIP ? &m->dskip[l] : e->kind == TS_EDGE_DS ? &m->slots[k].dsd[l]
       : e->kind == TS_EDGE_BLOCK && e->producer < 2 * m->cfg.levels && resenc(m) ? &m->rg[l] : &m->gin[l];
    return 0;
}

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
