/* The benchmarks' JSON files (`bench step`, its --layouts, `bench io`):
 * one writer for the three. */
#ifndef TS_BENCH_BENCH_JSON_H
#define TS_BENCH_BENCH_JSON_H

#include <cjson/cJSON.h>

/* Local. Writes o, pretty-printed with a newline after, to path (through
 * path.tmp and a rename, so a failed write leaves an earlier file whole)
 * and deletes o, also on error (o NULL: no memory). what names the file in
 * messages ("bench step"). Errors: TS_ERR_NOMEM, TS_ERR_IO naming path. */
int ts_bench_json_write(cJSON *o, const char *path, const char *what);

#endif
