/* Unit test of the emergency state's change marker (src/train/emergency.h):
 * a file written while the parameters change must be partial (a header
 * without entries), however many changes the step makes before its commit.
 * Local SGD changes them twice in one step (the optimizer's update, then
 * the parameter average: src/train/gradpath.c); each marks the start of a
 * change, and a second mark once flipped the state back to "stable", so a
 * rank lost during the average wrote half-averaged parameters as a whole
 * step. */
#include "tsbuild.h"
#include "src/train/emergency.h"
#include "tests/tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the JSON header of dir/step-S/rank-0.bin ("" when unreadable) */
static void header(const char *dir, int step, char *buf, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/step-%d/rank-0.bin", dir, step);
    buf[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char magic[8];
    unsigned len = 0;
    if (fread(magic, 1, 8, f) == 8 && fread(&len, 4, 1, f) == 1 && len < n) {
        size_t k = fread(buf, 1, len, f);
        buf[k] = 0;
    }
    fclose(f);
}

int main(void)
{
    char dir[] = "/tmp/tessera-emergency.XXXXXX", h[4096];
    if (!mkdtemp(dir)) return 1;
    ts_arena *a = NULL;
    const int64_t shape[1] = {8};
    int idx;
    int err = ts_arena_create(&a);
    if (!err) err = ts_arena_add(a, "w", TS_PARAM, TS_FLOAT32, 1, shape, &idx);
    if (!err) err = ts_arena_alloc(a, 0);
    ts_emergency_cfg c = {.dir = dir, .arena = a, .e0 = 0, .e1 = 1, .world_rank = 0, .world_size = 1,
                          .grid = {0, 1, 0, 1, 0, 1}, .global_batch = 1};
    if (!err) err = ts_emergency_setup(&c);
    ts_ok(err == 0, "an arena of one tensor armed for emergency states");
    if (err) return ts_done();

    ts_emergency_commit(1, 1, 0, 0, 0);
    ts_emergency_write("test", "", 0);
    header(dir, 1, h, sizeof h);
    ts_ok(h[0] && !strstr(h, "\"partial\":true") && strstr(h, "/params/w"), "after a commit: a whole state");

    ts_emergency_begin_update();
    ts_emergency_write("test", "", 0);
    header(dir, 1, h, sizeof h);
    ts_ok(strstr(h, "\"partial\":true") != NULL, "during one change: partial");

    ts_emergency_commit(2, 2, 0, 0, 0);
    ts_emergency_begin_update(); /* the optimizer's update ... */
    ts_emergency_begin_update(); /* ... then local SGD's parameter average, in the same step */
    ts_emergency_write("test", "", 0);
    header(dir, 2, h, sizeof h);
    ts_ok(strstr(h, "\"partial\":true") != NULL && !strstr(h, "/params/w"),
          "during the second change of one step: still partial, no entries");

    ts_emergency_commit(3, 3, 0, 0, 0);
    ts_emergency_write("test", "", 0);
    header(dir, 3, h, sizeof h);
    ts_ok(h[0] && !strstr(h, "\"partial\":true") && strstr(h, "/params/w"), "after that step's commit: whole again");

    ts_emergency_teardown();
    ts_arena_destroy(&a);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) ts_diag("could not remove %s", dir);
    return ts_done();
}
