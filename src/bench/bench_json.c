/* The benchmarks' JSON writer; see bench_json.h. Owns turning a result's
 * cJSON tree into its file. Prints nothing: errors go up as TS_ERR codes. */
#include "tsbuild.h"
#include "src/bench/bench_json.h"
#include "src/core/error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ts_bench_json_write(cJSON *o, const char *path, const char *what)
{
    char *txt = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!txt) return TS_ERR(TS_ERR_NOMEM, "%s: JSON for %s", what, path);
    int err = 0;
    const size_t n = strlen(path) + 5;
    char *tmp = malloc(n);
    FILE *f = NULL;
    if (!tmp) TS_FAIL(TS_ERR_NOMEM, "%s: JSON for %s", what, path);
    snprintf(tmp, n, "%s.tmp", path);
    f = fopen(tmp, "w");
    if (!f) TS_FAIL(TS_ERR_IO, "%s: cannot write %s: %s", what, tmp, strerror(errno));
    const int bad = fprintf(f, "%s\n", txt) < 0;
    if (fclose(f) || bad) {
        remove(tmp);
        TS_FAIL(TS_ERR_IO, "%s: writing %s failed", what, tmp);
    }
    if (rename(tmp, path)) {
        err = TS_ERR(TS_ERR_IO, "%s: cannot rename %s to %s: %s", what, tmp, path, strerror(errno));
        remove(tmp);
    }
cleanup:
    free(tmp);
    free(txt);
    return err;
}
