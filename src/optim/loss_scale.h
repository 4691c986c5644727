/* Dynamic loss scaling for train.precision = fp16 (docs/training.md, "Mixed
 * precision"): the loss gradient is multiplied by a scale S so that small
 * gradients survive fp16's range, the reduced gradients are divided by S
 * before clipping and the optimizer; a step whose gradients overflowed
 * (non-finite on some rank, agreed by the caller) is skipped and S halves;
 * after train.loss_scale_growth_interval good steps in a row S doubles.
 * fp32 and bf16 keep S = 1 (bf16 has fp32's range). All calls are local. */
#ifndef TS_OPTIM_LOSS_SCALE_H
#define TS_OPTIM_LOSS_SCALE_H

#include <stdint.h>

#include "src/core/config.h"
#include "src/nn/layers.h"

typedef struct ts_loss_scaler {
    int dynamic;       /* 1: fp16, the scale moves; 0: S = 1 always */
    double scale;      /* S, a power of two times train.loss_scale; >= 1 */
    int64_t interval;  /* good steps in a row before S doubles */
    int64_t good;      /* good steps since S last changed */
    int64_t overflows; /* steps skipped for an overflow (this run) */
} ts_loss_scaler;

/* train.loss_scale, train.loss_scale_growth_interval (NULL-terminated). */
extern const ts_cfg_key ts_loss_scale_config_keys[];

/* Local. The scaler for precision p from the config: dynamic with the
 * initial scale for fp16; S = 1 otherwise, where a loss-scale key set in the
 * config is an error naming it (bf16 and fp32 need no scaling). */
int ts_loss_scaler_from_config(const ts_config *cfg, ts_precision p, ts_loss_scaler *ls);

/* Local. After a step of a dynamic scaler whose gradients were finite
 * (overflow 0: one more good step; S doubles after `interval`) or not
 * (overflow 1: S halves, the caller skips the step). Returns 1 when an
 * overflow came at S = 1 (S cannot fall further: the gradients are
 * non-finite without any scaling, a bad step for fault.max_bad_steps), else 0. */
int ts_loss_scaler_update(ts_loss_scaler *ls, int overflow);

#endif
