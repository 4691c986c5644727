/* Fuzz target: the JSON readers. The input is one JSON text, handed to
 * every reader of JSON files in tessera: the tuning table
 * (collectives/tuning.c, then used by the automatic algorithm choice), the
 * α-β models stored in it (collectives/cost_model.c), the calibration of
 * `tessera plan` (src/plan/plan.c), an MSD task's dataset.json (io/convert.c;
 * the folder also holds a valid 4x4x4 image and label, img.nii and lab.nii,
 * so an input may convert) and a checkpoint's manifest.json
 * (io/checkpoint.c, beside a state.h5 of 100 bytes). Properties: no crash;
 * failures carry a message; a loaded tuning table gives only registered
 * algorithms; loaded models and calibrations hold what the readers
 * promise (finite rates). */
#include "tsbuild.h"
#include "collectives/coll.h"
#include "collectives/cost_model.h"
#include "io/checkpoint.h"
#include "io/convert.h"
#include "io/nifti.h"
#include "src/plan/plan.h"
#include "tests/fuzz/fuzz_common.h"

#include <math.h>
#include <nifti1.h>

static ts_coll *coll;
static char msd_dir[1024], ckpt_dir[1024], step_dir[1100];

static void mkdir_or_die(const char *p)
{
    if (mkdir(p, 0777) && errno != EEXIST) {
        perror(p);
        abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_mpi_init();
    if (ts_coll_create(MPI_COMM_SELF, NULL, &coll)) {
        fprintf(stderr, "fuzz_json: %s\n", ts_err_message());
        abort();
    }
    /* an MSD folder with one valid pair */
    snprintf(msd_dir, sizeof msd_dir, "%s/msd", fuzz_dir());
    mkdir_or_die(msd_dir);
    ts_nifti_geom g = {.dim = {4, 4, 4, 1}, .pixdim = {1, 1, 1}, .sform = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1},
                       .sform_code = 1};
    float img[64];
    uint8_t lab[64];
    for (int v = 0; v < 64; v++) {
        img[v] = (float)(v % 7);
        lab[v] = v % 3 == 0;
    }
    char p[1100];
    snprintf(p, sizeof p, "%s/img.nii", msd_dir);
    if (ts_nifti_write(p, &g, NIFTI_TYPE_FLOAT32, 1, img)) abort();
    snprintf(p, sizeof p, "%s/lab.nii", msd_dir);
    if (ts_nifti_write(p, &g, NIFTI_TYPE_UINT8, 1, lab)) abort();
    /* a checkpoint folder: state.h5 of 100 bytes, the manifest from the input */
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", fuzz_dir());
    mkdir_or_die(ckpt_dir);
    snprintf(step_dir, sizeof step_dir, "%s/step-5", ckpt_dir);
    mkdir_or_die(step_dir);
    snprintf(p, sizeof p, "%s/state.h5", step_dir);
    FILE *f = fopen(p, "wb");
    char zeros[100] = {0};
    if (!f || fwrite(zeros, 1, 100, f) != 100 || fclose(f)) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[1024], p[1200];
    snprintf(path, sizeof path, "%s", fuzz_write("table.json", data, size));

    /* tuning table, then the choice it drives */
    ts_err_clear();
    int rc = ts_coll_tuning_load(coll, path);
    FUZZ_ERROR_HAS_MESSAGE(rc);
    for (int k = 0; k < TS_COLL_KIND_COUNT; k++)
        for (size_t count = 0; count < ((size_t)1 << 40); count = count ? count * 37 : 1) {
            const char *why = "";
            const char *a = ts_coll_choice(coll, (ts_coll_kind)k, count, TS_FLOAT32, TS_OP_SUM, &why);
            FUZZ_REQUIRE(a != NULL, "no choice");
            int known = 0;
            for (const char *const *n = ts_coll_algorithms((ts_coll_kind)k); *n; n++) known |= !strcmp(*n, a);
            FUZZ_REQUIRE(known, "the choice '%s' is not a %s algorithm", a, ts_coll_kind_name((ts_coll_kind)k));
        }

    /* the models stored in a tuning table */
    {
        ts_coll_fit *fits = NULL;
        int n = -1;
        ts_err_clear();
        rc = ts_coll_model_load(path, &fits, &n);
        FUZZ_ERROR_HAS_MESSAGE(rc);
        if (!rc) {
            FUZZ_REQUIRE(n >= 0, "n = %d", n);
            const char *algo = NULL;
            for (int nodes = 1; nodes <= 2; nodes++)
                for (int ranks = 1; ranks <= 64; ranks *= 4) (void)ts_coll_model_best(fits, n, "allreduce", nodes, ranks, 1e6, &algo);
        }
        free(fits);
    }

    /* a plan calibration */
    {
        ts_plan_calib c;
        ts_err_clear();
        rc = ts_plan_calib_load(path, &c);
        FUZZ_ERROR_HAS_MESSAGE(rc);
        if (!rc) FUZZ_REQUIRE(c.threads >= 1, "threads %d", c.threads);
    }

    /* an MSD task's dataset.json */
    {
        char out[1200];
        snprintf(p, sizeof p, "%s/dataset.json", msd_dir);
        FILE *f = fopen(p, "wb");
        FUZZ_REQUIRE(f && (!size || fwrite(data, 1, size, f) == size) && !fclose(f), "write dataset.json");
        snprintf(out, sizeof out, "%s/out.h5", fuzz_dir());
        ts_convert_opts o = {.shards = 1 + (int)(size % 2), .chunk = 4};
        ts_err_clear();
        rc = ts_convert_msd(MPI_COMM_SELF, msd_dir, &o, out);
        FUZZ_ERROR_HAS_MESSAGE(rc);
        if (rc) FUZZ_REQUIRE(access(out, F_OK) != 0, "a failed conversion left %s", out);
        unlink(out);
        for (int s = 0; s < 2; s++) { /* shards next to the manifest */
            char sh[1300];
            snprintf(sh, sizeof sh, "%s/out-shard-%05d-of-%05d.h5", fuzz_dir(), s, 2);
            unlink(sh);
        }
    }

    /* a checkpoint manifest */
    {
        snprintf(p, sizeof p, "%s/manifest.json", step_dir);
        FILE *f = fopen(p, "wb");
        FUZZ_REQUIRE(f && (!size || fwrite(data, 1, size, f) == size) && !fclose(f), "write manifest.json");
        (void)ts_ckpt_is_complete(step_dir);
        char latest[2048];
        int64_t step = -1;
        if (ts_ckpt_latest(ckpt_dir, latest, sizeof latest, &step) == 0)
            FUZZ_REQUIRE(step == 5, "latest checkpoint step %lld", (long long)step);
    }
    ts_err_clear();
    return 0;
}
