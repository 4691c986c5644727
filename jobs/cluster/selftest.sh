#!/bin/bash
# tessera on a real network: jobs/cluster's namespaces (docs/scaling.md, "A
# real network on one machine"), as root:
#   bash jobs/cluster/selftest.sh [--full] [BUILDDIR]       (BUILDDIR: default build)
# The default is the 2-node subset that jobs/check.sh runs (about 5 minutes):
#   1. 2 nodes x 2 ranks: `tessera info` sees 2 nodes of 2 ranks from MPI
#      (no TESSERA_RANKS_PER_NODE);
#   2. the collectives' correctness matrix on them (every allreduce algorithm,
#      dtype, op, in and out of place up to 64 Ki elements; reduce-scatter,
#      allgather, broadcast; the topology);
#   3. one grid: dp 2 x pp 2 x sp 2 on 2 nodes x 4 ranks, one training
#      step's gradients equal one rank's (tests/train/grad_compare.py);
#   4. a lost node: n2 killed in the middle of training; every survivor ends
#      within fault.timeout + 10 s naming the lost node, and training resumes
#      on the node left from the last checkpoint;
#   5. Slurm on the 2 nodes: `sbatch -N 2 jobs/slurm/train.sbatch` completes;
#   6. `jobs/cluster/down` leaves no namespace, link, mount or process.
# --full adds (the longer target, docs/scaling.md): the full-size matrix on
# 2 x 2, 4 x 1 and 3 nodes of 1/2/1 ranks; the hierarchical allreduce against
# the ring at 64 MiB over a 1 Gbit/s link, and `bench coll --tune` choosing
# the winner; dp across nodes, sp inside them, pp across them, each equal to
# one rank; a checkpoint of 2 nodes resumed on 1; parallel HDF5 written and
# read from ranks on different nodes, bit-identical to one node; a node's
# link taken down; the Slurm time-limit signal, requeue and resume on 2 nodes.
# Prints TAP; exit 0 when all pass, 77 when it cannot run here (not root).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
full=0
[ "${1:-}" = --full ] && { full=1; shift; }
build=${1:-$here/build}
case $build in /*) ;; *) build=$(pwd)/$build ;; esac
tessera=$build/tessera
C=$here/jobs/cluster
n=0
bad=0
T_START=$(date +%s)
ok() { n=$((n + 1)); if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; bad=1; fi; echo "# ($(( $(date +%s) - T_START )) s)"; }
diag() { sed 's/^/# /'; }
skip_all() { echo "1..0 # SKIP $1"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip_all "needs root (network namespaces, veth links, a bridge)"
for t in ip nsenter unshare tc; do command -v $t >/dev/null || skip_all "$t is missing (iproute2, util-linux)"; done
[ -x "$tessera" ] || { echo "Bail out! no tessera binary at $tessera"; exit 1; }
# can this machine (or container) make namespaces and shape links?
probe=tscl-probe-$$
ip netns add "$probe" 2>/dev/null || skip_all "cannot create network namespaces here (ip netns add: no CAP_NET_ADMIN?)"
touch "/tmp/$probe.uts"
if ! unshare --uts="/tmp/$probe.uts" true 2>/dev/null; then
    ip netns del "$probe"; rm -f "/tmp/$probe.uts"
    skip_all "cannot create UTS namespaces here (unshare --uts: no CAP_SYS_ADMIN?)"
fi
umount "/tmp/$probe.uts" 2>/dev/null; rm -f "/tmp/$probe.uts"
link="--link 1gbit"
if ! ip netns exec "$probe" tc qdisc add dev lo root tbf rate 1gbit burst 128k latency 100ms 2>/dev/null; then
    link=
    echo "# tc tbf is not available here: the links are not shaped"
fi
ip netns del "$probe"
py=/usr/bin/python3
"$py" -c 'import h5py, numpy' 2>/dev/null || py=

d=$(mktemp -d /tmp/tessera-cluster-test.XXXXXX)
chmod 755 "$d"
export TESSERA_CLUSTER_DIR=$d/cluster TESSERA_CLUSTER_NS=tsct$$- TESSERA_FINALIZE_GRACE=10 TESSERA_EXIT_GRACE=20 OMP_NUM_THREADS=1
unset TESSERA_RANKS_PER_NODE
cleanup() {
    "$C/slurm" stop >/dev/null 2>&1
    "$C/down" >/dev/null 2>&1
    rm -rf "$d"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
cd "$d" || exit 1

# up SHAPE...: a fresh cluster (down first)
up() {
    "$C/down" >/dev/null 2>&1
    "$C/up" "$@" 2>&1 | diag
    return "${PIPESTATUS[0]}"
}
# cl NP ARGS...: the program on NP ranks of the cluster, under a timeout
cl() {
    local np=$1
    shift
    timeout -k 10 600 "$C/mpiexec" -n "$np" "$@"
}

cat >"$d/g.ini" <<'INI'
[model]
channels = 4,8,16
classes = 3
sync_bn = true
[data]
patch = 16
[train]
batch = 2
steps = 1
lr = 0.05
deterministic = true
warmup_steps = 0
[eval]
final = false
INI
"$tessera" synth --out "$d/syn.h5" --count 4 --size 20 --classes 3 --seed 5 >/dev/null 2>&1 ||
    { echo "Bail out! tessera synth failed"; exit 1; }

# ---- 1. two nodes of two ranks, seen by MPI
up 2 --ranks-per-node 2 $link
ok $? "jobs/cluster/up 2 --ranks-per-node 2 $link"
out=$(cl 4 "$tessera" info 2>&1)
printf '%s\n' "$out" | grep -E '^(ranks|nodes|ranks per node):' | diag
ok "$(printf '%s\n' "$out" | grep -q '^nodes: *2$' && printf '%s\n' "$out" | grep -q '^ranks per node: *2$'; echo $?)" \
    "tessera info on 4 ranks: 2 nodes of 2 ranks, from MPI (TESSERA_RANKS_PER_NODE unset)"

# ---- 2. the collectives' correctness matrix (the nodes from MPI itself)
coll_matrix() { # SHAPE-NAME NP [MAXCOUNT]
    local name=$1 np=$2 max=${3:-} t out rc
    for t in test_allreduce test_collectives test_coll_misc; do
        if [ $t = test_allreduce ]; then out=$(cl "$np" "$build/tests/coll/$t" all $max 2>&1); else out=$(cl "$np" "$build/tests/coll/$t" 2>&1); fi
        rc=$?
        printf '%s\n' "$out" | grep -E '^(not ok|# [0-9]+ ranks)' | head -20 | diag
        [ $rc -ne 0 ] && { echo "exit status $rc"; printf '%s\n' "$out" | grep -v '^ok' | tail -8; } | diag
        ok "$([ $rc -eq 0 ] && ! printf '%s\n' "$out" | grep -q '^not ok' && printf '%s\n' "$out" | grep -q '^1\.\.[1-9]'; echo $?)" \
            "$name: $t ($(printf '%s\n' "$out" | grep -c '^ok') checks${max:+, counts up to $max})"
    done
}
coll_matrix "2 nodes x 2 ranks" 4 $([ $full = 0 ] && echo 65539)
if [ $full = 1 ]; then
    # the hierarchical allreduce against the flat ones where the link is the bottleneck (one run)
    out=$(cl 4 "$tessera" bench coll --algo ring,hierarchical,rabenseifner,mpi --min-bytes 64M --max-bytes 64M --repeat 3 \
        --time-ms 1 --check --json "$d/coll64.json" 2>&1)
    printf '%s\n' "$out" | tail -6 | diag
    ok "$("${py:-python3}" - "$d/coll64.json" <<'PY'
import json, sys
r = {x['algo']: x for x in json.load(open(sys.argv[1])) if x['bytes'] == 64 << 20}
h, g = r['hierarchical']['time_us'], r['ring']['time_us']
print(int(not (h < g and all(x['wrong'] == 0 for x in r.values()))))
PY
)" "64 MiB allreduce on 2 x 2 ranks${link:+ over a 1 Gbit/s link}: hierarchical faster than ring, nothing wrong (one run)"
    up 4 --ranks-per-node 1 $link
    coll_matrix "4 nodes x 1 rank" 4
    up 3 --ranks-per-node 1,2,1 $link
    coll_matrix "3 nodes of 1/2/1 ranks" 4
fi

# ---- 3. dp 2 x pp 2 x sp 2 on 2 nodes x 4 ranks against one rank
grad_ref() { # KEY ARGS...: weights and the one-rank reference (outside the cluster: one machine)
    local key=$1
    shift
    "$tessera" model init "$d/g.ini" "$@" --out "$d/init-$key.h5" --seed 3 >/dev/null 2>&1 &&
        timeout -k 10 300 mpiexec.mpich -n 1 "$tessera" train "$d/g.ini" data.path="$d/syn.h5" "$@" \
            model.init="$d/init-$key.h5" run.dir="$d/ref-$key" train.dump_grads="$d/ref-$key.h5" >"$d/ref-$key.log" 2>&1
}
grad_eq() { # KEY NP DESC ARGS...: one step on the cluster, compared
    local key=$1 np=$2 desc=$3 out rc
    shift 3
    if [ -z "$py" ]; then echo "ok $((n += 1)) - $desc # SKIP no python3 with h5py"; return; fi
    cl "$np" "$tessera" train "$d/g.ini" data.path="$d/syn.h5" $(cat "$d/args-$key") model.init="$d/init-$key.h5" \
        run.dir="$d/run-$key-$np" train.dump_grads="$d/g-$key-$np.h5" "$@" >"$d/run-$key-$np.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && tail -5 "$d/run-$key-$np.log" | diag
    grep -m1 'ranks = ' "$d/run-$key-$np.log" | diag
    out=$("$py" "$here/tests/train/grad_compare.py" "$d/ref-$key.h5" "$d/g-$key-$np.h5" 1e-4 2>&1)
    printf '%s\n' "$out" | tail -3 | diag
    ok "$([ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q 'tensors compared' && ! printf '%s\n' "$out" | grep -q '^not ok'; echo $?)" "$desc"
}
ref() { # KEY ARGS...
    local key=$1
    shift
    echo "$*" >"$d/args-$key"
    grad_ref "$key" "$@"
    ok $? "one-rank reference $key ($*)"
}
up 2 --ranks-per-node 4 $link
ref q model.norm=batch train.accum=2
grad_eq q 8 "dp 2 x pp 2 x sp 2 on 2 nodes x 4 ranks: every gradient within 1e-4 of one rank's" \
    parallel.pp=2 parallel.sp=2 parallel.microbatches=2 train.batch=1 train.accum=1
ok "$(grep -q 'dp 2 x pp 2 x sp 2 on 2 nodes' "$d/run-q-8.log"; echo $?)" "... the grid spans 2 nodes (replicas across them)"

# ---- 4. a lost node: killed mid-training; the survivors end naming it; training resumes on the node left
lost_node() { # MODE (kill | link)
    local mode=$1 start k gone t0 rc log=$d/lost-$1.log run=$d/lost-$1
    up 2 --ranks-per-node 2 $link
    cl 4 "$tessera" train "$d/g.ini" data.path="$d/syn.h5" run.dir="$run" train.steps=400 train.batch=1 \
        ckpt.every=5 fault.timeout=10 train.log_every=1 >"$log" 2>&1 &
    local job=$!
    for _ in $(seq 1 240); do grep -q '"step": 8,' "$run/metrics.jsonl" 2>/dev/null && break; sleep 0.5; done
    k=$(date +%s.%N)
    if [ "$mode" = kill ]; then "$C/kill" n2 | diag; else "$C/link" n2 down; fi
    gone=
    for _ in $(seq 1 240); do
        if [ -z "$(for x in n1 n2; do ip netns pids "$TESSERA_CLUSTER_NS$x" 2>/dev/null; done | xargs -r ps -o comm= -p 2>/dev/null | grep -x tessera)" ]; then
            gone=$(echo "$(date +%s.%N) - $k" | bc)
            break
        fi
        sleep 0.25
    done
    wait $job
    grep 'watchdog' "$log" | cut -c1-400 | diag
    ok "$([ -n "$gone" ] && awk "BEGIN{exit !($gone <= 20)}" && grep -q 'node n1: watchdog: .*node n2 (ranks 2, 3) does not answer' "$log"; echo $?)" \
        "n2 $([ "$mode" = kill ] && echo killed || echo 'cut off (link down)') at step 8: every rank ended ${gone:-never} s later (fault.timeout 10 + 10), the survivors naming node n2 and its ranks"
    local last
    last=$(ls -d "$run"/ckpt/step-* 2>/dev/null | sed 's/.*step-//' | sort -n | tail -1)
    [ "$mode" = link ] && "$C/link" n2 up
    timeout -k 10 600 "$C/mpiexec" --nodes n1 -n 2 "$tessera" train "$d/g.ini" data.path="$d/syn.h5" run.dir="$run" \
        train.steps=$((${last:-0} + 4)) train.batch=1 ckpt.every=5 fault.timeout=10 >"$log.resume" 2>&1
    rc=$?
    grep -E 'resumed from|ranks = |^done' "$log.resume" | diag
    ok "$([ $rc -eq 0 ] && grep -q "resumed from .*step-$last at step $last" "$log.resume" && grep -q 'on 1 node' "$log.resume"; echo $?)" \
        "training resumes on node n1 alone (2 ranks) from the last checkpoint (step ${last:-none}) and finishes"
}
lost_node kill
[ $full = 1 ] && lost_node link

# ---- 5. Slurm on two nodes
up 2 --ranks-per-node 2
slurm_out=$("$C/slurm" start 2>&1)
rc=$?
printf '%s\n' "$slurm_out" | diag
ok $rc "Slurm on the cluster: slurmctld on the head, slurmd on n1 and n2"
if [ $rc -eq 0 ]; then
    export SLURM_CONF=$TESSERA_CLUSTER_DIR/slurm/slurm.conf
    cat >"$d/tiny.ini" <<'INI'
[model]
channels = 4,8
classes = 3
[data]
patch = 16
[train]
batch = 1
steps = 20
lr = 0.05
log_every = 10
[eval]
final = false
INI
    mkdir -p "$d/runs" "$d/out"
    job=$(TESSERA=$tessera TESSERA_RUNS=$d/runs "$C/on" head sbatch --parsable -N 2 --ntasks-per-node=2 \
        -o "$d/out/%j.out" "$here/jobs/slurm/train.sbatch" "$d/tiny.ini" 2>&1)
    ok $? "sbatch -N 2 --ntasks-per-node=2 jobs/slurm/train.sbatch: job $job"
    st=
    for _ in $(seq 1 150); do
        st=$("$C/on" head scontrol -o show job "$job" 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p')
        case $st in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) break ;; esac
        sleep 2
    done
    ec=$("$C/on" head scontrol -o show job "$job" 2>/dev/null | tr ' ' '\n' | sed -n 's/^ExitCode=//p')
    [ "$st" = COMPLETED ] || { "$C/on" head scontrol -o show job "$job" | tr ' ' '\n' | grep -E '^(Reason|NodeList)='; "$C/on" head sinfo -N; } 2>&1 | diag
    diag <"$d/out/$job.out"
    run=$d/runs/tessera-train-$job
    ok "$([ "$st" = COMPLETED ] && [ "$ec" = 0:0 ] && [ -d "$run/ckpt/step-20" ] && grep -q '4 ranks = .* on 2 nodes' "$d/out/$job.out"; echo $?)" \
        "the job ran 4 ranks on 2 nodes and completed ($st, exit code $ec), its step-20 checkpoint written"
fi
"$C/slurm" stop >/dev/null 2>&1

# ---- 6. down leaves nothing
"$C/down"
left_ns=$(ip netns list 2>/dev/null | grep -c "^$TESSERA_CLUSTER_NS")
left_mounts=$(grep -c "$TESSERA_CLUSTER_DIR" /proc/mounts)
left_procs=$(pgrep -f "$TESSERA_CLUSTER_DIR" | wc -l)
ok "$([ "$left_ns" -eq 0 ] && [ "$left_mounts" -eq 0 ] && [ "$left_procs" -eq 0 ] && [ ! -e "$TESSERA_CLUSTER_DIR" ] && ! ip link show br0 >/dev/null 2>&1; echo $?)" \
    "jobs/cluster/down: no namespace ($left_ns), mount ($left_mounts), process ($left_procs), bridge or state left"

echo "1..$n"
exit $bad
