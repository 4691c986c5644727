/* Cropping and resampling of a sample at conversion; see preprocess.h.
 * Owns the steps on a ts_sample, the geometry they change and their undoing
 * for inference; the interpolation is io/resample.c's. Local: no MPI, no file. */
#include "tsbuild.h"
#include "io/preprocess.h"
#include "io/resample.h"
#include "src/core/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ts_prep_nonzero_box(const float *img, int64_t C, const int64_t dhw[3], int64_t box[6])
{
    const int64_t D = dhw[0], H = dhw[1], W = dhw[2], nv = D * H * W;
    int64_t lo[3] = {D, H, W}, hi[3] = {-1, -1, -1};
    for (int64_t z = 0; z < D; z++)
        for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++) {
                const int64_t v = (z * H + y) * W + x;
                int nz = 0;
                for (int64_t c = 0; c < C && !nz; c++) nz = img[c * nv + v] != 0.0f;
                if (!nz) continue;
                const int64_t p[3] = {z, y, x};
                for (int d = 0; d < 3; d++) {
                    if (p[d] < lo[d]) lo[d] = p[d];
                    if (p[d] > hi[d]) hi[d] = p[d];
                }
            }
    for (int d = 0; d < 3; d++) {
        box[d] = hi[0] < 0 ? 0 : lo[d];
        box[3 + d] = hi[0] < 0 ? dhw[d] : hi[d] + 1;
    }
}

void ts_prep_begin(ts_sample *s)
{
    for (int d = 0; d < 3; d++) {
        s->shape_orig[d] = s->shape[d + 1];
        s->spacing_orig[d] = s->spacing[d];
        s->crop[d] = 0;
        s->crop[3 + d] = s->shape[d + 1];
    }
}

void ts_prep_affine_shift(const double m[16], const int64_t lo[3], double out[16])
{
    /* voxel index (i, j, k) is (W, H, D) */
    const double ijk[3] = {(double)lo[2], (double)lo[1], (double)lo[0]};
    memcpy(out, m, 16 * sizeof(double));
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < 3; j++) out[r * 4 + 3] += m[r * 4 + j] * ijk[j];
}

int ts_prep_crop(ts_sample *s, const int64_t box[6], int64_t *lost)
{
    const int64_t C = s->shape[0], D = s->shape[1], H = s->shape[2], W = s->shape[3];
    const int64_t n[3] = {box[3] - box[0], box[4] - box[1], box[5] - box[2]}, nv = n[0] * n[1] * n[2];
    float *im = TS_ALIGNED_ALLOC((size_t)(C * nv) * sizeof(float));
    uint8_t *lb = TS_ALIGNED_ALLOC((size_t)nv);
    if (!im || !lb) {
        free(im);
        free(lb);
        return TS_ERR(TS_ERR_NOMEM, "%s: cropping", s->name);
    }
    int64_t in_box = 0, all = 0;
    for (int64_t v = 0; v < D * H * W; v++) all += s->label[v] != 0;
    for (int64_t z = 0; z < n[0]; z++)
        for (int64_t y = 0; y < n[1]; y++) {
            const int64_t src = ((z + box[0]) * H + y + box[1]) * W + box[2], dst = (z * n[1] + y) * n[2];
            for (int64_t c = 0; c < C; c++)
                memcpy(im + c * nv + dst, s->image + c * D * H * W + src, (size_t)n[2] * sizeof(float));
            memcpy(lb + dst, s->label + src, (size_t)n[2]);
            for (int64_t x = 0; x < n[2]; x++) in_box += lb[dst + x] != 0;
        }
    *lost = all - in_box;
    free(s->image);
    free(s->label);
    s->image = im;
    s->label = lb;
    double t[16];
    ts_prep_affine_shift(s->sform, box, t);
    memcpy(s->sform, t, sizeof t);
    ts_prep_affine_shift(s->qform, box, t);
    memcpy(s->qform, t, sizeof t);
    for (int d = 0; d < 3; d++) {
        s->crop[d] += box[d];
        s->crop[3 + d] = s->crop[d] + n[d];
        s->shape[d + 1] = n[d];
    }
    return 0;
}

int ts_prep_resample(ts_sample *s, const ts_fp_prep *prep, int K)
{
    const double *spacing = prep->spacing;
    const int64_t C = s->shape[0], in[3] = {s->shape[1], s->shape[2], s->shape[3]};
    int64_t out[3];
    for (int d = 0; d < 3; d++) {
        if (!(spacing[d] > 0) || !isfinite(spacing[d]) || !(s->spacing[d] > 0))
            return TS_ERR(TS_ERR_ARG, "%s: cannot resample from spacing %g to %g along axis %d", s->name, s->spacing[d],
                          spacing[d], d);
        out[d] = ts_resample_size_to(in[d], s->spacing[d], spacing[d]);
    }
    const int64_t nv = out[0] * out[1] * out[2];
    if (out[0] == in[0] && out[1] == in[1] && out[2] == in[2]) return 0; /* the same grid */
    float *im = TS_ALIGNED_ALLOC((size_t)(C * nv) * sizeof(float));
    uint8_t *lb = TS_ALIGNED_ALLOC((size_t)nv);
    if (!im || !lb) {
        free(im);
        free(lb);
        return TS_ERR(TS_ERR_NOMEM, "%s: resampling to %lldx%lldx%lld", s->name, (long long)out[0],
                      (long long)out[1], (long long)out[2]);
    }
    const int sep = prep->separate ? ts_resample_separate_axis(s->spacing, spacing) : -1;
    int err = ts_resample_image(C, in, s->image, out, prep->image_cubic ? TS_INTERP_CUBIC : TS_INTERP_LINEAR, sep, im);
    if (err) {
        free(im);
        free(lb);
        return TS_ERR(err, "%s: %s", s->name, ts_err_message());
    }
    ts_resample_labels(s->label, in, K, out, prep->label_nearest, sep, lb);
    free(s->image);
    free(s->label);
    s->image = im;
    s->label = lb;
    double t[16];
    ts_resample_affine_to(s->sform, in, out, t);
    memcpy(s->sform, t, sizeof t);
    ts_resample_affine_to(s->qform, in, out, t);
    memcpy(s->qform, t, sizeof t);
    for (int d = 0; d < 3; d++) {
        s->spacing[d] *= (double)in[d] / (double)out[d];
        s->shape[d + 1] = out[d];
    }
    return 0;
}

int ts_prep_scan(const ts_fp_prep *prep, ts_sample *s)
{
    ts_prep_begin(s);
    if (prep->crop) {
        int64_t box[6], lost = 0;
        const int64_t dhw[3] = {s->shape[1], s->shape[2], s->shape[3]};
        ts_prep_nonzero_box(s->image, s->shape[0], dhw, box);
        TS_TRY(ts_prep_crop(s, box, &lost));
    }
    if (prep->spacing[0] > 0) {
        ts_fp_prep p = *prep;
        p.label_nearest = 1; /* the labels are zeros */
        TS_TRY(ts_prep_resample(s, &p, 2));
    }
    return 0;
}

int ts_prep_undo_labels(const ts_sample *s, const ts_fp_prep *prep, const uint8_t *lab, int K, uint8_t *out)
{
    const int64_t in[3] = {s->shape[1], s->shape[2], s->shape[3]}, *box = s->crop, *full = s->shape_orig;
    const int64_t cn[3] = {box[3] - box[0], box[4] - box[1], box[5] - box[2]}, nc = cn[0] * cn[1] * cn[2];
    uint8_t *c = malloc((size_t)nc);
    if (!c) return TS_ERR(TS_ERR_NOMEM, "%s: labels back onto the scan", s->name);
    if (in[0] == cn[0] && in[1] == cn[1] && in[2] == cn[2]) memcpy(c, lab, (size_t)nc);
    else
        ts_resample_labels(lab, in, K, cn, prep->label_nearest,
                           prep->separate ? ts_resample_separate_axis(s->spacing, s->spacing_orig) : -1, c);
    memset(out, 0, (size_t)(full[0] * full[1] * full[2]));
    for (int64_t z = 0; z < cn[0]; z++)
        for (int64_t y = 0; y < cn[1]; y++)
            memcpy(out + ((z + box[0]) * full[1] + y + box[1]) * full[2] + box[2], c + (z * cn[1] + y) * cn[2],
                   (size_t)cn[2]);
    free(c);
    return 0;
}

int ts_prep_undo_probs(const ts_sample *s, const ts_fp_prep *prep, const float *prob, int K, float *out)
{
    const int64_t in[3] = {s->shape[1], s->shape[2], s->shape[3]}, *box = s->crop, *full = s->shape_orig;
    const int64_t cn[3] = {box[3] - box[0], box[4] - box[1], box[5] - box[2]}, nc = cn[0] * cn[1] * cn[2];
    const int64_t nf = full[0] * full[1] * full[2];
    float *c = malloc(sizeof *c * (size_t)(K * nc));
    if (!c) return TS_ERR(TS_ERR_NOMEM, "%s: class probabilities back onto the scan", s->name);
    const int sep = prep->separate ? ts_resample_separate_axis(s->spacing, s->spacing_orig) : -1;
    int err = 0;
    if (in[0] == cn[0] && in[1] == cn[1] && in[2] == cn[2])
        memcpy(c, prob, sizeof *c * (size_t)(K * nc));
    else if ((err = ts_resample_image(K, in, prob, cn, TS_INTERP_LINEAR, sep, c)))
        err = TS_ERR(err, "%s: %s", s->name, ts_err_message());
    for (int k = 0; k < K && !err; k++) {
        float *o = out + k * nf;
        const float fill = k == 0 ? 1.0f : 0.0f;
        for (int64_t v = 0; v < nf; v++) o[v] = fill;
        for (int64_t z = 0; z < cn[0]; z++)
            for (int64_t y = 0; y < cn[1]; y++)
                memcpy(o + ((z + box[0]) * full[1] + y + box[1]) * full[2] + box[2], c + k * nc + (z * cn[1] + y) * cn[2],
                       sizeof *c * (size_t)cn[2]);
    }
    free(c);
    return err;
}
