/* dtype names; conversions are inline in dtype.h. Owns the names and the
 * aliases ts_dtype_parse accepts; no state, no allocation, no MPI. */
#include "tsbuild.h"
#include "src/core/dtype.h"

#include <strings.h>

static const char *const names[TS_DTYPE_COUNT] = {"float32", "float64", "bfloat16", "float16",
                                                  "int32",   "int64",   "uint8"};

const char *ts_dtype_name(ts_dtype t) { return (unsigned)t < TS_DTYPE_COUNT ? names[t] : "invalid"; }

int ts_dtype_parse(const char *s, ts_dtype *out)
{
    static const struct { const char *n; ts_dtype t; } alias[] = {
        {"f32", TS_FLOAT32}, {"fp32", TS_FLOAT32}, {"float", TS_FLOAT32}, {"f64", TS_FLOAT64},
        {"fp64", TS_FLOAT64}, {"double", TS_FLOAT64}, {"bf16", TS_BFLOAT16}, {"f16", TS_FLOAT16},
        {"fp16", TS_FLOAT16}, {"half", TS_FLOAT16}, {"i32", TS_INT32}, {"i64", TS_INT64},
        {"u8", TS_UINT8},
    };
    for (int i = 0; i < TS_DTYPE_COUNT; i++)
        if (!strcasecmp(s, names[i])) {
            *out = (ts_dtype)i;
            return 0;
        }
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (!strcasecmp(s, alias[i].n)) {
            *out = alias[i].t;
            return 0;
        }
    return 1;
}
