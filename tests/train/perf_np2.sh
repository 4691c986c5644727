#!/bin/sh
# Counters and timers per phase and per rank in perf.json, and launch
# conventions (issue [7] acceptance 1): 2 ranks with
# perf.papi_events=PAPI_TOT_INS,perf::TASK-CLOCK succeed; PAPI_TOT_INS is
# reported unavailable with the reason where the machine has no hardware
# counters (counted where it has); TASK-CLOCK per phase for both ranks with
# min/mean/max/imbalance; the job ID and launches.jsonl; a stop exits 75;
# a world that does not match its launcher is refused.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir perf
# no dataset: tessera's synthetic random batches
ts_ini t.ini model.channels=4,8 -model.norm -model.groups train.batch=1 train.steps=3 train.lr=0.1 -train.momentum \
    -train.loss -train.deterministic
# a scheduler's job ID without the scheduler: the variables tessera reads
ts_step "2 ranks, perf.papi_events=PAPI_TOT_INS,perf::TASK-CLOCK" env SLURM_JOB_ID=4242 SLURM_JOB_NAME=perftest \
    SLURM_RESTART_COUNT=1 timeout -k 10 300 "$MPIEXEC" -n 2 "$TESSERA" train "$d/t.ini" run.dir="$d/a" \
    perf.papi_events=PAPI_TOT_INS,perf::TASK-CLOCK
out=$ts_out
if printf '%s\n' "$out" | grep -q "PAPI_TOT_INS (papi"; then
    ts_check "PAPI_TOT_INS counted (this machine has hardware counters)" true
else
    ts_check "PAPI_TOT_INS reported unavailable with PAPI's reason" \
        sh -c "printf '%s\n' \"\$1\" | grep -q 'PAPI_TOT_INS unavailable (rank [01]: .*[a-z]'" _ "$out"
fi
ts_check "TASK-CLOCK counted per phase" sh -c "printf '%s\n' \"\$1\" | grep -q 'perf::TASK-CLOCK ('" _ "$out"
if [ -n "$TS_PY" ]; then
    ts_step "perf.json: TASK-CLOCK per phase for both ranks, min/mean/max/imbalance consistent" "$TS_PY" -c "
import json
p = json.load(open('$d/a/perf.json'))
ev = {e['name']: e for e in p['counters']['events']}
t = ev['perf::TASK-CLOCK']; i = ev['PAPI_TOT_INS']
assert t['available'] and t['ranks_counting'] == 2 and t['unit'] == 'ns', t
assert i['available'] or (i['reason'] and i['ranks_counting'] == 0), i
for ph in ('forward', 'backward', 'optimizer', 'step'):
    c = p['counters']['phases'][ph]['perf::TASK-CLOCK']
    r = c['per_rank']
    assert len(r) == 2 and all(x > 0 for x in r), (ph, c)
    assert c['min'] == min(r) and c['max'] == max(r) and abs(c['mean'] - sum(r) / 2) <= 1, (ph, c)
    assert abs(c['imbalance'] - c['max'] / c['mean']) < 1e-3, (ph, c)
    s = p['phases_s'][ph]
    assert len(s['per_rank']) == 2 and s['min'] <= s['mean'] <= s['max'] and s['max'] > 0, (ph, s)
# the step holds forward and backward: on each rank its CPU time is at least theirs
st = p['counters']['phases']['step']['perf::TASK-CLOCK']['per_rank']
fw = p['counters']['phases']['forward']['perf::TASK-CLOCK']['per_rank']
bw = p['counters']['phases']['backward']['perf::TASK-CLOCK']['per_rank']
assert all(st[k] >= fw[k] + bw[k] for k in range(2)), (st, fw, bw)
d = p['derived']
assert d['model_flops_per_step_per_rank']['forward'] > 0 and d['model_gflops_per_s_per_rank']['step'] > 0, d
assert 0 < d['cpu_busy_fraction']['forward'] <= 1.5, d
assert d['collective_bytes_per_step']['gradient_allreduce'] > 0, d
l = p['launch']
assert l['job_id'] == '4242' and l['restarts'] == 1 and l['ranks'] == 2 and l['nodes'] == 1 and l['ranks_per_node'] == 2, l
print('forward TASK-CLOCK per rank (ns):', fw, ' IPC' if 'ipc' in d else ' (no IPC: no cycle counter)')
"
    ts_step "launches.jsonl records the job ID and the first step" "$TS_PY" -c "
import json
l = [json.loads(x) for x in open('$d/a/launches.jsonl')]
assert len(l) == 1 and l[0]['first_step'] == 0 and l[0]['launch']['job_id'] == '4242', l"
else
    ts_skip "perf.json contents" "no python3 with h5py, nibabel and numpy"
fi
ts_step "the rusage fallback (TESSERA_PERF_SOFTWARE=rusage) and perf.timers=false also run" sh -c "
    TESSERA_PERF_SOFTWARE=rusage timeout -k 10 300 $MPIEXEC -n 2 '$TESSERA' train '$d/t.ini' run.dir='$d/b' perf.papi_events=perf::TASK-CLOCK >/dev/null &&
    grep -q '\"source\": \"rusage\"' '$d/b/perf.json' &&
    timeout -k 10 300 $MPIEXEC -n 2 '$TESSERA' train '$d/t.ini' run.dir='$d/c' perf.timers=false | grep -q 'timers and counters off'"
# a stop request exits with 75 (EX_TEMPFAIL) on every rank: the job scripts requeue on it
( timeout 300 "$MPIEXEC" -n 2 "$TESSERA" train "$d/t.ini" run.dir="$d/sig" train.steps=1000000 >"$d/sig.log" 2>&1
  echo "exit $?" >>"$d/sig.log" ) &
n=0
while [ ! -s "$d/sig/metrics.jsonl" ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n + 1)); done
# to a tessera rank (not timeout or mpiexec, whose command lines match too: the last pid is not always a
# rank's, pids wrap around at pid_max, 32768 here)
victim=
for p in $(pgrep -f "run.dir=$d/sig"); do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = tessera ] && victim=$p
done
kill -USR1 "$victim" 2>/dev/null
n=0
while ! grep -q "^exit" "$d/sig.log" 2>/dev/null && [ $n -lt 600 ]; do sleep 0.1; n=$((n + 1)); done
ts_check "a signal: checkpoint, then exit status 75 (requeue me) and the run directory marked stopped" \
    sh -c "grep -q '^exit 75' '$d/sig.log' && grep -q '^step [1-9][0-9]* of 1000000' '$d/sig/stopped'"
ts_step "the next start resumes and clears the mark" ts_mpirun 2 "$TESSERA" train "$d/t.ini" run.dir="$d/sig" \
    train.steps=$(( $(sed -n 's/^step \([0-9]*\) .*/\1/p' "$d/sig/stopped" 2>/dev/null || echo 0) + 1 ))
ts_check "... no stopped file after it completed" [ ! -e "$d/sig/stopped" ]
# launch conventions: srun --mpi=none -n 2 gives each task a world of 1 (simulated: its variables on a singleton)
ts_step_fails "srun's 2 tasks but a world of 1 rank: refused" env SLURM_JOB_ID=7 SLURM_STEP_ID=0 \
    SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=1 timeout 60 "$TESSERA" info
ts_check "... with a message naming the variable and the fix" sh -c "printf '%s\n' \"\$1\" |
    grep -q 'world of 1 rank but the launcher started 2 tasks (SLURM_STEP_NUM_TASKS=2).*srun --mpi=pmi2'" _ "$ts_out"
ts_step_fails "Open MPI's mpirun starting 3 copies of an MPICH program: refused" env OMPI_COMM_WORLD_SIZE=3 \
    timeout 60 "$TESSERA" info
ts_step "a world of 1 in a PBS job of 4 processors without a launcher: a warning only" env PBS_JOBID=12.pbs \
    PBS_NP=4 timeout 60 "$TESSERA" --version
ts_check "... the warning says so" sh -c "printf '%s\n' \"\$1\" | grep -q 'warning: running on 1 rank, but the job was allocated 4 tasks (PBS_NP=4)'" _ "$ts_out"
ts_finish
