/* Unit tests of src/core: config (INI, overrides, strict keys with file and
 * line, values, hash), Philox streams (known answer, independence),
 * bfloat16/float16 rounding, error recording, tensor shapes, the fault
 * injection list (TESSERA_FAULT); and of the
 * collectives' pure helpers (large-count pieces, blocks). */
#include "tsbuild.h"
#include "collectives/coll.h"
#include "src/core/config.h"
#include "src/core/error.h"
#include "src/core/fault.h"
#include "src/core/rng.h"
#include "src/core/tensor.h"
#include "tests/tap.h"

#include <limits.h>
#include <math.h>
#include <string.h>

static const ts_cfg_key keys[] = {
    {"model.channels", TS_CFG_INTLIST, "16,32,64,128", "1:", "channels per level"},
    {"train.lr", TS_CFG_FLOAT, "0.01", "0:", "learning rate"},
    {"train.batch", TS_CFG_INT, "2", "1:4096", "batch"},
    {"train.deterministic", TS_CFG_BOOL, "false", NULL, "bit-identical"},
    {"model.norm", TS_CFG_ENUM, "batch", "batch|group|instance", "norm"},
    {"data.path", TS_CFG_STRING, NULL, NULL, "dataset"},
    {"data.norm", TS_CFG_ENUMLIST, "image", "image|ct|foreground", "per channel"},
    {NULL, 0, NULL, NULL, NULL},
};

static void test_config(void)
{
    const ts_cfg_key *tables[] = {keys, NULL};
    ts_config *c = NULL;
    ts_ok(ts_config_create(tables, &c) == 0, "config: create");
    int64_t v;
    double d;
    int b;
    const char *s;
    ts_ok(ts_config_get_int(c, "train.batch", &v) == 0 && v == 2, "config: default int");
    ts_ok(!ts_config_isset(c, "data.path") && ts_config_get_str(c, "data.path", &s) == TS_ERR_CONFIG,
          "config: unset key without default is an error when read");
    int e = ts_config_load_string(c, "# comment\n[train]\nlr = 0.5\n\n[model]\nnorm = group\nchannels = 8, 16\n", "a.ini");
    ts_ok(e == 0, "config: load");
    ts_ok(ts_config_get_float(c, "train.lr", &d) == 0 && d == 0.5, "config: float from file");
    int64_t ch[8];
    int n;
    ts_ok(ts_config_get_intlist(c, "model.channels", ch, 8, &n) == 0 && n == 2 && ch[0] == 8 && ch[1] == 16,
          "config: int list with spaces");
    ts_ok(!strcmp(ts_config_source(c, "model.norm"), "a.ini:6"), "config: source file:line (%s)",
          ts_config_source(c, "model.norm"));
    e = ts_config_load_string(c, "[train]\nlr = 0.1\nbatchsize = 4\n", "b.ini");
    ts_ok(e == TS_ERR_CONFIG && strstr(ts_err_message(), "b.ini:3") && strstr(ts_err_message(), "train.batchsize"),
          "config: unknown key names file:line and key (%s)", ts_err_message());
    e = ts_config_load_string(c, "[train]\n\nbatch = many\n", "c.ini");
    ts_ok(e == TS_ERR_CONFIG && strstr(ts_err_message(), "c.ini:3") && strstr(ts_err_message(), "not an integer"),
          "config: bad value names file:line (%s)", ts_err_message());
    e = ts_config_load_string(c, "[train]\nbatch = 0\n", "d.ini");
    ts_ok(e == TS_ERR_CONFIG && strstr(ts_err_message(), ">= 1"), "config: range check (%s)", ts_err_message());
    e = ts_config_load_string(c, "[model]\nnorm = layer\n", "e.ini");
    ts_ok(e == TS_ERR_CONFIG && strstr(ts_err_message(), "batch|group|instance"), "config: enum choices listed");
    ts_ok(ts_config_set_arg(c, "data.norm= ct , foreground") == 0 && ts_config_get_str(c, "data.norm", &s) == 0 &&
              !strcmp(s, "ct , foreground"),
          "config: enum list, one choice per element, spaces around them");
    e = ts_config_set_arg(c, "data.norm=ct,zscore");
    ts_ok(e == TS_ERR_CONFIG && strstr(ts_err_message(), "'zscore'") && strstr(ts_err_message(), "image|ct|foreground"),
          "config: enum list names the element that is not a choice (%s)", ts_err_message());
    e = ts_config_set_arg(c, "data.norm=ct,");
    ts_ok(e == TS_ERR_CONFIG && strstr(ts_err_message(), "''"), "config: enum list with an empty element (%s)",
          ts_err_message());
    e = ts_config_load_string(c, "[train\nlr = 1\n", "f.ini");
    ts_ok(e == TS_ERR_CONFIG && strstr(ts_err_message(), "f.ini:1"), "config: syntax error with line (%s)",
          ts_err_message());
    uint64_t h1 = ts_config_hash(c);
    ts_ok(ts_config_set_arg(c, "train.deterministic=yes") == 0 && ts_config_get_bool(c, "train.deterministic", &b) == 0 &&
              b == 1 && !strcmp(ts_config_source(c, "train.deterministic"), "command line"),
          "config: command-line override");
    ts_ok(ts_config_hash(c) != h1, "config: hash changes with a value");
    ts_ok(ts_config_set_arg(c, "train.nope=1") == TS_ERR_CONFIG && strstr(ts_err_message(), "command line") &&
              strstr(ts_err_message(), "train.nope"),
          "config: unknown override key is an error");
    ts_ok(ts_config_set_arg(c, "justtext") == TS_ERR_CONFIG, "config: override without '=' is an error");
    ts_ok(ts_config_load_file(c, "/nonexistent/x.ini") == TS_ERR_IO && strstr(ts_err_message(), "/nonexistent/x.ini"),
          "config: missing file named");
    char buf[2048] = "";
    FILE *f = fmemopen(buf, sizeof buf, "w");
    ts_config_write(c, f);
    fclose(f);
    ts_ok(strstr(buf, "[train]\n") && strstr(buf, "lr = 0.5\n") && strstr(buf, "deterministic = yes\n"),
          "config: resolved config written as INI");
    /* the written config reads back to the same hash */
    ts_config *c2 = NULL;
    ts_config_create(tables, &c2);
    ts_ok(ts_config_load_string(c2, buf, "resolved") == 0 && ts_config_hash(c2) == ts_config_hash(c),
          "config: resolved INI reloads with the same hash");
    ts_config_destroy(&c2);
    ts_config_destroy(&c);
    ts_ok(c == NULL, "config: destroy clears the pointer");
}

static void test_rng(void)
{
    /* Random123 known-answer test for philox4x32-10 */
    uint32_t ctr[4] = {0, 0, 0, 0}, key[2] = {0, 0}, out[4];
    ts_philox4x32(ctr, key, out);
    ts_ok(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu && out[3] == 0x9b00dbd8u,
          "rng: philox4x32-10 known answer (zeros)");
    uint32_t ctr2[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, key2[2] = {0xffffffffu, 0xffffffffu};
    ts_philox4x32(ctr2, key2, out);
    ts_ok(out[0] == 0x408f276du && out[1] == 0x41c83b0eu && out[2] == 0xa20bc7c6u && out[3] == 0x6d5451fdu,
          "rng: philox4x32-10 known answer (ones)");
    ts_rng a, b, r1;
    ts_rng_init(&a, 42, 3, 7);
    ts_rng_init(&b, 42, 3, 7);
    int same = 1;
    for (int i = 0; i < 1000; i++) same &= ts_rng_u32(&a) == ts_rng_u32(&b);
    ts_ok(same, "rng: same (seed, rank, stream) gives the same sequence");
    ts_rng_init(&a, 42, 3, 7);
    ts_rng_init(&r1, 42, 4, 7);
    int diff = 0;
    for (int i = 0; i < 100; i++) diff += ts_rng_u32(&a) != ts_rng_u32(&r1);
    ts_ok(diff > 95, "rng: another rank gives another sequence");
    double s = 0, s2 = 0, mn = 1, mx = 0;
    ts_rng_init(&a, 1, 0, 0);
    for (int i = 0; i < 100000; i++) {
        double u = ts_rng_uniform(&a);
        s += u;
        if (u < mn) mn = u;
        if (u > mx) mx = u;
        double z = ts_rng_normal(&a);
        s2 += z * z;
    }
    ts_ok(mn >= 0 && mx < 1 && fabs(s / 1e5 - 0.5) < 0.01, "rng: uniform in [0,1), mean %.4f", s / 1e5);
    ts_ok(fabs(s2 / 1e5 - 1.0) < 0.02, "rng: normal variance %.4f", s2 / 1e5);
    int64_t idx[1000], seen[1000] = {0};
    for (int i = 0; i < 1000; i++) idx[i] = i;
    ts_rng_shuffle(&a, idx, 1000);
    int perm = 1, moved = 0;
    for (int i = 0; i < 1000; i++) {
        if (idx[i] < 0 || idx[i] >= 1000 || seen[idx[i]]++) perm = 0;
        moved += idx[i] != i;
    }
    ts_ok(perm && moved > 900, "rng: shuffle is a permutation");
    ts_rng_init(&a, 9, 0, 0);
    ts_rng_init(&b, 9, 0, 0);
    for (int i = 0; i < 40; i++) ts_rng_u32(&a);
    ts_rng_skip(&b, 10);
    ts_ok(ts_rng_u32(&a) == ts_rng_u32(&b), "rng: skip jumps by blocks");
    int hist[3] = {0, 0, 0};
    for (int i = 0; i < 30000; i++) hist[ts_rng_below(&a, 3)]++;
    ts_ok(hist[0] > 9500 && hist[1] > 9500 && hist[2] > 9500, "rng: below(3) uniform (%d %d %d)", hist[0], hist[1], hist[2]);
}

static void test_dtype(void)
{
    ts_ok(ts_f32_to_bf16(1.0f) == 0x3f80 && ts_bf16_to_f32(0x3f80) == 1.0f, "bf16: 1.0");
    /* 1 + 2^-8 lies halfway between bf16 1.0 and 1.0078125: ties to even */
    ts_ok(ts_f32_to_bf16(1.00390625f) == 0x3f80, "bf16: ties to even (down)");
    ts_ok(ts_f32_to_bf16(1.01171875f) == 0x3f82, "bf16: ties to even (up)");
    ts_ok(ts_f32_to_f16(1.0f) == 0x3c00 && ts_f16_to_f32(0x3c00) == 1.0f, "f16: 1.0");
    ts_ok(ts_f32_to_f16(65504.0f) == 0x7bff && ts_f32_to_f16(65536.0f) == 0x7c00, "f16: max and overflow to inf");
    ts_ok(ts_f16_to_f32(0x0001) == 0x1p-24f && ts_f32_to_f16(0x1p-24f) == 0x0001, "f16: smallest subnormal");
    ts_ok(ts_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00 && ts_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02,
          "f16: ties to even");
    int exact = 1;
    for (int i = -2048; i <= 2048; i++) exact &= ts_f16_to_f32(ts_f32_to_f16((float)i)) == (float)i;
    for (int i = -256; i <= 256; i++) exact &= ts_bf16_to_f32(ts_f32_to_bf16((float)i)) == (float)i;
    ts_ok(exact, "f16 integers to 2048 and bf16 integers to 256 are exact");
    ts_ok(isnan(ts_bf16_to_f32(ts_f32_to_bf16(NAN))) && isnan(ts_f16_to_f32(ts_f32_to_f16(NAN))), "NaN stays NaN");
    ts_dtype t;
    ts_ok(ts_dtype_parse("bf16", &t) == 0 && t == TS_BFLOAT16 && ts_dtype_parse("float7", &t) != 0, "dtype names");
}

static void test_err_tensor(void)
{
    ts_err_clear();
    int e = TS_ERR(TS_ERR_FORMAT, "file %s bad", "x.h5");
    ts_ok(e == TS_ERR_FORMAT && strstr(ts_err_message(), "file x.h5 bad") && strstr(ts_err_message(), "test_core.c:"),
          "error: message with file and line (%s)", ts_err_message());
    ts_tensor t;
    int64_t sh[5] = {2, 1, 4, 4, 4};
    ts_ok(ts_tensor_alloc(&t, TS_FLOAT32, 5, sh) == 0 && ts_tensor_numel(&t) == 128 && ts_tensor_bytes(&t) == 512 &&
              ((uintptr_t)t.data & 63) == 0,
          "tensor: alloc, numel, bytes, alignment");
    int64_t want[5] = {2, 3, -1, -1, -1};
    e = ts_tensor_check_shape(&t, "/image", 5, want);
    ts_ok(e == TS_ERR_FORMAT && strstr(ts_err_message(), "/image has shape [2, 1, 4, 4, 4], expected [2, 3, *, *, *]"),
          "tensor: shape check message (%s)", ts_err_message());
    ts_tensor_free(&t);
    ts_ok(t.data == NULL, "tensor: free clears");
}

static void test_pieces(void)
{
    size_t o, l, n;
    n = ts_coll_pieces(0, 100, 0, &o, &l);
    ts_ok(n == 0, "pieces: zero count, zero pieces");
    n = ts_coll_pieces(250, 100, 2, &o, &l);
    ts_ok(n == 3 && o == 200 && l == 50, "pieces: 250 by 100, last piece");
    /* 5e9 elements, cut below INT_MAX: every piece fits an int, they tile */
    size_t count = 5000000000ull, max = INT_MAX / 2, sum = 0, next = 0;
    int tiled = 1, fits = 1;
    n = ts_coll_pieces(count, max, 0, NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        ts_coll_pieces(count, max, i, &o, &l);
        tiled &= o == next;
        fits &= l > 0 && l <= (size_t)INT_MAX;
        next = o + l;
        sum += l;
    }
    ts_ok(n == 5 && tiled && fits && sum == count, "pieces: 5e9 elements in %zu pieces below INT_MAX", n);
    /* blocks: cover the buffer in order, cache-line aligned */
    int ok = 1;
    for (int p = 1; p <= 9; p++)
        for (size_t cnt = 0; cnt < 300; cnt += 7) {
            size_t end = 0;
            for (int r = 0; r < p; r++) {
                ts_coll_block(cnt, TS_FLOAT32, p, r, &o, &l);
                ok &= o == end && (o % 16 == 0 || l == 0);
                end = o + l;
            }
            ok &= end == cnt;
        }
    ts_ok(ok, "blocks: tile the buffer, 64-byte aligned, for 1..9 ranks");
}

/* TESSERA_FAULT's kill points: kill:...:at=P fires only at point P of its step
 * (ts_fault_at with that op), a kill without at= at any point; an unknown
 * point is an error naming the entry */
static void test_fault(void)
{
    setenv("TESSERA_FAULT", "kill:rank=1:step=4:at=update;kill:rank=0:step=2", 1);
    ts_ok(ts_fault_init(1) == 0, "fault: kill with at= parses");
    ts_ok(ts_fault_at(TS_FAULT_KILL, 4, "update") && !ts_fault_at(TS_FAULT_KILL, 4, "forward") &&
              !ts_fault_at(TS_FAULT_KILL, 4, NULL) && !ts_fault_at(TS_FAULT_KILL, 3, "update"),
          "fault: kill at=update fires in the update of step 4 only (not at the step's start, not in forward)");
    ts_ok(ts_fault_init(0) == 0 && ts_fault_at(TS_FAULT_KILL, 2, NULL) && ts_fault_at(TS_FAULT_KILL, 2, "halo") &&
              !ts_fault_at(TS_FAULT_KILL, 4, "update"),
          "fault: a kill without at= fires at any point of its step, on its rank only");
    ts_err_clear();
    setenv("TESSERA_FAULT", "kill:rank=1:at=sideways", 1);
    ts_ok(ts_fault_init(1) == TS_ERR_CONFIG && strstr(ts_err_message(), "'kill:rank=1:at=sideways': unknown kill point 'sideways'"),
          "fault: an unknown kill point names the entry (%s)", ts_err_message());
    setenv("TESSERA_FAULT", "hang:at=update", 1);
    ts_ok(ts_fault_init(0) == TS_ERR_CONFIG, "fault: at= belongs to kill only");
    unsetenv("TESSERA_FAULT");
    ts_ok(ts_fault_init(0) == 0 && !ts_fault_any(), "fault: no variable, no faults");
}

int main(void)
{
    test_config();
    test_rng();
    test_dtype();
    test_err_tensor();
    test_pieces();
    test_fault();
    return ts_done();
}
