/* `tessera infer` replays the preprocessing recorded in the training
 * dataset (data.path's /fingerprint, written by `tessera convert --crop
 * nonzero --spacing`): which steps, the checks of the options against them,
 * and the steps on one scan (io/preprocess.h); see infer_impl.h. Owns the
 * replay; the steps themselves are io/preprocess.c's. */
#include "tsbuild.h"
#include "src/infer/infer_impl.h"
#include "io/fingerprint.h"
#include "io/preprocess.h"
#include "src/core/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int ts_infer_prep_load(const ts_config *cfg, const ts_infer_opts *o, ts_fp_prep *prep, int *on, ts_infer_result *r)
{
    const char *dp;
    int have = 0;
    ts_fingerprint fp;
    *on = 0;
    memset(prep, 0, sizeof *prep);
    if (o->preprocess == TS_INFER_PREP_NONE || !ts_config_isset(cfg, "data.path")) return 0;
    TS_TRY(ts_config_get_str(cfg, "data.path", &dp));
    if (access(dp, R_OK) != 0)
        return TS_ERR(TS_ERR_IO, "infer: data.path=%s: %s (its recorded preprocessing is replayed on each scan; give "
                                 "preprocess=none to predict without it)", dp, strerror(errno));
    int e = ts_fingerprint_present(dp, &have);
    if (e)
        return TS_CTX(e, "infer: data.path=%s (its recorded preprocessing is replayed on each scan; give "
                                 "preprocess=none to predict without it)", dp);
    if (!have) return 0; /* converted before the fingerprint: nothing recorded */
    TS_TRY(ts_fingerprint_read(dp, &fp));
    *prep = fp.prep;
    ts_fingerprint_free(&fp);
    if (!prep->crop && !(prep->spacing[0] > 0)) return 0;
    const int f = prep->downsample > 1 ? prep->downsample : 1;
    if (o->downsample != f)
        return TS_ERR(TS_ERR_ARG, "infer: downsample=%d does not match data.path=%s (converted at downsample %d), "
                                  "whose preprocessing is replayed: give downsample=%d, or preprocess=none",
                      o->downsample, dp, f, f);
    *on = 1;
    r->prep_on = 1;
    r->prep_crop = prep->crop;
    memcpy(r->prep_spacing, prep->spacing, sizeof r->prep_spacing);
    snprintf(r->prep_from, sizeof r->prep_from, "%s", dp);
    return 0;
}

int ts_infer_prep_apply(const ts_fp_prep *prep, const char *name, const ts_nifti *img, float **vol, int64_t dhw[3],
                        ts_sample *s)
{
    int err;
    const int64_t nv = dhw[0] * dhw[1] * dhw[2];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->shape[0] = img->dim[3];
    for (int d = 0; d < 3; d++) {
        s->shape[d + 1] = dhw[d];
        s->spacing[d] = img->pixdim[2 - d]; /* D, H, W are NIfTI k, j, i */
    }
    memcpy(s->sform, img->sform, sizeof s->sform);
    memcpy(s->qform, img->qform, sizeof s->qform);
    s->sform_code = img->sform_code;
    s->qform_code = img->qform_code;
    s->image = *vol;
    s->label = calloc((size_t)nv, 1); /* no labels: cropped and resampled along, then dropped */
    if (!s->label) return TS_ERR(TS_ERR_NOMEM, "%s: %lld voxels", name, (long long)nv);
    *vol = NULL;
    err = ts_prep_scan(prep, s);
    *vol = s->image;
    free(s->label);
    s->image = NULL;
    s->label = NULL;
    for (int d = 0; d < 3; d++) dhw[d] = s->shape[d + 1];
    return err;
}
