#!/bin/sh
# train.engine (issue [16], docs/gpu.md): a value it does not know is refused
# naming the key; where there is no GPU, train.engine = cuda is refused on
# every rank with the reason (tessera train, tessera bench step, tessera
# model run), auto trains on the CPU without a word, and bench step's JSON
# says which engine ran. Where a GPU is visible the no-GPU checks skip, auto
# must take the GPU, and tests/train/engine_gpu.sh compares it with the CPU.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_use_gpus # the GPU checks below run where a GPU is visible (tests/mpi/lib.sh)
ts_tmpdir engine
ts_synth 4 16 3
ts_ini e.ini train.steps=2 ckpt.every=0

ts_fails_on_all "train.engine = gpu: refused on every rank, naming the key" "train.engine" 2 \
    train_run 2 bad train.engine=gpu
ts_check "... and the values it takes" sh -c "printf '%s\n' \"\$0\" | grep -q 'auto|cpu|cuda'" "$ts_out"

if ts_mpirun 1 "$TESSERA" info 2>&1 | grep -q '^GPU 0:'; then
    ts_skip "train.engine = cuda without a GPU" "a GPU is visible here: jobs/gpu/check.sh runs the GPU engine"
else
    why=$(ts_mpirun 1 "$TESSERA" info 2>&1 | sed -n 's/^GPUs: *none found *//p' | head -1)
    ts_fails_on_all "tessera train train.engine = cuda without a GPU: refused on every rank $why" \
        "train.engine = cuda: " 2 train_run 2 cuda train.engine=cuda
    ts_check "... before any step (no 'done:', no checkpoint)" sh -c "! printf '%s\n' \"\$0\" | grep -q 'done:' && [ ! -e '$d/cuda/ckpt' ]" "$ts_out"
    ts_fails_on_all "tessera bench step train.engine = cuda: refused on every rank" "train.engine = cuda: " 2 \
        ts_mpirun 2 "$TESSERA" bench step "$ini" train.engine=cuda --steps 1 --warmup 0
    ts_step "tessera model init (weights for model run)" "$TESSERA" model init "$ini" --out "$d/w.h5" --seed 1
    ts_step_fails "tessera model run train.engine = cuda: refused" "$TESSERA" model run "$ini" weights="$d/w.h5" \
        input="$TS_SRCDIR/tests/golden/input.h5" output="$d/o.h5" train.engine=cuda
    ts_check "... naming the key and the reason" sh -c "printf '%s\n' \"\$0\" | grep -q 'train.engine = cuda: '" "$ts_out"
    ts_check "... and writing no output" [ ! -e "$d/o.h5" ]
fi

run 2 auto train.engine=auto
if ts_mpirun 1 "$TESSERA" info 2>&1 | grep -q '^GPU 0:'; then # auto takes the GPU (tests/train/engine_gpu.sh compares it)
    ts_check "train.engine = auto with a GPU trains on it, saying so" sh -c \
        "printf '%s\n' \"\$0\" | grep -q 'done: 2 steps' && printf '%s\n' \"\$0\" | grep -q 'train.engine = auto: cuda on GPU'" "$ts_out"
    want=cuda
else
    ts_check "train.engine = auto without a GPU trains on the CPU without a note" sh -c \
        "printf '%s\n' \"\$0\" | grep -q 'done: 2 steps' && ! printf '%s\n' \"\$0\" | grep -q 'train.engine'" "$ts_out"
    want=cpu
fi
ts_step "bench step: 1 step" ts_mpirun 2 "$TESSERA" bench step "$ini" --steps 1 --warmup 0 --json "$d/b.json"
ts_check "... its JSON says the engine that ran ($want) and its kernels" python3 -c "
import json, sys
j = json.load(open('$d/b.json'))
r = j if 'engine' in j else j['results'][0]
print(r['engine'], r['conv_kernels'])
sys.exit(0 if r['engine'] == '$want' and (r['conv_kernels'] == 'cuDNN') == ('$want' == 'cuda') else 1)"
ts_finish
