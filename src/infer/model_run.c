/* `tessera model run` as a call (src/infer/model_run.h). Owns reading the
 * tensors, the one run (forward; optionally loss, backward and one optimizer
 * step) and writing the results; the arithmetic is src/model's, and nothing
 * here splits the model over ranks. */
#include "tsbuild.h"
#include "src/infer/model_run.h"
#include "src/core/error.h"
#include "src/model/unet.h"
#include "src/model/weights.h"
#include "src/optim/optim.h"

#include <hdf5.h>
#include <stdio.h>
#include <string.h>

static int write_grads(hid_t f, const char *path, const ts_arena *a)
{
    hid_t g = H5Gcreate2(f, "/grads", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return TS_ERR(TS_ERR_HDF5, "%s: cannot create /grads", path);
    H5Gclose(g);
    for (int i = 0; i < a->n; i++) {
        if (a->p[i].kind != TS_PARAM) continue;
        char name[TS_PARAM_NAME_MAX + 16];
        snprintf(name, sizeof name, "/grads/%s", a->p[i].name);
        ts_tensor t = ts_arena_grad(a, i);
        TS_TRY(ts_weights_write_dataset(f, path, name, &t));
    }
    return 0;
}

int ts_model_run_file(const ts_config *cfg, const ts_model_run_opts *o, double *loss_out, int *have_loss)
{
    int err = 0;
    ts_unet *m = NULL;
    ts_tensor image = {0}, label = {0}, logits = {0};
    hid_t in = -1, out = -1;
    *have_loss = 0;
    if (o->eval && o->train_step)
        return TS_ERR(TS_ERR_ARG, "model run: --train-step runs the forward in train mode; drop --eval");
    ts_unet_cfg u;
    ts_optim opt = {0};
    TS_CHECK(ts_unet_cfg_from_config(cfg, &u));
    {
        char note[256];
        TS_CHECK(ts_unet_engine_choose(&u, 0, note, sizeof note)); /* one process: the first GPU */
        if (note[0]) fprintf(stderr, "tessera model run: note: %s\n", note);
    }
    TS_CHECK(ts_optim_cfg_from_config(cfg, &opt.cfg));
    TS_CHECK(ts_unet_create(&u, o->train_step ? ts_optim_state_count(&opt.cfg) : 0, &m));
    TS_CHECK(ts_weights_load(ts_unet_arena(m), o->weights));
    TS_CHECK(ts_weights_open(o->input, &in));
    TS_CHECK(ts_weights_read_dataset(in, o->input, "/image", TS_FLOAT32, 5, &image));
    if (image.shape[1] != u.in_channels)
        TS_FAIL(TS_ERR_FORMAT, "%s: /image has %lld channels (dim 1 of [N, C, D, H, W]), model.in_channels is %d", o->input,
                (long long)image.shape[1], u.in_channels);
    {
        char what[1100];
        snprintf(what, sizeof what, "%s: /image", o->input);
        TS_CHECK(ts_unet_check_input(&u, image.shape + 2, what));
    }
    const int have_label = ts_weights_exists(in, "/label");
    if (have_label) {
        TS_CHECK(ts_weights_read_dataset(in, o->input, "/label", TS_UINT8, 4, &label));
        const int64_t want[4] = {image.shape[0], image.shape[2], image.shape[3], image.shape[4]};
        char what[1100];
        snprintf(what, sizeof what, "%s: /label", o->input);
        TS_CHECK(ts_tensor_check_shape(&label, what, 4, want));
    } else if (o->train_step) {
        TS_FAIL(TS_ERR_FORMAT, "%s: --train-step needs /label", o->input);
    }
    TS_CHECK(ts_unet_forward(m, &image, !o->eval));
    double loss = 0;
    if (have_label) TS_CHECK(ts_unet_loss(m, &label, o->train_step, &loss));
    const ts_tensor *lg = ts_unet_logits(m);
    if (!lg) TS_CHECK(ts_err_last()); /* the copy from the GPU failed */
    TS_CHECK(ts_tensor_alloc(&logits, TS_FLOAT32, 5,
                             (const int64_t[]){lg->shape[0], lg->shape[4], lg->shape[1], lg->shape[2], lg->shape[3]}));
    TS_CHECK(ts_tensor_to_channels_first(lg, &logits));
    if (o->train_step) {
        ts_arena_zero_grad(ts_unet_arena(m));
        TS_CHECK(ts_unet_backward(m));
    }
    TS_CHECK(ts_weights_create(o->output, &out));
    TS_CHECK(ts_weights_write_dataset(out, o->output, "/logits", &logits));
    if (have_label) {
        ts_tensor l = ts_tensor_view(&loss, TS_FLOAT64, 0, NULL);
        TS_CHECK(ts_weights_write_dataset(out, o->output, "/loss", &l));
    }
    if (o->train_step) {
        TS_CHECK(write_grads(out, o->output, ts_unet_arena(m)));
        double lr;
        TS_CHECK(ts_optim_step(&opt, ts_unet_arena(m), &lr, NULL));
        TS_CHECK(ts_weights_put(out, o->output, ts_unet_arena(m)));
    }
    *loss_out = loss;
    *have_loss = have_label;
cleanup:
    if (out >= 0 && H5Fclose(out) < 0 && !err) err = TS_ERR(TS_ERR_IO, "%s: closing failed", o->output);
    if (in >= 0) H5Fclose(in);
    ts_tensor_free(&image);
    ts_tensor_free(&label);
    ts_tensor_free(&logits);
    ts_unet_destroy(&m);
    return err;
}
