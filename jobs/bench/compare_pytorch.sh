#!/bin/sh
# Compares `tessera bench step` with PyTorch (Debian python3-torch 1.13) on the
# same model, data shape and optimizer, in one script run: ROUNDS rounds, each
# running tessera and PyTorch one after the other (alternating which goes
# first), so that both see the same machine state; prints each measurement,
# the medians, the speed ratio and the peak resident memory of each.
#
# usage: jobs/bench/compare_pytorch.sh [CONFIG] [ROUNDS]     (from the build dir
#        or with TESSERA=path/to/tessera); THREADS (default 2), STEPS (5),
#        WARMUP (2), OUT (a directory for the JSON files; default a temp dir).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
config=${1:-$here/../../configs/unet3d-small.ini}
rounds=${2:-3}
threads=${THREADS:-2}
steps=${STEPS:-5}
warmup=${WARMUP:-2}
tessera=${TESSERA:-./tessera}
python=${PYTHON:-/usr/bin/python3}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
[ -x "$tessera" ] || { echo "compare_pytorch.sh: no tessera binary at $tessera (set TESSERA=...)" >&2; exit 1; }
"$python" -c "import torch" 2> /dev/null || { echo "compare_pytorch.sh: $python has no torch (apt-get install python3-torch)" >&2; exit 1; }
echo "config $config, $threads threads, $steps steps after $warmup warm-up, $rounds rounds; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
run_tessera() {
    OMP_NUM_THREADS=$threads OMP_PROC_BIND=${OMP_PROC_BIND:-false} "$tessera" bench step "$config" \
        --steps "$steps" --warmup "$warmup" --json "$out/tessera-$1.json" > "$out/tessera-$1.log"
}
run_pytorch() {
    OMP_NUM_THREADS=$threads "$python" "$here/pytorch_step.py" "$config" --threads "$threads" --steps "$steps" \
        --warmup "$warmup" > "$out/pytorch-$1.json"
}
r=1
while [ "$r" -le "$rounds" ]; do
    if [ $((r % 2)) -eq 1 ]; then run_tessera "$r"; run_pytorch "$r"; else run_pytorch "$r"; run_tessera "$r"; fi
    r=$((r + 1))
done
"$python" - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
t = [json.load(open(f"{out}/tessera-{r}.json")) for r in range(1, rounds + 1)]
p = [json.load(open(f"{out}/pytorch-{r}.json")) for r in range(1, rounds + 1)]
for r in range(rounds):
    print(f"round {r + 1}: tessera {t[r]['samples_per_s']:.3f} samples/s ({t[r]['step_ms']:.0f} ms/step, "
          f"peak RSS {t[r]['peak_rss_mb']:.0f} MiB)   pytorch {p[r]['samples_per_s']:.3f} samples/s "
          f"({p[r]['step_ms']:.0f} ms/step, peak RSS {p[r]['peak_rss_mb']:.0f} MiB)   ratio {t[r]['samples_per_s'] / p[r]['samples_per_s']:.2f}")
ts, ps = statistics.median(x["samples_per_s"] for x in t), statistics.median(x["samples_per_s"] for x in p)
tr, pr = max(x["peak_rss_mb"] for x in t), max(x["peak_rss_mb"] for x in p)
print(f"median samples/s: tessera {ts:.3f}, pytorch {ps:.3f}; tessera/pytorch = {ts / ps:.2f}x")
print(f"median voxels/s:  tessera {statistics.median(x['voxels_per_s'] for x in t):.4g}, pytorch {statistics.median(x['voxels_per_s'] for x in p):.4g}")
print(f"peak RSS (max over rounds): tessera {tr:.0f} MiB, pytorch {pr:.0f} MiB; tessera/pytorch = {tr / pr:.2f}")
json.dump({"tessera_samples_per_s": ts, "pytorch_samples_per_s": ps, "ratio": ts / ps,
           "tessera_peak_rss_mb": tr, "pytorch_peak_rss_mb": pr, "rounds": rounds}, open(f"{out}/summary.json", "w"))
PY
echo "JSON files in $out"
