// The spatial split's halos on the GPU (src/nn/cuda/conv_split.c, the GPU
// engine's exchange in src/model): the box's layers that its neighbours
// need, packed for the message (the order and layout of
// ts_halo_send_floats, layers.h); the box with its halo as one padded
// tensor [N][D+2][H+2][W+2][C] for a convolution with padding 0 (the
// layouts of ts_halo: a face voxel outside the halo's rows and columns,
// or a face that is not there, reads as zero); and the interior of such a
// tensor cropped back, split into a concatenation's two parts. Layout
// kernels: every value is copied, none computed. Launchers only (declared
// in src/nn/cuda/cuda_nn.h). No cuDNN, cuBLAS, MPI or NCCL here.
#include <cuda_runtime.h>
#include <stdint.h>

#define TS_ERROR_NO_MPI 1
extern "C" {
#include "src/core/error.h"
#include "src/nn/cuda/cuda_nn.h"
}
#include "src/core/cuda_launch.h"

// the box's layer [z0, z0 + nz) x [y0, y0 + ny) x [x0, x0 + nx) of [a, b] into dst, n, z, y, x, then the channels
__global__ void halo_pack_k(const float *a, int ca, const float *b, int cb, int N, int D, int H, int W, int z0, int nz,
                            int y0, int ny, int x0, int nx, float *dst)
{
    const int C = ca + cb;
    const size_t n_all = (size_t)N * nz * ny * nx * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_all; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C);
        size_t v = i / C;
        const int x = x0 + (int)(v % nx);
        v /= nx;
        const int y = y0 + (int)(v % ny);
        v /= ny;
        const int z = z0 + (int)(v % nz);
        const size_t n = v / nz, src = ((n * D + z) * H + y) * W + x;
        dst[i] = c < ca ? a[src * ca + c] : b[src * cb + (c - ca)];
    }
}

// P [N][D+2][H+2][W+2][C]: the box [a, b] inside, its halo's faces around (f: lo and hi of D, H, W; NULL: zeros)
__global__ void halo_pad_k(const float *a, int ca, const float *b, int cb, const float *f0l, const float *f0h,
                           const float *f1l, const float *f1h, const float *f2l, const float *f2h, int e1, int e2, int N,
                           int D, int H, int W, float *P)
{
    const int C = ca + cb;
    const size_t n_all = (size_t)N * (D + 2) * (H + 2) * (W + 2) * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_all; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C);
        size_t v = i / C;
        const int iw = (int)(v % (W + 2)) - 1;
        v /= W + 2;
        const int ih = (int)(v % (H + 2)) - 1;
        v /= H + 2;
        const int id = (int)(v % (D + 2)) - 1;
        const size_t n = v / (D + 2);
        float val = 0.0f;
        if (id >= 0 && id < D && ih >= 0 && ih < H && iw >= 0 && iw < W) {
            const size_t s = ((n * D + id) * H + ih) * W + iw;
            val = c < ca ? a[s * ca + c] : b[s * cb + (c - ca)];
        } else if (id < 0 || id >= D) { // a D face: [N][H + 2 e1][W + 2 e2][C]
            const float *f = id < 0 ? f0l : f0h;
            if (f && ih >= -e1 && ih < H + e1 && iw >= -e2 && iw < W + e2)
                val = f[((n * (H + 2 * e1) + (ih + e1)) * (W + 2 * e2) + (iw + e2)) * C + c];
        } else if (ih < 0 || ih >= H) { // an H face: [N][D][W + 2 e2][C]
            const float *f = ih < 0 ? f1l : f1h;
            if (f && iw >= -e2 && iw < W + e2) val = f[((n * D + id) * (W + 2 * e2) + (iw + e2)) * C + c];
        } else { // a W face: [N][D][H][C]
            const float *f = iw < 0 ? f2l : f2h;
            if (f) val = f[((n * D + id) * H + ih) * C + c];
        }
        P[i] = val;
    }
}

// a [N][D][H][W][ca] and b (cb channels) = the interior of X [N][D+2][H+2][W+2][ca + cb] (either NULL: not written)
__global__ void halo_crop_k(const float *X, int ca, int cb, int N, int D, int H, int W, float *a, float *b)
{
    const int C = ca + cb;
    const size_t n_all = (size_t)N * D * H * W * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_all; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C);
        size_t v = i / C;
        const int w = (int)(v % W);
        v /= W;
        const int h = (int)(v % H);
        v /= H;
        const int d = (int)(v % D);
        const size_t n = v / D, o = ((n * D + d) * H + h) * W + w;
        const float val = X[(((n * (D + 2) + d + 1) * (H + 2) + h + 1) * (W + 2) + w + 1) * C + c];
        if (c < ca) {
            if (a) a[o * ca + c] = val;
        } else if (b) {
            b[o * cb + (c - ca)] = val;
        }
    }
}

extern "C" int ts_cuk_halo_pack(const float *a, int ca, const float *b, int cb, int N, const int64_t dhw[3],
                                unsigned mask, float *dst, void *stream)
{
    const int D = (int)dhw[0], H = (int)dhw[1], W = (int)dhw[2];
    for (int i = 0; i < 27; i++) {
        if (!(mask >> i & 1u)) continue;
        const int o[3] = {i / 9 - 1, i / 3 % 3 - 1, i % 3 - 1}, n[3] = {D, H, W};
        int lo[3], len[3];
        for (int d = 0; d < 3; d++) { /* the layer sent towards o: all of a dim where o is 0, else its first or last */
            lo[d] = o[d] > 0 ? n[d] - 1 : 0;
            len[d] = o[d] ? 1 : n[d];
        }
        const size_t cnt = (size_t)N * len[0] * len[1] * len[2] * (ca + cb);
        if (!cnt) continue;
        halo_pack_k<<<ts_cu_grid(cnt), 256, 0, (cudaStream_t)stream>>>(a, ca, b, cb, N, D, H, W, lo[0], len[0], lo[1],
                                                                         len[1], lo[2], len[2], dst);
        int err = TS_CU_LAUNCHED("halo pack");
        if (err) return err;
        dst += cnt;
    }
    return 0;
}

extern "C" int ts_cuk_halo_pad(const float *a, int ca, const float *b, int cb, const float *const faces[3][2],
                               const int on[3], int N, const int64_t dhw[3], float *P, void *stream)
{
    const int D = (int)dhw[0], H = (int)dhw[1], W = (int)dhw[2];
    const size_t cnt = (size_t)N * (D + 2) * (H + 2) * (W + 2) * (ca + cb);
    if (!cnt) return 0;
    halo_pad_k<<<ts_cu_grid(cnt), 256, 0, (cudaStream_t)stream>>>(a, ca, b, cb, faces[0][0], faces[0][1], faces[1][0],
                                                                    faces[1][1], faces[2][0], faces[2][1], on[1] ? 1 : 0,
                                                                    on[2] ? 1 : 0, N, D, H, W, P);
    return TS_CU_LAUNCHED("halo pad");
}

extern "C" int ts_cuk_halo_crop(const float *X, int ca, int cb, int N, const int64_t dhw[3], float *a, float *b,
                                void *stream)
{
    const int D = (int)dhw[0], H = (int)dhw[1], W = (int)dhw[2];
    const size_t cnt = (size_t)N * D * H * W * (ca + cb);
    if (!cnt) return 0;
    halo_crop_k<<<ts_cu_grid(cnt), 256, 0, (cudaStream_t)stream>>>(X, ca, cb, N, D, H, W, a, b);
    return TS_CU_LAUNCHED("halo crop");
}
