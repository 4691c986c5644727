#!/bin/sh
# Lose a rank, lose at most one step (issue [14]; docs/training.md, "Losing
# a node"), on one node: a rank is killed in the middle of training; every
# survivor writes the state it holds to run.dir/emergency and exits with
# status 76; the next run (fewer ranks, the global batch kept with
# train.accum or parallel.microbatches) assembles the survivors' files into
# a checkpoint of the last finished step and continues from it, and ends
# where an uninterrupted run ends (every loss, every final tensor). With
# parallel.zero = 1 (a shard of the optimizer state exists once) the run
# falls back to the last checkpoint and says why. The ranks run under a
# shell that outlives them, so that the launcher does not end the
# survivors before they write (as on a real machine, where a dead node's
# processes are not seen to end).
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
TESSERA="$TS_BUILDDIR/tessera"
export OMP_NUM_THREADS=1 TESSERA_EXIT_GRACE=20
unset TESSERA_FAULT TESSERA_COLL_ALLREDUCE TESSERA_RANKS_PER_NODE
d=$(mktemp -d "${TMPDIR:-/tmp}/tessera-emergency.XXXXXX")
trap 'pkill -f "$d/w.sh" 2>/dev/null; rm -rf "$d"' EXIT

ts_step "synthetic dataset: 8 samples of 20^3, 3 classes" \
    ts_mpirun 1 "$TESSERA" synth --out "$d/syn.h5" --count 8 --size 20 --classes 3 --seed 5
cat >"$d/e.ini" <<'INI'
[model]
channels = 4,8
classes = 3
norm = group
groups = 2
[data]
patch = 16
[train]
batch = 1
steps = 8
lr = 0.05
momentum = 0.9
deterministic = true
log_every = 1
[ckpt]
every = 3
keep = 10
[eval]
final = false
INI
cat >"$d/w.sh" <<EOF
#!/bin/sh
"$TESSERA" "\$@" 2>"\$TS_EM_OUT/err.\$PMI_RANK"
echo \$? >"\$TS_EM_OUT/rc.\$PMI_RANK"
exec sleep 120
EOF
chmod +x "$d/w.sh"

# killed NAME NP FAULT ARGS...: trains with FAULT (a rank killed); waits for the survivors' exit statuses
killed() {
    _n=$1 _np=$2 _f=$3
    shift 3
    mkdir -p "$d/$_n.out"
    TS_EM_OUT=$d/$_n.out TESSERA_FAULT=$_f timeout -k 5 200 "$MPIEXEC" -n "$_np" "$d/w.sh" train "$d/e.ini" \
        data.path="$d/syn.h5" run.dir="$d/$_n" fault.timeout=20 "$@" >"$d/$_n.log" 2>&1 &
    _bg=$!
    _i=0
    while [ $_i -lt 120 ] && [ "$(ls "$d/$_n.out"/rc.* 2>/dev/null | wc -l)" -lt "$_np" ]; do sleep 0.5; _i=$((_i + 1)); done
    kill "$_bg" 2>/dev/null
    pkill -f "$d/w.sh" 2>/dev/null
    wait "$_bg" 2>/dev/null
    cat "$d/$_n.out"/err.* | grep -E 'emergency|watchdog|fault injected' | cut -c1-300 | sed 's/^/# /'
}
# survivors NAME NP DEAD: every rank but DEAD exited 76 and wrote its file
survivors() {
    _ok=0
    for _r in $(seq 0 $(($2 - 1))); do
        [ "$_r" = "$3" ] && continue
        [ "$(cat "$d/$1.out/rc.$_r" 2>/dev/null)" = 76 ] || _ok=1
        grep -q "rank $_r: emergency state of step [0-9]* written" "$d/$1.out/err.$_r" || _ok=1
    done
    return $_ok
}
# same_run A B: every loss of A's metrics equal to B's (relative 1e-5), and every tensor of their last checkpoints
same_run() {
    [ -n "$TS_PY" ] || { echo "no python3 with h5py: compared the losses only"; }
    "${TS_PY:-python3}" - "$d/$1" "$d/$2" <<'PY'
import json, sys
a, b = sys.argv[1], sys.argv[2]
la = {x['step']: x['loss'] for x in map(json.loads, open(a + '/metrics.jsonl')) if 'loss' in x}
lb = {x['step']: x['loss'] for x in map(json.loads, open(b + '/metrics.jsonl')) if 'loss' in x}
assert sorted(la) == sorted(lb) == list(range(1, 9)), (sorted(la), sorted(lb))
worst = max(abs(la[s] - lb[s]) / abs(la[s]) for s in la)
print('losses of 8 steps: worst relative difference %.2e' % worst)
assert worst <= 1e-5
try:
    import h5py, numpy as np
except ImportError:
    sys.exit(0)
A, B = h5py.File(a + '/ckpt/step-8/state.h5', 'r'), h5py.File(b + '/ckpt/step-8/state.h5', 'r')
names = []
A.visit(lambda n: names.append(n) if isinstance(A[n], h5py.Dataset) and (n.startswith('params/') or n.startswith('optim/')) else None)
w = 0
for n in names:
    x, y = np.asarray(A[n], dtype=np.float64), np.asarray(B[n], dtype=np.float64)
    s = np.abs(x).max()
    if s > 0: w = max(w, np.abs(x - y).max() / s)
print('%d tensors of step 8 (parameters, optimizer state): worst %.2e of their scale' % (len(names), w))
assert len(names) > 10 and w <= 1e-5
PY
}

# --- dp 2: rank 1 killed when step 5 begins; the survivor holds all of step 4
ts_step "uninterrupted reference: dp 2, 8 steps" ts_mpirun 2 "$TESSERA" train "$d/e.ini" data.path="$d/syn.h5" run.dir="$d/ref"
killed dp 2 kill:rank=1:step=5
ts_check "dp 2, rank 1 killed at step 5: rank 0 writes its state of step 4 and exits 76" survivors dp 2 1
ts_check "... one file, step-4/rank-0.bin, next to the checkpoint of step 3" \
    sh -c "[ -f '$d/dp/emergency/step-4/rank-0.bin' ] && [ -d '$d/dp/ckpt/step-3' ] && [ ! -d '$d/dp/ckpt/step-4' ]"
ts_step "resume on 1 rank, train.accum = 2 (the global batch of 2 kept)" ts_mpirun 1 "$TESSERA" train "$d/e.ini" \
    data.path="$d/syn.h5" run.dir="$d/dp" train.accum=2
out=$ts_out
ts_check "... from the emergency state of step 4, naming the lost rank, not from step 3" sh -c "
    printf '%s\n' \"\$1\" | grep -q 'emergency state: rank 1 lost at step 5; the 1 surviving rank file (of 2 ranks) holds all of step 4' &&
    printf '%s\n' \"\$1\" | grep -q 'resumed from .*ckpt/step-4 at step 4' &&
    printf '%s\n' \"\$1\" | grep -q 'resumed after the loss of rank 1: step 5 done .* s after the loss'" _ "$out"
ts_check "... and the emergency files are gone (they are the checkpoint now)" sh -c "[ ! -e '$d/dp/emergency/step-4' ]"
ts_step "... ends as the uninterrupted run: every loss, every tensor of step 8" same_run ref dp

# --- dp 2 x pp 2: the last stage's second replica killed; stage 0 and stage 1 survive on other ranks
ts_step "uninterrupted reference: dp 2 x pp 2, 2 micro-batches" ts_mpirun 4 "$TESSERA" train "$d/e.ini" \
    data.path="$d/syn.h5" run.dir="$d/refpp" parallel.pp=2 parallel.microbatches=2
killed pp 4 kill:rank=3:step=6 parallel.pp=2 parallel.microbatches=2
ts_check "dp 2 x pp 2, rank 3 killed at step 6: ranks 0-2 write their stage's state of step 5 and exit 76" survivors pp 4 3
ts_step "resume as pp 2 on 2 ranks, parallel.microbatches = 4" ts_mpirun 2 "$TESSERA" train "$d/e.ini" \
    data.path="$d/syn.h5" run.dir="$d/pp" parallel.pp=2 parallel.microbatches=4
ts_check "... from the emergency state of step 5 (3 rank files of 4)" sh -c "
    printf '%s\n' \"\$1\" | grep -q 'the 3 surviving rank files (of 4 ranks) hold all of step 5' &&
    printf '%s\n' \"\$1\" | grep -q 'resumed from .*ckpt/step-5 at step 5'" _ "$ts_out"
ts_step "... ends as the uninterrupted run" same_run refpp pp

# --- dp 2 x sp 2: a box of the second replica lost; the first replica holds everything
ts_step "uninterrupted reference: dp 2 x sp 2" ts_mpirun 4 "$TESSERA" train "$d/e.ini" data.path="$d/syn.h5" \
    run.dir="$d/refsp" parallel.sp=2
killed sp 4 kill:rank=2:step=5 parallel.sp=2
ts_check "dp 2 x sp 2, rank 2 killed at step 5: the others write step 4 and exit 76" survivors sp 4 2
ts_step "resume as sp 2 on 2 ranks, train.accum = 2" ts_mpirun 2 "$TESSERA" train "$d/e.ini" data.path="$d/syn.h5" \
    run.dir="$d/sp" parallel.sp=2 train.accum=2
ts_check "... from the emergency state of step 4" sh -c "printf '%s\n' \"\$1\" | grep -q 'resumed from .*ckpt/step-4 at step 4'" _ "$ts_out"
ts_step "... ends as the uninterrupted run" same_run refsp sp

# --- ZeRO: the lost rank's optimizer shard exists nowhere else: the last checkpoint, and why
killed zero 2 kill:rank=1:step=5 parallel.zero=1
ts_check "parallel.zero = 1, rank 1 killed at step 5: rank 0 still writes (without the optimizer state)" survivors zero 2 1
ts_step "resume on 1 rank" ts_mpirun 1 "$TESSERA" train "$d/e.ini" data.path="$d/syn.h5" run.dir="$d/zero" \
    parallel.zero=1 train.accum=2
ts_check "... falls back to the checkpoint of step 3, saying the optimizer state was sharded" sh -c "
    printf '%s\n' \"\$1\" | grep -q 'emergency state not used: the emergency state of step 4 .*lacks .*/optim/.*the optimizer state was sharded' &&
    printf '%s\n' \"\$1\" | grep -q 'resumed from .*ckpt/step-3 at step 3'" _ "$ts_out"
ts_finish
