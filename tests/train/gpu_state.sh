#!/bin/sh
# The state on the GPU (TESSERA_CUDA_STATE=device, issue [16]; docs/gpu.md,
# "The state on the GPU"): parameters, gradients and optimizer state in
# device memory, the gradient buckets reduced there while backward runs,
# the optimizer, clipping, micro-batch and loss-scale division and the
# finiteness check as kernels. Where a GPU is visible (a real one, or the
# CPU's CUDA emulator of a build configured --with-cuda=emu), each run
# trains on train.engine = cuda with the state on the GPU and ends as the
# same run with the host's master copy (the GPU engine's default): every
# loss and every tensor of the last checkpoint, parameters and optimizer
# state, bit for bit (the kernels round as the CPU's optimizer does, and
# two ranks' sums have one order; with clipping the gradient norm is summed
# in another order, so there within 1e-6 of each tensor's scale). SGD with
# momentum, AdamW with weight decay, clipping and accumulation, fp16 with
# an injected overflow, an injected NaN, 2 ranks (faked nodes of one rank:
# NCCL communicators of one and the host-staged step between them), local
# SGD, a pipeline of two stages, a resume from a checkpoint, and a rank lost with the emergency state
# written from the GPU's copy. Where no GPU is visible every check skips.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir gpu-state
trap 'pkill -f "$d/w.sh" 2>/dev/null; rm -rf "$d"' EXIT
ts_gpu_or_finish "the state on the GPU"
ngpu=$(ts_mpirun 1 "$TESSERA" info 2>&1 | grep -c '^GPU [0-9]*:')
ts_synth 4 16 3 1
ts_ini s.ini train.engine=cuda train.tf32=false ckpt.every=6 ckpt.emergency=false # (the checkpoint alone pulls the state)
ts_step "initial weights" ts_mpirun 1 "$TESSERA" model init "$ini" --out "$d/init.h5"

# pair NAME NP ARGS...: the run on the host's master copy (h-NAME) and on the GPU's (g-NAME)
pair() {
    _pn=$1 _pp=$2
    shift 2
    ts_step "$_pn: host's master copy, $_pp rank(s) $*" train_run "$_pp" "h-$_pn" model.init="$d/init.h5" "$@"
    export TESSERA_CUDA_STATE=device
    ts_step "$_pn: the state on the GPU, $_pp rank(s) $*" train_run "$_pp" "g-$_pn" model.init="$d/init.h5" "$@"
    unset TESSERA_CUDA_STATE
    _pout=$ts_out
}
# same_state A B [TOL]: A's and B's checkpoints of step 6 and losses within TOL (default 0: bit for bit)
same_state() {
    _st=${3:-0}
    _sd="within $_st of each tensor's scale"
    [ "$_st" = 0 ] && _sd="bit for bit"
    ts_step "$2 = $1: every loss and every checkpointed tensor (parameters, optimizer state) $_sd" \
        "$TS_PY" "$TS_SRCDIR/tests/train/state_compare.py" "$d/$1" "$d/$2" 6 "$_st"
}
on_gpu() { printf '%s\n' "$_pout" | grep -q 'state: parameters, gradients and optimizer state on the GPU'; }

pair sgd 1
ts_check "... the run said its state is on the GPU" on_gpu
same_state h-sgd g-sgd
export TESSERA_CUDA_STATE=device
ts_step "a run with another learning rate (0.04)" train_run 1 g-lr model.init="$d/init.h5" train.lr=0.04
unset TESSERA_CUDA_STATE
ts_step "... differs from it beyond 1e-3 (the comparison can fail)" \
    "$TS_PY" "$TS_SRCDIR/tests/train/state_compare.py" "$d/h-sgd" "$d/g-lr" 6 1e-3 --differ

pair adamw 1 train.optimizer=adamw train.lr=0.003 train.weight_decay=0.01 train.clip_norm=0.5 train.accum=2 train.batch=1
ts_check "... the run said its state is on the GPU" on_gpu
same_state h-adamw g-adamw 1e-6

export TESSERA_FAULT=overflow:step=2
pair fp16 1 train.precision=fp16
unset TESSERA_FAULT
ts_check "... fp16 on the GPU: the overflow at step 2 skipped the step and halved the scale" sh -c \
    "printf '%s\n' \"\$0\" | grep -q 'step 2: fp16 gradients overflowed on some rank'" "$_pout"
same_state h-fp16 g-fp16

export TESSERA_FAULT=nan:step=3
pair nan 1 fault.max_bad_steps=2
unset TESSERA_FAULT
ts_check "... a NaN injected into the GPU's gradients at step 3: the step is skipped" sh -c \
    "printf '%s\n' \"\$0\" | grep -q 'step 3: non-finite loss or gradients on some rank: the optimizer step is skipped'" "$_pout"
same_state h-nan g-nan

# two ranks on faked nodes of one rank: the buckets go through `hierarchical` (NCCL in a node of one, the
# host-staged MPI allreduce between the nodes)
export TESSERA_RANKS_PER_NODE=1
pair dp2 2 train.batch=1
ts_check "... the run said its state is on the GPU" on_gpu
same_state h-dp2 g-dp2
pair local 2 train.batch=1 parallel.local_steps=2
same_state h-local g-local
# a pipeline of 2 stages (each steps its own range; clipping over both stages' norms)
pair pipe 2 parallel.pp=2 parallel.microbatches=2 train.batch=1 train.optimizer=adamw train.lr=0.003 train.clip_norm=0.5
ts_check "... the run said its state is on the GPU" on_gpu
same_state h-pipe g-pipe 1e-6
unset TESSERA_RANKS_PER_NODE
export TESSERA_CUDA_STATE=device
if [ "$ngpu" -eq 1 ]; then
    ts_step "2 ranks on the one GPU of one node" train_run 2 g-shared model.init="$d/init.h5" train.batch=1
    ts_check "... NCCL cannot have two ranks on one GPU: the host keeps the master copy, and the run says why" sh -c \
        "printf '%s\n' \"\$0\" | grep -q 'state: TESSERA_CUDA_STATE=device not taken, the host keeps the master copy: the gradient group cannot reduce GPU buffers: nccl: 2 ranks share GPU 0'" "$ts_out"
    same_state h-dp2 g-shared
else
    ts_step "2 ranks on one node, a GPU each" train_run 2 g-nccl model.init="$d/init.h5" train.batch=1
    ts_check "... the buckets go through NCCL over both ranks, the state on the GPUs" sh -c \
        "printf '%s\n' \"\$0\" | grep -q 'state: parameters, gradients and optimizer state on the GPU'" "$ts_out"
    same_state h-dp2 g-nccl
fi
ts_step "parallel.zero = 1 with the state asked on the GPU" train_run 2 g-zero model.init="$d/init.h5" \
    train.batch=1 parallel.zero=1
ts_check "... the sharded state stays on the host, and the run says so" sh -c \
    "printf '%s\n' \"\$0\" | grep -q 'not taken, the host keeps the master copy: a sharded optimizer state'" "$ts_out"
export TESSERA_CUDA_STATE=gpu
ts_fails_on_all "TESSERA_CUDA_STATE = gpu: refused on every rank" "TESSERA_CUDA_STATE = 'gpu': host (the default) or device" 2 \
    train_run 2 g-bad
unset TESSERA_CUDA_STATE

# a resume: 3 steps, a checkpoint, then steps 4-6 from it, both with the state on the GPU
export TESSERA_CUDA_STATE=device
ts_step "the state on the GPU: steps 1-3, a checkpoint" train_run 1 g-res model.init="$d/init.h5" ckpt.every=3 train.steps=3
ts_step "... resumed for steps 4-6 (the checkpoint's state goes up to the GPU)" train_run 1 g-res ckpt.every=3 ckpt.resume=auto
same_state h-sgd g-res
unset TESSERA_CUDA_STATE

# a rank lost: the survivor writes the emergency state from the GPU's copy of the last step
. "$TS_SRCDIR/tests/train/lib_emergency.sh"
export TESSERA_RANKS_PER_NODE=1
ts_step "uninterrupted reference: dp 2, 8 steps, the host's master copy" train_run 2 eref train.engine=cuda train.tf32=false
export TESSERA_CUDA_STATE=device
killed edp 2 kill:rank=1:step=5 train.engine=cuda train.tf32=false
ts_check "the state on the GPU, dp 2, rank 1 killed at step 5: rank 0 writes its state of step 4 and exits 76" survivors edp 2 1
unset TESSERA_RANKS_PER_NODE
ts_step "... resumed on 1 rank (train.accum = 2), the state on the GPU again" train_run 1 edp train.accum=2 \
    train.engine=cuda train.tf32=false
ts_check "... from the emergency state of step 4" sh -c "printf '%s\n' \"\$0\" | grep -q 'resumed from .*ckpt/step-4 at step 4'" "$ts_out"
ts_step "... ends as the uninterrupted run: every loss, every tensor of step 8" same_run eref edp
unset TESSERA_CUDA_STATE
ts_finish
