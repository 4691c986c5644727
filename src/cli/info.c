/* tessera info: what this build and this job have: build options, MPI
 * library, ranks and nodes, collectives, counters, GPUs. Prints what the
 * library reports; measures and writes nothing. */
#include "tsbuild.h"
#include "collectives/coll.h"
#include "src/cli/cli.h"
#include "src/core/counters.h"
#include "src/core/device.h"
#include "src/core/error.h"
#include "src/core/launch.h"
#include "src/core/perf.h"
#include "src/parallel/layout.h"
#ifdef TS_HAVE_CUDA
#include "src/nn/cuda/cuda_nn.h"
#endif

#include <stdlib.h>
#include <string.h>

/* the CUDA build and the GPUs this rank sees (rank 0's view) */
static void gpus(void)
{
    if (!ts_device_compiled()) {
        printf("CUDA:             not compiled (configure --with-cuda)\n");
        return;
    }
#ifdef TS_HAVE_CUDA
    char v[160], nn[400];
#ifdef TS_CUDA_EMU_FULL /* configure --with-cuda=emu: a test build (docs/testing.md) */
    printf("CUDA:             the CPU's CUDA emulator (a test build, no GPU; docs/testing.md); %s; %s\n",
           ts_device_versions(v, sizeof v),
#else
    printf("CUDA:             compiled (sm_90 + PTX); %s; %s\n", ts_device_versions(v, sizeof v),
#endif
           ts_cuda_nn_versions(nn, sizeof nn));
#endif
    const int n = ts_device_count();
    if (n == 0) printf("GPUs:             none found (%s)\n", ts_device_absent_reason());
    for (int i = 0; i < n; i++) {
        ts_device_info d;
        if (ts_device_info_get(i, &d)) printf("GPU %d:            (%s)\n", i, ts_err_message());
        else
            printf("GPU %d:            %s, sm_%d%d, %d SMs, %.1f GiB (%.1f free), PCI %s\n", i, d.name, d.major, d.minor,
                   d.sms, d.mem_total / 1073741824.0, d.mem_free / 1073741824.0, d.pci);
    }
    printf("GPU engine:       %s\n", "every layer of src/nn runs on device tensors (cuDNN convolutions, CUDA kernels); "
                                    "train.engine = cuda trains the data-parallel UNet3D on them and runs tessera infer's forwards there (docs/gpu.md)");
}

int ts_cli_info(int argc, char **argv)
{
    int err = 0;
    ts_layout *L = NULL;
    ts_coll *c = NULL;
    if (ts_cli_wants_help(argc, argv)) {
        if (ts_cli_rank() == 0)
            printf("usage: tessera info\n\nPrints the build options, the MPI library, ranks, nodes and ranks per node,\n"
                   "the collective algorithms and the automatic choice, the counters that work here and the GPUs.\n");
        return 0;
    }
    if (argc > 1) return TS_ERR(TS_ERR_ARG, "info: unexpected argument '%s'", argv[1]);
    ts_layout_spec spec; /* every rank a replica: the collectives over the whole job */
    ts_layout_spec_default(TS_LAYOUT_TRAIN, (const int64_t[]){1, 1, 1}, 1, &spec);
    TS_CHECK(ts_layout_create(MPI_COMM_WORLD, &spec, &L));
    c = L->grad;
    /* what perf.papi_events=auto and the software events would count (collective: the ranks agree) */
    static const char *const one[] = {"step"};
    ts_perf *perf = NULL;
    char perf_line[2048] = "";
    TS_CHECK(ts_perf_create(MPI_COMM_WORLD, 1, one, "PAPI_TOT_CYC,PAPI_TOT_INS,PAPI_FP_OPS,PAPI_L3_TCM,perf::TASK-CLOCK,"
                            "perf::PAGE-FAULTS,perf::CONTEXT-SWITCHES", 1, &perf));
    ts_perf_describe(perf, perf_line, sizeof perf_line);
    ts_perf_destroy(&perf);
    if (ts_cli_rank() == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len, provided;
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, '\n');
        if (nl) *nl = '\0';
        MPI_Query_thread(&provided);
        printf("tessera %s\n", PACKAGE_VERSION);
        printf("build:            %s\n", TS_BUILD_OPTIONS);
        printf("MPI library:      %s\n", lib);
        printf("MPI thread level: %s\n", provided == MPI_THREAD_MULTIPLE ? "multiple" : "below multiple");
        printf("ranks:            %d\n", ts_coll_size(c));
        printf("nodes:            %d%s\n", ts_coll_nodes(c),
               getenv("TESSERA_RANKS_PER_NODE") ? " (faked by TESSERA_RANKS_PER_NODE)" : "");
        printf("ranks per node:   %d%s\n", ts_coll_local_size(c), ts_coll_equal_nodes(c) ? "" : " on node 0 (unequal nodes)");
        const ts_launch *l = ts_launch_current();
        printf("launch:           %s; scheduler %s%s%s%s", l->launcher, l->scheduler, l->job_id[0] ? ", job " : "",
               l->job_id, l->restarts ? " (requeued)" : "");
        if (l->allocated) printf(", %d task(s) allocated (%s)", l->allocated, l->allocated_from);
        printf("; OMP_NUM_THREADS %s", getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "unset");
        if (l->threads_auto && l->cpu_first >= 0)
            printf(": %d thread(s) per rank, each bound to its share of the node's CPUs (node 0's ranks: CPUs %s; "
                   "TESSERA_BIND=none turns it off)", l->threads_auto, l->binding);
        else if (l->threads_auto)
            printf(": 1 thread per rank (fewer CPUs than ranks on the node; not bound)");
        printf("\n");
        for (int k = 0; k < TS_COLL_KIND_COUNT; k++) {
            printf("%-17s ", k == 0 ? "collectives:" : "");
            printf("%-15s", ts_coll_kind_name((ts_coll_kind)k));
            for (const char *const *n = ts_coll_algorithms((ts_coll_kind)k); *n; n++) printf(" %s", *n);
            const char *why;
            const char *small = ts_coll_choice(c, (ts_coll_kind)k, 2, TS_FLOAT32, TS_OP_SUM, &why);
            const char *big = ts_coll_choice(c, (ts_coll_kind)k, (size_t)16 << 20, TS_FLOAT32, TS_OP_SUM, &why);
            printf("  (auto: %s at 8 B, %s at 64 MiB, by %s)\n", small, big, why);
        }
        char ev[1024];
        int n = ts_counters_probe(ts_counters_default, ev, sizeof ev);
#ifdef TS_HAVE_PAPI
        printf("counters (PAPI):  %s\n", n ? ev : (ts_counters_init() ? "none work here" : "PAPI failed to initialise"));
#else
        (void)n;
        printf("counters (PAPI):  not built (configure --with-papi)\n");
#endif
        printf("perf.json:        %s\n", perf_line);
        gpus();
    }
cleanup:
    ts_layout_destroy(&L);
    return err;
}
