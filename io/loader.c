/* Prefetching loader; see loader.h. One producer thread fills a ring of
 * batch slots in order; the consumer takes them in the same order and hands
 * each back on its next call. A mutex and one condition variable guard the
 * slot states; errors raised on the producer travel in the slot. */
#include "tsbuild.h"
#include "io/loader.h"
#include "src/core/error.h"
#include "src/core/timer.h"

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
    {"data.norm", TS_CFG_ENUM, "image", "image|dataset|none", "z-score with the image's or the dataset's mean/std"},
    {"data.clip", TS_CFG_ENUM, "none", "none|0.5-99.5|1-99|5-95", "clip to the image's percentiles before z-score"},
    {"data.prefetch", TS_CFG_INT, "2", "0:16", "batches prepared ahead by the loader thread (0 = no thread)"},
    {"data.driver", TS_CFG_ENUM, "mpio", "mpio|posix", "HDF5 file driver: MPI-IO or POSIX"},
    {"data.cache_mb", TS_CFG_INT, "0", "0:65536", "chunk cache in MiB; 0 = sized for one patch"},
    {"data.val_fraction", TS_CFG_FLOAT, "0", "0:0.9", "fraction of samples held out for validation (ts_sampler_split)"},
    {"data.split_seed", TS_CFG_INT, "0", "0:", "seed of the train/validation split (independent of train.seed)"},
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
    TS_TRY(ts_config_get_str(cfg, "data.norm", &s));
    o->patch.norm = !strcmp(s, "image") ? TS_NORM_IMAGE : !strcmp(s, "dataset") ? TS_NORM_DATASET : TS_NORM_NONE;
    TS_TRY(ts_config_get_str(cfg, "data.clip", &s));
    if (ts_patch_parse_clip(s, &o->patch.clip_lo, &o->patch.clip_hi))
        return TS_ERR(TS_ERR_CONFIG, "data.clip: '%s'", s);
    TS_TRY(ts_config_get_int(cfg, "data.prefetch", &v));
    o->prefetch = (int)v;
    o->batch = 1;
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
};

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
    const int64_t C = s->b.image.shape[1], nv = l->o.patch.patch[0] * l->o.patch.patch[1] * l->o.patch.patch[2];
    for (int b = 0; b < B; b++) {
        float *img = (float *)s->b.image.data + (int64_t)b * C * nv;
        uint8_t *lab = (uint8_t *)s->b.label.data + (int64_t)b * nv;
        s->b.sample[b] = idx[b];
        if (idx[b] < 0) {
            memset(img, 0, (size_t)(C * nv) * sizeof(float));
            memset(lab, 0, (size_t)nv);
            continue;
        }
        ts_rng r;
        ts_rng_init(&r, l->o.seed, (uint32_t)pos[b], STREAM_AUG + (uint32_t)((uint64_t)pos[b] >> 32));
        TS_TRY(ts_patch_draw(l->ds, idx[b], &l->o.patch, &r, l->o.mode == TS_SAMPLER_TRAIN, img, lab, l->scratch));
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

int ts_loader_create(ts_dataset *ds, int rank, int size, const ts_loader_opts *o, ts_loader **out)
{
    int err = 0;
    *out = NULL;
    if (o->batch < 1 || o->batch > TS_LOADER_MAX_BATCH)
        return TS_ERR(TS_ERR_ARG, "loader: batch %d (1..%d)", o->batch, TS_LOADER_MAX_BATCH);
    for (int k = 0; k < 3; k++)
        if (o->patch.patch[k] < 1) return TS_ERR(TS_ERR_ARG, "loader: patch size %lld", (long long)o->patch.patch[k]);
    if (o->patch.clip_lo >= TS_IO_NPCT || o->patch.clip_hi >= TS_IO_NPCT || (o->patch.clip_lo >= 0) != (o->patch.clip_hi >= 0))
        return TS_ERR(TS_ERR_ARG, "loader: bad clipping percentiles");
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
    const int64_t C = ts_dataset_channels(ds), *p = o->patch.patch;
    for (int k = 0; k < l->nslots; k++) {
        TS_CHECK(ts_tensor_alloc(&l->slots[k].b.image, TS_FLOAT32, 5, (const int64_t[]){o->batch, C, p[0], p[1], p[2]}));
        TS_CHECK(ts_tensor_alloc(&l->slots[k].b.label, TS_UINT8, 4, (const int64_t[]){o->batch, p[0], p[1], p[2]}));
    }
    l->scratch = TS_ALIGNED_ALLOC(ts_patch_scratch_floats(ds, &o->patch) * sizeof(float));
    if (!l->scratch) TS_FAIL(TS_ERR_NOMEM, "loader scratch");
    TS_CHECK(start(l));
    *out = l;
    return 0;
cleanup:
    ts_loader_destroy(&l);
    return err;
}

int ts_loader_next(ts_loader *l, const ts_batch **out)
{
    *out = NULL;
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
    l->wait_s += ts_time_now() - t0;
    int rc = 0;
    if (s->state == SLOT_END) {
        rc = 1;
    } else if (s->err) {
        rc = TS_ERR(s->err, "%s", s->msg);
    } else {
        s->state = SLOT_HELD;
        l->held = l->tail;
        l->tail = (l->tail + 1) % l->nslots;
        l->pos_consumed = s->b.next_position;
        *out = &s->b;
    }
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
    }
    free(l->slots);
    free(l->scratch);
    ts_sampler_destroy(&l->smp);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
    *lp = NULL;
}
