/* Parameter arena; see arena.h. Owns the one contiguous block of
 * parameters, gradients, optimizer state and buffers (offsets fixed by
 * ts_arena_add, memory by ts_arena_alloc), a sharded optimizer state's
 * region and the GPU mirror of params, grads and buffers (the copies
 * between the two; with the state on the GPU, the device's params and
 * state are the master copy); knows no layer and no update rule, no MPI. */
#include "tsbuild.h"
#include "src/model/arena.h"
#include "src/core/device.h"
#include "src/core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ts_arena_create(ts_arena **out)
{
    ts_arena *a = TS_CALLOC(1, sizeof *a);
    if (!a) return TS_ERR_NOMEM;
    *out = a;
    return 0;
}

void ts_arena_destroy(ts_arena **a)
{
    if (!a || !*a) return;
    free((*a)->p);
    free((*a)->base);
    free((*a)->state_base);
    ts_device_free((*a)->dev_base);
    free(*a);
    *a = NULL;
}

int ts_arena_add(ts_arena *a, const char *name, ts_param_kind kind, ts_dtype dtype, int ndim, const int64_t *shape,
                 int *index)
{
    if (a->base) return TS_ERR(TS_ERR_INTERNAL, "arena: '%s' added after allocation", name);
    if (strlen(name) >= TS_PARAM_NAME_MAX || ndim < 0 || ndim > 5 || (dtype != TS_FLOAT32 && dtype != TS_INT64) ||
        (kind == TS_PARAM && dtype != TS_FLOAT32))
        return TS_ERR(TS_ERR_INTERNAL, "arena: bad declaration of '%s'", name);
    if (ts_arena_find(a, name) >= 0) return TS_ERR(TS_ERR_INTERNAL, "arena: '%s' declared twice", name);
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 64;
        ts_param *p = realloc(a->p, sizeof *p * (size_t)cap);
        if (!p) return TS_ERR(TS_ERR_NOMEM, "arena table");
        a->p = p;
        a->cap = cap;
    }
    ts_param *p = &a->p[a->n];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = kind;
    p->dtype = dtype;
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        p->numel *= shape[i];
    }
    size_t floats = (size_t)p->numel * (dtype == TS_INT64 ? 2 : 1), padded = (floats + 15) & ~(size_t)15;
    if (kind == TS_PARAM) {
        p->offset = a->nparam;
        a->nparam += padded;
    } else {
        p->offset = a->nbuf;
        a->nbuf += padded;
    }
    if (index) *index = a->n;
    a->n++;
    return 0;
}

int ts_arena_alloc(ts_arena *a, int nstate)
{
    if (nstate < 0 || nstate > TS_ARENA_MAX_STATE) return TS_ERR(TS_ERR_INTERNAL, "arena: %d state regions", nstate);
    free(a->base);
    free(a->state_base);
    a->state_base = NULL;
    size_t total = a->nparam * (size_t)(2 + nstate) + a->nbuf;
    a->base = TS_ALIGNED_ALLOC((total ? total : 16) * sizeof(float));
    if (!a->base) return TS_ERR_NOMEM;
    memset(a->base, 0, total * sizeof(float));
    a->nstate = nstate;
    a->nstate_floats = a->nparam;
    a->params = a->base;
    a->grads = a->params + a->nparam;
    for (int s = 0; s < TS_ARENA_MAX_STATE; s++) a->state[s] = s < nstate ? a->grads + a->nparam * (size_t)(s + 1) : NULL;
    a->buffers = a->base + a->nparam * (size_t)(2 + nstate);
    return 0;
}

int ts_arena_alloc_state(ts_arena *a, int nstate, size_t n)
{
    if (!a->base || (a->nstate > 0 && !a->state_base) || nstate < 0 || nstate > TS_ARENA_MAX_STATE)
        return TS_ERR(TS_ERR_INTERNAL, "arena: %d shard state regions on an arena with %d of its own", nstate, a->nstate);
    free(a->state_base);
    a->state_base = NULL;
    const size_t total = n * (size_t)nstate;
    a->state_base = TS_ALIGNED_ALLOC((total ? total : 16) * sizeof(float)); /* never NULL: it marks the shard */
    if (!a->state_base) return TS_ERR(TS_ERR_NOMEM, "optimizer state shard (%zu floats)", total);
    memset(a->state_base, 0, (total ? total : 16) * sizeof(float));
    a->nstate = nstate;
    a->nstate_floats = n;
    for (int s = 0; s < TS_ARENA_MAX_STATE; s++) a->state[s] = s < nstate ? a->state_base + n * (size_t)s : NULL;
    return 0;
}

int ts_arena_find(const ts_arena *a, const char *name)
{
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->p[i].name, name)) return i;
    return -1;
}

static ts_tensor view(const ts_param *p, float *region)
{
    if (!region) return ts_tensor_view(NULL, p->dtype, p->ndim, p->shape);
    return ts_tensor_view(region + p->offset, p->dtype, p->ndim, p->shape);
}

ts_tensor ts_arena_value(const ts_arena *a, int i)
{
    return view(&a->p[i], a->p[i].kind == TS_PARAM ? a->params : a->buffers);
}

ts_tensor ts_arena_grad(const ts_arena *a, int i) { return view(&a->p[i], a->p[i].kind == TS_PARAM ? a->grads : NULL); }

ts_tensor ts_arena_state(const ts_arena *a, int s, int i)
{
    return view(&a->p[i], a->p[i].kind == TS_PARAM && s < a->nstate && !a->state_base ? a->state[s] : NULL);
}

void ts_arena_zero_grad(ts_arena *a)
{
    if (a->grads) memset(a->grads, 0, a->nparam * sizeof(float));
    if (a->dev_grads) {
        ts_tensor g = ts_tensor_view(a->dev_grads, TS_FLOAT32, 1, (const int64_t[]){(int64_t)a->nparam});
        g.device = 1;
        ts_tensor_zero(&g);
    }
}

/* the device block: params | grads | nst state regions | buffers | scratch (the old one freed) */
static int dev_block(ts_arena *a, int nst)
{
    ts_device_free(a->dev_base);
    a->dev_base = a->dev_params = a->dev_grads = a->dev_buffers = a->dev_scratch = NULL;
    memset(a->dev_state, 0, sizeof a->dev_state);
    a->dev_master = 0;
    void *p = NULL;
    const size_t floats = (2 + (size_t)nst) * a->nparam + a->nbuf + TS_ARENA_DEV_SCRATCH;
    TS_TRY(ts_device_alloc(floats * sizeof(float), &p));
    a->dev_base = p;
    a->dev_params = a->dev_base;
    a->dev_grads = a->dev_params + a->nparam;
    for (int s = 0; s < nst; s++) a->dev_state[s] = a->dev_grads + a->nparam * (size_t)(s + 1);
    a->dev_buffers = a->dev_base + a->nparam * (size_t)(2 + nst);
    a->dev_scratch = a->dev_buffers + a->nbuf;
    ts_arena_zero_grad(a);
    return 0;
}

int ts_arena_alloc_device(ts_arena *a)
{
    if (!a->base) return TS_ERR(TS_ERR_INTERNAL, "arena: device mirror before ts_arena_alloc");
    TS_TRY(dev_block(a, 0));
    return ts_arena_to_device(a);
}

int ts_arena_device_master(ts_arena *a)
{
    if (!a->dev_base) return TS_ERR(TS_ERR_INTERNAL, "arena: the state on the GPU needs the device mirror");
    if (a->state_base) return TS_ERR(TS_ERR_UNSUPPORTED, "arena: a sharded optimizer state stays on the host");
    if (a->dev_master) return 0;
    TS_TRY(dev_block(a, a->nstate));
    a->dev_master = 1;
    return ts_arena_push(a);
}

static ts_tensor dev_view(const ts_param *p, float *region)
{
    ts_tensor t = ts_tensor_view(region + p->offset, p->dtype, p->ndim, p->shape);
    t.device = 1;
    return t;
}

ts_tensor ts_arena_dev_value(const ts_arena *a, int i)
{
    const ts_param *p = &a->p[i];
    if (!a->dev_base || p->dtype != TS_FLOAT32) return ts_arena_value(a, i);
    return dev_view(p, p->kind == TS_PARAM ? a->dev_params : a->dev_buffers);
}

ts_tensor ts_arena_dev_grad(const ts_arena *a, int i)
{
    const ts_param *p = &a->p[i];
    if (!a->dev_base || p->kind != TS_PARAM) return ts_arena_grad(a, i);
    return dev_view(p, a->dev_grads);
}

/* n floats from region src to dst (one of them on the device) */
static int copy_floats(float *dst, int dst_dev, float *src, size_t n)
{
    if (!n) return 0;
    ts_tensor d = ts_tensor_view(dst, TS_FLOAT32, 1, (const int64_t[]){(int64_t)n});
    ts_tensor s = ts_tensor_view(src, TS_FLOAT32, 1, (const int64_t[]){(int64_t)n});
    d.device = dst_dev;
    s.device = !dst_dev;
    return ts_tensor_transfer(&d, &s);
}

int ts_arena_to_device(ts_arena *a)
{
    if (!a->dev_base) return 0;
    if (!a->dev_master) TS_TRY(copy_floats(a->dev_params, 1, a->params, a->nparam)); /* the host's are the master */
    return copy_floats(a->dev_buffers, 1, a->buffers, a->nbuf);
}

int ts_arena_push(ts_arena *a)
{
    if (!a->dev_base) return 0;
    TS_TRY(copy_floats(a->dev_params, 1, a->params, a->nparam));
    for (int s = 0; a->dev_master && s < a->nstate; s++) TS_TRY(copy_floats(a->dev_state[s], 1, a->state[s], a->nparam));
    return copy_floats(a->dev_buffers, 1, a->buffers, a->nbuf);
}

int ts_arena_pull(ts_arena *a, size_t lo, size_t hi)
{
    if (!a->dev_master) return 0;
    if (lo > hi || hi > a->nparam) return TS_ERR(TS_ERR_INTERNAL, "arena: pull of [%zu, %zu) of %zu", lo, hi, a->nparam);
    TS_TRY(copy_floats(a->params + lo, 0, a->dev_params + lo, hi - lo));
    for (int s = 0; s < a->nstate; s++) TS_TRY(copy_floats(a->state[s] + lo, 0, a->dev_state[s] + lo, hi - lo));
    return 0;
}

int ts_arena_buffers_to_host(ts_arena *a)
{
    for (int i = 0; a->dev_base && i < a->n; i++) {
        const ts_param *p = &a->p[i];
        if (p->kind == TS_BUFFER && p->dtype == TS_FLOAT32)
            TS_TRY(copy_floats(a->buffers + p->offset, 0, a->dev_buffers + p->offset, (size_t)p->numel));
    }
    return 0;
}

int ts_arena_grads_to_host(ts_arena *a)
{
    return a->dev_base ? copy_floats(a->grads, 0, a->dev_grads, a->nparam) : 0;
}

int64_t ts_arena_count(const ts_arena *a)
{
    int64_t n = 0;
    for (int i = 0; i < a->n; i++)
        if (a->p[i].kind == TS_PARAM) n += a->p[i].numel;
    return n;
}
