/* The UNet3D's backward: the stage's units in reverse on one slot, a
 * checkpointed level recomputed first by the forward's kernels, each
 * parameter's gradient announced to the hook as soon as it is final, a
 * split's gradient halo exchanged while the weight gradient is taken. It
 * allocates nothing (the gradient buffers come from unet_acts.c) and
 * changes no parameter. */
#include "tsbuild.h"
#include "src/model/unet_impl.h"

#include <string.h>

/* the gradients of arena entries a and b are final: the hook is told; on
 * the GPU engine they are noted, and when backward ends all gradients come
 * to the host arena in one copy (the master copy that buckets, clipping
 * and the optimizer read; one synchronisation instead of one per
 * parameter) before the hook hears of them, in the same order; with the
 * state on the GPU (ts_arena_device_master) the hook hears at once, as on
 * the CPU, and its buckets reduce the device's gradients while backward
 * goes on */
static int ready2(ts_unet *m, int a, int b)
{
    if (m->device && !m->arena->dev_master) {
        if (m->nready + 2 > m->arena->n) return TS_ERR(TS_ERR_INTERNAL, "unet: more gradients final than parameters");
        if (a >= 0) m->ready[m->nready++] = a;
        if (b >= 0) m->ready[m->nready++] = b;
        return 0;
    }
    if (!m->grad_hook) return 0;
    if (a >= 0) m->grad_hook(m->grad_ctx, a);
    if (b >= 0) m->grad_hook(m->grad_ctx, b);
    return 0;
}

/* the GPU engine at the end of backward: the gradients down, then the hook */
static int device_grads_ready(ts_unet *m)
{
    const int n = m->nready;
    m->nready = 0;
    if (m->arena->dev_master) return 0; /* the hook heard already; the gradients stay on the GPU */
    TS_TRY(ts_arena_grads_to_host(m->arena));
    for (int i = 0; m->grad_hook && i < n; i++) m->grad_hook(m->grad_ctx, m->ready[i]);
    return 0;
}

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
    const ts_conv_split xs = {xh, TS_CONV_ALL, ts_unet_halo_progress, m, NULL}, dys = {gh, TS_CONV_ALL, NULL, NULL, NULL};
    if (dx) TS_TRY(ts_unet_halo_start(m, dy, NULL, gh));
    if (x2) TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_cat_backward_split(x, x2, w, &xs, &dys, dy, NULL, NULL, dw, db));
    else TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward_split(x, w, &xs, &dys, dy, NULL, dw, db));
    TS_TRY(ready2(m, iw, ib));
    if (!dx) return 0;
    TS_TRY(ts_unet_halo_wait(m));
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
    const ts_norm_opts o = ts_unet_norm_opts(m);
    {
        ts_tensor gm = V(m, b->nw[i]), be = V(m, b->nb[i]), dgm = G(m, b->nw[i]), dbe = G(m, b->nb[i]);
        /* norm + ReLU backward; the input gradient overwrites the norm's input y[i] */
        switch (m->cfg.norm) {
        case TS_NORM_BATCH:
            TIMED(m, TS_PROF_NORM, ts_batchnorm_backward(&xa->y[i], &xa->a[i], &gm, &be, &xa->smean[i], &xa->sinv[i], train,
                                                         &o, g, &xa->y[i], &dgm, &dbe));
            break;
        case TS_NORM_GROUP:
            TIMED(m, TS_PROF_NORM, ts_groupnorm_backward(&xa->y[i], &xa->a[i], &gm, &be, &xa->smean[i], &xa->sinv[i], &o, g,
                                                         &xa->y[i], &dgm, &dbe));
            break;
        case TS_NORM_INSTANCE:
            TIMED(m, TS_PROF_NORM, ts_instancenorm_backward(&xa->y[i], &xa->a[i], &gm, &be, &xa->smean[i], &xa->sinv[i], &o, g,
                                                            &xa->y[i], &dgm, &dbe));
            break;
        }
        TS_TRY(ready2(m, b->nw[i], b->nb[i]));
        ts_tensor w = V(m, b->cw[i]), dw = G(m, b->cw[i]), db = G(m, b->cb[i]);
        if (m->split_on)
            return conv3_backward_split(m, &xa->xh[i], &m->gh[b->level], in, in2, &w, &xa->y[i], dx, dx2, &dw, &db,
                                        b->cw[i], b->cb[i]);
        /* weight gradient first: dx may overwrite the input */
        if (in2) {
            TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_cat_backward(in, in2, &w, 1, 1, &xa->y[i], NULL, NULL, &dw, &db));
            TS_TRY(ready2(m, b->cw[i], b->cb[i]));
            TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_cat_backward(in, in2, &w, 1, 1, &xa->y[i], dx, dx2, NULL, NULL));
            return 0;
        }
        TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward(in, &w, 1, 1, &xa->y[i], NULL, &dw, &db));
        TS_TRY(ready2(m, b->cw[i], b->cb[i]));
        if (dx) TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward(in, &w, 1, 1, &xa->y[i], dx, NULL, NULL));
    }
    return 0;
}

/* ---- the residual encoder's backward ---- */

/* Backward of p's conv (dy in x->y): the weight gradient, then the input
 * gradient to dx (NULL: not needed). On a split, a 3x3x3 conv at stride 1
 * takes the split kernels; at stride 2 the weight gradient convolves in
 * ts_unet_grown by its low halo (as forward), and input voxel i, which the outputs
 * ceil((i-1)/2) .. floor((i+1)/2) read (a box's last voxel: the next box's first), needs dy's upper halo voxel: dy ts_unet_grown by it on
 * the high side, and the input gradient of in ts_unet_grown by one voxel on the
 * high side (padding 1), of which the box is kept. */
static int cn_conv_backward(ts_unet *m, const cnorm *p, cacts *x, const ts_tensor *in, ts_tensor *dx)
{
    ts_tensor w = V(m, p->cw), dw = G(m, p->cw), db = G(m, p->cb);
    if (m->split_on && p->k == 3 && p->stride == 1)
        return conv3_backward_split(m, &x->xh, &m->gh[p->level], in, NULL, &w, &x->y, dx, NULL, &dw, &db,
                                    p->cw, p->cb);
    if (!m->split_on || p->k == 1) {
        TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward(in, &w, p->stride, p->k / 2, &x->y, NULL, &dw, &db));
        TS_TRY(ready2(m, p->cw, p->cb));
        if (dx) TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward(in, &w, p->stride, p->k / 2, &x->y, dx, NULL, NULL));
        return 0;
    }
    ts_halo *gh = &m->gh[p->level];
    if (dx) TS_TRY(ts_unet_halo_start(m, &x->y, NULL, gh));
    if (in->device) { /* padded boxes on the device (src/nn/cuda/conv_split.c) */
        TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_s2_backward_split(in, &w, &x->xh, NULL, &x->y, NULL, &dw, &db));
        TS_TRY(ready2(m, p->cw, p->cb));
        if (!dx) return 0;
        TS_TRY(ts_unet_halo_wait(m));
        TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_s2_backward_split(in, &w, NULL, gh, &x->y, dx, NULL, NULL));
        return 0;
    }
    ts_tensor g = ts_unet_grown(&m->sx, in, p->cin);
    TIMED(m, TS_PROF_HALO, (ts_unet_halo_grow(in, &x->xh, 0, &g), 0));
    TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward(&g, &w, p->stride, 0, &x->y, NULL, &dw, &db));
    TS_TRY(ready2(m, p->cw, p->cb));
    if (!dx) return 0;
    TS_TRY(ts_unet_halo_wait(m));
    ts_tensor gy = ts_unet_grown(&m->sy, &x->y, p->cout);
    TIMED(m, TS_PROF_HALO, (ts_unet_halo_grow(&x->y, gh, 1, &gy), 0));
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

/* Backward of cnorm p (its act if act): g holds d(x->a), the norm's input gradient overwrites x->y, the conv's input
 * gradient goes to dx (NULL: not needed); in is the conv's forward input. */
static int cn_backward(ts_unet *m, const cnorm *p, cacts *x, const ts_tensor *in, int act, int train, ts_tensor *g,
                       ts_tensor *dx)
{
    ts_norm_opts o = ts_unet_norm_opts(m);
    o.relu = act && o.relu;
    ts_tensor gm = V(m, p->nw), be = V(m, p->nb), dgm = G(m, p->nw), dbe = G(m, p->nb);
    switch (m->cfg.norm) {
    case TS_NORM_BATCH:
        TIMED(m, TS_PROF_NORM, ts_batchnorm_backward(&x->y, &x->a, &gm, &be, &x->smean, &x->sinv, train, &o, g, &x->y, &dgm,
                                                     &dbe));
        break;
    case TS_NORM_GROUP:
        TIMED(m, TS_PROF_NORM, ts_groupnorm_backward(&x->y, &x->a, &gm, &be, &x->smean, &x->sinv, &o, g, &x->y, &dgm, &dbe));
        break;
    case TS_NORM_INSTANCE:
        TIMED(m, TS_PROF_NORM, ts_instancenorm_backward(&x->y, &x->a, &gm, &be, &x->smean, &x->sinv, &o, g, &x->y, &dgm,
                                                        &dbe));
        break;
    }
    TS_TRY(ready2(m, p->nw, p->nb));
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
    TIMED(m, TS_PROF_OTHER, ts_add_inplace(dx, r->skip ? tmp : g));
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
    TS_TRY(ts_unet_cn_forward(m, &r->c1, &x->c1, in, 1, train, 1));
    TS_TRY(ts_unet_cn_conv_forward(m, &r->c2, &x->c2, &x->c1.a));
    if (r->skip) TS_TRY(ts_unet_cn_forward(m, &r->sk, &x->sk, in, 0, train, 1));
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
    if (half && l < m->cfg.levels - 1) TIMED(m, TS_PROF_OTHER, ts_add_inplace(a, &m->dskip[l]));
    for (int j = half ? nb - 1 : nb - 2; j >= (half ? nb - 1 : 0); j--) {
        const ts_tensor *in = ts_unet_block_in(m, s, l, j);
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
        TS_TRY(ts_unet_block_input(m, s, enc, l));
        const ts_tensor *in = enc ? (l ? &s->pool[l] : &s->x) : &s->up[l];
        float am[TS_UNET_AMAX];
        const ts_conv_ep ep = {NULL, NULL, TS_EP_NONE, 0.0f, am};
        const int fuse = here(m, U_B(m, b, 1)) && ts_unet_amax_fits(m, in, w.shape[0], am);
        TS_TRY(ts_unet_conv3_forward(m, &x->xh[0], in, enc ? NULL : act(m, s, l), &w, &bias, fuse ? &ep : NULL, &x->y[0]));
        if (here(m, U_B(m, b, 1))) TS_TRY(ts_unet_norm_forward(m, b, x, 0, train, 1, fuse ? am : NULL));
    }
    if (here(m, U_B(m, b, 1))) {
        ts_tensor w = V(m, b->cw[1]), bias = V(m, b->cb[1]);
        TS_TRY(ts_unet_conv3_forward(m, &x->xh[1], act(m, s, mid_tensor(m, enc, l)), NULL, &w, &bias, NULL, &x->y[1]));
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
    return ts_unet_block_input(m, s, enc, l);
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
    slot *s = ts_unet_get_slot(m, k);
    if (!s) return TS_ERR(TS_ERR_ARG, "unet: backward on slot %d before forward", k);
    TS_TRY(ts_nn_set_conv_precision(m->cfg.precision));
    ts_nn_set_winograd(!m->device && m->cfg.conv_winograd);
    ts_nn_set_tf32(m->cfg.tf32);
    if (here(m, U_H(m)) && !s->have_dlogits)
        return TS_ERR(TS_ERR_ARG, "unet: backward without a loss gradient (call ts_unet_loss)");
    if (s->folded)
        return TS_ERR(TS_ERR_ARG, "unet: backward after a forward that folded its batch norms (ts_unet_set_fold_eval: "
                                  "inference only)");
    s->have_dlogits = 0; /* the forward buffers are consumed */
    const int train = s->train_forward;
    m->nready = 0;
    for (int u = m->u1 - 1; u >= m->u0; u--) {
        if (u < m->u1 - 1 && m->unit_hook) m->unit_hook(m->unit_ctx, u + 1, 1);
        if (u == U_H(m)) {
            ts_tensor hw = V(m, m->headw), dhw = G(m, m->headw), dhb = G(m, m->headb);
            ts_tensor *in = act(m, s, head_input(m));
            TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward(in, &hw, 1, 0, &s->dlogits, NULL, &dhw, &dhb));
            TS_TRY(ready2(m, m->headw, m->headb));
            TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward(in, &hw, 1, 0, &s->dlogits, &m->gin[0], NULL, NULL));
        } else if (u >= 2 * L) { /* dec l: conv 2, or conv 1 on [up, skip] (the up part over up[l] itself) and up{l} */
            const int l = L - 2 - (u - 2 * L) / 2, i = (u - 2 * L) % 2;
            TS_TRY(recompute_half(m, s, 0, l, i, train));
            if (i == 1 && m->dsw[l] >= 0) { /* deep supervision head: its input gradient (via dskip[l], free
                                             * until conv 1's backward) adds to gin[l] */
                ts_tensor hw = V(m, m->dsw[l]), dhw = G(m, m->dsw[l]), dhb = G(m, m->dsb[l]);
                ts_tensor *in = &s->dec[l].a[1];
                TIMED(m, TS_PROF_CONV_WGRAD, ts_conv3d_backward(in, &hw, 1, 0, &s->dsd[l], NULL, &dhw, &dhb));
                TS_TRY(ready2(m, m->dsw[l], m->dsb[l]));
                TIMED(m, TS_PROF_CONV_DGRAD, ts_conv3d_backward(in, &hw, 1, 0, &s->dsd[l], &m->dskip[l], NULL, NULL));
                TIMED(m, TS_PROF_OTHER, ts_add_inplace(&m->gin[l], &m->dskip[l]));
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
            TS_TRY(ready2(m, m->upw[l], m->upb[l]));
        } else if (resenc(m)) { /* residual encoder level l: its last block, or the others and the stem */
            TS_TRY(resenc_backward(m, s, u / 2, u % 2, train));
        } else { /* enc l: conv 2 (its output's gradient is the pool's plus the skip's), or conv 1 and the pool */
            const int l = u / 2, i = u % 2;
            if (i == 1) {
                if (l < L - 1) TIMED(m, TS_PROF_OTHER, ts_add_inplace(&m->gin[l], &m->dskip[l]));
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
    if (m->device) TS_TRY(device_grads_ready(m));
    if (m->unit_hook) m->unit_hook(m->unit_ctx, m->u0, 1);
    return 0;
}

int ts_unet_backward(ts_unet *m) { return ts_unet_backward_slot(m, 0); }
