#!/bin/sh
# Lose a rank at a random point, lose at most one step (issue [14];
# docs/testing.md, "Losing a node"): TS_EMERGENCY_TRIALS trials (default 4
# in make check; jobs/check.sh runs 50), each a layout (dp 2; dp 2 x sp 2;
# dp 2 x pp 2), a rank, a step and a point in it drawn at random: the
# forward pass, the backward pass, the gradient reduction, the optimizer
# update, or the checkpoint written after the step (TESSERA_FAULT
# kill:...:at=POINT). Every survivor must write its state and exit 76;
# the run resumed on the ranks left (the global batch kept) must start from
# a step no more than one before the kill (the step killed in the
# checkpoint: that step), and end as an uninterrupted run of the same
# layout: every logged loss and every tensor of step 8 (parameters,
# optimizer state) equal relative to its own scale. TS_EMERGENCY_SEED
# replays a draw (printed at the start), TS_EMERGENCY_ONLY=K runs its trial K
# alone, TS_KEEP=1 keeps the scratch directory.
. "$TS_SRCDIR/tests/train/lib_train.sh"
trials=${TS_EMERGENCY_TRIALS:-4}
seed=${TS_EMERGENCY_SEED:-$(date +%s)}
echo "# $trials trials, seed $seed (TS_EMERGENCY_SEED=$seed replays them)"
ts_tmpdir emrand
# the scratch directory (TS_KEEP=1: kept) and the ranks' shells left behind
trap 'pkill -f "$d/w.sh" 2>/dev/null; [ -n "${TS_KEEP:-}" ] && echo "# kept $d" || rm -rf "$d"' EXIT

. "$TS_SRCDIR/tests/train/lib_emergency.sh"

# layout NAME: ranks, the keys of the killed run, ranks and keys of the resumed run
layout() {
    case $1 in
    dp) L_NP=2 L_KEYS="" L_NP2=1 L_KEYS2="train.accum=2" ;;
    sp) L_NP=4 L_KEYS="parallel.sp=2" L_NP2=2 L_KEYS2="parallel.sp=2 train.accum=2" ;;
    pp) L_NP=4 L_KEYS="parallel.pp=2 parallel.microbatches=2" L_NP2=2 L_KEYS2="parallel.pp=2 parallel.microbatches=4" ;;
    esac
}
# the draw: TRIAL LAYOUT RANK STEP POINT per line (a checkpoint is written after steps 3 and 6)
awk -v seed="$seed" -v n="$trials" 'BEGIN {
    srand(seed); split("dp sp pp", L, " "); split("forward backward reduce update ckpt", P, " ")
    for (i = 1; i <= n; i++) {
        l = L[1 + int(rand() * 3)]; np = l == "dp" ? 2 : 4; p = P[1 + int(rand() * 5)]
        s = p == "ckpt" ? 3 * (1 + int(rand() * 2)) : 1 + int(rand() * 8)
        print i, l, int(rand() * np), s, p
    }
}' >"$d/draw"
refs=
while read -r i l r s p <&3; do # (fd 3: mpiexec reads stdin)
    [ -n "${TS_EMERGENCY_ONLY:-}" ] && [ "$i" != "$TS_EMERGENCY_ONLY" ] && continue
    layout "$l"
    case " $refs " in
    *" $l "*) ;;
    *)
        # shellcheck disable=SC2086
        ts_step "uninterrupted reference: $l ($L_NP ranks)" train_run "$L_NP" "ref-$l" $L_KEYS
        refs="$refs $l"
        ;;
    esac
    n=t$i
    # shellcheck disable=SC2086
    killed "$n" "$L_NP" "kill:rank=$r:step=$s:at=$p" $L_KEYS
    what="trial $i: $l, rank $r killed in $p of step $s"
    ts_check "$what: the $((L_NP - 1)) survivors write their state and exit 76" survivors "$n" "$L_NP" "$r"
    # shellcheck disable=SC2086
    ts_step "$what: resumed on $L_NP2 rank(s) ($L_KEYS2)" train_run "$L_NP2" "$n" $L_KEYS2
    from=$(printf '%s\n' "$ts_out" | sed -n 's/.*resumed from .*ckpt\/step-\([0-9]*\) at step .*/\1/p' | head -1)
    lost=$(printf '%s\n' "$ts_out" | grep -c "emergency state: rank $r lost at step")
    least=$((s - 1))
    [ "$p" = ckpt ] && least=$s
    [ "$least" -lt 1 ] && least=0
    echo "# $what: resumed from step ${from:-none} (at least $least)"
    if [ "$least" -eq 0 ]; then # killed in step 1: nothing to lose; a start from scratch is right too
        echo "# $what: nothing finished before the kill: no lower bound on the step resumed from"
    else
        ts_check "$what: resumed from the survivors' state of step >= $least, naming rank $r" \
            sh -c "[ '$lost' -ge 1 ] && [ -n '$from' ] && [ '${from:-0}' -ge $least ]"
    fi
    ts_step "$what: ends as the uninterrupted run" same_run "ref-$l" "$n" 1
done 3<"$d/draw"
ts_finish
