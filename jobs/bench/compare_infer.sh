#!/bin/sh
# Compares `tessera infer` with a PyTorch sliding window (Debian python3-torch,
# jobs/bench/pytorch_infer.py: the same windows, Gaussian weights, model and
# checkpoint parameters) on one scan, in one script run, each side's whole
# command timed from start to exit (the interpreter's start and torch's
# import included on PyTorch's side, MPI's start on tessera's):
#
#   - tessera infer, 1 rank, for each precision (fp32, bf16), then once more
#     with label= for the Dice of each precision (not timed);
#   - PyTorch for each precision (fp32; bf16 = torch.autocast("cpu",
#     torch.bfloat16)), layout (NCDHW, channels_last_3d) and windows per
#     forward (1, 4).
#
# Prints every time, PyTorch's best per precision, the ratios, tessera's
# own breakdown (bench infer's parts from its closing line), the share of
# voxels on which tessera's and PyTorch's fp32 masks agree (the check that
# both computed the same thing), and the Dice of fp32 and bf16 against the
# reference with their difference. Writes OUT/summary.json.
#
# usage: jobs/bench/compare_infer.sh CONFIG CHECKPOINT SCAN [LABEL [LABEL_MAP]]
#        (from the build dir or with TESSERA=path/to/tessera); THREADS (2),
#        PRECISIONS ("fp32 bf16"), LAYOUTS ("ncdhw channels_last"), WINDOWS
#        ("1 4"), BATCH (tessera's batch=, windows per forward; default the
#        config's train.batch), STREAMS (tessera's streams=, forwards at
#        once; default 1), OUT (default a temp dir).
#        CHECKPOINT is a checkpoint directory (ckpt/step-N, holding state.h5).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 3 ] || { sed -n '20,27p' "$0" >&2; exit 2; }
config=$1 ckpt=$2 scan=$3 label=${4:-} lmap=${5:-}
threads=${THREADS:-2}
precisions=${PRECISIONS:-fp32 bf16}
layouts=${LAYOUTS:-ncdhw channels_last}
windows=${WINDOWS:-1 4}
tessera=${TESSERA:-./tessera}
python=${PYTHON:-/usr/bin/python3}
mpiexec=${MPIEXEC:-mpiexec.mpich}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
[ -x "$tessera" ] || { echo "compare_infer.sh: no tessera binary at $tessera (set TESSERA=...)" >&2; exit 1; }
[ -f "$ckpt/state.h5" ] || { echo "compare_infer.sh: $ckpt/state.h5 not found (CHECKPOINT is ckpt/step-N)" >&2; exit 1; }
"$python" -c "import torch, nibabel, h5py" 2> /dev/null ||
    { echo "compare_infer.sh: $python lacks torch, nibabel or h5py (apt-get install python3-torch python3-nibabel python3-h5py)" >&2; exit 1; }
batch="${BATCH:+batch=$BATCH}${STREAMS:+ streams=$STREAMS}"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
flags=$(grep -o -w -E 'avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "scan $scan, config $config, checkpoint $ckpt, $threads threads, 1 rank"
echo "CPU: $cpu ($(nproc) cores; $flags), PyTorch $("$python" -c 'import torch; print(torch.__version__)'), load $(cut -d' ' -f1-3 /proc/loadavg)"
now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
: > "$out/times.txt"
for p in $precisions; do
    t0=$(now)
    # shellcheck disable=SC2086 # batch is up to two words
    OMP_NUM_THREADS=$threads "$mpiexec" -n 1 "$tessera" infer "$config" checkpoint="$ckpt" input="$scan" \
        output="$out/tessera-$p.nii.gz" precision="$p" $batch > "$out/tessera-$p.log"
    t1=$(now)
    echo "tessera $p $(sub "$t0" "$t1")" >> "$out/times.txt"
    echo "tessera infer precision=$p: $(sub "$t0" "$t1") s; $(grep '^infer: [0-9.]* s:' "$out/tessera-$p.log")"
    for l in $layouts; do
        for w in $windows; do
            case $p in bf16) pb=--bf16 ;; *) pb= ;; esac
            t0=$(now)
            # shellcheck disable=SC2086 # pb is one word or none
            OMP_NUM_THREADS=$threads "$python" "$here/pytorch_infer.py" "$config" "$ckpt/state.h5" "$scan" \
                "$out/pytorch-$p-$l-$w.nii.gz" --threads "$threads" --windows "$w" --layout "$l" $pb \
                > "$out/pytorch-$p-$l-$w.json"
            t1=$(now)
            echo "pytorch $p $l $w $(sub "$t0" "$t1")" >> "$out/times.txt"
            echo "pytorch $p $l $w windows/forward: $(sub "$t0" "$t1") s (network $("$python" -c \
                "import json,sys; print(round(json.load(open(sys.argv[1]))['network_s'], 2))" "$out/pytorch-$p-$l-$w.json") s)"
        done
    done
done
if [ -n "$label" ]; then
    for p in $precisions; do
        # shellcheck disable=SC2086
        OMP_NUM_THREADS=$threads "$mpiexec" -n 1 "$tessera" infer "$config" checkpoint="$ckpt" input="$scan" \
            output="$out/tessera-$p-dice.nii.gz" precision="$p" $batch label="$label" ${lmap:+label_map="$lmap"} \
            metrics="$out/tessera-$p.metrics.json" > "$out/tessera-$p-dice.log"
    done
fi
"$python" - "$out" "$precisions" <<'PY'
import json, sys
import nibabel as nib
import numpy as np
out, precisions = sys.argv[1], sys.argv[2].split()
t, p = {}, {}
for line in open(f"{out}/times.txt"):
    f = line.split()
    if f[0] == "tessera":
        t[f[1]] = float(f[2])
    else:
        p[(f[1], f[2], int(f[3]))] = float(f[4])
summary = {"tessera_s": t, "pytorch_s": {" ".join(map(str, k)): v for k, v in p.items()}}
best_all = min(p, key=p.get) if p else None
for prec in precisions:
    mine = {k: v for k, v in p.items() if k[0] == prec}
    if not mine or prec not in t:
        continue
    b = min(mine, key=mine.get)
    r = mine[b] / t[prec]
    print(f"{prec}: tessera {t[prec]:.2f} s; PyTorch's best {prec} ({b[1]}, {b[2]} windows/forward) {mine[b]:.2f} s: "
          f"tessera is {r:.2f}x faster; against PyTorch's best of all ({best_all[0]} {best_all[1]} {best_all[2]}, "
          f"{p[best_all]:.2f} s): {p[best_all] / t[prec]:.2f}x")
    summary[f"ratio_{prec}"] = r
    summary[f"ratio_{prec}_to_best_of_all"] = p[best_all] / t[prec]
    summary[f"pytorch_best_{prec}"] = " ".join(map(str, b))
if "fp32" in t and p:
    a = np.asarray(nib.load(f"{out}/tessera-fp32.nii.gz").dataobj)
    ks = [k for k in p if k[0] == "fp32"]
    if ks:
        b = np.asarray(nib.load(f"{out}/pytorch-{ks[0][0]}-{ks[0][1]}-{ks[0][2]}.nii.gz").dataobj)
        agree = float((a == b).mean())
        print(f"fp32 masks, tessera against PyTorch {ks[0][1]} {ks[0][2]}: {agree * 100:.4f} % of the voxels agree")
        summary["fp32_mask_agreement"] = agree
dice = {}
for prec in precisions:
    try:
        dice[prec] = json.load(open(f"{out}/tessera-{prec}.metrics.json"))
    except OSError:
        pass
if dice:
    fg = {k: v["scans"][0]["foreground_mean_dice"] for k, v in dice.items()}
    print("tessera foreground mean Dice: " + ", ".join(f"{k} {v:.4f}" for k, v in fg.items() if v is not None))
    if fg.get("fp32") is not None and fg.get("bf16") is not None:
        print(f"bf16 - fp32 foreground Dice: {fg['bf16'] - fg['fp32']:+.4f}")
        summary["fg_dice"] = fg
        summary["fg_dice_bf16_minus_fp32"] = fg["bf16"] - fg["fp32"]
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
PY
echo "files in $out"
