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

/* why the GPU engine does not run this layout ("" when it does): both
 * architectures, pipeline stages and spatial splits run there (since
 * 2026-12-06), but not the residual encoder on a split (its stride-2
 * convolutions read their halo through host code) */
static const char *unsupported(const ts_unet_cfg *u, int sp)
{
    return sp > 1 && u->arch != TS_ARCH_UNET
               ? "model.arch = resenc with a spatial split (parallel.sp > 1) runs on the CPU only so far"
               : "";
}

int ts_unet_engine_choose(ts_unet_cfg *u, int local_rank, int pp, int sp, char *note, size_t n)
{
    if (n) note[0] = 0;
    if (u->engine == TS_ENGINE_CPU) return 0;
    (void)pp;
    const char *why = ts_device_count() > 0 ? unsupported(u, sp) : ts_device_absent_reason();
    if (why[0]) {
        if (u->engine == TS_ENGINE_CUDA) return TS_ERR(TS_ERR_CONFIG, "train.engine = cuda: %s", why);
        u->engine = TS_ENGINE_CPU;
        if (n && ts_device_count() > 0) snprintf(note, n, "train.engine = auto: cpu (%s)", why); /* a GPU left idle */
        return 0;
    }
    const ts_device *d = NULL;
    TS_TRY(TS_CTX(ts_device_open(local_rank, &d), "train.engine = %s", ts_unet_engine_name(u->engine)));
    if (n) snprintf(note, n, "train.engine = %s: cuda on GPU %d", ts_unet_engine_name(u->engine), d->id);
    u->engine = TS_ENGINE_CUDA;
    return 0;
}

int ts_unet_device_check(const ts_unet *m)
{
    if (!m->device || !m->split_on || m->cfg.arch == TS_ARCH_UNET) return 0;
    return TS_ERR(TS_ERR_UNSUPPORTED, "unet on the GPU: the residual encoder on a spatial split runs on the CPU only so "
                  "far (train.engine = cpu runs it)");
}

int ts_unet_device_input(ts_unet *m, slot *s, const ts_tensor *image)
{
    TS_TRY(ts_tensor_to_channels_last(image, &m->hx)); /* hx is shaped as s->x */
    return ts_tensor_transfer(&s->x, &m->hx);
}

const ts_tensor *ts_unet_device_logits(ts_unet *m, int k)
{
    if (ts_tensor_transfer(&m->hlogits, &m->slots[k].logits)) return NULL;
    return &m->hlogits;
}
