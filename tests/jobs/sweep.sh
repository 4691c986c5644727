#!/bin/bash
# jobs/scaling/sweep.sh and jobs/scaling/report end to end on a tiny model:
# strong and weak, dp and sp, at 1 and 2 ranks; the CSV has a row per point
# with efficiency 1 at 1 rank and the phases and counters per step; the
# PNG plots are written (when matplotlib is there); the roofline of a
# bench step's profile (--roofline); --slurm --dry-run prints one job array
# per rank count.
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
export TESSERA_EXIT_GRACE=20 OMP_NUM_THREADS=1 TESSERA_SWEEP_TIMEOUT=300
d=$(mktemp -d "${TMPDIR:-/tmp}/tessera-sweep.XXXXXX")
trap 'rm -rf "$d"' EXIT
cat >"$d/s.ini" <<'INI'
[model]
channels = 4,8
classes = 3
[data]
patch = 16
[train]
batch = 2
lr = 0.05
log_every = 100
[eval]
final = false
INI
sweep=$TS_SRCDIR/jobs/scaling/sweep.sh
ts_step "sweep: strong and weak, dp and sp, 1 and 2 ranks, 2 steps" bash "$sweep" --config "$d/s.ini" --ranks 1,2 \
    --steps 2 --out "$d/sw" --tessera "$TS_BUILDDIR/tessera"
ts_check "8 points listed, each with a perf.json" sh -c "[ \$(tail -n +2 '$d/sw/points.tsv' | wc -l) -eq 8 ] &&
    [ \$(ls '$d'/sw/*/perf.json | wc -l) -eq 8 ]"
ts_check "weak sp at 2 ranks: patch depth doubled, box as at 1 rank" \
    sh -c "grep -q '^patch = 32,16,16' '$d/sw/weak-sp-r2/config.ini' && grep -q '\"box\": \[16, 16, 16\]' '$d/sw/weak-sp-r2/perf.json'"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null || python3 -c 'import matplotlib' 2>/dev/null; then
    ts_step "report: CSV and PNGs" "$TS_SRCDIR/jobs/scaling/report" "$d/sw" --out "$d/rep"
    ts_step "the CSV: 8 rows, efficiency 1 at 1 rank, speedup = efficiency x ranks, phases and counters per step" \
        /usr/bin/python3 -c "
import csv
rows = list(csv.DictReader(open('$d/rep/scaling.csv')))
assert len(rows) == 8, len(rows)
for r in rows:
    e, s, n = float(r['efficiency']), float(r['speedup']), int(r['ranks'])
    assert abs(s - e * n) < 1e-3 * max(s, 1), r
    if n == 1: assert abs(e - 1) < 1e-9, r
    assert float(r['step_ms']) > 0 and float(r['forward_ms']) > 0 and float(r['voxels_per_s']) > 0, r
    assert float(r['perf::TASK-CLOCK@forward']) > 0, r
    assert r['mode'] in ('strong', 'weak') and r['layout'] in ('dp', 'sp'), r
print(sorted((r['mode'], r['layout'], r['ranks'], r['efficiency']) for r in rows))"
    ts_check "five PNG plots written" sh -c "for f in throughput efficiency phases imbalance counters; do
        [ -s '$d/rep/'\$f.png ] && head -c 8 '$d/rep/'\$f.png | grep -q PNG || exit 1; done"
    ts_step "bench step --peak --profile for the roofline" ts_mpirun 1 "$TS_BUILDDIR/tessera" bench step "$d/s.ini" --steps 1 \
        --warmup 0 --peak --profile --json "$d/step.json"
    ts_step "report --roofline alone: roofline.csv and roofline.png" "$TS_SRCDIR/jobs/scaling/report" \
        --roofline "$d/step.json" --out "$d/roof"
    ts_step "the roofline CSV: every kind of the profile, its intensity FLOP / bytes, its bound and fraction as the step said" \
        /usr/bin/python3 -c "
import csv, json
j = json.load(open('$d/step.json'))
rows = list(csv.DictReader(open('$d/roof/roofline.csv')))
assert [r['kind'] for r in rows] == [k['kind'] for k in j['profile']], rows
for r, k in zip(rows, j['profile']):
    assert r['bound'] == k['bound'] and abs(float(r['fraction_of_roof']) - k['fraction_of_roof']) <= 1e-5 * max(1, k['fraction_of_roof']), r
    if k['bytes']: assert abs(float(r['intensity']) - k['flop'] / k['bytes']) <= 1e-5 * k['flop'] / k['bytes'], r
    assert abs(float(r['peak_gflops']) - j['peak_gflops']) <= 1e-5 * j['peak_gflops'], r
assert sum(float(r['flop']) for r in rows) > 0 and any(r['bound'] == 'memory' for r in rows), 'nothing measured'
print(len(rows), 'kinds')"
    ts_check "... the PNG written" sh -c "[ -s '$d/roof/roofline.png' ] && head -c 8 '$d/roof/roofline.png' | grep -q PNG"
    ts_step "a bench step without --peak" ts_mpirun 1 "$TS_BUILDDIR/tessera" bench step "$d/s.ini" --steps 1 --warmup 0 \
        --profile --json "$d/nopeak.json"
    ts_check "report --roofline on it: refused, saying what is missing" sh -c \
        "! '$TS_SRCDIR/jobs/scaling/report' --roofline '$d/nopeak.json' --out '$d/roof2' >'$d/roof2.log' 2>&1 &&
         grep -q 'no per-kind profile with a measured peak' '$d/roof2.log'"
else
    ts_skip "report" "no matplotlib (python3-matplotlib)"
fi
ts_step "--slurm --dry-run: one job array per rank count" bash "$sweep" --config "$d/s.ini" --ranks 1,2 --steps 2 \
    --mode strong --layouts dp --out "$d/sl" --slurm --dry-run --tessera "$TS_BUILDDIR/tessera"
ts_check "... sbatch --array=0 --ntasks=1 and --array=1 --ntasks=2, and the plan" sh -c "
    printf '%s\n' \"\$1\" | grep -q 'sbatch --array=0 --ntasks=1 ' && printf '%s\n' \"\$1\" | grep -q 'sbatch --array=1 --ntasks=2 ' &&
    [ \$(grep -vc '^#' '$d/sl/plan.txt') -eq 2 ]" _ "$ts_out"
bash "$sweep" --config "$d/s.ini" --ranks 3 --steps 1 --mode strong --layouts dp --out "$d/bad" \
    --tessera "$TS_BUILDDIR/tessera" >"$d/bad.log" 2>&1
ts_check "strong dp at 3 ranks with batch 2: skipped point, not a silent wrong run" sh -c \
    "grep -q 'not divisible by 3; skipped' '$d/bad.log' && [ ! -e '$d/bad/strong-dp-r3/perf.json' ]"
ts_finish
