/* Spatial decomposition and halo exchange; see spatial.h. The exchange
 * sends every neighbour (offset o in {-1,0,1}^3, up to 26) the layer of the
 * box that touches it in one nonblocking message, packed contiguously, and
 * unpacks what arrives into the face buffers of a ts_halo: a neighbour
 * across a face fills that face's centre, one across an edge or a corner
 * fills the corresponding rows/columns of the D (or H) face. Cost per
 * exchange: alpha * (neighbours) + beta * (surface of the box x C x 4
 * bytes), no relaying (a two-phase face-only scheme would send half the
 * messages but serialise them). */
#include "tsbuild.h"
#include "src/parallel/spatial.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/core/timer.h"
#include "src/core/watchdog.h"
#include "src/core/launch.h"
#include "collectives/coll.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#define NOFF 27 /* offsets (a, b, c) in {-1, 0, 1}^3; index 13 is the box itself */

struct ts_spatial {
    MPI_Comm cart;
    int dims[3], coords[3], rank, size;
    int nbr[NOFF]; /* neighbour's rank in cart, or MPI_PROC_NULL */
    /* the exchange in flight */
    int active, done, nreq;
    MPI_Request req[2 * NOFF];
    MPI_Status sts[2 * NOFF]; /* (a real array: MPI_STATUSES_IGNORE trips GCC's access checks) */
    float *sbuf[NOFF], *rbuf[NOFF];
    size_t scap[NOFF], rcap[NOFF];
    ts_halo h;
    int N, C;
    int64_t dhw[3];
    double t_start, t_done;
    int yield; /* the node runs more threads than CPUs: waits yield the CPU (same on every rank of cart) */
    int skip;  /* TESSERA_TEST_SKIP_HALO: the offset whose face is left empty (tests only), else -1 */
    ts_spatial_stats st;
};

static const char *const dim_name[3] = {"depth (D)", "height (H)", "width (W)"};

static int off_index(int a, int b, int c) { return (a + 1) * 9 + (b + 1) * 3 + (c + 1); }
static void off_of(int i, int o[3])
{
    o[0] = i / 9 - 1;
    o[1] = i / 3 % 3 - 1;
    o[2] = i % 3 - 1;
}

/* ------------------------------------------------------------- planning */

/* 0 if a box edge e suits a network of `levels` levels, else a message in why */
static int edge_ok(int64_t edge, int pieces, int levels, int d, char *why, size_t n)
{
    const int64_t need = (int64_t)1 << (levels - 1);
    if (edge % pieces) {
        snprintf(why, n, "data.patch %lld along %s does not split evenly over %d ranks", (long long)edge, dim_name[d],
                 pieces);
        return 1;
    }
    const int64_t e = edge / pieces;
    if (e < need) {
        snprintf(why, n,
                 "the local box is smaller than a level's halo: %lld voxels per rank along %s shrink below one voxel "
                 "(the one-voxel halo) at level %d of %d; each rank needs at least %lld voxels along %s",
                 (long long)e, dim_name[d], 64 - __builtin_clzll((unsigned long long)e), levels - 1, (long long)need,
                 dim_name[d]);
        return 1;
    }
    for (int l = 0; l < levels - 1; l++)
        if ((e >> l) & 1) {
            snprintf(why, n,
                     "data.patch %lld along %s over %d ranks does not split evenly at every level: each rank's %lld "
                     "voxels are %lld, odd, at level %d before a max-pool (the edge per rank must be a multiple of %lld)",
                     (long long)edge, dim_name[d], pieces, (long long)e, (long long)(e >> l), l, (long long)need);
            return 1;
        }
    return 0;
}

int ts_spatial_plan(int sp, const char *spec, const int64_t patch[3], int levels, int dims[3])
{
    char why[512];
    if (sp < 1) return TS_ERR(TS_ERR_CONFIG, "parallel.sp = %d must be >= 1", sp);
    if (levels < 1 || levels > 30) return TS_ERR(TS_ERR_ARG, "spatial plan: %d levels", levels);
    dims[0] = dims[1] = dims[2] = 1;
    if (!spec || !strcmp(spec, "auto")) {
        /* prime factors of sp, largest first, each to the first dim that takes it */
        int f[32], nf = 0, rest = sp;
        for (int p = 2; p * p <= rest; p++)
            while (rest % p == 0) {
                f[nf++] = p;
                rest /= p;
            }
        if (rest > 1) f[nf++] = rest;
        for (int i = nf - 1; i >= 0; i--) {
            int d = 0;
            while (d < 3 && edge_ok(patch[d], dims[d] * f[i], levels, d, why, sizeof why)) d++;
            if (d == 3)
                return TS_ERR(TS_ERR_CONFIG,
                              "parallel.sp = %d (parallel.sp_dims = auto): the automatic split (prime factors of sp, largest "
                              "first, to depth, then height, then width) found no way to cut data.patch %lldx%lldx%lld "
                              "over %d ranks with every rank's box even at all %d levels (each edge per rank a multiple "
                              "of %d); give parallel.sp_dims, another parallel.sp or another data.patch",
                              sp, (long long)patch[0], (long long)patch[1], (long long)patch[2], sp, levels,
                              1 << (levels - 1));
            dims[d] *= f[i];
        }
        return 0;
    }
    int v[3], used = 0;
    if (sscanf(spec, "%d,%d,%d%n", &v[0], &v[1], &v[2], &used) != 3 || spec[used] != '\0' || v[0] < 1 || v[1] < 1 ||
        v[2] < 1)
        return TS_ERR(TS_ERR_CONFIG, "parallel.sp_dims = '%s': expected 'auto' or three positive counts D,H,W (e.g. 2,2,1)",
                      spec);
    if ((long)v[0] * v[1] * v[2] != sp)
        return TS_ERR(TS_ERR_CONFIG, "parallel.sp_dims = %s: %d x %d x %d = %ld pieces, but parallel.sp = %d", spec,
                      v[0], v[1], v[2], (long)v[0] * v[1] * v[2], sp);
    for (int d = 0; d < 3; d++)
        if (v[d] > 1 && edge_ok(patch[d], v[d], levels, d, why, sizeof why))
            return TS_ERR(TS_ERR_CONFIG, "parallel.sp_dims = %s with data.patch %lldx%lldx%lld and %d levels: %s", spec,
                          (long long)patch[0], (long long)patch[1], (long long)patch[2], levels, why);
    memcpy(dims, v, sizeof v);
    return 0;
}

/* ------------------------------------------------------------- the group */

int ts_spatial_create(MPI_Comm comm, const int dims[3], ts_spatial **out)
{
    int err = 0, size;
    ts_spatial *s = NULL;
    *out = NULL;
    TS_MPI(MPI_Comm_size(comm, &size));
    if (dims[0] < 1 || dims[1] < 1 || dims[2] < 1 || dims[0] * dims[1] * dims[2] != size)
        return TS_ERR(TS_ERR_ARG, "spatial group of %d ranks cannot be a %dx%dx%d grid", size, dims[0], dims[1], dims[2]);
    s = TS_CALLOC(1, sizeof *s);
    if (!s) return TS_ERR_NOMEM;
    s->cart = MPI_COMM_NULL;
    const int periods[3] = {0, 0, 0};
    memcpy(s->dims, dims, sizeof s->dims);
    TS_MPI(MPI_Cart_create(comm, 3, dims, periods, 0, &s->cart));
    TS_MPI(MPI_Comm_rank(s->cart, &s->rank));
    TS_MPI(MPI_Comm_size(s->cart, &s->size));
    TS_MPI(MPI_Cart_coords(s->cart, s->rank, 3, s->coords));
    for (int i = 0; i < NOFF; i++) {
        int o[3], c[3], inside = 1;
        off_of(i, o);
        for (int d = 0; d < 3; d++) {
            c[d] = s->coords[d] + o[d];
            inside &= c[d] >= 0 && c[d] < dims[d];
        }
        s->nbr[i] = MPI_PROC_NULL;
        if (i != NOFF / 2 && inside) TS_MPI(MPI_Cart_rank(s->cart, c, &s->nbr[i]));
    }
    /* TESSERA_TEST_SKIP_HALO = D-|D+|H-|H+|W-|W+: a deliberately broken
     * exchange for the tests that must catch one (tests/train/grad_equiv.sh):
     * what arrives across that face is dropped, the face stays zero */
    s->skip = -1;
    {
        const char *e = getenv("TESSERA_TEST_SKIP_HALO");
        if (e && *e) {
            const char *dn = "DHW", *p = strchr(dn, e[0]);
            if (!p || !e[0] || (e[1] != '-' && e[1] != '+') || e[2])
                TS_FAIL(TS_ERR_CONFIG, "TESSERA_TEST_SKIP_HALO = '%s': expected D-, D+, H-, H+, W- or W+", e);
            int o[3] = {0, 0, 0};
            o[p - dn] = e[1] == '-' ? -1 : 1;
            s->skip = off_index(o[0], o[1], o[2]);
        }
    }
    /* Ranks outnumbering the node's CPUs (a development machine, a test):
     * MPI's waits spin and keep the rank that is still computing off the
     * CPU at each of the step's many sync points (halo waits, norm sums),
     * so waits test and yield instead (docs/scaling.md). Agreed over cart:
     * the sums are then nonblocking on every rank. */
    {
        const ts_launch *l = ts_launch_current();
        int local = l->local_size;
        if (local < 1) {
            MPI_Comm node;
            TS_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
            MPI_Comm_size(node, &local);
            MPI_Comm_free(&node);
        }
        int threads = 1;
#ifdef _OPENMP
        threads = omp_get_max_threads();
#endif
        s->yield = ts_coll_oversubscribed(local, threads);
        TS_MPI(MPI_Allreduce(MPI_IN_PLACE, &s->yield, 1, MPI_INT, MPI_MAX, s->cart));
    }
    *out = s;
    return 0;
cleanup:
    ts_spatial_destroy(&s);
    return err;
}

void ts_spatial_destroy(ts_spatial **sp)
{
    if (!sp || !*sp) return;
    ts_spatial *s = *sp;
    if (s->active && s->nreq > 0) MPI_Waitall(s->nreq, s->req, s->sts);
    for (int i = 0; i < NOFF; i++) {
        free(s->sbuf[i]);
        free(s->rbuf[i]);
    }
    if (s->cart != MPI_COMM_NULL) MPI_Comm_free(&s->cart);
    free(s);
    *sp = NULL;
}

int ts_spatial_size(const ts_spatial *s) { return s->size; }
int ts_spatial_rank(const ts_spatial *s) { return s->rank; }
void ts_spatial_dims(const ts_spatial *s, int dims[3]) { memcpy(dims, s->dims, sizeof s->dims); }
void ts_spatial_coords(const ts_spatial *s, int coords[3]) { memcpy(coords, s->coords, sizeof s->coords); }
MPI_Comm ts_spatial_comm(const ts_spatial *s) { return s->cart; }

int ts_spatial_neighbor(const ts_spatial *s, int d, int side)
{
    int o[3] = {0, 0, 0};
    o[d] = side ? 1 : -1;
    return s->nbr[off_index(o[0], o[1], o[2])] != MPI_PROC_NULL;
}

void ts_spatial_split_dims(const ts_spatial *s, int on[3])
{
    for (int d = 0; d < 3; d++) on[d] = s->dims[d] > 1;
}

int ts_spatial_box(const ts_spatial *s, const int64_t dhw[3], int64_t lo[3], int64_t size[3])
{
    for (int d = 0; d < 3; d++) {
        if (dhw[d] % s->dims[d])
            return TS_ERR(TS_ERR_ARG, "a volume of %lld along %s does not split evenly over %d ranks", (long long)dhw[d],
                          dim_name[d], s->dims[d]);
        size[d] = dhw[d] / s->dims[d];
        lo[d] = size[d] * s->coords[d];
    }
    return 0;
}

/* ------------------------------------------------------------ exchange */

/* index range along one dim: of the box layer sent towards offset o
 * (send = 1), or of the halo slots filled from offset o (send = 0), in box
 * coordinates (-1 .. n) */
static void range(int o, int64_t n, int send, int64_t *lo, int64_t *hi)
{
    if (o == 0) {
        *lo = 0;
        *hi = n;
    } else if (send) {
        *lo = o < 0 ? 0 : n - 1;
        *hi = *lo + 1;
    } else {
        *lo = o < 0 ? -1 : n;
        *hi = *lo + 1;
    }
}

static int64_t region_voxels(const int o[3], const int64_t dhw[3])
{
    int64_t v = 1;
    for (int d = 0; d < 3; d++) v *= o[d] ? 1 : dhw[d];
    return v;
}

static int ensure(float **buf, size_t *cap, size_t floats)
{
    if (*cap >= floats) return 0;
    free(*buf);
    *buf = TS_ALIGNED_ALLOC((floats ? floats : 1) * sizeof(float));
    *cap = *buf ? floats : 0;
    return *buf ? 0 : TS_ERR_NOMEM;
}

/* copies the layer of [a, b] towards offset o into dst (contiguous) */
static void pack(const float *a, int ca, const float *b, int cb, int N, const int64_t dhw[3], const int o[3], float *dst)
{
    int64_t lo[3], hi[3];
    for (int d = 0; d < 3; d++) range(o[d], dhw[d], 1, &lo[d], &hi[d]);
    const int64_t W = dhw[2], H = dhw[1], D = dhw[0];
    for (int n = 0; n < N; n++)
        for (int64_t z = lo[0]; z < hi[0]; z++)
            for (int64_t y = lo[1]; y < hi[1]; y++) {
                const int64_t row = ((int64_t)n * D + z) * H + y;
                if (!b) {
                    memcpy(dst, a + (row * W + lo[2]) * ca, sizeof(float) * (size_t)((hi[2] - lo[2]) * ca));
                    dst += (hi[2] - lo[2]) * ca;
                    continue;
                }
                for (int64_t x = lo[2]; x < hi[2]; x++) {
                    memcpy(dst, a + (row * W + x) * ca, sizeof(float) * (size_t)ca);
                    memcpy(dst + ca, b + (row * W + x) * cb, sizeof(float) * (size_t)cb);
                    dst += ca + cb;
                }
            }
}

/* writes what came from offset o (contiguous src) into the faces of h */
static void unpack(const ts_halo *h, int N, int C, const int64_t dhw[3], const int o[3], const float *src)
{
    int64_t lo[3], hi[3];
    for (int d = 0; d < 3; d++) range(o[d], dhw[d], 0, &lo[d], &hi[d]);
    const int64_t e1 = h->on[1], e2 = h->on[2], D = dhw[0], H = dhw[1], W = dhw[2];
    const int64_t nx = hi[2] - lo[2];
    for (int n = 0; n < N; n++)
        for (int64_t z = lo[0]; z < hi[0]; z++)
            for (int64_t y = lo[1]; y < hi[1]; y++) {
                float *dst;
                if (o[0]) /* D face: [N][H + 2 e1][W + 2 e2][C] */
                    dst = (o[0] < 0 ? h->lo[0] : h->hi[0]) + (((int64_t)n * (H + 2 * e1) + y + e1) * (W + 2 * e2) + lo[2] + e2) * C;
                else if (o[1]) /* H face: [N][D][W + 2 e2][C] */
                    dst = (o[1] < 0 ? h->lo[1] : h->hi[1]) + (((int64_t)n * D + z) * (W + 2 * e2) + lo[2] + e2) * C;
                else /* W face: [N][D][H][C] */
                    dst = (o[2] < 0 ? h->lo[2] : h->hi[2]) + (((int64_t)n * D + z) * H + y) * C;
                memcpy(dst, src, sizeof(float) * (size_t)(nx * C));
                src += nx * C;
            }
}

unsigned ts_spatial_send_mask(const ts_spatial *s)
{
    unsigned m = 0;
    for (int i = 0; i < NOFF; i++)
        if (s->nbr[i] != MPI_PROC_NULL) m |= 1u << i;
    return m;
}

/* the exchange of [a, b]'s boundary (packed NULL) or of a packed one (C channels) */
static int halo_begin(ts_spatial *s, const float *a, int ca, const float *b, int cb, const float *packed, int C, int N,
                      const int64_t dhw[3], const ts_halo *h)
{
    if (s->active) return TS_ERR(TS_ERR_INTERNAL, "halo exchange started while another is in flight");
    const double t0 = ts_time_now();
    /* the faces must match the neighbours; slots without a sender stay zero */
    for (int d = 0; d < 3; d++) {
        if (h->on[d] != (s->dims[d] > 1))
            return TS_ERR(TS_ERR_ARG, "halo: split dims (%d, %d, %d) do not match the spatial grid %dx%dx%d", h->on[0],
                          h->on[1], h->on[2], s->dims[0], s->dims[1], s->dims[2]);
        for (int side = 0; side < 2; side++) {
            float *f = side ? h->hi[d] : h->lo[d];
            if ((f != NULL) != ts_spatial_neighbor(s, d, side))
                return TS_ERR(TS_ERR_ARG, "halo: the %s face along %s is %s but this rank %s a neighbour there",
                              side ? "upper" : "lower", dim_name[d], f ? "given" : "missing",
                              f ? "has no" : "has");
            if (f) memset(f, 0, sizeof(float) * (size_t)ts_halo_face_floats(dhw, h->on, d, N, C));
        }
    }
    /* every buffer first, so that a failure posts nothing */
    for (int i = 0; i < NOFF; i++) {
        if (s->nbr[i] == MPI_PROC_NULL) continue;
        int o[3];
        off_of(i, o);
        const size_t n = (size_t)(N * region_voxels(o, dhw) * C);
        if (n > (size_t)0x7fffffff) return TS_ERR(TS_ERR_UNSUPPORTED, "halo message of %zu floats (above INT_MAX)", n);
        TS_TRY(ensure(&s->rbuf[i], &s->rcap[i], n));
        TS_TRY(ensure(&s->sbuf[i], &s->scap[i], n));
        if (packed) { /* the regions follow one another in offset order */
            memcpy(s->sbuf[i], packed, n * sizeof(float));
            packed += n;
        } else {
            pack(a, ca, b, b ? cb : 0, N, dhw, o, s->sbuf[i]);
        }
    }
    /* then the messages; from the first one on, the exchange counts as in
     * flight, so that wait (or destroy) completes whatever was posted */
    s->nreq = 0;
    s->active = 1;
    s->done = 0;
    int rc = MPI_SUCCESS;
    for (int i = 0; i < NOFF && rc == MPI_SUCCESS; i++) {
        if (s->nbr[i] == MPI_PROC_NULL) continue;
        int o[3];
        off_of(i, o);
        const int n = (int)(N * region_voxels(o, dhw) * C);
        /* what the neighbour at offset o sends me it tags with its own offset to me, -o */
        rc = MPI_Irecv(s->rbuf[i], n, MPI_FLOAT, s->nbr[i], off_index(-o[0], -o[1], -o[2]), s->cart, &s->req[s->nreq]);
        if (rc == MPI_SUCCESS) s->nreq++;
    }
    for (int i = 0; i < NOFF && rc == MPI_SUCCESS; i++) {
        if (s->nbr[i] == MPI_PROC_NULL) continue;
        int o[3];
        off_of(i, o);
        const int n = (int)(N * region_voxels(o, dhw) * C);
        rc = MPI_Isend(s->sbuf[i], n, MPI_FLOAT, s->nbr[i], i, s->cart, &s->req[s->nreq]);
        if (rc == MPI_SUCCESS) {
            s->nreq++;
            s->st.bytes += (uint64_t)n * sizeof(float);
        }
    }
    if (rc != MPI_SUCCESS) return ts_err_mpi(rc, __FILE__, __LINE__, "MPI_Irecv/MPI_Isend (halo)");
    s->h = *h;
    s->N = N;
    s->C = C;
    memcpy(s->dhw, dhw, sizeof s->dhw);
    s->st.exchanges++;
    s->t_start = ts_time_now();
    s->st.exposed_s += s->t_start - t0; /* packing is on the caller's path */
    return 0;
}

int ts_spatial_halo_start(ts_spatial *s, const float *a, int ca, const float *b, int cb, int N, const int64_t dhw[3],
                          const ts_halo *h)
{
    return halo_begin(s, a, ca, b, cb, NULL, ca + (b ? cb : 0), N, dhw, h);
}

int ts_spatial_halo_start_packed(ts_spatial *s, const float *packed, int C, int N, const int64_t dhw[3],
                                 const ts_halo *h)
{
    return halo_begin(s, NULL, 0, NULL, 0, packed, C, N, dhw, h);
}

void ts_spatial_halo_progress(ts_spatial *s)
{
    if (!s->active || s->done) return;
    int flag = 1;
    if (s->nreq > 0) MPI_Testall(s->nreq, s->req, &flag, s->sts);
    if (flag) {
        s->done = 1;
        s->t_done = ts_time_now();
    }
}

int ts_spatial_halo_wait(ts_spatial *s)
{
    if (!s->active) return TS_ERR(TS_ERR_INTERNAL, "halo wait without an exchange in flight");
    const double t0 = ts_time_now();
    s->st.hidden_s += (s->done ? s->t_done : t0) - s->t_start;
    if (!s->done && s->nreq > 0) {
        ts_fault_point("halo");
        ts_watch_enter("halo exchange", "spatial", (size_t)s->st.bytes);
        int rc = ts_coll_waitall_mpi(s->req, s->nreq, s->sts, s->yield);
        ts_watch_leave();
        if (rc != MPI_SUCCESS) return ts_err_mpi(rc, __FILE__, __LINE__, "MPI_Waitall (halo)");
    }
    s->active = 0; /* every request completed */
    for (int i = 0; i < NOFF; i++) {
        if (s->nbr[i] == MPI_PROC_NULL || i == s->skip) continue;
        int o[3];
        off_of(i, o);
        unpack(&s->h, s->N, s->C, s->dhw, o, s->rbuf[i]);
    }
    s->st.exposed_s += ts_time_now() - t0;
    return 0;
}

int ts_spatial_reduce(ts_spatial *s, double *buf, int n, int max)
{
    const double t0 = ts_time_now();
    ts_fault_point("sum");
    ts_watch_enter("spatial sum (norm/loss statistics)", "spatial", sizeof(double) * (size_t)n);
    int rc;
    if (s->yield) {
        MPI_Request rq;
        MPI_Status st;
        rc = MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, max ? MPI_MAX : MPI_SUM, s->cart, &rq);
        if (rc == MPI_SUCCESS) rc = ts_coll_waitall_mpi(&rq, 1, &st, 1);
    } else {
        rc = MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, max ? MPI_MAX : MPI_SUM, s->cart);
    }
    ts_watch_leave();
    s->st.sum_s += ts_time_now() - t0;
    if (rc != MPI_SUCCESS) return ts_err_mpi(rc, __FILE__, __LINE__, "MPI_Allreduce (spatial sums)");
    return 0;
}

const ts_spatial_stats *ts_spatial_get_stats(const ts_spatial *s) { return &s->st; }
void ts_spatial_set_stats(ts_spatial *s, const ts_spatial_stats *st) { s->st = *st; }
