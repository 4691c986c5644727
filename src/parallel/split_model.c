/* The model's split hooks on src/parallel's spatial group; see
 * split_model.h. This file owns the adapters from the U-Net's hook
 * signatures (src/model/unet.h) to ts_spatial's calls and nothing else: it
 * holds no state and sends nothing itself. src/model never includes
 * src/parallel; the edge points from here to the model. */
#include "tsbuild.h"
#include "src/parallel/split_model.h"

#include <string.h>

/* the model's split hooks on src/parallel's spatial group */
static int sp_halo_start(void *ctx, const float *a, int ca, const float *b, int cb, int N, const int64_t dhw[3],
                         const ts_halo *h)
{
    return ts_spatial_halo_start(ctx, a, ca, b, cb, N, dhw, h);
}
static int sp_halo_start_packed(void *ctx, const float *packed, int C, int N, const int64_t dhw[3], const ts_halo *h)
{
    return ts_spatial_halo_start_packed(ctx, packed, C, N, dhw, h);
}
static void sp_halo_progress(void *ctx) { ts_spatial_halo_progress(ctx); }
static int sp_halo_wait(void *ctx) { return ts_spatial_halo_wait(ctx); }
static int sp_reduce(void *ctx, double *buf, int n, int op) { return ts_spatial_reduce(ctx, buf, n, op == TS_SYNC_MAX); }

void ts_spatial_split_model(ts_unet *m, ts_spatial *sp)
{
    if (!sp || ts_spatial_size(sp) == 1) {
        ts_unet_set_split(m, NULL);
        return;
    }
    ts_unet_split u;
    memset(&u, 0, sizeof u);
    ts_spatial_split_dims(sp, u.on);
    for (int d = 0; d < 3; d++)
        for (int side = 0; side < 2; side++) u.nbr[d][side] = ts_spatial_neighbor(sp, d, side);
    u.halo_start = sp_halo_start;
    u.halo_start_packed = sp_halo_start_packed;
    u.send_mask = ts_spatial_send_mask(sp);
    u.halo_progress = sp_halo_progress;
    u.halo_wait = sp_halo_wait;
    u.reduce = sp_reduce;
    u.ctx = sp;
    ts_unet_set_split(m, &u);
}
