/* Private to src/model: the UNet3D's structures (a block's parameter
 * indices, a slot's activations, struct ts_unet), the numbering of its units
 * and tensors, and what its files share: unet.c (parameter table, create,
 * destroy, init, stages and edges), unet_acts.c (activation buffers and
 * their bytes), unet_forward.c (forward, loss), unet_backward.c (backward), unet_device.c
 * (the GPU engine: its choice, checks and host staging).
 *
 * Memory plan per level l (c_l channels): each conv block keeps its conv
 * outputs y[0..1] (norm inputs) and activations a[0..1]; the decoder keeps
 * the upsampled tensor (its first conv reads [upsampled, skip] without
 * forming the concatenation). Backward reuses the forward buffers for
 * gradients where the forward values are no longer needed (a norm's input
 * gradient overwrites its input y, a conv's input gradient overwrites its
 * input after the weight gradient is taken), plus per level one
 * incoming-gradient buffer gin[l] and the skip gradient dskip[l]. A
 * checkpointed level's pool/up, y[0], a[0] and y[1] are views of three
 * shared recompute buffers (rs[RS_IN] holds the first conv's input, later
 * the second conv's output, so backward makes the input twice), refilled
 * before its backward. */
#ifndef TS_MODEL_UNET_IMPL_H
#define TS_MODEL_UNET_IMPL_H

#include "src/model/unet.h"
#include "src/core/error.h"
#include "src/core/timer.h"
#include "src/core/device.h"

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
    ts_tensor lab; /* GPU engine: the labels of the loss, on the device */
    int train_forward; /* last forward was in train mode */
    int folded;        /* ... and its batch norms were folded into the convolutions (no backward) */
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
    int prof_sync; /* the GPU engine: each timed layer call waits for the device (ts_unet_set_profile_sync) */
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
    int device;        /* the GPU engine: activations and the arena's mirror on the device (unet_device.c) */
    int fold_eval;     /* ts_unet_set_fold_eval */
    int folding;       /* the forward under way folds its batch norms (eval, batch norm, CPU) */
    int winograd;      /* ts_unet_set_winograd */
    ts_tensor hx, hlab0, hlab, hlogits; /* its page-locked host staging: the channels-last image, the labels and
                                         * the downsampled labels (written only after ts_device_upload_wait), logits */
    ts_tensor dpack, hpack;      /* a split on the GPU: a box's halo packed on the device, and its host copy */
    int *ready, nready; /* GPU engine: the arena entries whose gradients became final in this backward, in order */
};

/* The layer units, one per conv (with what precedes it) and the head:
 * enc0.conv1 (the image), enc0.conv2, enc1.conv1 (max-pool first), ...,
 * enc{L-1}.conv2, dec{L-2}.conv1 (up{L-2} first, then the concatenation with
 * the skip), dec{L-2}.conv2, ..., dec0.conv2, head: 4L - 1 units. Half i
 * (0: conv1, 1: conv2) of enc l is unit 2l + i, of dec l 4L - 4 - 2l + i. */
static inline int U_E(const ts_unet *m, int l, int i) { (void)m; return 2 * l + i; }
static inline int U_D(const ts_unet *m, int l, int i) { return 4 * m->cfg.levels - 4 - 2 * l + i; }
static inline int U_H(const ts_unet *m) { return 4 * m->cfg.levels - 2; }
static inline int here(const ts_unet *m, int u) { return u >= m->u0 && u < m->u1; }
static inline int resenc(const ts_unet *m) { return m->cfg.arch == TS_ARCH_RESENC; }
/* a residual encoder level's output: its last block's */
static inline ts_tensor *res_out(ts_unet *m, slot *s, int l) { return &s->rb[l][m->cfg.res_blocks[l] - 1].c2.a; }
/* The residual encoder's level l in two units: enc l.conv1 the stem (l =
 * 0) and blocks 0 .. nb-2, enc l.conv2 the last block nb-1; the unit of
 * block j */
static inline int U_RB(const ts_unet *m, int l, int j) { return U_E(m, l, j == m->cfg.res_blocks[l] - 1); }
/* enc l.conv1 produces a tensor for enc l.conv2 (TEm(l)): it holds a block or the stem */
static inline int res_mid(const ts_unet *m, int l) { return l == 0 || m->cfg.res_blocks[l] > 1; }
/* the unit that consumes enc l's output along the encoder: the one holding
 * level l+1's first block (resenc), or the max-pool (enc l+1.conv1) */
static inline int U_NEXT(const ts_unet *m, int l) { return resenc(m) ? U_RB(m, l + 1, 0) : U_E(m, l + 1, 0); }
/* producer unit of tensor t */
static inline int producer(const ts_unet *m, int t)
{
    const int L = m->cfg.levels, l = t % L, kind = t / L; /* TE, TD, TEm, TDm, TDS */
    return kind == 0 ? U_E(m, l, 1) : kind == 1 ? U_D(m, l, 1) : kind == 2 ? U_E(m, l, 0) : kind == 3 ? U_D(m, l, 0)
                                                                                           : U_D(m, l, 1);
}
/* a tensor's activation in slot s: the producer's output here, or what arrived */
static inline ts_tensor *act(ts_unet *m, slot *s, int t)
{
    const int L = m->cfg.levels, l = t % L, kind = t / L;
    if (!here(m, producer(m, t))) return &s->rx[t];
    if (kind == 4) return &s->dsl[l];
    if (kind == 0 && resenc(m)) return res_out(m, s, l);
    if (kind == 2 && resenc(m)) return m->cfg.res_blocks[l] > 1 ? &s->rb[l][m->cfg.res_blocks[l] - 2].c2.a : &s->stem.a;
    return kind == 0 ? &s->enc[l].a[1] : kind == 1 ? &s->dec[l].a[1] : kind == 2 ? &s->enc[l].a[0] : &s->dec[l].a[0];
}
/* the input of up{l} (the decoder path's tensor one level down) and of the head */
static inline int up_input(const ts_unet *m, int l) { return l == m->cfg.levels - 2 ? l + 1 : m->cfg.levels + l + 1; }
static inline int head_input(const ts_unet *m) { return m->cfg.levels == 1 ? 0 : m->cfg.levels; }
static inline int mid_tensor(const ts_unet *m, int enc, int l) { return (enc ? 2 : 3) * m->cfg.levels + l; }
static inline int ds_tensor(const ts_unet *m, int l) { return 4 * m->cfg.levels + l; }
/* level l is checkpointed; the unit of half i of a block */
static inline int ck(const ts_unet *m, int l) { return (int)(m->ckpt >> l & 1u); }
static inline int U_B(const ts_unet *m, const block *b, int i) { return b->enc ? U_E(m, b->level, i) : U_D(m, b->level, i); }
/* the level of tensor t */
static inline int tensor_level(const ts_unet *m, int t) { return t % m->cfg.levels; }

/* arena entry i's value and gradient, where the layers read them (the GPU
 * engine's mirror: device views, but int64 counters stay on the host) */
static inline ts_tensor V(const ts_unet *m, int i)
{
    return m->device ? ts_arena_dev_value(m->arena, i) : ts_arena_value(m->arena, i);
}
static inline ts_tensor G(const ts_unet *m, int i)
{
    return m->device ? ts_arena_dev_grad(m->arena, i) : ts_arena_grad(m->arena, i);
}

/* runs call, adding its wall time to profile slot kind; returns on error */
#define TIMED(m, kind, call)                                   \
    do {                                                       \
        const double t0_ = ts_time_now();                      \
        TS_TRY(call);                                          \
        if ((m)->prof_sync) TS_TRY(ts_device_sync());          \
        (m)->prof[kind] += ts_time_now() - t0_;                \
    } while (0)

/* ---- unet_acts.c ---- */

/* frees every slot's activations, the recompute scratch, the halos and the
 * gradient buffers (ts_unet_setup allocates them again); local */
void ts_unet_free_acts(ts_unet *m);

/* ---- unet_device.c: the GPU engine's side of the model ---- */

/* TS_ERR_UNSUPPORTED naming what the GPU engine does not run yet (the
 * residual encoder on a spatial split); 0 on the CPU engine */
/* slot s's image s->x (device) from image [N, C, D, H, W] (host), through hx */
int ts_unet_device_input(ts_unet *m, slot *s, const ts_tensor *image);
/* slot k's logits copied to hlogits (host); NULL if the copy failed */
const ts_tensor *ts_unet_device_logits(ts_unet *m, int k);

/* ---- unet_forward.c: the pieces backward and its recomputation reuse (their
 * contracts are at the definitions) ---- */

ts_norm_opts ts_unet_norm_opts(const ts_unet *m);
void ts_unet_halo_progress(void *ctx);
int ts_unet_halo_start(ts_unet *m, const ts_tensor *a, const ts_tensor *b, const ts_halo *h);
int ts_unet_halo_wait(ts_unet *m);
int ts_unet_conv3_forward(ts_unet *m, ts_halo *h, const ts_tensor *in, const ts_tensor *in2, const ts_tensor *w,
                          const ts_tensor *bias, const ts_conv_ep *ep, ts_tensor *y);
/* amax: NULL, or the conv output's maxima from the conv's epilogue (ts_unet_amax_fits) */
int ts_unet_norm_forward(ts_unet *m, const block *b, bacts *x, int i, int train, int again, const float *amax);
#define TS_UNET_AMAX 4096 /* the most (sample, channel) maxima a conv's epilogue takes for its norm */
int ts_unet_amax_fits(const ts_unet *m, const ts_tensor *in, int64_t C, float *am);
void ts_unet_halo_grow(const ts_tensor *x, const ts_halo *h, int hi, ts_tensor *out);
ts_tensor ts_unet_grown(const ts_tensor *t, const ts_tensor *x, int64_t C);
int ts_unet_cn_conv_forward(ts_unet *m, const cnorm *p, cacts *x, const ts_tensor *in);
int ts_unet_cn_forward(ts_unet *m, const cnorm *p, cacts *x, const ts_tensor *in, int act, int train, int again);
ts_tensor *ts_unet_block_in(ts_unet *m, slot *s, int l, int j);
int ts_unet_block_input(ts_unet *m, slot *s, int enc, int l);
slot *ts_unet_get_slot(ts_unet *m, int k);

#endif
