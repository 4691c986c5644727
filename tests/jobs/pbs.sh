#!/bin/bash
# The PBS job scripts, run as a user without qsub would: under bash with
# the variables PBS sets (PBS_JOBID, PBS_JOBNAME, PBS_O_WORKDIR,
# PBS_NODEFILE with 2 slots, PBS_RUN_COUNT) and a stand-in qrerun that
# records its call. A training job completes in a run directory named by
# the job number; with a walltime of a few seconds the script's alarm asks
# tessera to checkpoint, tessera exits 75, the script calls qrerun, and the
# rerun (PBS_RUN_COUNT=2, same job ID) resumes to completion. Also: every
# job script parses (bash -n), the others refuse without arguments, and
# the Slurm scripts refuse outside a Slurm job.
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
export TESSERA="$TS_BUILDDIR/tessera" TESSERA_EXIT_GRACE=20 OMP_NUM_THREADS=1
d=$(mktemp -d "${TMPDIR:-/tmp}/tessera-pbs.XXXXXX")
trap 'rm -rf "$d"' EXIT
jobs=$TS_SRCDIR/jobs
for f in "$jobs"/pbs/*.pbs "$jobs"/slurm/*.sbatch "$jobs"/slurm/selftest.sh "$jobs"/scaling/sweep.sh; do
    ts_step "bash -n ${f#"$TS_SRCDIR"/}" bash -n "$f"
done
mkdir -p "$d/bin"
printf '#!/bin/sh\necho "$@" >>"%s/qrerun.calls"\n' "$d" >"$d/bin/qrerun"
chmod +x "$d/bin/qrerun"
hostname >"$d/nodes"
hostname >>"$d/nodes"
cat >"$d/t.ini" <<'INI'
[model]
channels = 4,8
classes = 3
[data]
patch = 16
[train]
batch = 1
steps = 10
lr = 0.05
log_every = 10
[eval]
final = false
INI
pbs_env() { # runs a job script with the variables a PBS job has
    env -u SLURM_JOB_ID PATH="$d/bin:$PATH" PBS_JOBID=4711.pbs-server PBS_JOBNAME=tessera-train PBS_O_WORKDIR="$d" \
        PBS_NODEFILE="$d/nodes" PBS_RUN_COUNT="${run_count:-1}" TESSERA_RUNS="$d/runs" "$@"
}
run_count=1
ts_step "train.pbs on the 2 slots of PBS_NODEFILE, 10 steps" pbs_env timeout 300 bash "$jobs/pbs/train.pbs" "$d/t.ini"
run="$d/runs/tessera-train-4711"
ts_check "run directory named by the job number: step-10 checkpoint, perf.json of 2 ranks with the PBS job ID" \
    sh -c "[ -d '$run/ckpt/step-10' ] && grep -q '\"ranks\": 2,' '$run/perf.json' && grep -q '\"job_id\": \"4711.pbs-server\"' '$run/perf.json'"
# walltime 10 s, alarm 5 s before it: the ranks are asked to stop about 5 s in (time enough, on a slow
# machine, for tessera to have started and set its signal handler). The run is given far more
# steps than it can take before then (it used to be given "about 12 s" of steps from the first run's step
# time, which its cold start makes look 2x slower than a warm run: a first run slowed 2x more by the machine
# let the second finish before the alarm); the rerun completes a few steps past the checkpoint.
steps=1000000
run_count=1
ts_step "walltime 10 s, alarm 5 s before: $steps steps stop early, the script calls qrerun" \
    pbs_env env TESSERA_WALLTIME=00:00:10 TESSERA_SIGNAL_MARGIN=5 timeout 300 bash "$jobs/pbs/train.pbs" "$d/t.ini" \
    train.steps=$steps run.dir="$d/runs/tl"
printf '%s\n' "$ts_out" >"$d/tl.log"
ckpt=$(ls "$d/runs/tl/ckpt" 2>/dev/null | sed -n 's/^step-//p' | sort -n | tail -1)
ts_check "the alarm reached tessera: checkpoint at step ${ckpt:-none} < $steps, exit 75, qrerun called with the job ID" \
    sh -c "grep -q 'walltime alarm at' '$d/tl.log' && grep -q 'stopped by a signal at step ${ckpt:-none} of $steps' '$d/tl.log' &&
           [ -n '$ckpt' ] && [ '${ckpt:-0}' -lt $steps ] && grep -qx '4711.pbs-server' '$d/qrerun.calls'"
end=$((${ckpt:-0} + 10))
run_count=2
ts_step "the rerun (PBS_RUN_COUNT=2) resumes from the checkpoint and completes (train.steps $end)" pbs_env timeout 300 bash \
    "$jobs/pbs/train.pbs" "$d/t.ini" train.steps=$end run.dir="$d/runs/tl"
ts_check "resumed at step $ckpt, ended at step $end; launches.jsonl has both starts" \
    sh -c "printf '%s\n' \"\$1\" | grep -q 'resumed from .*step-$ckpt at step $ckpt' && [ -d '$d/runs/tl/ckpt/step-$end' ] &&
           [ \$(wc -l <'$d/runs/tl/launches.jsonl') -eq 2 ] && grep -q '\"restarts\": 1' '$d/runs/tl/launches.jsonl'" _ "$ts_out"
ts_step_fails "infer.pbs without arguments: usage" pbs_env bash "$jobs/pbs/infer.pbs"
ts_step_fails "convert.pbs without arguments: usage" pbs_env bash "$jobs/pbs/convert.pbs"
ts_step_fails "sweep.pbs outside an array: usage" pbs_env bash "$jobs/pbs/sweep.pbs" "$d/t.ini"
ts_step_fails "train.sbatch outside a Slurm job: refused" env -u SLURM_JOB_ID bash "$jobs/slurm/train.sbatch" "$d/t.ini"
ts_finish
