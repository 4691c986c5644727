/* Prefetching loader; see loader.h. One producer thread fills a ring of
 * batch slots in order; the consumer takes them in the same order and hands
 * each back on its next call. A mutex and one condition variable guard the
 * slot states; errors raised on the producer travel in the slot. With a
 * spatial group the producer fills this rank's box and leaves the intensity
 * augmentation pending; the consumer reduces the boxes' ranges and the
 * error flags over the group (the producer never calls MPI collectives) and
 * finishes the batch. */
#include "tsbuild.h"
#include "io/loader.h"
#include "src/core/error.h"
#include "src/core/timer.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_AUG 0x41550000u /* "AU" */

const ts_cfg_key ts_io_config_keys[] = {
    {"data.path", TS_CFG_STRING, NULL, NULL, "dataset: an HDF5 file or shard manifest (tessera convert, tessera synth)"},
    {"data.patch", TS_CFG_INTLIST, "64", "1:65536", "patch edge, or D,H,W"},
    {"data.fg_fraction", TS_CFG_FLOAT, "0.33", "0:1", "fraction of training patches centred on a foreground voxel"},
    {"data.augment", TS_CFG_BOOL, "true", NULL, "augment training patches (the switches below)"},
    {"data.flip", TS_CFG_BOOL, "true", NULL, "random flips along D, H and W"},
    {"data.rot90", TS_CFG_BOOL, "true", NULL, "random 90-degree rotations in the axial (H, W) plane"},
    {"data.scale", TS_CFG_FLOAT, "0.1", "0:0.99", "intensity scale: x*s, s uniform in [1-scale, 1+scale]"},
    {"data.shift", TS_CFG_FLOAT, "0.1", "0:", "intensity shift: x+b, b uniform in [-shift, shift]"},
    {"data.gamma", TS_CFG_FLOAT, "0.3", "0:", "gamma on half the patches, log-uniform in [1/(1+g), 1+g]; 0 = off"},
    {"data.noise_p", TS_CFG_FLOAT, "0", "0:1", "probability of additive Gaussian noise per patch and channel (nnU-Net: 0.1)"},
    {"data.noise_std", TS_CFG_FLOAT, "0.316", "0:", "the noise's sigma, uniform in [0, noise_std] (normalised units; nnU-Net: variance up to 0.1)"},
    {"data.rot_p", TS_CFG_FLOAT, "0.2", "0:1", "probability of a random rotation about all three axes (nnU-Net: 0.2)"},
    {"data.rot_deg", TS_CFG_FLOAT, "30", "0:180", "each rotation angle uniform in [-rot_deg, rot_deg] degrees (nnU-Net: 30)"},
    {"data.zoom_p", TS_CFG_FLOAT, "0.2", "0:1", "probability of a random isotropic zoom (nnU-Net's scaling: 0.2)"},
    {"data.zoom_min", TS_CFG_FLOAT, "0.7", "0.05:10", "zoom factor uniform in [zoom_min, zoom_max]; < 1 magnifies (nnU-Net: 0.7)"},
    {"data.zoom_max", TS_CFG_FLOAT, "1.4", "0.05:10", "upper end of the zoom factor (nnU-Net: 1.4)"},
    {"data.aug_2d", TS_CFG_ENUM, "auto", "auto|on|off", "spatial augmentation in the H-W plane only (nnU-Net's dummy 2D "
     "augmentation): rotation about D by data.rot_deg_2d, zoom and elastic displacement of H and W; auto: when the "
     "patch's largest edge is more than 3 times its D edge (nnU-Net's rule)"},
    {"data.aug_image", TS_CFG_ENUM, "linear", "linear|cubic", "the image's interpolation in the spatial augmentation: "
     "trilinear, or cubic convolution (Keys, 4 taps per axis; nnU-Net: cubic B-spline, order 3)"},
    {"data.aug_label", TS_CFG_ENUM, "nearest", "nearest|linear", "the label's interpolation in the spatial "
     "augmentation: the nearest voxel, or one-hot linear (nnU-Net: order 1 per class)"},
    {"data.rot_deg_2d", TS_CFG_FLOAT, "180", "0:180", "the in-plane rotation angle uniform in [-rot_deg_2d, rot_deg_2d] "
     "degrees (data.aug_2d; nnU-Net: 180)"},
    {"data.elastic_p", TS_CFG_FLOAT, "0", "0:1", "probability of an elastic deformation (off, as nnU-Net's 3D default)"},
    {"data.elastic_points", TS_CFG_INT, "7", "4:16", "elastic control points per axis over the patch (TorchIO: 7)"},
    {"data.elastic_disp", TS_CFG_FLOAT, "7.5", "0:1000", "largest control-point displacement in voxels (TorchIO: 7.5)"},
    {"data.brightness_p", TS_CFG_FLOAT, "0", "0:1", "probability (per patch and channel) of x*m (nnU-Net: 0.15)"},
    {"data.brightness", TS_CFG_FLOAT, "0.25", "0:0.99", "m uniform in [1-brightness, 1+brightness] (nnU-Net: 0.25)"},
    {"data.contrast_p", TS_CFG_FLOAT, "0", "0:1",
     "probability (per patch and channel) of x*f about 0 clipped to the patch's range (nnU-Net: 0.15)"},
    {"data.contrast", TS_CFG_FLOAT, "0.25", "0:0.99", "f uniform in [1-contrast, 1] or [1, 1+contrast] (nnU-Net: 0.25)"},
    {"data.gamma_inv_p", TS_CFG_FLOAT, "0", "0:1",
     "probability (per patch and channel) of gamma on the inverted image, data.gamma's range (nnU-Net: 0.1)"},
    {"data.blur_p", TS_CFG_FLOAT, "0", "0:1", "probability per patch of Gaussian blur, then per channel 1/2 (nnU-Net: 0.2)"},
    {"data.blur_sigma_min", TS_CFG_FLOAT, "0.5", "0:16", "blur sigma in voxels, uniform in [min, max] (nnU-Net: 0.5)"},
    {"data.blur_sigma_max", TS_CFG_FLOAT, "1", "0:16", "(nnU-Net: 1)"},
    {"data.lowres_p", TS_CFG_FLOAT, "0", "0:1",
     "probability per patch of simulated low resolution, then per channel 1/2 (nnU-Net: 0.25)"},
    {"data.lowres_zoom", TS_CFG_FLOAT, "0.5", "0.25:1", "zoom uniform in [lowres_zoom, 1] (nnU-Net: 0.5)"},
    {"data.norm", TS_CFG_ENUMLIST, "image", "image|dataset|none|foreground|ct",
     "one for every channel, or one per channel (ct,foreground): z-score with the image's or the "
     "dataset's mean/std, or the image's over its voxels above its mean; ct: clip to the dataset's foreground "
     "0.5/99.5 percentiles, z-score with its foreground mean/std"},
    {"data.clip", TS_CFG_ENUM, "none", "none|0.5-99.5|1-99|5-95", "clip to the image's percentiles before z-score"},
    {"data.prefetch", TS_CFG_INT, "2", "0:16", "batches prepared ahead by the loader thread (0 = no thread)"},
    {"data.driver", TS_CFG_ENUM, "mpio", "mpio|posix", "HDF5 file driver: MPI-IO or POSIX"},
    {"data.cache_mb", TS_CFG_INT, "0", "0:65536", "chunk cache in MiB; 0 = sized for one patch"},
    {"data.val_fraction", TS_CFG_FLOAT, "0", "0:0.9", "fraction of samples held out for validation (ts_sampler_split)"},
    {"data.split_seed", TS_CFG_INT, "0", "0:", "seed of the train/validation split (independent of train.seed)"},
    {"data.folds", TS_CFG_INT, "0", "0:100", "cross-validation folds by subject (0 = off; replaces data.val_fraction)"},
    {"data.fold", TS_CFG_INT, "0", "0:99", "the fold held out for validation (0 .. data.folds - 1)"},
    {"data.subject_delim", TS_CFG_STRING, "", NULL,
     "a sample's subject is its name up to this string (empty: the whole name); folds never split a subject"},
    {NULL, 0, NULL, NULL, NULL},
};

int ts_loader_opts_from_config(const ts_config *cfg, ts_loader_opts *o)
{
    int64_t p[3], v;
    int np = 0;
    const char *s;
    memset(o, 0, sizeof *o);
    TS_TRY(ts_config_get_intlist(cfg, "data.patch", p, 3, &np));
    if (np != 1 && np != 3)
        return TS_ERR(TS_ERR_CONFIG, "data.patch (%s): one edge or D,H,W", ts_config_source(cfg, "data.patch"));
    for (int k = 0; k < 3; k++) o->patch.patch[k] = np == 1 ? p[0] : p[k];
    TS_TRY(ts_config_get_float(cfg, "data.fg_fraction", &o->patch.fg_fraction));
    TS_TRY(ts_config_get_bool(cfg, "data.augment", &o->patch.augment));
    TS_TRY(ts_config_get_bool(cfg, "data.flip", &o->patch.flip));
    TS_TRY(ts_config_get_bool(cfg, "data.rot90", &o->patch.rot90));
    TS_TRY(ts_config_get_float(cfg, "data.scale", &o->patch.scale));
    TS_TRY(ts_config_get_float(cfg, "data.shift", &o->patch.shift));
    TS_TRY(ts_config_get_float(cfg, "data.gamma", &o->patch.gamma));
    TS_TRY(ts_config_get_float(cfg, "data.noise_p", &o->patch.noise_p));
    TS_TRY(ts_config_get_float(cfg, "data.noise_std", &o->patch.noise_std));
    {
        ts_spatial_aug_opts *sa = &o->patch.spatial;
        TS_TRY(ts_config_get_float(cfg, "data.rot_p", &sa->rot_p));
        TS_TRY(ts_config_get_float(cfg, "data.rot_deg", &sa->rot_deg));
        TS_TRY(ts_config_get_float(cfg, "data.zoom_p", &sa->zoom_p));
        TS_TRY(ts_config_get_float(cfg, "data.zoom_min", &sa->zoom_min));
        TS_TRY(ts_config_get_float(cfg, "data.zoom_max", &sa->zoom_max));
        TS_TRY(ts_config_get_float(cfg, "data.elastic_p", &sa->elastic_p));
        TS_TRY(ts_config_get_int(cfg, "data.elastic_points", &v));
        sa->elastic_points = (int)v;
        TS_TRY(ts_config_get_float(cfg, "data.elastic_disp", &sa->elastic_disp));
        const char *m2;
        TS_TRY(ts_config_get_str(cfg, "data.aug_2d", &m2));
        sa->plane = ts_spatial_aug_plane_of(m2, o->patch.patch);
        TS_TRY(ts_config_get_float(cfg, "data.rot_deg_2d", &sa->rot_deg_plane));
        TS_TRY(ts_config_get_str(cfg, "data.aug_image", &m2));
        sa->cubic = !strcmp(m2, "cubic");
        TS_TRY(ts_config_get_str(cfg, "data.aug_label", &m2));
        sa->label_linear = !strcmp(m2, "linear");
        TS_TRY(ts_spatial_aug_check(sa));
    }
    ts_aug_opts *a = &o->patch.aug;
    TS_TRY(ts_config_get_float(cfg, "data.brightness_p", &a->brightness_p));
    TS_TRY(ts_config_get_float(cfg, "data.brightness", &a->brightness));
    TS_TRY(ts_config_get_float(cfg, "data.contrast_p", &a->contrast_p));
    TS_TRY(ts_config_get_float(cfg, "data.contrast", &a->contrast));
    TS_TRY(ts_config_get_float(cfg, "data.gamma_inv_p", &a->gamma_inv_p));
    TS_TRY(ts_config_get_float(cfg, "data.blur_p", &a->blur_p));
    TS_TRY(ts_config_get_float(cfg, "data.blur_sigma_min", &a->blur_sigma_min));
    TS_TRY(ts_config_get_float(cfg, "data.blur_sigma_max", &a->blur_sigma_max));
    TS_TRY(ts_config_get_float(cfg, "data.lowres_p", &a->lowres_p));
    TS_TRY(ts_config_get_float(cfg, "data.lowres_zoom", &a->lowres_zoom));
    if (a->blur_sigma_min > a->blur_sigma_max)
        return TS_ERR(TS_ERR_CONFIG, "data.blur_sigma_min (%g, %s) is above data.blur_sigma_max (%g, %s)",
                      a->blur_sigma_min, ts_config_source(cfg, "data.blur_sigma_min"), a->blur_sigma_max,
                      ts_config_source(cfg, "data.blur_sigma_max"));
    TS_TRY(ts_config_get_str(cfg, "data.norm", &s));
    TS_TRY(ts_patch_parse_norm(s, ts_config_source(cfg, "data.norm"), &o->patch));
    TS_TRY(ts_config_get_str(cfg, "data.clip", &s));
    if (ts_patch_parse_clip(s, &o->patch.clip_lo, &o->patch.clip_hi))
        return TS_ERR(TS_ERR_CONFIG, "data.clip: '%s'", s);
    TS_TRY(ts_config_get_int(cfg, "data.prefetch", &v));
    o->prefetch = (int)v;
    o->batch = 1;
    o->group = MPI_COMM_NULL;
    return 0;
}

int ts_dataset_opts_from_config(const ts_config *cfg, ts_dataset_opts *o)
{
    int64_t p[3], mb;
    int np = 0;
    const char *s;
    memset(o, 0, sizeof *o);
    o->check = 1;
    TS_TRY(ts_config_get_str(cfg, "data.driver", &s));
    o->driver = !strcmp(s, "posix") ? TS_IO_DRIVER_POSIX : TS_IO_DRIVER_MPIO;
    TS_TRY(ts_config_get_int(cfg, "data.cache_mb", &mb));
    o->cache_bytes = (size_t)mb << 20;
    TS_TRY(ts_config_get_intlist(cfg, "data.patch", p, 3, &np));
    for (int k = 0; k < 3; k++) o->box_hint[k] = np == 1 ? p[0] : p[k < np ? k : 0];
    return 0;
}

enum { SLOT_FREE = 0, SLOT_FILLING, SLOT_READY, SLOT_END, SLOT_HELD };

typedef struct {
    ts_batch b;
    int state;
    int err;
    char msg[2048];
    ts_patch_pending *pend; /* [batch]: intensity augmentation left to the consumer (group only) */
} slot;

struct ts_loader {
    ts_dataset *ds;
    ts_loader_opts o;
    int64_t *subset;
    ts_sampler *smp;
    int nslots, head, tail, held;
    slot *slots;
    pthread_t th;
    int running, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    float *scratch;
    int64_t step, pos_consumed;
    double wait_s;
    /* spatial parallelism */
    int64_t lo[3], sz[3], nv; /* this rank's box of every patch (the whole patch without a group) */
    MPI_Comm comm;            /* the group, duplicated, or MPI_COMM_NULL */
    int grank, gsize;
    double *red;              /* reduction buffers, in and out: 2 x (RED_HEAD + 2 * batch * C) doubles */
    int failed;               /* an agreed error: returned again by every later next() */
    char failed_msg[2048];
    int64_t taken;            /* batches returned since create or seek: the next one's step */
};

/* the reduction buffer's head (all reduced with MAX) */
enum { RED_FAIL = 0, RED_END, RED_NOT_END, RED_POS, RED_NEG_POS, RED_HEAD };

/* Fills one batch (producer side): 0, 1 at the end of an eval pass, or an error. */
static int fill(ts_loader *l, slot *s)
{
    const int B = l->o.batch;
    int64_t idx[TS_LOADER_MAX_BATCH], pos[TS_LOADER_MAX_BATCH];
    s->b.position = ts_sampler_position(l->smp);
    int rc = ts_sampler_next(l->smp, idx, pos);
    if (rc) return rc;
    s->b.next_position = ts_sampler_position(l->smp);
    s->b.step = l->step++;
    const int64_t C = s->b.image.shape[1], nv = l->nv;
    const int train = l->o.mode == TS_SAMPLER_TRAIN;
    for (int b = 0; b < B; b++) {
        float *img = (float *)s->b.image.data + (int64_t)b * C * nv;
        uint8_t *lab = (uint8_t *)s->b.label.data + (int64_t)b * nv;
        s->b.sample[b] = idx[b];
        if (idx[b] < 0) {
            memset(img, 0, (size_t)(C * nv) * sizeof(float));
            memset(lab, 0, (size_t)nv);
            if (s->pend) s->pend[b].augment = 0;
            continue;
        }
        ts_rng r;
        ts_rng_init(&r, l->o.seed, (uint32_t)pos[b], STREAM_AUG + (uint32_t)((uint64_t)pos[b] >> 32));
        int rc = l->comm == MPI_COMM_NULL
                     ? ts_patch_draw(l->ds, idx[b], &l->o.patch, &r, train, img, lab, l->scratch)
                     : ts_patch_draw_box(l->ds, idx[b], &l->o.patch, &r, train, l->lo, l->sz, img, lab, l->scratch,
                                         &s->pend[b]);
        if (rc) {
            ts_sample_info si = {0};
            ts_dataset_info(l->ds, idx[b], &si);
            return TS_CTX(rc, "the patch of sample %lld (%s) of %s, batch %lld", (long long)idx[b],
                          si.name ? si.name : "?", ts_dataset_path(l->ds), (long long)s->b.step);
        }
    }
    return 0;
}

static void finish_slot(slot *s, int rc)
{
    if (rc == 1) {
        s->state = SLOT_END;
    } else {
        s->state = SLOT_READY;
        s->err = rc;
        if (rc) snprintf(s->msg, sizeof s->msg, "%s", ts_err_message());
    }
}

static void *producer(void *arg)
{
    ts_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        slot *s = &l->slots[l->head];
        if (s->state != SLOT_FREE) {
            pthread_cond_wait(&l->cv, &l->mu);
            continue;
        }
        s->state = SLOT_FILLING;
        pthread_mutex_unlock(&l->mu);
        int rc = fill(l, s);
        pthread_mutex_lock(&l->mu);
        finish_slot(s, rc);
        l->head = (l->head + 1) % l->nslots;
        pthread_cond_broadcast(&l->cv);
        if (rc) break; /* end of the pass, or an error: the slot tells the consumer */
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static int start(ts_loader *l)
{
    l->stop = 0;
    if (l->o.prefetch <= 0) return 0;
    if (pthread_create(&l->th, NULL, producer, l) != 0) return TS_ERR(TS_ERR_INTERNAL, "cannot start the loader thread");
    l->running = 1;
    return 0;
}

static void stop(ts_loader *l)
{
    if (!l->running) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->th, NULL);
    l->running = 0;
}

/* A zero handle (memset opts) counts as MPI_COMM_NULL: no MPI uses 0 for a
 * valid communicator. */
static MPI_Comm group_of(const ts_loader_opts *o)
{
    MPI_Comm zero;
    memset(&zero, 0, sizeof zero);
    if (!memcmp(&o->group, &zero, sizeof zero)) return MPI_COMM_NULL;
    return o->group;
}

/* FNV-1a over what every rank of a spatial group must share */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t k = 0; k < n; k++) h = (h ^ c[k]) * 1099511628211ull;
    return h;
}

static uint64_t fingerprint(const ts_dataset *ds, int rank, int size, const ts_loader_opts *o)
{
    const ts_patch_opts *p = &o->patch;
    int64_t iv[] = {rank, size, o->batch, (int64_t)o->seed, o->mode, o->subset ? o->nsubset : -1,
                    ts_dataset_count(ds), ts_dataset_channels(ds), p->patch[0], p->patch[1], p->patch[2],
                    p->augment, p->flip, p->rot90, p->norm, p->clip_lo, p->clip_hi};
    const ts_aug_opts *a = &p->aug;
    double dv[] = {p->fg_fraction, p->scale, p->shift, p->gamma, p->noise_p, p->noise_std, a->brightness_p,
                   a->brightness, a->contrast_p, a->contrast, a->gamma_inv_p, a->blur_p, a->blur_sigma_min,
                   a->blur_sigma_max, a->lowres_p, a->lowres_zoom, p->spatial.rot_p, p->spatial.rot_deg,
                   p->spatial.zoom_p, p->spatial.zoom_min, p->spatial.zoom_max, p->spatial.elastic_p,
                   p->spatial.elastic_disp, (double)p->spatial.elastic_points};
    uint64_t h = fnv(1469598103934665603ull, iv, sizeof iv);
    h = fnv(h, dv, sizeof dv);
    if (o->subset) h = fnv(h, o->subset, (size_t)o->nsubset * sizeof *o->subset);
    if (p->norm_nch > 0) h = fnv(h, p->norm_ch, (size_t)p->norm_nch * sizeof *p->norm_ch); /* a mode per channel */
    if (p->spatial.plane) h = fnv(h, &p->spatial.rot_deg_plane, sizeof p->spatial.rot_deg_plane); /* data.aug_2d */
    if (p->spatial.cubic || p->spatial.label_linear) { /* data.aug_image, data.aug_label */
        const int64_t il[2] = {p->spatial.cubic, p->spatial.label_linear};
        h = fnv(h, il, sizeof il);
    }
    return h;
}

/* Everything local of create: checks, sampler, buffers; no thread yet. */
static int create_local(ts_dataset *ds, int rank, int size, const ts_loader_opts *o, int grouped, ts_loader **out)
{
    int err = 0;
    *out = NULL;
    if (o->batch < 1 || o->batch > TS_LOADER_MAX_BATCH)
        return TS_ERR(TS_ERR_ARG, "loader: batch %d (1..%d)", o->batch, TS_LOADER_MAX_BATCH);
    for (int k = 0; k < 3; k++)
        if (o->patch.patch[k] < 1) return TS_ERR(TS_ERR_ARG, "loader: patch size %lld", (long long)o->patch.patch[k]);
    TS_TRY(ts_spatial_aug_check(&o->patch.spatial));
    if (o->patch.clip_lo >= TS_IO_NPCT || o->patch.clip_hi >= TS_IO_NPCT || (o->patch.clip_lo >= 0) != (o->patch.clip_hi >= 0))
        return TS_ERR(TS_ERR_ARG, "loader: bad clipping percentiles");
    TS_TRY(ts_patch_check_norm(ds, &o->patch));
    /* the box: all 0 = the whole patch; otherwise inside the patch */
    const int64_t *p = o->patch.patch;
    int64_t lo[3] = {0, 0, 0}, sz[3] = {p[0], p[1], p[2]};
    if (o->sub_size[0] || o->sub_size[1] || o->sub_size[2]) {
        int whole = 1;
        for (int k = 0; k < 3; k++) {
            if (o->sub_lo[k] < 0 || o->sub_size[k] < 1 || o->sub_lo[k] + o->sub_size[k] > p[k])
                return TS_ERR(TS_ERR_ARG, "loader: box [%lld, %lld) x [%lld, %lld) x [%lld, %lld) does not lie inside "
                              "the %lldx%lldx%lld patch (sizes >= 1, or all 0 for the whole patch)",
                              (long long)o->sub_lo[0], (long long)(o->sub_lo[0] + o->sub_size[0]),
                              (long long)o->sub_lo[1], (long long)(o->sub_lo[1] + o->sub_size[1]),
                              (long long)o->sub_lo[2], (long long)(o->sub_lo[2] + o->sub_size[2]), (long long)p[0],
                              (long long)p[1], (long long)p[2]);
            lo[k] = o->sub_lo[k];
            sz[k] = o->sub_size[k];
            whole &= lo[k] == 0 && sz[k] == p[k];
        }
        if (!whole && !grouped)
            return TS_ERR(TS_ERR_ARG, "loader: a box smaller than the patch needs the group of ranks holding the "
                          "other boxes (ts_loader_opts.group with more than one rank)");
    }
    int inited = 0, level = MPI_THREAD_MULTIPLE;
    MPI_Initialized(&inited);
    if (inited) MPI_Query_thread(&level);
    if (o->prefetch > 0 && level < MPI_THREAD_MULTIPLE)
        return TS_ERR(TS_ERR_UNSUPPORTED, "loader: data.prefetch = %d reads on a thread, which needs MPI initialised "
                      "with MPI_THREAD_MULTIPLE (set data.prefetch = 0)", o->prefetch);
    ts_loader *l = TS_CALLOC(1, sizeof *l);
    if (!l) return TS_ERR_NOMEM;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->ds = ds;
    l->o = *o;
    l->held = -1;
    l->comm = MPI_COMM_NULL;
    l->gsize = 1;
    for (int k = 0; k < 3; k++) {
        l->lo[k] = lo[k];
        l->sz[k] = sz[k];
    }
    l->nv = sz[0] * sz[1] * sz[2];
    int64_t n = o->subset ? o->nsubset : ts_dataset_count(ds);
    if (o->subset) {
        for (int64_t t = 0; t < n; t++)
            if (o->subset[t] < 0 || o->subset[t] >= ts_dataset_count(ds))
                TS_FAIL(TS_ERR_ARG, "loader: subset index %lld out of range", (long long)o->subset[t]);
    }
    l->o.subset = NULL;
    TS_CHECK(ts_sampler_create(n, o->subset, rank, size, o->batch, o->seed, o->mode, &l->smp));
    l->nslots = (o->prefetch > 0 ? o->prefetch : 0) + 1;
    l->slots = TS_CALLOC((size_t)l->nslots, sizeof *l->slots);
    if (!l->slots) TS_FAIL(TS_ERR_NOMEM, "loader");
    const int64_t C = ts_dataset_channels(ds);
    for (int k = 0; k < l->nslots; k++) {
        TS_CHECK(ts_tensor_alloc(&l->slots[k].b.image, TS_FLOAT32, 5, (const int64_t[]){o->batch, C, sz[0], sz[1], sz[2]}));
        TS_CHECK(ts_tensor_alloc(&l->slots[k].b.label, TS_UINT8, 4, (const int64_t[]){o->batch, sz[0], sz[1], sz[2]}));
        if (grouped) {
            l->slots[k].pend = TS_CALLOC((size_t)o->batch, sizeof *l->slots[k].pend);
            if (!l->slots[k].pend) TS_FAIL(TS_ERR_NOMEM, "loader");
        }
    }
    if (grouped) {
        l->red = TS_MALLOC((size_t)(RED_HEAD + 2 * o->batch * C) * 2 * sizeof(double));
        if (!l->red) TS_FAIL(TS_ERR_NOMEM, "loader");
    }
    l->scratch = TS_ALIGNED_ALLOC(ts_patch_scratch_floats_box(ds, sz) * sizeof(float));
    if (!l->scratch) TS_FAIL(TS_ERR_NOMEM, "loader scratch");
    *out = l;
    return 0;
cleanup:
    ts_loader_destroy(&l);
    return err;
}

/* Collective on comm: the boxes of all ranks tile the patch and the ranks
 * share rank, size, batch, seed, sampler and patch options. Every rank
 * decides from the same gathered table, so the verdict needs no agreement. */
static int check_group(ts_loader *l, uint64_t fp)
{
    int err = 0;
    const int G = l->gsize;
    int64_t mine[7] = {l->lo[0], l->lo[1], l->lo[2], l->sz[0], l->sz[1], l->sz[2], (int64_t)fp};
    int64_t *all = TS_MALLOC((size_t)G * sizeof mine);
    TS_CHECK(ts_err_agree(l->comm, all ? 0 : TS_ERR_NOMEM));
    TS_MPI(MPI_Allgather(mine, 7, MPI_INT64_T, all, 7, MPI_INT64_T, l->comm));
    const int64_t *p = l->o.patch.patch;
    int64_t vol = 0;
    for (int g = 0; g < G; g++) {
        const int64_t *a = all + 7 * g;
        if (a[6] != all[6])
            TS_FAIL(TS_ERR_MISMATCH, "loader: rank %d of the spatial group uses another data-parallel rank/size, "
                    "batch, seed, mode, subset or patch options than rank 0 (every rank of a group loads the same "
                    "patches)", g);
        vol += a[3] * a[4] * a[5];
        for (int h = 0; h < g; h++) {
            const int64_t *b = all + 7 * h;
            int overlap = 1;
            for (int k = 0; k < 3; k++) overlap &= a[k] < b[k] + b[k + 3] && b[k] < a[k] + a[k + 3];
            if (overlap)
                TS_FAIL(TS_ERR_ARG, "loader: the boxes of ranks %d and %d of the spatial group overlap "
                        "([%lld, %lld, %lld] + [%lld, %lld, %lld] and [%lld, %lld, %lld] + [%lld, %lld, %lld])", h, g,
                        (long long)b[0], (long long)b[1], (long long)b[2], (long long)b[3], (long long)b[4],
                        (long long)b[5], (long long)a[0], (long long)a[1], (long long)a[2], (long long)a[3],
                        (long long)a[4], (long long)a[5]);
        }
    }
    if (vol != p[0] * p[1] * p[2])
        TS_FAIL(TS_ERR_ARG, "loader: the boxes of the spatial group's %d ranks cover %lld of the patch's %lld voxels "
                "(they must tile the %lldx%lldx%lld patch)", G, (long long)vol, (long long)(p[0] * p[1] * p[2]),
                (long long)p[0], (long long)p[1], (long long)p[2]);
cleanup:
    free(all);
    return err;
}

int ts_loader_create(ts_dataset *ds, int rank, int size, const ts_loader_opts *o, ts_loader **out)
{
    int err = 0, gsize = 1;
    *out = NULL;
    MPI_Comm grp = group_of(o), comm = MPI_COMM_NULL;
    if (grp != MPI_COMM_NULL) TS_MPI_TRY(MPI_Comm_size(grp, &gsize));
    ts_loader *l = NULL;
    if (gsize <= 1) {
        TS_TRY(create_local(ds, rank, size, o, 0, &l));
        TS_CHECK(start(l));
        *out = l;
        return 0;
    }
    /* collective from here on: every rank makes the same MPI calls */
    TS_MPI_TRY(MPI_Comm_dup(grp, &comm));
    TS_CHECK(ts_err_agree(comm, create_local(ds, rank, size, o, 1, &l)));
    l->comm = comm;
    comm = MPI_COMM_NULL;
    l->gsize = gsize;
    TS_MPI(MPI_Comm_rank(l->comm, &l->grank));
    TS_CHECK(check_group(l, fingerprint(ds, rank, size, o)));
    TS_CHECK(ts_err_agree(l->comm, start(l)));
    *out = l;
    return 0;
cleanup:
    ts_loader_destroy(&l);
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    return err;
}

/* With a group: the collective half of next(). s is the slot at the tail,
 * READY (s->err: this rank's part failed) or END. Reduces the error flags,
 * end marks, sampler positions and the boxes' per-channel min/max over the
 * group (one MPI_Allreduce, MAX, mins negated), then finishes the batch's
 * intensity augmentation. Returns 0 (batch ready), 1 (end), or an error that
 * every rank of the group returns too. Caller holds no lock. */
static int group_finish(ts_loader *l, slot *s)
{
    const int B = l->o.batch;
    const int64_t C = s->b.image.shape[1], nred = RED_HEAD + 2 * B * C;
    const int end = s->state == SLOT_END, ok = !end && !s->err;
    double *in = l->red, *red = l->red + nred;
    for (int64_t t = 0; t < nred; t++) in[t] = -INFINITY;
    in[RED_FAIL] = ok || end ? 0 : l->grank + 1;
    in[RED_END] = end;
    in[RED_NOT_END] = ok;
    if (ok) {
        in[RED_POS] = (double)s->b.position;
        in[RED_NEG_POS] = -(double)s->b.position;
        for (int b = 0; b < B; b++)
            for (int64_t c = 0; c < C && s->b.sample[b] >= 0; c++) {
                in[RED_HEAD + 2 * (b * C + c)] = -(double)s->pend[b].mn[c];
                in[RED_HEAD + 2 * (b * C + c) + 1] = (double)s->pend[b].mx[c];
            }
    }
    int rc = MPI_Allreduce(in, red, (int)nred, MPI_DOUBLE, MPI_MAX, l->comm);
    if (rc != MPI_SUCCESS) return ts_err_mpi(rc, __FILE__, __LINE__, "MPI_Allreduce(loader batch ranges)");
    const long long step = (long long)l->taken;
    int err = 0;
    if (red[RED_FAIL] > 0) {
        if (!ok && !end) err = TS_ERR(s->err, "%s", s->msg);
        else err = TS_ERR(TS_ERR_REMOTE, "rank %d of the spatial group failed to prepare its part of batch %lld",
                          (int)red[RED_FAIL] - 1, step);
    } else if (red[RED_END] > 0 && red[RED_NOT_END] > 0) {
        err = TS_ERR(TS_ERR_MISMATCH, "loader: at batch %lld some ranks of the spatial group reached the end of the "
                     "evaluation pass and others did not (same sampler and seek positions needed)", step);
    } else if (red[RED_END] > 0) {
        return 1;
    } else if (red[RED_POS] != -red[RED_NEG_POS]) {
        err = TS_ERR(TS_ERR_MISMATCH, "loader: at batch %lld the ranks of the spatial group hold different batches "
                     "(sampler positions %.0f to %.0f; every rank must seek to the same position)", step,
                     -red[RED_NEG_POS], red[RED_POS]);
    }
    if (err) {
        l->failed = err;
        snprintf(l->failed_msg, sizeof l->failed_msg, "%s", ts_err_message());
        return err;
    }
    /* the whole patch's range, exactly: min and max are exact in any order,
     * and float -> double -> float round-trips. (MAX may return either of
     * +0 and -0 where one sequential scan kept the first it met; gamma's
     * formula gives the same bits for both as powf(+-0, g) = +0, g > 0.) */
    for (int b = 0; b < B; b++) {
        if (s->b.sample[b] < 0) continue;
        ts_patch_pending p = s->pend[b];
        for (int64_t c = 0; c < C; c++) {
            p.mn[c] = (float)-red[RED_HEAD + 2 * (b * C + c)];
            p.mx[c] = (float)red[RED_HEAD + 2 * (b * C + c) + 1];
        }
        ts_patch_finish((float *)s->b.image.data + (int64_t)b * C * l->nv, l->nv, &p);
    }
    return 0;
}

int ts_loader_next(ts_loader *l, const ts_batch **out)
{
    *out = NULL;
    if (l->failed) return TS_ERR(l->failed, "%s", l->failed_msg);
    double t0 = ts_time_now();
    pthread_mutex_lock(&l->mu);
    if (l->held >= 0) {
        l->slots[l->held].state = SLOT_FREE;
        l->held = -1;
        pthread_cond_broadcast(&l->cv);
    }
    slot *s = &l->slots[l->tail];
    if (!l->running && s->state == SLOT_FREE) {
        /* no thread: fill in the caller's thread */
        s->state = SLOT_FILLING;
        pthread_mutex_unlock(&l->mu);
        int rc = fill(l, s);
        pthread_mutex_lock(&l->mu);
        finish_slot(s, rc);
    }
    while (s->state != SLOT_READY && s->state != SLOT_END) pthread_cond_wait(&l->cv, &l->mu);
    int rc = 0;
    if (l->comm != MPI_COMM_NULL) {
        /* the producer leaves a READY or END slot alone: reduce without the lock */
        pthread_mutex_unlock(&l->mu);
        rc = group_finish(l, s);
        pthread_mutex_lock(&l->mu);
    } else if (s->state == SLOT_END) {
        rc = 1;
    } else if (s->err) {
        rc = TS_ERR(s->err, "%s", s->msg);
    }
    if (rc == 0) {
        s->state = SLOT_HELD;
        l->held = l->tail;
        l->tail = (l->tail + 1) % l->nslots;
        l->pos_consumed = s->b.next_position;
        l->taken++;
        *out = &s->b;
    }
    l->wait_s += ts_time_now() - t0;
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int64_t ts_loader_position(const ts_loader *l) { return l->pos_consumed; }
double ts_loader_wait_seconds(const ts_loader *l) { return l->wait_s; }

int ts_loader_seek(ts_loader *l, int64_t position)
{
    stop(l);
    for (int k = 0; k < l->nslots; k++) {
        l->slots[k].state = SLOT_FREE;
        l->slots[k].err = 0;
    }
    l->head = l->tail = 0;
    l->held = -1;
    l->step = 0;
    l->taken = 0;
    l->failed = 0;
    TS_TRY(ts_sampler_seek(l->smp, position));
    l->pos_consumed = position;
    return start(l);
}

void ts_loader_destroy(ts_loader **lp)
{
    if (!lp || !*lp) return;
    ts_loader *l = *lp;
    stop(l);
    for (int k = 0; l->slots && k < l->nslots; k++) {
        ts_tensor_free(&l->slots[k].b.image);
        ts_tensor_free(&l->slots[k].b.label);
        free(l->slots[k].pend);
    }
    free(l->slots);
    free(l->scratch);
    free(l->red);
    ts_sampler_destroy(&l->smp);
    if (l->comm != MPI_COMM_NULL) MPI_Comm_free(&l->comm);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
    *lp = NULL;
}
