#!/bin/sh
# Golden test: `tessera model run` on weights and inputs written by PyTorch
# (tests/golden, see make_golden.py) must reproduce PyTorch's logits, loss,
# gradients and the parameters after one optimizer step (SGD and AdamW;
# batch, group and instance norm; eval mode). Goes through the files only.
# tests/model/golden_gpu.sh sources it with golden_args set (the GPU engine).
. "$TS_SRCDIR/tests/mpi/lib.sh"
[ -n "${golden_args:-}" ] && ts_use_gpus # (lib.sh hides them again)
G="$TS_SRCDIR/tests/golden"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
args=""
while read -r name input mode; do
    case "$name" in ''|'#'*) continue ;; esac
    flag=--train-step
    [ "$mode" = eval ] && flag=--eval
    if ! ts_mpirun 1 "$TS_BUILDDIR/tessera" model run "$G/$name.ini" weights="$G/$name-weights.h5" \
        input="$G/$input" output="$T/$name.h5" $flag ${golden_args:-} > "$T/$name.log" 2>&1 < /dev/null; then
        echo "# $name: tessera model run failed:"
        sed 's/^/# /' "$T/$name.log"
    fi
    args="$args $name $T/$name.h5 $G/$name-expect.h5"
done < "$G/cases.txt"
"$TS_BUILDDIR/tests/model/golden_compare" $args
