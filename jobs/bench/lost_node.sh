#!/bin/bash
# What a lost node costs (issue [14]; docs/testing.md, "Losing a node"), on
# jobs/cluster's namespaces over a shaped link, as root:
#   jobs/bench/lost_node.sh [ROUNDS]            (environment: TESSERA, LINK, STEPS, AT, EVERY)
# Per round and mode, a dp 4 run (2 nodes x 2 ranks, STEPS steps, a
# checkpoint every EVERY) loses n2 (its processes killed) after step AT, and
# is relaunched on n1 alone with train.accum = 2 (the global batch kept):
#   emergency: as shipped (ckpt.emergency = true) under jobs/elastic.sh:
#              the survivors' state of the last finished step;
#   periodic:  ckpt.emergency = false, relaunched the same way by this
#              script (what torchrun or a resubmission does): the last
#              periodic checkpoint.
# Prints per run the last step finished before the loss, the step resumed
# from, the steps lost, and the seconds from the loss until the first step
# after the lost one is done again (detection, exit, relaunch, start-up,
# assembly, steps redone), then the medians over rounds.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
rounds=${1:-3}
steps=${STEPS:-120}
at=${AT:-80}
every=${EVERY:-50}
link=${LINK:-1gbit}
[ "$(id -u)" = 0 ] || { echo "jobs/bench/lost_node.sh: needs root (network namespaces)" >&2; exit 77; }
export TESSERA_CLUSTER_NS=${TESSERA_CLUSTER_NS:-tslost-}
C=$here/jobs/cluster
d=$(mktemp -d /tmp/tessera-lost.XXXXXX)
trap '"$C/down" >/dev/null 2>&1; rm -rf "$d"' EXIT
cat >"$d/b.ini" <<'INI'
[model]
channels = 8,16,32
classes = 3
[data]
patch = 24
[train]
batch = 1
lr = 0.02
momentum = 0.9
log_every = 1
[eval]
final = false
INI
"$tessera" synth --out "$d/syn.h5" --count 8 --size 32 --classes 3 --seed 5 >/dev/null || exit 1
args=(train "$d/b.ini" data.path="$d/syn.h5" train.steps="$steps" ckpt.every="$every" fault.timeout=10)
# one run: MODE ROUND -> "ks from lost seconds" on stdout
one() {
    local mode=$1 r=$2 run=$d/$1-$2 log=$d/$1-$2.log ks from t0 t1 el
    "$C/up" 2 --ranks-per-node 2 --link "$link" >/dev/null || return 1
    if [ "$mode" = emergency ]; then
        "$here/jobs/elastic.sh" --hosts n1:2,n2:2 --launcher "$C/mpiexec" -- "$tessera" "${args[@]}" run.dir="$run" >"$log" 2>&1 &
    else
        timeout -k 10 600 "$C/mpiexec" -n 4 "$tessera" "${args[@]}" run.dir="$run" ckpt.emergency=false >"$log" 2>&1 &
    fi
    el=$!
    for _ in $(seq 1 3000); do grep -q "\"step\": $at," "$run/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
    t0=$(date +%s.%N)
    "$C/kill" n2 >/dev/null
    ks=$(grep -o '"step": [0-9]*' "$run/metrics.jsonl" | tail -1 | grep -o '[0-9]*$')
    if [ "$mode" = periodic ]; then # the survivors end (the watchdog); then the same relaunch on n1
        wait "$el"
        timeout -k 10 600 "$C/mpiexec" --nodes n1 -n 2 "$tessera" "${args[@]}" run.dir="$run" ckpt.emergency=false \
            train.accum=2 >>"$log" 2>&1 &
        el=$!
    fi
    t1=
    for _ in $(seq 1 6000); do
        if grep -q "\"step\": $((ks + 1))," "$run/metrics.jsonl" 2>/dev/null; then t1=$(date +%s.%N); break; fi
        sleep 0.05
    done
    wait "$el"
    from=$(grep -o 'resumed from .*ckpt/step-[0-9]* at step [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    "$C/down" >/dev/null 2>&1
    echo "${ks:-?} ${from:-0} $( [ -n "$t1" ] && printf '%.1f' "$(echo "$t1 - $t0" | bc)" || echo never)"
}
printf '%-10s %5s %12s %12s %10s %26s\n' mode round "last done" "resumed at" "steps lost" "s to step (last done + 1)"
for r in $(seq 1 "$rounds"); do
    for mode in emergency periodic; do
        read -r ks from secs < <(one "$mode" "$r")
        printf '%-10s %5s %12s %12s %10s %26s\n' "$mode" "$r" "$ks" "$from" "$((ks - from))" "$secs"
        echo "$mode $((ks - from)) $secs" >>"$d/all"
    done
done
echo "medians over $rounds round(s) (dp 4 on 2 nodes x 2 ranks, n2 killed after step ~$at, checkpoints every $every, link $link):"
med() { sort -g | awk '{v[NR] = $1} END {print NR ? v[int((NR + 1) / 2)] : "none"}'; }
for mode in emergency periodic; do
    printf '  %-10s steps lost %s, seconds to be back at the step lost %s\n' "$mode" \
        "$(awk -v m="$mode" '$1 == m {print $2}' "$d/all" | med)" "$(awk -v m="$mode" '$1 == m {print $3}' "$d/all" | med)"
done
