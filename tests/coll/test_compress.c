/* MPI test of gradient compression (collectives/compress.h) on any number
 * of ranks: parsing and refusals; bf16 / fp16 within their rounding bounds
 * of the exact average (and not exact: something was cast); top-k exact at
 * ratio 1 and on inputs with at most k non-zeros (compressed), its residual
 * holding exactly what was not sent; error feedback conserves the sum over
 * calls (results + mean residual = mean of the inputs) for topk, sign
 * (worker and server residuals) and PowerSGD; PowerSGD exact on a rank-r
 * matrix; results bit-identical on every rank; the progress-thread path
 * equal to the blocking one; non-finite input reaching every rank and
 * restarting the residual; the two-level (inner) groups. */
#include "tsbuild.h"
#include "collectives/compress.h"
#include "collectives/coll_impl.h"
#include "src/core/dtype.h"
#include "tests/tap.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank_, p_;

/* 1 on every rank when c holds on every rank */
static int all(int c)
{
    int r;
    MPI_Allreduce(&c, &r, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return r;
}

/* 1 when buf (n floats) is bitwise the same on every rank */
static int same_everywhere(const float *b, size_t n)
{
    float *r0 = malloc(n * sizeof *r0 + 1);
    memcpy(r0, b, n * sizeof *r0);
    MPI_Bcast(r0, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
    int ok = !memcmp(r0, b, n * sizeof *r0);
    free(r0);
    return all(ok);
}

static uint64_t rng_ = 1;
static double urand(void) /* [0, 1) */
{
    rng_ = rng_ * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_ >> 11) / 9007199254740992.0;
}
static float nrand(void) { return (float)(sqrt(-2 * log(urand() + 1e-300)) * cos(2 * M_PI * urand())); }
static void fill(float *x, size_t n, int seed)
{
    rng_ = 0x9e3779b97f4a7c15ull * (uint64_t)(seed * 131 + rank_ + 1);
    for (size_t i = 0; i < n; i++) x[i] = nrand();
}

static ts_compressor *make(ts_coll *c, const char *spec, size_t n)
{
    ts_compress_cfg cc;
    char why[256];
    if (ts_compress_parse(spec, &cc, why, sizeof why)) {
        fprintf(stderr, "parse %s: %s\n", spec, why);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    cc.seed = 42;
    ts_compressor *z = NULL;
    if (ts_compressor_create(c, &cc, 1, &n, &z)) {
        fprintf(stderr, "create %s: %s\n", spec, ts_err_message());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return z;
}

/* the residual every rank's results still owe, in double: the mean of the
 * worker residuals plus (sign) the server residuals, each rank's own chunk */
static void owed(const ts_compressor *z, size_t n, double *out)
{
    const float *srv;
    size_t off, len;
    const float *e = ts_compressor_residual(z, 0, &srv, &off, &len);
    for (size_t i = 0; i < n; i++) out[i] = e ? e[i] / (double)p_ : 0.0;
    for (size_t i = 0; srv && i < len; i++) out[off + i] += srv[i];
    MPI_Allreduce(MPI_IN_PLACE, out, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

/* error feedback: over T calls, sum of results + mean residual = mean of
 * the summed inputs (float32 rounding aside; for sign, the server residual
 * of each chunk counts too); also that the results were not
 * exact (something was compressed) and bit-identical everywhere */
static void conservation(ts_coll *c, const char *spec, size_t n, int T)
{
    ts_compressor *z = make(c, spec, n);
    float *x = malloc(n * sizeof *x);
    double *in = calloc(n, sizeof *in), *out = calloc(n, sizeof *out), *res = calloc(n, sizeof *res);
    double lost = 0;
    int ident = 1;
    for (int t = 0; t < T; t++) {
        fill(x, n, 100 + t);
        double *m = calloc(n, sizeof *m);
        for (size_t i = 0; i < n; i++) m[i] = x[i];
        MPI_Allreduce(MPI_IN_PLACE, m, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        for (size_t i = 0; i < n; i++) {
            m[i] /= p_;
            in[i] += m[i];
        }
        if (ts_compress_allreduce(z, 0, x)) {
            fprintf(stderr, "%s: %s\n", spec, ts_err_message());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        ident &= same_everywhere(x, n);
        for (size_t i = 0; i < n; i++) {
            out[i] += x[i];
            lost += fabs(x[i] - m[i]);
        }
        free(m);
    }
    owed(z, n, res);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs(out[i] + res[i] - in[i]));
        scale = fmax(scale, fabs(in[i]));
    }
    ts_ok(all(worst <= 1e-4 * (scale + 1) * T), "%s, %zu floats, %d calls: results + mean residual = mean of the inputs "
          "(largest difference %.3g)", spec, n, T, worst);
    ts_ok(all(lost > 1e-3 * (double)n) && ts_compressor_segment(z, 0, NULL, NULL, NULL, NULL),
          "%s: the segment was compressed and the results are not the exact averages (mean |error| %.3g)", spec,
          lost / (double)n / T);
    ts_ok(ident, "%s: results bit-identical on every rank", spec);
    free(x);
    free(in);
    free(out);
    free(res);
    ts_compressor_destroy(&z);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &p_);
    ts_err_set_rank(rank_);
    ts_tap_quiet = rank_ != 0;
    ts_coll *c = NULL;
    if (ts_coll_create(MPI_COMM_WORLD, NULL, &c)) MPI_Abort(MPI_COMM_WORLD, 1);
    char why[256], nm[64];
    ts_compress_cfg cc;

    /* ---- parsing ---- */
    {
        const char *good[] = {"none", "bf16", "fp16", "topk:0.01", "topk:1", "sign", "powersgd:4"};
        int ok = 1;
        for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
            ok &= ts_compress_parse(good[i], &cc, why, sizeof why) == 0;
            ts_compress_name(&cc, nm, sizeof nm);
            ok &= !strcmp(nm, good[i]) && cc.feedback == 1;
        }
        ts_ok(ok, "parse: none, bf16, fp16, topk:0.01, topk:1, sign, powersgd:4 (canonical names round-trip)");
        const char *bad[] = {"topk:0", "topk:2", "topk:", "topk", "topk:x", "powersgd:0", "powersgd:1.5", "powersgd",
                             "bf16:2", "zstd", ""};
        ok = 1;
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            why[0] = 0;
            ok &= ts_compress_parse(bad[i], &cc, why, sizeof why) == TS_ERR_CONFIG && why[0];
        }
        ts_ok(ok, "parse: topk:0, topk:2, topk:, powersgd:0, powersgd:1.5, bf16:2, unknown, empty are refused with a "
                  "reason");
        ts_compress_parse("zstd", &cc, why, sizeof why);
        ts_ok(strstr(why, "known:") != NULL, "unknown compression names the known ones: %s", why);
    }

    /* ---- bf16 / fp16: within the rounding bound, not exact, identical everywhere ---- */
    for (int half = 0; half < 2; half++) {
        const size_t n = 10007;
        const char *spec = half ? "fp16" : "bf16";
        ts_compressor *z = make(c, spec, n);
        float *x = malloc(n * sizeof *x);
        double *ref = malloc(n * sizeof *ref), *abs_ = malloc(n * sizeof *abs_);
        fill(x, n, 1);
        for (size_t i = 0; i < n; i++) {
            ref[i] = x[i];
            abs_[i] = fabs(x[i]);
        }
        MPI_Allreduce(MPI_IN_PLACE, ref, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, abs_, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        int rc = ts_compress_allreduce(z, 0, x);
        /* unit roundoff u (bf16 2^-8, fp16 2^-11); p input roundings and at most p partial sums, each within
         * u of what it rounds: |result - mean| <= 2 u sum|x| / p + u |mean| (+ fp16's subnormal spacing) */
        const double u = half ? ldexp(1, -11) : ldexp(1, -8);
        int within = 1, inexact = 0;
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            const double mean = ref[i] / p_, err = fabs(x[i] - mean);
            const double bound = 2 * u * abs_[i] / p_ + u * fabs(mean) + (half ? p_ * ldexp(1, -24) : 0) + 1e-30;
            within &= err <= bound;
            inexact |= (float)mean != x[i];
            if (err / bound > worst) worst = err / bound;
        }
        ts_ok(all(!rc && within), "%s round trip: every element within its rounding bound of the exact mean "
              "(worst at %.2f of the bound)", spec, worst);
        ts_ok(all(inexact) && same_everywhere(x, n), "%s: not the float32 average (it was cast), bit-identical on every "
              "rank", spec);
        ts_compress_bytes b = {0, 0, 0, 0};
        ts_compressor_bytes(z, 0, &b);
        ts_ok(b.payload * 2 == b.fp32, "%s: %g bytes for %g (2x)", spec, b.payload, b.fp32);
        free(x);
        free(ref);
        free(abs_);
        ts_compressor_destroy(&z);
    }

    /* ---- top-k exactness ---- */
    {
        const size_t n = 4096;
        float *x = malloc(n * sizeof *x), *all_x = malloc((size_t)p_ * n * sizeof *x), *want = malloc(n * sizeof *x);
        for (int sparse = 0; sparse < 2; sparse++) {
            const char *spec = sparse ? "topk:0.25" : "topk:1";
            ts_compressor *z = make(c, spec, n);
            size_t k = 0;
            int comp = ts_compressor_segment(z, 0, NULL, NULL, NULL, &k);
            fill(x, n, 7);
            if (sparse) /* at most k non-zeros on each rank, at rank-dependent places */
                for (size_t i = 0; i < n; i++)
                    if ((i + (size_t)rank_) % 5) x[i] = 0.0f;
            MPI_Allgather(x, (int)n, MPI_FLOAT, all_x, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
            for (size_t i = 0; i < n; i++) { /* rank order, then / p: the documented float32 sums */
                float s = 0.0f;
                for (int q = 0; q < p_; q++) s += all_x[(size_t)q * n + i];
                want[i] = s / (float)p_;
            }
            int rc = ts_compress_allreduce(z, 0, x);
            const float *e = ts_compressor_residual(z, 0, NULL, NULL, NULL);
            int exact = !rc, ezero = 1;
            for (size_t i = 0; i < n; i++) {
                exact &= sparse ? x[i] == want[i] : fabsf(x[i] - want[i]) <= 1e-6f * (fabsf(want[i]) + 1);
                ezero &= !e || e[i] == 0.0f;
            }
            if (sparse)
                ts_ok(all(exact && ezero && comp && k == n / 4), "topk:0.25 on inputs with <= k = %zu non-zeros: sent "
                      "compressed, result = the exact average bit for bit, residual zero", k);
            else
                ts_ok(all(exact && ezero), "topk:1: result = the float32 average, residual zero (sent %s)",
                      comp ? "compressed" : "as float32: indices would make it larger");
            ts_compressor_destroy(&z);
        }
        /* the residual holds exactly what was not sent: n - k entries equal to x, k zeros, none larger than a sent one */
        ts_compressor *z = make(c, "topk:0.01", n);
        size_t k = 0;
        ts_compressor_segment(z, 0, NULL, NULL, NULL, &k);
        fill(x, n, 9);
        memcpy(want, x, n * sizeof *x);
        int rc = ts_compress_allreduce(z, 0, x);
        const float *e = ts_compressor_residual(z, 0, NULL, NULL, NULL);
        size_t zeros = 0, kept = 0;
        float min_sent = INFINITY, max_left = 0;
        for (size_t i = 0; i < n; i++) {
            if (e[i] == 0.0f) {
                zeros++;
                min_sent = fminf(min_sent, fabsf(want[i]));
            } else {
                kept += e[i] == want[i];
                max_left = fmaxf(max_left, fabsf(e[i]));
            }
        }
        ts_ok(all(!rc && zeros == k && kept == n - k && max_left <= min_sent), "topk:0.01 residual: %zu sent (zeroed), "
              "%zu kept exactly, largest kept %.3g <= smallest sent %.3g", zeros, kept, max_left, min_sent);
        /* the result is the average of what the ranks sent: x - e */
        double *s = malloc(n * sizeof *s);
        for (size_t i = 0; i < n; i++) s[i] = (double)want[i] - e[i];
        MPI_Allreduce(MPI_IN_PLACE, s, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        int ok = 1;
        for (size_t i = 0; i < n; i++) ok &= fabs(x[i] - s[i] / p_) <= 1e-6 * (fabs(s[i]) + 1);
        ts_ok(all(ok), "topk:0.01: the result is the average of the sent entries (x - residual)");
        /* non-finite input on one rank: non-finite everywhere, that rank's residual restarts */
        fill(x, n, 10);
        if (rank_ == p_ - 1) x[17] = NAN;
        rc = ts_compress_allreduce(z, 0, x);
        int nf = 0, ez = 1;
        for (size_t i = 0; i < n; i++) nf |= !isfinite(x[i]);
        if (rank_ == p_ - 1)
            for (size_t i = 0; i < n; i++) ez &= e[i] == 0.0f;
        ts_ok(all(!rc && nf && ez), "topk: a NaN on rank %d makes the result non-finite on every rank and restarts its "
              "residual", p_ - 1);
        ts_compressor_destroy(&z);
        free(s);
        free(x);
        free(all_x);
        free(want);
    }

    /* ---- error feedback conserves the sum (topk, sign, powersgd) ---- */
    conservation(c, "topk:0.01", 20000, 6);
    conservation(c, "sign", 20000, 6);
    conservation(c, "powersgd:2", 20000, 6);

    /* ---- sign: scale groups cut at tensor starts ---- */
    {
        const size_t n = 20000, b[2] = {300, 303}; /* tensors [0, 300) ~1e-3, [300, 303) a bias, [303, n) ~1 */
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        rng_ = 77; /* the same on every rank: averaging changes nothing but the compression */
        for (size_t i = 0; i < n; i++) x[i] = (i < 300 ? 1e-3f : 1.0f) * (0.5f + (float)urand()) * (i % 3 ? 1 : -1);
        x[300] = 0.8f;
        x[301] = -0.1f;
        x[302] = -0.7f;
        memcpy(y, x, n * sizeof *x);
        ts_compressor *z1 = make(c, "sign", n), *z2 = make(c, "sign", n);
        int e = ts_compressor_set_bounds(z1, 0, b, 2);
        e |= ts_compress_allreduce(z1, 0, x) | ts_compress_allreduce(z2, 0, y);
        float small1 = 0, small2 = 0;
        for (size_t i = 0; i < 300; i++) {
            small1 = fmaxf(small1, fabsf(x[i]));
            small2 = fmaxf(small2, fabsf(y[i]));
        }
        const float m3 = sqrtf((0.64f + 0.01f + 0.49f) / 3); /* the bias's root mean square */
        ts_ok(all(!e && small1 < 2e-3f && fabsf(x[300] - m3) < 1e-6f && fabsf(x[301] + m3) < 1e-6f &&
                  fabsf(x[302] + m3) < 1e-6f), "sign with tensor starts: the small tensor keeps its scale (largest "
              "%.2g), the 3-element bias gets its own scale (%.3f %.3f %.3f)", small1, x[300], x[301], x[302]);
        ts_ok(all(small2 > 0.1f), "sign without them: a group straddles the start and inflates the small tensor to %.2g",
              small2);
        size_t bad[2] = {303, 300};
        ts_ok(all(ts_compressor_set_bounds(z2, 0, bad, 2) == TS_ERR_ARG), "descending tensor starts are refused");
        ts_compressor_destroy(&z1);
        ts_compressor_destroy(&z2);
        free(x);
        free(y);
    }

    /* ---- PowerSGD: exact on a rank-r matrix ---- */
    {
        const size_t m = 64, cols = 64, n = m * cols;
        const int r = 3;
        ts_compressor *z = make(c, "powersgd:3", n);
        size_t rows, cc2;
        int rk;
        int comp = ts_compressor_segment(z, 0, &rows, &cc2, &rk, NULL);
        float *A = malloc(m * r * sizeof *A), *B = malloc(cols * r * sizeof *B), *x = malloc(n * sizeof *x);
        rng_ = 5; /* the same factors on every rank, scaled by rank: the average is rank r too */
        for (size_t i = 0; i < m * r; i++) A[i] = nrand();
        for (size_t i = 0; i < cols * r; i++) B[i] = nrand();
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < cols; j++) {
                float v = 0;
                for (int t = 0; t < r; t++) v += A[i * r + t] * B[j * r + t];
                x[i * cols + j] = v * (float)(rank_ + 1);
            }
        const double f = (p_ + 1) / 2.0; /* mean of 1..p */
        float *x0 = malloc(n * sizeof *x0);
        memcpy(x0, x, n * sizeof *x);
        int rc = ts_compress_allreduce(z, 0, x);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < cols; j++) {
                double v = 0;
                for (int t = 0; t < r; t++) v += (double)A[i * r + t] * B[j * r + t];
                worst = fmax(worst, fabs(x[i * cols + j] - f * v));
                scale = fmax(scale, fabs(f * v));
            }
        const float *e = ts_compressor_residual(z, 0, NULL, NULL, NULL);
        double emax = 0;
        for (size_t i = 0; i < n; i++) emax = fmax(emax, fabs(e[i] - (x0[i] - x[i])));
        ts_ok(all(!rc && comp && rows == m && cc2 == cols && rk == r && worst <= 1e-4 * scale),
              "powersgd:3 on a rank-3 %zux%zu matrix: exact in one call (largest error %.3g of %.3g)", m, cols, worst,
              scale);
        ts_ok(all(emax <= 1e-5 * scale * (p_ + 1)), "powersgd:3 rank-3: each rank's residual is its own matrix minus the "
              "average, nothing lost (largest difference %.3g)", emax);
        free(x0);
        ts_compress_bytes b = {0, 0, 0, 0};
        ts_compressor_bytes(z, 0, &b);
        ts_ok(b.payload == 4.0 * (double)(m + cols) * r, "powersgd:3: %g bytes = 4 (m + c) r of %g", b.payload, b.fp32);
        free(A);
        free(B);
        free(x);
        ts_compressor_destroy(&z);
    }

    /* ---- progress thread = blocking; tiny segments go uncompressed ---- */
    {
        const char *specs[] = {"bf16", "fp16", "topk:0.05", "sign", "powersgd:2"};
        const size_t n = 6000;
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        int ok = 1;
        for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
            ts_compressor *z1 = make(c, specs[s], n), *z2 = make(c, specs[s], n);
            for (int t = 0; t < 3; t++) {
                fill(a, n, 30 + t);
                memcpy(b, a, n * sizeof *a);
                ts_coll_req *req = NULL;
                int e1 = ts_compress_allreduce(z1, 0, a);
                int e2 = ts_compress_iallreduce(z2, 0, b, &req);
                if (!e2) e2 = ts_coll_wait(&req);
                ok &= !e1 && !e2 && !memcmp(a, b, n * sizeof *a);
            }
            ts_compressor_destroy(&z1);
            ts_compressor_destroy(&z2);
        }
        ts_ok(all(ok), "bf16, fp16, topk, sign, powersgd: ts_compress_iallreduce (progress thread) = blocking, bit for bit, "
                  "over 3 calls");
        ok = 1;
        for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
            ts_compressor *z = make(c, specs[s], 3);
            ok &= !ts_compressor_segment(z, 0, NULL, NULL, NULL, NULL) || !strcmp(specs[s], "bf16") ||
                  !strcmp(specs[s], "fp16");
            ts_compressor_destroy(&z);
        }
        ts_ok(ok, "a 3-float segment goes uncompressed under topk, sign, powersgd (compression would not be smaller)");
        free(a);
        free(b);
    }

    /* ---- two levels: exact over inner pairs, compressed over the rest ---- */
    if (p_ >= 4 && p_ % 2 == 0) {
        MPI_Comm ic, oc;
        MPI_Comm_split(MPI_COMM_WORLD, rank_ / 2, rank_, &ic);
        MPI_Comm_split(MPI_COMM_WORLD, rank_ % 2, rank_, &oc);
        ts_coll *inner = NULL, *outer = NULL;
        if (ts_coll_create(ic, NULL, &inner) || ts_coll_create(oc, NULL, &outer)) MPI_Abort(MPI_COMM_WORLD, 1);
        const size_t n = 4096;
        ts_compressor *z = make(outer, "topk:0.25", n);
        ts_compressor_set_inner(z, inner);
        float *x = malloc(n * sizeof *x);
        double *ref = malloc(n * sizeof *ref);
        fill(x, n, 3);
        for (size_t i = 0; i < n; i++) { /* <= k non-zeros per pair: exact */
            if ((i + (size_t)(rank_ / 2)) % 10 > 1) x[i] = 0.0f;
            ref[i] = x[i];
        }
        MPI_Allreduce(MPI_IN_PLACE, ref, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        int rc = ts_compress_allreduce(z, 0, x), ok = !rc;
        for (size_t i = 0; i < n; i++) ok &= fabs(x[i] - ref[i] / p_) <= 1e-6 * (fabs(ref[i]) + 1);
        ts_compress_bytes b = {0, 0, 0, 0};
        ts_compressor_bytes(z, 0, &b);
        const double q = 2, o = p_ / 2;
        ok &= fabs(b.wire - ((o - 1) * 8.0 * (double)(n / 4) + 2 * (q - 1) / q * 4 * n)) < 1;
        ok &= fabs(b.wire_fp32 - 2.0 * (p_ - 1) / p_ * 4 * n) < 1;
        ts_ok(all(ok) && same_everywhere(x, n), "two levels (exact over pairs, topk over %d replicas): the average over "
              "all %d ranks, bit-identical; wire bytes count both levels", p_ / 2, p_);
        free(x);
        free(ref);
        ts_compressor_destroy(&z);
        ts_coll_destroy(&inner);
        ts_coll_destroy(&outer);
        MPI_Comm_free(&ic);
        MPI_Comm_free(&oc);
    }

    /* ---- bad arguments ---- */
    {
        ts_compress_cfg bad = {.kind = TS_COMPRESS_TOPK, .ratio = 0};
        size_t n = 10;
        ts_compressor *z = NULL;
        int e1 = ts_compressor_create(c, &bad, 1, &n, &z);
        bad = (ts_compress_cfg){.kind = TS_COMPRESS_POWERSGD, .rank = 0};
        int e2 = ts_compressor_create(c, &bad, 1, &n, &z);
        ts_ok(all(e1 == TS_ERR_ARG && e2 == TS_ERR_ARG && !z), "create refuses topk ratio 0 and powersgd rank 0");
    }

    ts_coll_destroy(&c);
    int rc = ts_done();
    MPI_Finalize();
    return rc;
}
