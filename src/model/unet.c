/* The UNet3D: parameter table, initialisation, activation buffers and the
 * forward/backward order (see unet.h). Memory plan per level l (c_l
 * channels): each conv block keeps its conv outputs y[0..1] (norm inputs)
 * and activations a[0..1]; the decoder keeps the upsampled tensor (its first
 * conv reads [upsampled, skip] without forming the concatenation). Backward
 * reuses the forward buffers for gradients where the
 * forward values are no longer needed (a norm's input gradient overwrites
 * its input y, a conv's input gradient overwrites its input after the
 * weight gradient is taken), plus per level one incoming-gradient buffer
 * gin[l] and the skip gradient dskip[l]. A checkpointed level's pool/up,
 * y[0], a[0] and y[1] are views of three shared recompute buffers
 * (rs[RS_IN] holds the first conv's input, later the second conv's output,
 * so backward makes the input twice), refilled before its backward. */
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

typedef struct block { /* a conv block's parameters */
    int cw[2], cb[2], nw[2], nb[2], rm[2], rv[2], nbt[2]; /* arena indices, -1 if absent */
    int cin, cout, level;
    int enc; /* 1: encoder block, 0: decoder block */
} block;

/* a conv (with bias) and the norm after it: the residual encoder's layers */
typedef struct cnorm {
    int cw, cb, nw, nb, rm, rv, nbt; /* arena indices, -1 if absent */
    int cin, cout, k, stride;        /* k 3 (padding 1) or 1 (padding 0) */
    int level;                       /* of the output */
} cnorm;
/* a residual block: conv1-norm1-act, conv2-norm2, plus the skip (the input,
 * or a 1x1x1 conv and norm where channels or stride change), act after the sum */
typedef struct rblock {
    cnorm c1, c2, sk;
    int skip; /* 1: the skip is sk (projection) */
} rblock;

/* the recompute scratch of checkpointed levels (float32; the pool indices apart); RS_Y1, RS_SY and RS_SA
 * only for the residual encoder: a block's second conv output, its skip's conv and norm outputs */
enum { RS_IN = 0, RS_Y0, RS_A0, RS_Y1, RS_SY, RS_SA, RS_N };

typedef struct cacts { /* a cnorm's activations: conv output y, norm (and act) output a, saved statistics */
    ts_tensor y, a, smean, sinv;
    ts_halo xh; /* split, 3x3x3 conv: the input's halo (kept for the weight gradient) */
} cacts;
typedef struct racts { /* a residual block's; c2.a is the block's output (the activated sum) */
    cacts c1, c2, sk;
} racts;

typedef struct bacts { /* a conv block's activations in one slot */
    ts_tensor y[2], a[2], smean[2], sinv[2];
    ts_halo xh[2]; /* split: conv i's input halo (kept for its weight gradient) */
} bacts;

/* One micro-batch's activations of the stage's units (a slot). Tensors a
 * unit of another stage produces arrive in rx, indexed by tensor id: enc
 * l's output TE(l) = l, dec l's TD(l) = L + l, the activations between the
 * two units of enc l and dec l, TEm(l) = 2L + l and TDm(l) = 3L + l, the
 * deep supervision logits of dec l TDS(l) = 4L + l. */
typedef struct slot {
    ts_tensor x, pool[L_MAX], pidx[L_MAX], up[L_MAX], logits, dlogits;
    ts_tensor rx[5 * L_MAX];
    bacts enc[L_MAX], dec[L_MAX];
    cacts stem;                                    /* resenc */
    racts rb[L_MAX][TS_UNET_MAX_RES_BLOCKS];       /* resenc */
    ts_tensor dsl[L_MAX], dsd[L_MAX], dslab[L_MAX]; /* deep supervision: level l's logits, their gradient, labels */
    int train_forward; /* last forward was in train mode */
    int have_dlogits;
} slot;

struct ts_unet {
    ts_unet_cfg cfg;
    ts_arena *arena;
    float *init_bound; /* per arena entry: > 0 uniform bound, 0 zeros, -1 ones */
    block enc[L_MAX], dec[L_MAX];
    int upw[L_MAX], upb[L_MAX], headw, headb;
    cnorm stem;                                   /* resenc: input -> channels[0] */
    rblock rb[L_MAX][TS_UNET_MAX_RES_BLOCKS];     /* resenc: encoder level l's blocks */
    int dsw[L_MAX], dsb[L_MAX];                   /* deep supervision heads ds{l} (-1: none) */
    ts_tensor rg[L_MAX];                          /* resenc backward scratch, one per level */
    ts_tensor sx, sy; /* resenc on a split: a strided conv's input and output gradient with their halo voxels */
    int unit_param[4 * L_MAX];     /* arena entries of unit u: [unit_param[u], unit_param[u + 1]) */
    int u0, u1, nslots;            /* this stage's units [u0, u1) and its activation slots */
    slot *slots;
    int n, d, h, w; /* set-up shape (n = 0: none) */
    ts_tensor gin[L_MAX], dskip[L_MAX]; /* backward scratch shared by the slots (one backward at a time) */
    double prof[TS_PROF_COUNT];
    void (*grad_hook)(void *ctx, int param); /* told when a parameter's gradient is final */
    void *grad_ctx;
    void (*unit_hook)(void *ctx, int unit, int backward); /* called after each unit's forward or backward */
    void *unit_ctx;
    ts_nn_sync_fn norm_sync; /* synchronised batch norm */
    void *norm_ctx;
    int split_on;        /* a spatial split is set */
    ts_unet_split split;
    ts_halo gh[L_MAX];   /* split: a conv output gradient's halo per level (channels[l]) */
    size_t halo_bytes;
    float loss_scale;
    int dry;           /* setup only counts bytes (ts_unet_plan_bytes) */
    size_t dry_bytes;
    unsigned ckpt;     /* checkpointed levels (bit l) */
    ts_tensor rs[RS_N], rsidx; /* their recompute scratch (shared by the levels and the slots) */
};

/* The layer units, one per conv (with what precedes it) and the head:
 * enc0.conv1 (the image), enc0.conv2, enc1.conv1 (max-pool first), ...,
 * enc{L-1}.conv2, dec{L-2}.conv1 (up{L-2} first, then the concatenation with
 * the skip), dec{L-2}.conv2, ..., dec0.conv2, head: 4L - 1 units. Half i
 * (0: conv1, 1: conv2) of enc l is unit 2l + i, of dec l 4L - 4 - 2l + i. */
static int U_E(const ts_unet *m, int l, int i) { (void)m; return 2 * l + i; }
static int U_D(const ts_unet *m, int l, int i) { return 4 * m->cfg.levels - 4 - 2 * l + i; }
static int U_H(const ts_unet *m) { return 4 * m->cfg.levels - 2; }
static int here(const ts_unet *m, int u) { return u >= m->u0 && u < m->u1; }
static int resenc(const ts_unet *m) { return m->cfg.arch == TS_ARCH_RESENC; }
/* a residual encoder level's output: its last block's */
static ts_tensor *res_out(ts_unet *m, slot *s, int l) { return &s->rb[l][m->cfg.res_blocks[l] - 1].c2.a; }
/* The residual encoder's level l in two units: enc l.conv1 the stem (l =
 * 0) and blocks 0 .. nb-2, enc l.conv2 the last block nb-1; the unit of
 * block j */
static int U_RB(const ts_unet *m, int l, int j) { return U_E(m, l, j == m->cfg.res_blocks[l] - 1); }
/* enc l.conv1 produces a tensor for enc l.conv2 (TEm(l)): it holds a block or the stem */
static int res_mid(const ts_unet *m, int l) { return l == 0 || m->cfg.res_blocks[l] > 1; }
/* the unit that consumes enc l's output along the encoder: the one holding
 * level l+1's first block (resenc), or the max-pool (enc l+1.conv1) */
static int U_NEXT(const ts_unet *m, int l) { return resenc(m) ? U_RB(m, l + 1, 0) : U_E(m, l + 1, 0); }
/* producer unit of tensor t */
static int producer(const ts_unet *m, int t)
{
    const int L = m->cfg.levels, l = t % L, kind = t / L; /* TE, TD, TEm, TDm, TDS */
    return kind == 0 ? U_E(m, l, 1) : kind == 1 ? U_D(m, l, 1) : kind == 2 ? U_E(m, l, 0) : kind == 3 ? U_D(m, l, 0)
                                                                                           : U_D(m, l, 1);
}
/* a tensor's activation in slot s: the producer's output here, or what arrived */
static ts_tensor *act(ts_unet *m, slot *s, int t)
{
    const int L = m->cfg.levels, l = t % L, kind = t / L;
    if (!here(m, producer(m, t))) return &s->rx[t];
    if (kind == 4) return &s->dsl[l];
    if (kind == 0 && resenc(m)) return res_out(m, s, l);
    if (kind == 2 && resenc(m)) return m->cfg.res_blocks[l] > 1 ? &s->rb[l][m->cfg.res_blocks[l] - 2].c2.a : &s->stem.a;
    return kind == 0 ? &s->enc[l].a[1] : kind == 1 ? &s->dec[l].a[1] : kind == 2 ? &s->enc[l].a[0] : &s->dec[l].a[0];
}
/* the input of up{l} (the decoder path's tensor one level down) and of the head */
static int up_input(const ts_unet *m, int l) { return l == m->cfg.levels - 2 ? l + 1 : m->cfg.levels + l + 1; }
static int head_input(const ts_unet *m) { return m->cfg.levels == 1 ? 0 : m->cfg.levels; }
static int mid_tensor(const ts_unet *m, int enc, int l) { return (enc ? 2 : 3) * m->cfg.levels + l; }
static int ds_tensor(const ts_unet *m, int l) { return 4 * m->cfg.levels + l; }
/* level l is checkpointed; the unit of half i of a block */
static int ck(const ts_unet *m, int l) { return (int)(m->ckpt >> l & 1u); }
static int U_B(const ts_unet *m, const block *b, int i) { return b->enc ? U_E(m, b->level, i) : U_D(m, b->level, i); }


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

static void free_acts(ts_unet *m);

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
    free_acts(m);
    m->split_on = s != NULL;
    if (s) m->split = *s;
    else memset(&m->split, 0, sizeof m->split);
}

int ts_unet_set_checkpoint(ts_unet *m, unsigned levels)
{
    if (levels >> m->cfg.levels)
        return TS_ERR(TS_ERR_ARG, "unet: checkpointed levels 0x%x, but the model has levels 0..%d", levels, m->cfg.levels - 1);
    if (levels == m->ckpt) return 0;
    free_acts(m);
    m->ckpt = m->cfg.ckpt_levels = levels;
    return 0;
}

unsigned ts_unet_checkpoint(const ts_unet *m) { return m->ckpt; }

void ts_unet_set_loss_scale(ts_unet *m, float f) { m->loss_scale = f; }
void ts_unet_set_precision(ts_unet *m, ts_precision p) { m->cfg.precision = p; }
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

static void free_acts(ts_unet *m)
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
    m->halo_bytes = 0;
    m->n = 0;
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
const ts_tensor *ts_unet_logits(const ts_unet *m) { return ts_unet_logits_slot(m, 0); }
const ts_tensor *ts_unet_logits_slot(const ts_unet *m, int slot)
{
    static const ts_tensor none = {0};
    return m->slots && slot >= 0 && slot < m->nslots ? &m->slots[slot].logits : &none;
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
    free_acts(m);
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

/* the level of tensor t */
static int tensor_level(const ts_unet *m, int t) { return t % m->cfg.levels; }

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

/* t as a view of recompute buffer r (RS_*, or RS_N: the pool indices), or
 * allocated when the level is not checkpointed; the scratch is counted once
 * (alloc_scratch) */
static int alloc_or_view(ts_unet *m, int view, int r, ts_tensor *t, ts_dtype dt, int64_t n, int64_t d, int64_t h,
                         int64_t w, int64_t c)
{
    if (!view) return alloc5(m, t, dt, n, d, h, w, c);
    if (!m->dry) *t = ts_tensor_view(r < RS_N ? m->rs[r].data : m->rsidx.data, dt, 5, (const int64_t[]){n, d, h, w, c});
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
        free_acts(m);
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
    if (resenc(m) && m->split_on) TS_CHECK(alloc_strided(m, n, d, h, w));
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
    size_t s = own(&x->x) + own(&x->logits) + own(&x->dlogits) + cacts_bytes(&x->stem);
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

/* ------------------------------------------------------------ forward */

static ts_tensor V(const ts_unet *m, int i) { return ts_arena_value(m->arena, i); }
static ts_tensor G(const ts_unet *m, int i) { return ts_arena_grad(m->arena, i); }

/* norms with the ReLU that follows them fused (leaky ReLU: applied after the norm) */
static ts_norm_opts norm_opts(const ts_unet *m)
{
    ts_norm_opts o = {m->cfg.eps, m->cfg.momentum, m->cfg.groups, m->cfg.act == TS_ACT_RELU, NULL, NULL};
    if (m->cfg.norm == TS_NORM_BATCH && m->norm_sync) {
        o.sync = m->norm_sync;
        o.sync_ctx = m->norm_ctx;
    } else if (m->split_on) { /* the statistics of a sample are those of all its boxes */
        o.sync = m->split.reduce;
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

/* norm i of a block and its ReLU: a[i] from y[i]. again = 1: the
 * recomputation in backward of a checkpointed level, which leaves batch
 * norm's running statistics and counter as the forward left them */
static int norm_forward(ts_unet *m, const block *b, bacts *x, int i, int train, int again)
{
    const ts_norm_opts o = norm_opts(m);
    {
        ts_tensor g = V(m, b->nw[i]), be = V(m, b->nb[i]);
        switch (m->cfg.norm) {
        case TS_NORM_BATCH: {
            ts_tensor rm = V(m, b->rm[i]), rv = V(m, b->rv[i]), nbt = V(m, b->nbt[i]);
            const int update = train && !again; /* eval mode reads them */
            TIMED(m, TS_PROF_NORM, ts_batchnorm_forward(&x->y[i], &g, &be, update || !train ? &rm : NULL,
                                                        update || !train ? &rv : NULL, train, &o, &x->a[i], &x->smean[i],
                                                        &x->sinv[i]));
            if (update) (*(int64_t *)nbt.data)++;
            break;
        }
        case TS_NORM_GROUP:
            TIMED(m, TS_PROF_NORM, ts_groupnorm_forward(&x->y[i], &g, &be, &o, &x->a[i], &x->smean[i], &x->sinv[i]));
            break;
        case TS_NORM_INSTANCE:
            TIMED(m, TS_PROF_NORM, ts_instancenorm_forward(&x->y[i], &g, &be, &o, &x->a[i], &x->smean[i], &x->sinv[i]));
            break;
        }
        if (m->cfg.act == TS_ACT_LEAKY) TIMED(m, TS_PROF_NORM, ts_relu_forward(&x->a[i], m->cfg.slope, &x->a[i]));
    }
    return 0;
}

/* ---- the residual encoder (model.arch = resenc) ---- */

/* p's norm on x->y into out, followed by the activation if act; running
 * statistics as norm_forward (again: a recomputation, which leaves them) */
static int cn_norm_forward(ts_unet *m, const cnorm *p, cacts *x, ts_tensor *out, int act, int train, int again)
{
    ts_norm_opts o = norm_opts(m);
    o.relu = act && m->cfg.act == TS_ACT_RELU;
    ts_tensor g = V(m, p->nw), be = V(m, p->nb);
    switch (m->cfg.norm) {
    case TS_NORM_BATCH: {
        ts_tensor rm = V(m, p->rm), rv = V(m, p->rv), nbt = V(m, p->nbt);
        const int update = train && !again; /* eval mode reads them */
        TIMED(m, TS_PROF_NORM, ts_batchnorm_forward(&x->y, &g, &be, update || !train ? &rm : NULL,
                                                    update || !train ? &rv : NULL, train, &o, out, &x->smean, &x->sinv));
        if (update) (*(int64_t *)nbt.data)++;
        break;
    }
    case TS_NORM_GROUP:
        TIMED(m, TS_PROF_NORM, ts_groupnorm_forward(&x->y, &g, &be, &o, out, &x->smean, &x->sinv));
        break;
    case TS_NORM_INSTANCE:
        TIMED(m, TS_PROF_NORM, ts_instancenorm_forward(&x->y, &g, &be, &o, out, &x->smean, &x->sinv));
        break;
    }
    if (act && m->cfg.act == TS_ACT_LEAKY) TIMED(m, TS_PROF_NORM, ts_relu_forward(out, m->cfg.slope, out));
    return 0;
}

/* The voxel (id, ih, iw) of box x (n-th sample, C channels) or of its halo
 * h around it (layouts in layers.h); NULL where it reads as zero (no
 * neighbour there, or outside the halo). */
static const float *halo_voxel(const ts_tensor *x, const ts_halo *h, int64_t n, int64_t id, int64_t ih, int64_t iw)
{
    const int64_t D = x->shape[1], H = x->shape[2], W = x->shape[3], C = x->shape[4];
    const int64_t e1 = h->on[1], e2 = h->on[2];
    if (id < 0 || id >= D) {
        const float *f = id < 0 ? h->lo[0] : h->hi[0];
        if (!h->on[0] || !f || ih < -e1 || ih >= H + e1 || iw < -e2 || iw >= W + e2) return NULL;
        return f + ((n * (H + 2 * e1) + ih + e1) * (W + 2 * e2) + iw + e2) * C;
    }
    if (ih < 0 || ih >= H) {
        const float *f = ih < 0 ? h->lo[1] : h->hi[1];
        if (!h->on[1] || !f || iw < -e2 || iw >= W + e2) return NULL;
        return f + ((n * D + id) * (W + 2 * e2) + iw + e2) * C;
    }
    if (iw < 0 || iw >= W) {
        const float *f = iw < 0 ? h->lo[2] : h->hi[2];
        if (!h->on[2] || !f) return NULL;
        return f + ((n * D + id) * H + ih) * C;
    }
    return (const float *)x->data + (((n * D + id) * H + ih) * W + iw) * C;
}

/* out = box x grown by one voxel along each dim ([N, D+1, H+1, W+1, C]),
 * on the low side (hi = 0: out's voxel i is x's i - 1) or the high side
 * (hi = 1: out's voxel i is x's i), the added voxels from x's halo h (zero
 * where h has none: the volume's border, an unsplit dim) */
static void halo_grow(const ts_tensor *x, const ts_halo *h, int hi, ts_tensor *out)
{
    const int64_t N = x->shape[0], D = x->shape[1] + 1, H = x->shape[2] + 1, W = x->shape[3] + 1, C = x->shape[4];
    const int64_t o = hi ? 0 : -1;
    float *dst = out->data;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t a = 0; a < D; a++)
            for (int64_t b = 0; b < H; b++)
                for (int64_t c = 0; c < W; c++) {
                    const float *src = halo_voxel(x, h, n, a + o, b + o, c + o);
                    float *v = dst + (((n * D + a) * H + b) * W + c) * C;
                    if (src) memcpy(v, src, sizeof(float) * (size_t)C);
                    else memset(v, 0, sizeof(float) * (size_t)C);
                }
}

/* a view of scratch t shaped [N, D+1, H+1, W+1, C] for box x of [N, D, H, W] with C channels */
static ts_tensor grown(const ts_tensor *t, const ts_tensor *x, int64_t C)
{
    return ts_tensor_view(t->data, TS_FLOAT32, 5,
                          (const int64_t[]){x->shape[0], x->shape[1] + 1, x->shape[2] + 1, x->shape[3] + 1, C});
}

/* p's conv on in into x->y. On a split a 3x3x3 conv reads in's halo: at
 * stride 1 the split kernels (interior while the halo travels), at stride
 * 2 (padding 1, even box edges at even offsets) output voxel o reads the
 * input voxels 2o-1 .. 2o+1, so only the low halo: in grown by it on the
 * low side convolved with padding 0. A 1x1x1 conv reads its own box. */
static int cn_conv_forward(ts_unet *m, const cnorm *p, cacts *x, const ts_tensor *in)
{
    ts_tensor w = V(m, p->cw), b = V(m, p->cb);
    if (!m->split_on || p->k == 1) {
        TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_forward(in, &w, &b, p->stride, p->k / 2, &x->y));
        return 0;
    }
    if (p->stride == 1) return conv3_forward(m, &x->xh, in, NULL, &w, &b, &x->y);
    TS_TRY(halo_start(m, in, NULL, &x->xh));
    TS_TRY(halo_wait(m));
    ts_tensor g = grown(&m->sx, in, p->cin);
    TIMED(m, TS_PROF_HALO, (halo_grow(in, &x->xh, 0, &g), 0));
    TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_forward(&g, &w, &b, p->stride, 0, &x->y));
    return 0;
}

/* p's conv on in into x->y, then its norm (and act) into x->a */
static int cn_forward(ts_unet *m, const cnorm *p, cacts *x, const ts_tensor *in, int act, int train, int again)
{
    TS_TRY(cn_conv_forward(m, p, x, in));
    return cn_norm_forward(m, p, x, &x->a, act, train, again);
}

/* a residual block on in: out (x->c2.a) = act(norm2(conv2(act(norm1(conv1(in))))) + skip) */
static int rblock_forward(ts_unet *m, const rblock *r, racts *x, const ts_tensor *in, int train)
{
    TS_TRY(cn_forward(m, &r->c1, &x->c1, in, 1, train, 0));
    TS_TRY(cn_forward(m, &r->c2, &x->c2, &x->c1.a, 0, train, 0));
    if (r->skip) TS_TRY(cn_forward(m, &r->sk, &x->sk, in, 0, train, 0));
    const double t0 = ts_time_now();
    const float *k = r->skip ? x->sk.a.data : in->data, slope = m->cfg.act == TS_ACT_LEAKY ? m->cfg.slope : 0.0f;
    float *o = x->c2.a.data;
    const int64_t n = ts_tensor_numel(&x->c2.a);
#pragma omp parallel for schedule(dynamic, 16384)
    for (int64_t i = 0; i < n; i++) {
        const float v = o[i] + k[i];
        o[i] = v > 0.0f ? v : slope * v;
    }
    m->prof[TS_PROF_OTHER] += ts_time_now() - t0;
    return 0;
}

/* the input of block j of residual encoder level l: the previous block's
 * output, the stem's, or enc l-1's output (here or arrived); the last
 * block's comes along the edge from enc l.conv1 (TEm(l)) when that unit
 * holds anything */
static ts_tensor *block_in(ts_unet *m, slot *s, int l, int j)
{
    if (j == m->cfg.res_blocks[l] - 1) return act(m, s, res_mid(m, l) ? mid_tensor(m, 1, l) : l - 1);
    return j ? &s->rb[l][j - 1].c2.a : l ? act(m, s, l - 1) : &s->stem.a;
}

/* encoder level l's unit enc l.conv1 (half 0: the stem at level 0, from
 * the image in s->x, then the blocks but the last) or enc l.conv2 (half 1:
 * the last block) */
static int resenc_forward(ts_unet *m, slot *s, int l, int half, int train)
{
    const int nb = m->cfg.res_blocks[l];
    if (l == 0 && !half) TS_TRY(cn_forward(m, &m->stem, &s->stem, &s->x, 1, train, 0));
    for (int j = half ? nb - 1 : 0; j < (half ? nb : nb - 1); j++)
        TS_TRY(rblock_forward(m, &m->rb[l][j], &s->rb[l][j], block_in(m, s, l, j), train));
    return 0;
}

/* conv i of a block, its norm and ReLU: y[i], a[i] from in (or the
 * concatenation [in, in2], a decoder's conv 0) */
static int half_forward(ts_unet *m, const block *b, bacts *x, int i, const ts_tensor *in, const ts_tensor *in2, int train)
{
    ts_tensor w = V(m, b->cw[i]), bias = V(m, b->cb[i]);
    TS_TRY(conv3_forward(m, &x->xh[i], in, in2, &w, &bias, &x->y[i]));
    return norm_forward(m, b, x, i, train, 0);
}

/* the input of enc l's first conv below level 0 (the max-pool of the level
 * above: pool[l], pidx[l]) or of dec l's (up{l}: up[l]) */
static int block_input(ts_unet *m, slot *s, int enc, int l)
{
    if (enc) {
        if (l > 0) TIMED(m, TS_PROF_POOL, ts_maxpool3d_forward(act(m, s, l - 1), 2, &s->pool[l], &s->pidx[l]));
        return 0;
    }
    ts_tensor w = V(m, m->upw[l]), b = V(m, m->upb[l]);
    TIMED(m, TS_PROF_CONVT, ts_convt3d_forward(act(m, s, up_input(m, l)), &w, &b, 2, &s->up[l]));
    return 0;
}

static slot *get_slot(ts_unet *m, int k)
{
    return m->slots && k >= 0 && k < m->nslots ? &m->slots[k] : NULL;
}

int ts_unet_forward_slot(ts_unet *m, int k, const ts_tensor *image, int train)
{
    const ts_unet_cfg *c = &m->cfg;
    TS_TRY(ts_nn_set_conv_precision(c->precision));
    const int L = c->levels;
    if (here(m, U_E(m, 0, 0))) {
        TS_TRY(ts_tensor_check_shape(image, "input image", 5, (const int64_t[]){-1, c->in_channels, -1, -1, -1}));
        if (image->dtype != TS_FLOAT32) return TS_ERR(TS_ERR_ARG, "input image must be float32");
        TS_TRY(ts_unet_setup(m, (int)image->shape[0], (int)image->shape[2], (int)image->shape[3], (int)image->shape[4]));
    }
    slot *s = get_slot(m, k);
    if (!s) return TS_ERR(TS_ERR_ARG, "unet: forward on slot %d before ts_unet_setup (%d slots)", k, m->nslots);
    s->have_dlogits = 0;
    for (int u = m->u0; u < m->u1; u++) {
        if (u > m->u0 && m->unit_hook) m->unit_hook(m->unit_ctx, u - 1, 0);
        if (u < 2 * L && resenc(m)) { /* residual encoder level l: stem and blocks but the last, or the last */
            if (u == 0) TIMED(m, TS_PROF_OTHER, ts_tensor_to_channels_last(image, &s->x));
            TS_TRY(resenc_forward(m, s, u / 2, u % 2, train));
        } else if (u < 2 * L) { /* enc l: pool the level above (or take the image) and conv 1, or conv 2 */
            const int l = u / 2, i = u % 2;
            if (i == 1) {
                TS_TRY(half_forward(m, &m->enc[l], &s->enc[l], 1, act(m, s, mid_tensor(m, 1, l)), NULL, train));
                continue;
            }
            if (l == 0) TIMED(m, TS_PROF_OTHER, ts_tensor_to_channels_last(image, &s->x));
            else TS_TRY(block_input(m, s, 1, l));
            TS_TRY(half_forward(m, &m->enc[l], &s->enc[l], 0, l ? &s->pool[l] : &s->x, NULL, train));
        } else if (u < U_H(m)) { /* dec l: up{l} from one level down and conv 1 on [up, skip], or conv 2 */
            const int l = L - 2 - (u - 2 * L) / 2, i = (u - 2 * L) % 2;
            if (i == 1) {
                TS_TRY(half_forward(m, &m->dec[l], &s->dec[l], 1, act(m, s, mid_tensor(m, 0, l)), NULL, train));
                if (m->dsw[l] >= 0) { /* deep supervision head */
                    ts_tensor dw = V(m, m->dsw[l]), db = V(m, m->dsb[l]);
                    TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_forward(&s->dec[l].a[1], &dw, &db, 1, 0, &s->dsl[l]));
                }
                continue;
            }
            TS_TRY(block_input(m, s, 0, l));
            TS_TRY(half_forward(m, &m->dec[l], &s->dec[l], 0, &s->up[l], act(m, s, l), train));
        } else {
            ts_tensor hw = V(m, m->headw), hb = V(m, m->headb);
            TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_forward(act(m, s, head_input(m)), &hw, &hb, 1, 0, &s->logits));
        }
    }
    s->train_forward = train;
    if (m->unit_hook) m->unit_hook(m->unit_ctx, m->u1 - 1, 0);
    return 0;
}

int ts_unet_forward(ts_unet *m, const ts_tensor *image, int train) { return ts_unet_forward_slot(m, 0, image, train); }

int ts_unet_loss_slot(ts_unet *m, int k, const ts_tensor *labels, int with_grad, double *loss)
{
    const ts_unet_cfg *c = &m->cfg;
    slot *s = get_slot(m, k);
    if (!m->n || !s) return TS_ERR(TS_ERR_ARG, "unet: loss before forward");
    if (!here(m, U_H(m))) return TS_ERR(TS_ERR_ARG, "unet: the loss belongs to the stage holding the head");
    TS_TRY(ts_tensor_check_shape(labels, "labels", 4, (const int64_t[]){m->n, m->d, m->h, m->w}));
    if (labels->dtype != TS_UINT8) return TS_ERR(TS_ERR_ARG, "labels must be uint8");
    ts_loss_opts o = {c->ignore_index, c->weighted ? c->class_weights : NULL, 1e-5f, NULL, NULL};
    if (m->split_on) { /* the loss of whole samples over their boxes */
        o.sync = m->split.reduce;
        o.sync_ctx = m->split.ctx;
    }
    double total = 0, l, t0 = ts_time_now();
    /* level 0 (the head), then with deep supervision the levels with a head ds{lv} against the labels
     * downsampled by nearest-exact sampling (voxel i of level lv is voxel 2^lv i + 2^(lv-1)), weighted */
    for (int lv = 0; lv < (c->levels > 1 ? c->levels - 1 : 1); lv++) {
        const double wl = ts_unet_ds_weight(c, lv);
        if (wl <= 0 || (lv > 0 && m->dsw[lv] < 0)) continue;
        const float f = (float)(m->loss_scale * wl);
        /* ds{lv}'s logits: made here, or arrived from the stage holding dec lv.conv2 */
        ts_tensor *lg = lv ? act(m, s, ds_tensor(m, lv)) : &s->logits, *dl = lv ? &s->dsd[lv] : &s->dlogits;
        const ts_tensor *lab = labels;
        if (lv) {
            const int64_t D = m->d >> lv, H = m->h >> lv, W = m->w >> lv, o0 = (int64_t)1 << (lv - 1);
            const uint8_t *src = labels->data;
            uint8_t *dst = s->dslab[lv].data;
            for (int64_t n = 0; n < m->n; n++)
                for (int64_t z = 0; z < D; z++)
                    for (int64_t y = 0; y < H; y++)
                        for (int64_t x = 0; x < W; x++)
                            dst[((n * D + z) * H + y) * W + x] =
                                src[((n * m->d + (z << lv) + o0) * m->h + (y << lv) + o0) * m->w + (x << lv) + o0];
            lab = &s->dslab[lv];
        }
        if (with_grad) ts_tensor_zero(dl);
        if (c->loss & TS_LOSS_CE) {
            if (with_grad) TS_TRY(ts_softmax_ce_forward_backward(lg, lab, &o, f, &l, dl));
            else TS_TRY(ts_softmax_ce_forward(lg, lab, &o, &l));
            total += wl * l;
        }
        if (c->loss & TS_LOSS_DICE) {
            if (with_grad) TS_TRY(ts_dice_forward_backward(lg, lab, &o, f, &l, dl));
            else TS_TRY(ts_dice_forward(lg, lab, &o, &l));
            total += wl * l;
        }
    }
    s->have_dlogits = with_grad;
    m->prof[TS_PROF_LOSS] += ts_time_now() - t0;
    *loss = total;
    return 0;
}

int ts_unet_loss(ts_unet *m, const ts_tensor *labels, int with_grad, double *loss)
{
    return ts_unet_loss_slot(m, 0, labels, with_grad, loss);
}

/* ----------------------------------------------------------- backward */

/* Backward of a 3x3x3, stride 1 conv on a split (conv i of a block, or a
 * residual encoder's): dy starts its halo exchange into gh, the weight
 * gradient is taken while it travels (it reads the input's halo xh kept
 * from forward; then the gradients of arena entries iw, ib are final), then
 * the input gradient (to dx, and dx2 for the second part of a concatenated
 * input; dx NULL: not needed). */
static int conv3_backward_split(ts_unet *m, const ts_halo *xh, ts_halo *gh, const ts_tensor *x, const ts_tensor *x2,
                                const ts_tensor *w, const ts_tensor *dy, ts_tensor *dx, ts_tensor *dx2, ts_tensor *dw,
                                ts_tensor *db, int iw, int ib)
{
    const ts_conv_split xs = {xh, TS_CONV_ALL, halo_progress, m}, dys = {gh, TS_CONV_ALL, NULL, NULL};
    if (dx) TS_TRY(halo_start(m, dy, NULL, gh));
    if (x2) TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_cat_backward_split(x, x2, w, &xs, &dys, dy, NULL, NULL, dw, db));
    else TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward_split(x, w, &xs, &dys, dy, NULL, dw, db));
    ready2(m, iw, ib);
    if (!dx) return 0;
    TS_TRY(halo_wait(m));
    if (x2) TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_cat_backward_split(x, x2, w, &xs, &dys, dy, dx, dx2, NULL, NULL));
    else TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward_split(x, w, &xs, &dys, dy, dx, NULL, NULL));
    return 0;
}

/* Backward of conv i of a block with its norm and ReLU: g holds d(a[i]) on
 * entry; the input gradient goes to dx (may be in itself; NULL: not
 * needed) and, for the concatenation [in, in2], dx2. */
static int half_backward(ts_unet *m, const block *b, bacts *xa, int i, int train, ts_tensor *in, ts_tensor *in2,
                         ts_tensor *g, ts_tensor *dx, ts_tensor *dx2)
{
    const ts_norm_opts o = norm_opts(m);
    if (m->cfg.act == TS_ACT_LEAKY) TIMED(m, TS_PROF_NORM, ts_relu_backward(&xa->a[i], m->cfg.slope, g, g));
    {
        ts_tensor gm = V(m, b->nw[i]), dgm = G(m, b->nw[i]), dbe = G(m, b->nb[i]);
        /* norm + ReLU backward; the input gradient overwrites the norm's input y[i] */
        switch (m->cfg.norm) {
        case TS_NORM_BATCH:
            TIMED(m, TS_PROF_NORM, ts_batchnorm_backward(&xa->y[i], &xa->a[i], &gm, &xa->smean[i], &xa->sinv[i], train,
                                                         &o, g, &xa->y[i], &dgm, &dbe));
            break;
        case TS_NORM_GROUP:
            TIMED(m, TS_PROF_NORM, ts_groupnorm_backward(&xa->y[i], &xa->a[i], &gm, &xa->smean[i], &xa->sinv[i], &o, g,
                                                         &xa->y[i], &dgm, &dbe));
            break;
        case TS_NORM_INSTANCE:
            TIMED(m, TS_PROF_NORM, ts_instancenorm_backward(&xa->y[i], &xa->a[i], &gm, &xa->smean[i], &xa->sinv[i], &o, g,
                                                            &xa->y[i], &dgm, &dbe));
            break;
        }
        ready2(m, b->nw[i], b->nb[i]);
        ts_tensor w = V(m, b->cw[i]), dw = G(m, b->cw[i]), db = G(m, b->cb[i]);
        if (m->split_on)
            return conv3_backward_split(m, &xa->xh[i], &m->gh[b->level], in, in2, &w, &xa->y[i], dx, dx2, &dw, &db,
                                        b->cw[i], b->cb[i]);
        /* weight gradient first: dx may overwrite the input */
        if (in2) {
            TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_cat_backward(in, in2, &w, 1, 1, &xa->y[i], NULL, NULL, &dw, &db));
            ready2(m, b->cw[i], b->cb[i]);
            TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_cat_backward(in, in2, &w, 1, 1, &xa->y[i], dx, dx2, NULL, NULL));
            return 0;
        }
        TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward(in, &w, 1, 1, &xa->y[i], NULL, &dw, &db));
        ready2(m, b->cw[i], b->cb[i]);
        if (dx) TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward(in, &w, 1, 1, &xa->y[i], dx, NULL, NULL));
    }
    return 0;
}

/* ---- the residual encoder's backward ---- */

/* Backward of p's conv (dy in x->y): the weight gradient, then the input
 * gradient to dx (NULL: not needed). On a split, a 3x3x3 conv at stride 1
 * takes the split kernels; at stride 2 the weight gradient convolves in
 * grown by its low halo (as forward), and input voxel i, which the outputs
 * ceil((i-1)/2) .. floor((i+1)/2) read (a box's last voxel: the next box's first), needs dy's upper halo voxel: dy grown by it on
 * the high side, and the input gradient of in grown by one voxel on the
 * high side (padding 1), of which the box is kept. */
static int cn_conv_backward(ts_unet *m, const cnorm *p, cacts *x, const ts_tensor *in, ts_tensor *dx)
{
    ts_tensor w = V(m, p->cw), dw = G(m, p->cw), db = G(m, p->cb);
    if (m->split_on && p->k == 3 && p->stride == 1)
        return conv3_backward_split(m, &x->xh, &m->gh[p->level], in, NULL, &w, &x->y, dx, NULL, &dw, &db,
                                    p->cw, p->cb);
    if (!m->split_on || p->k == 1) {
        TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward(in, &w, p->stride, p->k / 2, &x->y, NULL, &dw, &db));
        ready2(m, p->cw, p->cb);
        if (dx) TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward(in, &w, p->stride, p->k / 2, &x->y, dx, NULL, NULL));
        return 0;
    }
    ts_halo *gh = &m->gh[p->level];
    if (dx) TS_TRY(halo_start(m, &x->y, NULL, gh));
    ts_tensor g = grown(&m->sx, in, p->cin);
    TIMED(m, TS_PROF_HALO, (halo_grow(in, &x->xh, 0, &g), 0));
    TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward(&g, &w, p->stride, 0, &x->y, NULL, &dw, &db));
    ready2(m, p->cw, p->cb);
    if (!dx) return 0;
    TS_TRY(halo_wait(m));
    ts_tensor gy = grown(&m->sy, &x->y, p->cout);
    TIMED(m, TS_PROF_HALO, (halo_grow(&x->y, gh, 1, &gy), 0));
    TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward(&g, &w, p->stride, 1, &gy, &g, NULL, NULL));
    const double t0 = ts_time_now();
    const int64_t N = dx->shape[0], D = dx->shape[1], H = dx->shape[2], W = dx->shape[3], C = dx->shape[4];
    const float *src = g.data;
    float *dst = dx->data;
#pragma omp parallel for collapse(3) schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t a = 0; a < D; a++)
            for (int64_t b = 0; b < H; b++)
                memcpy(dst + ((n * D + a) * H + b) * W * C, src + ((n * (D + 1) + a) * (H + 1) + b) * (W + 1) * C,
                       sizeof(float) * (size_t)(W * C));
    m->prof[TS_PROF_OTHER] += ts_time_now() - t0;
    return 0;
}

/* Backward of cnorm p (its act if act): g holds d(x->a) (changed in place by a
 * leaky ReLU), the norm's input gradient overwrites x->y, the conv's input
 * gradient goes to dx (NULL: not needed); in is the conv's forward input. */
static int cn_backward(ts_unet *m, const cnorm *p, cacts *x, const ts_tensor *in, int act, int train, ts_tensor *g,
                       ts_tensor *dx)
{
    ts_norm_opts o = norm_opts(m);
    o.relu = act && m->cfg.act == TS_ACT_RELU;
    if (act && m->cfg.act == TS_ACT_LEAKY) TIMED(m, TS_PROF_NORM, ts_relu_backward(&x->a, m->cfg.slope, g, g));
    ts_tensor gm = V(m, p->nw), dgm = G(m, p->nw), dbe = G(m, p->nb);
    switch (m->cfg.norm) {
    case TS_NORM_BATCH:
        TIMED(m, TS_PROF_NORM, ts_batchnorm_backward(&x->y, &x->a, &gm, &x->smean, &x->sinv, train, &o, g, &x->y, &dgm,
                                                     &dbe));
        break;
    case TS_NORM_GROUP:
        TIMED(m, TS_PROF_NORM, ts_groupnorm_backward(&x->y, &x->a, &gm, &x->smean, &x->sinv, &o, g, &x->y, &dgm, &dbe));
        break;
    case TS_NORM_INSTANCE:
        TIMED(m, TS_PROF_NORM, ts_instancenorm_backward(&x->y, &x->a, &gm, &x->smean, &x->sinv, &o, g, &x->y, &dgm,
                                                        &dbe));
        break;
    }
    ready2(m, p->nw, p->nb);
    return cn_conv_backward(m, p, x, in, dx);
}

/* Backward of residual block r on input in: g holds d(out) (consumed), gc1
 * is scratch for d(conv1's activation), dx receives d(in) (may be gc1), tmp
 * is scratch shaped like in (may be g). */
static int rblock_backward(ts_unet *m, const rblock *r, racts *x, const ts_tensor *in, int train, ts_tensor *g,
                           ts_tensor *gc1, ts_tensor *dx, ts_tensor *tmp)
{
    /* the act after the sum; then g is the gradient of both the main path's norm2 and the skip */
    TIMED(m, TS_PROF_OTHER, ts_relu_backward(&x->c2.a, m->cfg.act == TS_ACT_LEAKY ? m->cfg.slope : 0.0f, g, g));
    TS_TRY(cn_backward(m, &r->c2, &x->c2, &x->c1.a, 0, train, g, gc1));
    if (r->skip) TS_TRY(cn_backward(m, &r->sk, &x->sk, in, 0, train, g, tmp));
    TS_TRY(cn_backward(m, &r->c1, &x->c1, in, 1, train, gc1, dx));
    const double t0 = ts_time_now();
    const float *k = r->skip ? tmp->data : g->data;
    float *d = dx->data;
    const int64_t n = ts_tensor_numel(dx);
#pragma omp parallel for schedule(dynamic, 16384)
    for (int64_t i = 0; i < n; i++) d[i] += k[i];
    m->prof[TS_PROF_OTHER] += ts_time_now() - t0;
    return 0;
}

/* A checkpointed level's residual block before its backward: what the
 * recompute scratch held in forward, from the kept input by the forward's
 * kernels (halos exchanged and batch-norm statistics summed again, running
 * statistics left): conv1, norm1 and its act, conv2, and the skip's conv
 * and norm. norm2 is not redone: its statistics are kept, and its output
 * became the block's output (kept). */
static int recompute_rblock(ts_unet *m, const rblock *r, racts *x, const ts_tensor *in, int train)
{
    TS_TRY(cn_forward(m, &r->c1, &x->c1, in, 1, train, 1));
    TS_TRY(cn_conv_forward(m, &r->c2, &x->c2, &x->c1.a));
    if (r->skip) TS_TRY(cn_forward(m, &r->sk, &x->sk, in, 0, train, 1));
    return 0;
}

/* Backward of residual encoder level l's unit enc l.conv2 (half 1: the
 * last block) or enc l.conv1 (half 0: the other blocks, the stem). d(the
 * level's output) is gin[l] (from the level below's first block, or
 * up{l-1}) plus dskip[l] (the decoder's skip); the blocks in reverse
 * alternate between gin[l] and rg[l], so the last block leaves d(its
 * input) in rg[l], where enc l.conv1 starts (and where a gradient for it
 * arrives from another stage); the first block of a level l > 0 writes
 * d(level l-1's output) to gin[l-1] (rg[l-1] its scratch); level 0 ends
 * with the stem. */
static int resenc_backward(ts_unet *m, slot *s, int l, int half, int train)
{
    const int nb = m->cfg.res_blocks[l];
    ts_tensor *a = half ? &m->gin[l] : &m->rg[l], *b = half ? &m->rg[l] : &m->gin[l];
    if (half && l < m->cfg.levels - 1) {
        const double t0 = ts_time_now();
        float *g = a->data;
        const float *d = m->dskip[l].data;
        const int64_t n = ts_tensor_numel(a);
#pragma omp parallel for schedule(dynamic, 16384)
        for (int64_t k = 0; k < n; k++) g[k] += d[k];
        m->prof[TS_PROF_OTHER] += ts_time_now() - t0;
    }
    for (int j = half ? nb - 1 : nb - 2; j >= (half ? nb - 1 : 0); j--) {
        const ts_tensor *in = block_in(m, s, l, j);
        if (ck(m, l)) TS_TRY(recompute_rblock(m, &m->rb[l][j], &s->rb[l][j], in, train));
        if (j == 0 && l > 0) {
            TS_TRY(rblock_backward(m, &m->rb[l][j], &s->rb[l][j], in, train, a, b, &m->gin[l - 1], &m->rg[l - 1]));
        } else {
            TS_TRY(rblock_backward(m, &m->rb[l][j], &s->rb[l][j], in, train, a, b, b, a));
            ts_tensor *t = a;
            a = b;
            b = t;
        }
    }
    if (l == 0 && !half) TS_TRY(cn_backward(m, &m->stem, &s->stem, &s->x, 1, train, a, NULL));
    return 0;
}

/* A checkpointed level's block before its backward: what the recompute
 * scratch held in forward, made again from the kept inputs by the
 * forward's kernels in its order (first conv's input, conv, norm, second
 * conv), for the halves this stage holds. The first norm is not redone
 * where its output stayed in the slot (it leaves the stage), the second
 * never (its output and statistics are kept). */
static int recompute_block(ts_unet *m, slot *s, int enc, int l, int train)
{
    const block *b = enc ? &m->enc[l] : &m->dec[l];
    bacts *x = enc ? &s->enc[l] : &s->dec[l];
    if (here(m, U_B(m, b, 0))) {
        ts_tensor w = V(m, b->cw[0]), bias = V(m, b->cb[0]);
        TS_TRY(block_input(m, s, enc, l));
        const ts_tensor *in = enc ? (l ? &s->pool[l] : &s->x) : &s->up[l];
        TS_TRY(conv3_forward(m, &x->xh[0], in, enc ? NULL : act(m, s, l), &w, &bias, &x->y[0]));
        if (here(m, U_B(m, b, 1))) TS_TRY(norm_forward(m, b, x, 0, train, 1));
    }
    if (here(m, U_B(m, b, 1))) {
        ts_tensor w = V(m, b->cw[1]), bias = V(m, b->cb[1]);
        TS_TRY(conv3_forward(m, &x->xh[1], act(m, s, mid_tensor(m, enc, l)), NULL, &w, &bias, &x->y[1]));
    }
    return 0;
}

/* before the backward of a checkpointed block's half i: the whole
 * recomputation at the last half the stage holds; the first conv's input
 * again before the first half if the second conv's output took its place */
static int recompute_half(ts_unet *m, slot *s, int enc, int l, int i, int train)
{
    if (!ck(m, l)) return 0;
    const block *b = enc ? &m->enc[l] : &m->dec[l];
    if (i == 1 || !here(m, U_B(m, b, 1))) return recompute_block(m, s, enc, l, train);
    return block_input(m, s, enc, l);
}

/* The stage's units in reverse. Gradient buffers (shared by the slots):
 * gin[l] receives the gradient of the level-l tensor a unit consumed (the
 * head's and up{l-1}'s input, the pooled enc l's output), dskip[l] that of
 * the skip dec l concatenated; enc l adds the two before its own backward.
 * Where the consumer is on another stage its contribution has arrived in
 * the same buffer (ts_unet_edge_tensors). */
int ts_unet_backward_slot(ts_unet *m, int k)
{
    const int L = m->cfg.levels;
    slot *s = get_slot(m, k);
    if (!s) return TS_ERR(TS_ERR_ARG, "unet: backward on slot %d before forward", k);
    TS_TRY(ts_nn_set_conv_precision(m->cfg.precision));
    if (here(m, U_H(m)) && !s->have_dlogits)
        return TS_ERR(TS_ERR_ARG, "unet: backward without a loss gradient (call ts_unet_loss)");
    s->have_dlogits = 0; /* the forward buffers are consumed */
    const int train = s->train_forward;
    for (int u = m->u1 - 1; u >= m->u0; u--) {
        if (u < m->u1 - 1 && m->unit_hook) m->unit_hook(m->unit_ctx, u + 1, 1);
        if (u == U_H(m)) {
            ts_tensor hw = V(m, m->headw), dhw = G(m, m->headw), dhb = G(m, m->headb);
            ts_tensor *in = act(m, s, head_input(m));
            TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward(in, &hw, 1, 0, &s->dlogits, NULL, &dhw, &dhb));
            ready2(m, m->headw, m->headb);
            TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward(in, &hw, 1, 0, &s->dlogits, &m->gin[0], NULL, NULL));
        } else if (u >= 2 * L) { /* dec l: conv 2, or conv 1 on [up, skip] (the up part over up[l] itself) and up{l} */
            const int l = L - 2 - (u - 2 * L) / 2, i = (u - 2 * L) % 2;
            TS_TRY(recompute_half(m, s, 0, l, i, train));
            if (i == 1 && m->dsw[l] >= 0) { /* deep supervision head: its input gradient (via dskip[l], free
                                             * until conv 1's backward) adds to gin[l] */
                ts_tensor hw = V(m, m->dsw[l]), dhw = G(m, m->dsw[l]), dhb = G(m, m->dsb[l]);
                ts_tensor *in = &s->dec[l].a[1];
                TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward(in, &hw, 1, 0, &s->dsd[l], NULL, &dhw, &dhb));
                ready2(m, m->dsw[l], m->dsb[l]);
                TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward(in, &hw, 1, 0, &s->dsd[l], &m->dskip[l], NULL, NULL));
                float *g = m->gin[l].data;
                const float *d = m->dskip[l].data;
                const int64_t n = ts_tensor_numel(&m->gin[l]);
#pragma omp parallel for schedule(dynamic, 16384)
                for (int64_t k2 = 0; k2 < n; k2++) g[k2] += d[k2];
            }
            if (i == 1) { /* d(a[1]) in gin[l]; d(a[0]) goes to gin[l] too */
                TS_TRY(half_backward(m, &m->dec[l], &s->dec[l], 1, train, act(m, s, mid_tensor(m, 0, l)), NULL,
                                     &m->gin[l], &m->gin[l], NULL));
                continue;
            }
            TS_TRY(half_backward(m, &m->dec[l], &s->dec[l], 0, train, &s->up[l], act(m, s, l), &m->gin[l], &s->up[l],
                                 &m->dskip[l]));
            ts_tensor w = V(m, m->upw[l]), dw = G(m, m->upw[l]), db = G(m, m->upb[l]);
            TIMED(m, TS_PROF_CONVT,
                  ts_convt3d_backward(act(m, s, up_input(m, l)), &w, 2, &s->up[l], &m->gin[l + 1], &dw, &db));
            ready2(m, m->upw[l], m->upb[l]);
        } else if (resenc(m)) { /* residual encoder level l: its last block, or the others and the stem */
            TS_TRY(resenc_backward(m, s, u / 2, u % 2, train));
        } else { /* enc l: conv 2 (its output's gradient is the pool's plus the skip's), or conv 1 and the pool */
            const int l = u / 2, i = u % 2;
            if (i == 1) {
                if (l < L - 1) {
                    const double t0 = ts_time_now();
                    float *g = m->gin[l].data;
                    const float *d = m->dskip[l].data;
                    const int64_t n = ts_tensor_numel(&m->gin[l]);
#pragma omp parallel for schedule(dynamic, 16384)
                    for (int64_t k2 = 0; k2 < n; k2++) g[k2] += d[k2];
                    m->prof[TS_PROF_OTHER] += ts_time_now() - t0;
                }
                TS_TRY(recompute_half(m, s, 1, l, 1, train));
                TS_TRY(half_backward(m, &m->enc[l], &s->enc[l], 1, train, act(m, s, mid_tensor(m, 1, l)), NULL,
                                     &m->gin[l], &m->gin[l], NULL));
                continue;
            }
            TS_TRY(recompute_half(m, s, 1, l, 0, train));
            TS_TRY(half_backward(m, &m->enc[l], &s->enc[l], 0, train, l ? &s->pool[l] : &s->x, NULL, &m->gin[l],
                                 l ? &s->pool[l] : NULL, NULL));
            if (l > 0) TIMED(m, TS_PROF_POOL, ts_maxpool3d_backward(&s->pool[l], &s->pidx[l], 2, &m->gin[l - 1]));
        }
    }
    if (m->unit_hook) m->unit_hook(m->unit_ctx, m->u0, 1);
    return 0;
}

int ts_unet_backward(ts_unet *m) { return ts_unet_backward_slot(m, 0); }
