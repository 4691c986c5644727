/* train.dump_grads (see grad_dump.h): one step's gradients gathered whole
 * from whichever ranks hold them and written by rank 0. Reads the gradients
 * only and no config key (the trainer hands in the path). */
#include "tsbuild.h"
#include "src/train/grad_dump.h"
#include "src/core/error.h"
#include "src/model/weights.h"

#include <stdlib.h>
#include <string.h>

/* 1 if this rank is the one that contributes entry i */
static int owns_entry(const ts_arena *a, const ts_grid *g, const ts_grad_share *sh, int i)
{
    if (i < sh->e0 || i >= sh->e1) return 0;
    if (a->p[i].kind == TS_PARAM && sh->npieces > 0) return 1; /* per float: its shard owner (below) */
    return g->d == 0 && g->s == 0;
}

/* the values this rank contributes, zero elsewhere: gradients of the
 * parameter region into gp, buffers into gb */
static void own_values(const ts_arena *a, const ts_grid *g, const ts_grad_share *sh, float *gp, float *gb)
{
    memset(gp, 0, a->nparam * sizeof(float));
    if (a->nbuf) memset(gb, 0, a->nbuf * sizeof(float));
    for (int i = 0; i < a->n; i++) {
        if (!owns_entry(a, g, sh, i)) continue;
        ts_tensor v = ts_arena_value(a, i);
        const size_t bytes = ts_tensor_bytes(&v);
        if (a->p[i].kind != TS_PARAM) {
            memcpy(gb + a->p[i].offset, v.data, bytes);
            continue;
        }
        const size_t lo = a->p[i].offset, hi = lo + bytes / sizeof(float);
        if (sh->npieces == 0) {
            memcpy(gp + lo, a->grads + lo, bytes);
            continue;
        }
        for (int k = 0; k < sh->npieces; k++) { /* the part of the entry in each piece of the shard */
            const size_t s = sh->plo[k] > lo ? sh->plo[k] : lo, e = sh->plo[k] + sh->plen[k] < hi ? sh->plo[k] + sh->plen[k] : hi;
            if (s < e) memcpy(gp + s, a->grads + s, (e - s) * sizeof(float));
        }
    }
}

static int or_world(const ts_grid *g, float *v, size_t n)
{
    for (size_t off = 0; off < n; off += (size_t)1 << 28) { /* pieces below INT_MAX */
        const size_t m = n - off < ((size_t)1 << 28) ? n - off : ((size_t)1 << 28);
        TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, v + off, (int)m, MPI_INT32_T, MPI_BOR, g->world));
    }
    return 0;
}

static int write_file(const char *path, const ts_arena *a, float *gp, float *gb, double loss, int64_t step)
{
    ts_arena view = *a; /* the same entries, their values read from the gathered regions */
    view.params = gp;
    view.buffers = gb;
    hid_t f;
    TS_TRY(ts_weights_create(path, &f));
    int err = ts_weights_put(f, path, &view);
    if (!err) {
        ts_tensor l = {0};
        l.dtype = TS_FLOAT64;
        l.ndim = 0;
        l.data = &loss;
        err = ts_weights_write_dataset(f, path, "/loss", &l);
    }
    if (!err) {
        ts_tensor s = {0};
        s.dtype = TS_INT64;
        s.ndim = 0;
        s.data = &step;
        err = ts_weights_write_dataset(f, path, "/step", &s);
    }
    if (H5Fclose(f) < 0 && !err) err = TS_ERR(TS_ERR_IO, "%s: closing failed", path);
    return err;
}

int ts_grad_dump(const char *path, const ts_arena *a, const ts_grid *g, const ts_grad_share *sh, double loss,
                 int64_t step)
{
    int err = 0;
    float *gp = TS_ALIGNED_ALLOC((a->nparam + a->nbuf + 16) * sizeof(float)), *gb = gp ? gp + a->nparam : NULL;
    err = gp ? 0 : TS_ERR(TS_ERR_NOMEM, "train.dump_grads: %zu floats", a->nparam + a->nbuf);
    TS_CHECK(ts_err_agree(g->world, err));
    own_values(a, g, sh, gp, gb);
    TS_CHECK(or_world(g, gp, a->nparam + a->nbuf));
    err = g->rank == 0 ? TS_CTX(write_file(path, a, gp, gb, loss, step), "train.dump_grads = %s", path) : 0;
    err = ts_err_agree(g->world, err);
cleanup:
    free(gp);
    return err;
}
