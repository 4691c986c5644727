#!/bin/bash
# Local SGD against synchronous data parallelism (issue [9] acceptance 5):
# the same synthetic segmentation task (tessera synth phantoms), RANKS
# replicas, STEPS steps, side by side in one invocation: synchronous,
# parallel.local_steps = H (global), and the node variant (gradients over a
# node's replicas every step, parameters over all every H; nodes of 2 ranks
# faked with TESSERA_RANKS_PER_NODE). Prints the final loss (mean of the
# last tenth of the steps) relative to synchronous, and the reductions that
# crossed replicas (perf.json's dp_reductions).
#   jobs/bench/local_sgd.sh [STEPS] [RANKS] [H]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
. "$here/jobs/bench/synthetic_task.sh"
steps=${1:-300}
ranks=${2:-4}
h=${3:-4}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
synthetic_task "$tmp" "$steps"
run() { # run NAME ARGS...
    local name=$1
    shift
    mpiexec.mpich -n "$ranks" "$tessera" train "$tmp/task.ini" data.path="$tmp/syn.h5" run.dir="$tmp/$name" "$@" >/dev/null
    echo "$name done" >&2
}
run sync
run local parallel.local_steps="$h"
TESSERA_RANKS_PER_NODE=2 run node parallel.local_steps="$h" parallel.local_sgd=node
/usr/bin/python3 - "$tmp" "$steps" "$ranks" "$h" <<'PY'
import json, sys
d, steps, ranks, h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def final(r):
    l = [json.loads(x)['loss'] for x in open(f"{d}/{r}/metrics.jsonl")]
    k = max(1, len(l) // 10)
    return sum(l[-k:]) / k, l[0]
base = final('sync')[0]
print(f"{ranks} replicas x batch 2, {steps} steps, H = {h}; final loss = mean of the last {max(1, steps // 10)} steps")
print("| run | first loss | final loss | vs synchronous | gradient reductions across replicas | parameter averages | samples/s |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for r, what in (('sync', 'synchronous'), ('local', f'local SGD, H = {h}'), ('node', f'local SGD node variant, H = {h}, 2 ranks per node')):
    p = json.load(open(f"{d}/{r}/perf.json"))
    f, first = final(r)
    red = p['dp_reductions']
    print(f"| {what} | {first:.4f} | {f:.4f} | {f / base:.3f} | {red['gradient']} | {red['parameter_averages']} | {p['samples_per_s']:.1f} |")
PY
