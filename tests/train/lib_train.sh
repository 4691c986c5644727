# Shared by the equivalence tests of the parallel layouts
# (tests/train/spatial.sh, tests/parallel/spatial_variants.sh,
# tests/train/pipeline_variants.sh); sourced after tests/io/lib_io.sh, with
# $d the test's directory (holding syn.h5), $ini its config and $TESSERA
# the program.

# run NP NAME ARGS...: trains $ini on $d/syn.h5 on NP ranks into $d/NAME
run() {
    _np=$1 _name=$2
    shift 2
    ts_step "$_name: $_np rank(s) $*" ts_mpirun "$_np" "$TESSERA" train "$ini" data.path="$d/syn.h5" \
        run.dir="$d/$_name" "$@"
}

# same REF RUN INIT: RUN's losses at every one of 3 steps within 1e-5 and
# its weights within 1e-4 of REF's, trained from $d/init-INIT.h5 (and the
# weights moved: tests/train/compare_runs.py)
same() {
    if [ -n "$TS_PY" ]; then
        ts_step "$2 = $1: losses at every step within 1e-5, weights within 1e-4 (and they moved)" \
            "$TS_PY" "$TS_SRCDIR/tests/train/compare_runs.py" "$d/$1" "$d/$2" "$d/init-$3.h5" 3
    else
        ts_skip "$2 = $1" "no python3 with h5py"
    fi
}
