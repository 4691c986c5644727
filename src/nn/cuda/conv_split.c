/* A spatial split's convolutions on device tensors (layers.h's
 * ts_conv3d_*_split when their tensors are on the GPU) and the packing of
 * a box's halo for the exchange. The CPU's split kernels read the halo's
 * faces where they lie; here the box and the faces (host memory, where the
 * exchange unpacked them; copied up) become one padded tensor
 * [N][D+2][H+2][W+2][C] (halo_kernels.cu), and cuDNN convolves it with
 * padding 0, which is the box's share of the whole volume's convolution:
 * the output voxels of the box, the weight gradient summed over them. The
 * input gradient of the box gathers the output gradient over each voxel's
 * neighbourhood, the neighbours' part from the output gradient's halo: the
 * output gradient padded the same way is the output gradient of a
 * convolution of the padded box with padding 1, whose input gradient's
 * interior is the box's (cropped; split for a concatenation). No overlap
 * of the interior with the exchange yet: the forward's INTERIOR part does
 * nothing, its BORDER part all of it. Owns no exchange (src/parallel) and
 * no kernel (halo_kernels.cu). */
#include "tsbuild.h"
#include "src/nn/cuda/cuda_nn.h"
#include "src/nn/layers.h"
#include "src/core/error.h"

#include <cuda_runtime.h>
#include <string.h>

static int dev_f32(const ts_tensor *t, const char *what)
{
    if (t && (!t->device || t->dtype != TS_FLOAT32 || t->ndim != 5))
        return TS_ERR(TS_ERR_ARG, "%s: every tensor of a GPU layer call must be 5-d float32 in device memory", what);
    return 0;
}

/* P (a view of scratch slot's memory) = [a, b] with h's faces around; h NULL: zeros around */
static int padded(const ts_tensor *a, const ts_tensor *b, const ts_halo *h, int slot, ts_tensor *P)
{
    void *stream = NULL;
    TS_TRY(ts_cuda_nn_handles(NULL, NULL, &stream));
    const int ca = (int)a->shape[4], cb = b ? (int)b->shape[4] : 0, N = (int)a->shape[0];
    const int64_t dhw[3] = {a->shape[1], a->shape[2], a->shape[3]};
    if (b)
        for (int i = 0; i < 4; i++)
            if (b->shape[i] != a->shape[i])
                return TS_ERR(TS_ERR_ARG, "conv3d split over a concatenation: inputs differ before the channels");
    const float *faces[3][2] = {{NULL, NULL}, {NULL, NULL}, {NULL, NULL}};
    static const int off[3] = {0, 0, 0};
    const int *on = h ? h->on : off;
    if (h) { /* the faces up, one after another in the halo slot */
        size_t total = 0;
        for (int d = 0; d < 3; d++)
            for (int s = 0; s < 2; s++)
                if (s ? h->hi[d] : h->lo[d]) total += (size_t)ts_halo_face_floats(dhw, on, d, N, ca + cb);
        float *dev = NULL;
        if (total) TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_HALO, total * sizeof(float), (void **)&dev));
        for (int d = 0; d < 3; d++)
            for (int s = 0; s < 2; s++) {
                const float *f = s ? h->hi[d] : h->lo[d];
                if (!f) continue;
                const size_t n = (size_t)ts_halo_face_floats(dhw, on, d, N, ca + cb);
                /* from pageable memory the call returns once f has been read (the next exchange may refill it) */
                cudaError_t e = cudaMemcpyAsync(dev, f, n * sizeof(float), cudaMemcpyHostToDevice, (cudaStream_t)stream);
                if (e != cudaSuccess)
                    return TS_ERR(TS_ERR_CUDA, "copying a halo face (%zu floats) to the GPU: %s", n, cudaGetErrorString(e));
                faces[d][s] = dev;
                dev += n;
            }
    }
    const int64_t sh[5] = {N, dhw[0] + 2, dhw[1] + 2, dhw[2] + 2, ca + cb};
    *P = ts_tensor_view(NULL, TS_FLOAT32, 5, sh);
    P->device = 1;
    TS_TRY(ts_cuda_scratch(slot, ts_tensor_bytes(P), &P->data));
    return ts_cuk_halo_pad(a->data, ca, b ? b->data : NULL, cb, faces, on, N, dhw, P->data, stream);
}

int ts_cuda_conv3d_forward_split(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_tensor *bias,
                                 const ts_conv_split *s, ts_tensor *y)
{
    TS_TRY(dev_f32(a, "conv3d split forward"));
    TS_TRY(dev_f32(b, "conv3d split forward"));
    if (s && s->ep) return TS_ERR(TS_ERR_UNSUPPORTED, "conv3d split forward on the GPU: no epilogue");
    if (s && (s->part < TS_CONV_ALL || s->part > TS_CONV_BORDER))
        return TS_ERR(TS_ERR_ARG, "conv3d split forward: part %d (ALL, INTERIOR or BORDER)", (int)s->part);
    if (s && s->part == TS_CONV_INTERIOR) return 0; /* all of it with the border, once the halo is there */
    ts_tensor P;
    TS_TRY(padded(a, b, s ? s->halo : NULL, TS_CUDA_SLOT_CAT, &P));
    return ts_cuda_conv3d_forward(&P, w, bias, 1, 0, y);
}

int ts_cuda_conv3d_backward_split(const ts_tensor *a, const ts_tensor *b, const ts_tensor *w, const ts_conv_split *xs,
                                  const ts_conv_split *dys, const ts_tensor *dy, ts_tensor *da, ts_tensor *db,
                                  ts_tensor *dw, ts_tensor *dbias)
{
    TS_TRY(dev_f32(a, "conv3d split backward"));
    TS_TRY(dev_f32(b, "conv3d split backward"));
    TS_TRY(dev_f32(dy, "conv3d split backward"));
    TS_TRY(dev_f32(da, "conv3d split backward"));
    TS_TRY(dev_f32(db, "conv3d split backward"));
    for (int i = 0; i < 5; i++)
        if ((da && da->shape[i] != a->shape[i]) || (db && b && db->shape[i] != b->shape[i]))
            return TS_ERR(TS_ERR_ARG, "conv3d split backward: an input gradient is not shaped like its input");
    if (db && !b) return TS_ERR(TS_ERR_ARG, "conv3d split backward: a second input gradient without a second input");
    if (dw || dbias) { /* the box's share: its outputs over the padded input */
        ts_tensor P;
        TS_TRY(padded(a, b, xs ? xs->halo : NULL, TS_CUDA_SLOT_CAT, &P));
        TS_TRY(ts_cuda_conv3d_backward(&P, w, 1, 0, dy, NULL, dw, dbias));
    }
    if (!da && !db) return 0;
    ts_tensor Q, dX;
    TS_TRY(padded(dy, NULL, dys ? dys->halo : NULL, TS_CUDA_SLOT_CAT2, &Q));
    const int ca = (int)a->shape[4], cb = b ? (int)b->shape[4] : 0;
    const int64_t dhw[3] = {a->shape[1], a->shape[2], a->shape[3]};
    const int64_t sh[5] = {a->shape[0], dhw[0] + 2, dhw[1] + 2, dhw[2] + 2, ca + cb};
    dX = ts_tensor_view(NULL, TS_FLOAT32, 5, sh);
    dX.device = 1;
    TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_SPLIT, ts_tensor_bytes(&dX), &dX.data));
    /* the padded box convolved with padding 1 has Q as its output gradient: dX is its input gradient (x = dX
     * gives the shapes only; its values are not read without a weight gradient) */
    TS_TRY(ts_cuda_conv3d_backward(&dX, w, 1, 1, &Q, &dX, NULL, NULL));
    void *stream = NULL;
    TS_TRY(ts_cuda_nn_handles(NULL, NULL, &stream));
    return ts_cuk_halo_crop(dX.data, ca, cb, (int)a->shape[0], dhw, da ? da->data : NULL, db ? db->data : NULL, stream);
}

/* A 3x3x3, stride 2, padding 1 convolution of a box (even edges at even
 * offsets, as the split requires): output voxel o reads the box's voxels
 * 2o-1 .. 2o+1, which are the padded box's 2o .. 2o+2, so the padded box
 * convolved with padding 0 gives the box's outputs (its last plane, the
 * high face, is never read). The input gradient: the output gradient padded
 * with its halo (its voxel q is output q-1; q = 0 reads only the padded
 * box's plane 0, cropped away; q = D/2+1 is the next box's first output,
 * which reads the box's last voxel) is the output gradient of the padded
 * box convolved with padding 2: its output q reads padded voxels 2q-2 ..
 * 2q, box voxels 2q-3 .. 2q-1, which output q-1 reads; the box is the
 * input gradient's interior. */
static int s2_geom(const ts_tensor *x, const char *what)
{
    for (int d = 1; d < 4; d++)
        if (x->shape[d] % 2)
            return TS_ERR(TS_ERR_ARG, "%s: the box's %s edge is %lld voxels; a stride-2 split needs even edges", what,
                          d == 1 ? "D" : d == 2 ? "H" : "W", (long long)x->shape[d]);
    return 0;
}

int ts_cuda_conv3d_s2_forward_split(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b, const ts_halo *h,
                                    ts_tensor *y)
{
    TS_TRY(dev_f32(x, "conv3d stride-2 split forward"));
    TS_TRY(s2_geom(x, "conv3d stride-2 split forward"));
    ts_tensor P;
    TS_TRY(padded(x, NULL, h, TS_CUDA_SLOT_CAT, &P));
    return ts_cuda_conv3d_forward(&P, w, b, 2, 0, y);
}

int ts_cuda_conv3d_s2_backward_split(const ts_tensor *x, const ts_tensor *w, const ts_halo *xh, const ts_halo *dyh,
                                     const ts_tensor *dy, ts_tensor *dx, ts_tensor *dw, ts_tensor *db)
{
    TS_TRY(dev_f32(x, "conv3d stride-2 split backward"));
    TS_TRY(dev_f32(dy, "conv3d stride-2 split backward"));
    TS_TRY(dev_f32(dx, "conv3d stride-2 split backward"));
    TS_TRY(s2_geom(x, "conv3d stride-2 split backward"));
    if (dx && !ts_tensor_same_shape(dx, x))
        return TS_ERR(TS_ERR_ARG, "conv3d stride-2 split backward: the input gradient is not shaped like the input");
    if (dw || db) {
        ts_tensor P;
        TS_TRY(padded(x, NULL, xh, TS_CUDA_SLOT_CAT, &P));
        TS_TRY(ts_cuda_conv3d_backward(&P, w, 2, 0, dy, NULL, dw, db));
    }
    if (!dx) return 0;
    ts_tensor Q;
    TS_TRY(padded(dy, NULL, dyh, TS_CUDA_SLOT_CAT2, &Q));
    const int64_t dhw[3] = {x->shape[1], x->shape[2], x->shape[3]};
    const int64_t sh[5] = {x->shape[0], dhw[0] + 2, dhw[1] + 2, dhw[2] + 2, x->shape[4]};
    ts_tensor dX = ts_tensor_view(NULL, TS_FLOAT32, 5, sh);
    dX.device = 1;
    TS_TRY(ts_cuda_scratch(TS_CUDA_SLOT_SPLIT, ts_tensor_bytes(&dX), &dX.data));
    TS_TRY(ts_cuda_conv3d_backward(&dX, w, 2, 2, &Q, &dX, NULL, NULL)); /* dX's values are not read (no dw) */
    void *stream = NULL;
    TS_TRY(ts_cuda_nn_handles(NULL, NULL, &stream));
    return ts_cuk_halo_crop(dX.data, (int)x->shape[4], 0, (int)x->shape[0], dhw, dx->data, NULL, stream);
}

int ts_cuda_halo_pack(const ts_tensor *a, const ts_tensor *b, unsigned mask, ts_tensor *dst)
{
    TS_TRY(dev_f32(a, "halo pack"));
    TS_TRY(dev_f32(b, "halo pack"));
    if (!dst->device || dst->dtype != TS_FLOAT32) return TS_ERR(TS_ERR_ARG, "halo pack: the destination must be on the GPU");
    const int ca = (int)a->shape[4], cb = b ? (int)b->shape[4] : 0;
    const int64_t dhw[3] = {a->shape[1], a->shape[2], a->shape[3]};
    if (ts_tensor_numel(dst) < ts_halo_send_floats(dhw, mask, a->shape[0], ca + cb))
        return TS_ERR(TS_ERR_ARG, "halo pack: the destination holds %lld floats of %lld", (long long)ts_tensor_numel(dst),
                      (long long)ts_halo_send_floats(dhw, mask, a->shape[0], ca + cb));
    void *stream = NULL;
    TS_TRY(ts_cuda_nn_handles(NULL, NULL, &stream));
    return ts_cuk_halo_pack(a->data, ca, b ? b->data : NULL, cb, (int)a->shape[0], dhw, mask, dst->data, stream);
}
