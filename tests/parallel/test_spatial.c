/* MPI test of the spatial decomposition: the split plan (auto dims, the
 * errors for patches that do not split), and the halo exchange on every
 * Cartesian layout of the job's ranks: each rank holds a box of a global
 * tensor whose values are known, exchanges, and every face slot must hold
 * the global value at its position (bit for bit) or zero outside the
 * volume; for one tensor and for a channel concatenation [a, b], twice in a
 * row, with the progress call in between. */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/parallel/spatial.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int all(int c, MPI_Comm comm)
{
    int r;
    MPI_Allreduce(&c, &r, 1, MPI_INT, MPI_LAND, comm);
    return r;
}

/* the global tensor's value at (n, z, y, x, channel c) */
static float val(int n, int64_t z, int64_t y, int64_t x, int c, int which)
{
    return (float)(sin(1.0 + n * 0.7 + z * 0.31 + y * 0.173 + x * 0.0917 + c * 1.3 + which * 2.9) * 1000.0);
}

/* expected value of a face slot at global position g (zero outside) */
static float expect(const int64_t gdim[3], int n, const int64_t g[3], int c, int ca)
{
    for (int d = 0; d < 3; d++)
        if (g[d] < 0 || g[d] >= gdim[d]) return 0.0f;
    return c < ca ? val(n, g[0], g[1], g[2], c, 0) : val(n, g[0], g[1], g[2], c - ca, 1);
}

/* one layout: exchange a box of [a] (cb = 0) or [a, b]; returns the number of wrong slots */
static long check_layout(const int dims[3], int N, const int64_t box[3], int ca, int cb, int reps, long *slots)
{
    ts_spatial *s = NULL;
    long wrong = 0;
    if (ts_spatial_create(MPI_COMM_WORLD, dims, &s)) return -1;
    int64_t gdim[3], lo[3], sz[3];
    for (int d = 0; d < 3; d++) gdim[d] = box[d] * dims[d];
    ts_spatial_box(s, gdim, lo, sz);
    const int C = ca + cb;
    const int64_t nv = box[0] * box[1] * box[2];
    float *a = malloc(sizeof(float) * (size_t)(N * nv * ca)), *b = cb ? malloc(sizeof(float) * (size_t)(N * nv * cb)) : NULL;
    for (int n = 0; n < N; n++)
        for (int64_t z = 0; z < box[0]; z++)
            for (int64_t y = 0; y < box[1]; y++)
                for (int64_t x = 0; x < box[2]; x++) {
                    const int64_t v = ((n * box[0] + z) * box[1] + y) * box[2] + x;
                    for (int c = 0; c < ca; c++) a[v * ca + c] = val(n, lo[0] + z, lo[1] + y, lo[2] + x, c, 0);
                    for (int c = 0; c < cb; c++) b[v * cb + c] = val(n, lo[0] + z, lo[1] + y, lo[2] + x, c, 1);
                }
    ts_halo h;
    memset(&h, 0, sizeof h);
    ts_spatial_split_dims(s, h.on);
    for (int d = 0; d < 3; d++)
        for (int side = 0; side < 2; side++)
            if (ts_spatial_neighbor(s, d, side)) {
                float *f = malloc(sizeof(float) * (size_t)ts_halo_face_floats(box, h.on, d, N, C));
                for (int64_t i = 0; i < ts_halo_face_floats(box, h.on, d, N, C); i++) f[i] = NAN; /* must be overwritten */
                if (side) h.hi[d] = f;
                else h.lo[d] = f;
            }
    const int64_t e1 = h.on[1], e2 = h.on[2], D = box[0], H = box[1], W = box[2];
    for (int r = 0; r < reps; r++) {
        if (ts_spatial_halo_start(s, a, ca, b, cb, N, box, &h)) {
            wrong = -1;
            break;
        }
        ts_spatial_halo_progress(s);
        if (ts_spatial_halo_wait(s)) {
            wrong = -1;
            break;
        }
        for (int d = 0; d < 3; d++)
            for (int side = 0; side < 2; side++) {
                const float *f = side ? h.hi[d] : h.lo[d];
                if (!f) continue;
                const int64_t edge = side ? box[d] : -1; /* the halo's position along d, box coordinates */
                int64_t r0 = 0, r1 = 0, q0 = 0, q1 = 0;  /* the face's two other extents, box coordinates */
                if (d == 0) r0 = -e1, r1 = H + e1, q0 = -e2, q1 = W + e2;
                if (d == 1) r0 = 0, r1 = D, q0 = -e2, q1 = W + e2;
                if (d == 2) r0 = 0, r1 = D, q0 = 0, q1 = H;
                for (int n = 0; n < N; n++)
                    for (int64_t i = r0; i < r1; i++)
                        for (int64_t j = q0; j < q1; j++) {
                            int64_t g[3];
                            if (d == 0) g[0] = edge, g[1] = i, g[2] = j;
                            else if (d == 1) g[0] = i, g[1] = edge, g[2] = j;
                            else g[0] = i, g[1] = j, g[2] = edge;
                            for (int k = 0; k < 3; k++) g[k] += lo[k];
                            const float *slot = f + (((int64_t)n * (r1 - r0) + (i - r0)) * (q1 - q0) + (j - q0)) * C;
                            for (int c = 0; c < C; c++) {
                                const float want = expect(gdim, n, g, c, ca);
                                (*slots)++;
                                if (memcmp(&slot[c], &want, sizeof want)) wrong++;
                            }
                        }
            }
    }
    const ts_spatial_stats *st = ts_spatial_get_stats(s);
    int any = 0;
    for (int d = 0; d < 3; d++) any |= h.lo[d] || h.hi[d];
    if (wrong >= 0 && any && (st->bytes == 0 || st->exchanges != reps)) wrong += 1000000;
    for (int d = 0; d < 3; d++) {
        free(h.lo[d]);
        free(h.hi[d]);
    }
    free(a);
    free(b);
    ts_spatial_destroy(&s);
    return wrong;
}

static int plan_fails(int sp, const char *spec, int64_t d, int64_t h, int64_t w, int levels, const char *needle)
{
    int dims[3];
    const int64_t p[3] = {d, h, w};
    int e = ts_spatial_plan(sp, spec, p, levels, dims);
    return e == TS_ERR_CONFIG && strstr(ts_err_message(), needle) != NULL;
}

static int plan_is(int sp, const char *spec, int64_t d, int64_t h, int64_t w, int levels, int a, int b, int c)
{
    int dims[3];
    const int64_t p[3] = {d, h, w};
    return ts_spatial_plan(sp, spec, p, levels, dims) == 0 && dims[0] == a && dims[1] == b && dims[2] == c;
}

int main(int argc, char **argv)
{
    int provided, rank, p;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    ts_err_set_rank(rank);
    ts_tap_quiet = rank != 0;

    /* the plan (local, the same on every rank) */
    ts_ok(plan_is(4, "auto", 32, 32, 32, 4, 4, 1, 1), "plan: sp 4 over 32^3, 4 levels: auto splits depth first (4,1,1)");
    ts_ok(plan_is(4, "auto", 16, 32, 32, 4, 2, 2, 1), "plan: auto moves on to height when depth is used up (2,2,1)");
    ts_ok(plan_is(8, "auto", 16, 16, 16, 4, 2, 2, 2), "plan: sp 8 over 16^3, 4 levels: 2,2,2");
    ts_ok(plan_is(3, "auto", 24, 8, 8, 3, 3, 1, 1), "plan: sp 3 over 24x8x8: 3,1,1");
    ts_ok(plan_is(4, "2,2,1", 32, 32, 32, 4, 2, 2, 1), "plan: explicit 2,2,1");
    ts_ok(plan_is(1, "auto", 32, 32, 32, 4, 1, 1, 1), "plan: sp 1 is 1,1,1");
    ts_ok(plan_fails(4, "3,1,1", 32, 32, 32, 4, "but parallel.sp = 4"),
          "plan: sp_dims whose product is not sp: %s", ts_err_message());
    ts_ok(plan_fails(4, "4,1,1", 30, 32, 32, 2, "does not split evenly over 4"), "plan: a patch that does not split: %s",
          ts_err_message());
    ts_ok(plan_fails(2, "2,1,1", 40, 32, 32, 4, "odd, at level 2"), "plan: a box odd at a level before a pool: %s",
          ts_err_message());
    ts_ok(plan_fails(8, "8,1,1", 32, 32, 32, 4, "smaller than a level's halo"), "plan: a box smaller than the halo: %s",
          ts_err_message());
    ts_ok(plan_fails(4, "2,x,1", 32, 32, 32, 4, "expected 'auto'"), "plan: malformed sp_dims: %s", ts_err_message());
    ts_ok(plan_fails(5, "auto", 32, 32, 32, 4, "found no way to cut"), "plan: auto with no valid split: %s", ts_err_message());

    /* the exchange on every layout of the p ranks */
    const int64_t boxes[2][3] = {{3, 4, 5}, {2, 2, 3}};
    long bad = 0, slots = 0;
    int layouts = 0;
    for (int a = 1; a <= p; a++)
        for (int b = 1; a * b <= p; b++) {
            if (p % (a * b)) continue;
            const int dims[3] = {a, b, p / (a * b)};
            for (int k = 0; k < 2; k++) {
                long w = check_layout(dims, 2, boxes[k], 3, 0, 2, &slots);
                long w2 = check_layout(dims, 1, boxes[k], 2, 3, 1, &slots);
                if (w < 0 || w2 < 0) bad += 1000000;
                else bad += w + w2;
            }
            layouts++;
        }
    long tot[2] = {bad, slots};
    MPI_Allreduce(MPI_IN_PLACE, tot, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    ts_ok(tot[0] == 0 && (p == 1 || tot[1] > 0),
          "halo exchange on %d layouts of %d ranks (faces, edges, corners; one tensor and [a, b]): %ld wrong of %ld slots",
          layouts, p, tot[0], tot[1]);

    /* misuse: faces that do not match the neighbours */
    if (p > 1) {
        const int dims[3] = {p, 1, 1};
        ts_spatial *s = NULL;
        ts_spatial_create(MPI_COMM_WORLD, dims, &s);
        ts_halo h;
        memset(&h, 0, sizeof h);
        ts_spatial_split_dims(s, h.on);
        float x[8] = {0};
        int e = ts_spatial_halo_start(s, x, 1, NULL, 0, 1, (const int64_t[]){2, 2, 2}, &h);
        ts_ok(all(e == TS_ERR_ARG && strstr(ts_err_message(), "face") != NULL, MPI_COMM_WORLD),
              "halo: missing faces are an error before any message (%s)", ts_err_message());
        ts_spatial_destroy(&s);
    }
    MPI_Finalize();
    return ts_done();
}
