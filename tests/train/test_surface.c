/* Surface metrics and largest-component post-processing (src/infer/surface.c):
 * known cases (identical maps, empty classes, concentric spheres, a shifted
 * cube, anisotropic spacing, the largest of three components), and with an
 * argument DIR the label maps listed in DIR/cases.txt (lines "name D H W
 * sd sh sw tol cls"; DIR/name.pred.raw and DIR/name.ref.raw, uint8) whose
 * HD95 and NSD it prints one line each, "name hd95 nsd", for
 * tests/train/surface_ref.py to compare with SciPy. */
#include "tsbuild.h"
#include "src/core/error.h"
#include "src/infer/surface.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void sphere(uint8_t *l, const int64_t n[3], double cz, double cy, double cx, double r, const double sp[3],
                   int cls)
{
    for (int64_t z = 0; z < n[0]; z++)
        for (int64_t y = 0; y < n[1]; y++)
            for (int64_t x = 0; x < n[2]; x++) {
                double dz = (z - cz) * sp[0], dy = (y - cy) * sp[1], dx = (x - cx) * sp[2];
                if (dz * dz + dy * dy + dx * dx <= r * r) l[(z * n[1] + y) * n[2] + x] = (uint8_t)cls;
            }
}

static void box(uint8_t *l, const int64_t n[3], const int64_t lo[3], const int64_t hi[3], int cls)
{
    for (int64_t z = lo[0]; z < hi[0]; z++)
        for (int64_t y = lo[1]; y < hi[1]; y++)
            for (int64_t x = lo[2]; x < hi[2]; x++) l[(z * n[1] + y) * n[2] + x] = (uint8_t)cls;
}

static int from_files(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/cases.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "test_surface: cannot open %s\n", path);
        return 1;
    }
    char name[256];
    int64_t n[3];
    double sp[3], tol;
    int cls;
    while (fscanf(f, "%255s %ld %ld %ld %lf %lf %lf %lf %d", name, &n[0], &n[1], &n[2], &sp[0], &sp[1], &sp[2],
                  &tol, &cls) == 9) {
        size_t nv = (size_t)(n[0] * n[1] * n[2]);
        uint8_t *p = malloc(nv), *r = malloc(nv);
        FILE *a, *b;
        snprintf(path, sizeof path, "%s/%s.pred.raw", dir, name);
        a = fopen(path, "rb");
        snprintf(path, sizeof path, "%s/%s.ref.raw", dir, name);
        b = fopen(path, "rb");
        if (!p || !r || !a || !b || fread(p, 1, nv, a) != nv || fread(r, 1, nv, b) != nv) {
            fprintf(stderr, "test_surface: cannot read case %s in %s\n", name, dir);
            return 1;
        }
        fclose(a), fclose(b);
        ts_surface_metrics m;
        if (ts_surface_metrics_class(p, r, n, sp, cls, tol, &m)) {
            fprintf(stderr, "test_surface: %s: %s\n", name, ts_err_message());
            return 1;
        }
        printf("%s %.9g %.9g\n", name, m.hd95, m.nsd);
        free(p), free(r);
    }
    fclose(f);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1) return from_files(argv[1]);
    int64_t n[3] = {40, 40, 40};
    size_t nv = 40 * 40 * 40;
    double iso[3] = {1, 1, 1};
    uint8_t *a = calloc(nv, 1), *b = calloc(nv, 1);
    ts_surface_metrics m;

    sphere(a, n, 20, 20, 20, 10, iso, 1);
    memcpy(b, a, nv);
    int e = ts_surface_metrics_class(a, b, n, iso, 1, 1.0, &m);
    ts_ok(!e && m.hd95 == 0 && m.nsd == 1 && m.n_pred > 0,
          "identical spheres: HD95 0, NSD 1 (%lld surface voxels)", (long long)m.n_pred);
    ts_ok(!ts_surface_metrics_class(a, b, n, iso, 2, 1.0, &m) && isnan(m.hd95) && isnan(m.nsd),
          "a class absent from both: NaN");
    memset(b, 0, nv);
    ts_ok(!ts_surface_metrics_class(a, b, n, iso, 1, 1.0, &m) && isinf(m.hd95) && m.nsd == 0,
          "a class absent from the reference: HD95 inf, NSD 0");

    /* concentric spheres of radius 10 and 14 mm: every distance is about 4 */
    sphere(b, n, 20, 20, 20, 14, iso, 1);
    e = ts_surface_metrics_class(a, b, n, iso, 1, 1.0, &m);
    ts_ok(!e && fabs(m.hd95 - 4) <= 1 && m.nsd < 0.05, "spheres of radius 10 and 14: HD95 %.3f mm (4 +- 1), NSD %.3f",
          m.hd95, m.nsd);
    e = ts_surface_metrics_class(a, b, n, iso, 1, 5.0, &m);
    ts_ok(!e && m.nsd == 1, "the same at tolerance 5 mm: NSD %.3f = 1", m.nsd);

    /* a cube shifted by 3 voxels along W with spacing 2 mm there: 6 mm */
    memset(a, 0, nv), memset(b, 0, nv);
    int64_t lo[3] = {10, 10, 10}, hi[3] = {30, 30, 30}, lo2[3] = {10, 10, 13}, hi2[3] = {30, 30, 33};
    box(a, n, lo, hi, 2);
    box(b, n, lo2, hi2, 2);
    double an[3] = {1, 1, 2};
    e = ts_surface_metrics_class(a, b, n, an, 2, 1.0, &m);
    ts_ok(!e && fabs(m.hd95 - 6) < 1e-9, "cubes 3 voxels apart along W at 2 mm spacing: HD95 %.4f = 6 mm", m.hd95);
    ts_ok(ts_surface_metrics_class(a, b, n, (double[3]){1, 0, 1}, 2, 1.0, &m) == TS_ERR_ARG,
          "zero spacing refused: %s", ts_err_message());

    /* largest component: three blobs of 27, 8 and 1 voxels (26-connected
     * diagonal neighbours count as one component) */
    memset(a, 0, nv);
    box(a, n, (int64_t[3]){2, 2, 2}, (int64_t[3]){5, 5, 5}, 1);
    box(a, n, (int64_t[3]){20, 20, 20}, (int64_t[3]){22, 22, 22}, 1);
    a[(22 * 40 + 22) * 40 + 22] = 1; /* touches the 8-voxel cube at a corner */
    a[(35 * 40 + 35) * 40 + 35] = 1;
    a[(30 * 40 + 2) * 40 + 2] = 3; /* another class: untouched */
    int64_t removed = -1;
    e = ts_keep_largest_component(a, n, 1, &removed);
    int64_t left = 0, other = 0;
    for (size_t i = 0; i < nv; i++) left += a[i] == 1, other += a[i] == 3;
    ts_ok(!e && removed == 10 && left == 27 && other == 1,
          "largest component kept: %lld voxels removed (the corner-joined 9 and the single one), 27 left, other "
          "classes untouched",
          (long long)removed);
    free(a), free(b);
    return ts_done();
}
