#!/bin/bash
# Mixed precision (issue [9] acceptance 1), two measurements in one script:
#   speed:    `tessera bench step` of configs/unet3d-small.ini at 64^3, batch 2,
#             THREADS (default 2) threads, one rank, train.precision = fp32 and
#             bf16 alternated ROUNDS times (which goes first alternates too);
#             prints samples/s and process CPU time per step of each round, the
#             medians and the bf16/fp32 ratios (target >= 1.5x, goal 1.8x),
#             then one single-thread round of each (CPU-time ratio, the figure a
#             loaded machine changes least), and the load before and after.
#   converge: STEPS (default 300) steps of the synthetic segmentation task
#             (tessera synth phantoms, as jobs/bench/local_sgd.sh) on RANKS
#             ranks in fp32, bf16 and fp16, side by side; prints the final loss
#             (mean of the last tenth of the steps) of each relative to fp32
#             (acceptance: bf16 within 5%).
#   jobs/bench/precision.sh [speed|converge|all] [ROUNDS|STEPS] [RANKS]
# TESSERA (default build/tessera), THREADS, BSTEPS (timed steps per run, 3),
# WARMUP (1).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
. "$here/jobs/bench/synthetic_task.sh"
what=${1:-all}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -x "$tessera" ] || { echo "precision.sh: no tessera binary at $tessera (set TESSERA=...)" >&2; exit 1; }

speed() {
    local rounds=$1 threads=${THREADS:-2} steps=${BSTEPS:-3} warmup=${WARMUP:-1}
    local cfg=$here/configs/unet3d-small.ini
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
    bench() { # bench PREC THREADS NAME
        OMP_NUM_THREADS=$2 OMP_PROC_BIND=${OMP_PROC_BIND:-false} mpiexec.mpich -n 1 "$tessera" bench step "$cfg" \
            data.patch=64 train.batch=2 train.precision="$1" --steps "$steps" --warmup "$warmup" \
            --json "$tmp/$3.json" >"$tmp/$3.log"
    }
    for r in $(seq 1 "$rounds"); do
        if [ $((r % 2)) -eq 1 ]; then
            bench fp32 "$threads" "fp32.$r"; bench bf16 "$threads" "bf16.$r"
        else
            bench bf16 "$threads" "bf16.$r"; bench fp32 "$threads" "fp32.$r"
        fi
        echo "round $r done" >&2
    done
    bench fp32 1 fp32.1t
    bench bf16 1 bf16.1t
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
    /usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
f = [json.load(open(f"{d}/fp32.{r}.json")) for r in range(1, rounds + 1)]
b = [json.load(open(f"{d}/bf16.{r}.json")) for r in range(1, rounds + 1)]
print(f"UNet3D {b[0]['config']}, patch {'x'.join(str(x) for x in b[0]['patch'])}, batch {b[0]['batch']}, "
      f"{b[0]['threads']} threads, bf16 kernels: {b[0]['conv_kernels']}")
print("| round | fp32 samples/s | bf16 samples/s | ratio | fp32 CPU ms/step | bf16 CPU ms/step | CPU ratio |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r, (x, y) in enumerate(zip(f, b), 1):
    print(f"| {r} | {x['samples_per_s']:.3f} | {y['samples_per_s']:.3f} | {y['samples_per_s'] / x['samples_per_s']:.2f} | "
          f"{x['cpu_ms']:.0f} | {y['cpu_ms']:.0f} | {x['cpu_ms'] / y['cpu_ms']:.2f} |")
mf = statistics.median(x["samples_per_s"] for x in f)
mb = statistics.median(x["samples_per_s"] for x in b)
rr = statistics.median(y["samples_per_s"] / x["samples_per_s"] for x, y in zip(f, b))
print(f"\nmedian: fp32 {mf:.3f} samples/s, bf16 {mb:.3f} samples/s; median of the rounds' ratios {rr:.2f}x "
      f"(target 1.5x, goal 1.8x)")
x, y = json.load(open(f"{d}/fp32.1t.json")), json.load(open(f"{d}/bf16.1t.json"))
print(f"one thread: fp32 {x['cpu_ms']:.0f} ms, bf16 {y['cpu_ms']:.0f} ms CPU per step: ratio {x['cpu_ms'] / y['cpu_ms']:.2f}x; "
      f"wall {y['samples_per_s'] / x['samples_per_s']:.2f}x")
PY
}

converge() {
    local steps=$1 ranks=$2
    export OMP_NUM_THREADS=1
    synthetic_task "$tmp" "$steps"
    for p in fp32 bf16 fp16; do
        mpiexec.mpich -n "$ranks" "$tessera" train "$tmp/task.ini" data.path="$tmp/syn.h5" run.dir="$tmp/$p" \
            train.precision=$p >/dev/null
        echo "$p done" >&2
    done
    /usr/bin/python3 - "$tmp" "$steps" "$ranks" <<'PY'
import json, sys
d, steps, ranks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def final(r):
    l = [json.loads(x)['loss'] for x in open(f"{d}/{r}/metrics.jsonl")]
    k = max(1, len(l) // 10)
    return sum(l[-k:]) / k, l[0]
base = final('fp32')[0]
print(f"synthetic task, {ranks} ranks x batch 2, {steps} steps; final loss = mean of the last {max(1, steps // 10)} steps")
print("| precision | first loss | final loss | vs fp32 | fp16 overflow steps | samples/s |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for r in ('fp32', 'bf16', 'fp16'):
    p = json.load(open(f"{d}/{r}/perf.json"))
    f, first = final(r)
    pr = p['precision']
    print(f"| {r} ({pr['conv_kernels']}) | {first:.4f} | {f:.4f} | {f / base:.4f} | "
          f"{pr['overflow_steps_max']:.0f} | {p['samples_per_s']:.1f} |")
PY
}

case $what in
speed) speed "${2:-3}" ;;
converge) converge "${2:-300}" "${3:-2}" ;;
all) speed 3; converge 300 2 ;;
*) echo "usage: jobs/bench/precision.sh [speed [ROUNDS] | converge [STEPS] [RANKS] | all]" >&2; exit 2 ;;
esac
