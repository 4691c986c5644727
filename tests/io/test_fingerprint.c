/* Unit test of the fingerprint's pure parts (io/fingerprint.h,
 * io/preprocess.h) against answers worked out by hand: nnU-Net's target
 * spacing rule (median; an even count averages the middle two; the
 * anisotropic axis takes its 10th percentile only when both its spacing
 * and its size are anisotropic; raised above the other spacings when the
 * percentile falls below them), numpy's linear percentile, modality names,
 * the non-zero box over channels and the affine of a cropped grid. */
#include "tsbuild.h"
#include "io/fingerprint.h"
#include "io/preprocess.h"
#include "src/core/error.h"
#include "tests/tap.h"

#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static int near3(const double *a, double x, double y, double z)
{
    return fabs(a[0] - x) < 1e-12 && fabs(a[1] - y) < 1e-12 && fabs(a[2] - z) < 1e-12;
}

static void spacing_rule(void)
{
    double t[3];
    int ax, rc;
    /* isotropic-ish: the medians; 4 samples: (a + b) / 2 of the middle two */
    const double sp1[] = {1, 0.8, 0.8, 1.2, 0.9, 0.9, 1.1, 0.7, 0.7, 1.3, 1.0, 1.0};
    const int64_t sh1[] = {100, 120, 120, 90, 110, 110, 95, 130, 130, 105, 100, 100};
    rc = ts_fp_target_spacing(4, sp1, sh1, t, &ax);
    ts_ok(!rc && ax == -1 && near3(t, 1.15, 0.85, 0.85),
          "median per axis, even count (%g %g %g)", t[0], t[1], t[2]);
    /* anisotropic spacing and size: D takes the 10th percentile of 4, 5, 6 = 4.2 */
    const double sp2[] = {4, 1, 1, 5, 1, 1, 6, 1, 1};
    const int64_t sh2[] = {8, 40, 40, 7, 44, 40, 9, 42, 44};
    rc = ts_fp_target_spacing(3, sp2, sh2, t, &ax);
    ts_ok(!rc && ax == 0 && near3(t, 4.2, 1, 1),
          "anisotropic: the coarse axis at its 10th percentile (%g %g %g)", t[0], t[1], t[2]);
    /* anisotropic spacing but as many voxels along the axis: the median stays */
    const int64_t sh3[] = {40, 40, 40, 44, 44, 40, 42, 42, 44};
    rc = ts_fp_target_spacing(3, sp2, sh3, t, &ax);
    ts_ok(!rc && ax == -1 && near3(t, 5, 1, 1),
          "anisotropic spacing, isotropic size: the median (%g %g %g)", t[0], t[1], t[2]);
    /* along W (the last axis); the 10th percentile (1) below the others' 3: raised to 3 + 1e-5 */
    const double sp4[] = {3, 3, 1, 3, 3, 1, 3, 3, 10, 3, 3, 10, 3, 3, 10, 3, 3, 10, 3, 3, 10, 3, 3, 10, 3, 3, 10, 3, 3, 10};
    int64_t sh4[30];
    for (int i = 0; i < 10; i++) sh4[3 * i] = sh4[3 * i + 1] = 60, sh4[3 * i + 2] = 10;
    rc = ts_fp_target_spacing(10, sp4, sh4, t, &ax);
    ts_ok(!rc && ax == 2 && fabs(t[2] - (3 + 1e-5)) < 1e-12,
          "anisotropic, percentile below the other spacings: raised to them + 1e-5 (%.8g)", t[2]);
    const double bad[] = {1, 0, 1};
    const int64_t one[] = {10, 10, 10};
    ts_ok(ts_fp_target_spacing(1, bad, one, t, &ax) == TS_ERR_FORMAT, "a zero spacing is an error");
    ts_err_clear();
}

/* two samples of 100 voxels: 40 foreground in the first, 3 in the second;
 * channel 1 = 2 x channel 0; at most 10 values (5 per sample) */
static int accumulate(uint64_t seed, ts_fg_intensity *fi)
{
    ts_fp_acc *a = NULL;
    float img[2][200];
    uint8_t lab[2][100];
    memset(lab, 0, sizeof lab);
    for (int v = 0; v < 100; v++) {
        img[0][v] = (float)(1000 + 3 * v), img[0][100 + v] = 2 * img[0][v];
        img[1][v] = (float)(-v), img[1][100 + v] = 2 * img[1][v];
        lab[0][v] = v % 5 < 2;     /* 40 voxels */
        lab[1][v] = v == 7 || v == 50 || v == 99;
    }
    const double sp[3] = {1, 1, 1};
    const int64_t sh[3] = {4, 5, 5};
    TS_TRY(ts_fp_acc_create(2, 2, seed, 10, &a));
    for (int i = 0; i < 2; i++) {
        ts_fp_sample fs;
        memset(&fs, 0, sizeof fs);
        TS_TRY(ts_fp_acc_sample(a, i, img[i], lab[i], 100, &fs));
        ts_fp_acc_record(a, i, &fs, sp, sh);
    }
    int err = ts_fp_acc_finish(a, MPI_COMM_WORLD, fi);
    ts_fp_acc_destroy(&a);
    return err;
}

static void sampling(void)
{
    ts_fg_intensity x, y, z;
    int rc = accumulate(1, &x) || accumulate(1, &y) || accumulate(2, &z);
    double s = 0, ss = 0, mn = INFINITY, mx = -INFINITY;
    int n = 0;
    for (int v = 0; v < 100; v++)
        if (v % 5 < 2) s += 1000 + 3 * v, n++;
    s += -7 - 50 - 99;
    n += 3;
    const double m = s / n;
    for (int v = 0; v < 100; v++)
        if (v % 5 < 2) ss += (1000 + 3 * v - m) * (1000 + 3 * v - m), mn = fmin(mn, 1000 + 3 * v), mx = fmax(mx, 1000 + 3 * v);
    ss += (-7 - m) * (-7 - m) + (-50 - m) * (-50 - m) + (-99 - m) * (-99 - m);
    mn = -99;
    ts_ok(!rc && x.voxels == 43 && x.sampled == 8, "43 foreground voxels, 5 + 3 sampled (%lld, %lld)",
          (long long)x.voxels, (long long)x.sampled);
    ts_ok(fabs(x.mean[0] - m) < 1e-9 && fabs(x.std[0] - sqrt(ss / n)) < 1e-9 && x.min[0] == mn && x.max[0] == mx &&
              fabs(x.mean[1] - 2 * m) < 1e-9 && fabs(x.std[1] - 2 * sqrt(ss / n)) < 1e-9,
          "mean, std, min, max exact over all 43 (mean %g, std %g)", x.mean[0], x.std[0]);
    int same = 1, other = 0, twice = 1;
    for (int q = 0; q < TS_FP_NPCT; q++) {
        same &= x.pct[0][q] == y.pct[0][q] && x.pct[1][q] == y.pct[1][q];
        other |= x.pct[0][q] != z.pct[0][q];
        twice &= fabs(x.pct[1][q] - 2 * x.pct[0][q]) < 1e-9 && x.pct[0][q] >= mn && x.pct[0][q] <= mx;
    }
    ts_ok(same && other && twice, "percentiles: the same for a seed, others for another seed, the same voxels in "
          "both channels (50%%: %g / %g)", x.pct[0][1], z.pct[0][1]);
}

/* a 40 x 36 x 30 scan at 1.1 x 0.9 x 1.3 mm: a head (non-zero) holding two nested spheres */
static void make_scan(ts_sample *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "scan");
    const int64_t D = 40, H = 36, W = 30;
    s->shape[0] = 1, s->shape[1] = D, s->shape[2] = H, s->shape[3] = W;
    s->spacing[0] = 1.1, s->spacing[1] = 0.9, s->spacing[2] = 1.3;
    for (int k = 0; k < 16; k++) s->sform[k] = s->qform[k] = k % 5 == 0;
    s->image = calloc((size_t)(D * H * W), sizeof(float));
    s->label = calloc((size_t)(D * H * W), 1);
    for (int64_t z = 0; z < D; z++)
        for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++) {
                const double dz = (z - 21.3) * 1.1, dy = (y - 16.6) * 0.9, dx = (x - 14.2) * 1.3;
                const double r = sqrt(dz * dz + dy * dy + dx * dx);
                const int64_t v = (z * H + y) * W + x;
                s->image[v] = r < 14 ? (float)(50 + r) : 0;
                s->label[v] = (uint8_t)((r < 10) + (r < 5));
            }
}

static void inference_steps(void)
{
    ts_sample a, b;
    make_scan(&a);
    make_scan(&b);
    const int64_t nv = 40 * 36 * 30;
    uint8_t *orig = malloc((size_t)nv), *back = malloc((size_t)nv);
    memcpy(orig, a.label, (size_t)nv);
    ts_fp_prep prep;
    memset(&prep, 0, sizeof prep);
    prep.crop = 1;
    prep.spacing[0] = 1.37, prep.spacing[1] = 0.83, prep.spacing[2] = 1.61;
    int64_t box[6], lost = 0;
    const int64_t dhw[3] = {40, 36, 30};
    ts_prep_begin(&a); /* as convert does */
    ts_prep_nonzero_box(a.image, 1, dhw, box);
    int rc = ts_prep_crop(&a, box, &lost) || ts_prep_resample(&a, &prep, 3);
    rc = rc || ts_prep_scan(&prep, &b);
    int same = !rc && !memcmp(a.shape, b.shape, sizeof a.shape) && !memcmp(a.crop, b.crop, sizeof a.crop) &&
               !memcmp(a.sform, b.sform, sizeof a.sform) && !memcmp(a.spacing, b.spacing, sizeof a.spacing) &&
               !memcmp(a.image, b.image, sizeof(float) * (size_t)(a.shape[1] * a.shape[2] * a.shape[3]));
    ts_ok(same && lost == 0 && a.crop[0] > 0 && a.shape[1] != a.crop[3] - a.crop[0],
          "ts_prep_scan: the grid, affine and image of conversion (crop [%lld, %lld) along D, %lld stored)",
          (long long)a.crop[0], (long long)a.crop[3], (long long)a.shape[1]);
    rc = rc || ts_prep_undo_labels(&a, &prep, a.label, 3, back);
    int64_t agree = 0;
    for (int64_t v = 0; v < nv; v++) agree += back[v] == orig[v];
    ts_ok(!rc && agree >= 0.99 * nv, "labels cropped, resampled to 1.37 x 0.83 x 1.61 mm and back: %.2f %% agree",
          100.0 * agree / nv);
    free(orig);
    free(back);
    free(a.image);
    free(a.label);
    free(b.image);
    free(b.label);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    spacing_rule();
    sampling();
    inference_steps();
    double v[] = {5, 1, 4, 2, 3};
    ts_ok(fabs(ts_fp_percentile(v, 5, 10) - 1.4) < 1e-12 && fabs(ts_fp_percentile(v, 5, 50) - 3) < 1e-12,
          "numpy's linear percentile");
    char m[16];
    int ok = !ts_fp_parse_modality("ct", m) && !strcmp(m, "CT") && !ts_fp_parse_modality("MRI", m) && !strcmp(m, "MR");
    ok = ok && ts_fp_parse_modality("PET", m) == TS_ERR_ARG;
    ts_err_clear();
    ts_ok(ok, "modalities: ct -> CT, MRI -> MR, PET refused");
    /* the non-zero box over two channels of a 4 x 5 x 6 volume */
    float img[2 * 120];
    memset(img, 0, sizeof img);
    img[(1 * 5 + 2) * 6 + 3] = 1;           /* channel 0: (1, 2, 3) */
    img[120 + (2 * 5 + 4) * 6 + 1] = -2;    /* channel 1: (2, 4, 1) */
    int64_t box[6];
    const int64_t dhw[3] = {4, 5, 6};
    ts_prep_nonzero_box(img, 2, dhw, box);
    ts_ok(box[0] == 1 && box[1] == 2 && box[2] == 1 && box[3] == 3 && box[4] == 5 && box[5] == 4,
          "non-zero box over channels: [%lld %lld %lld, %lld %lld %lld)", (long long)box[0], (long long)box[1],
          (long long)box[2], (long long)box[3], (long long)box[4], (long long)box[5]);
    memset(img, 0, sizeof img);
    ts_prep_nonzero_box(img, 2, dhw, box);
    ts_ok(!box[0] && !box[1] && !box[2] && box[3] == 4 && box[4] == 5 && box[5] == 6, "all zero: the whole volume");
    /* the cropped grid's voxel 0 is the old grid's voxel lo */
    const double a[16] = {0, 0, 2.5, -7, 0.9, 0, 0, 3, 0, 1.1, 0, 11, 0, 0, 0, 1};
    const int64_t lo[3] = {2, 3, 5}; /* D, H, W = k, j, i */
    double b[16];
    ts_prep_affine_shift(a, lo, b);
    ts_ok(fabs(b[3] - (-7 + 2.5 * 2)) < 1e-12 && fabs(b[7] - (3 + 0.9 * 5)) < 1e-12 && fabs(b[11] - (11 + 1.1 * 3)) < 1e-12,
          "cropped affine: translation moved by A (i, j, k) of the box's corner");
    int r = ts_done();
    MPI_Finalize();
    return r;
}
