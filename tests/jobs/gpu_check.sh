#!/bin/sh
# jobs/gpu/check.sh where there is no GPU (this machine, CI): it must say
# why, write its JSON with status "skip" and exit 77, running nothing else.
# Where a GPU is visible this test skips: run jobs/gpu/check.sh itself there.
. "$TS_SRCDIR/tests/mpi/lib.sh"
d=$(mktemp -d "${TMPDIR:-/tmp}/tessera-gpucheck.XXXXXX")
trap 'rm -rf "$d"' EXIT
if ts_mpirun 1 "$TS_BUILDDIR/tessera" info 2>&1 | grep -q '^GPU 0:'; then
    echo "1..0 # SKIP a GPU is visible here: run jobs/gpu/check.sh itself"
    exit 0
fi
echo "1..5"
TESSERA="$TS_BUILDDIR/tessera" MPIEXEC="$MPIEXEC" BENCH=0 timeout 120 "$TS_SRCDIR/jobs/gpu/check.sh" "$d/out" >"$d/stdout" 2>&1
rc=$?
[ $rc -eq 77 ] && echo "ok 1 - exit status 77 (skip) without a GPU" || { echo "not ok 1 - exit status $rc, not 77"; cat "$d/stdout"; }
if grep -q '^CUDA: *not compiled' "$d/out/gpu_check.log"; then
    want='built without CUDA'
else
    want='no GPU here'
fi
grep -q "$want" "$d/stdout" && echo "ok 2 - it says why: $(grep -m1 "$want" "$d/stdout")" || { echo "not ok 2 - no '$want' in its output"; cat "$d/stdout"; }
python3 - "$d/out/gpu_check.json" <<'PY' && echo "ok 3 - gpu_check.json: status skip, one step (info)" || echo "not ok 3 - gpu_check.json"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["status"] == "skip", j
assert [s["name"] for s in j["steps"]] == ["info"] and j["steps"][0]["status"] == "skip", j
PY
if grep -q 'test_layers_cuda\|bench coll\|pytorch_gpu' "$d/out/gpu_check.log"; then
    echo "not ok 4 - it ran GPU steps without a GPU"
else
    echo "ok 4 - no GPU step ran"
fi
# the GPU layer test itself skips with its reason here
out=$("$TS_BUILDDIR/tests/nn/test_layers_cuda" 2>&1)
case "$out" in
"1..0 # SKIP "*) echo "ok 5 - test_layers_cuda skips: ${out#1..0 # SKIP }" ;;
*) echo "not ok 5 - test_layers_cuda without a GPU printed: $out" ;;
esac
