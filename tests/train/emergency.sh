#!/bin/sh
# Lose a rank, lose at most one step (issue [14]; docs/training.md, "Losing
# a node"), on one node: a rank is killed in the middle of training; every
# survivor writes the state it holds to run.dir/emergency and exits with
# status 76; the next run (fewer ranks, the global batch kept with
# train.accum or parallel.microbatches) assembles the survivors' files into
# a checkpoint of the last finished step and continues from it, and ends
# where an uninterrupted run ends (every loss, every final tensor). An MPI
# error with a peer gone (TESSERA_FAULT=mpierr) writes the state at once,
# one without a peer gone fails as any error. With
# parallel.zero = 1 (a shard of the optimizer state exists once) the run
# falls back to the last checkpoint and says why. The ranks run under a
# shell that outlives them, so that the launcher does not end the
# survivors before they write (as on a real machine, where a dead node's
# processes are not seen to end).
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir emergency
# the scratch directory and the ranks' shells left behind
trap 'pkill -f "$d/w.sh" 2>/dev/null; rm -rf "$d"' EXIT

. "$TS_SRCDIR/tests/train/lib_emergency.sh"

# --- dp 2: rank 1 killed when step 5 begins; the survivor holds all of step 4
ts_step "uninterrupted reference: dp 2, 8 steps" train_run 2 ref
killed dp 2 kill:rank=1:step=5
ts_check "dp 2, rank 1 killed at step 5: rank 0 writes its state of step 4 and exits 76" survivors dp 2 1
ts_check "... one file, step-4/rank-0.bin, next to the checkpoint of step 3" \
    sh -c "[ -f '$d/dp/emergency/step-4/rank-0.bin' ] && [ -d '$d/dp/ckpt/step-3' ] && [ ! -d '$d/dp/ckpt/step-4' ]"
ts_step "resume on 1 rank, train.accum = 2 (the global batch of 2 kept)" train_run 1 dp train.accum=2
out=$ts_out
ts_check "... from the emergency state of step 4, naming the lost rank, not from step 3" sh -c "
    printf '%s\n' \"\$1\" | grep -q 'emergency state: rank 1 lost at step 5; the 1 surviving rank file (of 2 ranks) holds all of step 4' &&
    printf '%s\n' \"\$1\" | grep -q 'resumed from .*ckpt/step-4 at step 4' &&
    printf '%s\n' \"\$1\" | grep -q 'resumed after the loss of rank 1: step 5 done .* s after the loss'" _ "$out"
ts_check "... and the emergency files are gone (they are the checkpoint now)" sh -c "[ ! -e '$d/dp/emergency/step-4' ]"
ts_step "... ends as the uninterrupted run: every loss, every tensor of step 8" same_run ref dp

# --- dp 2 x pp 2: the last stage's second replica killed; stage 0 and stage 1 survive on other ranks
ts_step "uninterrupted reference: dp 2 x pp 2, 2 micro-batches" train_run 4 refpp parallel.pp=2 parallel.microbatches=2
killed pp 4 kill:rank=3:step=6 parallel.pp=2 parallel.microbatches=2
ts_check "dp 2 x pp 2, rank 3 killed at step 6: ranks 0-2 write their stage's state of step 5 and exit 76" survivors pp 4 3
ts_step "resume as pp 2 on 2 ranks, parallel.microbatches = 4" train_run 2 pp parallel.pp=2 parallel.microbatches=4
ts_check "... from the emergency state of step 5 (3 rank files of 4)" sh -c "
    printf '%s\n' \"\$1\" | grep -q 'the 3 surviving rank files (of 4 ranks) hold all of step 5' &&
    printf '%s\n' \"\$1\" | grep -q 'resumed from .*ckpt/step-5 at step 5'" _ "$ts_out"
ts_step "... ends as the uninterrupted run" same_run refpp pp

# --- dp 2 x sp 2: a box of the second replica lost; the first replica holds everything
ts_step "uninterrupted reference: dp 2 x sp 2" train_run 4 refsp parallel.sp=2
killed sp 4 kill:rank=2:step=5 parallel.sp=2
ts_check "dp 2 x sp 2, rank 2 killed at step 5: the others write step 4 and exit 76" survivors sp 4 2
ts_step "resume as sp 2 on 2 ranks, train.accum = 2" train_run 2 sp parallel.sp=2 train.accum=2
ts_check "... from the emergency state of step 4" sh -c "printf '%s\n' \"\$1\" | grep -q 'resumed from .*ckpt/step-4 at step 4'" _ "$ts_out"
ts_step "... ends as the uninterrupted run" same_run refsp sp

# --- an MPI error with a peer gone: the rank writes at once (not after fault.timeout = 20 s), and without
killed mpierr 2 "kill:rank=1:step=5;mpierr:rank=0:step=5"
el=$(sed -n 's/^elapsed //p' "$d/mpierr.out/elapsed" 2>/dev/null)
ts_check "an MPI error at step 5 with rank 1 gone: rank 0 names it, writes its state of step 4 and exits 76 (after ${el:-?} s, fault.timeout 20)" sh -c "
    [ \"\$(cat '$d/mpierr.out/rc.0')\" = 76 ] && [ '${el:-99}' -lt 15 ] &&
    grep -q 'watchdog: an MPI error in step 5 (MPI_Allreduce (injected by TESSERA_FAULT=mpierr) failed' '$d/mpierr.out/err.0' &&
    grep -q 'rank 1 is gone' '$d/mpierr.out/err.0' && grep -q 'rank 0: emergency state of step 4 written' '$d/mpierr.out/err.0'"
TESSERA_FAULT=mpierr:rank=0:step=5 timeout -k 5 100 "$MPIEXEC" -n 1 "$TESSERA" train "$d/e.ini" data.path="$d/syn.h5" \
    run.dir="$d/mpierr1" train.steps=6 >"$d/mpierr1.log" 2>&1
rc=$?
ts_check "an MPI error with no peer gone (one rank): it fails as any error (status $rc), names the MPI call, writes no emergency state" sh -c "
    [ $rc -ne 0 ] && [ $rc -ne 76 ] && grep -q 'MPI_Allreduce (injected by TESSERA_FAULT=mpierr) failed' '$d/mpierr1.log' &&
    [ ! -e '$d/mpierr1/emergency/step-4' ]"

# --- ZeRO: the lost rank's optimizer shard exists nowhere else: the last checkpoint, and why
killed zero 2 kill:rank=1:step=5 parallel.zero=1
ts_check "parallel.zero = 1, rank 1 killed at step 5: rank 0 still writes (without the optimizer state)" survivors zero 2 1
ts_step "resume on 1 rank" train_run 1 zero parallel.zero=1 train.accum=2
ts_check "... falls back to the checkpoint of step 3, saying the optimizer state was sharded" sh -c "
    printf '%s\n' \"\$1\" | grep -q 'emergency state not used: the emergency state of step 4 .*lacks .*/optim/.*the optimizer state was sharded' &&
    printf '%s\n' \"\$1\" | grep -q 'resumed from .*ckpt/step-3 at step 3'" _ "$ts_out"
ts_finish
