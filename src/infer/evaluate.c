/* Sliding-window evaluation; see evaluate.h. Owns the prediction of a
 * whole volume window by window over the replicas (and a spatial group or
 * pipeline stages) and the Dice counts; must not train or read a dataset
 * (the caller hands it volumes). */
#include "tsbuild.h"
#include "src/infer/evaluate.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/infer/window.h"
#include "src/nn/layers.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* One forward of a batch's windows on model m (the pipeline's when sp has
 * one): *lt its logits, NULL on a stage before the head */
static int forward(ts_unet *m, const ts_eval_split *sp, ts_tensor *x, const ts_tensor **lt)
{
    *lt = NULL;
    if (ts_fault_at(TS_FAULT_ERROR, ts_fault_step(), "window")) /* TESSERA_FAULT=error:at=window */
        return TS_ERR(TS_ERR_ARG, "evaluation: a window forward failed: injected error (TESSERA_FAULT)");
    if (sp && sp->forward) return sp->forward(sp->forward_ctx, x, lt);
    ts_unet_set_fold_eval(m, 1); /* batch norm in the convolutions' epilogues: same logits, fewer passes */
    const int ferr = ts_unet_forward(m, x, 0);
    ts_unet_set_fold_eval(m, 0);
    TS_TRY(ferr);
    *lt = ts_unet_logits(m);
    return *lt ? 0 : ts_err_last(); /* NULL: the copy from the GPU failed */
}

/* The windows of batch b of this rank's (R of P; mine in all) into in
 * [batch, C, box], origins into og; the number of windows used */
static int cut_batch(const ts_window_plan *plan, int64_t b, int batch, int64_t mine, int R, int P, const int64_t *blo,
                     const int64_t *bsz, const float *image, int C, float *in, int64_t (*og)[3])
{
    const int64_t bv = bsz[0] * bsz[1] * bsz[2];
    int used = 0;
    for (int s = 0; s < batch; s++) {
        const int64_t k = b * batch + s, idx = R + k * P;
        if (k >= mine) {
            memset(in + (size_t)s * C * bv, 0, sizeof *in * (size_t)(C * bv));
            continue;
        }
        ts_window_origin(plan, idx, og[s]);
        ts_window_extract_box(plan, og[s], blo, bsz, image, C, in + (size_t)s * C * bv);
        used = s + 1;
    }
    return used;
}

/* What the streams of one prediction share (ts_eval_predict with nm > 1) */
typedef struct streams {
    ts_unet *const *ms;
    int nm, batch, R, P, C, K;
    int64_t rounds, mine, bv, win[3]; /* bv: voxels of a window (win) */
    const ts_window_plan *plan;
    const float *image, *gw;
    float *in, *acc, *wsum; /* in: nm inputs of batch windows */
    int64_t (*og)[3];       /* nm x batch origins */
} streams;

/* A finished batch's logits waiting for its turn to be blended */
typedef struct pending {
    float *lg;        /* [batch][bv][K] */
    int64_t (*og)[3]; /* [batch] window origins */
    int used;
    int64_t b; /* the batch held; -1: free (read and written atomically) */
} pending;

/* What the streams share besides q: the slots (batch b in slot b % ns),
 * the next batch to blend and the lock of whoever blends */
typedef struct blend_queue {
    pending *slot;
    int ns;
    int64_t next; /* written under lk, read atomically */
#ifdef _OPENMP
    omp_lock_t lk;
#endif
} blend_queue;

static void queue_close(blend_queue *bq)
{
    for (int i = 0; bq->slot && i < bq->ns; i++) {
        free(bq->slot[i].lg);
        free(bq->slot[i].og);
    }
    free(bq->slot);
    bq->slot = NULL;
#ifdef _OPENMP
    omp_destroy_lock(&bq->lk);
#endif
}

/* ns free slots of batch windows' logits (per_slot floats) and origins */
static int queue_open(blend_queue *bq, int ns, size_t per_slot, int batch)
{
    bq->ns = ns;
    bq->next = 0;
#ifdef _OPENMP
    omp_init_lock(&bq->lk);
#endif
    bq->slot = calloc((size_t)ns, sizeof *bq->slot);
    int ok = bq->slot != NULL;
    for (int i = 0; ok && i < ns; i++) {
        bq->slot[i].b = -1;
        bq->slot[i].lg = malloc(per_slot * sizeof(float));
        bq->slot[i].og = calloc((size_t)batch, sizeof *bq->slot[i].og);
        ok = bq->slot[i].lg && bq->slot[i].og;
    }
    if (ok) return 0;
    queue_close(bq);
    return TS_ERR(TS_ERR_NOMEM, "evaluation: %d slots of %zu logits each for the streams", ns, per_slot);
}

/* Local, any stream. Blends the waiting batches in batch order (next,
 * next + 1, ... while each is in its slot) unless another stream is
 * blending: then returns at once, and that stream or a later call takes
 * them. */
static void drain(const streams *q, blend_queue *bq)
{
    const int64_t zero[3] = {0, 0, 0};
#ifdef _OPENMP
    if (!omp_test_lock(&bq->lk)) return;
#endif
    for (;;) {
        pending *p = &bq->slot[bq->next % bq->ns];
        int64_t held;
#pragma omp atomic read seq_cst
        held = p->b;
        if (held != bq->next) break;
        for (int s = 0; s < p->used; s++)
            ts_window_accumulate_box(q->plan, p->og[s], zero, q->win, p->lg + (size_t)s * q->bv * q->K, q->K, q->gw,
                                     q->acc, q->wsum);
#pragma omp atomic write seq_cst
        p->b = -1;
#pragma omp atomic write seq_cst
        bq->next = bq->next + 1;
    }
#ifdef _OPENMP
    omp_unset_lock(&bq->lk);
#endif
}

/* Local. The batches of this rank's windows over nm streams at once, each
 * stream taking the next batch when its forward is done (a stream held
 * back by its core does fewer), stream j on model ms[j] with its own input
 * buffer and threads/nm OpenMP threads for its layers. A finished batch's
 * logits are copied into one of nm + 2 slots and blended in batch order by
 * whichever stream finds them ready (drain): the same sums, in the same
 * order, as one stream, and no stream waits for another's forward unless
 * every slot is full. *net the streams' mean time in forwards. A stream's
 * error stops the others' forwards and is returned with its message. With
 * several threads a stream, the layers' regions are nested (GCC's runtime
 * starts their threads anew for each). */
static int streams_run(const streams *q, double *net, int64_t *fmin, int64_t *fmax)
{
    const int64_t zero[3] = {0, 0, 0}, *bsz = q->win;
    const size_t per_slot = (size_t)q->batch * (size_t)q->bv * (size_t)q->K;
    int code = 0, stop = 0;
    char msg[2048] = ""; /* the failing stream's message (thread-local there), as long as error.c keeps */
    double busy = 0;
    int64_t lo = INT64_MAX, hi = 0;
    blend_queue bq;
    TS_TRY(queue_open(&bq, q->nm + 2, per_slot, q->batch));
#ifdef _OPENMP
    const int per = omp_get_max_threads() / q->nm > 1 ? omp_get_max_threads() / q->nm : 1;
    const int levels = omp_get_max_active_levels();
    if (per > 1 && levels < 2) omp_set_max_active_levels(2);
#endif
#pragma omp parallel num_threads(q->nm) reduction(+ : busy) reduction(min : lo) reduction(max : hi)
    {
        int j = 0;
        int64_t mine = 0; /* this stream's forwards */
#ifdef _OPENMP
        j = omp_get_thread_num();
        omp_set_num_threads(per);
#endif
        float *in = q->in + (size_t)j * q->batch * q->C * q->bv;
        int64_t (*og)[3] = q->og + (size_t)j * q->batch;
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < q->rounds; b++) {
            int quit;
#pragma omp atomic read
            quit = stop;
            if (quit) continue;
            const int used = cut_batch(q->plan, b, q->batch, q->mine, q->R, q->P, zero, bsz, q->image, q->C, in, og);
            int64_t shape[5] = {q->batch, q->C, bsz[0], bsz[1], bsz[2]};
            ts_tensor x = ts_tensor_view(in, TS_FLOAT32, 5, shape);
            const ts_tensor *lt = NULL;
            const double t = MPI_Wtime();
            const int e = forward(q->ms[j], NULL, &x, &lt);
            busy += MPI_Wtime() - t;
            mine++;
            if (e) { /* without sp, forward gives logits or fails */
#pragma omp critical(ts_eval_streams_error)
                if (!code) {
                    code = e;
                    snprintf(msg, sizeof msg, "%s", ts_err_message());
                }
#pragma omp atomic write
                stop = 1;
                continue;
            }
            /* batch b may take slot b % ns once every batch before b - ns
             * is blended (b < next + ns): then the slot's last batch is
             * blended and no batch it waits for can need the slot (a
             * stream ahead of the others by ns batches waits here, and
             * blends while it waits) */
            pending *p = &bq.slot[b % bq.ns];
            for (;;) {
                int64_t nx;
#pragma omp atomic read seq_cst
                nx = bq.next;
#pragma omp atomic read
                quit = stop;
                if (b < nx + bq.ns || quit) break;
                drain(q, &bq);
            }
            if (quit) continue;
            memcpy(p->lg, lt->data, (size_t)used * (size_t)q->bv * (size_t)q->K * sizeof(float));
            memcpy(p->og, og, (size_t)used * sizeof *og);
            p->used = used;
#pragma omp atomic write seq_cst
            p->b = b;
            drain(q, &bq);
        }
        /* the loop's barrier: every batch is in its slot (or a stream
         * failed); the rest in order */
#pragma omp single
        if (!stop)
            while (bq.next < q->rounds) drain(q, &bq);
        /* the other streams' threads are OpenMP's pooled ones, which outlive
         * this call: their cached layer scratch and Winograd weights go now */
        if (j) ts_nn_release_scratch();
        lo = mine;
        hi = mine;
    }
#ifdef _OPENMP
    if (per > 1 && levels < 2) omp_set_max_active_levels(levels);
#endif
    queue_close(&bq);
    *net = busy / q->nm;
    *fmin = lo;
    *fmax = hi;
    if (code) return TS_ERR(code, "%s", msg);
    return 0;
}

/* Collective on c: 0 where no rank failed; else this rank's own error (its
 * message stands) or, on the others, TS_ERR_REMOTE saying that another rank
 * `what` */
static int agreed(ts_coll *c, int lerr, const char *what)
{
    int32_t bad = lerr != 0;
    TS_TRY(ts_coll_allreduce(c, TS_IN_PLACE, &bad, 1, TS_INT32, TS_OP_MAX));
    if (lerr) return lerr;
    return bad ? TS_ERR(TS_ERR_REMOTE, "evaluation: another rank%s (see its message)", what) : 0;
}

int ts_eval_predict(ts_unet *const *ms, int nm, ts_coll *coll, const ts_eval_split *sp, const float *image,
                    const int64_t dhw[3], double overlap, int batch, uint8_t *pred, float *prob, ts_eval_stats *st)
{
    int err = 0;
    ts_unet *m = ms[0];
    const ts_unet_cfg *u = ts_unet_config(m);
    const int C = u->in_channels, K = u->classes, P = ts_coll_size(coll), R = ts_coll_rank(coll);
    const int64_t win[3] = {u->patch[0], u->patch[1], u->patch[2]}, wv = win[0] * win[1] * win[2];
    const int64_t zero[3] = {0, 0, 0}, *blo = sp ? sp->box_lo : zero, *bsz = sp ? sp->box_size : win;
    const int64_t bv = bsz[0] * bsz[1] * bsz[2]; /* voxels of this rank's box of a window */
    const int64_t nv = dhw[0] * dhw[1] * dhw[2];
    ts_window_plan plan;
    float *acc = NULL, *wsum = NULL, *gw = NULL, *in = NULL;
    int64_t (*og)[3] = NULL;
    if (nm < 1 || (nm > 1 && sp))
        return TS_ERR(TS_ERR_ARG, "evaluation: %d models at once (1, or more without a spatial split or stages)", nm);
    /* buffers and the models' activations for a batch of boxes each; a
     * rank that cannot have them fails with every rank, before any collective */
    {
        int lerr = ts_window_plan_make(dhw, win, overlap, &plan);
        if (!lerr) {
            /* K planes of probability, then the weight sum (for probabilities only: the argmax needs none) */
            const size_t nacc = (size_t)(nv * (K + (prob != NULL)));
            acc = TS_ALIGNED_ALLOC(nacc * sizeof *acc); /* large: in huge pages where the kernel has them */
            if (acc) memset(acc, 0, nacc * sizeof *acc);
            gw = malloc(sizeof *gw * (size_t)wv);
            in = calloc((size_t)(nm * batch * C * bv), sizeof *in);
            og = calloc((size_t)(nm * batch), sizeof *og);
            if (!acc || !gw || !in || !og)
                lerr = TS_ERR(TS_ERR_NOMEM, "evaluation buffers for a %lldx%lldx%lld volume", (long long)dhw[0],
                              (long long)dhw[1], (long long)dhw[2]);
        }
        for (int j = 0; j < nm && !lerr; j++) lerr = ts_unet_setup(ms[j], batch, (int)bsz[0], (int)bsz[1], (int)bsz[2]);
        TS_CHECK(agreed(sp ? sp->all : coll, lerr, " could not set up its buffers"));
    }
    wsum = prob ? acc + nv * K : NULL;
    ts_window_gaussian(win, gw);
    /* this rank's windows: r, r + P, r + 2P, ... in batches */
    int64_t mine = plan.count > R ? (plan.count - R + P - 1) / P : 0;
    int64_t rounds = (mine + batch - 1) / batch;
    double t_net = 0, t_blend = 0, t0 = MPI_Wtime(), t1;
    int64_t smin = 0, smax = 0; /* the streams' fewest and most forwards */
    int ferr = 0;
    if (nm == 1) {
        for (int64_t b = 0; b < rounds; b++) {
            const int used = cut_batch(&plan, b, batch, mine, R, P, blo, bsz, image, C, in, og);
            int64_t shape[5] = {batch, C, bsz[0], bsz[1], bsz[2]};
            ts_tensor x = ts_tensor_view(in, TS_FLOAT32, 5, shape);
            const ts_tensor *lt = NULL;
            t1 = MPI_Wtime();
            t_blend += t1 - t0;
            ferr = forward(m, sp, &x, &lt);
            t0 = MPI_Wtime();
            t_net += t0 - t1;
            if (ferr) break; /* told to the other ranks below, before the sums */
            if (!lt) continue; /* a stage before the head */
            const float *lg = lt->data; /* [B, box..., K] */
            for (int s = 0; s < used; s++)
                ts_window_accumulate_box(&plan, og[s], blo, bsz, lg + (size_t)s * bv * K, K, gw, acc, wsum);
        }
    } else
    {
        const streams q = {ms,  nm,    batch, R,     P,  C,  K,   rounds, mine, bv, {win[0], win[1], win[2]},
                           &plan, image, gw,   in, acc, wsum, og};
        ferr = streams_run(&q, &t_net, &smin, &smax);
    }
    /* a rank whose forward failed fails with every rank, before the sums' collective */
    TS_CHECK(agreed(sp ? sp->all : coll, ferr, "'s window forward failed"));
    t1 = MPI_Wtime();
    t_blend += t1 - t0;
    if (nm > 1) t_blend -= t_net; /* the loop's wall time less the streams' mean time in forwards */
    /* every rank's windows (and boxes) into every rank's sums */
    TS_CHECK(ts_coll_allreduce(sp ? sp->all : coll, TS_IN_PLACE, acc, (size_t)(nv * (K + (prob != NULL))), TS_FLOAT32, TS_OP_SUM));
    for (int64_t v = 0; v < nv; v++) {
        int best = 0;
        float bv = acc[v];
        for (int k = 1; k < K; k++)
            if (acc[k * nv + v] > bv) {
                bv = acc[k * nv + v];
                best = k;
            }
        pred[v] = (uint8_t)best;
    }
    if (prob)
        for (int64_t v = 0; v < nv; v++)
            for (int k = 0; k < K; k++) prob[k * nv + v] = acc[k * nv + v] / wsum[v];
    if (st) {
        st->network_s += t_net;
        st->blend_s += t_blend;
        st->reduce_s += MPI_Wtime() - t1;
        st->windows += plan.count;
        st->forwards += rounds;
        st->stream_min += smin;
        st->stream_max += smax;
    }
cleanup:
    free(acc);
    free(gw);
    free(in);
    free(og);
    return err;
}

void ts_eval_confusion(const uint8_t *pred, const uint8_t *label, int64_t n, int K, int64_t *tp, int64_t *fp,
                       int64_t *fn)
{
    for (int64_t v = 0; v < n; v++) {
        int p = pred[v], l = label[v];
        if (p == l) {
            if (p < K) tp[p]++;
        } else {
            if (p < K) fp[p]++;
            if (l < K) fn[l]++;
        }
    }
}

double ts_eval_dice(int64_t tp, int64_t fp, int64_t fn)
{
    int64_t d = 2 * tp + fp + fn;
    return d ? 2.0 * (double)tp / (double)d : NAN;
}

int ts_eval_parse_axes(const char *s, int *mask)
{
    *mask = 0;
    if (!strcmp(s, "none")) return 0;
    for (const char *p = s; *p; p++) {
        const int b = *p == 'x' ? TS_EVAL_FLIP_W : *p == 'y' ? TS_EVAL_FLIP_H : *p == 'z' ? TS_EVAL_FLIP_D : 0;
        if (!b || (*mask & b)) return -1;
        *mask |= b;
    }
    return *s ? 0 : -1;
}
