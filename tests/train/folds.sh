#!/bin/sh
# Cross-validation by subject (data.folds, data.fold, data.subject_delim;
# issue [11]): the held-out fold's samples are the validation set on every
# rank, bad combinations are refused on every rank before any work, and
# jobs/cv.sh trains the folds and reports the mean and spread of the final
# validation Dice.
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
TESSERA="$TS_BUILDDIR/tessera"
export OMP_NUM_THREADS=1
unset TESSERA_FAULT TESSERA_RANKS_PER_NODE
d=$(mktemp -d "${TMPDIR:-/tmp}/tessera-folds.XXXXXX")
trap 'rm -rf "$d"' EXIT

ts_step "synthetic dataset: 8 samples of 16^3, 3 classes" \
    ts_mpirun 2 "$TESSERA" synth --out "$d/syn.h5" --count 8 --size 16 --classes 3 --seed 3
cat >"$d/f.ini" <<'INI'
[model]
channels = 4,8
classes = 3
norm = group
groups = 2
[data]
patch = 16
[train]
batch = 1
steps = 2
lr = 0.05
log_every = 1
[eval]
final = true
INI
ts_step "fold 1 of 4 on 2 ranks: 6 training and 2 validation samples" sh -c "
    timeout -k 10 300 $MPIEXEC -n 2 '$TESSERA' train '$d/f.ini' data.path='$d/syn.h5' data.folds=4 data.fold=1 \
        run.dir='$d/f1' 2>&1 | tee '$d/f1.log' | tail -4
    grep -q 'data: 6 training and 2 validation samples' '$d/f1.log'"
ts_fails_on_all "data.folds with data.val_fraction refused on every rank" "choose one way to hold out samples" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/f.ini" data.path="$d/syn.h5" data.folds=4 data.val_fraction=0.25 run.dir="$d/bad1"
ts_fails_on_all "data.fold without data.folds refused on every rank" "needs data.folds" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/f.ini" data.path="$d/syn.h5" data.fold=2 run.dir="$d/bad2"
ts_fails_on_all "more folds than subjects refused on every rank" "only 8 subjects" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/f.ini" data.path="$d/syn.h5" data.folds=9 run.dir="$d/bad3"
ts_fails_on_all "data.fold beyond data.folds refused on every rank" "0 <= fold < folds" 2 \
    ts_mpirun 2 "$TESSERA" train "$d/f.ini" data.path="$d/syn.h5" data.folds=3 data.fold=3 run.dir="$d/bad4"
if [ -n "$TS_PY" ]; then
    ts_step "jobs/cv.sh trains 2 folds and reports mean and spread" sh -c "
        TESSERA='$TESSERA' bash '$TS_SRCDIR/jobs/cv.sh' '$d/f.ini' 2 '$d/cv' data.path='$d/syn.h5' >'$d/cv.log' 2>&1
        rc=\$?; cat '$d/cv.log'; [ \$rc -eq 0 ] && grep -q 'foreground mean Dice over 2 folds' '$d/cv.log' &&
        grep -q '^| 1 | 2 |' '$d/cv.log'"
else
    ts_skip "jobs/cv.sh" "no python3 with h5py"
fi
ts_finish
