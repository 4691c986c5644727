/* Compares `tessera model run` outputs with golden files written by
 * PyTorch (tests/golden/make_golden.py): every dataset of each expected file
 * (/logits, /loss, /grads/..., /params/...) must exist in the output with the
 * same shape and agree within a relative error of 1e-4: for each dataset
 * max_i |out_i - exp_i| / max_i |exp_i|. A dataset whose expected values are
 * all below 1e-6 G, G the largest magnitude in its group (the gradients of
 * conv biases in front of batch norm, zero in exact arithmetic and ~1e-17 in
 * PyTorch's float64), must instead have max_i |out_i| <= 1e-6 G.
 * One TAP line per case and dataset group. --tol X replaces 1e-4 (the GPU
 * check compares bf16 runs, and the GPU's gradient dumps against the CPU's:
 * jobs/gpu/check.sh).
 * usage: golden_compare [--tol X] CASE OUT.h5 EXPECT.h5 [CASE OUT.h5 EXPECT.h5 ...] */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/model/weights.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double TOL = 1e-4; /* --tol */

typedef struct {
    hid_t out;
    const char *outpath, *exppath, *prefix;
    double worst, gmax; /* gmax: largest expected magnitude in the group (pass 1) */
    int pass;
    char worst_name[256], fail[512];
    int count, out_missing;
} cmp_ctx;

static void compare_one(cmp_ctx *c, hid_t exp, const char *name)
{
    ts_tensor e = {0}, o = {0};
    if (ts_weights_read_dataset(exp, c->exppath, name, TS_FLOAT64, -1, &e)) {
        snprintf(c->fail, sizeof c->fail, "%s", ts_err_message());
        return;
    }
    if (ts_weights_read_dataset(c->out, c->outpath, name, TS_FLOAT64, -1, &o)) {
        snprintf(c->fail, sizeof c->fail, "%s", ts_err_message());
        ts_tensor_free(&e);
        return;
    }
    int same = ts_tensor_numel(&e) == ts_tensor_numel(&o) && (e.ndim == o.ndim || ts_tensor_numel(&e) == 1);
    for (int i = 0; same && e.ndim == o.ndim && i < e.ndim; i++) same = e.shape[i] == o.shape[i];
    if (!same) {
        char a[96], b[96];
        snprintf(c->fail, sizeof c->fail, "%s: shape %s, expected %s", name, ts_tensor_shape_str(&o, a, sizeof a),
                 ts_tensor_shape_str(&e, b, sizeof b));
    } else {
        const double *pe = e.data, *po = o.data;
        double mx = 0, mo = 0, md = 0;
        int64_t n = ts_tensor_numel(&e), at = 0;
        for (int64_t i = 0; i < n; i++) {
            mx = fmax(mx, fabs(pe[i]));
            mo = fmax(mo, fabs(po[i]));
            if (!(fabs(po[i] - pe[i]) <= md)) { /* NaN counts as worst */
                md = isnan(po[i]) ? INFINITY : fabs(po[i] - pe[i]);
                at = i;
            }
        }
        if (c->pass == 0) {
            c->gmax = fmax(c->gmax, mx);
        } else {
            double err = mx < 1e-6 * c->gmax ? mo / (1e-6 * c->gmax) * TOL : md / mx;
            if (!(err <= c->worst)) {
                c->worst = isnan(err) ? INFINITY : err;
                snprintf(c->worst_name, sizeof c->worst_name, "%s[%lld]%s", name, (long long)at,
                         mx < 1e-6 * c->gmax ? " (zero in exact arithmetic)" : "");
            }
        }
        c->count++;
    }
    ts_tensor_free(&e);
    ts_tensor_free(&o);
}

typedef struct {
    cmp_ctx *c;
    hid_t exp;
} visit_ctx;

static herr_t visit(hid_t g, const char *name, const H5O_info_t *info, void *data)
{
    visit_ctx *v = data;
    if (info->type != H5O_TYPE_DATASET) return 0;
    char full[300];
    snprintf(full, sizeof full, "/%s", name);
    if (strncmp(full, v->c->prefix, strlen(v->c->prefix))) return 0;
    if (!v->c->out_missing && !v->c->fail[0]) compare_one(v->c, v->exp, full);
    else v->c->count++;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "--tol")) {
        char *end;
        TOL = strtod(argv[2], &end);
        if (*end || !(TOL > 0)) {
            fprintf(stderr, "golden_compare: --tol %s is not a positive number\n", argv[2]);
            return 2;
        }
        argv[2] = argv[0];
        argv += 2;
        argc -= 2;
    }
    if (argc < 4 || (argc - 1) % 3) {
        fprintf(stderr, "usage: golden_compare [--tol X] CASE OUT.h5 EXPECT.h5 ...\n");
        return 2;
    }
    static const char *const groups[] = {"/logits", "/loss", "/grads/", "/params/"};
    for (int a = 1; a < argc; a += 3) {
        hid_t out = -1, exp = -1;
        int oo = ts_weights_open(argv[a + 1], &out);
        char omsg[512];
        snprintf(omsg, sizeof omsg, "%s", oo ? ts_err_message() : "");
        if (ts_weights_open(argv[a + 2], &exp)) {
            ts_ok(0, "%s: expected file: %s", argv[a], ts_err_message());
            continue;
        }
        for (size_t gi = 0; gi < sizeof groups / sizeof *groups; gi++) {
            cmp_ctx c = {out, argv[a + 1], argv[a + 2], groups[gi], 0, 0, 0, "", "", 0, oo != 0};
            visit_ctx v = {&c, exp};
            if (!oo) {
                H5Ovisit(exp, H5_INDEX_NAME, H5_ITER_INC, visit, &v); /* pass 0: group scale */
                c.pass = 1;
                c.count = 0;
            }
            H5Ovisit(exp, H5_INDEX_NAME, H5_ITER_INC, visit, &v);
            if (c.count == 0 && !c.fail[0]) continue; /* group not in this case */
            if (oo) snprintf(c.fail, sizeof c.fail, "no output: %s", omsg);
            if (c.fail[0]) ts_ok(0, "%s %s: %s", argv[a], groups[gi], c.fail);
            else
                ts_ok(c.worst <= TOL, "%s %s: %d datasets vs expected, max rel err %.2e at %s (tol %.0e)", argv[a],
                      groups[gi], c.count, c.worst, c.worst_name, TOL);
        }
        if (out >= 0) H5Fclose(out);
        H5Fclose(exp);
    }
    return ts_done();
}
