/* One training step (data parallel, spatially split, pipelined); see step.h.
 * Owns the stepper: the backward hook that hands final gradients to the
 * buckets, the reduction, the optimizer over this rank's range or shard and
 * a sharded state's moves; with the state on the GPU
 * (ts_stepper_set_device) the same on the device's gradients. Must not split communicators or read config keys;
 * allocates at setup and for a checkpoint's state moves, not per step. */
#include "tsbuild.h"
#include "src/train/step.h"
#include "collectives/device.h"
#include "src/core/device.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/core/timer.h"
#include "src/core/watchdog.h"
#include "src/parallel/split_model.h"
#include "src/train/run.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ts_stepper {
    ts_unet *model;
    ts_arena *arena;
    ts_optim *opt;
    ts_coll *coll;
    ts_dp *dp;
    unsigned char *final; /* per arena entry: gradient final in this backward */
    int frontier;         /* entries [frontier, e1) are final (or buffers) */
    int hook_err;
    int pending;          /* a backward error kept until the buckets are done (ts_stepper_reduce) */
    MPI_Comm agree;       /* the ranks that agree on errors in a step (MPI_COMM_NULL: none) */
    int e0, e1;           /* the arena entries this rank reduces and steps (its pipeline stage's; all without one) */
    size_t off0, off1;    /* their floats in the parameter region */
    double bucket_mb;
    int zero;             /* sharded optimizer (ts_stepper_set_zero) */
    int npieces;          /* its shard: the floats [plo[k], plo[k] + plen[k]) of the parameter region */
    size_t *plo, *plen, shard_floats;
    int poisoned;         /* sharded: injected non-finite gradients (ts_stepper_poison) */
    ts_pipeline *pipe;    /* NULL: no pipeline */
    MPI_Comm pp_comm;     /* the pipeline group (gradient norm over the stages) */
    ts_step_times t;
    ts_perf *perf; /* may be NULL */
    float sp_scale;     /* the loss gradient's factor for the spatial split (sp) */
    double loss_scale;  /* fp16 loss scale S: the loss gradient is multiplied by it, reduce divides by it */
    ts_dp_compress compress; /* gradient compression (parallel.compress), applied to every new dp */
    size_t *zbounds;         /* its tensor starts in [off0, off1), relative to off0 */
    int dev_order;           /* the device collectives wait for the compute stream (ts_stepper_set_device) */
};

/* called by backward as each parameter's gradient becomes final */
static void grad_ready(void *ctx, int i)
{
    ts_stepper *s = ctx;
    if (s->hook_err) return;
    s->final[i] = 1;
    const ts_arena *a = s->arena;
    int f = s->frontier;
    while (f > s->e0 && (s->final[f - 1] || a->p[f - 1].kind != TS_PARAM)) f--;
    if (f == s->frontier) return;
    s->frontier = f;
    /* the lowest offset among the (final) parameters at or after the
     * frontier; buffers have offsets in another region and do not count */
    size_t lo = s->off1;
    for (int j = f; j < s->e1; j++)
        if (a->p[j].kind == TS_PARAM && a->p[j].offset < lo) lo = a->p[j].offset;
    s->hook_err = ts_dp_ready(s->dp, lo - s->off0);
}

static int norm_sync(void *ctx, double *buf, int n, int op)
{
    ts_stepper *s = ctx;
    return ts_coll_allreduce(s->coll, TS_IN_PLACE, buf, (size_t)n, TS_FLOAT64, op == TS_SYNC_MAX ? TS_OP_MAX : TS_OP_SUM);
}

int ts_stepper_create(ts_unet *m, ts_optim *opt, ts_coll *coll, double bucket_mb, int sync_bn, ts_spatial *sp,
                      ts_stepper **out)
{
    int err = 0;
    ts_stepper *s = TS_CALLOC(1, sizeof *s);
    *out = NULL;
    if (!s) return TS_ERR_NOMEM;
    s->pp_comm = s->agree = MPI_COMM_NULL;
    s->model = m;
    s->arena = ts_unet_arena(m);
    s->opt = opt;
    s->coll = coll;
    s->final = TS_CALLOC((size_t)s->arena->n + 1, 1);
    if (!s->final) TS_FAIL(TS_ERR_NOMEM, "gradient flags");
    s->e0 = 0;
    s->e1 = s->arena->n;
    s->off0 = 0;
    s->off1 = s->arena->nparam;
    s->bucket_mb = bucket_mb;
    s->pp_comm = MPI_COMM_NULL;
    size_t bf = (size_t)(bucket_mb * 1e6 / sizeof(float));
    TS_CHECK(ts_dp_create(coll, s->arena->grads, s->arena->nparam, bf ? bf : 16, &s->dp));
    if (sync_bn && ts_coll_size(coll) > 1) ts_unet_set_norm_sync(m, norm_sync, s);
    ts_spatial_split_model(m, sp);
    s->sp_scale = sp ? (float)ts_spatial_size(sp) : 1.0f;
    s->loss_scale = 1.0;
    ts_unet_set_loss_scale(m, s->sp_scale);
    *out = s;
    return 0;
cleanup:
    ts_stepper_destroy(&s);
    return err;
}

void ts_stepper_destroy(ts_stepper **sp)
{
    if (!sp || !*sp) return;
    ts_stepper *s = *sp;
    if (s->model) {
        ts_unet_set_grad_hook(s->model, NULL, NULL);
        ts_unet_set_norm_sync(s->model, NULL, NULL);
        ts_unet_set_loss_scale(s->model, 1.0f);
    }
    ts_dp_destroy(&s->dp);
    if (s->dev_order) ts_coll_device_order_after(NULL); /* the stream goes with the device */
    if (s->pp_comm != MPI_COMM_NULL) MPI_Comm_free(&s->pp_comm);
    if (s->agree != MPI_COMM_NULL) MPI_Comm_free(&s->agree);
    free(s->final);
    free(s->zbounds);
    free(s->plo);
    free(s->plen);
    free(s);
    *sp = NULL;
}

static int cmp_size(const void *x, const void *y)
{
    const size_t a = *(const size_t *)x, b = *(const size_t *)y;
    return a < b ? -1 : a > b;
}

/* the dp's compression, with the starts of this stepper's parameter tensors
 * (sign's scale groups do not straddle them) */
static int apply_compress(ts_stepper *s)
{
    const ts_arena *a = s->arena;
    free(s->zbounds);
    s->zbounds = TS_MALLOC(((size_t)a->n + 1) * sizeof *s->zbounds);
    if (!s->zbounds) return TS_ERR_NOMEM;
    size_t nb = 0, k = 0;
    for (int j = 0; j < a->n; j++)
        if (a->p[j].kind == TS_PARAM && a->p[j].offset > s->off0 && a->p[j].offset < s->off1)
            s->zbounds[nb++] = a->p[j].offset - s->off0;
    qsort(s->zbounds, nb, sizeof *s->zbounds, cmp_size);
    for (size_t i = 0; i < nb; i++) /* ascending, no repeats */
        if (!k || s->zbounds[i] > s->zbounds[k - 1]) s->zbounds[k++] = s->zbounds[i];
    nb = k;
    s->compress.bounds = s->zbounds;
    s->compress.nbounds = nb;
    return ts_dp_set_compress(s->dp, &s->compress);
}

int ts_stepper_set_pipeline(ts_stepper *s, ts_pipeline *pl, MPI_Comm pp_comm)
{
    int u0, u1, slots, f, e;
    if (s->zero) return TS_ERR(TS_ERR_INTERNAL, "stepper: pipeline set after sharding");
    ts_unet_stage(s->model, &u0, &u1, &slots);
    ts_unet_unit_params(s->model, u0, &s->e0, &e);
    ts_unet_unit_params(s->model, u1 - 1, &f, &s->e1);
    /* the stage's parameters: from its first parameter to the next stage's first (tensors are padded) */
    const ts_arena *a = s->arena;
    s->off0 = a->nparam;
    for (int j = s->e0; j < s->e1 && s->off0 == a->nparam; j++)
        if (a->p[j].kind == TS_PARAM) s->off0 = a->p[j].offset;
    s->off1 = a->nparam;
    for (int j = s->e1; j < a->n && s->off1 == a->nparam; j++)
        if (a->p[j].kind == TS_PARAM) s->off1 = a->p[j].offset;
    if (s->off0 > s->off1) s->off0 = s->off1;
    ts_dp_destroy(&s->dp);
    size_t bf = (size_t)(s->bucket_mb * 1e6 / sizeof(float));
    TS_TRY(ts_dp_create(s->coll, s->arena->grads + s->off0, s->off1 - s->off0, bf ? bf : 16, &s->dp));
    TS_TRY(apply_compress(s));
    s->pipe = pl;
    if (s->pp_comm != MPI_COMM_NULL) MPI_Comm_free(&s->pp_comm);
    TS_MPI_TRY(MPI_Comm_dup(pp_comm, &s->pp_comm));
    return 0;
}

/* before the last micro-batch's backward: no bucket is in flight */
static void begin_buckets(void *ctx)
{
    ts_stepper *s = ctx;
    ts_dp_begin(s->dp);
    memset(s->final, 0, (size_t)s->arena->n);
    s->frontier = s->e1;
    s->hook_err = 0;
    s->poisoned = 0;
}

int ts_stepper_pipe_step(ts_stepper *s, ts_pipeline_next next, void *ctx, double *loss)
{
    if (!s->pipe) return TS_ERR(TS_ERR_INTERNAL, "stepper: no pipeline");
    const ts_pipeline_stats *ps = ts_pipeline_get_stats(s->pipe);
    const double f0 = ps->forward_s, b0 = ps->backward_s;
    TS_TRY(ts_pipeline_step(s->pipe, next, ctx, grad_ready, s, begin_buckets, loss));
    TS_TRY(s->hook_err);
    /* the stage's own compute; its idle time is in the pipeline's figures */
    s->t.forward += ps->forward_s - f0;
    s->t.backward += ps->backward_s - b0;
    ts_perf_add(s->perf, TS_PH_FORWARD, ps->forward_s - f0); /* time only: units interleave with messages */
    ts_perf_add(s->perf, TS_PH_BACKWARD, ps->backward_s - b0);
    return 0;
}

int ts_stepper_micro(ts_stepper *s, const ts_tensor *image, const ts_tensor *label, int first, int last, double *loss)
{
    if (first) {
        ts_arena_zero_grad(s->arena);
        s->pending = 0;
    }
    ts_perf_begin(s->perf, TS_PH_FORWARD);
    double t0 = ts_time_now();
    ts_fault_point("forward"); /* an injected kill at=forward */
    int err = ts_unet_forward(s->model, image, 1);
    if (!err) err = ts_unet_loss(s->model, label, 1, loss);
    if (!err && ts_fault_at(TS_FAULT_ERROR, ts_fault_step(), NULL))
        err = TS_ERR(TS_ERR_ARG, "injected error (TESSERA_FAULT) in the forward pass of step %lld", (long long)ts_fault_step());
    double t1 = ts_time_now();
    ts_perf_end(s->perf, TS_PH_FORWARD);
    /* a rank that failed tells the others before anyone starts the gradient buckets */
    if (s->agree != MPI_COMM_NULL) err = ts_err_agree(s->agree, err);
    TS_TRY(err);
    s->t.forward += t1 - t0;
    if (last) begin_buckets(s); /* buckets go out as backward finishes them */
    ts_unet_set_grad_hook(s->model, last ? grad_ready : NULL, s);
    ts_perf_begin(s->perf, TS_PH_BACKWARD);
    ts_fault_point("backward"); /* an injected kill at=backward */
    err = ts_unet_backward(s->model);
    ts_perf_end(s->perf, TS_PH_BACKWARD);
    if (!err) err = s->hook_err;
    if (err && s->agree != MPI_COMM_NULL) {
        /* every bucket still goes out (the others reduce them), the error is agreed in ts_stepper_reduce */
        ts_unet_set_grad_hook(s->model, NULL, NULL);
        if (last) ts_dp_ready(s->dp, 0);
        if (!s->pending) s->pending = err;
        return 0;
    }
    TS_TRY(err);
    s->t.backward += ts_time_now() - t1;
    return 0;
}

int ts_stepper_update(ts_stepper *s, int accum)
{
    TS_TRY(ts_stepper_reduce(s, accum));
    return ts_stepper_apply(s);
}

int ts_stepper_set_zero(ts_stepper *s)
{
    const int nb = ts_dp_buckets(s->dp);
    free(s->plo);
    free(s->plen);
    s->plo = TS_CALLOC((size_t)nb + 1, sizeof *s->plo);
    s->plen = TS_CALLOC((size_t)nb + 1, sizeof *s->plen);
    if (!s->plo || !s->plen) return TS_ERR(TS_ERR_NOMEM, "shard pieces");
    ts_dp_set_sharded(s->dp, 1);
    s->shard_floats = ts_dp_shard(s->dp, s->plo, s->plen);
    for (int k = 0; k < nb; k++) s->plo[k] += s->off0;
    s->npieces = nb;
    TS_TRY(ts_arena_alloc_state(s->arena, ts_optim_state_count(&s->opt->cfg), s->shard_floats));
    s->zero = 1;
    return 0;
}

size_t ts_stepper_state_floats(const ts_stepper *s) { return s->zero ? s->shard_floats : s->arena->nparam; }

/* where every rank's shard lies, known on rank 0 of comm: rank q's pieces
 * are desc[2 j], desc[2 j + 1] (offset, length) for j in [dd[q]/2,
 * (dd[q] + dc[q])/2); buf holds the largest shard, so that rank 0 moves
 * one rank's packed shard at a time */
typedef struct shard_map {
    int size;
    int *dc, *dd;
    uint64_t *desc;
    float *buf;
} shard_map;

static void shard_map_free(shard_map *m)
{
    free(m->dc);
    free(m->desc);
    free(m->buf);
    memset(m, 0, sizeof *m);
}

/* floats of rank q's shard */
static size_t shard_floats_of(const shard_map *m, int q)
{
    size_t n = 0;
    for (int j = m->dd[q]; j < m->dd[q] + m->dc[q]; j += 2) n += m->desc[j + 1];
    return n;
}

/* Collective on comm: the map on rank 0 (nothing elsewhere); errors agreed. */
static int shard_map_make(const ts_stepper *s, MPI_Comm comm, shard_map *m)
{
    int rank, size, err = 0;
    const size_t nparam = s->arena->nparam;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    memset(m, 0, sizeof *m);
    m->size = size;
    uint64_t *mine = TS_CALLOC(2 * (size_t)s->npieces + 2, sizeof *mine);
    if (!mine) err = TS_ERR(TS_ERR_NOMEM, "shard map");
    if (!err && nparam > (size_t)INT_MAX) err = TS_ERR(TS_ERR_UNSUPPORTED, "sharded state of %zu floats: at most INT_MAX", nparam);
    if (!err && rank == 0) {
        m->dc = TS_CALLOC(2 * (size_t)size, sizeof *m->dc);
        if (!m->dc) err = TS_ERR(TS_ERR_NOMEM, "shard map");
        else m->dd = m->dc + size;
    }
    err = ts_err_agree(comm, err);
    if (err) goto cleanup;
    for (int k = 0; k < s->npieces; k++) {
        mine[2 * k] = s->plo[k];
        mine[2 * k + 1] = s->plen[k];
    }
    const int nd = 2 * s->npieces;
    TS_MPI(MPI_Gather(&nd, 1, MPI_INT, m->dc, 1, MPI_INT, 0, comm));
    if (rank == 0) {
        size_t total = 0;
        for (int q = 0; q < size; q++) {
            m->dd[q] = (int)total;
            total += (size_t)m->dc[q];
        }
        m->desc = TS_CALLOC(total + 1, sizeof *m->desc);
        if (!m->desc) err = TS_ERR(TS_ERR_NOMEM, "shard map");
    }
    err = ts_err_agree(comm, err);
    if (err) goto cleanup;
    TS_MPI(MPI_Gatherv(mine, nd, MPI_UINT64_T, m->desc, m->dc, m->dd, MPI_UINT64_T, 0, comm));
    if (rank == 0) {
        size_t f = 0, most = 0;
        for (int q = 0; q < size; q++) {
            const size_t n = shard_floats_of(m, q);
            f += n;
            if (n > most) most = n;
        }
        m->buf = TS_ALIGNED_ALLOC((most ? most : 16) * sizeof(float));
        if (!m->buf) err = TS_ERR(TS_ERR_NOMEM, "a shard of the optimizer state (%zu floats)", most);
        /* every float of the region has one owner in comm */
        else if (f != nparam) err = TS_ERR(TS_ERR_INTERNAL, "the shards hold %zu floats of %zu", f, nparam);
    }
    err = ts_err_agree(comm, err);
cleanup:
    free(mine);
    if (err) shard_map_free(m);
    return err;
}

/* rank 0: full (a whole state region) from (gather) or to every rank's
 * packed shard, one rank at a time through buf; the others: their packed
 * shard to or from rank 0 */
static int shard_move(const ts_stepper *s, MPI_Comm comm, const shard_map *m, float *full, float *packed, int gather)
{
    int rank, mrc = MPI_SUCCESS;
    const int tag = 0x2e50; /* the ranks of comm exchange nothing else point to point meanwhile */
    MPI_Comm_rank(comm, &rank);
    if (rank != 0) {
        mrc = gather ? MPI_Send(packed, (int)s->shard_floats, MPI_FLOAT, 0, tag, comm)
                     : MPI_Recv(packed, (int)s->shard_floats, MPI_FLOAT, 0, tag, comm, MPI_STATUS_IGNORE);
        return mrc == MPI_SUCCESS ? 0 : ts_err_mpi(mrc, __FILE__, __LINE__, gather ? "MPI_Send (shard)" : "MPI_Recv (shard)");
    }
    for (int q = 0; q < m->size && mrc == MPI_SUCCESS; q++) {
        const int n = (int)shard_floats_of(m, q);
        float *p = q == 0 ? packed : m->buf;
        if (q > 0 && gather) mrc = MPI_Recv(p, n, MPI_FLOAT, q, tag, comm, MPI_STATUS_IGNORE);
        size_t pos = 0;
        for (int j = m->dd[q]; j < m->dd[q] + m->dc[q] && mrc == MPI_SUCCESS; j += 2) {
            if (gather) memcpy(full + m->desc[j], p + pos, m->desc[j + 1] * sizeof(float));
            else memcpy(p + pos, full + m->desc[j], m->desc[j + 1] * sizeof(float));
            pos += m->desc[j + 1];
        }
        if (q > 0 && !gather && mrc == MPI_SUCCESS) mrc = MPI_Send(p, n, MPI_FLOAT, q, tag, comm);
    }
    return mrc == MPI_SUCCESS ? 0 : ts_err_mpi(mrc, __FILE__, __LINE__, "moving the optimizer state's shards");
}

int ts_stepper_state_gather(ts_stepper *s, MPI_Comm comm, float *const *full)
{
    const ts_arena *a = s->arena;
    shard_map m;
    int rank, err = 0;
    if (!s->zero) return TS_ERR(TS_ERR_INTERNAL, "stepper: state gather without sharding");
    MPI_Comm_rank(comm, &rank);
    TS_TRY(shard_map_make(s, comm, &m));
    for (int st = 0; st < a->nstate && !err; st++) {
        if (rank == 0) memset(full[st], 0, a->nparam * sizeof(float)); /* padding */
        err = shard_move(s, comm, &m, rank == 0 ? full[st] : NULL, a->state[st], 1);
    }
    shard_map_free(&m);
    return err;
}

int ts_stepper_state_scatter(ts_stepper *s, MPI_Comm comm, float *const *full)
{
    const ts_arena *a = s->arena;
    shard_map m;
    int rank, err = 0;
    if (!s->zero) return TS_ERR(TS_ERR_INTERNAL, "stepper: state scatter without sharding");
    MPI_Comm_rank(comm, &rank);
    TS_TRY(shard_map_make(s, comm, &m));
    for (int st = 0; st < a->nstate && !err; st++)
        err = shard_move(s, comm, &m, rank == 0 ? full[st] : NULL, a->state[st], 0);
    shard_map_free(&m);
    return err;
}

int ts_stepper_grads_finite(const ts_stepper *s)
{
    const float *g = s->arena->grads;
    int ok = 1;
    if (s->arena->dev_master) { /* on the GPU: a sum of squares in double is finite iff every gradient is */
        double sq = NAN;
        if (ts_optim_grad_sumsq(s->arena, s->off0, s->off1, &sq)) return 0; /* (the CUDA error resurfaces) */
        return isfinite(sq);
    }
    if (s->zero) { /* the shard: the rest of the gradients is the reduce-scatter's scratch */
        if (s->poisoned) return 0;
        for (int k = 0; k < s->npieces; k++) {
            const size_t lo = s->plo[k], hi = lo + s->plen[k];
#pragma omp parallel for schedule(static) reduction(&& : ok)
            for (size_t i = lo; i < hi; i++) ok = ok && isfinite(g[i]);
        }
        return ok;
    }
#pragma omp parallel for schedule(static) reduction(&& : ok)
    for (size_t i = s->off0; i < s->off1; i++) ok = ok && isfinite(g[i]);
    return ok;
}

void ts_stepper_param_range(const ts_stepper *s, size_t *lo, size_t *hi)
{
    *lo = s->off0;
    *hi = s->off1;
}

void ts_stepper_shard(const ts_stepper *s, int *n, const size_t **lo, const size_t **len)
{
    *n = s->zero ? s->npieces : 0;
    *lo = s->zero ? s->plo : NULL;
    *len = s->zero ? s->plen : NULL;
}

void ts_stepper_poison(ts_stepper *s)
{
    if (s->zero) s->poisoned = 1; /* the poisoned float may land in another rank's shard */
    if (s->off1 <= s->off0) return;
    if (s->arena->dev_master) {
        float nan = NAN;
        ts_tensor h = ts_tensor_view(&nan, TS_FLOAT32, 1, (const int64_t[]){1});
        ts_tensor d = ts_tensor_view(s->arena->dev_grads + s->off0, TS_FLOAT32, 1, (const int64_t[]){1});
        d.device = 1;
        (void)ts_tensor_transfer(&d, &h); /* (an error resurfaces at the next CUDA call) */
        return;
    }
    s->arena->grads[s->off0] = NAN;
}

int ts_stepper_reduce(ts_stepper *s, int accum)
{
    ts_dp_stats st = {0, 0, 0, 0};
    ts_fault_point("reduce"); /* an injected kill at=reduce: buckets may be in flight */
    ts_perf_begin(s->perf, TS_PH_COMM_EXPOSED);
    int err = ts_dp_finish(s->dp, &st);
    ts_perf_end(s->perf, TS_PH_COMM_EXPOSED);
    if (s->agree != MPI_COMM_NULL) { /* a backward that failed on some rank fails everywhere, after the buckets */
        err = ts_err_agree(s->agree, s->pending ? s->pending : err);
        s->pending = 0;
    }
    TS_TRY(err);
    s->t.comm_exposed += st.exposed_s;
    s->t.comm_total += st.comm_s;
    s->t.buckets_early += st.early;
    ts_perf_add(s->perf, TS_PH_COMM_TOTAL, st.comm_s);
    if (accum > 1 || s->loss_scale != 1.0) { /* summed over micro-batches, loss-scaled (only now: buckets were in flight) */
        const float f = (float)(1.0 / ((double)accum * s->loss_scale));
        if (s->zero)
            for (int k = 0; k < s->npieces; k++) TS_TRY(ts_optim_scale_grads(s->arena, s->plo[k], s->plo[k] + s->plen[k], f));
        else
            TS_TRY(ts_optim_scale_grads(s->arena, s->off0, s->off1, f)); /* where the gradients are */
    }
    return 0;
}

/* sharded: the global gradient norm (the shards' sums of squares added over
 * the group, then over the stages), the shard's update, the parameters
 * all-gathered bucket by bucket */
static int apply_sharded(ts_stepper *s)
{
    double norm = -1;
    if (s->opt->cfg.clip_norm > 0) {
        double sq = 0;
        for (int k = 0; k < s->npieces; k++) sq += ts_optim_sumsq(s->arena, s->plo[k], s->plo[k] + s->plen[k]);
        TS_TRY(ts_coll_allreduce(s->coll, TS_IN_PLACE, &sq, 1, TS_FLOAT64, TS_OP_SUM));
        if (s->pipe) TS_MPI_TRY(TS_WATCHED("gradient norm over the stages", MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, s->pp_comm)));
        norm = sqrt(sq);
    }
    /* the norm is the same on every rank, so an error here is too: no gather is left half-started */
    TS_TRY(ts_optim_step_pieces(s->opt, s->arena, s->npieces, s->plo, s->plen, norm, NULL));
    int err = 0;
    for (int k = 0; k < s->npieces && !err; k++) err = ts_dp_gather_start(s->dp, s->arena->params + s->off0, k);
    int e = ts_dp_gather_finish(s->dp);
    return err ? err : e;
}

int ts_stepper_apply(ts_stepper *s)
{
    int err;
    ts_perf_begin(s->perf, TS_PH_OPTIM);
    double t = ts_time_now(), norm = -1;
    ts_fault_point("update"); /* an injected kill at=update */
    if (s->zero) {
        err = apply_sharded(s);
        s->t.optimizer += ts_time_now() - t;
        ts_perf_end(s->perf, TS_PH_OPTIM);
        return err;
    }
    if (s->pipe && s->opt->cfg.clip_norm > 0) { /* the norm of every stage's gradients */
        err = ts_optim_grad_sumsq(s->arena, s->off0, s->off1, &norm); /* (where they are) */
        if (err) {
            ts_perf_end(s->perf, TS_PH_OPTIM);
            return err;
        }
        int mrc = TS_WATCHED("gradient norm over the stages", MPI_Allreduce(MPI_IN_PLACE, &norm, 1, MPI_DOUBLE, MPI_SUM, s->pp_comm));
        if (mrc != MPI_SUCCESS) {
            ts_perf_end(s->perf, TS_PH_OPTIM);
            return ts_err_mpi(mrc, __FILE__, __LINE__, "MPI_Allreduce");
        }
        norm = sqrt(norm);
    }
    err = ts_optim_step_range(s->opt, s->arena, s->off0, s->off1, norm, NULL, NULL);
    s->t.optimizer += ts_time_now() - t;
    ts_perf_end(s->perf, TS_PH_OPTIM);
    return err;
}

int ts_stepper_device_asked(ts_stepper *s, MPI_Comm world, int *on, char *why, size_t n)
{
    int want = 0;
    *on = -1;
    if (n) why[0] = 0;
    if (!s->arena->dev_base) return 0; /* the CPU engine: the key does not apply */
    TS_TRY(ts_err_agree(world, ts_stepper_state_wanted(&want)));
    if (!want) return 0;
    const int r = ts_stepper_set_device(s, why, n);
    TS_TRY(ts_err_agree(world, r < 0 ? r : 0));
    *on = r;
    return 0;
}

int ts_stepper_state_wanted(int *want)
{
    const char *e = getenv("TESSERA_CUDA_STATE");
    *want = e && !strcmp(e, "device");
    if (e && *e && !*want && strcmp(e, "host"))
        return TS_ERR(TS_ERR_CONFIG, "TESSERA_CUDA_STATE = '%s': host (the default) or device", e);
    return 0;
}

int ts_stepper_set_device(ts_stepper *s, char *why, size_t n)
{
    ts_arena *a = s->arena;
    const char *no = !a->dev_base ? "the model is not on the GPU (train.engine = cpu)"
                     : s->zero ? "a sharded optimizer state (parallel.zero = 1) is stepped on the host"
                     : s->compress.cfg.kind != TS_COMPRESS_NONE ? "gradient compression (parallel.compress) runs on the host"
                     : NULL;
    if (n) why[0] = 0;
    if (no) {
        if (n) snprintf(why, n, "%s", no);
        return 0;
    }
    const ts_device *dev = ts_device_current();
    if (!dev) return TS_ERR(TS_ERR_INTERNAL, "stepper: the model is on the GPU and no device is open");
    ts_coll_device_order_after(dev->compute); /* buckets read what the layers' kernels write */
    s->dev_order = 1;
    if (ts_coll_size(s->coll) > 1) { /* can the group reduce device buffers here (NCCL: one GPU per rank)? */
        int err = ts_coll_allreduce(s->coll, TS_IN_PLACE, a->dev_scratch, 1, TS_FLOAT32, TS_OP_SUM);
        if (err) { /* agreed by the collective: every rank keeps the host's state */
            if (n) snprintf(why, n, "the gradient group cannot reduce GPU buffers: %s", ts_err_message());
            ts_err_clear();
            ts_coll_device_order_after(NULL);
            s->dev_order = 0;
            return 0;
        }
    }
    TS_TRY(ts_arena_device_master(a));
    ts_dp_destroy(&s->dp);
    const size_t bf = (size_t)(s->bucket_mb * 1e6 / sizeof(float));
    TS_TRY(ts_dp_create(s->coll, a->dev_grads + s->off0, s->off1 - s->off0, bf ? bf : 16, &s->dp));
    return 1;
}

void ts_stepper_set_perf(ts_stepper *s, ts_perf *p) { s->perf = p; }

void ts_stepper_set_loss_scale(ts_stepper *s, double scale)
{
    s->loss_scale = scale;
    ts_unet_set_loss_scale(s->model, (float)(s->sp_scale * scale));
}

void ts_stepper_inject_overflow(ts_stepper *s, int on)
{
    /* S x 2^128 is inf as a float: dlogits, then every gradient, non-finite; the loss itself stays finite */
    ts_unet_set_loss_scale(s->model, (float)(s->sp_scale * s->loss_scale * (on ? 0x1p128 : 1.0)));
}

int ts_stepper_set_agree(ts_stepper *s, MPI_Comm comm)
{
    if (s->agree != MPI_COMM_NULL) MPI_Comm_free(&s->agree);
    TS_MPI_TRY(MPI_Comm_dup(comm, &s->agree));
    return 0;
}
/* ---- gradient compression (parallel.compress): the work is in src/parallel/buckets.c ---- */
int ts_stepper_set_compress(ts_stepper *s, const ts_dp_compress *c)
{
    s->compress = *c;
    return apply_compress(s);
}
const ts_dp *ts_stepper_dp(const ts_stepper *s) { return s->dp; }

const ts_step_times *ts_stepper_times(const ts_stepper *s) { return &s->t; }
int ts_stepper_buckets(const ts_stepper *s) { return ts_dp_buckets(s->dp); }

int ts_stepper_average_params(ts_stepper *s, ts_coll *replicas)
{
    if (ts_coll_size(replicas) == 1) return 0;
    ts_arena *a = s->arena;
    size_t lo, hi;
    ts_stepper_param_range(s, &lo, &hi);
    ts_perf_begin(s->perf, TS_PH_PARAM_AVG);
    int err = ts_arena_pull(a, lo, hi); /* a state on the GPU: averaged on the host, then up again */
    if (!err && hi > lo) {
        err = ts_coll_allreduce(replicas, TS_IN_PLACE, a->params + lo, hi - lo, TS_FLOAT32, TS_OP_AVG);
        for (int k = 0; !err && k < a->nstate; k++)
            err = ts_coll_allreduce(replicas, TS_IN_PLACE, a->state[k] + lo, hi - lo, TS_FLOAT32, TS_OP_AVG);
    }
    for (int i = 0; !err && i < a->n; i++) {
        if (a->p[i].kind != TS_BUFFER || a->p[i].dtype != TS_FLOAT32) continue;
        ts_tensor b = ts_arena_value(a, i);
        err = ts_coll_allreduce(replicas, TS_IN_PLACE, b.data, (size_t)b.shape[0], TS_FLOAT32, TS_OP_AVG);
    }
    if (!err) err = ts_arena_push(a);
    ts_perf_end(s->perf, TS_PH_PARAM_AVG);
    return err;
}
