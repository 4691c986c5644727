#!/bin/bash
# A scaling study: the same training at several rank counts, strong and weak,
# data-parallel and spatial, each point a `tessera train` run whose perf.json
# jobs/scaling/report turns into a CSV and plots (docs/scaling.md).
#   jobs/scaling/sweep.sh [--config FILE] [--ranks 1,2,4] [--steps N] [--warmup W]
#                         [--mode strong|weak|both] [--layouts dp,sp] [--out DIR]
#                         [--repeat K] [--slurm [--dry-run]] [--tessera BIN] [section.key=value ...]
# Points (R ranks, config batch B, patch D x H x W):
#   strong dp: global batch B split over R replicas (train.batch = B / R; R must divide B)
#   strong sp: one replica, every sample's volume split over R ranks (parallel.sp = R)
#   weak dp:   R replicas of train.batch = B / max(R) each
#   weak sp:   parallel.sp = R with the patch depth D x R: every rank keeps a D x H x W box
# Locally every point runs now with mpiexec.mpich (OMP_NUM_THREADS, default 1,
# threads per rank; repeats interleaved so that points share the machine's
# drift); with --slurm the plan is written and submitted as one Slurm job
# array per rank count (jobs/slurm/sweep.sbatch), or only printed with
# --dry-run. Run directories: DIR/<mode>-<layout>-r<R>[-k<K>], listed in
# DIR/points.tsv. Defaults: configs/scaling.ini, --ranks 1,2,4, --steps 5
# timed after --warmup 1, --mode both, --layouts dp,sp, --out runs/sweep.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
config=$here/configs/scaling.ini
ranks=1,2,4
steps=5
warmup=1
mode=both
layouts=dp,sp
out=runs/sweep
repeat=1
slurm=0
dry=0
tessera=${TESSERA:-}
over=()
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case $1 in
    --config) config=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --layouts) layouts=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --slurm) slurm=1; shift ;;
    --dry-run) dry=1; shift ;;
    --tessera) tessera=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *=*) over+=("$1"); shift ;;
    *) echo "sweep.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$tessera" ]; then
    for t in "$here/build/tessera" "$here/build-check/tessera" "$(command -v tessera 2>/dev/null)"; do
        [ -x "$t" ] && { tessera=$t; break; }
    done
fi
[ -x "$tessera" ] || { echo "sweep.sh: no tessera binary (build it, or give --tessera BIN)" >&2; exit 2; }
[ -f "$config" ] || { echo "sweep.sh: no config $config" >&2; exit 2; }
case $mode in strong) modes=(strong) ;; weak) modes=(weak) ;; both) modes=(strong weak) ;;
*) echo "sweep.sh: --mode strong|weak|both" >&2; exit 2 ;; esac
IFS=, read -r -a rlist <<<"$ranks"
IFS=, read -r -a llist <<<"$layouts"
for l in "${llist[@]}"; do
    case $l in dp | sp) ;; *) echo "sweep.sh: layout '$l': dp or sp (pipeline stages are not available yet)" >&2; exit 2 ;; esac
done
maxr=1
for r in "${rlist[@]}"; do
    [[ $r =~ ^[1-9][0-9]*$ ]] || { echo "sweep.sh: --ranks: '$r' is not a rank count" >&2; exit 2; }
    [ "$r" -gt "$maxr" ] && maxr=$r
done
# the config's batch and patch (a key given on the command line wins)
ini_get() { # ini_get SECTION KEY DEFAULT
    local v
    for o in "${over[@]}"; do [ "${o%%=*}" = "$1.$2" ] && { echo "${o#*=}"; return; }; done
    v=$(awk -v s="[$1]" -v k="$2" '/^\[/ {in_s = ($0 == s)} in_s && $1 == k && $2 == "=" {sub(/^[^=]*= */, ""); sub(/ *#.*/, ""); print; exit}' "$config")
    echo "${v:-$3}"
}
batch=$(ini_get train batch 2)
patch=$(ini_get data patch 64)
IFS=, read -r -a pd <<<"$patch"
[ ${#pd[@]} -eq 1 ] && pd=("${pd[0]}" "${pd[0]}" "${pd[0]}")

mkdir -p "$out" || exit 1
points=$out/points.tsv
printf 'mode\tlayout\tranks\trepeat\trun_dir\n' >"$points"
plan=()
for k in $(seq 1 "$repeat"); do
    for m in "${modes[@]}"; do
        for l in "${llist[@]}"; do
            for r in "${rlist[@]}"; do
                args=()
                case $m-$l in
                strong-dp)
                    if [ $((batch % r)) -ne 0 ]; then
                        echo "sweep.sh: strong dp at $r ranks: train.batch $batch is not divisible by $r; skipped" >&2
                        continue
                    fi
                    args=(parallel.dp="$r" parallel.sp=1 train.batch=$((batch / r))) ;;
                strong-sp) args=(parallel.dp=1 parallel.sp="$r" parallel.sp_dims=auto train.batch="$batch") ;;
                weak-dp)
                    b=$((batch / maxr))
                    [ "$b" -lt 1 ] && b=1
                    args=(parallel.dp="$r" parallel.sp=1 train.batch="$b") ;;
                weak-sp)
                    b=$((batch / maxr))
                    [ "$b" -lt 1 ] && b=1
                    args=(parallel.dp=1 parallel.sp="$r" parallel.sp_dims="$r,1,1" train.batch="$b"
                        data.patch="$((pd[0] * r)),${pd[1]},${pd[2]}") ;;
                esac
                name=$m-$l-r$r
                [ "$repeat" -gt 1 ] && name=$name-k$k
                dir=$out/$name
                printf '%s\t%s\t%s\t%s\t%s\n' "$m" "$l" "$r" "$k" "$dir" >>"$points"
                plan+=("$r $dir $config ${args[*]} ${over[*]} train.steps=$((steps + warmup)) perf.warmup_steps=$warmup eval.final=false ckpt.every=0")
            done
        done
    done
done
echo "sweep.sh: ${#plan[@]} points (${modes[*]} x ${llist[*]} x ranks ${rlist[*]} x $repeat), $steps steps each after $warmup warm-up; $points"

if [ "$slurm" = 1 ]; then
    planf=$out/plan.txt
    { echo "# RANKS RUN_DIR CONFIG overrides (jobs/slurm/sweep.sbatch)"; printf '%s\n' "${plan[@]}"; } >"$planf"
    for r in $(printf '%s\n' "${rlist[@]}" | sort -n -u); do
        idx=$(for i in "${!plan[@]}"; do [ "${plan[$i]%% *}" = "$r" ] && printf '%s,' "$i"; done)
        [ -z "$idx" ] && continue
        cmd=(sbatch --array="${idx%,}" --ntasks="$r" --export=ALL,TESSERA="$tessera"
            -o "$out/slurm-%A_%a.out" "$here/jobs/slurm/sweep.sbatch" "$planf")
        echo "+ ${cmd[*]}"
        [ "$dry" = 1 ] || "${cmd[@]}" || exit 1
    done
    echo "sweep.sh: when the arrays are done: jobs/scaling/report $out"
    exit 0
fi

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
failed=0
for p in "${plan[@]}"; do
    read -r -a a <<<"$p"
    r=${a[0]}
    dir=${a[1]}
    rm -rf "$dir"
    printf 'sweep.sh: %-28s %2d rank(s) ... ' "${dir##*/}" "$r"
    if timeout -k 10 "${TESSERA_SWEEP_TIMEOUT:-1800}" mpiexec.mpich -n "$r" "$tessera" train "${a[2]}" \
        run.dir="$dir" ckpt.resume=none "${a[@]:3}" >"$dir.log" 2>&1; then
        sed -n 's/^done: \(.*\);.*/\1/p' "$dir.log"
    else
        echo "failed (log: $dir.log)"
        failed=$((failed + 1))
    fi
done
echo "sweep.sh: done, $failed failed; next: jobs/scaling/report $out"
[ "$failed" -eq 0 ]
