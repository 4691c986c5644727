/* Learning-rate schedules: linear warm-up, then constant, cosine or poly.
 * The rate of a step as a function of ts_optim_cfg; reads no key (optim.c
 * does), no state. */
#include "tsbuild.h"
#include "src/optim/optim.h"

#include <math.h>

double ts_optim_lr(const ts_optim_cfg *o, int64_t step)
{
    if (step < o->warmup_steps) return o->lr * (double)(step + 1) / (double)o->warmup_steps;
    if (o->sched == TS_SCHED_CONSTANT) return o->lr;
    const double span = (double)(o->total_steps - o->warmup_steps);
    double t = span > 0 ? (double)(step - o->warmup_steps) / span : 1.0;
    if (t > 1) t = 1;
    if (o->sched == TS_SCHED_COSINE) return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(M_PI * t));
    return o->lr * pow(1.0 - t, o->poly_power);
}
