#!/bin/sh
# Faults (issue [8]): each failure that used to hang or pass silently now ends
# the job on every rank with the failing rank's message, within
# fault.timeout + 10 s, and loses nothing already written. Faults are injected
# with TESSERA_FAULT (docs/testing.md) or made for real (a bad label, a full
# tmpfs, a corrupted checkpoint).
. "$TS_SRCDIR/tests/train/lib_train.sh"
# the default exit grace: the timings below are those of a job as users run it
unset TESSERA_EXIT_GRACE
ts_tmpdir faults
mnt=
cleanup() {
    [ -n "$mnt" ] && umount "$mnt" 2>/dev/null
    rm -rf "$d"
}
trap cleanup EXIT # (and the tmpfs mounted below)

ts_synth 8 20 5
ts_ini f.ini model.channels=4,8 ckpt.every=1 ckpt.keep=10
# the steps below wrap train_run themselves (a failing run is what most of them expect)
frun() { # frun FAULT NP NAME ARGS...: run with TESSERA_FAULT=FAULT
    TESSERA_FAULT=$1
    export TESSERA_FAULT
    shift
    train_run "$@"
    _rc=$?
    unset TESSERA_FAULT
    return $_rc
}
# elapsed CMD...: runs CMD, sets el to the seconds it took
elapsed() {
    _t0=$(date +%s)
    "$@"
    _rc=$?
    el=$(($(date +%s) - _t0))
    return $_rc
}
valid_metrics() { # every line of NAME/metrics.jsonl is JSON, steps unique
    "$TS_PY" -c "
import json, sys
steps = [json.loads(l)['step'] for l in open('$d/$1/metrics.jsonl') if 'dice' not in l]
print('steps', steps); assert steps and len(steps) == len(set(steps))"
}
ts_step "initial weights" "$TESSERA" model init "$d/f.ini" --out "$d/init.h5" --seed 0
ts_step "the uninterrupted 2-rank run, 6 steps" train_run 2 full

# --- agreement: an error on one rank inside a step reaches every rank ---
ts_fails_on_all "an injected error on rank 1 at step 3 ends both ranks with its message" "injected" 2 \
    frun error:rank=1:step=3 2 err
ts_check "... the checkpoints before it are intact" [ -f "$d/err/ckpt/step-2/state.h5" ]
if [ -n "$TS_PY" ]; then
    cp "$d/syn.h5" "$d/badlab.h5"
    ts_step "a dataset whose sample 5 has a label out of range" "$TS_PY" -c "
import h5py
with h5py.File('$d/badlab.h5', 'r+') as f:
    l = f['samples/000005/label']; a = l[...]; a[...] = 9; l[...] = a"
    ts_fails_on_all "the rank that reads it fails, and every rank ends with its message" "label 9" 2 \
        train_run 2 badlab data.path="$d/badlab.h5"
    ts_check "... with the trace of where: the sample, its file (on the failing rank) and the step (on both)" \
        sh -c "printf '%s\n' \"\$1\" | grep -c '^ *in the batch of samples .*5 (synth_000005).* of .*badlab.h5' | grep -qx 1 &&
               printf '%s\n' \"\$1\" | grep -c '^ *in training step [0-9]* (rank [01])' | grep -qx 2" _ "$ts_out"
else
    ts_skip "a label out of range on one sample" "no python3 with h5py"
fi
# a full disk under the metrics file (a 64 KiB tmpfs; needs root and mount)
mkdir -p "$d/mnt"
if mount -t tmpfs -o size=64k tmpfs "$d/mnt" 2>/dev/null; then
    mnt="$d/mnt"
    ts_fails_on_all "metrics.jsonl on a full disk: an error on every rank naming the file" "metrics.jsonl: write failed" 2 \
        train_run 2 x train.steps=2000 ckpt.every=0 ckpt.every_minutes=0 run.dir="$mnt/run"
    umount "$mnt"
    mnt=
else
    ts_skip "metrics.jsonl on a full disk" "cannot mount a tmpfs here (not root, or no permission)"
fi

# --- watchdog: a hang ends with the stuck operation and the missing rank ---
if elapsed ts_step_fails "rank 1 hangs before the allreduce of step 3 (fault.timeout = 5)" \
    frun hang:rank=1:op=allreduce:step=3 2 hang fault.timeout=5; then :; fi
ts_check "... ended within fault.timeout + 10 s (took $el s after start)" [ "$el" -le 25 ]
ts_check "... the report names the operation, the step and the rank that did not arrive" sh -c \
    "printf '%s\n' \"\$0\" | grep -q 'watchdog: no progress (fault.timeout) after .* in allreduce.* at step 3; rank 1 has not arrived'" \
    "$ts_out"
# SIGTERM (the scheduler's polite stop) while a rank hangs: ends after the grace
(env TESSERA_FAULT=hang:rank=1:op=allreduce:step=3 timeout -k 5 200 "$MPIEXEC" -n 2 "$TESSERA" train "$d/f.ini" \
    data.path="$d/syn.h5" run.dir="$d/term" fault.timeout=300 >"$d/term.log" 2>&1; echo $? >"$d/term.rc") &
i=0
while [ $i -lt 120 ] && ! grep -q '"step": 2,' "$d/term/metrics.jsonl" 2>/dev/null; do sleep 0.5; i=$((i + 1)); done
sleep 1
t0=$(date +%s)
for p in $(pgrep -f "run.dir=$d/term"); do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = tessera ] && kill -TERM "$p"
done
i=0
while [ $i -lt 120 ] && [ ! -f "$d/term.rc" ]; do sleep 0.5; i=$((i + 1)); done
el=$(($(date +%s) - t0))
sed 's/^/# /' "$d/term.log"
ts_check "SIGTERM during a hang ends the job after the 10 s grace (took $el s), non-zero" \
    sh -c "[ -f '$d/term.rc' ] && [ \$(cat '$d/term.rc') -ne 0 ] && [ \$(cat '$d/term.rc') -ne 124 ] && [ $el -le 25 ]"
ts_check "... with a message naming the signal and the operation" grep -q 'stop requested (a signal) while waiting .* in allreduce' "$d/term.log"
wait
# a rank SIGKILLed and no launcher clean-up (default and shared-memory
# allreduce): each rank runs under a shell that outlives it, so the launcher
# sees nothing; the survivor must end by itself
cat >"$d/w.sh" <<EOF
#!/bin/sh
"$TESSERA" "\$@" 2>"$d/err.\$PMI_RANK"
echo \$? >"$d/rc.\$PMI_RANK"
exec sleep 300
EOF
chmod +x "$d/w.sh"
for coll in auto shm; do
    rm -f "$d"/err.* "$d"/rc.*
    t0=$(date +%s)
    TESSERA_FAULT=kill:rank=1:step=3 TESSERA_COLL_ALLREDUCE=$coll timeout -k 5 200 "$MPIEXEC" -disable-auto-cleanup \
        -n 2 "$d/w.sh" train "$d/f.ini" data.path="$d/syn.h5" run.dir="$d/kill-$coll" fault.timeout=20 >/dev/null 2>&1 &
    bg=$!
    i=0
    while [ $i -lt 120 ] && [ ! -f "$d/rc.0" ]; do sleep 0.5; i=$((i + 1)); done
    el=$(($(date +%s) - t0))
    kill "$bg" 2>/dev/null
    pkill -f "$d/w.sh" 2>/dev/null
    wait "$bg" 2>/dev/null
    cat "$d"/err.* 2>/dev/null | sed 's/^/# /'
    ts_check "rank 1 SIGKILLed at step 3 without launcher clean-up, allreduce $coll: rank 0 ends, non-zero, within fault.timeout + 10 s ($el s after start)" \
        sh -c "[ -f '$d/rc.0' ] && [ \$(cat '$d/rc.0') -ne 0 ] && [ $el -le 30 ]"
    ts_check "... its report says rank 1 is gone" grep -q 'rank 1 is gone' "$d/err.0"
done

# --- consistency: environment that changes collectives must agree ---
ts_fails_on_all "TESSERA_COLL_ALLREDUCE differing between the ranks: an error naming it, before any step" \
    "TESSERA_COLL_ALLREDUCE" 2 timeout -k 5 200 "$MPIEXEC" -n 1 -env TESSERA_COLL_ALLREDUCE ring "$TESSERA" train \
    "$d/f.ini" data.path="$d/syn.h5" run.dir="$d/env" : -n 1 "$TESSERA" train "$d/f.ini" data.path="$d/syn.h5" \
    run.dir="$d/env"
ts_fails_on_all "TESSERA_RANKS_PER_NODE differing between the ranks" "TESSERA_RANKS_PER_NODE" 2 \
    timeout -k 5 200 "$MPIEXEC" -n 1 -env TESSERA_RANKS_PER_NODE 1 "$TESSERA" train "$d/f.ini" \
    data.path="$d/syn.h5" run.dir="$d/env2" : -n 1 "$TESSERA" train "$d/f.ini" data.path="$d/syn.h5" run.dir="$d/env2"

# --- numerics ---
ts_step "NaN on rank 0 at step 2: both ranks skip the step, the run ends normally" \
    frun nan:rank=0:step=2 2 nan2
ts_check "... step 2 is reported skipped on every rank" sh -c \
    "printf '%s\n' \"\$0\" | grep -q 'step 2: non-finite loss or gradients on some rank: the optimizer step is skipped'" "$ts_out"
if [ -n "$TS_PY" ]; then
    ts_step "... metrics.jsonl is valid JSON with step 2 null and flagged; the weights moved" "$TS_PY" -c "
import json, h5py, numpy as np
m = [json.loads(l) for l in open('$d/nan2/metrics.jsonl')]
s2 = [x for x in m if x['step'] == 2][0]; print(s2)
assert s2['loss'] is None and s2['nonfinite'] is True and all(x['loss'] is not None for x in m if x['step'] != 2)
a = h5py.File('$d/init.h5', 'r'); b = h5py.File('$d/nan2/ckpt/step-6/state.h5', 'r')
names = []
b['params'].visit(lambda n: names.append(n) if isinstance(b['params'][n], h5py.Dataset) else None)
moved = max(float(np.abs(np.asarray(b['params'][n]) - np.asarray(a['params'][n])).max()) for n in names if n in a['params'])
print('largest change', moved); assert moved > 1e-4"
fi
ts_step_fails "train.lr = 1e30: diverges, stops after fault.max_bad_steps = 3, exit non-zero" \
    train_run 2 lr fault.max_bad_steps=3 train.lr=1e30 train.steps=40
ts_check "... with a message on every rank" sh -c "[ \$(printf '%s\n' \"\$0\" | grep -c 'tessera: error (rank [01]): .*fault.max_bad_steps') -eq 2 ]" "$ts_out"
if [ -n "$TS_PY" ]; then
    ts_step "... metrics.jsonl is valid JSON; every checkpoint left is finite" "$TS_PY" -c "
import json, glob, h5py, numpy as np
m = [json.loads(l) for l in open('$d/lr/metrics.jsonl')]; print(len(m), 'lines;', sum(x['loss'] is None for x in m), 'null')
cks = sorted(glob.glob('$d/lr/ckpt/step-*/state.h5')); print(cks)
def finite(g):
    ok = [True]
    g.visit(lambda n: ok.__setitem__(0, ok[0] and np.isfinite(np.asarray(g[n])).all()) if isinstance(g[n], h5py.Dataset) else None)
    return ok[0]
assert cks and all(finite(h5py.File(c, 'r')['params']) for c in cks)"
    valid_metrics lr >/dev/null || ts_report bad "metrics steps unique (lr)"
fi
ts_step_fails "NaN on rank 1 from step 4 on: stops after 3 bad steps" \
    frun 'nan:rank=1:step=4+' 2 nanall fault.max_bad_steps=3
ts_step "... resuming (no fault) from the newest checkpoint, which is finite, completes" train_run 2 nanall
ts_check "... resumed from step 3" sh -c "printf '%s\n' \"\$0\" | grep -q 'resumed from .*step-3 at step 3'" "$ts_out"

# --- exact resume ---
k=$(( $(od -An -N1 -tu1 /dev/urandom) % 5 + 2 ))
ts_step_fails "rank 1 SIGKILLed at step $k (a random step)" frun kill:rank=1:step=$k 2 kr
ts_step "rerun: resumes from the last checkpoint" train_run 2 kr
ts_check "... from step $((k - 1))" sh -c "printf '%s\n' \"\$0\" | grep -q 'resumed from .*step-$((k - 1)) at step $((k - 1))'" "$ts_out"
ts_step "kill-and-resume = the uninterrupted run, bit for bit (h5diff of parameters and optimizer state)" \
    sh -c "h5diff '$d/full/ckpt/step-6/state.h5' '$d/kr/ckpt/step-6/state.h5' /params /params &&
           h5diff '$d/full/ckpt/step-6/state.h5' '$d/kr/ckpt/step-6/state.h5' /optim /optim"
if [ -n "$TS_PY" ]; then
    ts_step "metrics.jsonl after the resume: each step once, the same losses as the uninterrupted run" "$TS_PY" -c "
import json
def l(r): return [(x['step'], x['loss']) for x in map(json.loads, open('$d/' + r + '/metrics.jsonl'))]
a, b = l('full'), l('kr'); print(b); assert a == b"
    # the same global batch of 4 on other grids (group norm: per-sample statistics)
    ts_step "4 steps on 2 ranks x batch 2" train_run 2 g2 train.steps=4
    dump_grads=yes # g1 and g4 resume from the same checkpoint: their first step's (step 5's) gradients are compared
    ts_step "resume step 4 on 1 rank x batch 4" train_run 1 g1 train.batch=4 ckpt.resume="$d/g2/ckpt/step-4"
    ts_step "... continues the 2-rank run within 1e-5 relative" \
        "$TS_PY" "$TS_SRCDIR/tests/train/compare_runs.py" "$d/full" "$d/g1" "$d/init.h5" 6 1e-5 1e-5
    ts_step "resume step 4 on 4 ranks x batch 1" train_run 4 g4 train.batch=1 ckpt.resume="$d/g2/ckpt/step-4"
    ts_step "... continues the 2-rank run within 1e-5 relative" \
        "$TS_PY" "$TS_SRCDIR/tests/train/compare_runs.py" "$d/full" "$d/g4" "$d/init.h5" 6 1e-5 1e-5
    dump_grads=
    grads g1 g4
fi

# --- checkpoints ---
ts_step "a run whose step-3 checkpoint is corrupted after writing" frun corrupt:ckpt:step=3 2 cor \
    train.steps=3
ts_step "resuming: the corruption is found (checksum) and step 2 is used" train_run 2 cor train.steps=4
ts_check "... with a message" sh -c "printf '%s\n' \"\$0\" | grep -q 'step-3 is not usable (.*crc\|checksum.*trying the one before it'" \
    "$ts_out"
ts_check "... resumed from step 2" sh -c "printf '%s\n' \"\$0\" | grep -q 'resumed from .*step-2 at step 2'" "$ts_out"
ts_fails_on_all "checkpoint writes fail (ENOSPC): an error on every rank" "No space left" 2 \
    frun enospc:ckpt 2 nospc
ts_check "... the metrics written before are kept" [ -s "$d/nospc/metrics.jsonl" ]
mkdir -p "$d/ro"
: >"$d/ro/ckpt"
ts_fails_on_all "ckpt/ not writable (a file in its place): an error at start" "ckpt" 2 train_run 2 ro
ts_check "... before any step" sh -c "! grep -q '\"step\"' '$d/ro/metrics.jsonl' 2>/dev/null"
long=$d/$(printf 'x%.0s' $(seq 1 1100))
ts_fails_on_all "run.dir longer than 1023 characters: refused, not truncated" "run.dir" 2 train_run 2 x run.dir="$long"
ts_finish
