# Sourced by the MPI test wrappers: ts_mpirun NP PROGRAM ARGS... runs under
# a timeout (a hang is a failure) and turns a timeout into a TAP bail-out.
# TS_TEST_TIMEOUT (seconds, default 300) changes the limit.
: "${MPIEXEC:=mpiexec.mpich}"
# GPUs: hidden from every test (CUDA_VISIBLE_DEVICES empty; make check does
# the same, Makefile.am), so that the CPU's tests run the CPU engine where a
# GPU is present; TS_GPUS keeps the caller's value and a GPU test calls
# ts_use_gpus first to see the GPUs again.
if [ -z "${TS_GPUS+x}" ]; then TS_GPUS=${CUDA_VISIBLE_DEVICES-unset}; fi
CUDA_VISIBLE_DEVICES=
export TS_GPUS CUDA_VISIBLE_DEVICES
ts_use_gpus() {
    if [ "$TS_GPUS" = unset ]; then unset CUDA_VISIBLE_DEVICES; else CUDA_VISIBLE_DEVICES=$TS_GPUS; export CUDA_VISIBLE_DEVICES; fi
}
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
