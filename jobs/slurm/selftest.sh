#!/bin/bash
# The job scripts against a real one-node Slurm (Debian's slurm-wlm):
#   bash jobs/slurm/selftest.sh [TESSERA]        (as root; TESSERA: the binary, default build/tessera)
# Installs munge, slurmctld, slurmd and the client commands if absent,
# starts munged, slurmctld and slurmd on this machine with a minimal
# private configuration (its own munge socket and key, ports, spool and
# state directories under a temporary directory; proctrack/linuxproc,
# task/none, no accounting), then:
#   1. submits jobs/slurm/train.sbatch with a tiny config on 2 tasks and
#      checks the job's state and exit code, and its run directory (named by
#      the job ID, which perf.json and launches.jsonl record);
#   2. submits it again with a 1-minute time limit and the early signal
#      (--signal=B:USR1@50) for about 55 s of training: the ranks checkpoint
#      on the signal, exit 75, the script requeues the job, and the requeued
#      job resumes from the checkpoint until training completes;
#   3. runs `srun --mpi=none -n 2 tessera train` and checks that every task
#      refuses with a message naming the cause;
#   4. runs jobs/scaling/sweep.sh --slurm (strong dp at 1 and 2 ranks): one
#      job array per rank count, each task a training with its perf.json.
# Stops only the daemons it started and removes its directory, whatever
# happens (a Slurm or munge already running on this machine is left alone:
# the private configuration does not touch it). Prints TAP; exit 0 when all
# pass, 77 when it cannot run here (not root, no packages).
# Slurm holds a requeued job for cred_expire + 1 seconds (120 s by default);
# the private configuration sets cred_expire=10 and sched_interval=2 so that
# the test takes minutes, not a quarter of an hour.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${1:-${TESSERA:-$here/build/tessera}}
case $tessera in /*) ;; *) tessera=$(pwd)/$tessera ;; esac
n=0
bad=0
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; bad=1; fi; }
diag() { sed 's/^/# /'; }
skip_all() { echo "1..0 # SKIP $1"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip_all "needs root (it starts slurmctld, slurmd and munged)"
[ -x "$tessera" ] || { echo "Bail out! no tessera binary at $tessera"; exit 1; }
need=()
for p in munge slurmctld slurmd slurm-client; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "# installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -q && apt-get install -y -q --no-install-recommends "${need[@]}"; } 2>&1 | tail -3 | diag
    for p in "${need[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || skip_all "cannot install $p"
    done
fi

d=$(mktemp -d /tmp/tessera-slurm.XXXXXX)
chmod 700 "$d"
mkdir -p "$d/state" "$d/spool" "$d/runs" "$d/out"
started=()
cleanup() {
    local pid
    # jobs first (their processes are children of our slurmd), then the daemons we started, newest first
    [ -f "$d/slurm.conf" ] && SLURM_CONF=$d/slurm.conf timeout 10 scancel --quiet --user=root 2>/dev/null
    for ((i = ${#started[@]} - 1; i >= 0; i--)); do
        pid=${started[$i]}
        kill "$pid" 2>/dev/null
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null
    done
    rm -rf "$d"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# a free TCP port pair
port=
for p in $(shuf -i 20000-29990 -n 20); do
    if ! ss -ltnH 2>/dev/null | awk '{print $4}' | grep -qE ":($p|$((p + 1)))\$"; then port=$p; break; fi
done
[ -n "$port" ] || { echo "Bail out! no free port"; exit 1; }

# munge: a private key and socket
mungekey -c -k "$d/munge.key" 2>/dev/null || dd if=/dev/urandom of="$d/munge.key" bs=1 count=1024 2>/dev/null
chmod 400 "$d/munge.key"
munged --force --socket="$d/munge.sock" --key-file="$d/munge.key" --pid-file="$d/munged.pid" \
    --log-file="$d/munged.log" --seed-file="$d/munged.seed" 2>&1 | diag
for _ in $(seq 1 50); do [ -s "$d/munged.pid" ] && break; sleep 0.1; done
[ -s "$d/munged.pid" ] && started+=("$(cat "$d/munged.pid")")
munge -S "$d/munge.sock" -n </dev/null | unmunge -S "$d/munge.sock" >/dev/null 2>&1
ok $? "munged runs with a private key and socket"

host=$(hostname -s)
cpus=$(nproc --all) # (plain nproc follows OMP_NUM_THREADS)
mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
cat >"$d/slurm.conf" <<EOF
ClusterName=tessera-selftest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$d/munge.sock,cred_expire=10
CredType=cred/munge
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_interval=2
MpiDefault=none
ReturnToService=2
MinJobAge=3600
KillWait=15
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=selftest Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$d/slurm.conf
slurmctld -f "$SLURM_CONF" -i 2>&1 | diag
for _ in $(seq 1 50); do [ -s "$d/slurmctld.pid" ] && break; sleep 0.1; done
[ -s "$d/slurmctld.pid" ] && started+=("$(cat "$d/slurmctld.pid")")
slurmd -f "$SLURM_CONF" 2>&1 | diag
for _ in $(seq 1 50); do [ -s "$d/slurmd.pid" ] && break; sleep 0.1; done
[ -s "$d/slurmd.pid" ] && started+=("$(cat "$d/slurmd.pid")")
state=
for _ in $(seq 1 60); do
    state=$(sinfo -h -N -o %t 2>/dev/null | head -1)
    [ "$state" = idle ] && break
    sleep 1
done
ok "$([ "$state" = idle ]; echo $?)" "slurmctld and slurmd up: node $host ($cpus CPUs) $state"
if [ "$state" != idle ]; then
    tail -20 "$d/slurmctld.log" "$d/slurmd.log" 2>/dev/null | diag
    echo "1..$n"
    exit 1
fi

# job_field JOBID FIELD: a field of `scontrol show job`
job_field() { scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
# wait_job JOBID SECONDS: until it is COMPLETED, FAILED, CANCELLED, TIMEOUT... (not pending, running or requeued)
wait_job() {
    local t=0 st
    while [ $t -lt "$2" ]; do
        st=$(job_field "$1" JobState)
        case $st in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) echo "$st"; return 0 ;; esac
        sleep 2
        t=$((t + 2))
    done
    echo "${st:-unknown} (still, after $2 s)"
    return 1
}

cat >"$d/tiny.ini" <<'INI'
[model]
channels = 4,8
classes = 3
[data]
patch = 16
[train]
batch = 1
steps = 20
lr = 0.05
log_every = 10
log_seconds = 5
[eval]
final = false
INI
export TESSERA=$tessera TESSERA_RUNS=$d/runs TESSERA_EXIT_GRACE=20
cd "$d" || exit 1

# 1. the 2-task training job
job=$(sbatch --parsable -n 2 -o "$d/out/%j.out" "$here/jobs/slurm/train.sbatch" "$d/tiny.ini" 2>&1)
ok $? "sbatch train.sbatch on 2 tasks: job $job"
st=$(wait_job "$job" 240)
ec=$(job_field "$job" ExitCode)
diag <"$d/out/$job.out"
ok "$([ "$st" = COMPLETED ] && [ "$ec" = 0:0 ]; echo $?)" "the job completed with exit code 0:0 ($st, $ec)"
run=$d/runs/tessera-train-$job
ok "$([ -s "$run/perf.json" ] && [ -d "$run/ckpt/step-20" ] && grep -q '"step": 20' "$run/metrics.jsonl"; echo $?)" \
    "its run directory is named by the job ID and holds the step-20 checkpoint, metrics and perf.json"
python3 - "$run" "$job" <<'PY' 2>&1 | diag
import json, sys
p = json.load(open(sys.argv[1] + '/perf.json'))
l = p['launch']
assert p['ranks'] == 2 and l['job_id'] == sys.argv[2] and l['scheduler'] == 'slurm' and l['ranks'] == 2, l
assert len(p['phases_s']['forward']['per_rank']) == 2
print('perf.json launch:', l)
PY
ok "${PIPESTATUS[0]}" "perf.json: 2 ranks, scheduler slurm, job ID $job"

# steps for about 55 s of training, from job 1's step time
steps=$(python3 -c "
import json; p = json.load(open('$run/perf.json')); s = p['phases_s']['step']['max'] / p['steps']
print(max(200, int(55 / max(s, 1e-4))))" 2>/dev/null)
steps=${steps:-2000}

# 2. time limit: the early signal, a checkpoint, the requeue and the resumed job
job2=$(sbatch --parsable -n 2 --time=1 --signal=B:USR1@50 -o "$d/out/%j.out" "$here/jobs/slurm/train.sbatch" \
    "$d/tiny.ini" train.steps="$steps" train.log_every=50 2>&1)
ok $? "sbatch --time=1 --signal=B:USR1@50 train.sbatch, $steps steps (about 55 s of training): job $job2"
st=$(wait_job "$job2" 600)
ec=$(job_field "$job2" ExitCode)
restarts=$(job_field "$job2" Restarts)
diag <"$d/out/$job2.out"
run2=$d/runs/tessera-train-$job2
ok "$([ "$st" = COMPLETED ] && [ "$ec" = 0:0 ]; echo $?)" "the job completed ($st, exit code $ec) after $restarts requeue(s)"
ok "$([ "${restarts:-0}" -ge 1 ] && grep -q 'USR1 at' "$d/out/$job2.out" && grep -q 'requeueing job' "$d/out/$job2.out"; echo $?)" \
    "the early signal reached the script, which requeued the job ($restarts restart(s))"
ok "$(grep -q 'stopped by a signal at step' "$d/out/$job2.out" && grep -q "resumed from .*step-[1-9][0-9]* at step [1-9]" "$d/out/$job2.out"; echo $?)" \
    "tessera checkpointed on the signal and the requeued job resumed from that checkpoint"
python3 - "$run2" "$steps" "$job2" <<'PY' 2>&1 | diag
import json, sys
run, steps, job = sys.argv[1], int(sys.argv[2]), sys.argv[3]
l = [json.loads(x) for x in open(run + '/launches.jsonl')]
print('starts:', [(x['launch']['restarts'], x['first_step']) for x in l])
assert len(l) >= 2 and l[0]['first_step'] == 0 and all(x['launch']['job_id'] == job for x in l)
assert all(l[i + 1]['first_step'] > l[i]['first_step'] for i in range(len(l) - 1))
assert [x['launch']['restarts'] for x in l] == list(range(len(l)))
m = [json.loads(x) for x in open(run + '/metrics.jsonl')]
assert m[-1]['step'] == steps, m[-1]
PY
ok "${PIPESTATUS[0]}" "launches.jsonl: one start per attempt, each from a later step; training reached step $steps"

# 3. srun without an MPI plugin: two 1-rank worlds, refused by each task
out=$(timeout 120 srun --mpi=none -n 2 "$tessera" train "$d/tiny.ini" run.dir="$d/runs/none" 2>&1)
rc=$?
printf '%s\n' "$out" | diag
refused=$(printf '%s\n' "$out" | grep -c "world of 1 rank but the launcher started 2 tasks (SLURM_STEP_NUM_TASKS=2)")
ok "$([ $rc -ne 0 ] && [ "$refused" -eq 2 ] && [ ! -e "$d/runs/none/perf.json" ]; echo $?)" \
    "srun --mpi=none -n 2: both tasks refuse with a clear message (exit $rc), nothing trained"

# 4. a sweep as Slurm job arrays (jobs/scaling/sweep.sh --slurm: one array per rank count, sweep.sbatch)
out=$(bash "$here/jobs/scaling/sweep.sh" --config "$d/tiny.ini" --ranks 1,2 --steps 2 --mode strong --layouts dp \
    --out "$d/sweep" --slurm --tessera "$tessera" train.batch=2 2>&1)
rc=$?
printf '%s\n' "$out" | diag
arrays=$(printf '%s\n' "$out" | grep -c '^Submitted batch job')
ok "$([ $rc -eq 0 ] && [ "$arrays" -eq 2 ]; echo $?)" "sweep.sh --slurm submitted one job array per rank count ($arrays)"
for _ in $(seq 1 90); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 2; done
ok "$([ -s "$d/sweep/strong-dp-r1/perf.json" ] && [ -s "$d/sweep/strong-dp-r2/perf.json" ] &&
    grep -q '"ranks": 2,' "$d/sweep/strong-dp-r2/perf.json" && grep -q '"array_id": "[0-9]*_1"' "$d/sweep/strong-dp-r2/perf.json"; echo $?)" \
    "both array tasks trained (1 and 2 ranks) with the array ID in perf.json"

echo "1..$n"
exit $bad
