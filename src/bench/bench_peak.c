/* `tessera bench peak` (bench_peak.h): every rank's measurement at once, the
 * sums over the job, the JSON. The measuring is src/nn/peak.c's. */
#include "tsbuild.h"
#include "src/bench/bench_peak.h"
#include "src/bench/bench_json.h"
#include "src/core/error.h"

#include <string.h>

int ts_bench_peak_run(MPI_Comm comm, int threads, double seconds, ts_bench_peak_result *r)
{
    memset(r, 0, sizeof *r);
    TS_TRY(ts_err_agree(comm, ts_cpu_peak_measure(threads, seconds, &r->p)));
    double sum[4] = {r->p.fp32_gflops, r->p.bf16_gflops, r->p.triad_GBps, r->p.amx_gflops};
    TS_MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, sum, 4, MPI_DOUBLE, MPI_SUM, comm));
    TS_MPI_TRY(MPI_Comm_size(comm, &r->ranks));
    r->sum_fp32_gflops = sum[0];
    r->sum_bf16_gflops = sum[1];
    r->sum_triad_GBps = sum[2];
    r->sum_amx_gflops = sum[3];
    return 0;
}

int ts_bench_peak_write_json(const char *path, const ts_bench_peak_result *r)
{
    const ts_cpu_peak *p = &r->p;
    cJSON *o = cJSON_CreateObject();
    if (o) {
        cJSON_AddNumberToObject(o, "threads", p->threads);
        cJSON_AddStringToObject(o, "fp32_isa", p->fp32_isa);
        cJSON_AddStringToObject(o, "bf16_isa", p->bf16_isa);
        cJSON_AddNumberToObject(o, "fp32_gflops_1", p->fp32_gflops_1);
        cJSON_AddNumberToObject(o, "fp32_gflops", p->fp32_gflops);
        cJSON_AddNumberToObject(o, "bf16_gflops_1", p->bf16_gflops_1);
        cJSON_AddNumberToObject(o, "bf16_gflops", p->bf16_gflops);
        cJSON_AddNumberToObject(o, "amx_gflops_1", p->amx_gflops_1);
        cJSON_AddNumberToObject(o, "amx_gflops", p->amx_gflops);
        cJSON_AddNumberToObject(o, "triad_GBps_1", p->triad_GBps_1);
        cJSON_AddNumberToObject(o, "triad_GBps", p->triad_GBps);
        cJSON_AddNumberToObject(o, "triad_mb", p->triad_mb);
        cJSON_AddNumberToObject(o, "seconds", p->seconds);
        cJSON_AddNumberToObject(o, "ranks", r->ranks);
        cJSON_AddNumberToObject(o, "sum_fp32_gflops", r->sum_fp32_gflops);
        cJSON_AddNumberToObject(o, "sum_bf16_gflops", r->sum_bf16_gflops);
        cJSON_AddNumberToObject(o, "sum_amx_gflops", r->sum_amx_gflops);
        cJSON_AddNumberToObject(o, "sum_triad_GBps", r->sum_triad_GBps);
    }
    return ts_bench_json_write(o, path, "bench peak");
}
