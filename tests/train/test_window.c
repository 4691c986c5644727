/* Unit test of the sliding-window geometry: coverage, flush borders,
 * overlap, padding of short axes, Gaussian weights, and that accumulating
 * window predictions of a known field and dividing by the weights gives
 * the field back. */
#include "tsbuild.h"
#include "src/infer/window.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int main(void)
{
    ts_window_plan p;
    int64_t vol[3] = {181, 217, 181}, win[3] = {64, 64, 64}, o[3];
    int e = ts_window_plan_make(vol, win, 0.5, &p);
    ts_ok(e == 0 && p.n[0] == 5 && p.n[1] == 6 && p.count == 150,
          "181x217x181 with 64^3 windows, overlap 0.5: %lldx%lldx%lld windows", (long long)p.n[0], (long long)p.n[1],
          (long long)p.n[2]);
    int flush = 1, inside = 1;
    for (int64_t i = 0; i < p.count; i++) {
        ts_window_origin(&p, i, o);
        for (int a = 0; a < 3; a++) inside &= o[a] >= 0 && o[a] + win[a] <= vol[a];
    }
    ts_window_origin(&p, p.count - 1, o);
    for (int a = 0; a < 3; a++) flush &= o[a] + win[a] == vol[a];
    ts_ok(inside && flush, "windows stay inside and the last is flush with the far border");
    /* coverage and overlap along one axis */
    int64_t v1[3] = {100, 10, 10}, w1[3] = {32, 16, 8};
    ts_window_plan q;
    ts_window_plan_make(v1, w1, 0.5, &q);
    int covered = 1, maxgap = 0;
    int64_t prev = -1;
    for (int64_t k = 0; k < q.n[0]; k++) {
        ts_window_origin(&q, k * q.n[1] * q.n[2], o);
        if (prev >= 0 && o[0] - prev > 16) maxgap = 1;
        if (prev >= 0 && o[0] > prev + 32) covered = 0;
        prev = o[0];
    }
    ts_ok(q.n[1] == 1 && q.n[2] == 2 && covered && !maxgap, "stride at most half a window; short axis (10 < 16) gets one padded window");
    ts_ok(ts_window_plan_make(v1, w1, 1.0, &q) != 0, "overlap 1 is refused");
    /* gaussian */
    float *g = malloc(sizeof(float) * 32 * 16 * 8);
    ts_window_gaussian(w1, g);
    float mx = 0, mn = 2;
    for (int i = 0; i < 32 * 16 * 8; i++) {
        mx = g[i] > mx ? g[i] : mx;
        mn = g[i] < mn ? g[i] : mn;
    }
    ts_ok(mx == 1.0f && mn >= 1e-3f && g[(16 * 16 + 8) * 8 + 4] > g[0], "Gaussian: peak in the centre, floor 1e-3");
    /* accumulation: logits = log(field) with K = 2 gives back softmax = field */
    int64_t nv = 100 * 10 * 10;
    float *f = malloc(sizeof(float) * (size_t)nv), *acc = calloc(2 * (size_t)nv, sizeof(float)),
          *ws = calloc((size_t)nv, sizeof(float)), *img = malloc(sizeof(float) * (size_t)nv);
    for (int64_t i = 0; i < nv; i++) f[i] = 0.1f + 0.8f * (float)((i * 37) % 101) / 100.0f;
    ts_window_plan_make(v1, w1, 0.5, &q);
    float *win_img = malloc(sizeof(float) * 32 * 16 * 8), *logits = malloc(sizeof(float) * 32 * 16 * 8 * 2);
    for (int64_t i = 0; i < nv; i++) img[i] = f[i];
    int pad_ok = 1;
    for (int64_t i = 0; i < q.count; i++) {
        ts_window_origin(&q, i, o);
        ts_window_extract(&q, o, img, 1, win_img);
        for (int64_t j = 0; j < 32 * 16 * 8; j++) {
            int64_t z = j / 128, y = (j / 8) % 16, x = j % 8;
            int out = o[0] + z >= 100 || o[1] + y >= 10 || o[2] + x >= 10;
            if (out && win_img[j] != 0) pad_ok = 0;
            float pr = out ? 0.5f : win_img[j];
            logits[2 * j] = logf(1 - pr);
            logits[2 * j + 1] = logf(pr);
        }
        ts_window_accumulate(&q, o, logits, 2, g, acc, ws);
    }
    double maxerr = 0;
    for (int64_t i = 0; i < nv; i++) {
        double e = fabs(acc[nv + i] / ws[i] - f[i]);
        maxerr = e > maxerr ? e : maxerr;
    }
    ts_ok(pad_ok, "extract zero-pads outside the volume");
    ts_ok(maxerr < 1e-5, "weighted average of overlapping windows returns the field (max err %.2g)", maxerr);
    free(g);
    free(f);
    free(acc);
    free(ws);
    free(img);
    free(win_img);
    free(logits);
    return ts_done();
}
