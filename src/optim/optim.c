/* Optimizer configuration, dispatch and gradient clipping (see optim.h).
 * Owns the optimizer's train.* keys and the step over a range or pieces of
 * the arena; the rules are sgd.c's and adamw.c's, the rate schedule.c's. No
 * MPI: a sharded or pipelined step hands in the global norm (src/train/step.c). */
#include "tsbuild.h"
#include "src/optim/optim.h"
#include "src/core/error.h"

#include <math.h>
#include <string.h>

#ifdef TS_HAVE_CUDA
#include "src/core/device.h"
#include "src/optim/cuda/optim_cuda.h"

/* the partial sums of ts_cuo_sumsq live in the arena's device scratch */
_Static_assert(TS_CUO_SUMSQ_PARTS * sizeof(double) <= TS_ARENA_DEV_SCRATCH * sizeof(float),
               "the arena's device scratch holds the optimizer's partial sums");

/* the engine's compute stream (the layers' results are ordered on it) */
static void *dev_stream(void)
{
    const ts_device *d = ts_device_current();
    return d ? d->compute : NULL;
}
#endif

const ts_cfg_key ts_optim_config_keys[] = {
    {"train.optimizer", TS_CFG_ENUM, "sgd", "sgd|adamw", "optimizer"},
    {"train.lr", TS_CFG_FLOAT, "0.01", "0:", "peak learning rate"},
    {"train.momentum", TS_CFG_FLOAT, "0.9", "0:1", "SGD momentum (0: plain SGD)"},
    {"train.nesterov", TS_CFG_BOOL, "false", NULL, "SGD: Nesterov momentum"},
    {"train.weight_decay", TS_CFG_FLOAT, "0", "0:", "SGD: L2 term added to the gradient; AdamW: decoupled decay"},
    {"train.beta1", TS_CFG_FLOAT, "0.9", "0:1", "AdamW beta1"},
    {"train.beta2", TS_CFG_FLOAT, "0.999", "0:1", "AdamW beta2"},
    {"train.adam_eps", TS_CFG_FLOAT, "1e-8", "0:", "AdamW epsilon"},
    {"train.schedule", TS_CFG_ENUM, "constant", "constant|cosine|poly", "learning-rate schedule after warm-up"},
    {"train.warmup_steps", TS_CFG_INT, "0", "0:", "linear warm-up steps"},
    {"train.steps", TS_CFG_INT, "1000", "1:", "total optimizer steps (the cosine and poly schedules end there)"},
    {"train.min_lr", TS_CFG_FLOAT, "0", "0:", "cosine schedule: final learning rate"},
    {"train.poly_power", TS_CFG_FLOAT, "0.9", "0:", "poly schedule: exponent"},
    {"train.clip_norm", TS_CFG_FLOAT, "0", "0:", "clip gradients to this global L2 norm (0: off)"},
    {NULL, 0, NULL, NULL, NULL},
};

int ts_optim_cfg_from_config(const ts_config *cfg, ts_optim_cfg *o)
{
    const char *s;
    int64_t v;
    memset(o, 0, sizeof *o);
    TS_TRY(ts_config_get_str(cfg, "train.optimizer", &s));
    o->kind = !strcmp(s, "sgd") ? TS_OPT_SGD : TS_OPT_ADAMW;
    TS_TRY(ts_config_get_float(cfg, "train.lr", &o->lr));
    TS_TRY(ts_config_get_float(cfg, "train.momentum", &o->momentum));
    TS_TRY(ts_config_get_bool(cfg, "train.nesterov", &o->nesterov));
    TS_TRY(ts_config_get_float(cfg, "train.weight_decay", &o->weight_decay));
    TS_TRY(ts_config_get_float(cfg, "train.beta1", &o->beta1));
    TS_TRY(ts_config_get_float(cfg, "train.beta2", &o->beta2));
    TS_TRY(ts_config_get_float(cfg, "train.adam_eps", &o->eps));
    TS_TRY(ts_config_get_str(cfg, "train.schedule", &s));
    o->sched = !strcmp(s, "constant") ? TS_SCHED_CONSTANT : !strcmp(s, "cosine") ? TS_SCHED_COSINE : TS_SCHED_POLY;
    TS_TRY(ts_config_get_int(cfg, "train.warmup_steps", &v));
    o->warmup_steps = v;
    TS_TRY(ts_config_get_int(cfg, "train.steps", &v));
    o->total_steps = v;
    TS_TRY(ts_config_get_float(cfg, "train.min_lr", &o->min_lr));
    TS_TRY(ts_config_get_float(cfg, "train.poly_power", &o->poly_power));
    TS_TRY(ts_config_get_float(cfg, "train.clip_norm", &o->clip_norm));
    if (o->kind == TS_OPT_SGD && o->nesterov && o->momentum <= 0)
        return TS_ERR(TS_ERR_CONFIG, "train.nesterov = true (%s) needs train.momentum > 0",
                      ts_config_source(cfg, "train.nesterov"));
    if (o->kind == TS_OPT_ADAMW && (o->beta1 >= 1 || o->beta2 >= 1))
        return TS_ERR(TS_ERR_CONFIG, "train.beta1 and train.beta2 must be below 1 for AdamW");
    if (o->sched != TS_SCHED_CONSTANT && o->warmup_steps >= o->total_steps)
        return TS_ERR(TS_ERR_CONFIG, "train.warmup_steps = %lld (%s) must be below train.steps = %lld for the %s schedule",
                      (long long)o->warmup_steps, ts_config_source(cfg, "train.warmup_steps"), (long long)o->total_steps,
                      o->sched == TS_SCHED_COSINE ? "cosine" : "poly");
    return 0;
}

int ts_optim_state_count(const ts_optim_cfg *o)
{
    return o->kind == TS_OPT_ADAMW ? 2 : o->momentum > 0 ? 1 : 0;
}

double ts_optim_sumsq(const ts_arena *a, size_t lo, size_t hi)
{
    const float *g = a->grads + lo;
    const size_t n = hi - lo, chunk = 1 << 14, nch = (n + chunk - 1) / chunk;
    double total = 0;
    /* fixed-order sum over chunks */
    double part[256];
    for (size_t c0 = 0; c0 < nch; c0 += 256) {
        const size_t c1 = c0 + 256 < nch ? c0 + 256 : nch;
#pragma omp parallel for schedule(static)
        for (size_t c = c0; c < c1; c++) {
            double s = 0;
            for (size_t i = c * chunk; i < n && i < (c + 1) * chunk; i++) s += (double)g[i] * g[i];
            part[c - c0] = s;
        }
        for (size_t c = c0; c < c1; c++) total += part[c - c0];
    }
    return total;
}

int ts_optim_grad_sumsq(const ts_arena *a, size_t lo, size_t hi, double *out)
{
    if (!a->dev_master) {
        *out = ts_optim_sumsq(a, lo, hi);
        return 0;
    }
#ifdef TS_HAVE_CUDA
    double part[TS_CUO_SUMSQ_PARTS];
    ts_tensor h = ts_tensor_view(part, TS_FLOAT64, 1, (const int64_t[]){TS_CUO_SUMSQ_PARTS});
    ts_tensor d = ts_tensor_view(a->dev_scratch, TS_FLOAT64, 1, (const int64_t[]){TS_CUO_SUMSQ_PARTS});
    d.device = 1;
    TS_TRY(ts_cuo_sumsq(a->dev_grads + lo, hi - lo, (double *)a->dev_scratch, dev_stream()));
    TS_TRY(ts_tensor_transfer(&h, &d));
    double t = 0;
    for (int b = 0; b < TS_CUO_SUMSQ_PARTS; b++) t += part[b];
    *out = t;
    return 0;
#else
    return TS_ERR(TS_ERR_INTERNAL, "optimizer: a state on the GPU in a build without CUDA");
#endif
}

int ts_optim_scale_grads(ts_arena *a, size_t lo, size_t hi, float f)
{
    if (a->dev_master) {
#ifdef TS_HAVE_CUDA
        return ts_cuo_scale(a->dev_grads + lo, hi - lo, f, dev_stream());
#else
        return TS_ERR(TS_ERR_INTERNAL, "optimizer: a state on the GPU in a build without CUDA");
#endif
    }
    float *g = a->grads;
#pragma omp parallel for schedule(static)
    for (size_t i = lo; i < hi; i++) g[i] *= f;
    return 0;
}

/* scales grads [lo, hi) to max_norm when the norm nrm exceeds it */
static int clip_range(ts_arena *a, size_t lo, size_t hi, double max_norm, double nrm)
{
    if (!isfinite(nrm)) return TS_ERR(TS_ERR_NUMERIC, "gradient norm is %g (NaN or Inf in the gradients)", nrm);
    if (max_norm > 0) {
        const double coef = max_norm / (nrm + 1e-6);
        if (coef < 1) return ts_optim_scale_grads(a, lo, hi, (float)coef);
    }
    return 0;
}

int ts_optim_clip(ts_arena *a, double max_norm, double *norm)
{
    double sq;
    TS_TRY(ts_optim_grad_sumsq(a, 0, a->nparam, &sq));
    const double nrm = sqrt(sq);
    if (norm) *norm = nrm;
    return clip_range(a, 0, a->nparam, max_norm, nrm);
}

/* the update of the floats [lo, lo + n) of the parameter region, with their
 * optimizer state at [soff, soff + n) of each state region: on the host, or
 * on the GPU where the state is (ts_arena_device_master) */
static int update(const ts_optim *opt, ts_arena *a, size_t lo, size_t n, size_t soff, double lr)
{
    const ts_optim_cfg *c = &opt->cfg;
    if (a->dev_master) {
#ifdef TS_HAVE_CUDA
        if (c->kind == TS_OPT_SGD)
            return ts_cuo_sgd(a->dev_params + lo, a->dev_grads + lo, c->momentum > 0 ? a->dev_state[0] + soff : NULL, n,
                              (float)lr, (float)c->momentum, (float)c->weight_decay, c->nesterov, dev_stream());
        const double t = (double)(opt->step + 1), bc1 = 1.0 - pow(c->beta1, t), bc2 = 1.0 - pow(c->beta2, t);
        return ts_cuo_adamw(a->dev_params + lo, a->dev_grads + lo, a->dev_state[0] + soff, a->dev_state[1] + soff, n,
                            (float)(lr / bc1), (float)(1.0 / sqrt(bc2)), (float)(1.0 - lr * c->weight_decay),
                            (float)c->beta1, (float)c->beta2, (float)c->eps, dev_stream());
#else
        return TS_ERR(TS_ERR_INTERNAL, "optimizer: a state on the GPU in a build without CUDA");
#endif
    }
    if (c->kind == TS_OPT_SGD)
        ts_sgd_update(a->params + lo, a->grads + lo, c->momentum > 0 ? a->state[0] + soff : NULL, n, lr, c->momentum,
                      c->weight_decay, c->nesterov);
    else
        ts_adamw_update(a->params + lo, a->grads + lo, a->state[0] + soff, a->state[1] + soff, n, lr, c->beta1,
                        c->beta2, c->eps, c->weight_decay, opt->step + 1);
    return 0;
}

int ts_optim_step_range(ts_optim *opt, ts_arena *a, size_t lo, size_t hi, double global_norm, double *lr_out,
                        double *norm_out)
{
    const ts_optim_cfg *c = &opt->cfg;
    const double lr = ts_optim_lr(c, opt->step);
    if (a->nstate < ts_optim_state_count(c))
        return TS_ERR(TS_ERR_INTERNAL, "optimizer needs %d state regions, the arena has %d", ts_optim_state_count(c), a->nstate);
    if (lo > hi || hi > a->nparam) return TS_ERR(TS_ERR_ARG, "optimizer range [%zu, %zu) of %zu", lo, hi, a->nparam);
    if (c->clip_norm > 0 || norm_out) {
        double nrm = global_norm;
        if (nrm < 0) {
            TS_TRY(ts_optim_grad_sumsq(a, lo, hi, &nrm));
            nrm = sqrt(nrm);
        }
        TS_TRY(clip_range(a, lo, hi, c->clip_norm, nrm));
        if (norm_out) *norm_out = nrm;
    }
    if (a->nstate_floats != a->nparam)
        return TS_ERR(TS_ERR_INTERNAL, "optimizer: the arena's state is a shard (ts_optim_step_pieces)");
    TS_TRY(update(opt, a, lo, hi - lo, lo, lr));
    opt->step++;
    if (lr_out) *lr_out = lr;
    return 0;
}

int ts_optim_step_pieces(ts_optim *opt, ts_arena *a, int npieces, const size_t *lo, const size_t *len,
                         double global_norm, double *lr_out)
{
    const ts_optim_cfg *c = &opt->cfg;
    const double lr = ts_optim_lr(c, opt->step);
    size_t total = 0;
    if (a->nstate < ts_optim_state_count(c))
        return TS_ERR(TS_ERR_INTERNAL, "optimizer needs %d state regions, the arena has %d", ts_optim_state_count(c), a->nstate);
    for (int k = 0; k < npieces; k++) {
        if (lo[k] + len[k] > a->nparam) return TS_ERR(TS_ERR_ARG, "optimizer piece [%zu, %zu) of %zu", lo[k], lo[k] + len[k], a->nparam);
        total += len[k];
    }
    if (a->nstate > 0 && total > a->nstate_floats)
        return TS_ERR(TS_ERR_INTERNAL, "optimizer: %zu floats of pieces, state regions of %zu", total, a->nstate_floats);
    if (c->clip_norm > 0) {
        if (global_norm < 0) return TS_ERR(TS_ERR_INTERNAL, "optimizer: clipping a shard needs the global norm");
        for (int k = 0; k < npieces; k++) TS_TRY(clip_range(a, lo[k], lo[k] + len[k], c->clip_norm, global_norm));
    }
    if (a->dev_master) return TS_ERR(TS_ERR_INTERNAL, "optimizer: a sharded step on a state on the GPU");
    size_t soff = 0;
    for (int k = 0; k < npieces; k++) {
        update(opt, a, lo[k], len[k], soff, lr);
        soff += len[k];
    }
    opt->step++;
    if (lr_out) *lr_out = lr;
    return 0;
}

int ts_optim_step(ts_optim *opt, ts_arena *a, double *lr_out, double *norm_out)
{
    return ts_optim_step_range(opt, a, 0, a->nparam, -1, lr_out, norm_out);
}
