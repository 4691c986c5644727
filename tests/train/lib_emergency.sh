# Shared by tests/train/emergency.sh and emergency_random.sh (issue [14]):
# trains with a rank killed, under a shell per rank that outlives it (so that
# the launcher does not end the survivors before they write, as on a real
# machine where a dead node's processes are not seen to end), and compares
# a resumed run with an uninterrupted one. Needs $d (a scratch directory);
# sourced after tests/train/lib_train.sh. Makes the dataset ($d/syn.h5) and
# the configuration ($d/e.ini) both scripts train.
ts_synth 8 20 5 1
ts_ini e.ini model.channels=4,8 train.batch=1 train.steps=8 -train.loss ckpt.every=3 ckpt.keep=10
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
    _t0=$(date +%s)
    _i=0
    while [ $_i -lt 120 ] && [ "$(ls "$d/$_n.out"/rc.* 2>/dev/null | wc -l)" -lt "$_np" ]; do sleep 0.5; _i=$((_i + 1)); done
    echo "elapsed $(($(date +%s) - _t0))" >"$d/$_n.out/elapsed" # (seconds until every rank had ended)
    kill "$_bg" 2>/dev/null
    pkill -f "$d/w.sh" 2>/dev/null
    wait "$_bg" 2>/dev/null
    cat "$d/$_n.out"/err.* | grep -E 'emergency|watchdog|fault injected' | cut -c1-300 | sed 's/^/# /'
}
# survivors NAME NP DEAD: every rank but DEAD exited 76 and wrote its file;
# for a rank that did not: its exit status and the end of its stderr (which
# killed() filters), so that a rare failure can be read from the log
survivors() {
    _ok=0
    for _r in $(seq 0 $(($2 - 1))); do
        [ "$_r" = "$3" ] && continue
        _rc=$(cat "$d/$1.out/rc.$_r" 2>/dev/null)
        if [ "$_rc" != 76 ] || ! grep -q "rank $_r: emergency state of step [0-9]* written" "$d/$1.out/err.$_r"; then
            _ok=1
            echo "# rank $_r: exit status ${_rc:-none recorded}; the end of its stderr:"
            tail -n 8 "$d/$1.out/err.$_r" 2>/dev/null | cut -c1-300 | sed 's/^/#   /'
        fi
    done
    return $_ok
}
# same_run A B [GAP]: every loss of B's metrics equal to A's (relative 1e-5; the last record of a step
# counts), every step's loss present (GAP: up to that many steps may lack one: a step finished by the
# survivors whose loss rank 0 did not live to log), and every tensor of their checkpoints of step 8
# (parameters, optimizer state) equal relative to each tensor's own scale (1e-5)
same_run() {
    [ -n "$TS_PY" ] || { echo "no python3 with h5py: compared the losses only"; }
    "${TS_PY:-python3}" - "$d/$1" "$d/$2" "${3:-0}" <<'PY'
import json, sys
a, b, gap = sys.argv[1], sys.argv[2], int(sys.argv[3])
la = {x['step']: x['loss'] for x in map(json.loads, open(a + '/metrics.jsonl')) if 'loss' in x}
lb = {x['step']: x['loss'] for x in map(json.loads, open(b + '/metrics.jsonl')) if 'loss' in x}
assert sorted(la) == list(range(1, 9)), sorted(la)
assert set(lb) <= set(la) and len(la) - len(lb) <= gap, (sorted(la), sorted(lb))
worst = max(abs(la[s] - lb[s]) / abs(la[s]) for s in lb)
print('losses of %d steps: worst relative difference %.2e' % (len(lb), worst))
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

