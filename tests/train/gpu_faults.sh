#!/bin/sh
# NCCL's failures as a clean end of the job (issue [16], docs/collectives.md,
# "No hangs"): with the state on the GPU the gradient buckets go through
# NCCL (two faked nodes of one rank: `hierarchical`, NCCL inside each node,
# MPI between them). An NCCL error on one rank (TESSERA_FAULT=nccl: NCCL's
# remote error, as when a peer's process or the network is gone) ends every
# rank with that rank's message and loses no checkpoint, and the same
# command resumes to the uninterrupted run's state bit for bit; an NCCL
# collective that never completes (TESSERA_FAULT=hang:op=nccl) is ended by
# its deadline (0.8 of fault.timeout) on every rank, before the watchdog.
# Where no GPU is visible every check skips.
. "$TS_SRCDIR/tests/train/lib_train.sh"
unset TESSERA_EXIT_GRACE
ts_tmpdir gpu-faults
ts_gpu_or_finish "NCCL faults"
ts_synth 4 16 3 1
ts_ini n.ini train.engine=cuda train.tf32=false train.batch=1 ckpt.every=1 ckpt.keep=10 ckpt.emergency=false
ts_step "initial weights" ts_mpirun 1 "$TESSERA" model init "$ini" --out "$d/init.h5"
export TESSERA_CUDA_STATE=device TESSERA_RANKS_PER_NODE=1
elapsed() { # elapsed CMD...: runs CMD, sets el to the seconds it took
    _t0=$(date +%s)
    "$@"
    _rc=$?
    el=$(($(date +%s) - _t0))
    return $_rc
}
ts_step "the uninterrupted 2-rank run, 6 steps, the state on the GPU" train_run 2 full model.init="$d/init.h5"
ts_check "... its buckets went through the GPU's collectives" sh -c \
    "printf '%s\n' \"\$0\" | grep -q 'state: parameters, gradients and optimizer state on the GPU'" "$ts_out"

export TESSERA_FAULT=nccl:rank=1:step=3
elapsed ts_fails_on_all "NCCL's remote error on rank 1 at step 3: every rank ends with rank 1's NCCL message" \
    "rank 1: hierarchical: reduce-scatter in the node: NCCL: remote process exited or there was a network error" 2 \
    train_run 2 err model.init="$d/init.h5"
unset TESSERA_FAULT
ts_check "... within a minute (took $el s)" [ "$el" -le 60 ]
ts_check "... the checkpoints before it are intact, none of step 3" \
    sh -c "[ -f '$d/err/ckpt/step-2/state.h5' ] && [ ! -e '$d/err/ckpt/step-3' ]"
ts_step "the same command again resumes from step 2" train_run 2 err model.init="$d/init.h5"
ts_step "... and ends where the uninterrupted run does: every loss and checkpointed tensor bit for bit" \
    "$TS_PY" "$TS_SRCDIR/tests/train/state_compare.py" "$d/full" "$d/err" 6 0

export TESSERA_FAULT=hang:rank=1:op=nccl:step=3
elapsed ts_fails_on_all "an NCCL collective of rank 1 that never completes (fault.timeout = 8): every rank ends" \
    "NCCL communicator aborted" 2 train_run 2 hang model.init="$d/init.h5" fault.timeout=8
unset TESSERA_FAULT
ts_check "... within fault.timeout + 15 s (took $el s)" [ "$el" -le 23 ]
ts_check "... rank 1 names its deadline, the other rank names rank 1" sh -c \
    "printf '%s\n' \"\$0\" | grep -q 'tessera: error (rank 1).*rank 1: hierarchical: .*not finished by the deadline (6 s: 80% of fault.timeout)' &&
     printf '%s\n' \"\$0\" | grep 'tessera: error (rank 0)' | grep -q 'rank 1'" "$ts_out"
ts_check "... before the watchdog would have (no watchdog report)" sh -c \
    "! printf '%s\n' \"\$0\" | grep -q 'watchdog: no progress'" "$ts_out"
ts_check "... the checkpoints before it are intact" [ -f "$d/hang/ckpt/step-2/state.h5" ]

export TESSERA_FAULT=nccl:rank=1:step=0
ts_fails_on_all "a malformed NCCL fault is refused at start on every rank" "TESSERA_FAULT entry 'nccl:rank=1:step=0': bad step=0" 2 \
    train_run 2 bad model.init="$d/init.h5"
unset TESSERA_FAULT TESSERA_CUDA_STATE TESSERA_RANKS_PER_NODE
ts_finish
