#!/bin/bash
# The GPU self-check (docs/gpu.md): run it on a new GPU system, from a build
# tree or from a bundle of the program.
#   jobs/gpu/check.sh [OUTDIR]        (default OUTDIR: ./gpu-check)
# environment:
#   TESSERA        the tessera program (default build/tessera, else bin/tessera beside a bundle's env.sh)
#   GPU_TESTS      folder holding test_layers_cuda and test_device (default build/tests/nn and
#                  build/tests/coll, else the program's folder)
#   MPIEXEC        the MPI launcher (default mpiexec.mpich, else mpiexec)
#   PYTHON         a python3 with PyTorch and a GPU for the comparison (default python3; BENCH=0 skips it)
#   CHECK_BUDGET_S seconds the whole check may take (default 470: under 8 minutes)
# It runs, in this order, each step under a timeout that keeps the whole
# under CHECK_BUDGET_S:
#   1. tessera info: the build, the CUDA libraries and the GPUs;
#   2. the GPU layer tests (tests/nn/test_layers_cuda): cuDNN conv3d,
#      transposed conv3d and conv3d over a concatenation against the CPU
#      kernels, fp32 (TF32 off, <= 1e-4), bf16 and fp16 (<= 1e-2);
#   3. the collectives on device buffers (tessera bench coll --device gpu
#      --check): nccl, hierarchical and auto on 1 rank, hierarchical and auto
#      on 2 ranks faked as 2 nodes of one rank each (one GPU cannot hold two
#      ranks of one NCCL communicator: with one GPU that must be refused, and
#      is checked), float32, bfloat16 and float16, sum and avg, uneven sizes;
#      then the collectives' GPU test program (tests/coll/test_device);
#   4. PyTorch's UNet3D-small at 128^3, batch 2 and 8, bf16 (eager
#      channels_last_3d and torch.compile): the figure tessera's GPU engine
#      is to beat. tessera's own training step does not run on a GPU yet:
#      the check says so rather than timing the CPU.
# Writes OUTDIR/gpu_check.json (one entry per step: name, status
# pass|fail|skip, seconds, detail) and OUTDIR/gpu_check.log (everything
# printed). Exit status: 0 all ran steps passed, 1 some failed, 77 there is
# no GPU here (nothing else runs; the reason is printed).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-gpu-check}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
log=$out/gpu_check.log
json=$out/gpu_check.json
: >"$log"
start=$(date +%s)
budget=${CHECK_BUDGET_S:-470}
tessera=${TESSERA:-}
if [ -z "$tessera" ]; then
    if [ -x "$here/build/tessera" ]; then tessera=$here/build/tessera
    else tessera=$(command -v tessera || true); fi
fi
[ -n "$tessera" ] && [ -x "$tessera" ] || { echo "gpu check: no tessera program (set TESSERA)" | tee -a "$log"; exit 1; }
tests=${GPU_TESTS:-}
if [ -z "$tests" ]; then
    if [ -x "$here/build/tests/nn/test_layers_cuda" ]; then tests=$here/build/tests/nn
    else tests=$(dirname "$tessera"); fi
fi
mpiexec=${MPIEXEC:-$(command -v mpiexec.mpich || command -v mpiexec || true)}
py=${PYTHON:-python3}
# cuDNN, NCCL or cuBLAS not on the loader's path: look where PyTorch's wheels keep them
# (site-packages/nvidia/*/lib), as on a machine with PyTorch but no CUDA packages
if ldd "$tessera" 2>/dev/null | grep -q 'not found'; then
    extra=$("$py" -c 'import glob, os, nvidia
print(":".join(sorted(d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, "*", "lib")) + glob.glob(os.path.join(p, "*", "*", "lib")))))' 2>/dev/null)
    [ -n "$extra" ] && export LD_LIBRARY_PATH="$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
steps=()

say() { echo "$*" | tee -a "$log"; }
left() { echo $((budget - ($(date +%s) - start))); }
mark=0
out_of_step() { tail -n +$((mark + 1)) "$log"; } # what the last run printed
# record NAME STATUS SECONDS DETAIL
record() {
    steps+=("$(python3 -c 'import json,sys; print(json.dumps({"name":sys.argv[1],"status":sys.argv[2],"seconds":float(sys.argv[3]),"detail":sys.argv[4]}))' "$1" "$2" "$3" "$4" 2>/dev/null ||
        printf '{"name":"%s","status":"%s","seconds":%s,"detail":"(python3 missing)"}' "$1" "$2" "$3")")
    say "== $1: $2 ($3 s) $4"
}
finish() {
    local st=$1 gpu=$2
    { printf '{"date":"%s","host":"%s","tessera":"%s","gpu":"%s","status":"%s","steps":[' \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(hostname)" "$tessera" "$gpu" "$st"
      local first=1
      for s in "${steps[@]}"; do [ $first = 1 ] || printf ','; first=0; printf '%s' "$s"; done
      printf ']}\n'; } >"$json"
    say "gpu check: $st; $json, $log"
}
# run NAME TIMEOUT CMD...: runs with the timeout, output to the log; sets rc and secs
run() {
    local name=$1 t=$2; shift 2
    local l; l=$(left)
    [ "$t" -gt "$l" ] && t=$l
    if [ "$t" -le 5 ]; then rc=124; secs=0; say "== $name: no time left in the budget"; return; fi
    say "== $name (timeout $t s): $*"
    mark=$(wc -l <"$log")
    local a; a=$(date +%s.%N)
    timeout -k 10 "$t" "$@" >>"$log" 2>&1
    rc=$?
    secs=$(python3 -c "import time; print(round(time.time() - $a, 1))" 2>/dev/null || echo 0)
}

# 1. the build and the GPUs
missing=$(ldd "$tessera" 2>/dev/null | grep 'not found' | tr -s ' \t' ' ' | tr '\n' ';')
if [ -n "$missing" ]; then
    say "gpu check: $tessera cannot start: libraries not found: $missing (set LD_LIBRARY_PATH)"
    record info fail 0 "libraries not found: $missing"
    finish fail ""
    exit 1
fi
run info 60 "$mpiexec" -n 1 "$tessera" info
info_rc=$rc
gpu=$(sed -n 's/^GPU 0: *//p' "$log" | head -1)
if [ $info_rc -ne 0 ]; then
    record info fail "$secs" "tessera info failed (exit $info_rc): see the log"
    finish fail ""
    exit 1
fi
if grep -q '^CUDA: *not compiled' "$log"; then
    record info skip "$secs" "this tessera was built without CUDA (configure --with-cuda)"
    finish skip ""
    exit 77
fi
if [ -z "$gpu" ]; then
    why=$(sed -n 's/^GPUs: *none found *//p' "$log" | head -1)
    record info skip "$secs" "no GPU here $why"
    say "gpu check: no GPU here $why: nothing to check (exit 77)"
    finish skip ""
    exit 77
fi
record info pass "$secs" "$gpu"

fails=0
# 2. the layers on the GPU against the CPU
if [ -x "$tests/test_layers_cuda" ]; then
    run layers 120 "$tests/test_layers_cuda"
    n_ok=$(out_of_step | grep -c '^ok ')
    n_bad=$(out_of_step | grep -c '^not ok ')
    if [ $rc -eq 0 ] && [ "$n_bad" -eq 0 ] && [ "$n_ok" -gt 0 ]; then
        record layers pass "$secs" "$n_ok checks passed"
    else
        record layers fail "$secs" "exit $rc, $n_ok passed, $n_bad failed: $(out_of_step | grep '^not ok ' | head -3 | tr '\n' ';')"
        fails=$((fails + 1))
    fi
else
    record layers fail 0 "no test_layers_cuda in $tests (build it: make check or make tests/nn/test_layers_cuda)"
    fails=$((fails + 1))
fi

# 3. the collectives on device buffers (docs/collectives.md, "GPU buffers")
# coll NAME NP RANKS_PER_NODE ARGS...: bench coll --device gpu --check, wrong elements counted
coll() {
    local name=$1 np=$2 rpn=$3; shift 3
    run "$name" 60 env TESSERA_RANKS_PER_NODE="$rpn" "$mpiexec" -n "$np" "$tessera" bench coll --device gpu --check \
        --repeat 1 --time-ms 2 "$@"
    if [ $rc -eq 0 ]; then record "$name" pass "$secs" "$np rank(s), $rpn per node: $*"
    else record "$name" fail "$secs" "exit $rc ($np rank(s), $rpn per node: $*): see the log"; fails=$((fails + 1)); fi
}
coll coll-1-f32 1 1 --algo nccl,hierarchical,auto --min-bytes 4 --max-bytes 4000004
coll coll-1-bf16-avg 1 1 --algo nccl,hierarchical,auto --dtype bfloat16 --reduce avg --in-place --min-bytes 2 --max-bytes 2000002
coll coll-1-f16-avg 1 1 --algo nccl,hierarchical,auto --dtype float16 --reduce avg --min-bytes 2 --max-bytes 2000002
coll coll-2nodes-f32 2 1 --algo hierarchical,auto --min-bytes 4 --max-bytes 4000004
coll coll-2nodes-bf16-avg 2 1 --algo hierarchical,auto --dtype bfloat16 --reduce avg --in-place --min-bytes 2 --max-bytes 2000002
# two ranks on one GPU in one NCCL communicator: refused on both ranks, not a failure inside NCCL
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" = 1 ]; then
    for a in nccl hierarchical; do
        run "coll-refuse-$a" 60 "$mpiexec" -n 2 "$tessera" bench coll --device gpu --algo "$a" --max-bytes 64 --repeat 1 --time-ms 1
        n=$(out_of_step | grep -c "share GPU 0")
        if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -ge 2 ]; then record "coll-refuse-$a" pass "$secs" "2 ranks on the one GPU: refused on both"
        else record "coll-refuse-$a" fail "$secs" "exit $rc, 'share GPU 0' on $n of 2 ranks"; fails=$((fails + 1)); fi
    done
fi
# the collectives' GPU test program (every dtype and op, uneven counts, in place or not)
if [ -x "$tests/test_device" ] || [ -x "$here/build/tests/coll/test_device" ]; then
    td=$tests/test_device
    [ -x "$td" ] || td=$here/build/tests/coll/test_device
    for np in 1 2; do
        run "coll-test-device-$np" 90 env TESSERA_RANKS_PER_NODE=1 "$mpiexec" -n $np "$td"
        bad=$(out_of_step | grep -c '^not ok ')
        if [ $rc -eq 0 ] && [ "$bad" -eq 0 ]; then record "coll-test-device-$np" pass "$secs" "$np rank(s), one per node"
        else record "coll-test-device-$np" fail "$secs" "exit $rc, $bad failed"; fails=$((fails + 1)); fi
    done
fi

# 4. PyTorch's UNet3D-small at 128^3 on this GPU (the figure to beat)
if [ "${BENCH:-1}" = 0 ]; then
    record pytorch skip 0 "BENCH=0"
elif ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    record pytorch skip 0 "$py has no PyTorch that sees a GPU"
else
    run pytorch 330 env PYTHONUNBUFFERED=1 "$py" "$here/jobs/gpu/pytorch_gpu.py" "$here/configs/unet3d-small.ini" \
        --patch 128 --batches 2,8 --modes eager,compile
    best=$(out_of_step | grep '"best_of_pytorch"' | python3 -c 'import json,sys
print("; ".join("batch %d: %.1f samples/s (%s), %.1f TFLOP/s, %.3f of peak" % (r["batch"], r["samples_per_s"], r["mode"], r["tflops"], r["fraction_of_peak"]) for r in map(json.loads, sys.stdin)))' 2>/dev/null)
    if [ $rc -eq 0 ] && [ -n "$best" ]; then record pytorch pass "$secs" "$best"
    else record pytorch fail "$secs" "exit $rc: see the log"; fails=$((fails + 1)); fi
fi
record tessera-train skip 0 "tessera's training step does not run on a GPU yet (docs/gpu.md): nothing to time against PyTorch"

if [ $fails -eq 0 ]; then finish pass "$gpu"; exit 0; fi
finish fail "$gpu"
exit 1
