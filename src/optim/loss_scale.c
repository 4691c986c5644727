/* Dynamic loss scaling for fp16; see loss_scale.h. Owns the
 * train.loss_scale* keys and the rule (halve on an overflow, double after
 * the growth interval). It does not detect an overflow: the trainer agrees
 * on one over the ranks and reports it. */
#include "tsbuild.h"
#include "src/optim/loss_scale.h"
#include "src/core/error.h"

#include <string.h>

const ts_cfg_key ts_loss_scale_config_keys[] = {
    {"train.loss_scale", TS_CFG_FLOAT, "65536", "1:1e30", "train.precision = fp16: initial loss scale (dynamic: "
     "halved on an overflow, doubled after train.loss_scale_growth_interval good steps)"},
    {"train.loss_scale_growth_interval", TS_CFG_INT, "2000", "1:", "train.precision = fp16: good steps in a row "
     "before the loss scale doubles"},
    {NULL, 0, NULL, NULL, NULL},
};

int ts_loss_scaler_from_config(const ts_config *cfg, ts_precision p, ts_loss_scaler *ls)
{
    memset(ls, 0, sizeof *ls);
    ls->scale = 1.0;
    ls->interval = 1;
    if (p != TS_PREC_FP16) { /* a value other than the default is a mistake (a resolved config.ini repeats defaults) */
        double v;
        int64_t n;
        TS_TRY(ts_config_get_float(cfg, "train.loss_scale", &v));
        TS_TRY(ts_config_get_int(cfg, "train.loss_scale_growth_interval", &n));
        const char *key = v != 65536.0 ? "train.loss_scale" : n != 2000 ? "train.loss_scale_growth_interval" : NULL;
        if (key)
            return TS_ERR(TS_ERR_CONFIG, "%s (%s) applies to train.precision = fp16 only (fp32 and bf16 have fp32's "
                          "range and need no loss scaling)", key, ts_config_source(cfg, key));
        return 0;
    }
    ls->dynamic = 1;
    TS_TRY(ts_config_get_float(cfg, "train.loss_scale", &ls->scale));
    TS_TRY(ts_config_get_int(cfg, "train.loss_scale_growth_interval", &ls->interval));
    return 0;
}

int ts_loss_scaler_update(ts_loss_scaler *ls, int overflow)
{
    if (!ls->dynamic) return overflow;
    if (!overflow) {
        if (++ls->good >= ls->interval && ls->scale * 2 <= 1e30) {
            ls->scale *= 2;
            ls->good = 0;
        }
        return 0;
    }
    ls->good = 0;
    if (ls->scale <= 1.0) return 1;
    ls->overflows++;
    ls->scale = ls->scale / 2 < 1.0 ? 1.0 : ls->scale / 2;
    return 0;
}
