/* Synthetic phantoms; see synth.h. Shapes are tested only inside their
 * bounding boxes; the smooth field is separable (a product of three 1-D
 * low-frequency profiles), so a sample costs a few passes over its voxels.
 * Owns the phantoms; the files are the dataset writer's (io/writer.c). */
#include "tsbuild.h"
#include "io/synth.h"
#include "src/core/error.h"
#include "src/core/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_SYNTH 0x53590000u /* "SY" */

void ts_sample_release(ts_sample *s)
{
    if (!s) return;
    free(s->image);
    free(s->label);
    s->image = NULL;
    s->label = NULL;
}

typedef struct {
    double c[3], r[3], rot[9]; /* centre, radii (voxels), rotation (rows = axes) */
    int cls;
    int64_t lo[3], hi[3];      /* bounding box */
} shape;

static void rotation(ts_rng *g, double *m)
{
    double a = 2 * M_PI * ts_rng_uniform(g), b = 2 * M_PI * ts_rng_uniform(g), c = 2 * M_PI * ts_rng_uniform(g);
    double ca = cos(a), sa = sin(a), cb = cos(b), sb = sin(b), cc = cos(c), sc = sin(c);
    /* Rz(a) * Ry(b) * Rx(c) */
    m[0] = ca * cb; m[1] = ca * sb * sc - sa * cc; m[2] = ca * sb * cc + sa * sc;
    m[3] = sa * cb; m[4] = sa * sb * sc + ca * cc; m[5] = sa * sb * cc - ca * sc;
    m[6] = -sb;     m[7] = cb * sc;                m[8] = cb * cc;
}

static void add_shape(shape *s, const int64_t *dims, const double *c, const double *r, const double *rot, int cls)
{
    memcpy(s->c, c, sizeof s->c);
    memcpy(s->r, r, sizeof s->r);
    memcpy(s->rot, rot, sizeof s->rot);
    s->cls = cls;
    double rmax = fmax(r[0], fmax(r[1], r[2]));
    for (int k = 0; k < 3; k++) {
        int64_t lo = (int64_t)floor(c[k] - rmax), hi = (int64_t)ceil(c[k] + rmax) + 1;
        s->lo[k] = lo < 0 ? 0 : lo;
        s->hi[k] = hi > dims[k] ? dims[k] : hi;
    }
}

int ts_synth_sample(const ts_synth_opts *o, int64_t index, ts_sample *s)
{
    int err = 0;
    shape *shapes = NULL;
    double *fz = NULL, *fy = NULL, *fx = NULL;
    memset(s, 0, sizeof *s);
    const int C = o->channels > 0 ? o->channels : 1, K = o->classes > 0 ? o->classes : 3;
    const int64_t D = o->size[0], H = o->size[1], W = o->size[2];
    if (D < 1 || H < 1 || W < 1) return TS_ERR(TS_ERR_ARG, "synth: size %lldx%lldx%lld", (long long)D, (long long)H,
                                               (long long)W);
    if (K < 2 || K > TS_IO_MAX_CLASSES) return TS_ERR(TS_ERR_ARG, "synth: %d classes (2..%d)", K, TS_IO_MAX_CLASSES);
    if (C > TS_IO_MAX_CHANNELS) return TS_ERR(TS_ERR_ARG, "synth: %d channels (1..%d)", C, TS_IO_MAX_CHANNELS);
    const int64_t nv = D * H * W, dims[3] = {D, H, W};
    ts_rng g;
    ts_rng_init(&g, o->seed, (uint32_t)index, STREAM_SYNTH + (uint32_t)(index >> 32));
    snprintf(s->name, sizeof s->name, "synth_%06lld", (long long)index);
    snprintf(s->source_image, sizeof s->source_image, "tessera synth seed=%llu", (unsigned long long)o->seed);
    snprintf(s->source_label, sizeof s->source_label, "tessera synth seed=%llu", (unsigned long long)o->seed);
    s->shape[0] = C;
    s->shape[1] = D;
    s->shape[2] = H;
    s->shape[3] = W;
    for (int k = 0; k < 3; k++) s->spacing[k] = 1.0;
    for (int k = 0; k < 4; k++) s->sform[5 * k] = s->qform[5 * k] = 1.0;
    s->image = TS_ALIGNED_ALLOC((size_t)(C * nv) * sizeof(float));
    s->label = TS_ALIGNED_ALLOC((size_t)nv);
    int nmax = 4 * (K - 1);
    shapes = TS_CALLOC((size_t)nmax, sizeof *shapes);
    fz = TS_CALLOC((size_t)D, sizeof(double));
    fy = TS_CALLOC((size_t)H, sizeof(double));
    fx = TS_CALLOC((size_t)W, sizeof(double));
    if (!s->image || !s->label || !shapes || !fz || !fy || !fx) TS_FAIL(TS_ERR_NOMEM, "synth sample");
    memset(s->label, 0, (size_t)nv);

    /* shapes: per class one ellipsoid, or a blob of 2-3 overlapping spheroids */
    int ns = 0;
    for (int k = 1; k < K; k++) {
        double c[3], r[3], rot[9];
        for (int d = 0; d < 3; d++) {
            c[d] = dims[d] * (0.2 + 0.6 * ts_rng_uniform(&g));
            r[d] = fmax(1.0, dims[d] * (0.08 + 0.17 * ts_rng_uniform(&g)));
        }
        rotation(&g, rot);
        int parts = ts_rng_uniform(&g) < 0.5 ? 1 : 2 + (int)ts_rng_below(&g, 2);
        for (int p = 0; p < parts && ns < nmax; p++) {
            double cp[3], rp[3];
            for (int d = 0; d < 3; d++) {
                cp[d] = p ? c[d] + r[d] * (ts_rng_uniform(&g) - 0.5) : c[d];
                rp[d] = p ? fmax(1.0, r[d] * (0.5 + 0.4 * ts_rng_uniform(&g))) : r[d];
            }
            add_shape(&shapes[ns++], dims, cp, rp, rot, k);
        }
    }
    for (int t = 0; t < ns; t++) {
        const shape *sh = &shapes[t];
        for (int64_t z = sh->lo[0]; z < sh->hi[0]; z++)
            for (int64_t y = sh->lo[1]; y < sh->hi[1]; y++)
                for (int64_t x = sh->lo[2]; x < sh->hi[2]; x++) {
                    double p[3] = {z + 0.5 - sh->c[0], y + 0.5 - sh->c[1], x + 0.5 - sh->c[2]}, q = 0;
                    for (int a = 0; a < 3; a++) {
                        double u = sh->rot[3 * a] * p[0] + sh->rot[3 * a + 1] * p[1] + sh->rot[3 * a + 2] * p[2];
                        q += (u / sh->r[a]) * (u / sh->r[a]);
                    }
                    if (q <= 1.0) s->label[(z * H + y) * W + x] = (uint8_t)sh->cls;
                }
    }
    /* intensities: background 0.1, classes spread over [0.3, 1] in a random order per channel */
    for (int c = 0; c < C; c++) {
        double mu[TS_IO_MAX_CLASSES];
        mu[0] = 0.1;
        for (int k = 1; k < K; k++) mu[k] = 0.3 + 0.7 * (double)k / (double)(K - 1);
        for (int k = K - 1; k > 1; k--) { /* shuffle classes 1..K-1 */
            int j = 1 + (int)ts_rng_below(&g, (uint64_t)k);
            double t = mu[k];
            mu[k] = mu[j];
            mu[j] = t;
        }
        double amp = 0.1 + 0.15 * ts_rng_uniform(&g);
        double fr[3], ph[3];
        for (int d = 0; d < 3; d++) {
            fr[d] = (0.5 + ts_rng_uniform(&g)) * M_PI / (double)dims[d];
            ph[d] = 2 * M_PI * ts_rng_uniform(&g);
        }
        for (int64_t z = 0; z < D; z++) fz[z] = 1.0 + amp * sin(fr[0] * z + ph[0]);
        for (int64_t y = 0; y < H; y++) fy[y] = 1.0 + amp * sin(fr[1] * y + ph[1]);
        for (int64_t x = 0; x < W; x++) fx[x] = 1.0 + amp * sin(fr[2] * x + ph[2]);
        const double sigma = o->noise > 0 ? o->noise : 0.05;
        float *img = s->image + c * nv;
        for (int64_t z = 0; z < D; z++)
            for (int64_t y = 0; y < H; y++) {
                double fzy = fz[z] * fy[y];
                int64_t row = (z * H + y) * W;
                for (int64_t x = 0; x < W; x++)
                    img[row + x] = (float)(mu[s->label[row + x]] * fzy * fx[x] + sigma * ts_rng_normal(&g));
            }
    }
cleanup:
    free(shapes);
    free(fz);
    free(fy);
    free(fx);
    if (err) ts_sample_release(s);
    return err;
}

int ts_synth_write(MPI_Comm comm, const char *path, const ts_synth_opts *o, int64_t count, int shards, int chunk)
{
    int err = 0;
    ts_dswriter *w = NULL;
    char src[256];
    const int K = o->classes > 0 ? o->classes : 3;
    snprintf(src, sizeof src, "tessera synth --count %lld --size %lld,%lld,%lld --classes %d --channels %d --seed %llu",
             (long long)count, (long long)o->size[0], (long long)o->size[1], (long long)o->size[2], K,
             o->channels > 0 ? o->channels : 1, (unsigned long long)o->seed);
    const char *names[TS_IO_MAX_CLASSES];
    char buf[TS_IO_MAX_CLASSES][16];
    names[0] = "background";
    for (int k = 1; k < K && k < TS_IO_MAX_CLASSES; k++) {
        snprintf(buf[k], sizeof buf[k], "shape%d", k);
        names[k] = buf[k];
    }
    ts_dswriter_opts wo = {
        .count = count,
        .channels = o->channels > 0 ? o->channels : 1,
        .classes = K,
        .class_names = names,
        .shards = shards,
        .chunk = chunk,
        .source = src,
        .seed = o->seed,
    };
    TS_CHECK(ts_dswriter_create(comm, path, &wo, &w));
    for (int64_t r = 0; r < ts_dswriter_rounds(w); r++) {
        ts_sample s;
        memset(&s, 0, sizeof s);
        int lerr = 0, have = r < ts_dswriter_local_count(w);
        if (have) lerr = ts_synth_sample(o, ts_dswriter_local_index(w, r), &s);
        err = ts_dswriter_put(w, have && !lerr ? &s : NULL, lerr);
        ts_sample_release(&s);
        if (err) goto cleanup;
    }
    TS_CHECK(ts_dswriter_finish(w));
cleanup:
    ts_dswriter_destroy(&w);
    return err;
}
