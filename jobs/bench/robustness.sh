#!/bin/bash
# Robustness of a trained model to image changes that keep the anatomy
# (issue [11] acceptance 1): trains the demo's configuration on Colin27 +
# AAL (as jobs/demo.sh does; skipped when RUN already holds a checkpoint),
# writes the variants of tests/train/robustness_variants.py (intensity
# scale and offset, gamma, contrast, noise, blur, lower resolution, the
# background zeroed outside the brain mask grown by 5 mm; and, reported
# apart, BET's skull-stripped scan, which cuts into the cortex) and
# predicts each against the same atlas labels, printing per-variant
# foreground mean Dice and its difference from the original's.
#   jobs/bench/robustness.sh [RUN] [section.key=value ...]   (RUN default runs/robustness)
# Environment: TESSERA (default build/tessera), NP ranks (default 2),
# INFER_OPTS the infer options (default jobs/demo.sh's: mirror=xyz
# keep_largest=all; INFER_OPTS= for the raw prediction).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
run=${1:-$here/runs/robustness}
shift $(( $# >= 1 ? 1 : 0 )) || true
templates=/usr/share/mricron/templates
mpirun=(mpiexec.mpich -n "${NP:-2}")
infer_opts=${INFER_OPTS-mirror=xyz keep_largest=all}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$run"
if ! ls "$run"/ckpt/step-* >/dev/null 2>&1; then
    start=$(date +%s)
    "${mpirun[@]}" "$tessera" convert nifti --image "$templates/ch2.nii.gz" --label "$templates/aal.nii.gz" \
        --label-map "$here/configs/labelmaps/aal-3class.txt" --downsample 2 --out "$run/ch2-aal3.h5" >/dev/null
    "${mpirun[@]}" "$tessera" train "$here/configs/demo.ini" data.path="$run/ch2-aal3.h5" run.dir="$run" "$@" |
        tail -2
    echo "trained in $(( $(date +%s) - start )) s"
fi
/usr/bin/python3 "$here/tests/train/robustness_variants.py" "$templates/ch2.nii.gz" "$run/variants" \
    --brain "$templates/ch2bet.nii.gz" >/dev/null
echo "| variant | foreground mean Dice | Dice per class (background, cerebrum, cerebellum) | vs original |"
echo "| --- | ---: | --- | ---: |"
orig=
for v in original scale_offset gamma contrast noise blur lowres brain_only brain_only_bet; do
    out=$("${mpirun[@]}" "$tessera" infer "$here/configs/demo.ini" checkpoint="$run" input="$run/variants/$v.nii.gz" \
        downsample=2 output="$run/variants/$v-pred.nii.gz" label="$templates/aal.nii.gz" \
        label_map="$here/configs/labelmaps/aal-3class.txt" $infer_opts "$@")
    fg=$(printf '%s\n' "$out" | sed -n 's/^foreground mean Dice: //p')
    per=$(printf '%s\n' "$out" | sed -n 's/^Dice per class: *//p')
    [ -n "$orig" ] || orig=$fg
    d=$(awk -v a="$fg" -v b="$orig" 'BEGIN { printf "%+.4f", a - b }')
    echo "| $v | $fg | $per | $d |"
    # the worst change over the variants that keep the anatomy (not brain_only_bet)
    [ "$v" = brain_only_bet ] || worst=$(awk -v d="$d" -v w="${worst:-0}" 'BEGIN { print (d < w ? d : w) + 0 }')
done
awk -v o="$orig" -v w="$worst" 'BEGIN { printf "original %.4f (>= 0.85: %s); worst change over the variants that keep the anatomy %+.4f (within 0.1: %s)\n", o, (o >= 0.85 ? "yes" : "no"), w, (w >= -0.1 ? "yes" : "no") }'
