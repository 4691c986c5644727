#!/bin/bash
# The test command of the README: on Debian 12 as root, installs the Debian
# packages tessera and its tests need, bootstraps, configures, builds and
# runs `make check` in build-check/, then the GPU tests in a build against
# the CPU's CUDA emulator (configure --with-cuda=emu), then the whole gradient-equivalence
# matrix (tests/train/grad_equiv.sh, TS_GRAD_MATRIX=full), then the job scripts against a real
# one-node Slurm (jobs/slurm/selftest.sh; skipped when not root), then a
# 2-node cluster of network namespaces (jobs/cluster/selftest.sh; root), then
# prints "N passed, N failed" over all of them.
#   bash jobs/check.sh [--distcheck]     (--distcheck also runs make distcheck)
set -u -o pipefail
cd "$(dirname "$0")/.."
top=$(pwd)

packages=(
    build-essential autoconf automake libtool pkg-config
    mpich libmpich-dev libhdf5-mpich-dev hdf5-tools libopenblas-dev
    libnifti2-dev libniftiio-dev libinih-dev libcjson-dev zlib1g-dev
    libpapi-dev papi-tools mricron-data clang libclang-rt-dev
    python3 python3-numpy python3-scipy python3-h5py python3-nibabel python3-matplotlib
    munge slurmctld slurmd slurm-client iproute2 util-linux bc procps
)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing: ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then
        echo "jobs/check.sh: these Debian packages are missing and installing them needs root: ${missing[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}" || exit 1
fi

jobs=$(nproc 2>/dev/null || echo 2)
echo "== bootstrap and configure"
./bootstrap >/dev/null || exit 1
mkdir -p build-check && cd build-check || exit 1
../configure -q MPICC=mpicc.mpich MPIEXEC=mpiexec.mpich || exit 1
echo "== build"
make -j"$jobs" >/dev/null || { make 2>&1 | tail -30; exit 1; }
echo "== make check (MPI tests run one at a time, each under a timeout)"
start=$(date +%s)
rm -f test-suite.log
make check 2>&1 | tee make-check.out | grep -E '^(PASS|FAIL|ERROR|XPASS|SKIP):' | grep -vE '^PASS:' | head -200
status=${PIPESTATUS[0]}
log=test-suite.log
if [ ! -f "$log" ]; then
    # make check ended before running the tests (a test program that does not build): show why
    echo "not ok: make check exited $status without running the tests; the end of its output:"
    grep -E 'error|Error|undefined reference' make-check.out | head -20
    tail -15 make-check.out
fi
pass=$(sed -n 's/^# PASS: *//p' "$log" | head -1)
fail=$(sed -n 's/^# FAIL: *//p' "$log" | head -1)
err=$(sed -n 's/^# ERROR: *//p' "$log" | head -1)
xpass=$(sed -n 's/^# XPASS: *//p' "$log" | head -1)
skip=$(sed -n 's/^# SKIP: *//p' "$log" | head -1)
failed=$(( ${fail:-0} + ${err:-0} + ${xpass:-0} ))
[ "$status" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
echo "== make check took $(( $(date +%s) - start )) s; ${skip:-0} skipped; log: $top/build-check/$log"
echo "== the release tarball holds every tracked file (make distdir against git ls-files)"
if git -C "$top" rev-parse --git-dir >/dev/null 2>&1; then
    rm -rf dist-check && make distdir distdir=dist-check >/dev/null 2>&1
    missing_files=$(git -C "$top" ls-files | grep -v '^\.gitignore$' | while read -r f; do
        [ -e "dist-check/$f" ] || echo "$f"; done)
    rm -rf dist-check
    if [ -z "$missing_files" ]; then
        echo "ok: every tracked file is in the tarball"
        pass=$(( ${pass:-0} + 1 ))
    else
        echo "not ok: tracked files missing from the tarball (add them to EXTRA_DIST):"
        printf '  %s\n' $missing_files | head -20
        failed=$(( failed + 1 ))
    fi
else
    echo "== skipped: not a git checkout"
fi
if grep -q 'cuda=yes' tsbuild.h 2>/dev/null; then
    # CI machines may lack the CUDA toolkit: the build without it must compile too, tests included
    echo "== the build without CUDA compiles, test programs included (configure --without-cuda; make check TESTS=)"
    nstart=$(date +%s)
    rm -rf build-nocuda && mkdir build-nocuda
    if (cd build-nocuda && "$top/configure" -q --without-cuda MPICC=mpicc.mpich MPIEXEC=mpiexec.mpich \
        && make -j"$jobs" check TESTS=) >nocuda-build.log 2>&1; then
        echo "ok: the build without CUDA compiles ($(( $(date +%s) - nstart )) s)"
        pass=$(( ${pass:-0} + 1 ))
        rm -rf build-nocuda
    else
        echo "not ok: the build without CUDA fails; log: $top/build-check/nocuda-build.log"
        grep -E 'error|undefined reference' nocuda-build.log | head -20
        failed=$(( failed + 1 ))
    fi
fi
# the GPU engine with the CPU's CUDA emulator in the place of CUDA, cuDNN and NCCL: the GPU tests run without a GPU
echo "== the GPU engine under the CPU's CUDA emulator (configure --with-cuda=emu; docs/testing.md)"
estart=$(date +%s)
emu_tests="tests/nn/test_layers_cuda tests/coll/device_np1.sh tests/coll/device_np2.sh tests/coll/device_fake1_np2.sh \
tests/coll/device_cli_np2.sh tests/train/engine.sh tests/train/engine_gpu.sh tests/train/gpu_state.sh tests/train/gpu_faults.sh tests/train/infer.sh tests/model/golden_gpu.sh"
rm -rf build-emu && mkdir build-emu
if (cd build-emu && "$top/configure" -q --with-cuda=emu MPICC=mpicc.mpich MPIEXEC=mpiexec.mpich \
    && make -j"$jobs" && make -j"$jobs" check TESTS=) >emu-build.log 2>&1; then
    # one device, then two (NCCL between two emulated GPUs), each run's counts from its own log
    for devs in 1 2; do
        if [ "$devs" = 1 ]; then t=$emu_tests; else t="tests/coll/device_np2.sh tests/coll/device_fake1_np2.sh tests/train/gpu_state.sh"; fi
        (cd build-emu && TSEMU_DEVICES=$devs make check TESTS="$t" TEST_SUITE_LOG=emu-$devs.log) >emu-check-$devs.out 2>&1
        est=$?
        grep -E '^(FAIL|ERROR|XPASS|SKIP):' emu-check-$devs.out | head -40
        ep=$(sed -n 's/^# PASS: *//p' build-emu/emu-$devs.log | head -1)
        ef1=$(sed -n 's/^# FAIL: *//p' build-emu/emu-$devs.log 2>/dev/null | head -1)
        ef2=$(sed -n 's/^# ERROR: *//p' build-emu/emu-$devs.log 2>/dev/null | head -1)
        ef=$(( ${ef1:-0} + ${ef2:-0} ))
        [ "$est" -ne 0 ] && [ "$ef" -eq 0 ] && ef=1
        echo "== emulated GPU engine, $devs device(s): ${ep:-0} passed, $ef failed; log: $top/build-check/build-emu/emu-$devs.log"
        pass=$(( ${pass:-0} + ${ep:-0} ))
        failed=$(( failed + ef ))
    done
    echo "== the emulated GPU engine took $(( $(date +%s) - estart )) s"
else
    echo "not ok: the build --with-cuda=emu fails; log: $top/build-check/emu-build.log"
    grep -E 'error|undefined reference' emu-build.log | head -20
    failed=$(( failed + 1 ))
fi
echo "== fuzz: each fuzz target for 60 s (tests/fuzz/run.sh, libFuzzer + ASan + UBSan; docs/testing.md)"
fstart=$(date +%s)
make -j"$jobs" fuzz >fuzz-build.log 2>&1
# a fixed seed: the same inputs on every run (tests/fuzz/run.sh), so a finding is the code's, not the draw's
FUZZ_SEED=1 bash "$top/tests/fuzz/run.sh" 60 >fuzz.log 2>&1
fstatus=$?
cat fuzz.log
if [ "$fstatus" -eq 77 ]; then
    skip=$(( ${skip:-0} + 1 ))
    echo "== fuzz: skipped (the targets cannot be built, see above)"
else
    fpass=$(grep -c '^fuzz_.*: no finding$' fuzz.log)
    ffail=$(grep -c '^fuzz_.*FINDING' fuzz.log)
    [ "$fstatus" -ne 0 ] && [ "$ffail" -eq 0 ] && ffail=1
    pass=$(( ${pass:-0} + fpass ))
    failed=$(( failed + ffail ))
    echo "== fuzz: $fpass passed, $ffail failed in $(( $(date +%s) - fstart )) s; findings in $top/build-check/fuzz-build/findings/"
fi
# tap_step NAME LOG SECONDS CMD...: a TAP script under a timeout, its failures and skips shown,
# its counts added (exit 77: skipped as a whole, with the reason in its log)
tap_step() {
    local name=$1 log=$2 limit=$3 start st p f
    shift 3
    start=$(date +%s)
    timeout -k 30 "$limit" "$@" >"$log" 2>&1
    st=$?
    # each failure with the diagnostic lines the test wrote just before it (CI shows only this output)
    awk '/^# /{ d[n++ % 40] = $0; next } /^not ok/{ for (i = (n > 40 ? n - 40 : 0); i < n; i++) print d[i % 40]; print; n = 0; next }
         /^ok [0-9]+ - .*# SKIP|^1\.\.0/{ print } /^ok /{ n = 0 }' "$log" | head -200
    p=$(grep -c '^ok ' "$log")
    f=$(grep -c '^not ok ' "$log")
    if [ "$st" -ne 0 ] && [ "$st" -ne 77 ] && [ "$f" -eq 0 ]; then f=1; tail -20 "$log"; fi
    [ "$st" -eq 77 ] && skip=$(( ${skip:-0} + 1 ))
    echo "== $name: $p passed, $f failed in $(( $(date +%s) - start )) s; log: $(pwd)/$log"
    pass=$(( ${pass:-0} + p ))
    failed=$(( failed + f ))
}
echo "== gradient equivalence, the whole matrix (tests/train/grad_equiv.sh with TS_GRAD_MATRIX=full; make check runs a subset)"
tap_step "gradient matrix" grad-matrix.log 2400 env TS_GRAD_MATRIX=full MPIEXEC=mpiexec.mpich \
    TS_BUILDDIR="$top/build-check" TS_SRCDIR="$top" sh "$top/tests/train/grad_equiv.sh"
echo "== a lost rank at 50 random points (tests/train/emergency_random.sh with TS_EMERGENCY_TRIALS=50; make check runs 4)"
tap_step "random kill points" emergency-random.log 2400 env TS_EMERGENCY_TRIALS=50 MPIEXEC=mpiexec.mpich \
    TS_BUILDDIR="$top/build-check" TS_SRCDIR="$top" sh "$top/tests/train/emergency_random.sh"
echo "== Slurm: the job scripts on a one-node Slurm started for the test (jobs/slurm/selftest.sh)"
tap_step "Slurm selftest" slurm-selftest.log 1200 bash "$top/jobs/slurm/selftest.sh" "$top/build-check/tessera"
echo "== a real network: 2 nodes of network namespaces (jobs/cluster/selftest.sh; --full for the longer target)"
tap_step "cluster selftest" cluster-selftest.log 1200 bash "$top/jobs/cluster/selftest.sh" "$top/build-check"
if [ "${1:-}" = "--distcheck" ]; then
    echo "== make distcheck"
    make distcheck >distcheck.log 2>&1 && echo "distcheck passed" || { tail -30 distcheck.log; failed=$((failed + 1)); }
fi
echo "${pass:-0} passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$status" -eq 0 ]
