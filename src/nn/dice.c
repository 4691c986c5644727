/* Soft Dice loss on softmax probabilities, per sample and class, averaged
 * (MONAI DiceLoss(softmax=True, to_onehot_y=True), smooth in numerator and
 * denominator). With o->sync (samples split over the ranks of a group) the
 * per-sample per-class sums are summed over the group, with error flags in
 * the same sums so that every rank of the group fails together. */
#pragma GCC optimize("O3")
#include "tsbuild.h"
#include "src/nn/layers.h"
#ifdef TS_HAVE_CUDA
#include "src/nn/cuda/cuda_nn.h"
#endif
#include "src/nn/loss_impl.h"
#pragma GCC diagnostic ignored "-Wpsabi" /* loss_impl.h's vector helpers are static: no call leaves this file, no ABI to differ */

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 4096

typedef double v8d __attribute__((vector_size(64)));
static inline v8d lo8(ts_lv16 v) { return __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), v8d); }
static inline v8d hi8(ts_lv16 v)
{
    return __builtin_convertvector(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15), v8d);
}
static inline int has_lane(ts_li16 m)
{
    int r = 0;
    for (int j = 0; j < TS_LANES; j++) r |= m[j];
    return r != 0;
}

/* s[n][k][0..2] = sum p g, sum p, sum g over the sample's kept voxels (over
 * the group's voxels with o->sync). Errors after the shape check are agreed
 * through the sums: a label that is not a class on any rank fails every
 * rank with TS_ERR_ARG, any other failure with TS_ERR_REMOTE elsewhere. */
static int dice_sums(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, double **out)
{
    int64_t V = 0, N = 1;
    int K = 1, err = 0, label_err = 0;
    TS_TRY(ts_nn_loss_shapes(logits, labels, "dice", &V, &K, &N));
    const int64_t S = V / N, nch = (S + CHUNK - 1) / CHUNK;
    const size_t ns = (size_t)N * 3 * K; /* the sums; with sync two error flags follow */
    const int sync = o && o->sync;
    if (sync && ns + 2 > INT_MAX) return TS_ERR(TS_ERR_UNSUPPORTED, "dice: %zu sums to synchronise", ns);
    const float *l = logits->data;
    const uint8_t *y = labels->data;
    const int ign = o ? o->ignore_index : -1;
    double *s = TS_CALLOC(ns + (sync ? 2 : 0), sizeof(double));
    if (!s) return TS_ERR(TS_ERR_NOMEM, "dice sums");
    double *part = TS_CALLOC((size_t)(N * nch) * 3 * K, sizeof(double));
    int64_t bad = -1;
    if (!part) {
        err = TS_ERR(TS_ERR_NOMEM, "dice sums");
    } else {
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t it = 0; it < N * nch; it++) {
            const int64_t n = it / nch, v0 = n * S + it % nch * CHUNK, v1 = v0 + CHUNK < (n + 1) * S ? v0 + CHUNK : (n + 1) * S;
            double *ps = part + (size_t)it * 3 * K;
            float p[256 * TS_LANES];
            v8d acc[2 * 16 * 2]; /* up to 16 classes: sum p and sum p g per class and lane (full blocks) */
            ts_li16 cnt[16];     /* sum g per class and lane */
            const int lanes = K <= 16;
            if (lanes) {
                memset(acc, 0, sizeof acc);
                memset(cnt, 0, sizeof cnt);
            }
            for (int64_t b0 = v0; b0 < v1; b0 += TS_LANES) {
                const int nv = v1 - b0 < TS_LANES ? (int)(v1 - b0) : TS_LANES;
                ts_nn_softmax16(l + b0 * K, K, nv, p, NULL);
                if (lanes && nv == TS_LANES) {
                    const ts_li16 t = ts_nn_labels16(y + b0, nv), keep = (t != ign) & (t >= 0);
                    if (!has_lane(keep & (t >= K))) { /* no label out of range: the sums in vectors */
                        for (int k = 0; k < K; k++) {
                            const ts_lv16 pk = ts_nn_vsel(keep, ts_nn_ld16(p + k * TS_LANES), (ts_lv16){0});
                            const ts_li16 g = keep & (t == k);
                            const ts_lv16 pg = ts_nn_vsel(g, pk, (ts_lv16){0});
                            acc[4 * k] += lo8(pk);
                            acc[4 * k + 1] += hi8(pk);
                            acc[4 * k + 2] += lo8(pg);
                            acc[4 * k + 3] += hi8(pg);
                            cnt[k] -= g; /* true lanes are -1 */
                        }
                        continue;
                    }
                }
                for (int j = 0; j < nv; j++) {
                    const int64_t v = b0 + j;
                    const int t = y[v];
                    if (ts_nn_ignored(t, ign)) continue;
                    if (t >= K) {
#pragma omp critical(ts_dice_bad)
                        if (bad < 0 || v < bad) bad = v;
                        continue;
                    }
                    for (int k = 0; k < K; k++) ps[3 * k + 1] += p[k * TS_LANES + j];
                    ps[3 * t] += p[t * TS_LANES + j];
                    ps[3 * t + 2] += 1.0;
                }
            }
            if (lanes) /* the lanes' sums, in lane order */
                for (int k = 0; k < K; k++) {
                    double sp = 0, spg = 0;
                    for (int j = 0; j < 8; j++) sp += acc[4 * k][j], spg += acc[4 * k + 2][j];
                    for (int j = 0; j < 8; j++) sp += acc[4 * k + 1][j], spg += acc[4 * k + 3][j];
                    int64_t c = 0;
                    for (int j = 0; j < TS_LANES; j++) c += cnt[k][j];
                    ps[3 * k] += spg;
                    ps[3 * k + 1] += sp;
                    ps[3 * k + 2] += (double)c;
                }
        }
        for (int64_t it = 0; it < N * nch; it++)
            for (int i = 0; i < 3 * K; i++) s[(it / nch) * 3 * K + i] += part[(size_t)it * 3 * K + i];
        free(part);
    }
    if (!err && bad >= 0) {
        label_err = 1;
        err = TS_ERR(TS_ERR_ARG, "dice: label %d at voxel %lld is not a class (0..%d) nor the ignore index", y[bad],
                     (long long)bad, K - 1);
    }
    if (sync) {
        s[ns] = label_err ? 1.0 : 0.0;
        s[ns + 1] = err && !label_err ? 1.0 : 0.0;
        const int e = o->sync(o->sync_ctx, s, (int)(ns + 2), TS_SYNC_SUM);
        if (!err && e) err = e;
        else if (!err && s[ns] > 0)
            err = TS_ERR(TS_ERR_ARG, "dice: a label on another rank of the group is not a class (0..%d) nor the ignore index",
                         K - 1);
        else if (!err && s[ns + 1] > 0)
            err = TS_ERR(TS_ERR_REMOTE, "dice: another rank of the group failed");
    }
    if (err) {
        free(s);
        return err;
    }
    *out = s;
    return 0;
}

int ts_dice_forward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, double *loss)
{
#ifdef TS_HAVE_CUDA
    if (logits->device) return ts_cuda_dice(logits, labels, o, 0.0f, loss, NULL);
#endif
    double *s;
    TS_TRY(dice_sums(logits, labels, o, &s));
    const int K = (int)logits->shape[logits->ndim - 1];
    const int64_t N = logits->shape[0];
    const double sm = o ? o->dice_smooth : 1e-5;
    double acc = 0;
    for (int64_t i = 0; i < N * K; i++) acc += 1.0 - (2.0 * s[3 * i] + sm) / (s[3 * i + 1] + s[3 * i + 2] + sm);
    *loss = acc / (double)(N * K);
    free(s);
    return 0;
}

static int dice_grad(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale,
                     double *loss, ts_tensor *dlogits)
{
    double *s;
    if (!ts_tensor_f32(dlogits) || !ts_tensor_same_shape(dlogits, logits))
        return TS_ERR(TS_ERR_ARG, "dice: the logit gradient must be float32 shaped like the logits");
    TS_TRY(dice_sums(logits, labels, o, &s));
    const int K = (int)logits->shape[logits->ndim - 1];
    const int64_t N = logits->shape[0], V = ts_tensor_numel(labels), S = V / N;
    const double sm = o ? o->dice_smooth : 1e-5;
    /* dL/dp[v][k] = A[n][k] + g * B[n][k] */
    float *AB = TS_ALIGNED_ALLOC((size_t)N * K * 2 * sizeof(float));
    if (!AB) {
        free(s);
        return TS_ERR_NOMEM;
    }
    double acc = 0;
    for (int64_t i = 0; i < N * K; i++) {
        const double den = s[3 * i + 1] + s[3 * i + 2] + sm, num = 2.0 * s[3 * i] + sm, c = scale / (double)(N * K);
        acc += 1.0 - num / den;
        AB[2 * i] = (float)(c * num / (den * den));
        AB[2 * i + 1] = (float)(-c * 2.0 / den);
    }
    if (loss) *loss = acc / (double)(N * K);
    free(s);
    const float *l = logits->data;
    const uint8_t *y = labels->data;
    const int ign = o ? o->ignore_index : -1;
    float *d = dlogits->data;
    const int64_t nb = (V + TS_LANES - 1) / TS_LANES;
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t b0 = b * TS_LANES;
        const int nv = V - b0 < TS_LANES ? (int)(V - b0) : TS_LANES;
        float p[256 * TS_LANES], g[256 * TS_LANES];
        ts_nn_softmax16(l + b0 * K, K, nv, p, NULL);
        /* dL/dl_k = p_k (dp_k - sum_i p_i dp_i), dp_k = A_k + [k = t] B_k (the
         * sample's A, B), 16 voxels at a time; ignored voxels get nothing */
        const ts_li16 t = ts_nn_labels16(y + b0, nv), keep = (t != ign) & (t >= 0);
        ts_lv16 dot = {0};
        const int64_t n0 = b0 / S, n1 = (b0 + nv - 1) / S;
        int32_t nl[TS_LANES];
        for (int j = 0; j < TS_LANES; j++) nl[j] = (int32_t)((j < nv ? b0 + j : b0) / S - n0);
        for (int k = 0; k < K; k++) {
            ts_lv16 pk, A, B;
            memcpy(&pk, p + k * TS_LANES, sizeof pk);
            if (n0 == n1) {
                A = (ts_lv16){0} + AB[(size_t)n0 * K * 2 + 2 * k];
                B = (ts_lv16){0} + AB[(size_t)n0 * K * 2 + 2 * k + 1];
            } else { /* a block across samples */
                for (int j = 0; j < TS_LANES; j++) {
                    A[j] = AB[(size_t)(n0 + nl[j]) * K * 2 + 2 * k];
                    B[j] = AB[(size_t)(n0 + nl[j]) * K * 2 + 2 * k + 1];
                }
            }
            const ts_lv16 dpk = A + ts_nn_vsel(t == k, B, (ts_lv16){0});
            dot += pk * dpk;
            memcpy(g + k * TS_LANES, &dpk, sizeof dpk);
        }
        for (int k = 0; k < K; k++) {
            ts_lv16 pk, dpk;
            memcpy(&pk, p + k * TS_LANES, sizeof pk);
            memcpy(&dpk, g + k * TS_LANES, sizeof dpk);
            const ts_lv16 gk = ts_nn_vsel(keep, pk * (dpk - dot), (ts_lv16){0});
            memcpy(g + k * TS_LANES, &gk, sizeof gk);
        }
        ts_nn_add_lanes(d + b0 * K, K, nv, g);
    }
    free(AB);
    return 0;
}

int ts_dice_backward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale,
                     ts_tensor *dlogits)
{
#ifdef TS_HAVE_CUDA
    if (logits->device && dlogits) return ts_cuda_dice(logits, labels, o, scale, NULL, dlogits);
#endif
    return dice_grad(logits, labels, o, scale, NULL, dlogits);
}

int ts_dice_forward_backward(const ts_tensor *logits, const ts_tensor *labels, const ts_loss_opts *o, float scale,
                             double *loss, ts_tensor *dlogits)
{
#ifdef TS_HAVE_CUDA
    if (logits->device && dlogits) return ts_cuda_dice(logits, labels, o, scale, loss, dlogits);
#endif
    return dice_grad(logits, labels, o, scale, loss, dlogits);
}
