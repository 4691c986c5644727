/* `tessera model run` as a call: one forward of a config's UNet3D
 * (optionally with the loss, a backward and one optimizer step) on tensors
 * read from an HDF5 file, the results written to another, so that tessera
 * can be compared with another implementation (PyTorch) on the same weights
 * and inputs. Internal to the library (not installed). */
#ifndef TS_INFER_MODEL_RUN_H
#define TS_INFER_MODEL_RUN_H

#include "src/core/config.h"

typedef struct ts_model_run_opts {
    const char *weights; /* weights file (docs/formats-weights.md) */
    const char *input;   /* HDF5: /image [N, C, D, H, W] float32, optional /label [N, D, H, W] uint8 */
    const char *output;  /* HDF5 written: /logits [N, K, D, H, W], /loss with a label; with train_step /grads/<name>
                            and /params/<name> after the step */
    int eval;            /* the forward in evaluation mode (norm running statistics) */
    int train_step;      /* backward and one optimizer step (needs /label; not with eval) */
} ts_model_run_opts;

/* Local. Runs o on the model of cfg (borrowed). *have_loss = 1 and *loss
 * set when the input holds a label. Errors name the file and the dataset. */
int ts_model_run_file(const ts_config *cfg, const ts_model_run_opts *o, double *loss, int *have_loss);

#endif
