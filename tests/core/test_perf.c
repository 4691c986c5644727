/* Unit tests of src/core/perf (per-phase timers and counters) on one rank:
 * nesting and re-entry, time added from elsewhere, reset, timers off, an
 * unknown event reported unavailable with a reason and the software
 * fallback added, TASK-CLOCK (perf_event_open, and the rusage fallback)
 * counting 50 ms of CPU and not 50 ms of sleep; and of src/model/cost (FLOPs of a conv by hand). */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/core/perf.h"
#include "src/model/cost.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static volatile double sink;
static void busy(double seconds)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    double x = 0;
    do {
        for (int i = 0; i < 10000; i++) x += i * 1e-9;
        clock_gettime(CLOCK_MONOTONIC, &b);
    } while ((b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec) < seconds);
    sink = x;
}
/* spins until this thread has used `seconds` of CPU (robust on a loaded machine) */
static void busy_cpu(double seconds)
{
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    double x = 0;
    do {
        for (int i = 0; i < 10000; i++) x += i * 1e-9;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    } while ((b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec) < seconds);
    sink = x;
}
static void nap(double seconds)
{
    struct timespec t = {0, (long)(seconds * 1e9)};
    nanosleep(&t, NULL);
}

static const char *const names[] = {"outer", "inner", "other"};

static void test_timers(void)
{
    ts_perf *p = NULL;
    ts_ok(ts_perf_create(MPI_COMM_WORLD, 3, names, "none", 1, &p) == 0 && p, "perf: create with no counters");
    ts_perf_begin(p, 0);
    busy(0.02);
    ts_perf_begin(p, 1);
    busy(0.02);
    ts_perf_begin(p, 1); /* re-entered: counts once */
    ts_perf_end(p, 1);
    ts_perf_end(p, 1);
    ts_perf_end(p, 0);
    ts_perf_end(p, 2); /* never begun: ignored */
    double o = ts_perf_seconds(p, 0), i = ts_perf_seconds(p, 1);
    ts_ok(o >= 0.039 && i >= 0.019 && i < o, "perf: nested phases: outer %.3f s >= 0.04 holds inner %.3f s >= 0.02", o, i);
    ts_ok(ts_perf_calls(p, 0) == 1 && ts_perf_calls(p, 1) == 1 && ts_perf_calls(p, 2) == 0,
          "perf: a re-entered phase counts one call, an unbegun end none");
    ts_perf_add(p, 2, 1.5);
    ts_ok(ts_perf_seconds(p, 2) == 1.5, "perf: time added from elsewhere");
    ts_perf_reset(p);
    ts_ok(ts_perf_seconds(p, 0) == 0 && ts_perf_calls(p, 1) == 0, "perf: reset");
    ts_ok(strcmp(ts_perf_phase_name(p, 1), "inner") == 0 && ts_perf_nevents(p) == 0, "perf: names, no events");
    ts_perf_destroy(&p);
    ts_ok(p == NULL, "perf: destroy clears the pointer");
    ts_ok(ts_perf_create(MPI_COMM_WORLD, 3, names, "perf::TASK-CLOCK", 0, &p) == 0, "perf: create with timers off");
    ts_perf_begin(p, 0);
    busy(0.005);
    ts_perf_end(p, 0);
    ts_ok(ts_perf_seconds(p, 0) == 0 && ts_perf_calls(p, 0) == 0 && ts_perf_nevents(p) == 0,
          "perf: timers off: nothing recorded, no counters");
    ts_perf_destroy(&p);
    ts_ok(ts_perf_create(MPI_COMM_WORLD, 0, names, "", 1, &p) == TS_ERR_ARG && p == NULL, "perf: zero phases refused");
}

/* busy work counts CPU time, sleep does not */
static void check_clock(const char *how)
{
    ts_perf *p = NULL;
    ts_ok(ts_perf_create(MPI_COMM_WORLD, 3, names, "NO_SUCH_EVENT,perf::TASK-CLOCK", 1, &p) == 0,
          "perf (%s): create with an unknown event", how);
    int clk = ts_perf_find(p, "perf::TASK-CLOCK"), bad = -1, pf = ts_perf_find(p, "perf::PAGE-FAULTS");
    for (int e = 0; e < ts_perf_nevents(p); e++)
        if (!strcmp(ts_perf_event_info(p, e)->name, "NO_SUCH_EVENT")) bad = e;
    const ts_perf_event *bi = bad >= 0 ? ts_perf_event_info(p, bad) : NULL;
    ts_ok(bi && !bi->all_ranks && bi->source == TS_PERF_SRC_NONE && bi->reason[0] && bi->reason_rank == 0,
          "perf (%s): unknown event unavailable with a reason: %s", how, bi ? bi->reason : "-");
    ts_ok(clk >= 0 && !ts_perf_event_info(p, clk)->fallback && pf >= 0 && ts_perf_event_info(p, pf)->fallback &&
              ts_perf_find(p, "perf::CONTEXT-SWITCHES") >= 0,
          "perf (%s): TASK-CLOCK counted; PAGE-FAULTS and CONTEXT-SWITCHES added as the fallback", how);
    if (clk < 0) {
        ts_perf_destroy(&p);
        return;
    }
    ts_diag("TASK-CLOCK source: %s", ts_perf_source_name(ts_perf_event_info(p, clk)->source));
    ts_perf_begin(p, 0);
    busy_cpu(0.05);
    ts_perf_end(p, 0);
    ts_perf_begin(p, 1);
    nap(0.05);
    ts_perf_end(p, 1);
    /* touching new pages: 2048 faults of 4 KiB, not a few of 2 MiB (with transparent huge pages set to
     * "always" a malloc'd 8 MiB faulted in a few huge pages where the kernel had them free: a count that
     * varied from run to run) */
    size_t nb = (size_t)8 << 20;
    char *mem = mmap(NULL, nb, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) mem = NULL;
#ifdef MADV_NOHUGEPAGE
    if (mem) madvise(mem, nb, MADV_NOHUGEPAGE);
#endif
    ts_perf_begin(p, 2);
    for (size_t i = 0; mem && i < nb; i += 4096) mem[i] = (char)i;
    ts_perf_end(p, 2);
    if (mem) munmap(mem, nb);
    double busy_s = ts_perf_count(p, 0, clk) * 1e-9, nap_s = ts_perf_count(p, 1, clk) * 1e-9;
    ts_ok(busy_s >= 0.045 && busy_s < ts_perf_seconds(p, 0) + 0.005,
          "perf (%s): 50 ms of CPU: TASK-CLOCK %.4f s (wall %.4f s)", how, busy_s, ts_perf_seconds(p, 0));
    ts_ok(nap_s < 0.01, "perf (%s): 50 ms asleep: TASK-CLOCK %.4f s", how, nap_s);
    ts_ok(ts_perf_count(p, 2, pf) >= 1000, "perf (%s): touching 8 MiB: %lld page faults (>= 1000)", how,
          ts_perf_count(p, 2, pf));
    char line[2048];
    ts_perf_describe(p, line, sizeof line);
    ts_ok(strstr(line, "NO_SUCH_EVENT unavailable") && strstr(line, "perf::TASK-CLOCK ("), "perf (%s): describe: %s", how,
          line);
    ts_perf_destroy(&p);
}

static void test_cost(void)
{
    ts_unet_cfg u;
    memset(&u, 0, sizeof u);
    u.levels = 1;
    u.channels[0] = 4;
    u.in_channels = 2;
    u.classes = 3;
    u.norm = TS_NORM_BATCH;
    ts_unet_cost c;
    int64_t box[3] = {8, 8, 8};
    ts_ok(ts_unet_cost_of(&u, 2, box, NULL, &c) == 0, "cost: one level");
    /* two 3x3x3 convs (2->4, 4->4) and the 1x1x1 head (4->3) over 2 x 512 voxels */
    double v = 2 * 512, fwd = 2.0 * 27 * (2 * 4 + 4 * 4) * v + 2.0 * 4 * 3 * v;
    ts_ok(fabs(c.flops_forward - fwd) < 1e-6 * fwd, "cost: forward FLOPs %.0f == %.0f by hand", c.flops_forward, fwd);
    /* weight gradients of all three, input gradients of all but the first conv */
    double bwd = fwd + fwd - 2.0 * 27 * 2 * 4 * v;
    ts_ok(fabs(c.flops_backward - bwd) < 1e-6 * bwd, "cost: backward FLOPs %.0f == %.0f", c.flops_backward, bwd);
    double params = 27 * 2 * 4 + 4 + 8 + 27 * 4 * 4 + 4 + 8 + 4 * 3 + 3;
    ts_ok(c.params == params && c.buffers == 16 && c.convs == 2, "cost: %.0f parameters (%.0f by hand), 16 buffers",
          c.params, params);
    int split[3] = {1, 0, 0};
    int rc = ts_unet_cost_of(&u, 1, box, split, &c);
    ts_ok(rc == 0 && c.halo_elems == 2.0 * (2 + 4) * 2 * 64,
          "cost: halo faces of a box split along depth: %.0f elements", c.halo_elems);
    u.levels = 2;
    u.channels[1] = 8;
    int64_t odd[3] = {8, 8, 5};
    ts_ok(ts_unet_cost_of(&u, 1, odd, NULL, &c) == TS_ERR_CONFIG, "cost: edge not divisible by 2^(levels-1) refused");
    ts_err_clear();
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    test_timers();
    check_clock("default");
    setenv("TESSERA_PERF_SOFTWARE", "rusage", 1);
    check_clock("rusage");
    unsetenv("TESSERA_PERF_SOFTWARE");
    test_cost();
    int rc = ts_done();
    MPI_Finalize();
    return rc;
}
