#!/bin/bash
# Relaunch a training job on the nodes left when one is lost (issue [14];
# docs/training.md, "Losing a node"):
#   jobs/elastic.sh --hosts h1:R1,h2:R2,... [--launcher CMD] [--tries K] -- TESSERA train CONFIG [key=value ...]
#   jobs/elastic.sh --slurm [--tries K] -- TESSERA train CONFIG [key=value ...]   (inside a Slurm job)
# Runs `CMD -hosts LIST -n N TESSERA train ...` (CMD default mpiexec.mpich;
# jobs/cluster/mpiexec on the namespace cluster). --slurm takes the nodes and
# tasks of the job (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE) and launches
# `srun --mpi=pmi2 --kill-on-bad-exit=0 --overlap --nodelist=NODES ...`
# (CMD replaces `srun --mpi=pmi2`; a CMD not srun gets -hosts): a survivor's exit must not end the
# others while they write, and the relaunch may share the nodes with the
# lost run's step until Slurm has noticed the node is gone (the job needs
# --no-kill, as jobs/slurm/train.sbatch sets, so that Slurm does not end it
# then). SIGUSR1 and SIGTERM are passed on to the launcher (the ranks
# checkpoint and exit 75: not relaunched). When the ranks end because
# a peer was lost (the survivors wrote their emergency state: "emergency
# state of step" in the log), it drops the nodes the survivors named as not
# answering, keeps the global batch (train.accum, or parallel.microbatches
# with parallel.pp > 1, times the replicas lost), and runs again on the
# nodes left: the run resumes from the emergency state (ckpt.resume = auto).
# At most K relaunches (default 3). parallel.pp, parallel.sp, train.accum and
# parallel.microbatches are read from the command line (default 1; give
# them there when the config sets them). Prints what was lost, the step
# resumed from and the seconds from the loss to the first step after it
# (the trainer's lines), and ends with the last run's status.
set -u -o pipefail
launcher=
hosts=
tries=3
slurm=0
while [ $# -gt 0 ]; do
    case $1 in
    --hosts) hosts=${2:?--hosts needs h1:R1,h2:R2,...}; shift 2 ;;
    --slurm) slurm=1; shift ;;
    --launcher) launcher=${2:?--launcher needs a command}; shift 2 ;;
    --tries) tries=${2:?--tries needs a count}; shift 2 ;;
    --) shift; break ;;
    *) echo "jobs/elastic.sh: unexpected argument '$1' (usage: --hosts LIST [--launcher CMD] [--tries K] -- TESSERA train ...)" >&2; exit 2 ;;
    esac
done
if [ "$slurm" = 1 ] && [ -z "$hosts" ]; then # the job's nodes with their task counts: SLURM_TASKS_PER_NODE is e.g. 2(x3),1
    [ -n "${SLURM_JOB_NODELIST:-}" ] && [ -n "${SLURM_TASKS_PER_NODE:-}" ] ||
        { echo "jobs/elastic.sh: --slurm outside a Slurm job (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE unset)" >&2; exit 2; }
    counts=()
    IFS=, read -r -a tp <<<"$SLURM_TASKS_PER_NODE"
    for x in "${tp[@]}"; do
        if [[ $x =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
            for ((i = 0; i < BASH_REMATCH[2]; i++)); do counts+=("${BASH_REMATCH[1]}"); done
        else counts+=("$x"); fi
    done
    i=0
    for h in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
        hosts=$hosts${hosts:+,}$h:${counts[$i]:-${counts[0]}}
        i=$((i + 1))
    done
fi
[ -n "$hosts" ] && [ $# -ge 2 ] || { echo "jobs/elastic.sh: usage: --hosts h1:R1,... [--launcher CMD] -- TESSERA train CONFIG ..." >&2; exit 2; }
[ -n "$launcher" ] || { [ "$slurm" = 1 ] && launcher="srun --mpi=pmi2" || launcher=mpiexec.mpich; }
val() { # KEY DEFAULT: the last KEY=value of the command line
    local v=$2 a
    for a in "${cmd[@]}"; do case $a in "$1"=*) v=${a#"$1"=} ;; esac; done
    echo "$v"
}
ranks_of() { local n=0 h; IFS=, read -r -a hl <<<"$1"; for h in "${hl[@]}"; do n=$((n + ${h##*:})); done; echo $n; }
cmd=("$@")
pp=$(val parallel.pp 1)
sp=$(val parallel.sp 1)
accum=$(val train.accum 1)
micro=$(val parallel.microbatches 1)
n0=$(ranks_of "$hosts")
dp0=$((n0 / (pp * sp)))
log=$(mktemp /tmp/tessera-elastic.XXXXXX)
trap 'rm -f "$log"' EXIT
extra=()
lp=
# the early signals (time limit, walltime) go on to the launcher, which passes them to the ranks
pending= # a signal that came before the launcher started: passed on once it has
pass_on() { if [ -n "$lp" ]; then kill -"$1" "$lp" 2>/dev/null; else pending=$1; fi; }
trap 'pass_on USR1' USR1
trap 'pass_on TERM' TERM
launch() { # HOSTS N: the launcher in a process group of its own (setsid), its output to the log
    if [[ $launcher == srun* ]]; then
        local nodes= k=0 h
        IFS=, read -r -a hl <<<"$1"
        for h in "${hl[@]}"; do nodes=$nodes${nodes:+,}${h%%:*}; k=$((k + 1)); done
        # shellcheck disable=SC2086
        setsid $launcher --kill-on-bad-exit=0 --overlap --nodelist="$nodes" --nodes="$k" --ntasks="$2" \
            "${cmd[@]}" "${extra[@]}" >"$log" 2>&1 &
    else
        # shellcheck disable=SC2086
        setsid $launcher -hosts "$1" -n "$2" "${cmd[@]}" "${extra[@]}" >"$log" 2>&1 &
    fi
    lp=$!
    [ -n "$pending" ] && { sleep 1; kill -"$pending" "$lp" 2>/dev/null; pending=; }
}
for ((k = 0; ; k++)); do
    n=$(ranks_of "$hosts")
    echo "jobs/elastic.sh: run $((k + 1)) on $hosts ($n ranks)${extra[*]:+, ${extra[*]}}" >&2
    launch "$hosts" "$n" # (its output shown as it comes)
    tail -n +1 -f --pid="$lp" "$log" &
    tp=$!
    # A lost node's launcher connection stays half open (no reset comes over a dead link), so the
    # launcher can wait for it long after the survivors wrote their state and exited: once every
    # survivor has written (the ranks of the nodes named lost are not waited for; a rank lost on a
    # node that answers counts as one), the launcher's group is ended.
    while kill -0 "$lp" 2>/dev/null; do
        sleep 1
        w=$(grep -c 'emergency state of step .* written' "$log" 2>/dev/null)
        [ "${w:-0}" -gt 0 ] || continue
        gone=$(grep -o 'node [^ ]* (ranks\{0,1\} [0-9, .]*) does not answer' "$log" | sort -u |
            sed 's/.*(ranks\{0,1\} \([0-9, .]*\)).*/\1/' | tr ',' '\n' | grep -c '[0-9]')
        [ "$gone" -gt 0 ] || gone=1
        if [ "$w" -ge $((n - gone)) ]; then
            sleep 3
            kill -0 "$lp" 2>/dev/null || break
            echo "jobs/elastic.sh: every survivor wrote its emergency state: ending the launcher" >&2
            kill -TERM -- "-$lp" 2>/dev/null
            sleep 2
            kill -KILL -- "-$lp" 2>/dev/null
            break
        fi
    done
    while :; do # (a signal passed on ends `wait` early: wait again; bash's note on a killed launcher silenced)
        { wait "$lp"; } 2>/dev/null
        rc=$?
        kill -0 "$lp" 2>/dev/null || break
    done
    wait "$tp" 2>/dev/null
    [ "$rc" -eq 0 ] && exit 0
    if ! grep -q 'emergency state of step' "$log"; then
        echo "jobs/elastic.sh: the run ended with status $rc without a lost peer: not relaunched" >&2
        exit "$rc"
    fi
    [ "$k" -lt "$tries" ] || { echo "jobs/elastic.sh: $tries relaunches done: giving up" >&2; exit "$rc"; }
    # the nodes the survivors named: "node n2 (ranks 2, 3) does not answer"
    lost=$(grep -o 'node [^ ]* (ranks\{0,1\} [0-9, .]*) does not answer' "$log" | awk '{print $2}' | sort -u)
    left=
    IFS=, read -r -a hl <<<"$hosts"
    for h in "${hl[@]}"; do
        grep -qx "${h%%:*}" <<<"$lost" || left=$left${left:+,}$h
    done
    [ -n "$left" ] || { echo "jobs/elastic.sh: no node left" >&2; exit "$rc"; }
    n=$(ranks_of "$left")
    dp=$((n / (pp * sp)))
    if [ "$dp" -lt 1 ] || [ $((dp * pp * sp)) -ne "$n" ] || [ $(((dp0 * accum * micro) % dp)) -ne 0 ]; then
        echo "jobs/elastic.sh: $n ranks left cannot hold pp $pp x sp $sp with the global batch kept: not relaunched" >&2
        exit "$rc"
    fi
    if [ "$pp" -gt 1 ]; then
        extra=("parallel.microbatches=$((dp0 * micro / dp))")
    else
        extra=("train.accum=$((dp0 * accum / dp))")
    fi
    echo "jobs/elastic.sh: lost ${lost:-a rank (its node still answers)}; relaunching on $left ($n ranks, dp $dp, ${extra[*]})" >&2
    hosts=$left
done
