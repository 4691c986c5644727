#!/bin/bash
# Sharded optimizer state (parallel.zero = 1, issue [9] acceptance 4): the
# same training, RANKS data-parallel ranks, AdamW, with parallel.zero = 0 and
# 1 side by side in one invocation, in alternated rounds. Prints per run the
# optimizer state per rank (perf.json's optimizer_state: allocated bytes, the
# largest over ranks), the peak resident memory of each rank (/usr/bin/time:
# rank 0, which also gathers the whole state to write the final checkpoint,
# and the largest of the others), samples/s and the optimizer phase (update
# plus, with zero = 1, the parameters' allgather), each as a ratio to zero = 0.
#   jobs/bench/zero_memory.sh [RANKS] [STEPS] [CHANNELS] [ROUNDS]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
ranks=${1:-4}
steps=${2:-6}
channels=${3:-16,32,64,128}
rounds=${4:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
cat >"$tmp/z.ini" <<INI
[model]
channels = $channels
classes = 3
norm = group
groups = 4
[data]
patch = 16
[train]
batch = 1
steps = $steps
optimizer = adamw
lr = 0.001
log_every = 1
[ckpt]
every = 0
every_minutes = 0
[eval]
final = false
INI
echo "load before: $(uptime)" >&2
for r in $(seq 1 "$rounds"); do
    for z in 0 1; do
        # %M: the process's peak resident set in KiB, one line per rank, tagged by the rank's PMI_RANK
        mpiexec.mpich -n "$ranks" sh -c 'exec /usr/bin/time -f "rss $PMI_RANK %M" -o "$0/rss-$1-$2-$PMI_RANK" "$3" train "$0/z.ini" \
            run.dir="$0/r$1-z$2" parallel.zero="$2"' "$tmp" "$r" "$z" "$tessera" >/dev/null
        echo "round $r zero=$z done" >&2
    done
done
echo "load after: $(uptime)" >&2
/usr/bin/python3 - "$tmp" "$ranks" "$rounds" "$channels" <<'PY'
import glob, json, sys
d, ranks, rounds, channels = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def run(r, z):
    p = json.load(open(f"{d}/r{r}-z{z}/perf.json"))
    rss = {}
    for f in glob.glob(f"{d}/rss-{r}-{z}-*"):
        tag, rank, kib = open(f).read().split()[-3:]
        rss[int(rank)] = int(kib) / 1024
    return dict(state=p['optimizer_state']['bytes_per_rank'] / 2**20, whole=p['optimizer_state']['bytes_whole'] / 2**20,
                rss0=rss[0], rss_rest=max(v for k, v in rss.items() if k) if len(rss) > 1 else rss[0],
                sps=p['samples_per_s'], opt=p['phases_s']['optimizer']['max'] / p['steps'] * 1e3)
print(f"{ranks} ranks (dp {ranks}), AdamW, channels {channels}, patch 16, batch 1, {rounds} alternated rounds")
print("| run | optimizer state per rank MiB (ratio) | peak RSS rank 0 MiB | peak RSS other ranks MiB (difference) | samples/s (ratio) | optimizer ms/step (ratio) |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for r in range(1, rounds + 1):
    a, b = run(r, 0), run(r, 1)
    for z, x in ((0, a), (1, b)):
        print(f"| round {r}, zero = {z} | {x['state']:.2f} ({x['state'] / a['state']:.3f}x) | {x['rss0']:.1f} | "
              f"{x['rss_rest']:.1f} ({x['rss_rest'] - a['rss_rest']:+.1f}) | {x['sps']:.2f} ({x['sps'] / a['sps']:.3f}x) | "
              f"{x['opt']:.2f} ({x['opt'] / a['opt']:.3f}x) |")
PY
