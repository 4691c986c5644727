/* Builds a small Medical Segmentation Decathlon task from the mricron-data
 * volumes (headers made by libnifti, through io/nifti.h): six cases of different sizes,
 * each a crop of Colin27 (ch2.nii.gz and the brain-extracted ch2bet.nii.gz
 * as two modalities of one 4-D image) with the AAL atlas grouped into
 * background / cerebrum / cerebellum as the label, some flipped along one
 * axis (the sform follows the crop and the flip), in NIfTI-1 and NIfTI-2,
 * .nii and .nii.gz. Also writes DIR/expected.txt: per case the image sum per
 * channel and the class voxel counts, computed here from the source volumes.
 * usage: mkmsd TEMPLATES_DIR OUT_TASK_DIR */
#include "tsbuild.h"
#include "io/nifti.h"
#include "src/core/error.h"

#include <nifti2_io.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    int64_t o[3], s[3];
    int flip; /* -1 none, else axis 0..2 (i, j, k) */
    int version;
    const char *ext;
} case_t;

static const case_t cases[] = {
    {{60, 80, 40}, {40, 48, 36}, -1, 1, ".nii.gz"},
    {{50, 60, 30}, {32, 40, 44}, 0, 1, ".nii"},
    {{70, 100, 60}, {48, 36, 40}, 1, 2, ".nii.gz"},
    {{40, 120, 20}, {36, 44, 32}, 2, 2, ".nii"},
    {{80, 40, 100}, {44, 32, 28}, -1, 1, ".nii.gz"},
    {{30, 70, 50}, {28, 52, 36}, 0, 1, ".nii.gz"},
};

static int group(double v)
{
    int a = (int)v;
    return a == 0 ? 0 : a <= 90 ? 1 : 2;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s TEMPLATES_DIR OUT_TASK_DIR\n", argv[0]);
        return 2;
    }
    char p[2048];
    ts_nifti *ch2 = NULL, *bet = NULL, *aal = NULL;
    snprintf(p, sizeof p, "%s/ch2.nii.gz", argv[1]);
    if (ts_nifti_read(p, &ch2)) goto fail;
    snprintf(p, sizeof p, "%s/ch2bet.nii.gz", argv[1]);
    if (ts_nifti_read(p, &bet)) goto fail;
    snprintf(p, sizeof p, "%s/aal.nii.gz", argv[1]);
    if (ts_nifti_read(p, &aal)) goto fail;
    const char *dir = argv[2];
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/imagesTr", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/labelsTr", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/expected.txt", dir);
    FILE *ex = fopen(p, "w");
    snprintf(p, sizeof p, "%s/dataset.json", dir);
    FILE *js = fopen(p, "w");
    if (!ex || !js) {
        perror(p);
        return 1;
    }
    const int nc = (int)(sizeof cases / sizeof cases[0]);
    fprintf(js, "{\n \"name\": \"Colin27 crops\",\n \"description\": \"test task made by tests/io/mkmsd\",\n"
                " \"tensorImageSize\": \"4D\",\n \"modality\": {\"0\": \"T1\", \"1\": \"T1_brain\"},\n"
                " \"labels\": {\"0\": \"background\", \"1\": \"cerebrum\", \"2\": \"cerebellum\"},\n"
                " \"numTraining\": %d, \"numTest\": 0,\n \"training\": [\n", nc);
    const int64_t NX = ch2->dim[0], NY = ch2->dim[1];
    for (int c = 0; c < nc; c++) {
        const case_t *k = &cases[c];
        const int64_t sx = k->s[0], sy = k->s[1], sz = k->s[2], nv = sx * sy * sz;
        float *img = calloc((size_t)(2 * nv), sizeof(float));
        uint8_t *lab = calloc((size_t)nv, 1);
        double sum[2] = {0, 0};
        long long cls[3] = {0, 0, 0};
        for (int64_t z = 0; z < sz; z++)
            for (int64_t y = 0; y < sy; y++)
                for (int64_t x = 0; x < sx; x++) {
                    int64_t q[3] = {x, y, z};
                    if (k->flip >= 0) q[k->flip] = k->s[k->flip] - 1 - q[k->flip];
                    int64_t src = ((k->o[2] + q[2]) * NY + (k->o[1] + q[1])) * NX + (k->o[0] + q[0]);
                    int64_t dst = (z * sy + y) * sx + x;
                    img[dst] = (float)ts_nifti_get(ch2, src);
                    img[nv + dst] = (float)ts_nifti_get(bet, src);
                    lab[dst] = (uint8_t)group(ts_nifti_get(aal, src));
                    sum[0] += img[dst];
                    sum[1] += img[nv + dst];
                    cls[lab[dst]]++;
                }
        /* new voxel v -> old voxel o + F v (+ (s-1) on the flipped axis) */
        double A[16] = {1, 0, 0, (double)k->o[0], 0, 1, 0, (double)k->o[1], 0, 0, 1, (double)k->o[2], 0, 0, 0, 1};
        if (k->flip >= 0) {
            A[5 * k->flip] = -1;
            A[4 * k->flip + 3] += (double)(k->s[k->flip] - 1);
        }
        ts_nifti_geom g = {.dim = {sx, sy, sz, 2}, .pixdim = {1, 1, 1}, .sform_code = ch2->sform_code};
        for (int r = 0; r < 4; r++)
            for (int cc = 0; cc < 4; cc++) {
                double v = 0;
                for (int t = 0; t < 4; t++) v += ch2->sform[4 * r + t] * A[4 * t + cc];
                g.sform[4 * r + cc] = v;
            }
        memcpy(g.qform, g.sform, sizeof g.qform);
        g.qform_code = 0;
        char ip[1024], lp[1024];
        snprintf(ip, sizeof ip, "%s/imagesTr/colin_%03d%s", dir, c, k->ext);
        snprintf(lp, sizeof lp, "%s/labelsTr/colin_%03d%s", dir, c, k->ext);
        if (ts_nifti_write(ip, &g, NIFTI_TYPE_FLOAT32, k->version, img)) goto fail;
        g.dim[3] = 1;
        if (ts_nifti_write(lp, &g, NIFTI_TYPE_UINT8, k->version, lab)) goto fail;
        fprintf(js, "  {\"image\": \"./imagesTr/colin_%03d%s\", \"label\": \"./labelsTr/colin_%03d%s\"}%s\n", c, k->ext,
                c, k->ext, c + 1 < nc ? "," : "");
        fprintf(ex, "colin_%03d %lld %lld %lld %.1f %.1f %lld %lld %lld\n", c, (long long)sz, (long long)sy,
                (long long)sx, sum[0], sum[1], cls[0], cls[1], cls[2]);
        free(img);
        free(lab);
    }
    fprintf(js, " ],\n \"test\": []\n}\n");
    fclose(js);
    fclose(ex);
    ts_nifti_free(&ch2);
    ts_nifti_free(&bet);
    ts_nifti_free(&aal);
    printf("wrote %d cases to %s\n", nc, dir);
    return 0;
fail:
    fprintf(stderr, "mkmsd: %s\n", ts_err_message());
    return 1;
}
