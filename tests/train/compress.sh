#!/bin/sh
# Gradient compression in training (parallel.compress, issue [9]): each
# method trains on 2 ranks (losses finite, weights moved, the weights differ
# from the uncompressed run: compression happened), perf.json reports the
# bytes; a warm-up covering every step is the uncompressed run bit for bit
# (weights and the first step's gradients); with dp x sp only the reduction
# over replicas is compressed (the same weights as dp alone; with PowerSGD
# also the first step's gradients, tensor by tensor), with dp x pp each
# stage compresses its own buckets (bf16: the same weights and first-step
# gradients as the unsplit run); bad values and local SGD are refused on
# every rank, naming the key.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir compress
ts_synth 8 20 7
ts_ini c.ini train.steps=4 ckpt.every=4
same_loss=1e-4 same_weights=1e-3 # the same losses and weights
dump_grads=yes # the first step's gradients, compared where two runs must compute the same (below)
# trained RUN MODE REF RANKS PIECES MIN_RATIO: finite losses, weights moved and differ from REF, perf.json's figures
trained() {
    if [ -z "$TS_PY" ]; then
        ts_skip "$1 trained" "no python3 with h5py"
        return
    fi
    ts_step "$1: losses finite, weights moved and differ from $3; perf.json: $2 over $4 replicas ($5 piece(s) each), \
every step compressed, bytes cut >= $6x" "$TS_PY" -c "
import json, math, h5py, numpy as np
l = [json.loads(x)['loss'] for x in open('$d/$1/metrics.jsonl') if 'loss' in x]
assert len(l) == 4 and all(math.isfinite(v) for v in l), l
a = h5py.File('$d/$1/ckpt/step-4/state.h5', 'r')['params']
b = h5py.File('$d/$3/ckpt/step-4/state.h5', 'r')['params']
w = h5py.File('$d/init.h5', 'r')['params']
fl = [n for n in w if np.asarray(w[n]).dtype.kind == 'f']
moved = max(float(np.abs(np.asarray(a[n]) - np.asarray(w[n])).max()) for n in fl)
diff = max(float(np.abs(np.asarray(a[n]) - np.asarray(b[n])).max()) for n in fl)
c = json.load(open('$d/$1/perf.json'))['compress']
print('moved', moved, 'differs from $3 by', diff, c)
assert moved > 1e-3 and diff > 1e-7
assert c['mode'] == '$2' and c['ranks'] == $4 and c['inner_ranks'] == $5 and c['compressed_steps'] == 4
assert c['buckets_compressed'] >= 1 and c['per_step']['ratio'] >= $6 and c['per_step']['wire_ratio'] > 1"
}

ts_step "initial weights" "$TESSERA" model init "$d/c.ini" --out "$d/init.h5" --seed 0
run 2 none
for m in bf16:1.9 fp16:1.9 topk:0.01:30 sign:20 powersgd:4:5; do
    mode=${m%:*}
    run 2 "$mode" parallel.compress="$mode"
    trained "$mode" "$mode" none 2 1 "${m##*:}"
done
# a warm-up as long as the run: uncompressed every step, the uncompressed run bit for bit
run 2 warm parallel.compress=sign parallel.compress_warmup=4
ts_step "warm-up over every step = uncompressed, bit for bit" \
    h5diff "$d/none/ckpt/step-4/state.h5" "$d/warm/ckpt/step-4/state.h5" /params /params
grads none warm 0

# dp x sp: the spatial pieces average exactly, only the replicas' reduction is compressed
for mode in topk:0.01 powersgd:4; do
    run 4 "sp-$mode" parallel.sp=2 parallel.compress="$mode"
    same "$mode" "sp-$mode"
    # the first step's gradients too, but not top-k's: it sends 1 % of the entries, so whole tensors of the
    # step's gradient are zero, which the harness refuses as "nothing computed" (seen: 17 of 46)
    [ "$mode" = topk:0.01 ] || grads "$mode" "sp-$mode"
done
run 4 sp-none parallel.sp=2
trained sp-topk:0.01 topk:0.01 sp-none 2 2 30

# dp x pp: each stage compresses its own buckets
run 2 a2-bf16 train.batch=1 train.accum=2 parallel.compress=bf16
run 4 pp-bf16 parallel.pp=2 parallel.microbatches=2 train.batch=1 parallel.compress=bf16
same a2-bf16 pp-bf16
grads a2-bf16 pp-bf16 1e-2 # (the bound of bf16 layouts in grad_equiv.sh; seen: bit-identical)
run 4 pp-none parallel.pp=2 parallel.microbatches=2 train.batch=1
for m in topk:0.01:30 sign:15 powersgd:4:3; do
    mode=${m%:*}
    run 4 "pp-$mode" parallel.pp=2 parallel.microbatches=2 train.batch=1 parallel.compress="$mode"
    trained "pp-$mode" "$mode" pp-none 2 1 "${m##*:}"
done

dump_grads=
# refusals, on every rank, before any work
for bad in topk:0 topk:2 powersgd:0 zstd; do
    ts_fails_on_all "parallel.compress = $bad: refused naming the key" "parallel.compress = '$bad'" 2 \
        train_run 2 bad parallel.compress="$bad"
done
ts_fails_on_all "parallel.compress with local SGD: refused with the reason" \
    "parallel.compress = topk:0.01 with parallel.local_steps = 2" 2 \
    train_run 2 bad parallel.compress=topk:0.01 parallel.local_steps=2
ts_finish
