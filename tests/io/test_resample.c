/* Unit test of integer-factor resampling: sizes, block means at the borders,
 * label majority, the coarse affine (a coarse voxel at the world position of
 * its block's centre) and labels back on the fine grid; and of any-factor
 * resampling: sizes for a target spacing, trilinear exactness on a linear
 * ramp, the resampled affine, and a smooth label map taken to a non-integer
 * spacing and back agreeing with itself on >= 99% of voxels; the cubic
 * B-spline (interpolating, closer than trilinear on a smooth field, zero
 * background kept) and nnU-Net's separate axis (issue [11]). */
#include "tsbuild.h"
#include "io/resample.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>

static void any_factor(void)
{
    ts_ok(ts_resample_size_to(181, 1.0, 1.37) == 132 && ts_resample_size_to(3, 1.0, 10.0) == 1 &&
              ts_resample_size_to(40, 0.83, 0.5) == 66,
          "sizes for a target spacing: round(n sp_in / sp_out), at least 1");
    /* trilinear reproduces a linear ramp wherever its taps lie inside */
    const int64_t in[3] = {20, 17, 23}, out[3] = {29, 11, 31};
    int64_t nin = in[0] * in[1] * in[2], nout = out[0] * out[1] * out[2];
    float *v = malloc(sizeof(float) * (size_t)nin), *r = malloc(sizeof(float) * (size_t)nout);
    for (int64_t z = 0; z < in[0]; z++)
        for (int64_t y = 0; y < in[1]; y++)
            for (int64_t x = 0; x < in[2]; x++) v[(z * in[1] + y) * in[2] + x] = (float)(0.5 * z - 1.25 * y + 2.0 * x + 3);
    ts_resample_linear(1, in, v, out, r);
    double maxerr = 0;
    int64_t inside = 0;
    for (int64_t z = 0; z < out[0]; z++)
        for (int64_t y = 0; y < out[1]; y++)
            for (int64_t x = 0; x < out[2]; x++) {
                double p[3] = {(z + 0.5) * in[0] / out[0] - 0.5, (y + 0.5) * in[1] / out[1] - 0.5,
                               (x + 0.5) * in[2] / out[2] - 0.5};
                if (p[0] < 0 || p[1] < 0 || p[2] < 0 || p[0] > in[0] - 1 || p[1] > in[1] - 1 || p[2] > in[2] - 1)
                    continue;
                inside++;
                maxerr = fmax(maxerr, fabs(r[(z * out[1] + y) * out[2] + x] - (0.5 * p[0] - 1.25 * p[1] + 2.0 * p[2] + 3)));
            }
    ts_ok(inside > nout / 2 && maxerr < 1e-4, "trilinear: a linear ramp reproduced at %lld voxels (max error %.2g)",
          (long long)inside, maxerr);
    /* the resampled affine maps output voxel o where the input's (o + 0.5) r - 0.5 lies */
    double a[16] = {0.9, 0.1, 0, -10, 0, 1.1, 0.2, 5, 0.05, 0, 1.3, 7, 0, 0, 0, 1}, b[16], err = 0;
    ts_resample_affine_to(a, in, out, b);
    double oi[3] = {4, 7, 2}; /* (i, j, k) = (W, H, D) indices */
    double fi[3] = {(oi[0] + 0.5) * in[2] / out[2] - 0.5, (oi[1] + 0.5) * in[1] / out[1] - 0.5,
                    (oi[2] + 0.5) * in[0] / out[0] - 0.5};
    for (int row = 0; row < 3; row++) {
        double pc = b[row * 4 + 3], pf = a[row * 4 + 3];
        for (int j = 0; j < 3; j++) pc += b[row * 4 + j] * oi[j], pf += a[row * 4 + j] * fi[j];
        err = fmax(err, fabs(pc - pf));
    }
    ts_ok(err < 1e-9, "any-factor affine: output voxel centres keep their world position (error %.2g)", err);
    free(v), free(r);
    /* a smooth label map (nested ellipsoids and a slab) to spacing 1.37 x 0.83 x 1.61 mm and back */
    const int64_t n[3] = {60, 50, 44};
    const double sp[3] = {1, 1, 1}, to[3] = {1.37, 0.83, 1.61};
    int64_t m[3], nv = n[0] * n[1] * n[2];
    for (int k = 0; k < 3; k++) m[k] = ts_resample_size_to(n[k], sp[k], to[k]);
    uint8_t *l = malloc((size_t)nv), *c = malloc((size_t)(m[0] * m[1] * m[2])), *back = malloc((size_t)nv);
    for (int64_t z = 0; z < n[0]; z++)
        for (int64_t y = 0; y < n[1]; y++)
            for (int64_t x = 0; x < n[2]; x++) {
                double dz = (z - 30) / 22.0, dy = (y - 24) / 18.0, dx = (x - 21) / 15.0, q = dz * dz + dy * dy + dx * dx;
                l[(z * n[1] + y) * n[2] + x] = (uint8_t)(q < 0.3 ? 2 : q < 1 ? 1 : (z > 52 && y < 30 ? 3 : 0));
            }
    for (int nearest = 0; nearest < 2; nearest++) {
        ts_resample_labels(l, n, 4, m, nearest, -1, c);
        ts_resample_labels(c, m, 4, n, nearest, -1, back);
        int64_t same = 0, present[4] = {0};
        for (int64_t i = 0; i < nv; i++) same += back[i] == l[i];
        for (int64_t i = 0; i < m[0] * m[1] * m[2]; i++) present[c[i]]++;
        /* one-hot linear, the default, must keep 99%; nearest (a coarser
         * rule, for speed) 98% */
        double need = nearest ? 0.98 : 0.99;
        ts_ok((double)same / (double)nv >= need && present[1] && present[2] && present[3],
              "labels (%s) to %lldx%lldx%lld at 1.37x0.83x1.61 mm and back: %.4f of voxels agree (>= %.2f)",
              nearest ? "nearest" : "one-hot linear", (long long)m[0], (long long)m[1], (long long)m[2],
              (double)same / (double)nv, need);
    }
    free(l), free(c), free(back);
}

/* cubic B-spline and nnU-Net's separate axis (issue [11]; tests/io/fingerprint.sh checks against SciPy) */
static void cubic(void)
{
    const double iso[3] = {1, 1, 1}, dz[3] = {4, 1, 1}, hw[3] = {1, 3.5, 3.5}, w3[3] = {1, 1, 3.1}, w29[3] = {1, 1, 2.9};
    ts_ok(ts_resample_separate_axis(dz, iso) == 0 && ts_resample_separate_axis(iso, w3) == 2 &&
              ts_resample_separate_axis(hw, iso) == -1 && ts_resample_separate_axis(w29, iso) == -1 &&
              ts_resample_separate_axis(iso, iso) == -1,
          "separate axis: the one coarsest axis beyond 3x the finest, from the input spacing, else the output's");
    const int64_t in[3] = {18, 21, 16}, same[3] = {18, 21, 16}, out[3] = {25, 13, 23};
    const int64_t nin = in[0] * in[1] * in[2], nout = out[0] * out[1] * out[2];
    float *v = malloc(sizeof(float) * (size_t)nin), *r = malloc(sizeof(float) * (size_t)nin);
    float *c = malloc(sizeof(float) * (size_t)nout), *l = malloc(sizeof(float) * (size_t)nout);
    /* a smooth field on a zero background (a ball of radius 7) */
    for (int64_t z = 0; z < in[0]; z++)
        for (int64_t y = 0; y < in[1]; y++)
            for (int64_t x = 0; x < in[2]; x++) {
                double q = (z - 8.6) * (z - 8.6) + (y - 10.2) * (y - 10.2) + (x - 7.7) * (x - 7.7);
                v[(z * in[1] + y) * in[2] + x] = q < 49 ? (float)(2 + sin(0.45 * z) * cos(0.3 * y) + 0.02 * x * z) : 0;
            }
    /* on the same grid the spline interpolates: every sample comes back (this needs the prefilter) */
    int e = ts_resample_image(1, in, v, same, TS_INTERP_CUBIC, -1, r);
    double d = 0;
    for (int64_t i = 0; i < nin; i++) d = fmax(d, fabs(r[i] - v[i]));
    ts_ok(!e && d < 1e-5, "cubic: the samples come back on the same grid (max error %.2g)", d);
    /* at a non-integer factor: 0 where every trilinear tap is 0 (the ball's outside), not elsewhere */
    e = e || ts_resample_image(1, in, v, out, TS_INTERP_CUBIC, -1, c);
    int64_t zeros_ok = 1, zeros = 0;
    for (int64_t z = 0; z < out[0]; z++)
        for (int64_t y = 0; y < out[1]; y++)
            for (int64_t x = 0; x < out[2]; x++) {
                const int64_t o = (z * out[1] + y) * out[2] + x, pz[3] = {z, y, x};
                int64_t t[3][2];
                for (int k = 0; k < 3; k++) {
                    double q = (pz[k] + 0.5) * in[k] / out[k] - 0.5;
                    q = q < 0 ? 0 : q > in[k] - 1 ? (double)(in[k] - 1) : q;
                    t[k][0] = (int64_t)floor(q);
                    t[k][1] = t[k][0] + 1 < in[k] ? t[k][0] + 1 : t[k][0];
                }
                int any = 0;
                for (int q = 0; q < 8; q++)
                    any |= v[(t[0][q >> 2] * in[1] + t[1][(q >> 1) & 1]) * in[2] + t[2][q & 1]] != 0.0f;
                zeros += !any;
                zeros_ok &= any == (c[o] != 0.0f);
            }
    ts_ok(!e && zeros_ok && zeros > nout / 4 && zeros < nout,
          "cubic with a zero background: %lld of %lld voxels 0, those where every trilinear tap is 0", (long long)zeros,
          (long long)nout);
    /* the field without the ball's edge: cubic closer to it than trilinear, away from the volume's border */
    for (int64_t z = 0; z < in[0]; z++)
        for (int64_t y = 0; y < in[1]; y++)
            for (int64_t x = 0; x < in[2]; x++)
                v[(z * in[1] + y) * in[2] + x] = (float)(2 + sin(0.45 * z) * cos(0.3 * y) + 0.02 * x * z);
    e = e || ts_resample_image(1, in, v, out, TS_INTERP_CUBIC, -1, c);
    e = e || ts_resample_image(1, in, v, out, TS_INTERP_LINEAR, -1, l);
    double ec = 0, el = 0;
    int64_t inside = 0;
    for (int64_t z = 0; z < out[0]; z++)
        for (int64_t y = 0; y < out[1]; y++)
            for (int64_t x = 0; x < out[2]; x++) {
                const double p[3] = {(z + 0.5) * in[0] / out[0] - 0.5, (y + 0.5) * in[1] / out[1] - 0.5,
                                     (x + 0.5) * in[2] / out[2] - 0.5};
                if (p[0] < 3 || p[1] < 3 || p[2] < 3 || p[0] > in[0] - 4 || p[1] > in[1] - 4 || p[2] > in[2] - 4)
                    continue;
                inside++;
                const int64_t o = (z * out[1] + y) * out[2] + x;
                double f = 2 + sin(0.45 * p[0]) * cos(0.3 * p[1]) + 0.02 * p[2] * p[0];
                ec = fmax(ec, fabs(c[o] - f));
                el = fmax(el, fabs(l[o] - f));
            }
    ts_ok(!e && inside > 100 && ec < 0.25 * el,
          "cubic at 18x21x16 -> 25x13x23 on a smooth field: max error %.2g against trilinear's %.2g (%lld voxels "
          "3 from the border)",
          ec, el, (long long)inside);
    e = e || ts_resample_image(1, in, v, out, TS_INTERP_CUBIC, 0, c);
    e = e || ts_resample_image(1, in, v, (const int64_t[3]){in[0], out[1], out[2]}, TS_INTERP_CUBIC, 0, l);
    int slices = !e;
    for (int64_t z = 0; z < out[0] && slices; z++) {
        double pz = (z + 0.5) * in[0] / out[0] - 0.5;
        int64_t a = (int64_t)floor(pz < 0 ? 0 : pz);
        int64_t zn = pz - (double)a >= 0.5 && a + 1 < in[0] ? a + 1 : a;
        for (int64_t i = 0; i < out[1] * out[2] && slices; i++)
            slices = c[z * out[1] * out[2] + i] == l[zn * out[1] * out[2] + i];
    }
    ts_ok(slices, "separate axis D: each output slice is the in-plane cubic resampling of the nearest input slice");
    free(v), free(r), free(c), free(l);
}

int main(void)
{
    const int64_t dhw[3] = {5, 4, 3};
    float img[60], out[3 * 2 * 2];
    uint8_t lab[60], olab[12], back[60];
    for (int i = 0; i < 60; i++) {
        img[i] = (float)i;
        int z = i / 12, y = (i / 3) % 4, x = i % 3;
        lab[i] = (uint8_t)(z >= 2 ? 2 : (x == 0 && y < 2 ? 1 : 0));
    }
    ts_ok(ts_resample_size(5, 2) == 3 && ts_resample_size(4, 2) == 2 && ts_resample_size(3, 2) == 2, "sizes: ceil(n/f)");
    ts_resample_down(1, dhw, 2, img, out, lab, 3, olab);
    /* block (0,0,0): z 0-1, y 0-1, x 0-1 -> voxels 0,1,3,4,12,13,15,16 */
    double m0 = (0 + 1 + 3 + 4 + 12 + 13 + 15 + 16) / 8.0;
    /* border block (2,1,1): z 4, y 2-3, x 2 -> voxels 56, 59 */
    double mb = (56 + 59) / 2.0;
    ts_ok(fabs(out[0] - m0) < 1e-6 && fabs(out[(2 * 2 + 1) * 2 + 1] - mb) < 1e-6, "block means, partial blocks at borders");
    /* block (0,0,0) labels: x=0,y<2 -> 1 (4 voxels), else 0 (4): tie -> lower class 0 */
    ts_ok(olab[0] == 0 && olab[(2 * 2 + 0) * 2 + 0] == 2 && olab[(1 * 2 + 0) * 2 + 0] == 2, "label majority (ties to the lower class)");
    ts_resample_up_labels(olab, dhw, 2, back);
    int ok = 1;
    for (int i = 0; i < 60; i++) {
        int z = i / 12, y = (i / 3) % 4, x = i % 3;
        ok &= back[i] == olab[((z / 2) * 2 + y / 2) * 2 + x / 2];
    }
    ts_ok(ok, "labels back on the fine grid fill each block");
    double a[16] = {0.9, 0.1, 0, -10, 0, 1.1, 0.2, 5, 0.05, 0, 1.3, 7, 0, 0, 0, 1}, b[16];
    ts_resample_affine(a, 2, b);
    /* coarse voxel (i,j,k) = (3,1,2) must map where fine voxel (6.5, 2.5, 4.5) maps */
    double ci[3] = {3, 1, 2}, fi[3] = {6.5, 2.5, 4.5}, err = 0;
    for (int r = 0; r < 3; r++) {
        double pc = b[r * 4 + 3], pf = a[r * 4 + 3];
        for (int j = 0; j < 3; j++) {
            pc += b[r * 4 + j] * ci[j];
            pf += a[r * 4 + j] * fi[j];
        }
        err = fmax(err, fabs(pc - pf));
    }
    ts_ok(err < 1e-12 && b[15] == 1, "coarse affine: a coarse voxel sits at its block's centre");
    any_factor();
    cubic();
    return ts_done();
}
