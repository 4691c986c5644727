#!/bin/bash
# The test command of the README: on Debian 12 as root, installs the Debian
# packages tessera and its tests need, bootstraps, configures, builds and
# runs `make check` in build-check/, then prints "N passed, N failed".
#   bash jobs/check.sh [--distcheck]     (--distcheck also runs make distcheck)
set -u -o pipefail
cd "$(dirname "$0")/.."
top=$(pwd)

packages=(
    build-essential autoconf automake libtool pkg-config
    mpich libmpich-dev libhdf5-mpich-dev hdf5-tools libopenblas-dev
    libnifti2-dev libniftiio-dev libinih-dev libcjson-dev zlib1g-dev
    libpapi-dev papi-tools mricron-data
    python3 python3-numpy python3-h5py python3-nibabel
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
make check 2>&1 | grep -E '^(PASS|FAIL|ERROR|XPASS|SKIP):' | grep -vE '^PASS:' | head -200
status=${PIPESTATUS[0]}
log=test-suite.log
pass=$(sed -n 's/^# PASS: *//p' "$log" | head -1)
fail=$(sed -n 's/^# FAIL: *//p' "$log" | head -1)
err=$(sed -n 's/^# ERROR: *//p' "$log" | head -1)
xpass=$(sed -n 's/^# XPASS: *//p' "$log" | head -1)
skip=$(sed -n 's/^# SKIP: *//p' "$log" | head -1)
failed=$(( ${fail:-0} + ${err:-0} + ${xpass:-0} ))
if [ "${1:-}" = "--distcheck" ]; then
    echo "== make distcheck"
    make distcheck >distcheck.log 2>&1 && echo "distcheck passed" || { tail -30 distcheck.log; failed=$((failed + 1)); }
fi
echo "== make check took $(( $(date +%s) - start )) s; ${skip:-0} skipped; log: $top/build-check/$log"
echo "${pass:-0} passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$status" -eq 0 ]
