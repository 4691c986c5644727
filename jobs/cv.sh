#!/bin/bash
# Cross-validation by subject (data.folds / data.fold, docs/medical.md):
# trains every fold of CONFIG and reports each fold's final validation Dice
# per class and the foreground mean, with the mean and spread over folds.
#   jobs/cv.sh CONFIG FOLDS OUTDIR [section.key=value ...]
#       trains the folds one after the other here (NP ranks, default 1;
#       TESSERA the binary, default build/tessera), then reports
#   jobs/cv.sh --slurm CONFIG FOLDS OUTDIR [section.key=value ...]
#       submits one Slurm array job (jobs/slurm/train.sbatch, a task per
#       fold, run directories OUTDIR/fold<k>); report when it has finished:
#   jobs/cv.sh --report FOLDS OUTDIR
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mode=local
case ${1:-} in --slurm) mode=slurm; shift ;; --report) mode=report; shift ;; esac
if [ "$mode" = report ]; then
    [ $# -eq 2 ] || { echo "usage: jobs/cv.sh --report FOLDS OUTDIR" >&2; exit 2; }
    folds=$1 out=$2
else
    [ $# -ge 3 ] || { echo "usage: jobs/cv.sh [--slurm] CONFIG FOLDS OUTDIR [section.key=value ...]" >&2; exit 2; }
    config=$1 folds=$2 out=$3
    shift 3
fi
case $folds in '' | *[!0-9]*) echo "jobs/cv.sh: FOLDS must be a number >= 2, not '$folds'" >&2; exit 2 ;; esac
[ "$folds" -ge 2 ] || { echo "jobs/cv.sh: FOLDS must be >= 2" >&2; exit 2; }
mkdir -p "$out"

if [ "$mode" = slurm ]; then
    # the array task index becomes data.fold; each task's run directory is OUTDIR/fold<index>
    TESSERA_ARRAY_KEY=data.fold TESSERA_RUN_DIR="$out/fold%a" sbatch --array=0-$((folds - 1)) \
        --job-name=tessera-cv --output="$out/fold%a.out" "$here/jobs/slurm/train.sbatch" "$config" data.folds="$folds" "$@"
    echo "jobs/cv.sh: submitted; when the array has finished: jobs/cv.sh --report $folds $out"
    exit 0
fi
if [ "$mode" = local ]; then
    tessera=${TESSERA:-$here/build/tessera}
    for ((f = 0; f < folds; f++)); do
        echo "== fold $f of $folds"
        mpiexec.mpich -n "${NP:-1}" "$tessera" train "$config" data.folds="$folds" data.fold="$f" \
            run.dir="$out/fold$f" "$@" | tail -3
    done
fi
/usr/bin/python3 - "$folds" "$out" <<'PY'
import json, math, statistics, sys
folds, out = int(sys.argv[1]), sys.argv[2]
rows, bad = [], []
for f in range(folds):
    last = None
    try:
        for line in open(f"{out}/fold{f}/metrics.jsonl"):
            m = json.loads(line)
            if "dice" in m:
                last = m
    except OSError as e:
        bad.append(f"fold {f}: {e}")
        continue
    if last is None:
        bad.append(f"fold {f}: no evaluation in {out}/fold{f}/metrics.jsonl")
        continue
    d = [x if x is not None and x >= 0 else math.nan for x in last["dice"]]
    fg = [x for x in d[1:] if not math.isnan(x)]
    rows.append((f, last["step"], d, statistics.mean(fg) if fg else math.nan))
if bad:
    print("jobs/cv.sh: " + "; ".join(bad), file=sys.stderr)
    sys.exit(1)
K = len(rows[0][2])
print("| fold | step | " + " | ".join(f"Dice {k}" for k in range(1, K)) + " | foreground mean |")
print("| ---: | ---: | " + " | ".join("---:" for _ in range(1, K)) + " | ---: |")
for f, step, d, fg in rows:
    print(f"| {f} | {step} | " + " | ".join(f"{x:.4f}" for x in d[1:]) + f" | {fg:.4f} |")
fgs = [r[3] for r in rows]
sd = statistics.stdev(fgs) if len(fgs) > 1 else 0.0
print(f"\nforeground mean Dice over {folds} folds: {statistics.mean(fgs):.4f} +- {sd:.4f} (sample std), "
      f"min {min(fgs):.4f}, max {max(fgs):.4f}")
PY
