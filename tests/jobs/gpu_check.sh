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
echo "1..7"
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
# the GPU layer test itself skips with its reason here (GPUs hidden from it too: it shows it the
# caller's, TS_GPUS, which a machine with a GPU or the emulated build has)
out=$(TS_GPUS= "$TS_BUILDDIR/tests/nn/test_layers_cuda" 2>&1)
case "$out" in
"1..0 # SKIP "*) echo "ok 5 - test_layers_cuda skips: ${out#1..0 # SKIP }" ;;
*) echo "not ok 5 - test_layers_cuda without a GPU printed: $out" ;;
esac
# CHECK_STEPS: with a stand-in program that reports a GPU (its info only),
# the groups left out are recorded as skipped and nothing else runs
cat >"$d/fake" <<'FAKE'
#!/bin/sh
[ "$1" = info ] && { echo "CUDA:             compiled"; echo "GPU 0:            Stand-in GPU"; exit 0; }
echo "stand-in: $*"; exit 3
FAKE
chmod +x "$d/fake"
TESSERA="$d/fake" GPU_TESTS="$d" MPIEXEC="$MPIEXEC" CHECK_STEPS=none timeout 60 "$TS_SRCDIR/jobs/gpu/check.sh" "$d/o2" >"$d/stdout2" 2>&1
rc=$?
if [ $rc -eq 0 ] && python3 - "$d/o2/gpu_check.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
st = {s["name"]: s["status"] for s in j["steps"]}
assert st == {"info": "pass", "layers": "skip", "coll": "skip", "model": "skip", "bench": "skip", "profile": "skip"}, st
assert j["status"] == "pass" and j["gpu"] == "Stand-in GPU", j
PY
then echo "ok 6 - CHECK_STEPS=none: info passes, every group recorded as skipped, nothing else ran"
else echo "not ok 6 - CHECK_STEPS=none: exit $rc"; sed 's/^/# /' "$d/stdout2"; fi
# ... and a group asked for runs (the stand-in's bench step fails: the check says so)
TESSERA="$d/fake" GPU_TESTS="$d" MPIEXEC="$MPIEXEC" CHECK_STEPS=profile timeout 60 "$TS_SRCDIR/jobs/gpu/check.sh" "$d/o3" >"$d/stdout3" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "stand-in: bench step" "$d/o3/gpu_check.log" && python3 - "$d/o3/gpu_check.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
st = {s["name"]: s["status"] for s in j["steps"]}
assert st["profile"] == "fail" and st["layers"] == "skip" and st["bench"] == "skip" and j["status"] == "fail", st
PY
then echo "ok 7 - CHECK_STEPS=profile runs the profile alone (the stand-in fails it: exit 1, recorded)"
else echo "not ok 7 - CHECK_STEPS=profile: exit $rc"; sed 's/^/# /' "$d/stdout3"; fi
