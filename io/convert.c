/* NIfTI and MSD conversion; see convert.h. A job is a list of (image,
 * label) pairs with the channel and class names; the writer decides which
 * rank converts which pair, and each round every rank loads, checks and
 * hands over one pair. */
#include "tsbuild.h"
#include "io/convert.h"
#include "io/fingerprint.h"
#include "io/preprocess.h"
#include "io/resample.h"
#include "io/labelmap.h"
#include "io/nifti.h"
#include "io/writer.h"
#include "src/core/error.h"
#include "src/core/log.h"
#include "src/core/path.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int n;
    char **images, **labels;
    int C, K;
    char *class_names[TS_IO_MAX_CLASSES];
    char *channel_names[TS_IO_MAX_CHANNELS];
    ts_labelmap *map;
    char source[1024];
    int downsample;
    const float *nan_to; /* NULL: non-finite voxels are an error */
    ts_fp_prep prep;     /* crop, target spacing, label resampling, modalities */
} job;

static void job_free(job *j)
{
    for (int i = 0; i < j->n; i++) {
        if (j->images) free(j->images[i]);
        if (j->labels) free(j->labels[i]);
    }
    free(j->images);
    free(j->labels);
    for (int k = 0; k < TS_IO_MAX_CLASSES; k++) free(j->class_names[k]);
    for (int c = 0; c < TS_IO_MAX_CHANNELS; c++) free(j->channel_names[c]);
    ts_labelmap_destroy(&j->map);
}

static void sample_name(const char *path, char *out, size_t n)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t l = strlen(b);
    if (l > 7 && !strcmp(b + l - 7, ".nii.gz")) l -= 7;
    else if (l > 4 && (!strcmp(b + l - 4, ".nii") || !strcmp(b + l - 4, ".hdr"))) l -= 4;
    snprintf(out, n, "%.*s", (int)l, b);
}

static void voxel_ijk(const ts_nifti *n, int64_t v, long long *i, long long *j, long long *k)
{
    *i = (long long)(v % n->dim[0]);
    *j = (long long)(v / n->dim[0] % n->dim[1]);
    *k = (long long)(v / (n->dim[0] * n->dim[1]));
}

/* Labels to classes: through the map, or as they are (then < K). */
static int convert_labels(const ts_nifti *lab, const ts_labelmap *map, int K, uint8_t *out)
{
    long long i, j, k;
    if (lab->datatype == 2 /* uint8 */ && !(isfinite(lab->scl_slope) && lab->scl_slope != 0)) {
        int table[256];
        for (int s = 0; s < 256; s++) {
            int t = -1;
            if (map) {
                if (ts_labelmap_lookup(map, s, &t)) t = -1;
            } else if (s < K) {
                t = s;
            }
            table[s] = t;
        }
        const uint8_t *d = lab->data;
        for (int64_t v = 0; v < lab->nvox; v++) {
            int t = table[d[v]];
            if (t < 0) {
                voxel_ijk(lab, v, &i, &j, &k);
                if (map)
                    return TS_ERR(TS_ERR_FORMAT, "%s: label value %d at voxel (i=%lld, j=%lld, k=%lld) is not in the "
                                  "label map %s", lab->path, d[v], i, j, k, ts_labelmap_path(map));
                return TS_ERR(TS_ERR_FORMAT, "%s: label value %d at voxel (i=%lld, j=%lld, k=%lld) is not a class "
                              "(0..%d); use a label map to group values", lab->path, d[v], i, j, k, K - 1);
            }
            out[v] = (uint8_t)t;
        }
        return 0;
    }
    for (int64_t v = 0; v < lab->nvox; v++) {
        double x = ts_nifti_get(lab, v);
        if (!isfinite(x) || x != floor(x) || fabs(x) > 9.0e15) {
            voxel_ijk(lab, v, &i, &j, &k);
            return TS_ERR(TS_ERR_FORMAT, "%s: voxel (i=%lld, j=%lld, k=%lld) holds %g: labels must be integers",
                          lab->path, i, j, k, x);
        }
        int64_t s = (int64_t)x;
        int t = -1;
        if (map) {
            if (ts_labelmap_lookup(map, s, &t)) {
                voxel_ijk(lab, v, &i, &j, &k);
                return TS_ERR(TS_ERR_FORMAT, "%s: label value %lld at voxel (i=%lld, j=%lld, k=%lld) is not in the "
                              "label map %s", lab->path, (long long)s, i, j, k, ts_labelmap_path(map));
            }
        } else if (s >= 0 && s < K) {
            t = (int)s;
        } else {
            voxel_ijk(lab, v, &i, &j, &k);
            return TS_ERR(TS_ERR_FORMAT, "%s: label value %lld at voxel (i=%lld, j=%lld, k=%lld) is not a class "
                          "(0..%d); use a label map to group values", lab->path, (long long)s, i, j, k, K - 1);
        }
        out[v] = (uint8_t)t;
    }
    return 0;
}

/* The voxel-to-world transforms must agree (1e-3 mm plus 1e-4 relative). */
static int same_grid(const ts_nifti *a, const ts_nifti *b, double *diff)
{
    const double *ma = NULL, *mb = NULL;
    if (a->sform_code > 0 && b->sform_code > 0) ma = a->sform, mb = b->sform;
    else if (a->qform_code > 0 && b->qform_code > 0) ma = a->qform, mb = b->qform;
    *diff = 0;
    if (!ma) return 1;
    int ok = 1;
    for (int t = 0; t < 12; t++) {
        double d = fabs(ma[t] - mb[t]);
        if (d > *diff) *diff = d;
        if (d > 1e-3 + 1e-4 * fabs(ma[t])) ok = 0;
    }
    return ok;
}

/* crop to the non-zero box, then resample to the target spacing */
static int preprocess(const job *jb, ts_sample *s)
{
    if (jb->prep.crop) {
        int64_t box[6], lost = 0;
        const int64_t dhw[3] = {s->shape[1], s->shape[2], s->shape[3]};
        ts_prep_nonzero_box(s->image, s->shape[0], dhw, box);
        TS_TRY(ts_prep_crop(s, box, &lost));
        if (lost)
            ts_log(TS_LOG_WARN, "%s: --crop nonzero drops %lld labelled voxel%s outside the non-zero image box", s->source_label,
                   (long long)lost, lost > 1 ? "s" : "");
    }
    if (jb->prep.spacing[0] > 0 || jb->downsample > 1) { /* the fingerprint's statistics: this volume, as nnU-Net's */
        const int64_t nv = s->shape[1] * s->shape[2] * s->shape[3];
        s->fp_image = malloc((size_t)(nv * s->shape[0]) * sizeof(float));
        s->fp_label = malloc((size_t)nv);
        if (!s->fp_image || !s->fp_label) return TS_ERR(TS_ERR_NOMEM, "%s: a copy for the fingerprint", s->name);
        memcpy(s->fp_image, s->image, (size_t)(nv * s->shape[0]) * sizeof(float));
        memcpy(s->fp_label, s->label, (size_t)nv);
        for (int d = 0; d < 3; d++) s->fp_shape[d] = s->shape[d + 1];
    }
    if (jb->prep.spacing[0] > 0) TS_TRY(ts_prep_resample(s, &jb->prep, jb->K));
    return 0;
}

static int load_pair(const job *jb, int64_t idx, ts_sample *s)
{
    int err = 0;
    ts_nifti *img = NULL, *lab = NULL;
    const char *ip = jb->images[idx], *lp = jb->labels[idx];
    memset(s, 0, sizeof *s);
    TS_CHECK(ts_nifti_read(ip, &img));
    TS_CHECK(ts_nifti_read(lp, &lab));
    if (img->dim[3] != jb->C)
        TS_FAIL(TS_ERR_FORMAT, "%s: %lld volume(s) along t, the dataset has %d channel(s)", ip, (long long)img->dim[3],
                jb->C);
    if (lab->dim[3] != 1)
        TS_FAIL(TS_ERR_FORMAT, "%s: a label volume must be 3-D (it has %lld volumes along t)", lp,
                (long long)lab->dim[3]);
    if (lab->dim[0] != img->dim[0] || lab->dim[1] != img->dim[1] || lab->dim[2] != img->dim[2])
        TS_FAIL(TS_ERR_FORMAT, "grid mismatch: image %s is %lld x %lld x %lld, label %s is %lld x %lld x %lld", ip,
                (long long)img->dim[0], (long long)img->dim[1], (long long)img->dim[2], lp, (long long)lab->dim[0],
                (long long)lab->dim[1], (long long)lab->dim[2]);
    double diff;
    if (!same_grid(img, lab, &diff))
        TS_FAIL(TS_ERR_FORMAT, "grid mismatch: the voxel-to-world transforms of image %s and label %s differ (by up to "
                "%g)", ip, lp, diff);
    TS_CHECK(ts_path_check(ip, sizeof s->source_image, "the image file name"));
    TS_CHECK(ts_path_check(lp, sizeof s->source_label, "the label file name"));
    sample_name(ip, s->name, sizeof s->name);
    snprintf(s->source_image, sizeof s->source_image, "%s", ip);
    snprintf(s->source_label, sizeof s->source_label, "%s", lp);
    s->shape[0] = img->dim[3];
    s->shape[1] = img->dim[2];
    s->shape[2] = img->dim[1];
    s->shape[3] = img->dim[0];
    s->spacing[0] = img->pixdim[2];
    s->spacing[1] = img->pixdim[1];
    s->spacing[2] = img->pixdim[0];
    memcpy(s->sform, img->sform, sizeof s->sform);
    memcpy(s->qform, img->qform, sizeof s->qform);
    s->sform_code = img->sform_code;
    s->qform_code = img->qform_code;
    s->image = TS_ALIGNED_ALLOC((size_t)img->nvox * sizeof(float));
    s->label = TS_ALIGNED_ALLOC((size_t)lab->nvox);
    if (!s->image || !s->label) TS_FAIL(TS_ERR_NOMEM, "%s", ip);
    {
        int64_t replaced = 0;
        TS_CHECK(ts_nifti_to_float_replace(img, s->image, jb->nan_to, &replaced));
        if (replaced)
            ts_log(TS_LOG_WARN, "%s: %lld non-finite voxel%s (NaN or Inf) replaced by %g (--nan-to)", ip,
                   (long long)replaced, replaced > 1 ? "s" : "", (double)*jb->nan_to);
    }
    TS_CHECK(convert_labels(lab, jb->map, jb->K, s->label));
    ts_prep_begin(s);
    TS_CHECK(preprocess(jb, s));
    if (jb->downsample > 1) { /* coarser grid: block means and majorities, geometry adjusted */
        const int f = jb->downsample;
        int64_t dhw[3] = {s->shape[1], s->shape[2], s->shape[3]};
        int64_t nv2 = ts_resample_size(dhw[0], f) * ts_resample_size(dhw[1], f) * ts_resample_size(dhw[2], f);
        float *im2 = TS_ALIGNED_ALLOC((size_t)(nv2 * s->shape[0]) * sizeof(float));
        uint8_t *lb2 = TS_ALIGNED_ALLOC((size_t)nv2);
        if (!im2 || !lb2) {
            free(im2);
            free(lb2);
            TS_FAIL(TS_ERR_NOMEM, "%s: downsampling", ip);
        }
        ts_resample_down(s->shape[0], dhw, f, s->image, im2, s->label, jb->K, lb2);
        free(s->image);
        free(s->label);
        s->image = im2;
        s->label = lb2;
        for (int k = 0; k < 3; k++) {
            s->shape[k + 1] = ts_resample_size(dhw[k], f);
            s->spacing[k] *= f;
        }
        double a[16]; /* from the (cropped) sample's transforms: with --crop nonzero the box's corner */
        ts_resample_affine(s->sform, f, a);
        memcpy(s->sform, a, sizeof a);
        ts_resample_affine(s->qform, f, a);
        memcpy(s->qform, a, sizeof a);
    }
cleanup:
    ts_nifti_free(&img);
    ts_nifti_free(&lab);
    if (err) {
        free(s->image);
        free(s->label);
        free(s->fp_image);
        free(s->fp_label);
        s->image = s->fp_image = NULL;
        s->label = s->fp_label = NULL;
    }
    return err;
}

/* Largest label value over this rank's share (for K without a map). */
static int max_label(const job *jb, const int64_t *mine, int64_t nmine, int64_t *mx)
{
    *mx = 0;
    for (int64_t t = 0; t < nmine; t++) {
        ts_nifti *lab = NULL;
        TS_TRY(ts_nifti_read(jb->labels[mine[t]], &lab));
        for (int64_t v = 0; v < lab->nvox; v++) {
            double x = ts_nifti_get(lab, v);
            if (isfinite(x) && x > (double)*mx) *mx = (int64_t)x;
        }
        ts_nifti_free(&lab);
    }
    return 0;
}

/* --spacing median: every rank reads its share of the images (i mod
 * size) for their spacing and (cropped) shape; the planner's rule over all */
static int median_spacing(MPI_Comm comm, job *jb)
{
    int err = 0, lerr = 0, rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const size_t n = (size_t)jb->n;
    double *sp = TS_CALLOC(3 * n, sizeof(double));
    int64_t *sh = TS_CALLOC(3 * n, sizeof(int64_t));
    float *tmp = NULL;
    if (!sp || !sh) lerr = TS_ERR(TS_ERR_NOMEM, "--spacing median");
    for (int i = rank; i < jb->n && !lerr; i += size) {
        ts_nifti *img = NULL;
        lerr = ts_nifti_read(jb->images[i], &img);
        if (lerr) break;
        const int64_t dhw[3] = {img->dim[2], img->dim[1], img->dim[0]};
        int64_t box[6] = {0, 0, 0, dhw[0], dhw[1], dhw[2]};
        if (jb->prep.crop) {
            tmp = TS_ALIGNED_ALLOC((size_t)img->nvox * sizeof(float));
            lerr = tmp ? ts_nifti_to_float_replace(img, tmp, jb->nan_to, NULL) : TS_ERR(TS_ERR_NOMEM, "%s", jb->images[i]);
            if (!lerr) ts_prep_nonzero_box(tmp, img->dim[3], dhw, box);
            free(tmp);
            tmp = NULL;
        }
        for (int d = 0; d < 3 && !lerr; d++)
            if (!(img->pixdim[d] > 0))
                lerr = TS_ERR(TS_ERR_FORMAT, "%s: pixdim[%d] is %g: --spacing median needs positive voxel sizes",
                              jb->images[i], d + 1, img->pixdim[d]);
        for (int d = 0; d < 3; d++) {
            sp[3 * i + d] = img->pixdim[2 - d];
            sh[3 * i + d] = box[3 + d] - box[d];
        }
        ts_nifti_free(&img);
    }
    TS_CHECK(ts_err_agree(comm, lerr));
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, sp, 3 * jb->n, MPI_DOUBLE, MPI_SUM, comm));
    TS_MPI(MPI_Allreduce(MPI_IN_PLACE, sh, 3 * jb->n, MPI_INT64_T, MPI_SUM, comm));
    int axis;
    TS_CHECK(ts_fp_target_spacing(jb->n, sp, sh, jb->prep.spacing, &axis));
    if (rank == 0)
        ts_log(TS_LOG_INFO, "convert: target spacing %g x %g x %g mm (D, H, W; the median of %d scans%s)",
               jb->prep.spacing[0], jb->prep.spacing[1], jb->prep.spacing[2], jb->n,
               axis >= 0 ? "; anisotropic: the coarse axis takes the 10th percentile" : "");
cleanup:
    free(sp);
    free(sh);
    return err;
}

/* the preprocessing of o into jb->prep: modalities, crop, spacing */
static int setup_prep(MPI_Comm comm, job *jb, const ts_convert_opts *o)
{
    int lerr = 0;
    jb->prep.crop = o->crop_nonzero;
    jb->prep.label_nearest = o->label_nearest;
    jb->prep.image_cubic = !o->image_linear;
    jb->prep.separate = !o->no_separate;
    jb->prep.downsample = o->downsample;
    for (int d = 0; d < 3; d++) jb->prep.spacing[d] = o->spacing[d] > 0 ? o->spacing[d] : 0;
    if (o->downsample > 1 && (o->spacing_median || jb->prep.spacing[0] > 0))
        lerr = TS_ERR(TS_ERR_ARG, "convert: --downsample and --spacing exclude each other (--spacing resamples by any factor)");
    if (!lerr && !o->spacing_median && (jb->prep.spacing[0] > 0 || jb->prep.spacing[1] > 0 || jb->prep.spacing[2] > 0))
        for (int d = 0; d < 3 && !lerr; d++)
            if (!(jb->prep.spacing[d] > 0)) lerr = TS_ERR(TS_ERR_ARG, "convert: --spacing needs three positive values");
    for (int c = 0; c < jb->C && !lerr; c++) { /* default: from the channel's name */
        const char *nm = jb->channel_names[c] ? jb->channel_names[c] : "";
        if (ts_fp_parse_modality(nm, jb->prep.modality[c])) {
            ts_err_clear();
            snprintf(jb->prep.modality[c], sizeof jb->prep.modality[c], "other");
        }
    }
    if (!lerr && o->modality) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", o->modality);
        int c = 0;
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && !lerr; t = strtok_r(NULL, ",", &save), c++)
            lerr = c < jb->C ? ts_fp_parse_modality(t, jb->prep.modality[c]) : 0;
        if (!lerr && c != jb->C)
            lerr = TS_ERR(TS_ERR_ARG, "convert: --modality '%s' names %d modalit%s for %d channel%s", o->modality, c,
                          c == 1 ? "y" : "ies", jb->C, jb->C == 1 ? "" : "s");
    }
    TS_TRY(ts_err_agree(comm, lerr));
    if (o->spacing_median) TS_TRY(median_spacing(comm, jb));
    return 0;
}

static int run(MPI_Comm comm, job *jb, const ts_convert_opts *o, const char *out)
{
    int err = 0;
    ts_dswriter *w = NULL;
    const char *cn[TS_IO_MAX_CLASSES], *chn[TS_IO_MAX_CHANNELS];
    for (int k = 0; k < TS_IO_MAX_CLASSES; k++) cn[k] = jb->class_names[k];
    for (int c = 0; c < TS_IO_MAX_CHANNELS; c++) chn[c] = jb->channel_names[c];
    ts_dswriter_opts wo = {
        .count = jb->n,
        .channels = jb->C,
        .classes = jb->K,
        .class_names = cn,
        .channel_names = chn,
        .shards = o->shards > 0 ? o->shards : 1,
        .chunk = o->chunk,
        .source = jb->source,
        .seed = o->seed,
        .prep = &jb->prep,
    };
    if (jb->K <= 0) {
        /* classes from the data: a first pass over this rank's labels */
        wo.classes = 2; /* provisional, to learn the assignment */
        TS_CHECK(ts_dswriter_create(comm, out, &wo, &w));
        int64_t n = ts_dswriter_local_count(w), *mine = TS_CALLOC((size_t)n + 1, sizeof(int64_t)), mx = 0, gmx = 0;
        int lerr = mine ? 0 : TS_ERR_NOMEM;
        for (int64_t t = 0; t < n && mine; t++) mine[t] = ts_dswriter_local_index(w, t);
        if (!lerr) lerr = max_label(jb, mine, n, &mx);
        free(mine);
        ts_dswriter_destroy(&w);
        TS_CHECK(ts_err_agree(comm, lerr));
        TS_MPI(MPI_Allreduce(&mx, &gmx, 1, MPI_INT64_T, MPI_MAX, comm));
        if (gmx + 1 > TS_IO_MAX_CLASSES)
            TS_FAIL(TS_ERR_FORMAT, "label values go up to %lld: more than %d classes; use --label-map to group them",
                    (long long)gmx, TS_IO_MAX_CLASSES);
        jb->K = wo.classes = gmx + 1 < 2 ? 2 : (int)gmx + 1;
    }
    TS_CHECK(ts_dswriter_create(comm, out, &wo, &w));
    for (int64_t r = 0; r < ts_dswriter_rounds(w); r++) {
        ts_sample s;
        memset(&s, 0, sizeof s);
        int lerr = 0, have = r < ts_dswriter_local_count(w);
        if (have) lerr = load_pair(jb, ts_dswriter_local_index(w, r), &s);
        err = ts_dswriter_put(w, have && !lerr ? &s : NULL, lerr);
        free(s.image);
        free(s.label);
        free(s.fp_image);
        free(s.fp_label);
        if (err) goto cleanup;
    }
    TS_CHECK(ts_dswriter_finish(w));
cleanup:
    ts_dswriter_destroy(&w);
    return err;
}

static int use_map(job *jb, const ts_convert_opts *o, int agree_on, MPI_Comm comm)
{
    int lerr = 0;
    if (o->label_map) {
        lerr = ts_labelmap_load(o->label_map, &jb->map);
        if (!lerr) {
            jb->K = ts_labelmap_classes(jb->map);
            for (int k = 0; k < jb->K && !lerr; k++) {
                const char *nm = ts_labelmap_class_name(jb->map, k);
                free(jb->class_names[k]);
                jb->class_names[k] = *nm ? strdup(nm) : NULL;
            }
        }
    }
    return agree_on ? ts_err_agree(comm, lerr) : lerr;
}

int ts_convert_nifti(MPI_Comm comm, int n, const char *const *images, const char *const *labels,
                     const ts_convert_opts *o, const char *out)
{
    int err = 0, lerr = 0;
    job jb;
    memset(&jb, 0, sizeof jb);
    jb.downsample = o->downsample;
    jb.nan_to = o->nan_to_set ? &o->nan_to : NULL;
    if (n < 1) return TS_ERR(TS_ERR_ARG, "convert nifti: no image/label pair given");
    jb.images = TS_CALLOC((size_t)n, sizeof(char *));
    jb.labels = TS_CALLOC((size_t)n, sizeof(char *));
    if (!jb.images || !jb.labels) return TS_ERR_NOMEM;
    jb.n = n;
    for (int i = 0; i < n; i++) {
        jb.images[i] = strdup(images[i]);
        jb.labels[i] = strdup(labels[i]);
        if (!jb.images[i] || !jb.labels[i]) TS_FAIL(TS_ERR_NOMEM, "convert");
    }
    /* channels: from the first image's header (every image must agree; checked per pair) */
    {
        ts_nifti *first = NULL;
        int rank;
        MPI_Comm_rank(comm, &rank);
        int64_t c = 0;
        if (rank == 0) {
            lerr = ts_nifti_read(images[0], &first);
            if (!lerr) c = first->dim[3];
            ts_nifti_free(&first);
        }
        TS_CHECK(ts_err_agree(comm, lerr));
        TS_MPI(MPI_Bcast(&c, 1, MPI_INT64_T, 0, comm));
        if (c > TS_IO_MAX_CHANNELS)
            TS_FAIL(TS_ERR_FORMAT, "%s: %lld channels (at most %d)", images[0], (long long)c, TS_IO_MAX_CHANNELS);
        jb.C = (int)c;
    }
    jb.K = o->classes;
    TS_CHECK(use_map(&jb, o, 1, comm));
    snprintf(jb.source, sizeof jb.source, "tessera convert nifti (%d pair%s)%s%s", n, n > 1 ? "s" : "",
             o->label_map ? " --label-map " : "", o->label_map ? o->label_map : "");
    TS_CHECK(setup_prep(comm, &jb, o));
    err = run(comm, &jb, o, out);
cleanup:
    job_free(&jb);
    return err;
}

/* ---------------- Medical Segmentation Decathlon ---------------- */

/* The whole file as a string, at most max bytes (the buffer grows with
 * what is read, not to max up front). */
static char *read_text(const char *path, size_t max)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        TS_ERR(TS_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 0, n = 0;
    char *buf = NULL;
    int bad = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            size_t nc = cap ? 2 * cap : 8192;
            char *b = realloc(buf, nc);
            if (!b) {
                free(buf);
                fclose(f);
                TS_ERR(TS_ERR_NOMEM, "%s", path);
                return NULL;
            }
            buf = b;
            cap = nc;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (n > max || got < 4096) break;
    }
    bad = ferror(f);
    fclose(f);
    if (bad || n > max) {
        free(buf);
        TS_ERR(TS_ERR_IO, "cannot read %s%s", path, n > max ? " (too large)" : "");
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* An MSD object {"0": "name", "1": ...} with keys 0..n-1: names into out. */
static int numbered(const cJSON *obj, const char *key, const char *where, int max, char **out, int *n)
{
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsObject(o)) return TS_ERR(TS_ERR_FORMAT, "%s: '%s' is missing or not an object", where, key);
    int cnt = cJSON_GetArraySize(o);
    if (cnt < 1 || cnt > max)
        return TS_ERR(TS_ERR_FORMAT, "%s: '%s' has %d entries (1..%d)", where, key, cnt, max);
    for (int i = 0; i < cnt; i++) {
        char k[16];
        snprintf(k, sizeof k, "%d", i);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
        if (!cJSON_IsString(v))
            return TS_ERR(TS_ERR_FORMAT, "%s: '%s' has no string entry \"%d\" (keys must be 0..%d)", where, key, i,
                          cnt - 1);
        free(out[i]);
        out[i] = strdup(v->valuestring);
        if (!out[i]) return TS_ERR_NOMEM;
    }
    *n = cnt;
    return 0;
}

static int msd_job(const char *dir, job *jb)
{
    int err = 0;
    char path[4096];
    cJSON *js = NULL;
    TS_TRY(ts_path_join(path, sizeof path, dir, "dataset.json"));
    char *text = read_text(path, (size_t)64 << 20);
    if (!text) return ts_err_last() ? ts_err_last() : TS_ERR_IO;
    js = cJSON_Parse(text);
    if (!js) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= text ? (long)(at - text) : -1;
        TS_FAIL(TS_ERR_FORMAT, "%s: not valid JSON (near byte %ld)", path, off);
    }
    TS_CHECK(numbered(js, "modality", path, TS_IO_MAX_CHANNELS, jb->channel_names, &jb->C));
    TS_CHECK(numbered(js, "labels", path, TS_IO_MAX_CLASSES, jb->class_names, &jb->K));
    if (jb->K < 2) TS_FAIL(TS_ERR_FORMAT, "%s: 'labels' names only one class", path);
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(js, "training");
    if (!cJSON_IsArray(tr) || cJSON_GetArraySize(tr) < 1)
        TS_FAIL(TS_ERR_FORMAT, "%s: 'training' is missing or empty", path);
    int n = cJSON_GetArraySize(tr);
    jb->images = TS_CALLOC((size_t)n, sizeof(char *));
    jb->labels = TS_CALLOC((size_t)n, sizeof(char *));
    if (!jb->images || !jb->labels) TS_FAIL(TS_ERR_NOMEM, "msd");
    jb->n = n;
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(tr, i);
        const cJSON *im = cJSON_GetObjectItemCaseSensitive(e, "image"), *lb = cJSON_GetObjectItemCaseSensitive(e, "label");
        if (!cJSON_IsString(im) || !cJSON_IsString(lb))
            TS_FAIL(TS_ERR_FORMAT, "%s: training[%d] needs string fields 'image' and 'label'", path, i);
        const char *a = im->valuestring, *b = lb->valuestring;
        if (!strncmp(a, "./", 2)) a += 2;
        if (!strncmp(b, "./", 2)) b += 2;
        size_t la = strlen(dir) + strlen(a) + 2, lbn = strlen(dir) + strlen(b) + 2;
        jb->images[i] = malloc(la);
        jb->labels[i] = malloc(lbn);
        if (!jb->images[i] || !jb->labels[i]) TS_FAIL(TS_ERR_NOMEM, "msd");
        snprintf(jb->images[i], la, "%s/%s", dir, a);
        snprintf(jb->labels[i], lbn, "%s/%s", dir, b);
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    snprintf(jb->source, sizeof jb->source, "tessera convert msd %s (%s)", dir,
             cJSON_IsString(name) ? name->valuestring : "unnamed task");
cleanup:
    cJSON_Delete(js);
    free(text);
    return err;
}

int ts_convert_msd(MPI_Comm comm, const char *dir, const ts_convert_opts *o, const char *out)
{
    int err = 0;
    job jb;
    memset(&jb, 0, sizeof jb);
    jb.downsample = o->downsample;
    jb.nan_to = o->nan_to_set ? &o->nan_to : NULL;
    int lerr = msd_job(dir, &jb);
    TS_CHECK(ts_err_agree(comm, lerr));
    if (o->label_map) {
        /* the map replaces the task's classes */
        for (int k = 0; k < TS_IO_MAX_CLASSES; k++) {
            free(jb.class_names[k]);
            jb.class_names[k] = NULL;
        }
        TS_CHECK(use_map(&jb, o, 1, comm));
        size_t l = strlen(jb.source);
        snprintf(jb.source + l, sizeof jb.source - l, " --label-map %s", o->label_map);
    }
    TS_CHECK(setup_prep(comm, &jb, o));
    err = run(comm, &jb, o, out);
cleanup:
    job_free(&jb);
    return err;
}
