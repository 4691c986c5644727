/* Unit tests of the performance model (src/plan/plan.c) and the
 * collectives' alpha-beta fits (collectives/cost_model.c) with rates and fits
 * given by hand, so that every prediction is known: fits recover the alpha
 * and beta of synthetic times (and ignore one noisy size); one rank's step
 * is its layers' work over the rates; ranks beyond the cores slow compute
 * down in proportion; the allreduce comes from the fits inside a node and
 * from the network between nodes; a pipeline adds its bubble; memory
 * beyond the limit makes a layout infeasible with the reason; layouts are
 * sorted feasible first, fastest first; the bottleneck follows the
 * largest part. */
#include "tsbuild.h"
#include "collectives/cost_model.h"
#include "src/core/error.h"
#include "src/model/cost.h"
#include "src/plan/plan.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int near(double a, double b, double rel) { return fabs(a - b) <= rel * fabs(b) + 1e-15; }

static void test_fit(void)
{
    double bytes[8], t[8], L, B;
    const double alpha = 3e-6, beta = 1e-9;
    ts_coll_model_shape("allreduce", "ring", 4, &L, &B);
    ts_ok(L == 6 && near(B, 1.5, 1e-12), "ring shape at 4 ranks: L = 2(p-1) = %g, B = 2(p-1)/p = %g", L, B);
    for (int i = 0; i < 8; i++) {
        bytes[i] = pow(8, i) * 8; /* 8 B .. 16 MiB */
        t[i] = L * alpha + B * bytes[i] * beta;
    }
    t[3] *= 20; /* one noisy size */
    ts_coll_fit f;
    ts_ok(ts_coll_model_fit("allreduce", "ring", 4, 1, bytes, t, 8, &f) == 0, "fit");
    ts_ok(near(f.alpha_s, alpha, 0.01) && near(f.beta_s, beta, 0.01),
          "fit recovers alpha %.3g us and beta %.3g ns/B despite a noisy size", f.alpha_s * 1e6, f.beta_s * 1e9);
    ts_ok(near(ts_coll_model_time(&f, 8, 1e6), 14 * alpha + 1.75 * 1e6 * beta, 0.01),
          "extrapolated to 8 ranks with the ring's shape");
    ts_ok(ts_coll_model_time(&f, 1, 1e6) == 0, "one rank: no time");
    ts_coll_fit fits[2] = {f, f};
    snprintf(fits[1].algo, sizeof fits[1].algo, "shm");
    fits[1].alpha_s = 1e-6;
    fits[1].beta_s = 0.1e-9;
    const char *best = NULL;
    double tb = ts_coll_model_best(fits, 2, "allreduce", 1, 4, 1e6, &best);
    ts_ok(best && !strcmp(best, "shm") && near(tb, 2e-6 + 3.5 * 1e6 * 0.1e-9, 1e-9), "best of two fits: %s",
          best ? best : "-");
    ts_ok(ts_coll_model_best(fits, 2, "allreduce", 2, 4, 1e6, NULL) < 0, "no fit for 2 nodes: -1");
    /* write and load back through a tuning table */
    char path[] = "/tmp/tessera-plan-XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    remove(path);
    ts_coll_fit *back = NULL;
    int n = 0;
    int rc = ts_coll_model_write(path, fits, 2);
    if (!rc) rc = ts_coll_model_write(path, fits, 1);
    if (!rc) rc = ts_coll_model_load(path, &back, &n);
    ts_ok(rc == 0 && n == 2 && back && !strcmp(back[0].algo, "shm") && !strcmp(back[1].algo, "ring") &&
              near(back[1].alpha_s, fits[0].alpha_s, 1e-6) && near(back[0].beta_s, 0.1e-9, 1e-6),
          "models written twice (replacing the same algorithm) and loaded: %d fits", n);
    free(back);
    remove(path);
}

/* a calibration of 1 GFLOP/s for the convolutions, 1e8 elements/s otherwise */
static void calib(ts_plan_calib *c)
{
    memset(c, 0, sizeof *c);
    for (int k = 0; k < TS_PROF_COUNT; k++) c->rate[k] = 1e8;
    c->rate[TS_PROF_CONV_FWD] = c->rate[TS_PROF_CONV_WGRAD] = c->rate[TS_PROF_CONV_DGRAD] = c->rate[TS_PROF_CONVT] = 1e9;
    c->opt_s_per_param = 1e-8;
    c->act_bytes_per_elem = 8;
    c->process_mb = 100;
    c->threads = 1;
}

static void test_plan(void)
{
    ts_plan_job j;
    memset(&j, 0, sizeof j);
    j.u.levels = 3;
    j.u.channels[0] = 8;
    j.u.channels[1] = 16;
    j.u.channels[2] = 32;
    j.u.in_channels = 1;
    j.u.classes = 3;
    j.u.norm = TS_NORM_BATCH;
    for (int d = 0; d < 3; d++) j.u.patch[d] = 32;
    j.nstate = 1;
    j.global_batch = 4;
    j.micro_batch = 1;
    ts_plan_calib c;
    calib(&c);
    ts_plan_machine m;
    memset(&m, 0, sizeof m);
    m.nodes = 1;
    m.ranks_per_node = 1;
    m.threads = 1;
    m.cores_per_node = 2;
    m.net_GBps = 12.5;
    m.net_latency_us = 2;
    m.halo_hidden = 0.9;
    m.bucket_mb = 25;
    ts_unet_cost cost;
    ts_unet_cost_of(&j.u, 4, j.u.patch, NULL, &cost);
    double layers = 0;
    for (int k = 0; k < TS_PROF_COUNT; k++)
        if (k != TS_PROF_HALO) layers += cost.work[k] / c.rate[k];
    const double opt = cost.params * 1e-8;
    ts_plan_layout l1, l2, l4;
    ts_plan_predict(&j, &c, &m, 1, 1, 1, &l1);
    ts_ok(l1.feasible && near(l1.step_s, layers + opt, 1e-9) && l1.comm_s == 0,
          "1 rank: step %.4f s = layers %.4f s + optimizer %.6f s, no communication", l1.step_s, layers, opt);
    ts_ok(near(l1.efficiency, 1, 1e-9), "1 rank: efficiency 1 (%.4f)", l1.efficiency);
    ts_ok(strstr(l1.bottleneck, "compute") != NULL, "1 rank: bottleneck %s", l1.bottleneck);
    /* 2 ranks (2 cores), 2 samples each; the allreduce from a shm fit */
    ts_coll_fit fit;
    memset(&fit, 0, sizeof fit);
    snprintf(fit.op, sizeof fit.op, "allreduce");
    snprintf(fit.algo, sizeof fit.algo, "shm");
    fit.ranks = 2;
    fit.nodes = 1;
    fit.alpha_s = 5e-6;
    fit.beta_s = 1e-9;
    m.fits = &fit;
    m.nfits = 1;
    m.ranks_per_node = 2;
    ts_plan_predict(&j, &c, &m, 2, 1, 1, &l2);
    ts_unet_cost_of(&j.u, 2, j.u.patch, NULL, &cost);
    double layers2 = 0;
    for (int k = 0; k < TS_PROF_COUNT; k++)
        if (k != TS_PROF_HALO) layers2 += cost.work[k] / c.rate[k];
    const double ar = 2 * 5e-6 + 3.0 * cost.params * 4 * 1e-9; /* shm shape at 2 ranks: L = 2, B = 4 - 2/2 */
    ts_ok(near(l2.grad_s, ar, 1e-9) && near(l2.grad_exposed_s, ar, 1e-9), "2 ranks: allreduce %.6f s from the fit, "
          "all exposed (one bucket)", l2.grad_s);
    ts_ok(near(l2.step_s, layers2 + opt + ar, 1e-9), "2 ranks: step = half the layers + optimizer + allreduce");
    /* 4 ranks on 2 cores: each rank gets half a core */
    m.ranks_per_node = 4;
    j.global_batch = 8;
    ts_plan_predict(&j, &c, &m, 4, 1, 1, &l4);
    ts_ok(near(l4.compute_s, 2 * (layers2 + opt), 1e-9), "4 ranks on 2 cores: compute %.4f s = 2 x %.4f s",
          l4.compute_s, layers2 + opt);
    ts_ok(l4.efficiency > 0.4 && l4.efficiency < 0.55, "4 ranks on 2 cores: efficiency about 0.5 (%.3f)", l4.efficiency);
    /* across nodes, a slow network makes the allreduce the bottleneck */
    m.nodes = 2;
    m.ranks_per_node = 2;
    m.net_GBps = 1e-5;
    m.net_latency_us = 1000;
    ts_plan_layout ln;
    ts_plan_predict(&j, &c, &m, 4, 1, 1, &ln);
    const double inter = 2.0 * 1 * 1000e-6 + 2.0 * 1 / 2 * cost.params * 4 / 1e4;
    ts_ok(near(ln.grad_s, ar + inter, 1e-6) && strstr(ln.bottleneck, "gradient allreduce"),
          "2 nodes on a slow network: allreduce %.3f s = in the node + between nodes; bottleneck: %s", ln.grad_s,
          ln.bottleneck);
    /* pipeline: bubble (m + pp - 1) / m with a micro-batch per sample */
    m.nodes = 1;
    m.ranks_per_node = 2;
    m.net_GBps = 12.5;
    j.global_batch = 4;
    ts_plan_layout lp;
    ts_plan_predict(&j, &c, &m, 1, 2, 1, &lp);
    ts_ok(lp.feasible && lp.runnable && lp.micro == 4 && near(lp.bubble_s, (lp.compute_s - lp.opt_s) / 5, 1e-9),
          "pp = 2, 4 micro-batches of 1 sample: bubble = 1/4 of a stage's work (%.4f s)", lp.bubble_s);
    j.micro_batch = 3;
    ts_plan_predict(&j, &c, &m, 1, 2, 1, &lp);
    ts_ok(!lp.feasible && strstr(lp.why, "micro-batches of 3"), "4 samples in micro-batches of 3: infeasible (%s)", lp.why);
    j.micro_batch = 1;
    /* spatial: a split patch, halo and sums counted */
    ts_plan_layout ls;
    ts_plan_predict(&j, &c, &m, 1, 1, 2, &ls);
    ts_ok(ls.feasible && ls.box[0] == 16 && ls.halo_s > 0 && ls.sums_s > 0, "sp = 2: box 16x32x32, halo %.2g s, sums %.2g s",
          ls.halo_s, ls.sums_s);
    /* memory limit */
    m.mem_per_rank_mb = 50;
    ts_plan_layout lm;
    ts_plan_predict(&j, &c, &m, 2, 1, 1, &lm);
    ts_ok(!lm.feasible && strstr(lm.why, "MiB per rank"), "memory limit: infeasible (%s)", lm.why);
    m.mem_per_rank_mb = 0;
    ts_plan_layout lb;
    ts_plan_predict(&j, &c, &m, 3, 1, 1, &lb);
    ts_ok(!lb.feasible && strstr(lb.why, "dp x pp x sp"), "3 x 1 x 1 on 2 ranks refused: %s", lb.why);
    /* all layouts: feasible first, by step time */
    ts_plan_layout *all = NULL;
    int n = 0, rc;
    m.nodes = 2;
    j.global_batch = 3; /* dp = 2 or 4 do not divide it: infeasible */
    rc = ts_plan_layouts(&j, &c, &m, &all, &n);
    ts_ok(rc == 0 && n > 3, "layouts of 4 ranks: %d", n);
    int sorted = 1, seen_bad = 0;
    for (int i = 0; i < n; i++) {
        if (!all[i].feasible) seen_bad = 1;
        else if (seen_bad || (i > 0 && all[i].step_s < all[i - 1].step_s)) sorted = 0;
    }
    ts_ok(sorted && seen_bad, "feasible layouts first, fastest first; infeasible ones last");
    free(all);
}

/* issue [13]: rates per box size, fits measured on several nodes, cores shared by nodes, halos small boxes
 * cannot hide */
static void test_cluster_terms(void)
{
    ts_plan_job j;
    memset(&j, 0, sizeof j);
    j.u.levels = 3;
    j.u.channels[0] = 8;
    j.u.channels[1] = 16;
    j.u.channels[2] = 32;
    j.u.in_channels = 1;
    j.u.classes = 3;
    j.u.norm = TS_NORM_BATCH;
    for (int d = 0; d < 3; d++) j.u.patch[d] = 32;
    j.nstate = 1;
    j.global_batch = 4;
    j.micro_batch = 1;
    ts_plan_calib c, half;
    calib(&c);
    calib(&half);
    for (int k = 0; k < TS_PROF_COUNT; k++) half.rate[k] /= 2;
    const int64_t b32[3] = {32, 32, 32}, b16[3] = {16, 32, 32}, b8[3] = {8, 32, 32}, b24[3] = {24, 32, 32};
    ts_plan_calib_add_box(&c, &c, b32);
    ts_plan_calib_add_box(&c, &half, b16);
    ts_plan_calib_add_box(&c, &half, b16); /* the same box again: replaced, not added */
    double r[TS_PROF_COUNT], o;
    ts_ok(c.nbox == 2, "calibration boxes: 2 (%d)", c.nbox);
    ts_plan_calib_rates(&c, b32, r, &o);
    ts_ok(near(r[TS_PROF_CONV_FWD], 1e9, 1e-12), "the patch's box: its rate (%g)", r[TS_PROF_CONV_FWD]);
    ts_plan_calib_rates(&c, b16, r, &o);
    ts_ok(near(r[TS_PROF_CONV_FWD], 5e8, 1e-12), "the box of sp 2: its own rate (%g)", r[TS_PROF_CONV_FWD]);
    ts_plan_calib_rates(&c, b8, r, &o);
    ts_ok(near(r[TS_PROF_CONV_FWD], 5e8, 1e-12), "a smaller box than measured: the smallest's rate (%g)", r[TS_PROF_CONV_FWD]);
    ts_plan_calib_rates(&c, b24, r, &o);
    ts_ok(r[TS_PROF_CONV_FWD] > 5e8 && r[TS_PROF_CONV_FWD] < 1e9, "in between: in between (%g)", r[TS_PROF_CONV_FWD]);
    /* the calibration file keeps the boxes */
    const char *path = "test_plan_cal.json";
    ts_plan_calib back;
    ts_ok(ts_plan_calib_write(path, &c) == 0 && ts_plan_calib_load(path, &back) == 0 && back.nbox == 2 &&
              back.boxes[1].box[0] == 16 && near(back.boxes[1].rate[TS_PROF_CONV_FWD], 5e8, 1e-12),
          "calibration boxes written and read back");
    remove(path);
    /* a layout with sp 2 runs at the rate of its box: slower per FLOP than the patch */
    ts_plan_machine m;
    memset(&m, 0, sizeof m);
    m.nodes = 1;
    m.ranks_per_node = 2;
    m.threads = 1;
    m.cores_per_node = 2;
    m.net_GBps = 12.5;
    m.net_latency_us = 2;
    m.halo_hidden = 0.9;
    m.bucket_mb = 25;
    ts_plan_layout ls, lf;
    ts_plan_calib flat;
    calib(&flat);
    ts_plan_predict(&j, &c, &m, 1, 1, 2, &ls);
    ts_plan_predict(&j, &flat, &m, 1, 1, 2, &lf);
    ts_ok(ls.feasible && lf.feasible && ls.compute_s > 1.8 * lf.compute_s,
          "sp 2 with the box's own (half) rates: compute %.4f s, about twice %.4f s", ls.compute_s, lf.compute_s);
    /* nodes sharing cores: 4 nodes of 1 rank on 2 cores, half a core each */
    ts_plan_layout l1, lq;
    m.ranks_per_node = 1;
    m.cores_per_node = 1;
    ts_plan_predict(&j, &flat, &m, 1, 1, 1, &l1);
    m.cores_per_node = 0.5;
    ts_plan_predict(&j, &flat, &m, 1, 1, 1, &lq);
    ts_ok(near(lq.compute_s, 2 * l1.compute_s, 1e-9), "half a core per node: compute %.4f s = 2 x %.4f s", lq.compute_s,
          l1.compute_s);
    /* fits measured on 2 nodes are used for groups across 2 nodes */
    ts_coll_fit f2;
    memset(&f2, 0, sizeof f2);
    snprintf(f2.op, sizeof f2.op, "allreduce");
    snprintf(f2.algo, sizeof f2.algo, "ring");
    f2.ranks = 2;
    f2.nodes = 2;
    f2.alpha_s = 50e-6;
    f2.beta_s = 8e-9; /* 125 MB/s */
    m.fits = &f2;
    m.nfits = 1;
    m.nodes = 2;
    m.cores_per_node = 1;
    ts_plan_layout l2;
    ts_plan_predict(&j, &flat, &m, 2, 1, 1, &l2);
    ts_unet_cost cost;
    ts_unet_cost_of(&j.u, 2, j.u.patch, NULL, &cost);
    ts_ok(near(l2.grad_s, ts_coll_model_time(&f2, 2, cost.params * 4), 1e-9),
          "dp 2 on 2 nodes: the allreduce of the 2-node fit (%.4g s)", l2.grad_s);
    /* a halo across a slow link: a small box cannot hide it, a large one hides 90 % of it */
    m.fits = NULL;
    m.nfits = 0;
    m.net_GBps = 0.125;
    m.net_latency_us = 0;
    ts_plan_layout big, tiny;
    ts_plan_predict(&j, &flat, &m, 1, 1, 2, &big); /* boxes of 16x32x32 across the 2 nodes */
    ts_unet_cost_of(&j.u, 4, big.box, (int[3]){1, 0, 0}, &cost);
    const double t_bw = cost.halo_elems * 4 / 0.125e9;
    ts_ok(cost.conv_interior_flops > 0 && cost.conv_interior_flops < cost.work[TS_PROF_CONV_FWD] + cost.work[TS_PROF_CONV_DGRAD],
          "interior FLOPs of a split box: some, less than all");
    flat.rate[TS_PROF_CONV_FWD] = 1e15; /* convolutions so fast that nothing hides the halo */
    ts_plan_predict(&j, &flat, &m, 1, 1, 2, &tiny);
    ts_ok(near(big.halo_s, 0.1 * t_bw, 1e-6) && near(tiny.halo_s, t_bw, 1e-3),
          "halo over 1 Gbit/s: 10%% exposed behind slow convolutions (%.4g s), all of it behind instant ones (%.4g of %.4g s)",
          big.halo_s, tiny.halo_s, t_bw);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    test_fit();
    test_plan();
    test_cluster_terms();
    int rc = ts_done();
    MPI_Finalize();
    return rc;
}
