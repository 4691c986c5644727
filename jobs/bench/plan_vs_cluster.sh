#!/bin/bash
# `tessera plan` against `tessera bench step` on jobs/cluster's nodes over a
# shaped link (issue [13] acceptance 4; docs/scaling.md "A real network on
# one machine"), as root:
#   jobs/bench/plan_vs_cluster.sh [CONFIG] [ROUNDS] [key=value ...]
# environment: LINK (default 1gbit), KEEP=DIR (keep the JSON), STEPS, WARMUP, TUNING=FILE (a tuning
# table of an earlier run: skips step 1's collectives).
# 1. calibrates, as a user would: the link's alpha and beta and the
#    multi-node allreduce fits from `bench coll --tune` on 2 nodes x 1 rank,
#    2 x 2 and 4 x 1 (one tuning table); the shared-memory fits on one node
#    of 2 ranks; the layer rates at the patch and the boxes of sp 2, 4, 8
#    (`bench step --calibrate`, one rank; in every round: the machine drifts);
# 2. per round, bench step and `plan --layout` of the same layout on
#    dp 2 (2 nodes x 1 rank), dp 2 x sp 2 (2 nodes x 2 ranks: the spatial
#    pairs inside a node), dp 4 (4 x 1) and dp 2 x sp 2 (4 x 1: the spatial
#    pairs across nodes), batch train.batch per replica;
# 3. prints predicted / measured per layout and round and the median over
#    rounds; exit 1 when a median is outside 25 %.
# The nodes share this machine's cores: plan gets --cores-per-node = cores /
# nodes (a fraction with 4 nodes on 2 cores), so its compute is this
# machine's; what it predicts for the network is the shaped link's.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
cfg=${1:-$here/configs/unet3d-small.ini}
rounds=${2:-3}
shift $(($# >= 2 ? 2 : $#)) || true
steps=${STEPS:-3}
warmup=${WARMUP:-1}
link=${LINK:-1gbit}
C=$here/jobs/cluster
[ "$(id -u)" -eq 0 ] || { echo "plan_vs_cluster.sh: needs root (jobs/cluster: network namespaces)" >&2; exit 77; }
tmp=${KEEP:-$(mktemp -d)}
mkdir -p "$tmp"
export TESSERA_CLUSTER_DIR=$tmp/cluster TESSERA_CLUSTER_NS=tspv$$- OMP_NUM_THREADS=1 TESSERA_FINALIZE_GRACE=10
unset TESSERA_RANKS_PER_NODE
cleanup() {
    "$C/down" >/dev/null 2>&1 || true
    [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
cores=$(getconf _NPROCESSORS_ONLN) # (not nproc: it follows OMP_NUM_THREADS)
batch=$(sed -n 's/^batch *= *//p' "$cfg" | head -1)
batch=${batch:-2}
for a in "$@"; do case $a in train.batch=*) batch=${a#train.batch=} ;; esac; done
up() { "$C/down" >/dev/null 2>&1 || true; "$C/up" "$@" --link "$link" >/dev/null; }
cl() { local np=$1; shift; timeout -k 10 900 "$C/mpiexec" -n "$np" "$@"; }
tune=(--tune "$tmp/tuning.json" --min-bytes 8 --max-bytes 16M --repeat 3 --time-ms 5)

# 1. the collectives: one node (shared memory), then the link (TUNING=FILE: a table measured before)
if [ -n "${TUNING:-}" ]; then
    cp "$TUNING" "$tmp/tuning.json"
else
    mpiexec.mpich -n 2 "$tessera" bench coll "${tune[@]}" >"$tmp/coll.1x2.txt"
    up 2 --ranks-per-node 1
    cl 2 "$tessera" bench coll "${tune[@]}" >"$tmp/coll.2x1.txt"
    up 2 --ranks-per-node 2
    TESSERA_YIELD=1 cl 4 "$tessera" bench coll "${tune[@]}" >"$tmp/coll.2x2.txt"
    up 4 --ranks-per-node 1
    TESSERA_YIELD=1 cl 4 "$tessera" bench coll "${tune[@]}" >"$tmp/coll.4x1.txt"
    "$C/down" >/dev/null
    grep -h "^# \(tuning\|model\)" "$tmp"/coll.*.txt >&2 || true
fi

# name NODES RPN DP SP: one measured layout per round
layouts=("dp2-2x1 2 1 2 1" "dp2sp2-2x2 2 2 2 2" "dp4-4x1 4 1 4 1" "dp2sp2-4x1 4 1 2 2")
for k in $(seq 1 "$rounds"); do
    "$tessera" bench step "$cfg" "$@" --steps "$steps" --warmup "$warmup" --calibrate "$tmp/calib.$k.json" >"$tmp/calib.$k.txt"
    for l in "${layouts[@]}"; do
        read -r name nodes rpn dp sp <<<"$l"
        up "$nodes" --ranks-per-node "$rpn"
        # the nodes share this machine's cores: with more ranks than cores, waits yield (as MPI ranks on
        # one node do by themselves, collectives/p2p.c: each node here sees all the cores)
        if [ $((nodes * rpn)) -gt "$cores" ]; then export TESSERA_YIELD=1; else unset TESSERA_YIELD; fi
        cl $((nodes * rpn)) "$tessera" bench step "$cfg" "$@" parallel.sp="$sp" --steps "$steps" --warmup "$warmup" \
            --json "$tmp/m.$name.$k.json" >"$tmp/m.$name.$k.txt"
        "$tessera" plan "$cfg" "$@" --nodes "$nodes" --ranks-per-node "$rpn" --layout "$dp,1,$sp" \
            --cores-per-node "$(awk "BEGIN{print $cores / $nodes}")" --global-batch $((batch * dp)) \
            --calib "$tmp/calib.$k.json" --tuning "$tmp/tuning.json" --json "$tmp/p.$name.$k.json" >"$tmp/p.$name.$k.txt"
    done
    "$C/down" >/dev/null
    echo "round $k done" >&2
done
head -3 "$tmp/p.dp2-2x1.1.txt" | tail -2
/usr/bin/python3 - "$tmp" "$rounds" "${layouts[@]}" <<'PY'
import json, statistics, sys
d, rounds, layouts = sys.argv[1], int(sys.argv[2]), [x.split() for x in sys.argv[3:]]
print("| layout | nodes x ranks | round | bench step ms | plan ms | plan / measured | halo exposed ms (measured / plan) | plan's bottleneck |")
print("| --- | --- | ---: | ---: | ---: | ---: | --- | --- |")
ok, med = True, {}
for name, nodes, rpn, dp, sp in layouts:
    rs = []
    for k in range(1, rounds + 1):
        m = json.load(open(f"{d}/m.{name}.{k}.json"))
        p = json.load(open(f"{d}/p.{name}.{k}.json"))["layouts"][0]
        r = p["step_ms"] / m["step_ms"]
        rs.append(r)
        halo = f"{m.get('halo_exposed_ms', 0):.1f} / {p.get('halo_ms', 0):.1f}" if int(sp) > 1 else "-"
        print(f"| dp {dp} x sp {sp} | {nodes} x {rpn} | {k} | {m['step_ms']:.1f} | {p['step_ms']:.1f} | {r:.3f} | {halo} | {p['bottleneck']} |")
    med[name] = statistics.median(rs)
print()
for name, nodes, rpn, dp, sp in layouts:
    x = med[name]
    inside = abs(x - 1) <= 0.25
    ok &= inside
    print(f"dp {dp} x sp {sp} on {nodes} nodes x {rpn}: median plan / measured {x:.3f} ({'within' if inside else 'OUTSIDE'} 25%)")
sys.exit(0 if ok else 1)
PY
