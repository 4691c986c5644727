/* Test-time mirroring (evaluate.h): the volume flipped along every subset
 * of the chosen axes, each flip predicted by the sliding window
 * (ts_eval_predict, so windows over the replicas and boxes over a spatial
 * group or pipeline stages as without mirroring), its probabilities
 * flipped back and averaged, as nnU-Net's mirroring with all three axes
 * (8 predictions). Owns the flips and their average only; the windows are
 * evaluate.c's. */
#include "tsbuild.h"
#include "src/infer/evaluate.h"
#include "src/core/error.h"

#include <stdlib.h>
#include <string.h>

void ts_eval_flip(const float *in, float *out, int C, const int64_t dhw[3], int flip)
{
    const int64_t D = dhw[0], H = dhw[1], W = dhw[2], nv = D * H * W;
    for (int64_t c = 0; c < C; c++)
        for (int64_t z = 0; z < D; z++) {
            int64_t zs = flip & TS_EVAL_FLIP_D ? D - 1 - z : z;
            for (int64_t y = 0; y < H; y++) {
                int64_t ys = flip & TS_EVAL_FLIP_H ? H - 1 - y : y;
                const float *src = in + c * nv + (zs * H + ys) * W;
                float *dst = out + c * nv + (z * H + y) * W;
                if (flip & TS_EVAL_FLIP_W)
                    for (int64_t x = 0; x < W; x++) dst[x] = src[W - 1 - x];
                else memcpy(dst, src, sizeof *dst * (size_t)W);
            }
        }
}

/* acc [K, D, H, W] += in flipped along the axes of flip */
static void flip_add(const float *in, float *acc, int K, const int64_t dhw[3], int flip)
{
    const int64_t D = dhw[0], H = dhw[1], W = dhw[2], nv = D * H * W;
    for (int64_t k = 0; k < K; k++)
        for (int64_t z = 0; z < D; z++)
            for (int64_t y = 0; y < H; y++) {
                int64_t zs = flip & TS_EVAL_FLIP_D ? D - 1 - z : z, ys = flip & TS_EVAL_FLIP_H ? H - 1 - y : y;
                const float *src = in + k * nv + (zs * H + ys) * W;
                float *dst = acc + k * nv + (z * H + y) * W;
                for (int64_t x = 0; x < W; x++) dst[x] += src[flip & TS_EVAL_FLIP_W ? W - 1 - x : x];
            }
}

int ts_eval_predict_mirror(ts_unet *const *ms, int nm, ts_coll *coll, const ts_eval_split *sp, const float *image,
                           const int64_t dhw[3], double overlap, int batch, int axes, uint8_t *pred, float *prob,
                           ts_eval_stats *st)
{
    if (!(axes & TS_EVAL_FLIP_ALL))
        return ts_eval_predict(ms, nm, coll, sp, image, dhw, overlap, batch, pred, prob, st);
    int err = 0;
    const ts_unet_cfg *u = ts_unet_config(ms[0]);
    const int C = u->in_channels, K = u->classes;
    const int64_t nv = dhw[0] * dhw[1] * dhw[2];
    float *flipped = malloc(sizeof *flipped * (size_t)(nv * C));
    float *one = malloc(sizeof *one * (size_t)(nv * K));
    float *sum = calloc((size_t)(nv * K), sizeof *sum);
    uint8_t *scratch = malloc((size_t)nv);
    { /* every rank has its buffers, or all fail before the first prediction */
        int lerr = flipped && one && sum && scratch
                       ? 0
                       : TS_ERR(TS_ERR_NOMEM, "test-time mirroring buffers for a %lldx%lldx%lld volume",
                                (long long)dhw[0], (long long)dhw[1], (long long)dhw[2]);
        int32_t bad = lerr != 0;
        TS_CHECK(ts_coll_allreduce(sp ? sp->all : coll, TS_IN_PLACE, &bad, 1, TS_INT32, TS_OP_MAX));
        if (lerr) TS_CHECK(lerr);
        if (bad) TS_FAIL(TS_ERR_REMOTE, "test-time mirroring: another rank could not allocate its buffers");
    }
    int n = 0;
    for (int f = 0; f <= TS_EVAL_FLIP_ALL; f++) {
        if (f & ~axes) continue; /* flips only along the chosen axes */
        ts_eval_flip(image, flipped, C, dhw, f);
        TS_CHECK(ts_eval_predict(ms, nm, coll, sp, flipped, dhw, overlap, batch, scratch, one, st));
        flip_add(one, sum, K, dhw, f); /* a flip is its own inverse */
        n++;
    }
    for (int64_t i = 0; i < nv * K; i++) sum[i] /= (float)n;
    for (int64_t v = 0; v < nv; v++) {
        int best = 0;
        for (int k = 1; k < K; k++)
            if (sum[k * nv + v] > sum[best * nv + v]) best = k;
        pred[v] = (uint8_t)best;
    }
    if (prob) memcpy(prob, sum, sizeof *prob * (size_t)(nv * K));
cleanup:
    free(flipped);
    free(one);
    free(sum);
    free(scratch);
    return err;
}
