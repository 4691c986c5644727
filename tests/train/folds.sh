#!/bin/sh
# Cross-validation by subject (data.folds, data.fold, data.subject_delim;
# issue [11]): the held-out fold's samples are the validation set on every
# rank, bad combinations are refused on every rank before any work, and
# jobs/cv.sh trains the folds and reports the mean and spread of the final
# validation Dice.
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_tmpdir folds
ts_synth 8 16 3
ts_ini f.ini model.channels=4,8 train.batch=1 train.steps=2 -train.momentum -train.loss -train.deterministic \
    eval.final=true
ts_step "fold 1 of 4 on 2 ranks: 6 training and 2 validation samples" sh -c "
    timeout -k 10 300 $MPIEXEC -n 2 '$TESSERA' train '$d/f.ini' data.path='$d/syn.h5' data.folds=4 data.fold=1 \
        run.dir='$d/f1' 2>&1 | tee '$d/f1.log' | tail -4
    grep -q 'data: 6 training and 2 validation samples' '$d/f1.log'"
ts_fails_on_all "data.folds with data.val_fraction refused on every rank" "choose one way to hold out samples" 2 \
    train_run 2 bad1 data.folds=4 data.val_fraction=0.25
ts_fails_on_all "data.fold without data.folds refused on every rank" "needs data.folds" 2 \
    train_run 2 bad2 data.fold=2
ts_fails_on_all "more folds than subjects refused on every rank" "only 8 subjects" 2 \
    train_run 2 bad3 data.folds=9
ts_fails_on_all "data.fold beyond data.folds refused on every rank" "0 <= fold < folds" 2 \
    train_run 2 bad4 data.folds=3 data.fold=3
if [ -n "$TS_PY" ]; then
    ts_step "jobs/cv.sh trains 2 folds and reports mean and spread" sh -c "
        TESSERA='$TESSERA' bash '$TS_SRCDIR/jobs/cv.sh' '$d/f.ini' 2 '$d/cv' data.path='$d/syn.h5' >'$d/cv.log' 2>&1
        rc=\$?; cat '$d/cv.log'; [ \$rc -eq 0 ] && grep -q 'foreground mean Dice over 2 folds' '$d/cv.log' &&
        grep -q '^| 1 | 2 |' '$d/cv.log'"
else
    ts_skip "jobs/cv.sh" "no python3 with h5py"
fi
ts_finish
