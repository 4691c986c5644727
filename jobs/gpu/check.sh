#!/bin/bash
# The GPU self-check (docs/gpu.md): run it on a new GPU system, from a build
# tree or from a bundle of the program.
#   jobs/gpu/check.sh [OUTDIR]        (default OUTDIR: ./gpu-check)
# environment:
#   TESSERA        the tessera program (default build/tessera, else bin/tessera beside a bundle's env.sh)
#   GPU_TESTS      folder holding test_layers_cuda, test_device and golden_compare (default
#                  build/tests/nn, build/tests/coll and build/tests/model, else the program's folder)
#   MPIEXEC        the MPI launcher (default mpiexec.mpich, else mpiexec)
#   PYTHON         a python3 with PyTorch and a GPU for the comparison (default python3; BENCH=0 skips it)
#   CHECK_BUDGET_S seconds the whole check may take (default 470: under 8 minutes)
#   CHECK_STEPS    the groups of steps 2-6 to run, a comma list of layers, coll, model, bench,
#                  profile (default: all; a group left out is recorded as skipped)
# It runs, in this order, each step under a timeout that keeps the whole
# under CHECK_BUDGET_S:
#   1. tessera info: the build, the CUDA libraries and the GPUs;
#   2. the GPU layer tests (tests/nn/test_layers_cuda): cuDNN conv3d,
#      transposed conv3d and conv3d over a concatenation against the CPU
#      kernels, fp32 (TF32 off, <= 1e-4), bf16 and fp16 (<= 1e-2), the
#      other layers (the opt-in paths of 5 included) likewise;
#   3. the collectives on device buffers (tessera bench coll --device gpu
#      --check): nccl, hierarchical and auto on 1 rank, hierarchical and auto
#      on 2 ranks faked as 2 nodes of one rank each (one GPU cannot hold two
#      ranks of one NCCL communicator: with one GPU that must be refused, and
#      is checked), float32, bfloat16 and float16, sum and avg, uneven sizes;
#      then the collectives' GPU test program (tests/coll/test_device);
#   4. the model on the GPU engine (train.engine = cuda): `tessera model
#      run` on the golden cases of tests/golden that the GPU engine runs
#      (every case: the residual encoder since 2026-12-06) against PyTorch's logits, loss, gradients
#      and parameters after one step, fp32 with TF32 off (<= 1e-4 of each
#      tensor's scale, tests/model/golden_compare); bf16 logits on the GPU
#      against bf16 on this machine's CPU (<= 1e-2); 20 training steps on
#      the GPU and on the CPU (final loss within 1 %), with batch norm +
#      ReLU, with instance norm + leaky ReLU, and with the parameters,
#      gradients and optimizer state on the GPU (TESSERA_CUDA_STATE=device);
#      one step's gradients at 16^3 on 2 ranks data parallel on the GPU
#      (faked nodes of one rank each; the host's master copy, and the state
#      on the GPU with the gradients reduced there; a spatial split in 2; a
#      pipeline of 2 stages with instance norm, whose statistics do not
#      depend on the micro-batches; the residual encoder split in 2 and cut
#      into 2 stages) against 1 rank
#      on the GPU and against the CPU (<= 1e-4;
#      a second draw of data where the first does not agree: a ReLU input
#      within rounding of zero flips a voxel's gradient, docs/testing.md);
#      `tessera infer` of a phantom scan on the GPU against the CPU (the
#      masks 99.9 % equal, the probabilities within 1e-4); NCCL's remote
#      error injected on rank 1 (TESSERA_FAULT=nccl) ending both ranks
#      with its message;
#   5. PyTorch's UNet3D-small at 128^3, batch 2 and 8, bf16 (eager
#      channels_last_3d and torch.compile) and `tessera bench step` on the
#      GPU engine at the same sizes: samples/s side by side (and batch 8
#      again with the few-channel convolutions padded to 8 channels,
#      TESSERA_CUDA_FEWCH=pad, and with every opt-in path: that, the
#      transposed convolutions and every weight gradient as cuBLAS GEMMs,
#      TESSERA_CUDA_CONVT=gemm TESSERA_CUDA_WGRAD=gemm, and the norms'
#      passes and the concatenations through the tiled kernels,
#      TESSERA_CUDA_PASSES=tiled, with their statistics on the device,
#      TESSERA_CUDA_NORMSTATS=device, and the state on the GPU,
#      TESSERA_CUDA_STATE=device: none yet the default);
#   6. `tessera bench step --profile` at batch 2: the GPU's time per kind of
#      layer (each layer call waits for the GPU), for the next speed work;
#      again with the opt-in paths of 5 (profile-opt).
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
# (cuBLAS is opened at its first use, so ldd does not list it: tessera info says
# whether it could be opened)
if ldd "$tessera" 2>/dev/null | grep -q 'not found' ||
    { [ -n "$mpiexec" ] && "$mpiexec" -n 1 "$tessera" info 2>/dev/null | grep -q 'cuBLAS not loaded'; }; then
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
    # stdin from /dev/null: mpiexec reads its stdin, which would swallow the rest of a
    # `while read` loop's input (it did: only the first golden case ran)
    timeout -k 10 "$t" "$@" </dev/null >>"$log" 2>&1
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
# want GROUP: whether CHECK_STEPS asks for the group (else it is recorded as skipped)
want() {
    case ",${CHECK_STEPS:-layers,coll,model,bench,profile}," in *",$1,"*) return 0 ;; esac
    record "$1" skip 0 "not in CHECK_STEPS=$CHECK_STEPS"
    return 1
}
# 2. the layers on the GPU against the CPU
if ! want layers; then :
elif [ -x "$tests/test_layers_cuda" ]; then
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
if want coll; then
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
fi # want coll

# 4. the model on the GPU engine
gc=$tests/golden_compare
[ -x "$gc" ] || gc=$here/build/tests/model/golden_compare
G=$here/tests/golden
mkdir -p "$out/model"
if ! want model; then :
elif [ ! -x "$gc" ]; then
    record model fail 0 "no golden_compare in $tests (build it: make tests/model/golden_compare)"
    fails=$((fails + 1))
else
    # golden cases, fp32, TF32 off, against PyTorch
    args=""
    while read -r name input mode; do
        case "$name" in ''|'#'*) continue ;; esac
        flag=--train-step
        [ "$mode" = eval ] && flag=--eval
        run "golden-$name" 60 "$mpiexec" -n 1 "$tessera" model run "$G/$name.ini" weights="$G/$name-weights.h5" \
            input="$G/$input" output="$out/model/$name.h5" $flag train.engine=cuda train.tf32=false
        args="$args $name $out/model/$name.h5 $G/$name-expect.h5"
    done <"$G/cases.txt"
    run golden-compare 60 "$gc" $args
    bad=$(out_of_step | grep -c '^not ok ')
    if [ $rc -eq 0 ] && [ "$bad" -eq 0 ]; then
        record golden pass "$secs" "$(out_of_step | grep -c '^ok ') checks vs PyTorch (fp32, TF32 off, tol 1e-4)"
    else
        record golden fail "$secs" "exit $rc, $bad failed: $(out_of_step | grep '^not ok ' | head -3 | tr '\n' ';')"
        fails=$((fails + 1))
    fi
    # bf16 logits, GPU against this machine's CPU
    args=""
    for name in bn-eval gn-sgd; do
        for e in cuda cpu; do
            run "bf16-$name-$e" 120 "$mpiexec" -n 1 "$tessera" model run "$G/$name.ini" weights="$G/$name-weights.h5" \
                input="$G/input.h5" output="$out/model/bf16-$name-$e.h5" --eval train.precision=bf16 train.engine=$e
        done
        args="$args bf16-$name $out/model/bf16-$name-cuda.h5 $out/model/bf16-$name-cpu.h5"
    done
    run bf16-compare 60 "$gc" --tol 1e-2 $args
    bad=$(out_of_step | grep -c '^not ok ')
    if [ $rc -eq 0 ] && [ "$bad" -eq 0 ]; then record bf16 pass "$secs" "bf16 logits and loss, GPU vs CPU, tol 1e-2"
    else record bf16 fail "$secs" "exit $rc, $bad failed: $(out_of_step | grep '^not ok ' | head -3 | tr '\n' ';')"; fails=$((fails + 1)); fi
    # training: a synthetic dataset, a small UNet3D with batch norm
    ini=$out/model/train.ini
    printf '%s\n' '[model]' 'channels = 8,16,32' 'classes = 3' 'norm = batch' 'sync_bn = true' '[data]' 'patch = 32' \
        '[train]' 'batch = 2' 'steps = 20' 'lr = 0.05' 'momentum = 0.9' 'loss = ce+dice' 'deterministic = true' \
        'log_every = 1' 'tf32 = false' '[eval]' 'final = false' '[ckpt]' 'every = 0' >"$ini"
    run synth 60 "$mpiexec" -n 1 "$tessera" synth --out "$out/model/syn.h5" --count 8 --size 48 --classes 3 --seed 5
    trn() { # NP NAME ARGS...
        local np=$1 name=$2; shift 2
        run "train-$name" 120 env TESSERA_RANKS_PER_NODE=1 "$mpiexec" -n "$np" "$tessera" train "$ini" \
            data.path="$out/model/syn.h5" run.dir="$out/model/run-$name" "$@"
    }
    "$mpiexec" -n 1 "$tessera" model init "$ini" --out "$out/model/init.h5" --seed 3 </dev/null >>"$log" 2>&1
    trn 1 gpu train.engine=cuda model.init="$out/model/init.h5"
    trn 1 cpu train.engine=cpu model.init="$out/model/init.h5" ckpt.every=20
    # the parameters, gradients and optimizer state on the GPU (written 2026-12-06, not yet the default)
    TESSERA_CUDA_STATE=device trn 1 gpu-state train.engine=cuda model.init="$out/model/init.h5"
    state_taken=$(out_of_step | grep -c 'state: parameters, gradients and optimizer state on the GPU')
    # nnU-Net's activation: instance norm with the leaky ReLU fused into it (the GPU engine fuses it since 2026-12-06)
    leaky="model.norm=instance model.act=leaky_relu model.sync_bn=false"
    "$mpiexec" -n 1 "$tessera" model init "$ini" $leaky --out "$out/model/init-leaky.h5" --seed 3 </dev/null >>"$log" 2>&1
    trn 1 gpu-leaky train.engine=cuda model.init="$out/model/init-leaky.h5" $leaky
    trn 1 cpu-leaky train.engine=cpu model.init="$out/model/init-leaky.h5" $leaky
    for v in "train-20 gpu cpu" "train-20-leaky gpu-leaky cpu-leaky" "train-20-state gpu-state cpu"; do
        set -- $v
        losses=$(python3 - "$out/model/run-$2" "$out/model/run-$3" "$here/tests/train" <<'PY' 2>>"$log"
import sys
sys.path.insert(0, sys.argv[3])
from run_metrics import losses  # tests/train/run_metrics.py: each step's training loss
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert 20 in a and 20 in b, (sorted(a), sorted(b))
r = abs(a[20] - b[20]) / abs(b[20])
print("step 20 loss %.6f on the GPU, %.6f on the CPU (step 1: %.6f, %.6f): %.2e relative" % (a[20], b[20], a[1], b[1], r))
sys.exit(0 if r <= 0.01 and a[20] < a[1] else 1)
PY
)
        lrc=$?
        if [ "$1" = train-20-state ] && [ "$state_taken" = 0 ]; then lrc=1; losses="the state was not on the GPU; $losses"; fi
        if [ $lrc -eq 0 ]; then record "$1" pass 0 "$losses"
        else record "$1" fail 0 "${losses:-no losses (see the log)}"; fails=$((fails + 1)); fi
    done
    # tessera infer on the GPU against the CPU: a phantom scan (NIfTI written here without numpy), the CPU run's
    # checkpoint, fp32 with TF32 off; masks and probabilities compared
    python3 "$here/jobs/gpu/nifti_check.py" write "$out/model/scan.nii.gz" 2>>"$log"
    rm -f "$out"/model/mask-*.nii.gz "$out"/model/prob-*.nii.gz # nothing of an earlier check counts
    infer_rc=0 infer_gpu=no
    for e in cpu cuda; do
        run "infer-$e" 60 "$mpiexec" -n 1 "$tessera" infer "$ini" checkpoint="$out/model/run-cpu" \
            input="$out/model/scan.nii.gz" output="$out/model/mask-$e.nii.gz" probabilities="$out/model/prob-$e.nii.gz" \
            preprocess=none train.engine=$e train.tf32=false
        [ $rc -eq 0 ] || infer_rc=$rc
        # the closing line of this run names the GPU's convolutions
        [ "$e" = cuda ] && out_of_step | grep -q '^infer: .*cudnn' && infer_gpu=yes
    done
    cmp_out=$(python3 "$here/jobs/gpu/nifti_check.py" compare "$out/model/mask-cuda.nii.gz" "$out/model/mask-cpu.nii.gz" \
        "$out/model/prob-cuda.nii.gz" "$out/model/prob-cpu.nii.gz" 2>&1)
    if [ $? -eq 0 ] && [ $infer_rc -eq 0 ] && [ $infer_gpu = yes ]; then
        record infer pass 0 "tessera infer on the GPU = the CPU: $cmp_out"
    else record infer fail 0 "exit $infer_rc, on the GPU: $infer_gpu; ${cmp_out:-see the log}"; fails=$((fails + 1)); fi
    # one step's gradients: 2 ranks data parallel on the GPU, 1 rank on the GPU, 1 rank on the CPU, at 16^3.
    # A ReLU input within rounding of zero on one engine and not the other flips that voxel's gradient and
    # moves the deepest gradients by ~2e-3 of their scale (seen under the CPU's CUDA emulator: 2 voxels of
    # 1M at 32^3; docs/testing.md): a coincidence of the data, where a wrong gradient is there in every
    # draw. So a second draw of data (seed 6) runs when the first does not agree, and either passing passes.
    grads_ok=no
    # nnU-Net's residual encoder split in 2 (its stride-2 convolutions on padded boxes, since 2026-12-07)
    resenc="model.arch=resenc model.channels=8,16,32,64 $leaky model.deep_supervision=true"
    # shellcheck disable=SC2086
    "$mpiexec" -n 1 "$tessera" model init "$ini" --out "$out/model/init-resenc.h5" --seed 3 $resenc </dev/null >>"$log" 2>&1
    for draw in syn syn2; do
        if [ $draw = syn2 ]; then
            run synth2 60 "$mpiexec" -n 1 "$tessera" synth --out "$out/model/syn2.h5" --count 8 --size 48 --classes 3 --seed 6
        fi
        # a pipeline's micro-batches have their own batch-norm statistics: the pipelines run with instance
        # norm, against one rank with instance norm (igpu1, rgpu1)
        for v in "gpu1 1 host train.engine=cuda" "gpu2 2 host train.engine=cuda train.batch=1" \
            "gpu2s 2 device train.engine=cuda train.batch=1" "cpu1 1 host train.engine=cpu" \
            "gpusp 2 host train.engine=cuda parallel.sp=2" "igpu1 1 host train.engine=cuda $leaky" \
            "ipp 2 host train.engine=cuda parallel.pp=2 parallel.microbatches=2 train.batch=1 $leaky" \
            "rgpu1 1 host train.engine=cuda $resenc" "rgpusp 2 host train.engine=cuda parallel.sp=2 $resenc" \
            "rpp 2 host train.engine=cuda parallel.pp=2 parallel.microbatches=2 train.batch=1 $resenc"; do
            set -- $v
            name=$1 np=$2 state=$3; shift 3
            init=$out/model/init.h5
            case $name in r*) init=$out/model/init-resenc.h5 ;; i*) init=$out/model/init-leaky.h5 ;; esac
            # gpu2s: the state on the GPU, the gradients reduced there (hierarchical between the faked nodes)
            TESSERA_CUDA_STATE=$state trn "$np" "g-$name" "$@" train.steps=1 data.patch=16 data.path="$out/model/$draw.h5" \
                model.init="$init" train.dump_grads="$out/model/g-$name.h5"
        done
        run grads-compare 60 "$gc" --tol 1e-4 dp2-vs-1 "$out/model/g-gpu2.h5" "$out/model/g-gpu1.h5" \
            dp2-state-vs-1 "$out/model/g-gpu2s.h5" "$out/model/g-gpu1.h5" \
            sp2-vs-1 "$out/model/g-gpusp.h5" "$out/model/g-gpu1.h5" \
            pp2-vs-1 "$out/model/g-ipp.h5" "$out/model/g-igpu1.h5" \
            resenc-sp2-vs-1 "$out/model/g-rgpusp.h5" "$out/model/g-rgpu1.h5" \
            resenc-pp2-vs-1 "$out/model/g-rpp.h5" "$out/model/g-rgpu1.h5" \
            gpu-vs-cpu "$out/model/g-gpu1.h5" "$out/model/g-cpu1.h5"
        bad=$(out_of_step | grep -c '^not ok ')
        if [ $rc -eq 0 ] && [ "$bad" -eq 0 ]; then grads_ok=yes; break; fi
        grads_bad="$draw: exit $rc, $bad failed: $(out_of_step | grep '^not ok ' | head -3 | tr '\n' ';')"
    done
    if [ $grads_ok = yes ]; then record grads pass "$secs" "dp 2 (host and GPU state), pp 2 and sp 2 (UNet3D and ResEnc) on the GPU = 1 rank on the GPU = the CPU (tol 1e-4; data $draw.h5)"
    else record grads fail "$secs" "in both draws; the last: $grads_bad"; fails=$((fails + 1)); fi
    # NCCL's remote error injected on rank 1 at step 2 (TESSERA_FAULT=nccl, tests/train/gpu_faults.sh): with the state on
    # the GPU the buckets go through NCCL (hierarchical between the faked nodes); the real NCCL communicator is aborted and
    # both ranks end with rank 1's message, not a hang
    TESSERA_FAULT=nccl:rank=1:step=2 TESSERA_CUDA_STATE=device trn 2 nccl-fault train.engine=cuda train.batch=1 \
        train.steps=3 data.patch=16 model.init="$out/model/init.h5" fault.timeout=30
    nf=$(out_of_step | grep 'tessera: error (rank [01])' | grep -c 'rank 1: hierarchical: .*NCCL: remote process exited')
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] && [ "$nf" = 2 ]; then
        record nccl-fault pass "$secs" "NCCL's error on rank 1 ended both ranks with its message (exit $rc)"
    else record nccl-fault fail "$secs" "exit $rc, $nf of 2 ranks named rank 1's NCCL error (see the log)"; fails=$((fails + 1)); fi
fi

# 5. PyTorch's UNet3D-small at 128^3 on this GPU, and tessera's GPU engine
if want bench; then
# (b8-pad: the few-channel convolutions padded to 8 channels, TESSERA_CUDA_FEWCH=pad; b8-opt: also the
# 2x2x2 transposed convolutions and the weight gradients as cuBLAS GEMMs, TESSERA_CUDA_CONVT=gemm
# TESSERA_CUDA_WGRAD=gemm, the tiled norm and concatenation kernels, TESSERA_CUDA_PASSES=tiled, and the
# norms' statistics on the device, TESSERA_CUDA_NORMSTATS=device, the state on the GPU,
# TESSERA_CUDA_STATE=device; none the default yet)
for b in 2 8 8-pad 8-opt; do
    [ "${BENCH:-1}" = 0 ] && { record "tessera-b$b" skip 0 "BENCH=0"; continue; }
    fewch=fp32 convt=cudnn passes=plain stats=host state=host
    case $b in *-pad) fewch=pad ;; *-opt) fewch=pad convt=gemm passes=tiled stats=device state=device ;; esac
    run "tessera-b$b" 150 env TESSERA_CUDA_FEWCH=$fewch TESSERA_CUDA_CONVT=$convt TESSERA_CUDA_WGRAD=$convt \
        TESSERA_CUDA_PASSES=$passes TESSERA_CUDA_NORMSTATS=$stats TESSERA_CUDA_STATE=$state "$mpiexec" -n 1 "$tessera" bench step \
        "$here/configs/unet3d-small.ini" data.patch=128 train.batch=${b%%-*} train.precision=bf16 train.engine=cuda \
        --steps 5 --warmup 2 --json "$out/tessera-b$b.json"
    sps=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); r=j if 'samples_per_s' in j else j['results'][0]
print('%.2f samples/s (%s, %s, state %s)' % (r['samples_per_s'], r['engine'], r['conv_kernels'], r.get('state', '?')))" "$out/tessera-b$b.json" 2>/dev/null)
    if [ $rc -eq 0 ] && [ -n "$sps" ]; then record "tessera-b$b" pass "$secs" "batch $b: $sps"
    else record "tessera-b$b" fail "$secs" "exit $rc: see the log"; fails=$((fails + 1)); fi
done
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
fi # want bench

# 6. where tessera's step goes on the GPU (printed to the log)
if want profile; then
# (profile-opt: with the opt-in paths of the bench above)
for p in profile profile-opt; do
    opts="TESSERA_CUDA_FEWCH=fp32 TESSERA_CUDA_CONVT=cudnn TESSERA_CUDA_WGRAD=cudnn TESSERA_CUDA_PASSES=plain"
    opts="$opts TESSERA_CUDA_NORMSTATS=host"
    opts="$opts TESSERA_CUDA_STATE=host"
    [ "$p" = profile-opt ] && opts="TESSERA_CUDA_FEWCH=pad TESSERA_CUDA_CONVT=gemm TESSERA_CUDA_WGRAD=gemm TESSERA_CUDA_PASSES=tiled TESSERA_CUDA_NORMSTATS=device TESSERA_CUDA_STATE=device"
    run $p 90 env $opts "$mpiexec" -n 1 "$tessera" bench step "$here/configs/unet3d-small.ini" data.patch=128 \
        train.batch=2 train.precision=bf16 train.engine=cuda --steps 2 --warmup 1 --profile
    if [ $rc -eq 0 ]; then
        record $p pass "$secs" "batch 2, ms per step: $(out_of_step | grep -E '^ +(conv forward|conv weight grad|conv input grad|transposed conv|norm\+relu|other) ' |
            awk '{n = ""; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) { printf "%s %s; ", n, $i; break } else n = (n == "" ? $i : n " " $i)}')"
    else record $p fail "$secs" "exit $rc: see the log"; fails=$((fails + 1)); fi
done
fi

if [ $fails -eq 0 ]; then finish pass "$gpu"; exit 0; fi
finish fail "$gpu"
exit 1
