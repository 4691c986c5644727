#!/bin/bash
# Gradient compression against uncompressed data parallelism (issue [9]
# acceptance 3): the synthetic segmentation task of jobs/bench/local_sgd.sh
# (tessera synth phantoms), RANKS replicas, STEPS steps, side by side in one
# invocation: parallel.compress = none, bf16, topk:0.01, sign, powersgd:4.
# Prints the final loss (mean of the last tenth of the steps) relative to
# uncompressed, and perf.json's bytes per rank and step against float32:
# the message a rank contributes (compress.per_step.ratio) and what it sends
# with ring-style exchanges (wire_ratio); for PowerSGD also the factor
# expected from the bucket's matrix shape, n / ((m + c) r). A method may
# carry more keys after commas (sign,parallel.compress_warmup=60).
#   jobs/bench/compress.sh [STEPS] [RANKS] [METHODS...]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
. "$here/jobs/bench/synthetic_task.sh"
steps=${1:-300}
ranks=${2:-4}
shift $(( $# < 2 ? $# : 2 ))
methods=("$@")
[ ${#methods[@]} -gt 0 ] || methods=(bf16 topk:0.01 sign powersgd:4 sign,parallel.compress_warmup=60)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
synthetic_task "$tmp" "$steps"
run() { # run NAME METHOD[,KEY=VALUE...]
    local IFS=,
    local spec=($2)
    mpiexec.mpich -n "$ranks" "$tessera" train "$tmp/task.ini" data.path="$tmp/syn.h5" run.dir="$tmp/$1" \
        parallel.compress="${spec[0]}" "${spec[@]:1}" >/dev/null
    echo "$2" >"$tmp/$1/spec"
    echo "$2 done" >&2
}
names=(none)
run none none
for i in "${!methods[@]}"; do
    names+=("m$i")
    run "m$i" "${methods[$i]}"
done
/usr/bin/python3 - "$tmp" "$steps" "$ranks" "${names[@]}" <<'PY'
import json, math, sys
d, steps, ranks, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
def final(r):
    l = [json.loads(x)['loss'] for x in open(f"{d}/{r}/metrics.jsonl")]
    k = max(1, len(l) // 10)
    return sum(l[-k:]) / k, l[0], all(math.isfinite(x) for x in l)
base = final('none')[0]
print(f"{ranks} replicas x batch 2, {steps} steps; final loss = mean of the last {max(1, steps // 10)} steps; "
      "bytes per rank and step from perf.json")
print("| parallel.compress | final loss | vs none | bytes/step | vs float32 | wire bytes/step | wire vs float32 | expected | samples/s |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in names:
    p = json.load(open(f"{d}/{r}/perf.json"))
    c = p['compress']
    s = c['per_step']
    f, first, finite = final(r)
    mode = c['mode']
    spec = open(f"{d}/{r}/spec").read().strip()
    if c['warmup_steps']:
        spec += f" (bytes/step: compressed steps; over all {c['steps']} steps {c['total']['ratio']:.1f}x)"
    if mode == 'bf16':
        exp = '2.0x'
    elif mode.startswith('topk:'):
        exp = f"{0.5 / float(mode[5:]):.1f}x (4n / 8k)"
    elif mode == 'sign':
        exp = f"{32 / (1 + 32 / 256):.1f}x (1 bit + a float per 256)"
    elif mode.startswith('powersgd:'):
        # one bucket of n floats as an m x c matrix, m = ceil(sqrt n), c = ceil(n / m): n / ((m + c) r)
        n, rk = round(s['fp32_bytes'] / 4), int(mode[9:])
        m = math.isqrt(n - 1) + 1 if n > 1 else 1
        cc = -(-n // m)
        exp = f"{n / ((m + cc) * min(rk, m, cc)):.1f}x (n = {n}, {m} x {cc}, rank {min(rk, m, cc)})"
    else:
        exp = '1.0x'
    print(f"| {spec} | {f:.4f}{'' if finite else ' (non-finite)'} | {f / base:.3f} | {s['bytes']:.0f} | {s['ratio']:.1f}x | "
          f"{s['wire_bytes']:.0f} | {s['wire_ratio']:.1f}x | {exp} | {p['samples_per_s']:.1f} |")
PY
