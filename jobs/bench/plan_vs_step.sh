#!/bin/bash
# `tessera plan` against `tessera bench step` on this machine (issue [7]
# acceptance 4: within 25% at 1, 2 and 4 ranks, data parallel, 1 thread per
# rank; spatial sp = 2 and 4 and pipeline pp = 2 with 4 micro-batches as well; environment SP, PP: the spatial and pipeline rank counts, default 2,4 and 2). Calibrates first: the collectives'
# alpha-beta fits (`bench coll --tune` at 2 and 4 ranks) and the layer rates
# (`bench step --calibrate` on one rank, in each round: the machine drifts);
# then per round measures bench step at every rank count and asks plan for
# the same layout, and prints predicted / measured.
#   jobs/bench/plan_vs_step.sh [CONFIG] [ROUNDS] [RANKS (default 1,2,4)] [key=value ...]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
cfg=${1:-$here/configs/unet3d-small.ini}
rounds=${2:-3}
ranks=${3:-1,2,4}
shift $(( $# >= 3 ? 3 : $# )) || true
steps=${STEPS:-3}
warmup=${WARMUP:-1}
sp=${SP:-2,4}
pp=${PP:-2}
micro=${MICRO:-4}
tmp=${KEEP:-$(mktemp -d)}
[ -n "${KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
export OMP_NUM_THREADS=1
IFS=, read -r -a rl <<<"$ranks"
IFS=, read -r -a sl <<<"$sp"
IFS=, read -r -a pl <<<"$pp"
for r in "${rl[@]}"; do
    [ "$r" -gt 1 ] && mpiexec.mpich -n "$r" "$tessera" bench coll --tune "$tmp/tuning.json" --max-bytes 64M --repeat 3 \
        --time-ms 20 >"$tmp/coll.$r.txt"
done
grep -h "^# model" "$tmp"/coll.*.txt >&2 || true
batch=$(sed -n 's/^batch *= *//p' "$cfg" | head -1)
for k in $(seq 1 "$rounds"); do
    "$tessera" bench step "$cfg" --steps "$steps" --warmup "$warmup" --calibrate "$tmp/calib.$k.json" "$@" >/dev/null
    for r in "${rl[@]}"; do
        mpiexec.mpich -n "$r" "$tessera" bench step "$cfg" --steps "$steps" --warmup "$warmup" --json "$tmp/dp$r.$k.json" "$@" >/dev/null
        "$tessera" plan "$cfg" "$@" --nodes 1 --ranks-per-node "$r" --layout "$r,1,1" --calib "$tmp/calib.$k.json" \
            --tuning "$tmp/tuning.json" --json "$tmp/pdp$r.$k.json" >"$tmp/pdp$r.$k.txt"
    done
    for s in "${sl[@]}"; do
        [ -z "$s" ] && continue
        mpiexec.mpich -n "$s" "$tessera" bench step "$cfg" parallel.sp="$s" --steps "$steps" --warmup "$warmup" \
            --json "$tmp/sp$s.$k.json" "$@" >/dev/null
        "$tessera" plan "$cfg" "$@" --nodes 1 --ranks-per-node "$s" --layout "1,1,$s" --global-batch "${batch:-2}" \
            --calib "$tmp/calib.$k.json" --tuning "$tmp/tuning.json" --json "$tmp/psp$s.$k.json" >"$tmp/psp$s.$k.txt"
    done
    for q in "${pl[@]}"; do
        [ -z "$q" ] && continue
        mpiexec.mpich -n "$q" "$tessera" bench step "$cfg" parallel.pp="$q" parallel.microbatches="$micro" --steps "$steps" \
            --warmup "$warmup" --json "$tmp/pp$q.$k.json" "$@" >/dev/null
        "$tessera" plan "$cfg" "$@" --nodes 1 --ranks-per-node "$q" --layout "1,$q,1" --global-batch $(( ${batch:-2} * micro )) \
            --calib "$tmp/calib.$k.json" --tuning "$tmp/tuning.json" --json "$tmp/ppp$q.$k.json" >"$tmp/ppp$q.$k.txt"
    done
    echo "round $k done" >&2
done
/usr/bin/python3 - "$tmp" "$rounds" "$ranks" "$sp" "$pp" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
rl = [int(x) for x in sys.argv[3].split(",") if x]
sl = [int(x) for x in sys.argv[4].split(",") if x]
pl = [int(x) for x in sys.argv[5].split(",") if x]
rows = [("dp", r) for r in rl] + [("sp", s) for s in sl] + [("pp", q) for q in pl]
print("| layout | ranks | round | bench step ms | plan ms | plan / measured | plan's bottleneck |")
print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
worst = {}
for kind, r in rows:
    ratios = []
    for k in range(1, rounds + 1):
        m = json.load(open(f"{d}/{kind}{r}.{k}.json"))
        p = json.load(open(f"{d}/p{kind}{r}.{k}.json"))["layouts"][0]
        ratio = p["step_ms"] / m["step_ms"]
        ratios.append(ratio)
        print(f"| {kind} | {r} | {k} | {m['step_ms']:.1f} | {p['step_ms']:.1f} | {ratio:.3f} | {p['bottleneck']} |")
    worst[(kind, r)] = statistics.median(ratios)
print()
ok = True
for (kind, r), x in worst.items():
    inside = abs(x - 1) <= 0.25
    ok &= inside or kind != "dp"
    print(f"{kind} at {r} rank(s): median plan / measured {x:.3f} ({'within' if inside else 'OUTSIDE'} 25%)")
print("data parallel within 25% at every rank count:", "yes" if ok else "NO")
sys.exit(0 if ok else 1)
PY
