/* The UNet3D's forward and loss: the stage's units in order on one slot
 * (conv blocks, the residual encoder, pool and up, the heads), a split's
 * halo exchange overlapped with the interior, and the loss with deep
 * supervision. Its conv, norm and halo pieces are shared with backward's
 * recomputation (unet_impl.h). It allocates nothing itself (ts_unet_setup,
 * unet_acts.c) and writes no parameter gradient. */
#include "tsbuild.h"
#include "src/model/unet_impl.h"
#include "src/core/device.h"

#include <string.h>

/* norms with the activation that follows them fused (ReLU or leaky ReLU, on
 * the CPU and on the GPU engine alike) */
ts_norm_opts ts_unet_norm_opts(const ts_unet *m)
{
    const int leaky = m->cfg.act == TS_ACT_LEAKY;
    ts_norm_opts o = {m->cfg.eps, m->cfg.momentum, m->cfg.groups, m->cfg.act == TS_ACT_RELU || leaky,
                      leaky ? m->cfg.slope : 0.0f, NULL, NULL, NULL};
    if (m->cfg.norm == TS_NORM_BATCH && m->norm_sync) {
        o.sync = m->norm_sync;
        o.sync_ctx = m->norm_ctx;
    } else if (m->split_on) { /* the statistics of a sample are those of all its boxes */
        o.sync = m->split.reduce;
        o.sync_ctx = m->split.ctx;
    }
    return o;
}

void ts_unet_halo_progress(void *ctx)
{
    ts_unet *m = ctx;
    m->split.halo_progress(m->split.ctx);
}

/* t holds at least n floats (on the device or the host), reallocated when it does not */
static int pack_buf(ts_tensor *t, int64_t n, int device)
{
    if (t->data && ts_tensor_numel(t) >= n) return 0;
    ts_tensor_free(t);
    const int64_t sh[1] = {n > 0 ? n : 1};
    return device ? ts_tensor_alloc_device(t, TS_FLOAT32, 1, sh) : ts_tensor_alloc(t, TS_FLOAT32, 1, sh);
}

/* the GPU engine: [a, b]'s boundary packed on the device, copied down, the exchange started from the host copy */
static int halo_start_device(ts_unet *m, const ts_tensor *a, const ts_tensor *b, const int64_t dhw[3], const ts_halo *h)
{
    const int C = (int)a->shape[4] + (b ? (int)b->shape[4] : 0);
    if (!m->split.halo_start_packed)
        return TS_ERR(TS_ERR_INTERNAL, "unet on the GPU: the split's hooks have no exchange of a packed halo");
    const int64_t n = ts_halo_send_floats(dhw, m->split.send_mask, a->shape[0], C);
    TS_TRY(pack_buf(&m->dpack, n, 1));
    TS_TRY(pack_buf(&m->hpack, n, 0));
    TS_TRY(ts_halo_pack(a, b, m->split.send_mask, &m->dpack));
    ts_tensor dv = ts_tensor_view(m->dpack.data, TS_FLOAT32, 1, (const int64_t[]){n}), hv = dv;
    dv.device = 1;
    hv.data = m->hpack.data;
    TS_TRY(ts_tensor_transfer(&hv, &dv));
    return m->split.halo_start_packed(m->split.ctx, m->hpack.data, C, (int)a->shape[0], dhw, h);
}

/* starts the exchange of [a, b]'s halo into h (split only) */
int ts_unet_halo_start(ts_unet *m, const ts_tensor *a, const ts_tensor *b, const ts_halo *h)
{
    const double t0 = ts_time_now();
    const int64_t dhw[3] = {a->shape[1], a->shape[2], a->shape[3]};
    if (a->device) {
        int rc = halo_start_device(m, a, b, dhw, h);
        m->prof[TS_PROF_HALO] += ts_time_now() - t0;
        return rc;
    }
    int rc = m->split.halo_start(m->split.ctx, a->data, (int)a->shape[4], b ? b->data : NULL, b ? (int)b->shape[4] : 0,
                                 (int)a->shape[0], dhw, h);
    m->prof[TS_PROF_HALO] += ts_time_now() - t0;
    return rc;
}

int ts_unet_halo_wait(ts_unet *m)
{
    const double t0 = ts_time_now();
    int rc = m->split.halo_wait(m->split.ctx);
    m->prof[TS_PROF_HALO] += ts_time_now() - t0;
    return rc;
}

/* Whether a conv of C output channels on in takes the maxima of its
 * output for the norm after it in its epilogue (ts_conv_ep.amax: host
 * tensors, at most TS_UNET_AMAX values), and if so am zeroed for them */
int ts_unet_amax_fits(const ts_unet *m, const ts_tensor *in, int64_t C, float *am)
{
    const int64_t n = in->shape[0] * C;
    if (m->device || n > TS_UNET_AMAX) return 0;
    memset(am, 0, (size_t)n * sizeof(float));
    return 1;
}

/* a 3x3x3 conv of the block (on [in, in2] when in2): with a split, the
 * interior while the halo travels, then the border */
int ts_unet_conv3_forward(ts_unet *m, ts_halo *h, const ts_tensor *in, const ts_tensor *in2, const ts_tensor *w,
                         const ts_tensor *bias, const ts_conv_ep *ep, ts_tensor *y)
{
    if (!m->split_on && ep) { /* the epilogue goes through the split calls' options, without a halo */
        const ts_conv_split cs = {NULL, TS_CONV_ALL, NULL, NULL, ep};
        if (in2) TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_cat_forward_split(in, in2, w, bias, &cs, y));
        else TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_forward_split(in, w, bias, &cs, y));
        return 0;
    }
    if (!m->split_on) {
        if (in2) TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_cat_forward(in, in2, w, bias, 1, 1, y));
        else TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_forward(in, w, bias, 1, 1, y));
        return 0;
    }
    TS_TRY(ts_unet_halo_start(m, in, in2, h));
    ts_conv_split cs = {h, TS_CONV_INTERIOR, ts_unet_halo_progress, m, ep};
    for (int part = 0; part < 2; part++) {
        if (part) {
            TS_TRY(ts_unet_halo_wait(m));
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
int ts_unet_norm_forward(ts_unet *m, const block *b, bacts *x, int i, int train, int again, const float *amax)
{
    ts_norm_opts o = ts_unet_norm_opts(m);
    o.amax = amax;
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
    }
    return 0;
}

/* ---- the residual encoder (model.arch = resenc) ---- */

/* p's norm on x->y into out, followed by the activation if act; running
 * statistics as ts_unet_norm_forward (again: a recomputation, which leaves them) */
static int cn_norm_forward(ts_unet *m, const cnorm *p, cacts *x, ts_tensor *out, int act, int train, int again)
{
    ts_norm_opts o = ts_unet_norm_opts(m);
    o.relu = act && o.relu;
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

/* out = box x ts_unet_grown by one voxel along each dim ([N, D+1, H+1, W+1, C]),
 * on the low side (hi = 0: out's voxel i is x's i - 1) or the high side
 * (hi = 1: out's voxel i is x's i), the added voxels from x's halo h (zero
 * where h has none: the volume's border, an unsplit dim) */
void ts_unet_halo_grow(const ts_tensor *x, const ts_halo *h, int hi, ts_tensor *out)
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
ts_tensor ts_unet_grown(const ts_tensor *t, const ts_tensor *x, int64_t C)
{
    return ts_tensor_view(t->data, TS_FLOAT32, 5,
                          (const int64_t[]){x->shape[0], x->shape[1] + 1, x->shape[2] + 1, x->shape[3] + 1, C});
}

/* p's conv on in into x->y. On a split a 3x3x3 conv reads in's halo: at
 * stride 1 the split kernels (interior while the halo travels), at stride
 * 2 (padding 1, even box edges at even offsets) output voxel o reads the
 * input voxels 2o-1 .. 2o+1, so only the low halo: in ts_unet_grown by it on the
 * low side convolved with padding 0. A 1x1x1 conv reads its own box. */
int ts_unet_cn_conv_forward(ts_unet *m, const cnorm *p, cacts *x, const ts_tensor *in)
{
    ts_tensor w = V(m, p->cw), b = V(m, p->cb);
    if (!m->split_on || p->k == 1) {
        TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_forward(in, &w, &b, p->stride, p->k / 2, &x->y));
        return 0;
    }
    if (p->stride == 1) return ts_unet_conv3_forward(m, &x->xh, in, NULL, &w, &b, NULL, &x->y);
    TS_TRY(ts_unet_halo_start(m, in, NULL, &x->xh));
    TS_TRY(ts_unet_halo_wait(m));
    if (in->device) { /* the box padded by its halo on the device, convolved with padding 0 */
        TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_s2_forward_split(in, &w, &b, &x->xh, &x->y));
        return 0;
    }
    ts_tensor g = ts_unet_grown(&m->sx, in, p->cin);
    TIMED(m, TS_PROF_HALO, (ts_unet_halo_grow(in, &x->xh, 0, &g), 0));
    TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_forward(&g, &w, &b, p->stride, 0, &x->y));
    return 0;
}

/* p's conv on in into x->y, then its norm (and act) into x->a */
int ts_unet_cn_forward(ts_unet *m, const cnorm *p, cacts *x, const ts_tensor *in, int act, int train, int again)
{
    TS_TRY(ts_unet_cn_conv_forward(m, p, x, in));
    return cn_norm_forward(m, p, x, &x->a, act, train, again);
}

/* a residual block on in: out (x->c2.a) = act(norm2(conv2(act(norm1(conv1(in))))) + skip) */
static int rblock_forward(ts_unet *m, const rblock *r, racts *x, const ts_tensor *in, int train)
{
    TS_TRY(ts_unet_cn_forward(m, &r->c1, &x->c1, in, 1, train, 0));
    TS_TRY(ts_unet_cn_forward(m, &r->c2, &x->c2, &x->c1.a, 0, train, 0));
    if (r->skip) TS_TRY(ts_unet_cn_forward(m, &r->sk, &x->sk, in, 0, train, 0));
    const float slope = m->cfg.act == TS_ACT_LEAKY ? m->cfg.slope : 0.0f;
    if (m->device) { /* the same sum and activation as two kernels (the same bits as the loop below) */
        TIMED(m, TS_PROF_OTHER, ts_add_inplace(&x->c2.a, r->skip ? &x->sk.a : in));
        TIMED(m, TS_PROF_OTHER, ts_relu_forward(&x->c2.a, slope, &x->c2.a));
        return 0;
    }
    const double t0 = ts_time_now();
    const float *k = r->skip ? x->sk.a.data : in->data;
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
ts_tensor *ts_unet_block_in(ts_unet *m, slot *s, int l, int j)
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
    if (l == 0 && !half) TS_TRY(ts_unet_cn_forward(m, &m->stem, &s->stem, &s->x, 1, train, 0));
    for (int j = half ? nb - 1 : 0; j < (half ? nb : nb - 1); j++)
        TS_TRY(rblock_forward(m, &m->rb[l][j], &s->rb[l][j], ts_unet_block_in(m, s, l, j), train));
    return 0;
}

void ts_unet_set_fold_eval(ts_unet *m, int on) { m->fold_eval = on != 0; }
void ts_unet_set_winograd(ts_unet *m, int on) { m->winograd = on != 0; }

#define FOLD_MAX_C 1024 /* channels of a folded norm (its scale and shift on the stack) */

/* conv i of a block, its norm and ReLU: y[i], a[i] from in (or the
 * concatenation [in, in2], a decoder's conv 0); folding (see
 * ts_unet_set_fold_eval): a[i] only, the eval batch norm and the
 * activation in the conv's epilogue */
static int half_forward(ts_unet *m, const block *b, bacts *x, int i, const ts_tensor *in, const ts_tensor *in2, int train)
{
    ts_tensor w = V(m, b->cw[i]), bias = V(m, b->cb[i]);
    const int64_t C = w.shape[0];
    if (m->folding && C <= FOLD_MAX_C) {
        float ss[2 * FOLD_MAX_C];
        ts_tensor g = V(m, b->nw[i]), be = V(m, b->nb[i]), rm = V(m, b->rm[i]), rv = V(m, b->rv[i]);
        TS_TRY(ts_batchnorm_fold(&g, &be, &rm, &rv, m->cfg.eps, ss, ss + C));
        const ts_conv_ep ep = {ss, ss + C, m->cfg.act == TS_ACT_LEAKY ? TS_EP_LEAKY : TS_EP_RELU, m->cfg.slope, NULL};
        return ts_unet_conv3_forward(m, &x->xh[i], in, in2, &w, &bias, &ep, &x->a[i]);
    }
    float am[TS_UNET_AMAX];
    const ts_conv_ep ep = {NULL, NULL, TS_EP_NONE, 0.0f, am};
    const int fuse = ts_unet_amax_fits(m, in, C, am);
    TS_TRY(ts_unet_conv3_forward(m, &x->xh[i], in, in2, &w, &bias, fuse ? &ep : NULL, &x->y[i]));
    return ts_unet_norm_forward(m, b, x, i, train, 0, fuse ? am : NULL);
}

/* the input of enc l's first conv below level 0 (the max-pool of the level
 * above: pool[l], pidx[l]) or of dec l's (up{l}: up[l]) */
int ts_unet_block_input(ts_unet *m, slot *s, int enc, int l)
{
    if (enc) {
        if (l > 0) TIMED(m, TS_PROF_POOL, ts_maxpool3d_forward(act(m, s, l - 1), 2, &s->pool[l], &s->pidx[l]));
        return 0;
    }
    ts_tensor w = V(m, m->upw[l]), b = V(m, m->upb[l]);
    TIMED(m, TS_PROF_CONVT, ts_convt3d_forward(act(m, s, up_input(m, l)), &w, &b, 2, &s->up[l]));
    return 0;
}

slot *ts_unet_get_slot(ts_unet *m, int k)
{
    return m->slots && k >= 0 && k < m->nslots ? &m->slots[k] : NULL;
}

int ts_unet_forward_slot(ts_unet *m, int k, const ts_tensor *image, int train)
{
    const ts_unet_cfg *c = &m->cfg;
    TS_TRY(ts_nn_set_conv_precision(c->precision));
    ts_nn_set_tf32(c->tf32);
    const int L = c->levels;
    if (here(m, U_E(m, 0, 0))) {
        TS_TRY(ts_tensor_check_shape(image, "input image", 5, (const int64_t[]){-1, c->in_channels, -1, -1, -1}));
        if (image->dtype != TS_FLOAT32) return TS_ERR(TS_ERR_ARG, "input image must be float32");
        TS_TRY(ts_unet_setup(m, (int)image->shape[0], (int)image->shape[2], (int)image->shape[3], (int)image->shape[4]));
    }
    slot *s = ts_unet_get_slot(m, k);
    if (!s) return TS_ERR(TS_ERR_ARG, "unet: forward on slot %d before ts_unet_setup (%d slots)", k, m->nslots);
    s->have_dlogits = 0;
    m->folding = m->fold_eval && !train && c->norm == TS_NORM_BATCH && !m->device;
    ts_nn_set_winograd(!m->device && (c->conv_winograd || (m->winograd && !train)));
    if (m->device) TIMED(m, TS_PROF_OTHER, ts_arena_to_device(m->arena)); /* the host's params (unless the state is on the GPU) and buffers */
    for (int u = m->u0; u < m->u1; u++) {
        if (u > m->u0 && m->unit_hook) m->unit_hook(m->unit_ctx, u - 1, 0);
        if (u < 2 * L && resenc(m)) { /* residual encoder level l: stem and blocks but the last, or the last */
            if (u == 0)
                TIMED(m, TS_PROF_OTHER,
                      m->device ? ts_unet_device_input(m, s, image) : ts_tensor_to_channels_last(image, &s->x));
            TS_TRY(resenc_forward(m, s, u / 2, u % 2, train));
        } else if (u < 2 * L) { /* enc l: pool the level above (or take the image) and conv 1, or conv 2 */
            const int l = u / 2, i = u % 2;
            if (i == 1) {
                TS_TRY(half_forward(m, &m->enc[l], &s->enc[l], 1, act(m, s, mid_tensor(m, 1, l)), NULL, train));
                continue;
            }
            if (l == 0)
                TIMED(m, TS_PROF_OTHER,
                      m->device ? ts_unet_device_input(m, s, image) : ts_tensor_to_channels_last(image, &s->x));
            else TS_TRY(ts_unet_block_input(m, s, 1, l));
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
            TS_TRY(ts_unet_block_input(m, s, 0, l));
            TS_TRY(half_forward(m, &m->dec[l], &s->dec[l], 0, &s->up[l], act(m, s, l), train));
        } else {
            ts_tensor hw = V(m, m->headw), hb = V(m, m->headb);
            TIMED(m, TS_PROF_CONV_FWD, ts_conv3d_forward(act(m, s, head_input(m)), &hw, &hb, 1, 0, &s->logits));
        }
    }
    s->train_forward = train;
    s->folded = m->folding;
    if (m->device && train && m->cfg.norm == TS_NORM_BATCH) /* the running statistics, for checkpoints and eval */
        TIMED(m, TS_PROF_OTHER, ts_arena_buffers_to_host(m->arena));
    if (m->unit_hook) m->unit_hook(m->unit_ctx, m->u1 - 1, 0);
    return 0;
}

int ts_unet_forward(ts_unet *m, const ts_tensor *image, int train) { return ts_unet_forward_slot(m, 0, image, train); }

int ts_unet_loss_slot(ts_unet *m, int k, const ts_tensor *labels, int with_grad, double *loss)
{
    const ts_unet_cfg *c = &m->cfg;
    slot *s = ts_unet_get_slot(m, k);
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
        if (!lv && m->device) { /* the GPU engine: the labels go up once, from page-locked staging */
            TS_TRY(ts_device_upload_wait());
            memcpy(m->hlab0.data, labels->data, ts_tensor_bytes(&s->lab));
            TS_TRY(ts_tensor_upload_async(&s->lab, &m->hlab0));
            lab = &s->lab;
        }
        if (lv) {
            const int64_t D = m->d >> lv, H = m->h >> lv, W = m->w >> lv, o0 = (int64_t)1 << (lv - 1);
            const uint8_t *src = labels->data;
            if (m->device) TS_TRY(ts_device_upload_wait()); /* hlab's last copy has read it */
            uint8_t *dst = m->device ? m->hlab.data : s->dslab[lv].data; /* the GPU engine: downsampled on the host */
            for (int64_t n = 0; n < m->n; n++)
                for (int64_t z = 0; z < D; z++)
                    for (int64_t y = 0; y < H; y++)
                        for (int64_t x = 0; x < W; x++)
                            dst[((n * D + z) * H + y) * W + x] =
                                src[((n * m->d + (z << lv) + o0) * m->h + (y << lv) + o0) * m->w + (x << lv) + o0];
            if (m->device) {
                const ts_tensor h = ts_tensor_view(m->hlab.data, TS_UINT8, 4, s->dslab[lv].shape);
                TS_TRY(ts_tensor_upload_async(&s->dslab[lv], &h));
            }
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
