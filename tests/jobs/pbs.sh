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
# steps for about 12 s of training, from that run's step time
steps=$(sed -n 's/.*"step": {"min": [0-9.]*, "mean": \([0-9.]*\),.*/\1/p' "$run/perf.json" | head -1)
steps=$(awk -v s="${steps:-0.01}" 'BEGIN { n = int(12 * 10 / (s > 1e-4 ? s : 1e-4)); print n < 200 ? 200 : n }')
# walltime 8 s, alarm 5 s before it: the ranks are asked to stop about 3 s in
run_count=1
ts_step "walltime 8 s, alarm 5 s before: $steps steps (about 12 s) stop early, the script calls qrerun" \
    pbs_env env TESSERA_WALLTIME=00:00:08 TESSERA_SIGNAL_MARGIN=5 timeout 300 bash "$jobs/pbs/train.pbs" "$d/t.ini" \
    train.steps=$steps run.dir="$d/runs/tl"
printf '%s\n' "$ts_out" >"$d/tl.log"
ckpt=$(ls "$d/runs/tl/ckpt" 2>/dev/null | sed -n 's/^step-//p' | sort -n | tail -1)
ts_check "the alarm reached tessera: checkpoint at step ${ckpt:-none} < $steps, exit 75, qrerun called with the job ID" \
    sh -c "grep -q 'walltime alarm at' '$d/tl.log' && grep -q 'stopped by a signal at step' '$d/tl.log' &&
           [ -n '$ckpt' ] && [ '${ckpt:-0}' -lt $steps ] && grep -qx '4711.pbs-server' '$d/qrerun.calls'"
run_count=2
ts_step "the rerun (PBS_RUN_COUNT=2) resumes from the checkpoint and completes" pbs_env timeout 300 bash \
    "$jobs/pbs/train.pbs" "$d/t.ini" train.steps=$steps run.dir="$d/runs/tl"
ts_check "resumed at step $ckpt, ended at step $steps; launches.jsonl has both starts" \
    sh -c "printf '%s\n' \"\$1\" | grep -q 'resumed from .*step-$ckpt at step $ckpt' && [ -d '$d/runs/tl/ckpt/step-$steps' ] &&
           [ \$(wc -l <'$d/runs/tl/launches.jsonl') -eq 2 ] && grep -q '\"restarts\": 1' '$d/runs/tl/launches.jsonl'" _ "$ts_out"
ts_step_fails "infer.pbs without arguments: usage" pbs_env bash "$jobs/pbs/infer.pbs"
ts_step_fails "convert.pbs without arguments: usage" pbs_env bash "$jobs/pbs/convert.pbs"
ts_step_fails "sweep.pbs outside an array: usage" pbs_env bash "$jobs/pbs/sweep.pbs" "$d/t.ini"
ts_step_fails "train.sbatch outside a Slurm job: refused" env -u SLURM_JOB_ID bash "$jobs/slurm/train.sbatch" "$d/t.ini"
ts_finish
