/* Sliding-window evaluation; see evaluate.h. Owns the prediction of a
 * whole volume window by window over the replicas (and a spatial group or
 * pipeline stages) and the Dice counts; must not train or read a dataset
 * (the caller hands it volumes). */
#include "tsbuild.h"
#include "src/infer/evaluate.h"
#include "src/core/error.h"
#include "src/infer/window.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

int ts_eval_predict(ts_unet *m, ts_coll *coll, const ts_eval_split *sp, const float *image, const int64_t dhw[3],
                    double overlap, int batch, uint8_t *pred, float *prob, ts_eval_stats *st)
{
    int err = 0;
    const ts_unet_cfg *u = ts_unet_config(m);
    const int C = u->in_channels, K = u->classes, P = ts_coll_size(coll), R = ts_coll_rank(coll);
    const int64_t win[3] = {u->patch[0], u->patch[1], u->patch[2]}, wv = win[0] * win[1] * win[2];
    const int64_t zero[3] = {0, 0, 0}, *blo = sp ? sp->box_lo : zero, *bsz = sp ? sp->box_size : win;
    const int64_t bv = bsz[0] * bsz[1] * bsz[2]; /* voxels of this rank's box of a window */
    const int64_t nv = dhw[0] * dhw[1] * dhw[2];
    ts_window_plan plan;
    float *acc = NULL, *wsum = NULL, *gw = NULL, *in = NULL;
    int64_t (*og)[3] = NULL;
    /* buffers and the model's activations for a batch of boxes; a rank that
     * cannot have them fails with every rank, before any collective */
    {
        int lerr = ts_window_plan_make(dhw, win, overlap, &plan);
        if (!lerr) {
            /* K planes of probability, then the weight sum (for probabilities only: the argmax needs none) */
            const size_t nacc = (size_t)(nv * (K + (prob != NULL)));
            acc = TS_ALIGNED_ALLOC(nacc * sizeof *acc); /* large: in huge pages where the kernel has them */
            if (acc) memset(acc, 0, nacc * sizeof *acc);
            gw = malloc(sizeof *gw * (size_t)wv);
            in = calloc((size_t)(batch * C * bv), sizeof *in);
            og = calloc((size_t)batch, sizeof *og);
            if (!acc || !gw || !in || !og)
                lerr = TS_ERR(TS_ERR_NOMEM, "evaluation buffers for a %lldx%lldx%lld volume", (long long)dhw[0],
                              (long long)dhw[1], (long long)dhw[2]);
        }
        if (!lerr) lerr = ts_unet_setup(m, batch, (int)bsz[0], (int)bsz[1], (int)bsz[2]);
        int32_t bad = lerr != 0;
        TS_CHECK(ts_coll_allreduce(sp ? sp->all : coll, TS_IN_PLACE, &bad, 1, TS_INT32, TS_OP_MAX));
        if (lerr) {
            err = lerr; /* its own message stands */
            goto cleanup;
        }
        if (bad) TS_FAIL(TS_ERR_REMOTE, "evaluation: another rank could not set up its buffers (see its message)");
    }
    wsum = prob ? acc + nv * K : NULL;
    ts_window_gaussian(win, gw);
    /* this rank's windows: r, r + P, r + 2P, ... in batches */
    int64_t mine = plan.count > R ? (plan.count - R + P - 1) / P : 0;
    int64_t rounds = (mine + batch - 1) / batch;
    double t_net = 0, t_blend = 0, t0 = MPI_Wtime(), t1;
    for (int64_t b = 0; b < rounds; b++) {
        int64_t (*origin)[3] = og;
        int used = 0;
        for (int s = 0; s < batch; s++) {
            int64_t k = b * batch + s, idx = R + k * P;
            if (k >= mine) {
                memset(in + (size_t)s * C * bv, 0, sizeof *in * (size_t)(C * bv));
                continue;
            }
            ts_window_origin(&plan, idx, origin[s]);
            ts_window_extract_box(&plan, origin[s], blo, bsz, image, C, in + (size_t)s * C * bv);
            used = s + 1;
        }
        int64_t shape[5] = {batch, C, bsz[0], bsz[1], bsz[2]};
        ts_tensor x = ts_tensor_view(in, TS_FLOAT32, 5, shape);
        const ts_tensor *lt = NULL;
        t1 = MPI_Wtime();
        t_blend += t1 - t0;
        if (sp && sp->forward) TS_CHECK(sp->forward(sp->forward_ctx, &x, &lt));
        else {
            ts_unet_set_fold_eval(m, 1); /* batch norm in the convolutions' epilogues: same logits, fewer passes */
            const int ferr = ts_unet_forward(m, &x, 0);
            ts_unet_set_fold_eval(m, 0);
            TS_CHECK(ferr);
            lt = ts_unet_logits(m);
            if (!lt) TS_CHECK(ts_err_last()); /* the copy from the GPU failed */
        }
        t0 = MPI_Wtime();
        t_net += t0 - t1;
        if (!lt) continue; /* a stage before the head */
        const float *lg = lt->data; /* [B, box..., K] */
        for (int s = 0; s < used; s++)
            ts_window_accumulate_box(&plan, origin[s], blo, bsz, lg + (size_t)s * bv * K, K, gw, acc, wsum);
    }
    t1 = MPI_Wtime();
    t_blend += t1 - t0;
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
