/* tessera bench: dispatch to the benchmarks. Reads the first word and
 * prints the usage only; each benchmark's arguments are its own file's
 * (bench_coll.c, bench_step.c, bench_io.c, bench_peak.c,
 * bench_infer.c). */
#include "tsbuild.h"
#include "src/cli/cli.h"
#include "src/core/error.h"

#include <string.h>

int ts_cli_bench_coll(int argc, char **argv);
int ts_cli_bench_step(int argc, char **argv);
int ts_cli_bench_io(int argc, char **argv);
int ts_cli_bench_peak(int argc, char **argv);
int ts_cli_bench_infer(int argc, char **argv);

int ts_cli_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        if (ts_cli_rank() == 0)
            printf("usage: tessera bench coll [OPTIONS]   collectives: time, bandwidth, correctness, tuning\n"
                   "       tessera bench step CONFIG [...]  training steps of the configured model\n"
                   "       tessera bench io CONFIG [...]    the data path: whole-sample reads and the loader\n"
                   "       tessera bench peak [...]         the CPU's measured FMA, bf16 and memory limits\n"
                   "       tessera bench infer CONFIG [...] sliding-window inference of a scan, timed in parts\n");
        return argc < 2 ? TS_ERR(TS_ERR_ARG, "bench: which benchmark? (coll)") : 0;
    }
    if (!strcmp(argv[1], "coll")) return ts_cli_bench_coll(argc - 1, argv + 1);
    if (!strcmp(argv[1], "step")) return ts_cli_bench_step(argc - 1, argv + 1);
    if (!strcmp(argv[1], "io")) return ts_cli_bench_io(argc - 1, argv + 1);
    if (!strcmp(argv[1], "peak")) return ts_cli_bench_peak(argc - 1, argv + 1);
    if (!strcmp(argv[1], "infer")) return ts_cli_bench_infer(argc - 1, argv + 1);
    return TS_ERR(TS_ERR_ARG, "bench: unknown benchmark '%s' (coll, step, io, peak, infer)", argv[1]);
}
