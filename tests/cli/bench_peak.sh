#!/bin/sh
# tessera bench peak (issue [17]): the CPU's measured fp32 FMA, bf16 and
# triad figures; the bf16 figure present exactly where the CPU has
# AVX512-BF16 (/proc/cpuinfo), the ISA the widest the CPU has, every
# figure positive (no speed is asserted: make check runs tests side by side); 2 ranks
# report their sums; bad arguments are refused on every rank.
. "$TS_SRCDIR/tests/cli/tap.sh"
export OMP_NUM_THREADS=2
ts_mpirun 1 "$TESSERA" bench peak --seconds 1 --json "$tmpdir/p.json" >"$tmpdir/p.txt" 2>&1
ok $? "bench peak on 1 rank, 2 threads: exit 0"
sed 's/^/# /' "$tmpdir/p.txt"
"${TS_PYTHON:-/usr/bin/python3}" - "$tmpdir/p.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
flags = set()
for line in open("/proc/cpuinfo"):
    if line.startswith("flags"):
        flags = set(line.split(":", 1)[1].split())
        break
want_fp32 = "avx512f" if "avx512f" in flags else "avx2+fma" if {"avx2", "fma"} <= flags else "scalar"
assert j["fp32_isa"] == want_fp32, (j["fp32_isa"], want_fp32)
assert j["threads"] == 2 and j["ranks"] == 1, j
for k in ("fp32_gflops_1", "fp32_gflops", "triad_GBps_1", "triad_GBps"):
    assert j[k] > 0, (k, j[k])
if "avx512_bf16" in flags:
    assert j["bf16_isa"] == "avx512bf16" and j["bf16_gflops_1"] > 0 and j["bf16_gflops"] > 0, j
else:
    assert j["bf16_isa"] == "none" and j["bf16_gflops"] == 0, j
# AMX tiles where the CPU has them (and Linux 5.16+ grants them; an older kernel: 0), beyond the FMA rate
if {"amx_bf16", "amx_tile", "avx512_bf16"} <= flags and tuple(map(int, __import__("os").uname().release.split(".")[:2])) >= (5, 16):
    assert j["amx_gflops_1"] > j["fp32_gflops_1"] and j["amx_gflops"] > j["fp32_gflops"], j
elif not {"amx_bf16", "amx_tile"} <= flags:
    assert j["amx_gflops"] == 0 and j["amx_gflops_1"] == 0, j
assert j["triad_mb"] >= 192, j
PY
ok $? "its JSON: the CPU's widest FMA ($(grep -o '"fp32_isa":[[:space:]]*"[^"]*"' "$tmpdir/p.json")), bf16 and AMX where the CPU has them, figures positive"
ts_mpirun 2 "$TESSERA" bench peak --seconds 0.5 --threads 1 >"$tmpdir/p2.txt" 2>&1 &&
    grep -q "sum over the ranks: fp32 [0-9.]* GFLOP/s" "$tmpdir/p2.txt"
ok $? "2 ranks: the sums over the ranks"
for bad in "--seconds 0" "--threads x" "--frobnicate"; do
    ts_mpirun 2 "$TESSERA" bench peak $bad >"$tmpdir/bad.txt" 2>&1
    rc=$?
    n=$(grep -c "tessera: error (rank [01])" "$tmpdir/bad.txt")
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq 2 ]
    ok $? "bench peak $bad: refused on both ranks (exit $rc)"
done
# bench step --peak --profile: the step's GFLOP/s over the measured peak, and the roofline per kind
printf '%s\n' '[model]' 'channels = 8,16,32' 'classes = 3' 'norm = group' 'groups = 2' '[data]' 'patch = 32' \
    '[train]' 'batch = 2' >"$tmpdir/s.ini"
ts_mpirun 1 "$TESSERA" bench step "$tmpdir/s.ini" --steps 2 --warmup 1 --profile --peak --json "$tmpdir/s.json" \
    >"$tmpdir/s.txt" 2>&1
ok $? "bench step --profile --peak: exit 0"
sed 's/^/# /' "$tmpdir/s.txt"
"${TS_PYTHON:-/usr/bin/python3}" - "$tmpdir/s.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["flop_per_step"] > 0 and abs(j["gflops"] - j["flop_per_step"] / (j["step_ms"] * 1e-3) / 1e9) < 1e-6 * j["gflops"], j
assert j["peak_kind"] == "fp32" and j["peak_gflops"] > 0 and j["peak_triad_GBps"] > 0, j
assert abs(j["fraction_of_peak"] - j["gflops"] / j["peak_gflops"]) < 1e-9 and 0 < j["fraction_of_peak"] < 1.5, j
rows = {r["kind"]: r for r in j["profile"]}
assert len(rows) == 9 and all(r["bound"] in ("compute", "memory") for r in rows.values()), rows
assert rows["norm+relu"]["bound"] == "memory" and rows["norm+relu"]["flop"] == 0 and rows["norm+relu"]["bytes"] > 0, rows["norm+relu"]
assert rows["conv forward"]["flop"] > 0 and rows["conv forward"]["ms"] > 0, rows["conv forward"]
assert 0.3 < j["profile_sum_over_step"] <= 1.05, j["profile_sum_over_step"]
PY
ok $? "its JSON: GFLOP/s = the cost model's FLOP over the step, the fraction of the measured peak, 9 kinds each with its bound, their sum within the step"
done_testing
