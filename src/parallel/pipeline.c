/* Pipeline stages of the UNet3D; see pipeline.h. Owns the model's stages
 * on the layout's pipeline group over src/parallel/pipe.c's schedules, for
 * training and inference alike; must not reduce gradients or step an
 * optimizer (src/train/step.c does). Per micro-batch on stage s:
 * forward = receive the activations of the edges entering the stage (one
 * message per tensor and producing stage), run the units, send the edges
 * leaving it (one message per tensor and consuming stage); backward =
 * receive the gradients of the edges leaving the stage (one per edge),
 * run the units in reverse, send the gradients of the edges entering it.
 * Sends complete in the background: an activation's before its slot is
 * reused; a gradient goes from a copy (the model's gradient buffers are
 * shared by the slots), two sets of copies, so a backward waits only for
 * the gradients of the backward before the previous one. The gradients a backward needs are received into
 * the pipeline's own buffers, posted as soon as the previous backward has
 * copied its own out (or after the step's first forward), so a sending
 * stage's transfer never waits for the receiving stage to reach its
 * backward. On the GPU engine the model's tensors are in device memory,
 * which MPI does not read (Debian's MPICH is not CUDA-aware): every message
 * travels from and arrives in host memory, an activation through a host
 * copy per slot and edge, copied up after it arrived and down before it
 * leaves. */
#include "tsbuild.h"
#include "src/parallel/pipeline.h"
#include "src/core/device.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/core/rng.h"
#include "src/core/timer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_EDGES (6 * TS_UNET_MAX_LEVELS)

typedef struct pedge {
    ts_unet_edge e;
    int peer;     /* the stage at the other end */
    int incoming; /* 1: produced elsewhere, consumed here */
    int act_msg;  /* 1: this edge carries the activation (the first edge of its tensor and stage pair) */
    int tag;
} pedge;

struct ts_pipeline {
    ts_unet *m;
    MPI_Comm comm;
    int P, s, M, slots;
    ts_pipe_kind kind;
    int *first;
    pedge pe[MAX_EDGES];
    int npe;
    ts_pipe_msgs *act_sends; /* per slot */
    ts_pipe_msgs *act_recvs; /* per slot: the activations of its next forward, posted early */
    int *recv_mb;            /* per slot: the micro-batch act_recvs are for (-1: none) */
    ts_pipe_msgs grad_sends[2], recvs; /* grad_sends[mb % 2]: the gradients micro-batch mb's backward sends */
    float *sbuf[2][MAX_EDGES]; /* per entering edge: a copy of its gradient while it travels */
    size_t sbuf_n[2][MAX_EDGES];
    float *gbuf[MAX_EDGES];  /* per leaving edge: where its gradient is received */
    size_t gbuf_n[MAX_EDGES];
    int grad_mb;             /* the micro-batch `recvs` are posted for (-1: none) */
    float **abuf;            /* the GPU engine: [slot * MAX_EDGES + edge] the host copy of an activation */
    size_t *abuf_n;
    int cur;        /* the slot of the forward or backward running (for the unit hook) */
    int cur_mb;     /* its micro-batch */
    int hook_err;   /* a send the unit hook could not post */
    ts_pipeline_stats st;
};

static int stage_of(const ts_pipeline *p, int u)
{
    int s = 0;
    while (s + 1 < p->P && p->first[s + 1] <= u) s++;
    return s;
}

int ts_pipeline_create(ts_unet *m, MPI_Comm comm, const int *first, ts_pipe_kind kind, int M, ts_pipeline **out)
{
    int err = 0, P, s;
    ts_pipeline *p = NULL;
    *out = NULL;
    TS_MPI(MPI_Comm_size(comm, &P));
    TS_MPI(MPI_Comm_rank(comm, &s));
    if (first[0] != 0 || first[P] != ts_unet_units(m))
        return TS_ERR(TS_ERR_ARG, "pipeline: the cut must cover units 0 .. %d", ts_unet_units(m));
    for (int k = 0; k < P; k++)
        if (first[k] >= first[k + 1]) return TS_ERR(TS_ERR_ARG, "pipeline: stage %d is empty", k);
    if (kind == TS_PIPE_1F1B && M < P)
        return TS_ERR(TS_ERR_CONFIG, "parallel.schedule = 1f1b needs parallel.microbatches >= parallel.pp, but %d < %d "
                                     "(use more micro-batches, or parallel.schedule = gpipe)", M, P);
    p = TS_CALLOC(1, sizeof *p);
    if (!p) return TS_ERR_NOMEM;
    p->m = m;
    p->P = P;
    p->s = s;
    p->M = M;
    p->kind = kind;
    p->comm = MPI_COMM_NULL;
    p->first = TS_CALLOC((size_t)P + 1, sizeof *p->first);
    if (!p->first) TS_FAIL(TS_ERR_NOMEM, "pipeline");
    memcpy(p->first, first, sizeof *first * (size_t)(P + 1));
    p->slots = ts_pipe_in_flight(kind, P, s, M);
    p->act_sends = TS_CALLOC((size_t)p->slots, sizeof *p->act_sends);
    p->act_recvs = TS_CALLOC((size_t)p->slots, sizeof *p->act_recvs);
    p->recv_mb = TS_CALLOC((size_t)p->slots, sizeof *p->recv_mb);
    p->abuf = TS_CALLOC((size_t)p->slots * MAX_EDGES, sizeof *p->abuf);
    p->abuf_n = TS_CALLOC((size_t)p->slots * MAX_EDGES, sizeof *p->abuf_n);
    if (!p->act_sends || !p->act_recvs || !p->recv_mb || !p->abuf || !p->abuf_n) TS_FAIL(TS_ERR_NOMEM, "pipeline");
    for (int k = 0; k < p->slots; k++) p->recv_mb[k] = -1;
    p->grad_mb = -1;
    TS_MPI(MPI_Comm_dup(comm, &p->comm));
    TS_CHECK(ts_unet_set_stage(m, first[s], first[s + 1], p->slots));
    /* the edges crossing this stage's border, in the model's order (the same on every stage) */
    ts_unet_edge e[MAX_EDGES];
    const int ne = ts_unet_edges(m, e);
    for (int i = 0; i < ne; i++) {
        const int ps = stage_of(p, e[i].producer), cs = stage_of(p, e[i].consumer);
        if (ps == cs || (ps != s && cs != s)) continue;
        pedge *q = &p->pe[p->npe++];
        q->e = e[i];
        q->incoming = cs == s;
        q->peer = q->incoming ? ps : cs;
        q->tag = i;
        q->act_msg = 1;
        for (int j = 0; j < i; j++) /* the tensor already travels to that stage */
            if (e[j].tensor == e[i].tensor && stage_of(p, e[j].consumer) == cs) q->act_msg = 0;
    }
    *out = p;
    return 0;
cleanup:
    ts_pipeline_destroy(&p);
    return err;
}

void ts_pipeline_destroy(ts_pipeline **pp)
{
    if (!pp || !*pp) return;
    ts_pipeline *p = *pp;
    for (int k = 0; p->act_sends && k < p->slots; k++) ts_pipe_wait(&p->act_sends[k]);
    for (int k = 0; p->act_recvs && k < p->slots; k++) ts_pipe_wait(&p->act_recvs[k]);
    ts_pipe_wait(&p->grad_sends[0]);
    ts_pipe_wait(&p->grad_sends[1]);
    ts_pipe_cancel(&p->recvs); /* gradients posted for a backward an error cut short */
    if (p->m) ts_unet_set_unit_hook(p->m, NULL, NULL);
    if (p->comm != MPI_COMM_NULL) MPI_Comm_free(&p->comm);
    free(p->act_sends);
    free(p->act_recvs);
    free(p->recv_mb);
    for (size_t i = 0; p->abuf && i < (size_t)p->slots * MAX_EDGES; i++) free(p->abuf[i]);
    free(p->abuf);
    free(p->abuf_n);
    for (int i = 0; i < MAX_EDGES; i++) {
        free(p->gbuf[i]);
        free(p->sbuf[0][i]);
        free(p->sbuf[1][i]);
    }
    free(p->first);
    free(p);
    *pp = NULL;
}

int ts_pipeline_stage(const ts_pipeline *p) { return p->s; }
int ts_pipeline_stages(const ts_pipeline *p) { return p->P; }
int ts_pipeline_first(const ts_pipeline *p) { return p->s == 0; }
int ts_pipeline_last(const ts_pipeline *p) { return p->s == p->P - 1; }
const ts_pipeline_stats *ts_pipeline_get_stats(const ts_pipeline *p) { return &p->st; }

static size_t floats(const ts_tensor *t) { return (size_t)ts_tensor_numel(t); }

/* *b holds at least n floats (*bn of them), reallocated when n differs */
static int host_buf(float **b, size_t *bn, size_t n)
{
    if (*bn == n) return 0;
    free(*b);
    *bn = 0;
    *b = TS_MALLOC((n ? n : 1) * sizeof(float));
    if (!*b) return TS_ERR(TS_ERR_NOMEM, "pipeline message buffer of %zu floats", n);
    *bn = n;
    return 0;
}

/* a tensor's values to the host floats dst, or back (on the GPU engine a copy between the memories) */
static int to_host(float *dst, const ts_tensor *src)
{
    if (!src->device) {
        memcpy(dst, src->data, floats(src) * sizeof(float));
        return 0;
    }
    ts_tensor h = ts_tensor_view(dst, TS_FLOAT32, src->ndim, src->shape);
    return ts_tensor_transfer(&h, src);
}
static int from_host(ts_tensor *dst, float *src)
{
    if (!dst->device) {
        memcpy(dst->data, src, floats(dst) * sizeof(float));
        return 0;
    }
    ts_tensor h = ts_tensor_view(src, TS_FLOAT32, dst->ndim, dst->shape);
    return ts_tensor_transfer(dst, &h);
}

/* where edge i's activation of slot k travels from or arrives: the tensor
 * itself, or on the GPU engine its host copy */
static int act_host(ts_pipeline *p, int k, int i, const ts_tensor *a, float **where)
{
    *where = a->data;
    if (!a->device) return 0;
    const size_t j = (size_t)k * MAX_EDGES + (size_t)i;
    TS_TRY(host_buf(&p->abuf[j], &p->abuf_n[j], floats(a)));
    *where = p->abuf[j];
    return 0;
}

/* the activations entering the stage in slot k: post == 1, their receives
 * (for micro-batch mb) are posted into the slot (on the GPU engine into
 * host copies); post == 0, on the GPU engine, those that arrived go up */
static int act_in(ts_pipeline *p, int k, int mb, int post)
{
    for (int i = 0; i < p->npe; i++) {
        const pedge *q = &p->pe[i];
        if (!q->incoming || !q->act_msg) continue;
        ts_tensor *a, *g;
        float *h;
        TS_TRY(ts_unet_edge_tensors(p->m, k, &q->e, &a, &g));
        if (!post && !a->device) continue;
        TS_TRY(act_host(p, k, i, a, &h));
        if (post) TS_TRY(ts_pipe_irecv(&p->act_recvs[k], h, floats(a), q->peer, 2 * q->tag, p->comm));
        else TS_TRY(from_host(a, h));
    }
    if (post) p->recv_mb[k] = mb;
    return 0;
}

/* posts the receives of the activations entering the stage for micro-batch mb into its slot */
static int post_act_recvs(ts_pipeline *p, int mb) { return act_in(p, mb % p->slots, mb, 1); }

/* sends the gradient g of entering edge i (the backward of micro-batch
 * cur_mb wrote it into the model's buffer, which the next backward
 * reuses) from a copy, so the next backward need not wait for it to leave */
static int send_grad(ts_pipeline *p, int i, const ts_tensor *g, const pedge *q)
{
    const int j = p->cur_mb % 2;
    TS_TRY(host_buf(&p->sbuf[j][i], &p->sbuf_n[j][i], floats(g)));
    TS_TRY(to_host(p->sbuf[j][i], g));
    return ts_pipe_isend(&p->grad_sends[j], p->sbuf[j][i], floats(g), q->peer, 2 * q->tag + 1, p->comm);
}

/* after each unit: what it produced that leaves the stage goes now (the
 * activation of a forward, the gradient contribution of a backward), so
 * that it travels while the stage computes on; then the messages in flight
 * are progressed (MPI moves large messages only inside MPI calls) */
static void unit_done(void *ctx, int unit, int backward)
{
    ts_pipeline *p = ctx;
    const int k = p->cur;
    for (int i = 0; i < p->npe && !p->hook_err; i++) {
        const pedge *q = &p->pe[i];
        ts_tensor *a, *g;
        if (!backward && !q->incoming && q->act_msg && q->e.producer == unit) {
            float *h = NULL;
            p->hook_err = ts_unet_edge_tensors(p->m, k, &q->e, &a, &g);
            if (!p->hook_err) p->hook_err = act_host(p, k, i, a, &h);
            if (!p->hook_err && a->device) p->hook_err = to_host(h, a); /* (the slot's last send has left) */
            if (!p->hook_err) p->hook_err = ts_pipe_isend(&p->act_sends[k], h, floats(a), q->peer, 2 * q->tag, p->comm);
        }
        if (backward && q->incoming && q->e.consumer == unit) {
            p->hook_err = ts_unet_edge_tensors(p->m, k, &q->e, &a, &g);
            if (!p->hook_err) p->hook_err = send_grad(p, i, g, q);
        }
    }
    for (int s = 0; s < p->slots; s++) {
        ts_pipe_test(&p->act_sends[s]);
        ts_pipe_test(&p->act_recvs[s]);
    }
    ts_pipe_test(&p->grad_sends[0]);
    ts_pipe_test(&p->grad_sends[1]);
    ts_pipe_test(&p->recvs);
}

/* receives the activations entering the stage for micro-batch mb (slot k;
 * posted already or now), runs its units (each sends what leaves as it
 * finishes: unit_done) */
static int forward_one(ts_pipeline *p, int mb, const ts_tensor *image, const ts_tensor *labels, int train, double *loss)
{
    const int k = mb % p->slots;
    if (p->recv_mb[k] != mb) TS_TRY(post_act_recvs(p, mb));
    const double w0 = p->act_recvs[k].wait_s;
    TS_TRY(ts_pipe_wait(&p->act_recvs[k]));
    p->recv_mb[k] = -1;
    TS_TRY(act_in(p, k, mb, 0)); /* on the GPU engine: what arrived, up */
    p->st.wait_s += p->act_recvs[k].wait_s - w0;
    const double t0 = ts_time_now();
    p->cur = k;
    p->hook_err = 0;
    ts_unet_set_unit_hook(p->m, unit_done, p);
    ts_fault_point("forward"); /* an injected kill at=forward */
    int err = ts_unet_forward_slot(p->m, k, image, train);
    if (!err && labels) err = ts_unet_loss_slot(p->m, k, labels, train, loss);
    ts_unet_set_unit_hook(p->m, NULL, NULL);
    p->st.forward_s += ts_time_now() - t0;
    TS_TRY(err);
    return p->hook_err;
}

/* posts the receives of the gradients of the edges leaving the stage for
 * micro-batch mb into the pipeline's buffers (sized as the model's) */
static int post_grad_recvs(ts_pipeline *p, int mb)
{
    const int k = mb % p->slots;
    for (int i = 0; i < p->npe; i++) {
        const pedge *q = &p->pe[i];
        if (q->incoming) continue;
        ts_tensor *a, *g;
        TS_TRY(ts_unet_edge_tensors(p->m, k, &q->e, &a, &g));
        TS_TRY(host_buf(&p->gbuf[i], &p->gbuf_n[i], floats(g)));
        TS_TRY(ts_pipe_irecv(&p->recvs, p->gbuf[i], floats(g), q->peer, 2 * q->tag + 1, p->comm));
    }
    p->grad_mb = mb;
    return 0;
}

/* receives the gradients of the edges leaving the stage for micro-batch mb
 * (posted already or now) into the model's buffers, posts those of
 * micro-batch next (-1: none), runs the units backward (each sends the
 * gradients of the edges it consumed as it finishes) */
static int backward_one(ts_pipeline *p, int mb, int next)
{
    const int k = mb % p->slots;
    TS_TRY(ts_pipe_wait(&p->grad_sends[mb % 2])); /* the copies micro-batch mb - 2 sent have left */
    if (p->grad_mb != mb) TS_TRY(post_grad_recvs(p, mb));
    const double w0 = p->recvs.wait_s;
    TS_TRY(ts_pipe_wait(&p->recvs));
    p->st.wait_s += p->recvs.wait_s - w0;
    p->grad_mb = -1;
    for (int i = 0; i < p->npe; i++) {
        const pedge *q = &p->pe[i];
        if (q->incoming) continue;
        ts_tensor *a, *g;
        TS_TRY(ts_unet_edge_tensors(p->m, k, &q->e, &a, &g));
        TS_TRY(from_host(g, p->gbuf[i]));
    }
    if (next >= 0) TS_TRY(post_grad_recvs(p, next));
    const double t0 = ts_time_now();
    p->cur = k;
    p->cur_mb = mb;
    p->hook_err = 0;
    ts_unet_set_unit_hook(p->m, unit_done, p);
    ts_fault_point("backward"); /* an injected kill at=backward */
    int err = ts_unet_backward_slot(p->m, k);
    ts_unet_set_unit_hook(p->m, NULL, NULL);
    p->st.backward_s += ts_time_now() - t0;
    TS_TRY(err);
    return p->hook_err; /* the gradients entering the stage went out as their units finished (unit_done) */
}

static double msg_s(const ts_pipeline *p)
{
    double s = p->recvs.wait_s + p->recvs.post_s;
    for (int j = 0; j < 2; j++) s += p->grad_sends[j].wait_s + p->grad_sends[j].post_s;
    for (int k = 0; k < p->slots; k++)
        s += p->act_sends[k].wait_s + p->act_sends[k].post_s + p->act_recvs[k].wait_s + p->act_recvs[k].post_s;
    return s;
}

static double sent_bytes(const ts_pipeline *p)
{
    double b = (double)p->grad_sends[0].bytes + (double)p->grad_sends[1].bytes;
    for (int k = 0; k < p->slots; k++) b += (double)p->act_sends[k].bytes;
    return b;
}

int ts_pipeline_step(ts_pipeline *p, ts_pipeline_next next, void *ctx, void (*hook)(void *, int), void *hook_ctx,
                     void (*before_last)(void *), double *loss)
{
    int err = 0;
    ts_pipe_op *ops = TS_CALLOC((size_t)(2 * p->M), sizeof *ops);
    if (!ops) return TS_ERR_NOMEM;
    const double t0 = ts_time_now(), m0 = msg_s(p);
    double sum = 0;
    TS_CHECK(ts_pipe_schedule(p->kind, p->P, p->s, p->M, ops));
    ts_arena_zero_grad(ts_unet_arena(p->m));
    int bdone = 0; /* backwards completed (in micro-batch order) */
    for (int i = 0; i < 2 * p->M; i++) {
        const int mb = ops[i].mb, k = mb % p->slots;
        if (!ops[i].backward) {
            ts_tensor img = {0}, lab = {0};
            if (p->s == 0 || p->s == p->P - 1) TS_CHECK(next(ctx, &img, &lab));
            TS_CHECK(ts_pipe_wait(&p->act_sends[k])); /* the slot's last use has left */
            double l = 0;
            TS_CHECK(forward_one(p, mb, p->s == 0 ? &img : NULL, p->s == p->P - 1 ? &lab : NULL, 1, &l));
            sum += l;
            if (bdone == 0 && p->grad_mb < 0) TS_CHECK(post_grad_recvs(p, 0)); /* the first backward's gradients */
        } else {
            const int last = mb == p->M - 1;
            if (last && before_last) before_last(hook_ctx);
            ts_unet_set_grad_hook(p->m, last ? hook : NULL, hook_ctx);
            err = backward_one(p, mb, mb + 1 < p->M ? mb + 1 : -1);
            ts_unet_set_grad_hook(p->m, NULL, NULL);
            TS_CHECK(err);
            bdone++;
        }
        /* the next forward's activations may start arriving once its slot is free */
        for (int j = i + 1; j < 2 * p->M; j++) {
            if (ops[j].backward) continue;
            const int nmb = ops[j].mb, nk = nmb % p->slots;
            if (p->recv_mb[nk] != nmb && (nmb < p->slots || nmb - p->slots < bdone)) TS_CHECK(post_act_recvs(p, nmb));
            break;
        }
    }
    for (int k = 0; k < p->slots; k++) TS_CHECK(ts_pipe_wait(&p->act_sends[k]));
    TS_CHECK(ts_pipe_wait(&p->grad_sends[0]));
    TS_CHECK(ts_pipe_wait(&p->grad_sends[1]));
    p->st.span_s += ts_time_now() - t0;
    p->st.p2p_s += msg_s(p) - m0;
    p->st.busy_s = p->st.forward_s + p->st.backward_s;
    p->st.bytes = sent_bytes(p);
    p->st.steps++;
    *loss = p->s == p->P - 1 ? sum / p->M : 0;
cleanup:
    free(ops);
    return err;
}

int ts_pipeline_forward(ts_pipeline *p, const ts_tensor *x, const ts_tensor **logits)
{
    *logits = NULL;
    TS_TRY(ts_pipe_wait(&p->act_sends[0]));
    double l;
    TS_TRY(forward_one(p, 0, p->s == 0 ? x : NULL, NULL, 0, &l));
    TS_TRY(ts_pipe_wait(&p->act_sends[0]));
    p->st.busy_s = p->st.forward_s + p->st.backward_s;
    if (p->s == p->P - 1) *logits = ts_unet_logits_slot(p->m, 0);
    return 0;
}

/* ------------------------------------------------------------ the cut */

/* normal values into t (on the GPU engine through a host copy) */
static int fill_random(ts_tensor *t, ts_rng *r)
{
    if (!t || !t->data || t->dtype == TS_UINT8) return 0;
    const size_t n = floats(t);
    float *x = t->device ? TS_MALLOC((n ? n : 1) * sizeof(float)) : t->data;
    if (!x) return TS_ERR(TS_ERR_NOMEM, "pipeline timing pass: %zu floats", n);
    for (size_t i = 0; i < n; i++) x[i] = (float)ts_rng_normal(r);
    int err = 0;
    if (t->device) {
        err = from_host(t, x);
        free(x);
    }
    return err;
}

int ts_pipeline_measure(ts_unet *m, MPI_Comm world, int batch, const int64_t box[3], double *cost)
{
    int err = 0, lerr = 0, size;
    const ts_unet_cfg *c = ts_unet_config(m);
    const int U = ts_unet_units(m);
    ts_tensor img = {0}, lab = {0};
    ts_unet_edge e[MAX_EDGES];
    const int ne = ts_unet_edges(m, e);
    ts_rng r;
    ts_rng_init(&r, 12345, 0, 99);
    ts_arena *ar = ts_unet_arena(m);
    float *keep = NULL; /* the batch-norm running statistics, which the timed forwards would move */
    TS_MPI(MPI_Comm_size(world, &size));
    keep = TS_MALLOC(sizeof(float) * (ar->nbuf ? ar->nbuf : 1));
    lerr = keep ? 0 : TS_ERR(TS_ERR_NOMEM, "pipeline timing pass");
    if (!lerr) {
        memcpy(keep, ar->buffers, sizeof(float) * ar->nbuf);
        lerr = ts_tensor_alloc(&img, TS_FLOAT32, 5, (const int64_t[]){batch, c->in_channels, box[0], box[1], box[2]});
    }
    if (!lerr) lerr = ts_tensor_alloc(&lab, TS_UINT8, 4, (const int64_t[]){batch, box[0], box[1], box[2]});
    TS_CHECK(ts_err_agree(world, lerr));
    (void)fill_random(&img, &r); /* a host tensor */
    for (int64_t i = 0; i < ts_tensor_numel(&lab); i++) ((uint8_t *)lab.data)[i] = (uint8_t)ts_rng_below(&r, (uint64_t)c->classes);
    for (int u = 0; u < U; u++) {
        lerr = ts_unet_set_stage(m, u, u + 1, 1);
        if (!lerr) lerr = ts_unet_setup(m, batch, (int)box[0], (int)box[1], (int)box[2]);
        TS_CHECK(ts_err_agree(world, lerr)); /* a rank without the memory fails with all, before the unit's collectives */
        double t = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            for (int i = 0; i < ne; i++) { /* what arrives: activations in, gradients of what leaves */
                ts_tensor *a, *g;
                if (e[i].consumer == u && e[i].producer != u) {
                    TS_CHECK(ts_unet_edge_tensors(m, 0, &e[i], &a, &g));
                    TS_CHECK(fill_random(a, &r));
                }
                if (e[i].producer == u && e[i].consumer != u) {
                    TS_CHECK(ts_unet_edge_tensors(m, 0, &e[i], &a, &g));
                    TS_CHECK(fill_random(g, &r));
                }
            }
            const double t0 = ts_time_now();
            TS_CHECK(ts_unet_forward_slot(m, 0, &img, 1));
            if (u == U - 1) {
                double l;
                TS_CHECK(ts_unet_loss_slot(m, 0, &lab, 1, &l));
            }
            TS_CHECK(ts_unet_backward_slot(m, 0));
            if (rep > 0 && ts_time_now() - t0 < t) t = ts_time_now() - t0; /* the first warms up; the fastest of the rest */
        }
        cost[u] = t;
    }
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, cost, U, MPI_DOUBLE, MPI_SUM, world));
    for (int u = 0; u < U; u++) cost[u] /= size;
cleanup:
    /* the measurement's gradients and statistics are not a step's; the model is whole again */
    ts_arena_zero_grad(ar);
    if (keep) memcpy(ar->buffers, keep, sizeof(float) * ar->nbuf);
    ts_unet_set_stage(m, 0, U, 1);
    ts_unet_profile_reset(m);
    free(keep);
    ts_tensor_free(&img);
    ts_tensor_free(&lab);
    return err;
}

int ts_pipeline_plan(ts_unet *m, MPI_Comm world, int P, const char *spec, int batch, const int64_t box[3], int *first,
                     double *cost)
{
    const int U = ts_unet_units(m);
    int err = 0;
    for (int u = 0; u < U; u++) cost[u] = 0;
    if (P > U) /* before any work */
        return ts_pipeline_cut(m, P, spec, cost, first);
    if (!spec || !strcmp(spec, "auto")) TS_TRY(ts_pipeline_measure(m, world, batch, box, cost));
    err = ts_pipeline_cut(m, P, spec, cost, first);
    TS_TRY(ts_err_agree(world, err));
    /* one cut everywhere, whatever the last bits of the reduced costs */
    TS_MPI_TRY(MPI_Bcast(first, P + 1, MPI_INT, 0, world));
    TS_MPI_TRY(MPI_Bcast(cost, U, MPI_DOUBLE, 0, world));
    return 0;
}

int ts_pipeline_cut(const ts_unet *m, int P, const char *spec, const double *cost, int *first)
{
    const int U = ts_unet_units(m);
    char name[32];
    if (P > U)
        return TS_ERR(TS_ERR_CONFIG, "parallel.pp = %d stages, but the model has only %d layer units to cut between "
                                     "(%d cut points; model.channels has %d levels): use parallel.pp <= %d", P, U, U - 1,
                      (U + 1) / 4, U);
    if (!spec || !strcmp(spec, "auto")) return ts_pipe_partition(cost, U, P, first);
    /* a list of the units that start stages 1 .. P-1 */
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    int n = 0;
    first[0] = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        int u = -1;
        char block[48];
        snprintf(block, sizeof block, "%s.conv1", tok); /* a block's name stands for its first conv */
        for (int k = 0; k < U; k++) {
            ts_unet_unit_name(m, k, name, sizeof name);
            if (!strcmp(tok, name) || !strcmp(block, name)) u = k;
        }
        if (u < 0)
            return TS_ERR(TS_ERR_CONFIG, "parallel.pp_cut = '%s': '%s' is not a unit of the model (enc0.conv1, enc0.conv2, "
                          "..., dec0.conv2, head; a block's name, e.g. dec1, means its first conv)", spec, tok);
        if (++n >= P) return TS_ERR(TS_ERR_CONFIG, "parallel.pp_cut = '%s': more cuts than parallel.pp - 1 = %d", spec, P - 1);
        if (u <= first[n - 1])
            return TS_ERR(TS_ERR_CONFIG, "parallel.pp_cut = '%s': '%s' does not come after the previous stage's first unit "
                                         "(units run enc0.conv1 .. enc%d.conv2, dec%d.conv1 .. dec0.conv2, head)", spec, tok,
                          (U + 1) / 4 - 1, (U + 1) / 4 - 2);
        first[n] = u;
    }
    if (n != P - 1)
        return TS_ERR(TS_ERR_CONFIG, "parallel.pp_cut = '%s': %d cuts, parallel.pp = %d stages need %d", spec, n, P, P - 1);
    first[P] = U;
    return 0;
}

int ts_pipeline_create_on(ts_unet *m, const ts_layout *L, int batch, int *first, double *cost, ts_pipeline **out)
{
    *out = NULL;
    const int P = L->grid->pp;
    if (P == 1) return 0;
    const ts_spatial_stats halo0 = *ts_spatial_get_stats(L->spatial); /* the timing pass's exchanges are not a step's */
    TS_TRY(ts_pipeline_plan(m, L->grid->world, P, L->spec.pp_cut, batch, L->box, first, cost));
    ts_spatial_set_stats(L->spatial, &halo0);
    return ts_pipeline_create(m, L->grid->pp_comm, first, L->spec.schedule, L->micro, out);
}
