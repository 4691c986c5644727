/* The UNet3D on a GPU (train.engine, docs/gpu.md): which engine a run
 * takes, and what the model does around the layers when it runs on the
 * device: its checks of what the device path supports, the host staging of
 * the image, labels and logits. The layers themselves dispatch on their
 * tensors (src/nn/cuda); the parameter mirror is the arena's
 * (src/model/arena.c). No MPI. */
#include "tsbuild.h"
#include "src/model/unet_impl.h"
#include "src/core/device.h"

#include <stdio.h>
#include <string.h>

const char *ts_unet_engine_name(ts_engine e)
{
    return e == TS_ENGINE_CUDA ? "cuda" : e == TS_ENGINE_CPU ? "cpu" : "auto";
}

int ts_unet_engine_choose(ts_unet_cfg *u, int local_rank, char *note, size_t n)
{
    if (n) note[0] = 0;
    if (u->engine == TS_ENGINE_CPU) return 0;
    if (ts_device_count() == 0) { /* every architecture and layout runs on a GPU (the residual encoder on a split since
                                   * 2026-12-07): only the GPU's absence keeps a run on the CPU */
        if (u->engine == TS_ENGINE_CUDA)
            return TS_ERR(TS_ERR_CONFIG, "train.engine = cuda: %s", ts_device_absent_reason());
        u->engine = TS_ENGINE_CPU;
        return 0;
    }
    const ts_device *d = NULL;
    TS_TRY(TS_CTX(ts_device_open(local_rank, &d), "train.engine = %s", ts_unet_engine_name(u->engine)));
    if (n) snprintf(note, n, "train.engine = %s: cuda on GPU %d", ts_unet_engine_name(u->engine), d->id);
    u->engine = TS_ENGINE_CUDA;
    return 0;
}

int ts_unet_device_input(ts_unet *m, slot *s, const ts_tensor *image)
{
    TS_TRY(ts_device_upload_wait()); /* the last step's copies have read the staging buffers */
    TS_TRY(ts_tensor_to_channels_last(image, &m->hx)); /* hx is shaped as s->x */
    return ts_tensor_upload_async(&s->x, &m->hx); /* the layers' kernels queue behind it */
}

const ts_tensor *ts_unet_device_logits(ts_unet *m, int k)
{
    if (ts_tensor_transfer(&m->hlogits, &m->slots[k].logits)) return NULL;
    return &m->hlogits;
}
