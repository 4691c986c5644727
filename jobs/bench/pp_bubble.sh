#!/bin/bash
# Pipeline bubble and activation memory: `tessera bench step` on P ranks
# (parallel.pp = P stages, M micro-batches, 1 OpenMP thread per rank) with
# GPipe and with 1F1B, alternated ROUNDS times in one run, the cut fixed by
# CUT (default: configs/pipeline-bench.ini's balanced dec0) so that both
# schedules run the same stages. Prints per run each stage's busy and idle
# time and bubble = idle / span, the bottleneck stage's bubble against
# (P-1)/(M+P-1), and the activation memory per stage of both schedules
# against the factor the schedule predicts (M / min(M, P - s) micro-batches
# in flight) (issue [6]: bubble within 15% of the formula at P = 2, M = 8).
#   jobs/bench/pp_bubble.sh [CONFIG] [ROUNDS] [P] [M] [key=value ...]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
cfg=${1:-$here/configs/pipeline-bench.ini}
rounds=${2:-3}
p=${3:-2}
m=${4:-8}
shift $(( $# >= 4 ? 4 : $# )) || true
cut=${CUT:-dec0}
steps=${STEPS:-3}
warmup=${WARMUP:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
for r in $(seq 1 "$rounds"); do
    for s in gpipe 1f1b; do
        mpiexec.mpich -n "$p" "$tessera" bench step "$cfg" --steps "$steps" --warmup "$warmup" --json "$tmp/$s.$r.json" \
            parallel.pp="$p" parallel.microbatches="$m" parallel.schedule=$s parallel.pp_cut="$cut" "$@" >/dev/null
    done
    echo "round $r done" >&2
done
/usr/bin/python3 - "$tmp" "$rounds" "$p" "$m" <<'PY'
import json, statistics, sys
d, rounds, P, M = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
runs = {s: [json.load(open(f"{d}/{s}.{r}.json")) for r in range(1, rounds + 1)] for s in ("gpipe", "1f1b")}
formula = (P - 1) / (M + P - 1)
b = runs["1f1b"][0]
print(f"{b['config']}: patch {'x'.join(map(str, b['patch']))}, batch {b['batch']} x {M} micro-batches, P = {P}, "
      f"stages {[s['units'] for s in b['stages']]}; (P-1)/(M+P-1) = {formula:.4f}")
# The formula assumes P equal stages. With the stage times measured in the
# same run, stage k idles 1 - busy_k / span, with the span each schedule
# has in a flow shop of identical micro-batches: 1F1B interleaves a stage's
# forwards and backwards, so its span is (M - 1) max t + sum t with
# t_k = busy_k / M; GPipe runs all forwards, then all backwards, two flow
# shops one after the other, so its span is (M - 1) max f + sum f +
# (M - 1) max b + sum b with f_k, b_k the forward and backward time of one
# micro-batch: stages whose forward and backward shares differ idle more
# under GPipe than their total times say. That prediction is the last
# column's reference.
print("| round | schedule | samples/s | stage busy / idle ms | stage forward / backward ms | bubble per stage "
      "| bottleneck bubble | / formula | predicted from stage times | bottleneck / predicted |")
print("| ---: | --- | ---: | --- | --- | --- | ---: | ---: | --- | ---: |")
bott = {"gpipe": [], "1f1b": []}
ratio = {"gpipe": [], "1f1b": []}
for r in range(rounds):
    for s in ("gpipe", "1f1b"):
        j = runs[s][r]
        st = j["stages"]
        k = max(range(len(st)), key=lambda i: st[i]["busy_ms"])
        if s == "gpipe":
            f = [x["forward_ms"] / M for x in st]
            b = [x["backward_ms"] / M for x in st]
            span = (M - 1) * max(f) + sum(f) + (M - 1) * max(b) + sum(b)
        else:
            t = [x["busy_ms"] / M for x in st]
            span = (M - 1) * max(t) + sum(t)
        pred = [1 - x["busy_ms"] / span for x in st]
        bott[s].append(st[k]["bubble"])
        ratio[s].append(st[k]["bubble"] / pred[k] if pred[k] > 0 else float("nan"))
        print(f"| {r + 1} | {s} | {j['samples_per_s']:.3f} | "
              + ", ".join(f"{x['busy_ms']:.0f} / {x['idle_ms']:.0f}" for x in st) + " | "
              + ", ".join(f"{x['forward_ms']:.0f} / {x['backward_ms']:.0f}" for x in st) + " | "
              + ", ".join(f"{x['bubble']:.3f}" for x in st) + f" | {st[k]['bubble']:.3f} | {st[k]['bubble'] / formula:.2f} | "
              + ", ".join(f"{x:.3f}" for x in pred) + f" | {ratio[s][-1]:.2f} |")
for s in ("gpipe", "1f1b"):
    med = statistics.median(bott[s])
    print(f"\n{s}: median bottleneck-stage bubble {med:.4f} = {med / formula:.2f} x the formula {formula:.4f}; "
          f"median {statistics.median(ratio[s]):.2f} x the bubble predicted from the run's own stage times")
g, f = runs["gpipe"][0]["stages"], runs["1f1b"][0]["stages"]
print("\n| stage | micro-batches in flight gpipe / 1f1b (predicted factor) | in-flight activations MiB gpipe / 1f1b (factor) "
      "| all activation buffers MiB gpipe / 1f1b (factor) |")
print("| ---: | --- | --- | --- |")
for k in range(P):
    pred = g[k]["slots"] / f[k]["slots"]
    ia, ib = g[k]["slots"] * g[k]["slot_bytes"] / 2**20, f[k]["slots"] * f[k]["slot_bytes"] / 2**20
    aa, ab = g[k]["act_bytes"] / 2**20, f[k]["act_bytes"] / 2**20
    print(f"| {k} | {g[k]['slots']:.0f} / {f[k]['slots']:.0f} ({pred:.1f}x) | {ia:.1f} / {ib:.1f} ({ia / ib:.2f}x) "
          f"| {aa:.1f} / {ab:.1f} ({aa / ab:.2f}x) |")
PY
