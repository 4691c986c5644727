#!/bin/sh
# Compares `tessera bench step` with PyTorch (Debian python3-torch) on the same
# model, data shape and optimizer, in one script run, against PyTorch's best
# CPU layout: ROUNDS rounds, each running tessera, PyTorch with its default
# NCDHW layout and PyTorch with channels_last_3d (the order rotates from round
# to round, so that all see the same machine state). Prints each measurement,
# the medians, the speed ratio to the faster PyTorch layout and to each, the
# peak resident memory of each, the CPU model and the PyTorch version.
# PRECISION=bf16 runs tessera with train.precision = bf16 and PyTorch under
# torch.autocast("cpu", torch.bfloat16) (what a PyTorch user would do).
#
# usage: jobs/bench/compare_pytorch.sh [CONFIG] [ROUNDS]     (from the build dir
#        or with TESSERA=path/to/tessera); THREADS (default 2), STEPS (5),
#        WARMUP (2), PRECISION (fp32 or bf16), BATCH (train.batch instead of
#        the config's, both sides), CONV (tessera's train.conv: direct or
#        winograd; default the config's), OUT (a directory for the JSON
#        files; default a temp dir).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
config=${1:-$here/../../configs/unet3d-small.ini}
rounds=${2:-3}
threads=${THREADS:-2}
steps=${STEPS:-5}
warmup=${WARMUP:-2}
precision=${PRECISION:-fp32}
batch=${BATCH:-}
tessera=${TESSERA:-./tessera}
python=${PYTHON:-/usr/bin/python3}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
[ -x "$tessera" ] || { echo "compare_pytorch.sh: no tessera binary at $tessera (set TESSERA=...)" >&2; exit 1; }
"$python" -c "import torch" 2> /dev/null || { echo "compare_pytorch.sh: $python has no torch (apt-get install python3-torch)" >&2; exit 1; }
case $precision in
fp32) tprec=""; pprec="" ;;
bf16) tprec="train.precision=bf16"; pprec="--bf16" ;;
*) echo "compare_pytorch.sh: PRECISION is fp32 or bf16, not $precision" >&2; exit 1 ;;
esac
case $batch in
'') ;;
*[!0-9]* | 0) echo "compare_pytorch.sh: BATCH is a positive integer, not $batch" >&2; exit 1 ;;
*) tprec="$tprec train.batch=$batch"; pprec="$pprec --batch $batch" ;;
esac
case ${CONV:-} in
'') ;;
direct | winograd) tprec="$tprec train.conv=$CONV" ;;
*) echo "compare_pytorch.sh: CONV is direct or winograd, not $CONV" >&2; exit 1 ;;
esac
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
flags=$(grep -o -w -E 'avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "config $config${batch:+ (train.batch=$batch)}${CONV:+ (tessera train.conv=$CONV)}, $precision, $threads threads, $steps steps after $warmup warm-up, $rounds rounds"
echo "CPU: $cpu ($(nproc) cores; $flags), PyTorch $("$python" -c 'import torch; print(torch.__version__)'), load $(cut -d' ' -f1-3 /proc/loadavg)"
run_tessera() {
    # shellcheck disable=SC2086 # tprec is words without spaces in them, or none
    OMP_NUM_THREADS=$threads OMP_PROC_BIND=${OMP_PROC_BIND:-false} "$tessera" bench step "$config" $tprec \
        --steps "$steps" --warmup "$warmup" --json "$out/tessera-$1.json" > "$out/tessera-$1.log"
}
run_pytorch() { # round layout
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=$threads "$python" "$here/pytorch_step.py" "$config" --threads "$threads" --steps "$steps" \
        --warmup "$warmup" --layout "$2" $pprec > "$out/pytorch-$2-$1.json"
}
r=1
while [ "$r" -le "$rounds" ]; do
    case $((r % 3)) in
    1) run_tessera "$r"; run_pytorch "$r" ncdhw; run_pytorch "$r" channels_last ;;
    2) run_pytorch "$r" ncdhw; run_pytorch "$r" channels_last; run_tessera "$r" ;;
    0) run_pytorch "$r" channels_last; run_tessera "$r"; run_pytorch "$r" ncdhw ;;
    esac
    r=$((r + 1))
done
"$python" - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
R = range(1, rounds + 1)
t = [json.load(open(f"{out}/tessera-{r}.json")) for r in R]
p = {l: [json.load(open(f"{out}/pytorch-{l}-{r}.json")) for r in R] for l in ("ncdhw", "channels_last")}
for i in range(rounds):
    line = f"round {i + 1}: tessera {t[i]['samples_per_s']:.3f} samples/s ({t[i]['step_ms']:.0f} ms/step)"
    for l in p:
        line += f"   pytorch {l} {p[l][i]['samples_per_s']:.3f} ({p[l][i]['step_ms']:.0f} ms)"
    print(line)
ts = statistics.median(x["samples_per_s"] for x in t)
ps = {l: statistics.median(x["samples_per_s"] for x in p[l]) for l in p}
best = max(ps, key=ps.get)
for l in p:
    print(f"median samples/s: pytorch {l} {ps[l]:.3f}; tessera/pytorch {l} = {ts / ps[l]:.2f}x")
print(f"median samples/s: tessera {ts:.3f}; PyTorch's best layout here is {best}: tessera/pytorch best = {ts / ps[best]:.2f}x")
tr = max(x["peak_rss_mb"] for x in t)
pr = {l: max(x["peak_rss_mb"] for x in p[l]) for l in p}
print(f"peak RSS (max over rounds): tessera {tr:.0f} MiB, pytorch {best} {pr[best]:.0f} MiB; tessera/pytorch = {tr / pr[best]:.2f}")
json.dump({"tessera_samples_per_s": ts, "pytorch_samples_per_s": ps, "pytorch_best_layout": best,
           "ratio_to_best": ts / ps[best], "tessera_peak_rss_mb": tr, "pytorch_peak_rss_mb": pr, "rounds": rounds},
          open(f"{out}/summary.json", "w"))
PY
echo "JSON files in $out"
