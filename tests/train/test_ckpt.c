/* MPI test of checkpoint directories: save on every rank's call (rank 0
 * writes), find the newest complete one, load it back bit for bit, keep
 * only the newest K, skip temporary and truncated ones, and fail on every
 * rank without touching older checkpoints when the target cannot be written. */
#include "tsbuild.h"
#include "io/checkpoint.h"
#include "src/core/error.h"
#include "tests/tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int all(int c)
{
    int r;
    MPI_Allreduce(&c, &r, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return r;
}

int main(int argc, char **argv)
{
    int provided, rank, p;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    ts_err_set_rank(rank);
    ts_tap_quiet = rank != 0;
    char dir[256];
    if (rank == 0) {
        snprintf(dir, sizeof dir, "%s/tessera-ckpt-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (!mkdtemp(dir)) MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    float w[24];
    int64_t nbt = 7, shape[2] = {4, 6};
    ts_ckpt_item items[3];
    memset(items, 0, sizeof items);
    snprintf(items[0].name, sizeof items[0].name, "/params/enc0.conv1.weight");
    items[0].t = ts_tensor_view(w, TS_FLOAT32, 2, shape);
    snprintf(items[1].name, sizeof items[1].name, "/params/enc0.norm1.num_batches_tracked");
    items[1].t = ts_tensor_view(&nbt, TS_INT64, 0, NULL);
    float mom[24];
    snprintf(items[2].name, sizeof items[2].name, "/optim/momentum_buffer/enc0.conv1.weight");
    items[2].t = ts_tensor_view(mom, TS_FLOAT32, 2, shape);
    int e = 0;
    for (int step = 1; step <= 4 && !e; step++) {
        for (int i = 0; i < 24; i++) {
            w[i] = (float)(step * 100 + i);
            mom[i] = -w[i];
        }
        ts_ckpt_meta m = {.step = step * 10, .epoch = step, .sampler_position = step * 4, .seed = 42, .ranks = p,
                          .config_hash = 0xabcdefull, .config = "[train]\nlr = 0.1\n"};
        e = ts_ckpt_save(MPI_COMM_WORLD, dir, items, 3, &m, 2, NULL, 0);
    }
    ts_ok(all(e == 0), "4 checkpoints saved");
    char path[4096];
    int64_t step = -1;
    int rc = ts_ckpt_latest(dir, path, sizeof path, &step);
    ts_ok(all(rc == 0 && step == 40 && strstr(path, "step-40") != NULL), "newest complete checkpoint is step-40 (%s)", path);
    char p20[4096], p30[4096];
    snprintf(p20, sizeof p20, "%s/step-20", dir);
    snprintf(p30, sizeof p30, "%s/step-30", dir);
    struct stat st;
    ts_ok(all(stat(p20, &st) != 0 && stat(p30, &st) == 0), "ckpt.keep = 2 removed the older ones");
    memset(w, 0, sizeof w);
    memset(mom, 0, sizeof mom);
    nbt = 0;
    ts_ckpt_meta m2;
    e = ts_ckpt_load(path, items, 3, &m2);
    int same = !e && nbt == 7 && m2.step == 40 && m2.sampler_position == 16 && m2.config_hash == 0xabcdefull;
    for (int i = 0; i < 24; i++) same &= w[i] == (float)(400 + i) && mom[i] == -w[i];
    ts_ok(all(same), "load gives back tensors and meta bit for bit");
    /* a temporary (crashed) and a truncated checkpoint are not "latest" */
    if (rank == 0) {
        char t[4096];
        snprintf(t, sizeof t, "%s/.tmp-step-90", dir);
        mkdir(t, 0777);
        snprintf(t, sizeof t, "%s/step-50", dir);
        mkdir(t, 0777);
        char f[4200];
        snprintf(f, sizeof f, "%s/state.h5", t);
        FILE *x = fopen(f, "w");
        fputs("truncated", x);
        fclose(x);
        snprintf(f, sizeof f, "%s/manifest.json", t);
        x = fopen(f, "w");
        fputs("{\"files\": {\"state.h5\": 123456}}", x);
        fclose(x);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    rc = ts_ckpt_latest(dir, path, sizeof path, &step);
    ts_ok(all(rc == 0 && step == 40), "temporary and truncated checkpoints are skipped");
    char bad[4096];
    snprintf(bad, sizeof bad, "%s/step-50", dir);
    e = ts_ckpt_load(bad, items, 3, NULL);
    ts_ok(all(e == TS_ERR_FORMAT && strstr(ts_err_message(), "not a complete checkpoint")), "loading a truncated one is an error");
    /* a target that cannot be written: error on every rank, old ones intact */
    ts_ckpt_meta m = {.step = 60, .ranks = p};
    e = ts_ckpt_save(MPI_COMM_WORLD, "/proc/tessera-cannot-write", items, 3, &m, 2, NULL, 0);
    ts_ok(all(e != 0), "unwritable checkpoint directory: error on every rank (%s)", ts_err_message());
    /* a missing dataset is named */
    snprintf(items[2].name, sizeof items[2].name, "/optim/exp_avg/enc0.conv1.weight");
    e = ts_ckpt_load(path, items, 3, NULL);
    ts_ok(all(e == TS_ERR_FORMAT && strstr(ts_err_message(), "/optim/exp_avg/enc0.conv1.weight")), "missing dataset named");
    if (rank == 0) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd)) {}
    }
    rc = ts_done();
    MPI_Finalize();
    return rc;
}
