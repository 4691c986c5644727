#!/bin/sh
# bench step on the gradient path tessera train takes (issue [15]): the
# layout object gives bench step train's compression, sharded optimizer,
# local SGD and accumulation, so a configuration using them is measured with
# them. Each run's JSON (grad_path) is compared with the plain run's: fewer
# bytes with compression, none exchanged between replicas with local SGD but
# parameter averages inside the timed steps, a smaller arena with ZeRO, two
# micro-batches with train.accum = 2; and bench step refuses, on every rank,
# what train refuses.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir bench-grad
# bench step's config: no training run's keys (steps, logging, evaluation), so not lib_train.sh's common one
cat >"$d/b.ini" <<'INI'
[model]
channels = 4,8,16
classes = 3
norm = group
groups = 2
[data]
patch = 16
[train]
batch = 2
optimizer = adamw
lr = 0.001
INI

# bench NAME ARGS...: bench step on 2 ranks, 1 warm-up and 4 timed steps, into $d/NAME.json and NAME.out
bench() {
    _n=$1
    shift
    ts_step "bench step, 2 ranks: ${*:-plain}" ts_mpirun 2 "$TESSERA" bench step "$d/b.ini" "$@" --steps 4 --warmup 1 \
        --json "$d/$_n.json"
    printf '%s\n' "$ts_out" >"$d/$_n.out"
}
bench plain
bench topk parallel.compress=topk:0.01
bench warm parallel.compress=topk:0.01 parallel.compress_warmup=10
bench local parallel.local_steps=2
bench zero parallel.zero=1
bench accum train.accum=2 train.batch=1

# check NAME PYTHON-EXPRESSION: the expression over a (plain's JSON) and b (NAME's) is true
check() {
    ts_step "$1" "$TS_PY" -c "
import json, sys
a = json.load(open('$d/plain.json')); b = json.load(open('$d/$2.json'))
ga, gb = a['grad_path'], b['grad_path']
ok = $3
if not ok: print('plain:', ga, a['comm_total_ms'], a['arena_mb'], '\n$2:', gb, b['comm_total_ms'], b['arena_mb'], b['microbatches'])
sys.exit(0 if ok else 1)"
}
if [ -n "$TS_PY" ]; then
    check "plain: kind plain, every step reduced as float32, gradients exchanged" plain \
        "gb['kind'] == 'plain' and gb['reduced_steps'] == 5 and gb['compressed_steps'] == 0 and gb['bytes_per_step'] == gb['bytes_per_step_fp32'] > 0 and b['comm_total_ms'] > 0"
    check "parallel.compress = topk:0.01: kind compress, all 5 steps compressed, under 1/20 of plain's bytes" topk \
        "gb['kind'] == 'compress' and gb['compress'] == 'topk:0.01' and gb['compressed_steps'] == gb['reduced_steps'] == 5 and 0 < gb['bytes_per_step'] < ga['bytes_per_step'] / 20"
    check "parallel.compress_warmup over every step: none compressed (warm-up honoured)" warm \
        "gb['kind'] == 'compress' and gb['compressed_steps'] == 0 and gb['reduced_steps'] == 5"
    check "parallel.local_steps = 2: kind local, no gradient exchange, 2 parameter averages timed inside the steps" local \
        "gb['kind'] == 'local' and gb['local_steps'] == 2 and gb['parameter_averages'] == 2 and gb['param_average_ms'] > 0 and gb['reduced_steps'] == 0 and b['comm_total_ms'] == 0 and ga['parameter_averages'] == 0"
    check "parallel.zero = 1: kind zero, a smaller arena (the optimizer state sharded)" zero \
        "gb['kind'] == 'zero' and b['arena_mb'] < a['arena_mb'] * 0.8"
    check "train.accum = 2: two micro-batches per step" accum \
        "b['microbatches'] == 2 and a['microbatches'] == 1"
else
    ts_skip "the JSON checks" "no python3 with h5py"
fi
ts_check "the printed gradient path names compression and local SGD" sh -c \
    "grep -q 'gradient path: compress (topk:0.01), 5 of 5 steps compressed' '$d/topk.out' && grep -q 'gradient path: local SGD (parallel.local_steps = 2, parallel.local_sgd = global): 2 parameter averages' '$d/local.out'"

# train's refusals
ts_fails_on_all "bench step: parallel.zero = 1 with compression refused as train refuses it" \
    "parallel.zero = 1 (command line) with parallel.compress = topk:0.01" 2 \
    ts_mpirun 2 "$TESSERA" bench step "$d/b.ini" parallel.zero=1 parallel.compress=topk:0.01 --steps 1 --warmup 0
ts_fails_on_all "bench step: parallel.zero = 1 with local SGD refused" \
    "parallel.zero = 1 (command line) with parallel.local_steps = 2" 2 \
    ts_mpirun 2 "$TESSERA" bench step "$d/b.ini" parallel.zero=1 parallel.local_steps=2 --steps 1 --warmup 0
ts_fails_on_all "bench step: compression with local SGD refused" \
    "parallel.compress = topk:0.01 with parallel.local_steps = 2" 2 \
    ts_mpirun 2 "$TESSERA" bench step "$d/b.ini" parallel.compress=topk:0.01 parallel.local_steps=2 --steps 1 --warmup 0
ts_fails_on_all "bench step: train.accum with a pipeline refused" "train.accum = 2 with parallel.pp = 2" 2 \
    ts_mpirun 2 "$TESSERA" bench step "$d/b.ini" train.accum=2 parallel.pp=2 parallel.microbatches=2 --steps 1 --warmup 0
ts_finish
