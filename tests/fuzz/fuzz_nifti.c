/* Fuzz target: the NIfTI reader (io/nifti.c, over niftilib and zlib). The
 * input is written as a .nii file (a gzip stream is inflated whatever the
 * name) and read with ts_nifti_read. Properties: no crash; a failure has a
 * message naming the file; no allocation beyond what the file holds (a
 * 348-byte header cannot make the reader allocate gigabytes: libFuzzer's
 * -malloc_limit_mb reports that as a crash); a volume that is read has
 * consistent dimensions, converts to float32 or fails naming the file, and
 * small ones survive ts_nifti_write and a second read unchanged. */
#include "tsbuild.h"
#include "io/nifti.h"
#include "tests/fuzz/fuzz_common.h"

#include <math.h>
#include <nifti1.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_dir();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[1024], out[1024];
    snprintf(path, sizeof path, "%s", fuzz_write("in.nii", data, size));
    snprintf(out, sizeof out, "%s/out.nii", fuzz_dir());
    ts_nifti *n = NULL, *back = NULL;
    ts_err_clear();
    int rc = ts_nifti_read(path, &n);
    FUZZ_ERROR_HAS_MESSAGE(rc);
    if (rc) {
        FUZZ_REQUIRE(strstr(ts_err_message(), path) != NULL, "the error does not name the file: %s", ts_err_message());
        FUZZ_REQUIRE(n == NULL, "a failed read returned a volume");
        return 0;
    }
    FUZZ_REQUIRE(n && n->data, "no volume");
    FUZZ_REQUIRE(n->dim[0] >= 1 && n->dim[1] >= 1 && n->dim[2] >= 1 && n->dim[3] >= 1, "dims %lld %lld %lld %lld",
                 (long long)n->dim[0], (long long)n->dim[1], (long long)n->dim[2], (long long)n->dim[3]);
    FUZZ_REQUIRE(n->nvox == n->dim[0] * n->dim[1] * n->dim[2] * n->dim[3], "nvox %lld", (long long)n->nvox);
    FUZZ_REQUIRE(n->nbyper >= 1 && n->nbyper <= 8, "nbyper %d", n->nbyper);
    /* the voxels came from the file: at most the (inflated) input */
    for (int k = 0; k < 3; k++) FUZZ_REQUIRE(n->pixdim[k] > 0 && isfinite(n->pixdim[k]), "pixdim %g", n->pixdim[k]);
    float *f = malloc((size_t)n->nvox * sizeof *f);
    FUZZ_REQUIRE(f, "malloc");
    ts_err_clear();
    int fr = ts_nifti_to_float(n, f);
    FUZZ_ERROR_HAS_MESSAGE(fr);
    if (fr) FUZZ_REQUIRE(strstr(ts_err_message(), path) != NULL, "the error does not name the file: %s", ts_err_message());
    else
        for (int64_t v = 0; v < n->nvox; v++) FUZZ_REQUIRE(isfinite(f[v]), "voxel %lld not finite", (long long)v);
    {
        const float zero = 0;
        int64_t replaced = -1;
        FUZZ_REQUIRE(ts_nifti_to_float_replace(n, f, &zero, &replaced) == 0, "replacing failed: %s", ts_err_message());
        FUZZ_REQUIRE((replaced > 0) == (fr != 0), "%lld replaced but the plain conversion %s", (long long)replaced,
                     fr ? "failed" : "passed");
    }
    (void)ts_nifti_get(n, 0);
    (void)ts_nifti_get(n, n->nvox - 1);
    if (!fr && n->nvox <= 4096) {
        /* write as float32 with the geometry read, then read back */
        ts_nifti_geom g;
        memset(&g, 0, sizeof g);
        for (int k = 0; k < 4; k++) g.dim[k] = n->dim[k];
        for (int k = 0; k < 3; k++) g.pixdim[k] = n->pixdim[k];
        memcpy(g.sform, n->sform, sizeof g.sform);
        memcpy(g.qform, n->qform, sizeof g.qform);
        g.sform_code = n->sform_code >= 1 && n->sform_code <= 4 ? n->sform_code : 0; /* NIfTI's codes */
        g.qform_code = 0; /* a qform must be rigid times the voxel sizes: not every header's is */
        for (int k = 0; k < 16; k++)
            if (!isfinite(g.sform[k])) g.sform_code = 0;
        if (!g.sform_code) {
            memset(g.sform, 0, sizeof g.sform);
            for (int k = 0; k < 4; k++) g.sform[5 * k] = k < 3 ? g.pixdim[k] : 1;
        }
        ts_err_clear();
        int wr = ts_nifti_write(out, &g, NIFTI_TYPE_FLOAT32, 1 + (int)(size & 1), f);
        FUZZ_ERROR_HAS_MESSAGE(wr);
        if (!wr) {
            FUZZ_REQUIRE(ts_nifti_read(out, &back) == 0, "a written volume does not read back: %s", ts_err_message());
            FUZZ_REQUIRE(back->nvox == n->nvox && !memcmp(back->data, f, (size_t)n->nvox * 4),
                         "the volume read back differs");
            for (int k = 0; k < 4; k++) FUZZ_REQUIRE(back->dim[k] == n->dim[k], "dim %d differs", k);
            ts_nifti_free(&back);
        }
        unlink(out);
    }
    free(f);
    ts_nifti_free(&n);
    ts_err_clear();
    return 0;
}
