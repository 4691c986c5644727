#!/bin/sh
# Local SGD (parallel.local_steps, parallel.local_sgd; issue [9]): replicas
# step on their own gradients and average parameters every H steps; the
# runs differ from synchronous training (something happened), compose with
# spatial and pipeline parallelism (the same weights as the unsplit local
# run), the node variant equals synchronous training when one node holds
# every replica, perf.json counts the reductions, and kill-and-resume stays
# bit-identical.
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
TESSERA="$TS_BUILDDIR/tessera"
export OMP_NUM_THREADS=1
unset TESSERA_FAULT TESSERA_RANKS_PER_NODE
d=$(mktemp -d "${TMPDIR:-/tmp}/tessera-localsgd.XXXXXX")
trap 'rm -rf "$d"' EXIT

ts_step "synthetic dataset: 8 samples of 20^3, 3 classes" \
    ts_mpirun 2 "$TESSERA" synth --out "$d/syn.h5" --count 8 --size 20 --classes 3 --seed 7
cat >"$d/l.ini" <<'INI'
[model]
channels = 4,8,16
classes = 3
norm = group
groups = 2
[data]
patch = 16
[train]
batch = 2
steps = 6
lr = 0.05
momentum = 0.9
loss = ce+dice
deterministic = true
log_every = 1
[ckpt]
every = 2
keep = 5
[eval]
final = false
INI
run() { # run NP NAME ARGS...
    _np=$1 _name=$2
    shift 2
    ts_step "$_name: $_np rank(s) $*" ts_mpirun "$_np" "$TESSERA" train "$d/l.ini" data.path="$d/syn.h5" \
        run.dir="$d/$_name" "$@"
}
same() { # same REF RUN [STEPS]
    if [ -n "$TS_PY" ]; then
        ts_step "$2 = $1: losses within 1e-5, weights within 1e-4 (and they moved)" \
            "$TS_PY" "$TS_SRCDIR/tests/train/compare_runs.py" "$d/$1" "$d/$2" "$d/init.h5" "${3:-6}"
    else
        ts_skip "$2 = $1" "no python3 with h5py"
    fi
}
reductions() { # reductions RUN GRADIENT AVERAGES: perf.json's counts
    if [ -n "$TS_PY" ]; then
        ts_step "$1: perf.json counts $2 gradient reductions across replicas and $3 parameter averages" "$TS_PY" -c "
import json
r = json.load(open('$d/$1/perf.json'))['dp_reductions']; print(r)
assert r['gradient'] == $2 and r['parameter_averages'] == $3"
    fi
}
ts_step "initial weights" "$TESSERA" model init "$d/l.ini" --out "$d/init.h5" --seed 0
run 2 sync
run 2 h2 parallel.local_steps=2
reductions sync 6 0
reductions h2 0 3
if [ -n "$TS_PY" ]; then
    ts_step "local SGD (H = 2) is not synchronous training: the weights differ by more than 1e-3 of their scale" \
        "$TS_PY" -c "
import h5py, numpy as np
a = h5py.File('$d/sync/ckpt/step-6/state.h5', 'r')['params']; b = h5py.File('$d/h2/ckpt/step-6/state.h5', 'r')['params']
dif = max(float(np.abs(np.asarray(a[n]) - np.asarray(b[n])).max() / (np.abs(np.asarray(a[n])).max() + 1e-12)) for n in a)
print('largest relative difference', dif); assert dif > 1e-3"
fi
# composition: the split runs give the unsplit local run's weights
# sp changes the order of the weight gradient's sums (boxes, then the group), so the
# weights differ in their last bits from step 1, and a ReLU input within such a
# difference of 0 can flip at step 2 and move the deep levels' gradients by ~0.5 %
# (seen: the momentum of enc2 after 2 steps; docs/parallelism.md, "Equal to one
# rank"): weights after several steps are no measure of equality. What must be equal
# is compared instead: the first step's gradients per tensor (the harness of
# tests/train/grad_equiv.sh, from the same weights), and the losses of all 6 steps.
run 4 h2-sp2 parallel.local_steps=2 parallel.sp=2
if [ -n "$TS_PY" ]; then
    ts_step "h2-sp2 = h2: the losses of all 6 steps within 1e-5 (and the weights moved)" \
        "$TS_PY" "$TS_SRCDIR/tests/train/compare_runs.py" "$d/h2" "$d/h2-sp2" "$d/init.h5" 6 1e-5 1
    run 2 h2-g parallel.local_steps=2 model.init="$d/init.h5" train.steps=1 train.dump_grads="$d/h2-g.h5"
    run 4 h2-sp2-g parallel.local_steps=2 parallel.sp=2 model.init="$d/init.h5" train.steps=1 \
        train.dump_grads="$d/h2-sp2-g.h5"
    ts_step "h2-sp2 = h2: the first step's gradients per tensor within 1e-4 of their scale" \
        "$TS_PY" "$TS_SRCDIR/tests/train/grad_compare.py" "$d/h2-g.h5" "$d/h2-sp2-g.h5" 1e-4
else
    ts_skip "h2-sp2 = h2" "no python3 with h5py"
fi
run 2 h2-a2 parallel.local_steps=2 train.batch=1 train.accum=2
run 4 h2-pp2 parallel.local_steps=2 parallel.pp=2 parallel.microbatches=2 train.batch=1
same h2-a2 h2-pp2
reductions h2-pp2 0 3
# the node variant: gradients over a node's replicas every step, parameters over all every H
run 4 sync4 train.batch=1
TESSERA_RANKS_PER_NODE=4 run 4 node-all parallel.local_steps=3 parallel.local_sgd=node train.batch=1
same sync4 node-all
TESSERA_RANKS_PER_NODE=2 run 4 node2 parallel.local_steps=3 parallel.local_sgd=node train.batch=1 ckpt.every=3
reductions node2 6 2
# a checkpoint between averages averages first (steps 2 and 4 here, besides 3 and 6)
TESSERA_RANKS_PER_NODE=2 run 4 node2c parallel.local_steps=3 parallel.local_sgd=node train.batch=1
reductions node2c 6 4
TESSERA_RANKS_PER_NODE=1 ts_fails_on_all "node variant with spatial groups across nodes: refused" \
    "parallel.local_sgd = node needs every spatial group inside one node" 4 \
    ts_mpirun 4 "$TESSERA" train "$d/l.ini" data.path="$d/syn.h5" run.dir="$d/bad" parallel.local_steps=2 \
    parallel.local_sgd=node parallel.sp=2
# kill-and-resume between averages
TESSERA_FAULT=kill:rank=1:step=4 ts_step_fails "rank 1 killed at step 4 (local SGD, H = 2)" \
    ts_mpirun 2 "$TESSERA" train "$d/l.ini" data.path="$d/syn.h5" run.dir="$d/kr" parallel.local_steps=2
run 2 kr parallel.local_steps=2
ts_step "kill-and-resume = the uninterrupted local run, bit for bit" \
    sh -c "h5diff '$d/h2/ckpt/step-6/state.h5' '$d/kr/ckpt/step-6/state.h5' /params /params &&
           h5diff '$d/h2/ckpt/step-6/state.h5' '$d/kr/ckpt/step-6/state.h5' /optim /optim"
ts_finish
