/* Unit test of integer-factor resampling: sizes, block means at the borders,
 * label majority, the coarse affine (a coarse voxel at the world position of
 * its block's centre) and labels back on the fine grid. */
#include "tsbuild.h"
#include "io/resample.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>

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
    return ts_done();
}
