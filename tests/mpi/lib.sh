# Sourced by the MPI test wrappers: ts_mpirun NP PROGRAM ARGS... runs under
# a timeout (a hang is a failure) and turns a timeout into a TAP bail-out.
# TS_TEST_TIMEOUT (seconds, default 300) changes the limit.
: "${MPIEXEC:=mpiexec.mpich}"
: "${TS_BUILDDIR:=.}"
: "${TS_SRCDIR:=.}"
ts_mpirun() {
    np=$1
    shift
    timeout -k 10 "${TS_TEST_TIMEOUT:-300}" "$MPIEXEC" -n "$np" "$@"
    rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "Bail out! timed out after ${TS_TEST_TIMEOUT:-300} s: $MPIEXEC -n $np $*"
    fi
    return $rc
}
