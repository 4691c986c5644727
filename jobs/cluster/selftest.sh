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
#   4. a lost node costs at most one step: n2 killed in the middle of a dp 4
#      run under jobs/elastic.sh; the survivors name it, write their state
#      (emergency state) and are ended within fault.timeout + 10 s;
#      elastic.sh relaunches on n1 (dp 2, train.accum 2), which resumes from
#      that step: its state there equals the same run's uninterrupted on the
#      same 2 nodes (a checkpoint every step), and its step 60 equals that
#      checkpoint's run on to step 60 as the relaunch runs (within 1e-4);
#   5. Slurm on the 2 nodes: `sbatch -N 2 jobs/slurm/train.sbatch` completes;
#   6. `jobs/cluster/down` leaves no namespace, link, mount or process.
# --full (the longer target, docs/scaling.md; about 22 minutes here) adds, in order:
#   2. the matrix at full size (counts to 2^20 + 3) on 2 x 2; `bench coll
#      --tune` on 2 x 2 over the 1 Gbit/s link (ring, hierarchical,
#      rabenseifner, mpi; 1 KiB to 64 MiB) into tune.json: hierarchical the
#      fastest at 64 MiB, ahead of the ring, nothing wrong, and `auto` under
#      TESSERA_COLL_TUNING=tune.json choosing that winner from the table;
#      the matrix (counts to 2^18 + 3) on 4 x 1, `bench coll --tune` there
#      into the same tune.json and `auto` choosing its 64 MiB winner;
#      tune.json then holds both tables (4 ranks on 2 nodes, kept as
#      written, and on 4 nodes); the matrix (counts to 2^18 + 3) on 3 nodes
#      of 1/2/1 ranks;
#   3. each kind of parallelism where it belongs, each step's gradients equal
#      to one rank's: dp 2 x sp 2 on 2 x 2 (each spatial group inside a node,
#      the replicas on different nodes: the log and grid.json), dp 2 and
#      pp 2 on 2 x 1 (a replica, a stage, per node);
#   4. the lost node again with n2's link taken down instead of killed, and
#      killed under dp 2 x sp 2 and dp 2 x pp 2 (a replica per node: its
#      spatial group, its 2 stages), each relaunched on n1 (sp 2 or pp 2) and
#      ending within 1e-4 of its uninterrupted run; a
#      checkpoint written by 4 ranks on 2 nodes resumed by 2 ranks on n1
#      alone; parallel HDF5: `tessera convert nifti` of 4 NIfTI pairs on
#      2 x 2 (one file written collectively) bit-identical, every dataset and
#      attribute, to one rank's conversion outside the cluster, then read on
#      the 2 nodes: `bench io` (every chunk's checksum) and the first training
#      batch (`bench io --dump-patch`) byte-identical to one rank's;
#   5. the Slurm time limit on 2 nodes: `sbatch -N 2 --ntasks-per-node=2
#      --time=2 --signal=B:USR1@60 jobs/slurm/train.sbatch` for about 80 s of
#      training: the ranks checkpoint on the signal and exit 75, the script
#      requeues the job, which resumes from that checkpoint on 2 nodes and
#      completes (COMPLETED after one or more requeues); a lost node under
#      Slurm: n2's link taken down in the middle of a 2-node train.sbatch
#      job; the survivors write their state, jobs/elastic.sh (launched by
#      the script) relaunches with srun on n1 inside the allocation
#      (train.accum 2), and the job completes; the same under PBS
#      (jobs/pbs/train.pbs with a node file of n1 and n2).
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
launch=cl
if [ $full = 1 ]; then
    # clt NP ARGS...: cl, except that mpiexec's failure after the ranks counts as success: exit status 255
    # with Hydra's messages of a lost proxy ("assert (!closed) failed", "demux engine error", a PMI write
    # error) or 141 (mpiexec killed by SIGPIPE writing to a proxy that had gone), when ranks had reported
    # finishing with status 0 and none was killed. MPICH 4.0's MPI_Finalize over TCP hangs in about half
    # the runs; ts_mpi_finalize used to end each rank after TESSERA_FINALIZE_GRACE s, and Hydra then lost
    # track of a proxy in 1 to 3 of the 45 or so launches of a --full run. Since 2026-12-04 it does not
    # call MPI_Finalize with that MPICH on more than one node (docs/scaling.md), so the signature should
    # not occur; the tolerance stays for runs whose finalize still times out. The callers still check
    # what the program produced (TAP, JSON, files). Prints the output (stdout and stderr) and a note when it applies.
    clt() {
        local out rc g
        out=$(cl "$@" 2>&1)
        rc=$?
        printf '%s\n' "$out"
        g=$(printf '%s\n' "$out" | grep 'MPI_Finalize did not return within')
        if [ -n "$g" ] && ! printf '%s\n' "$g" | grep -vq 'exiting with status 0$' &&
            ! printf '%s\n' "$out" | grep -qE 'BAD TERMINATION|signal [0-9]|Killed' &&
            { [ $rc -eq 141 ] || { [ $rc -eq 255 ] &&
                printf '%s\n' "$out" | grep -qE '^\[(mpiexec|proxy)[^]]*\] .*(assert \(!closed\) failed|demux engine error|HYDU_sock_write)'; }; }; then
            echo "clt: mpiexec exited $rc after the ranks had finished with status 0 (Hydra lost a proxy in the guarded finalize): counted as 0"
            return 0
        fi
        return $rc
    }
    launch=clt
fi

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
        if [ $t = test_allreduce ]; then out=$($launch "$np" "$build/tests/coll/$t" all $max 2>&1); else out=$($launch "$np" "$build/tests/coll/$t" 2>&1); fi
        rc=$?
        printf '%s\n' "$out" | grep -E '^(not ok|# [0-9]+ ranks|clt: )' | head -20 | diag
        [ $rc -ne 0 ] && { echo "exit status $rc"; printf '%s\n' "$out" | grep -v '^ok' | tail -8; } | diag
        printf '%s\n' "$out" | grep 'MPI_Finalize did not return' | head -2 | diag
        ok "$([ $rc -eq 0 ] && ! printf '%s\n' "$out" | grep -q '^not ok' && printf '%s\n' "$out" | grep -q '^1\.\.[1-9]' &&
            ! printf '%s\n' "$out" | grep -q 'MPI_Finalize did not return'; echo $?)" \
            "$name: $t ($(printf '%s\n' "$out" | grep -c '^ok') checks${max:+, counts up to $max}; every rank ended without the finalize guard)"
    done
}
coll_matrix "2 nodes x 2 ranks" 4 $([ $full = 0 ] && echo 65539)
if [ $full = 1 ]; then
    # coll_tune NP KEY: `bench coll --tune` into $d/tune.json (entries of other shapes kept), then
    # the same shape again under TESSERA_COLL_TUNING=$d/tune.json: auto's choice at 64 MiB must be the
    # algorithm that was fastest there, taken from the table ("(tuning)", not the built-in rules).
    # Sizes 1 KiB to 64 MiB in x4 steps (9; the small ones give the alpha-beta fits their latency),
    # 3 interleaved repetitions: 1.5 to 3 minutes a shape over 1 Gbit/s on 2 cores.
    coll_tune() {
        local np=$1 key=$2 out rc
        out=$(clt "$np" "$tessera" bench coll --algo ring,hierarchical,rabenseifner,mpi --min-bytes 1K --max-bytes 64M \
            --repeat 3 --time-ms 1 --check --tune "$d/tune.json" --json "$d/tune-$key.json" 2>&1)
        rc=$?
        printf '%s\n' "$out" | grep -E '^ +67108864 |^# (tessera|tuning|model)|^clt: ' | diag
        [ $rc -ne 0 ] && printf '%s\n' "$out" | tail -5 | diag
        out=$(TESSERA_COLL_TUNING=$d/tune.json clt "$np" "$tessera" bench coll --algo auto --min-bytes 64M --max-bytes 64M \
            --repeat 1 --time-ms 1 --json "$d/auto-$key.json" 2>&1)
        [ $? -ne 0 ] && { rc=1; printf '%s\n' "$out" | tail -5 | diag; }
        printf '%s\n' "$out" | grep -E '^ +67108864 |^clt: ' | diag
        printf '%s\n' "$out" | awk '$1 == 67108864 && $2 == "auto" {print $NF}' >"$d/auto-$key.why"
        return $rc
    }
    # tune_verdict KEY NODES NEED_HIER: prints a summary line, then 0 or 1
    tune_verdict() {
        "${py:-python3}" - "$d" "$1" "$2" "$3" <<'PY'
import json, sys
d, key, nodes, need_hier = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == '1'
try:
    rows = [x for x in json.load(open(f'{d}/tune-{key}.json')) if x['bytes'] == 64 << 20]
    t = {x['algo']: x['time_us'] for x in rows}
    win = min(t, key=t.get)
    table = [e for e in json.load(open(f'{d}/tune.json'))['entries'] if e['op'] == 'allreduce' and e['ranks'] == 4]
    mine = sorted((e for e in table if e['nodes'] == nodes), key=lambda e: e['max_bytes'])
    auto = [x for x in json.load(open(f'{d}/auto-{key}.json')) if x['algo'] == 'auto' and x['bytes'] == 64 << 20]
    chosen = auto[0].get('chosen') if auto else None
    why = open(f'{d}/auto-{key}.why').read().strip()
    ok = (bool(mine) and mine[-1]['algo'] == win and chosen == win and why == '(tuning)' and
          all(x['wrong'] == 0 for x in rows) and (not need_hier or (win == 'hierarchical' and t['hierarchical'] < t['ring'])))
    print('64 MiB: ' + ', '.join(f'{a} {t[a] / 1e3:.0f} ms' for a in sorted(t, key=t.get)) +
          f'; table: {mine[-1]["algo"] if mine else "none"}; auto chose {chosen} {why}')
except Exception as e:
    ok = False
    print(f'cannot read the results: {e!r}')
print(0 if ok else 1)
PY
    }
    # the hierarchical allreduce against the flat ones where the link is the bottleneck, and the tuning
    # table choosing the winner
    coll_tune 4 2x2
    rc=$?
    v=$(tune_verdict 2x2 2 "$([ -n "$link" ] && echo 1 || echo 0)")
    printf '%s\n' "$v" | head -1 | diag
    times=$(printf '%s\n' "$v" | head -1 | cut -d';' -f1)
    [ -n "$link" ] && times="$times (hierarchical the fastest, ahead of the ring)"
    ok "$([ $rc -eq 0 ] && [ "$(printf '%s\n' "$v" | tail -1)" = 0 ]; echo $?)" "bench coll --tune on 2 nodes x 2 ranks${link:+ \
over a 1 Gbit/s link}: $times, nothing wrong; auto under TESSERA_COLL_TUNING chooses the winner from the table"
    cp "$d/tune.json" "$d/tune-2x2-table.json" 2>/dev/null
    # the other shapes' matrices up to 256 Ki + 3 elements (every 64 KiB + 5 piece size still split many
    # times): at 2^20 + 3 each took 6-7 minutes here, the 2 x 2 one above covers that count
    up 4 --ranks-per-node 1 $link
    coll_matrix "4 nodes x 1 rank" 4 262147
    coll_tune 4 4x1
    rc=$?
    v=$(tune_verdict 4x1 4 0)
    printf '%s\n' "$v" | head -1 | diag
    ok "$([ $rc -eq 0 ] && [ "$(printf '%s\n' "$v" | tail -1)" = 0 ]; echo $?)" \
        "bench coll --tune on 4 nodes x 1 rank into the same table: $(printf '%s\n' "$v" | head -1 | cut -d';' -f1); auto under TESSERA_COLL_TUNING chooses that winner"
    v=$("${py:-python3}" - "$d/tune.json" "$d/tune-2x2-table.json" <<'PY'
import json, sys
try:
    e, e2 = (json.load(open(f))['entries'] for f in sys.argv[1:3])
    sel = lambda t, k: [x for x in t if x['op'] == 'allreduce' and x['ranks'] == 4 and x['nodes'] == k]
    n = {k: sel(e, k) for k in (2, 4)}
    print('tune.json: ' + '; '.join(f'{k} nodes: ' + ', '.join(f"{x['algo']} to {x['max_bytes']:.3g} B" for x in v)
                                    for k, v in n.items()))
    print(0 if len(n[2]) == 9 and len(n[4]) == 9 and len(e) == 18 and n[2] == sel(e2, 2) else 1)
except Exception as x:
    print(f'cannot read the tables: {x!r}')
    print(1)
PY
)
    printf '%s\n' "$v" | head -1 | diag
    ok "$([ "$(printf '%s\n' "$v" | tail -1)" = 0 ]; echo $?)" \
        "tune.json holds a table per node count: 9 size buckets for 4 ranks on 4 nodes added, the 2-node ones kept as written"
    up 3 --ranks-per-node 1,2,1 $link
    coll_matrix "3 nodes of 1/2/1 ranks" 4 262147
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
    rm -rf "$d/run-$key-$np" "$d/g-$key-$np.h5"
    $launch "$np" "$tessera" train "$d/g.ini" data.path="$d/syn.h5" $(cat "$d/args-$key") model.init="$d/init-$key.h5" \
        run.dir="$d/run-$key-$np" train.dump_grads="$d/g-$key-$np.h5" "$@" >"$d/run-$key-$np.log" 2>&1
    rc=$?
    # what the launcher and the ranks said at the end (the ranks' errors and notes first)
    [ $rc -ne 0 ] && { grep -E '^tessera: (error|note|rank)' "$d/run-$key-$np.log" | sort | uniq -c | head -20
        grep -vE "^(  |[a-z ]*: )" "$d/run-$key-$np.log" | tail -30; } | diag
    # Hydra (MPICH 4.0.2) reported a bad termination after every rank had finished in 7 of 129 runs of this
    # grid until ts_mpi_finalize sent the PMI finalize before exiting (0 of 40 since; docs/scaling.md). Should
    # it recur: after rank 0's note that all finished with status 0 (printed before any rank exits), the
    # run itself counts as succeeded, and says so; the gradients are compared all the same
    if [ $rc -ne 0 ] && grep -q '^tessera: note: every rank finished (exit status 0)' "$d/run-$key-$np.log" &&
        grep -q '^done: ' "$d/run-$key-$np.log" && ! grep -q '^tessera: error' "$d/run-$key-$np.log"; then
        echo "launcher exit $rc after every rank had finished with status 0 (Hydra over TCP, docs/scaling.md): the run counts" | diag
        rc=0
    fi
    grep -m1 'ranks = ' "$d/run-$key-$np.log" | diag
    grep '^clt: ' "$d/run-$key-$np.log" | diag
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
if [ $full = 1 ]; then
    # each kind of parallelism where it belongs: replicas across nodes, spatial groups inside a node,
    # pipeline stages across nodes; against one rank with the same global batch (d: batch 2; p: batch 1,
    # 2 accumulated = the pipeline's 2 micro-batches of 1), as tests/train/grad_equiv.sh does
    placed() { # GRID.JSON sp|dp|pp: where the ranks ran, as the layout wants (prints it)
        "${py:-python3}" - "$@" <<'PY' 2>&1 | diag
import json, sys
g = json.load(open(sys.argv[1]))
r = g['rank']
print(' '.join(f"rank {x['world_rank']}: node {x['node']} d{x['d']} p{x['p']} s{x['s']};" for x in r))
by = lambda k: {v: {x['node'] for x in r if x[k] == v} for v in {x[k] for x in r}}
if sys.argv[2] == 'sp':  # every spatial group (d, p) on one node, the replicas on different ones
    groups = {(x['d'], x['p']): set() for x in r}
    for x in r: groups[(x['d'], x['p'])].add(x['node'])
    ok = g['sp_within_node'] and all(len(v) == 1 for v in groups.values()) and \
        len(set().union(*by('d').values())) == len(by('d'))
else:  # every replica (dp) or stage (pp) on a node of its own
    k = {'dp': 'd', 'pp': 'p'}[sys.argv[2]]
    b = by(k)
    ok = all(len(v) == 1 for v in b.values()) and len(set().union(*b.values())) == len(b) > 1
sys.exit(0 if ok else 1)
PY
        return "${PIPESTATUS[0]}"
    }
    ref d model.norm=batch
    ref p model.norm=batch train.batch=1 train.accum=2
    up 2 --ranks-per-node 2 $link
    grad_eq d 4 "dp 2 x sp 2 on 2 nodes x 2 ranks: every gradient within 1e-4 of one rank's" parallel.sp=2 train.batch=1
    placed "$d/run-d-4/grid.json" sp
    rc=$?
    ok "$([ $rc -eq 0 ] && grep -q 'dp 2 x pp 1 x sp 2 on 2 nodes (spatial groups are consecutive ranks, each within one node' "$d/run-d-4.log"; echo $?)" "... each spatial group inside one node, the 2 replicas on different nodes (grid.json)"
    up 2 --ranks-per-node 1 $link
    grad_eq d 2 "dp 2 on 2 nodes x 1 rank: every gradient within 1e-4 of one rank's" train.batch=1
    grad_eq p 2 "pp 2 on 2 nodes x 1 rank (a stage per node): every gradient within 1e-4 of one rank's" \
        parallel.pp=2 parallel.microbatches=2 train.accum=1
    placed "$d/run-d-2/grid.json" dp
    rc=$?
    placed "$d/run-p-2/grid.json" pp || rc=1
    ok "$([ $rc -eq 0 ] && grep -q 'dp 2 x pp 1 x sp 1 on 2 nodes' "$d/run-d-2.log" && grep -q 'dp 1 x pp 2 x sp 1 on 2 nodes' "$d/run-p-2.log"; echo $?)" \
        "... the 2 replicas, and the 2 stages, each on its own node (grid.json)"
fi

# (with the link down n2's ranks live on and write their state too: 4 files then, 2 when n2 is killed)
# ---- 4. a lost node costs at most one step (issue [14]): n2 killed (or cut off) at about step 37 of a
# dp 4 run; the survivors write their emergency state and end within fault.timeout + 10 s naming it;
# jobs/elastic.sh relaunches on n1 (dp 2, train.accum 2: the global batch kept), which resumes from step 36
# or 37 (checkpoints every 50) and ends at step 60 as an uninterrupted run does.
# What "as an uninterrupted run" means: this small model's training is chaotic in the last bits (a
# different summation order of the gradient allreduce alone, ring against shm on one machine, moves
# optim/momentum_buffer/enc2.norm2.bias by 5.5e-2 of its scale at step 60), so the references do the
# same arithmetic as the run they check: the uninterrupted run on the same 2 nodes with a checkpoint
# every step (the emergency state of step S must equal its step S), and that checkpoint of step S run
# on to step 60 by the relaunch's own command on n1 (the resumed run's step 60 must equal it).
lost_node() { # MODE (kill | link) [LAYOUT (dp | sp | pp)]
    local mode=$1 lay=${2:-dp} k gone log=$d/lost-$1-${2:-dp}.log run=$d/lost-$1-${2:-dp} args keys=() grid=dp4 again
    case $lay in # the replicas outermost: replica 0 on n1, replica 1 on n2 (a spatial group, or the 2 stages, per node)
    sp) keys=(parallel.sp=2) grid="dp 2 x sp 2" again="dp 1, train.accum=2" ;;
    pp) keys=(parallel.pp=2 parallel.microbatches=2) grid="dp 2 x pp 2" again="dp 1, parallel.microbatches=4" ;;
    *) grid="dp 4" again="dp 2, train.accum=2" ;;
    esac
    # ckpt.keep=0: the relaunch's checkpoint assembled from the emergency state stays for the comparison
    args=(train "$d/g.ini" data.path="$d/syn.h5" train.steps=60 train.batch=1 model.sync_bn=false ckpt.every=50
        ckpt.keep=0 fault.timeout=10 train.log_every=1 "${keys[@]}")
    local lost_ref=$d/lost-ref-$lay
    up 2 --ranks-per-node 2 $link
    if [ ! -d "$lost_ref" ]; then # the uninterrupted run: the same 4 ranks on n1 and n2, a checkpoint every step
        timeout -k 10 600 "$C/mpiexec" -hosts n1:2,n2:2 -n 4 "$tessera" "${args[@]}" run.dir="$lost_ref" \
            ckpt.every=1 >"$lost_ref.log" 2>&1
        ok $? "uninterrupted reference: $grid on n1 and n2, 60 steps, a checkpoint every step"
    fi
    "$here/jobs/elastic.sh" --hosts n1:2,n2:2 --launcher "$C/mpiexec" -- "$tessera" "${args[@]}" run.dir="$run" \
        >"$log" 2>&1 &
    local job=$!
    for _ in $(seq 1 480); do grep -q '"step": 35,' "$run/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
    k=$(date +%s.%N)
    if [ "$mode" = kill ]; then "$C/kill" n2 | diag; else "$C/link" n2 down; fi
    local ks # the last step finished when the node was gone
    ks=$(grep -o '"step": [0-9]*' "$run/metrics.jsonl" | tail -1 | grep -o '[0-9]*$')
    gone= # until the first run's ranks have all ended (elastic.sh relaunches a few seconds later)
    for _ in $(seq 1 240); do
        if [ -z "$(for x in n1 n2; do ip netns pids "$TESSERA_CLUSTER_NS$x" 2>/dev/null; done | xargs -r ps -o comm= -p 2>/dev/null | grep -x tessera)" ]; then
            gone=$(echo "$(date +%s.%N) - $k" | bc)
            break
        fi
        sleep 0.25
    done
    timeout 600 tail --pid=$job -f /dev/null
    wait $job
    local rc=$?
    grep -E 'watchdog|emergency state|elastic|resumed|^done' "$log" | cut -c1-300 | diag
    local es
    es=$(grep -o 'rank 0: emergency state of step [0-9]*' "$log" | head -1 | grep -o '[0-9]*$')
    # what the check below reads, for a failure's diagnosis
    echo "last step logged when n2 went: ${ks:-none}; lines of rank 0 and 1's state of step ${es:-none}: $(grep -c "rank [01]: emergency state of step $es written" "$log") (more when elastic.sh's tail reread a truncated file); watchdog naming n2: $(grep -c 'node n1: watchdog: .*node n2 (ranks 2, 3) does not answer' "$log")" | diag
    ok "$([ -n "$gone" ] && awk "BEGIN{exit !($gone <= 20)}" && grep -q 'node n1: watchdog: .*node n2 (ranks 2, 3) does not answer' "$log" &&
        grep -q "rank 0: emergency state of step $es written" "$log" && grep -q "rank 1: emergency state of step $es written" "$log" &&
        [ "${es:-0}" -ge $((ks - 1)) ]; echo $?)" \
        "$grid: n2 $([ "$mode" = kill ] && echo killed || echo 'cut off (link down)') after step $ks: ranks 0 and 1 wrote their state of step ${es:-none} (at most one step lost) and every rank had ended ${gone:-never} s after the loss (fault.timeout 10 + 10)"
    ok "$([ $rc -eq 0 ] && grep -q "relaunching on n1:2 (2 ranks, $again)" "$log" &&
        grep -Eq "emergency state: n2 \(ranks 2, 3\) lost at step $((es + 1)); the [24] surviving rank files \(of 4 ranks\) hold all of step $es" "$log" &&
        grep -q "resumed from .*ckpt/step-$es at step $es" "$log" && grep -q 'on 1 node' "$log" &&
        grep -q "resumed after the loss of n2 (ranks 2, 3): step $((es + 1)) done" "$log"; echo $?)" \
        "jobs/elastic.sh relaunched on n1 ($again), which resumed from the emergency state of step ${es:-none} (checkpoints every 50: not 0) and trained to step 60"
    if [ -n "$py" ]; then
        # the relaunch's own command: the same launcher on n1 with the keys elastic.sh added, from the
        # reference's checkpoint of the emergency state's step
        local more cont=$d/lost-cont-$1-$lay
        more=$(grep -o "relaunching on n1:2 (2 ranks, dp [0-9]*, [^)]*)" "$log" | head -1 | sed 's/.*, dp [0-9]*, //; s/)$//')
        rm -rf "$cont"
        timeout -k 10 600 "$C/mpiexec" -hosts n1:2 -n 2 "$tessera" "${args[@]}" $more run.dir="$cont" \
            ckpt.resume="$lost_ref/ckpt/step-${es:-0}" >"$cont.log" 2>&1
        ok $? "the reference's checkpoint of step ${es:-none} run on to step 60 as the relaunch runs ($more on n1)"
        out=$("$py" - "$lost_ref/ckpt/step-${es:-0}" "$run/ckpt/step-${es:-0}" 0 <<'PY'
import h5py, numpy as np, sys
A, B = (h5py.File(p + '/state.h5', 'r') for p in sys.argv[1:3])
names = []
A.visit(lambda n: names.append(n) if isinstance(A[n], h5py.Dataset) and n.split('/')[0] in ('params', 'optim') and 'running' not in n and 'num_batches' not in n else None)
diff = [n for n in names if not np.array_equal(np.asarray(A[n]), np.asarray(B[n]))]
print('%d tensors of the emergency state (assembled: %s): %d differ from the uninterrupted run\'s checkpoint of that step%s'
      % (len(names), sys.argv[2], len(diff), (' (' + ', '.join(diff[:3]) + ')') if diff else ''))
sys.exit(0 if len(names) > 10 and not diff else 1)
PY
)
        rc=$?
        echo "$out" | diag
        ok $rc "... the emergency state of step ${es:-none} is bitwise the uninterrupted run's state of that step (every parameter and optimizer tensor)"
        out=$("$py" - "$cont" "$run" <<'PY'
import h5py, numpy as np, sys
A, B = (h5py.File(p + '/ckpt/step-60/state.h5', 'r') for p in sys.argv[1:3])
names = []
A.visit(lambda n: names.append(n) if isinstance(A[n], h5py.Dataset) and n.split('/')[0] in ('params', 'optim') and 'running' not in n and 'num_batches' not in n else None)
def scale(n): # a bias whose gradient is analytically zero (before a norm) is compared at its weight's scale
    s = float(np.abs(np.asarray(A[n])).max())
    if n.endswith('.bias') and n[:-5] + '.weight' in A:
        s = max(s, float(np.abs(np.asarray(A[n[:-5] + '.weight'])).max()))
    return max(s, 1e-30)
r = {n: float(np.abs(np.asarray(A[n], np.float64) - np.asarray(B[n], np.float64)).max()) / scale(n) for n in names}
worst = max(r, key=r.get)
w = r[worst]
print('%d tensors of step 60: worst %.2e of their scale (%s)' % (len(names), w, worst))
sys.exit(0 if len(names) > 10 and w <= 1e-4 else 1)
PY
)
        rc=$?
        echo "$out" | diag
        ok $rc "... and the resumed run ends at step 60 within 1e-4 of it (every parameter and optimizer tensor)"
    fi
}
lost_node kill
[ $full = 1 ] && { lost_node link; lost_node kill sp; lost_node kill pp; }
if [ $full = 1 ]; then
    # a checkpoint written on 2 nodes resumed on 1 (cleanly: no fault)
    up 2 --ranks-per-node 2 $link
    run=$d/move
    clt 4 "$tessera" train "$d/g.ini" data.path="$d/syn.h5" run.dir="$run" train.steps=6 train.batch=1 ckpt.every=3 \
        >"$run.log" 2>&1
    rc=$?
    timeout -k 10 600 "$C/mpiexec" --nodes n1 -n 2 "$tessera" train "$d/g.ini" data.path="$d/syn.h5" run.dir="$run" \
        train.steps=9 train.batch=1 ckpt.every=3 >"$run.resume.log" 2>&1
    rc2=$?
    grep -hE 'ranks = |resumed from|^clt: ' "$run.log" "$run.resume.log" | diag
    ok "$([ $rc -eq 0 ] && [ $rc2 -eq 0 ] && grep -q '4 ranks = .* on 2 nodes' "$run.log" && [ -d "$run/ckpt/step-6" ] &&
        grep -q '2 ranks = .* on 1 node' "$run.resume.log" && grep -q "resumed from .*step-6 at step 6" "$run.resume.log" &&
        grep -q '"step": 9,' "$run/metrics.jsonl"; echo $?)" \
        "a checkpoint written by 4 ranks on 2 nodes (step 6) resumes on node n1 alone (2 ranks), which trains to step 9"

    # parallel HDF5 across nodes: `tessera convert` on 2 nodes x 2 ranks (one file, written collectively)
    # against one rank outside the cluster, every dataset and attribute compared bit for bit; then read
    # on the 2 nodes: bench io's read phase (every chunk's checksum) and the first training patches,
    # which must be the files one rank cuts from the one-rank dataset
    mkdir -p "$d/h5" "$d/h5/p1" "$d/h5/p4"
    h5ok=1
    if [ -n "$py" ]; then
        "$tessera" synth --out "$d/h5/src.h5" --count 4 --size 40,48,36 --classes 3 --seed 7 >/dev/null 2>&1 &&
            "$py" - "$d/h5/src.h5" "$d/h5" >"$d/h5/nii.log" 2>&1 <<'PY'
# the phantoms as NIfTI-1 pairs (float32 image, uint8 label), each with its own voxel size
import struct, sys, h5py, numpy as np
def write(path, a, code, bitpix, sp):
    h = bytearray(348)
    struct.pack_into('<i', h, 0, 348)
    struct.pack_into('<8h', h, 40, 3, a.shape[2], a.shape[1], a.shape[0], 1, 1, 1, 1)
    struct.pack_into('<hh', h, 70, code, bitpix)
    struct.pack_into('<8f', h, 76, 1, sp[0], sp[1], sp[2], 1, 1, 1, 1)
    struct.pack_into('<3f', h, 108, 352, 1, 0)  # vox_offset, scl_slope, scl_inter
    struct.pack_into('<B', h, 123, 2)  # millimetres
    struct.pack_into('<hh', h, 252, 0, 1)  # qform_code, sform_code
    for r in range(3):
        row = [0.0] * 4
        row[r], row[3] = sp[r], -10.0 * (r + 1)
        struct.pack_into('<4f', h, 280 + 16 * r, *row)
    h[344:348] = b'n+1\0'
    with open(path, 'wb') as f:
        f.write(bytes(h) + b'\0' * 4 + np.ascontiguousarray(a).tobytes())
f = h5py.File(sys.argv[1], 'r')
for i, k in enumerate(sorted(f['samples'])):
    sp = (1.0, 1.25 + 0.25 * i, 1.5)
    write(f'{sys.argv[2]}/s{i}_img.nii', f['samples'][k]['image'][0].astype('<f4'), 16, 32, sp)
    write(f'{sys.argv[2]}/s{i}_seg.nii', f['samples'][k]['label'][()].astype('u1'), 2, 8, sp)
PY
        h5ok=$?
        diag <"$d/h5/nii.log"
        pairs=()
        for i in 0 1 2 3; do pairs+=(--image "$d/h5/s${i}_img.nii" --label "$d/h5/s${i}_seg.nii"); done
        [ $h5ok -eq 0 ] &&
            timeout -k 10 300 mpiexec.mpich -n 1 "$tessera" convert nifti "${pairs[@]}" --classes 3 --chunk 16 \
                --out "$d/h5/one.h5" >"$d/h5/one.log" 2>&1 &&
            clt 4 "$tessera" convert nifti "${pairs[@]}" --classes 3 --chunk 16 --out "$d/h5/cl.h5" >"$d/h5/cl.log" 2>&1
        h5ok=$?
        grep -hE 'convert nifti: wrote|^clt: ' "$d/h5/one.log" "$d/h5/cl.log" | diag
        [ $h5ok -ne 0 ] && tail -5 "$d/h5/one.log" "$d/h5/cl.log" | diag
    fi
    if [ -z "$py" ]; then
        echo "ok $((n += 1)) - parallel HDF5 across nodes # SKIP no python3 with h5py"
    else
        cmprc=1
        [ $h5ok -eq 0 ] && { "$py" - "$d/h5/one.h5" "$d/h5/cl.h5" >"$d/h5/cmp.log" 2>&1; cmprc=$?; } <<'PY'
# every group, dataset and attribute of two datasets: numbers bit for bit, strings by value
import sys, h5py, numpy as np
def same(u, v):
    if u.dtype != v.dtype or u.shape != v.shape: return False
    return u.tolist() == v.tolist() if u.dtype.hasobject else u.tobytes() == v.tobytes()
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
diff, nd, nbytes, na = [], 0, 0, 0
def attrs(name, x, y):
    global na
    if sorted(x.attrs) != sorted(y.attrs): diff.append(f'{name}: attributes {sorted(x.attrs)} vs {sorted(y.attrs)}')
    for k in x.attrs:
        if k in y.attrs:
            na += 1
            if not same(np.asarray(x.attrs[k]), np.asarray(y.attrs[k])): diff.append(f'{name} attribute {k}')
def walk(name, x):
    global nd, nbytes
    y = b.get(name)
    if y is None or type(y) != type(x):
        diff.append(f'{name}: missing, or not the same kind of object')
        return
    attrs(name, x, y)
    if isinstance(x, h5py.Dataset):
        u, v = np.asarray(x[()]), np.asarray(y[()])
        nd, nbytes = nd + 1, nbytes + u.nbytes
        if not same(u, v): diff.append(f'{name}: {u.dtype}{u.shape} vs {v.dtype}{v.shape}')
attrs('/', a, b)
a.visititems(walk)
b.visititems(lambda name, y: None if name in a else diff.append(f'{name}: only in {sys.argv[2]}'))
for x in diff[:10]: print('differs:', x)
print(f'{nd} datasets ({nbytes} bytes) and {na} attributes compared: {len(diff)} differ')
sys.exit(1 if diff or nd < 12 else 0)
PY
        diag <"$d/h5/cmp.log" 2>/dev/null
        ok "$([ $h5ok -eq 0 ] && [ $cmprc -eq 0 ] && grep -q 'on 4 ranks' "$d/h5/cl.log"; echo $?)" \
            "tessera convert on 2 nodes x 2 ranks (4 NIfTI pairs, one file written collectively, 16^3 chunks): every dataset and attribute bit-identical to one rank's"
        out=$(clt 4 "$tessera" bench io "$d/g.ini" data.path="$d/h5/cl.h5" --steps 0 --repeat 1 2>&1)
        rc=$?
        printf '%s\n' "$out" | grep -E 'bench io|read |^clt: ' | diag
        timeout -k 10 300 mpiexec.mpich -n 1 "$tessera" bench io "$d/g.ini" data.path="$d/h5/one.h5" train.batch=4 \
            --dump-patch "$d/h5/p1" >/dev/null 2>&1 &&
            clt 4 "$tessera" bench io "$d/g.ini" data.path="$d/h5/cl.h5" train.batch=1 --dump-patch "$d/h5/p4" >"$d/h5/dump.log" 2>&1
        rc2=$?
        same=0
        for f in "$d"/h5/p1/*.nii; do cmp -s "$f" "$d/h5/p4/${f##*/}" && same=$((same + 1)); done
        echo "first batch: $same of $(ls "$d"/h5/p1/*.nii 2>/dev/null | wc -l) patch files identical" | diag
        ok "$([ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q '4 samples, 4 ranks' && [ $rc2 -eq 0 ] && [ $same -eq 8 ]; echo $?)" \
            "... read on the 2 nodes: every chunk's checksum (bench io), and the first training batch (4 ranks x 1) identical to one rank's from the one-rank file"
    fi
fi

# lost_batch slurm|pbs: a lost node under the batch scripts (issue [14]): a 2-node job of 4 ranks, n2's
# link taken down after step 35 of 60; the survivors on n1 write their state, jobs/elastic.sh (the
# scripts' launcher) relaunches on n1 alone (train.accum 2: the global batch kept) and the job completes
lost_batch() {
    local kind=$1 run out st= ec= rc job k
    mkdir -p "$d/runs" "$d/out"
    if [ "$kind" = slurm ]; then
        job=$(TESSERA=$tessera TESSERA_JOBS=$here/jobs TESSERA_RUNS=$d/runs "$C/on" head sbatch --parsable -N 2 \
            --ntasks-per-node=2 -o "$d/out/%j.out" "$here/jobs/slurm/train.sbatch" "$d/tiny.ini" train.steps=60 \
            train.log_every=1 fault.timeout=10 ckpt.every=50 2>&1)
        run=$d/runs/tessera-train-$job
        out=$d/out/$job.out
    else
        job=pbs
        run=$d/runs/pbs-lost
        out=$d/out/pbs-lost.out
        printf 'n1\nn1\nn2\nn2\n' >"$d/pbs-nodes"
        PBS_JOBID=4242.head PBS_JOBNAME=tessera PBS_O_WORKDIR=$d PBS_NODEFILE=$d/pbs-nodes TESSERA=$tessera \
            TESSERA_JOBS=$here/jobs TESSERA_MPIEXEC=$C/mpiexec TESSERA_WALLTIME=3600 TESSERA_RUN_DIR=$run \
            timeout -k 10 600 bash "$here/jobs/pbs/train.pbs" "$d/tiny.ini" train.steps=60 train.log_every=1 \
            fault.timeout=10 ckpt.every=50 >"$out" 2>&1 &
        job=$!
    fi
    for _ in $(seq 1 1200); do grep -q '"step": 35,' "$run/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
    "$C/link" n2 down
    k=$(grep -o '"step": [0-9]*' "$run/metrics.jsonl" 2>/dev/null | tail -1 | grep -o '[0-9]*$')
    if [ "$kind" = slurm ]; then
        for _ in $(seq 1 200); do
            st=$("$C/on" head scontrol -o show job "$job" 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p')
            case $st in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) break ;; esac
            sleep 2
        done
        ec=$("$C/on" head scontrol -o show job "$job" 2>/dev/null | tr ' ' '\n' | sed -n 's/^ExitCode=//p')
        [ "$st" = COMPLETED ] && [ "$ec" = 0:0 ]
        rc=$?
    else
        wait "$job"
        rc=$?
        st="exit $rc"
    fi
    grep -E '^train\.|watchdog|emergency state|elastic|resumed|^done' "$out" | cut -c1-300 | diag
    ok "$([ $rc -eq 0 ] && grep -q 'relaunching on n1:2 (2 ranks, dp 2, train.accum=2)' "$out" &&
        grep -Eq 'emergency state: n2 \(ranks 2, 3\) lost at step [0-9]+; the [24] surviving rank files \(of 4 ranks\) hold all of step' "$out" &&
        grep -q 'resumed after the loss of n2 (ranks 2, 3): step [0-9]* done' "$out" && [ -d "$run/ckpt/step-60" ] &&
        grep -q '"step": 60,' "$run/metrics.jsonl"; echo $?)" \
        "$([ "$kind" = slurm ] && echo "Slurm: n2 cut off after step ${k:-none} of a 2-node train.sbatch job; elastic.sh relaunched with srun on n1 inside the allocation (train.accum 2) and the job completed ($st, exit code ${ec:-none})" ||
            echo "PBS: n2 cut off after step ${k:-none} of a train.pbs job on a node file of n1 and n2; elastic.sh relaunched on n1 (train.accum 2) and the job completed ($st)")"
    "$C/link" n2 up
}

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
    job=$(TESSERA=$tessera TESSERA_JOBS=$here/jobs TESSERA_RUNS=$d/runs "$C/on" head sbatch --parsable -N 2 --ntasks-per-node=2 \
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
    if [ $full = 1 ]; then
        # the time limit on 2 nodes (jobs/slurm/selftest.sh's check 2 on one node): the ranks checkpoint on
        # the early signal and exit 75, the script requeues the job (held cred_expire + 1 s: cluster.sh sets
        # cred_expire=10), the job resumes from the checkpoint, until training completes. slurmctld looks
        # at time limits every 30 s and sends the signal at the first look within 50 + 30 s of the end
        # (hence "up to 60 s early"): --time=1 with @50 would signal at 0-30 s, often before the ranks
        # have started; --time=2 with @60 signals 30-60 s after each start. About 80 s of training (from
        # job 1's steady rate over its steps 11-20): at least one requeue, usually one or two.
        steps=$("${py:-python3}" -c "
import json
m = [json.loads(x) for x in open('$run/metrics.jsonl')]
r = [x['samples_per_s'] for x in m if x.get('step') == 20 and x.get('samples_per_s')]
print(max(100, int(80 * r[-1] / 4)))" 2>/dev/null)
        steps=${steps:-800}
        job2=$(TESSERA=$tessera TESSERA_JOBS=$here/jobs TESSERA_RUNS=$d/runs "$C/on" head sbatch --parsable -N 2 --ntasks-per-node=2 --time=2 \
            --signal=B:USR1@60 -o "$d/out/%j.out" "$here/jobs/slurm/train.sbatch" "$d/tiny.ini" train.steps="$steps" \
            train.log_every=50 2>&1)
        ok $? "sbatch -N 2 --ntasks-per-node=2 --time=2 --signal=B:USR1@60 train.sbatch, $steps steps (about 80 s of training): job $job2"
        st=
        for _ in $(seq 1 300); do
            st=$("$C/on" head scontrol -o show job "$job2" 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p')
            case $st in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) break ;; esac
            sleep 2
        done
        info=$("$C/on" head scontrol -o show job "$job2" 2>/dev/null | tr ' ' '\n')
        ec=$(printf '%s\n' "$info" | sed -n 's/^ExitCode=//p')
        restarts=$(printf '%s\n' "$info" | sed -n 's/^Restarts=//p')
        [ "$st" = COMPLETED ] || printf '%s\n' "$info" | grep -E '^(JobState|Reason|NodeList|Restarts)=' | diag
        grep -E '^train\.sbatch|stopped by a signal|resumed from|ranks = |^done' "$d/out/$job2.out" | cut -c1-300 | diag
        run2=$d/runs/tessera-train-$job2
        k=$(sed -n 's/.*stopped by a signal at step \([0-9]*\) .*/\1/p' "$d/out/$job2.out" | head -1)
        ok "$([ "$st" = COMPLETED ] && [ "$ec" = 0:0 ] && [ "${restarts:-0}" -ge 1 ] && [ -n "$k" ] &&
            grep -q "resumed from .*step-$k at step $k" "$d/out/$job2.out" && grep -q 'requeueing job' "$d/out/$job2.out" &&
            [ "$(grep -c '4 ranks = .* on 2 nodes' "$d/out/$job2.out")" -ge 2 ] && grep -q "\"step\": $steps," "$run2/metrics.jsonl"; echo $?)" \
            "the job completed ($st, exit code $ec) after $restarts requeue(s): stopped by the signal at step ${k:-none} on 2 nodes, requeued, resumed from step-${k:-none} on 2 nodes, trained to step $steps"
        lost_batch slurm
    fi
fi
"$C/slurm" stop >/dev/null 2>&1
[ $full = 1 ] && { up 2 --ranks-per-node 2 $link; lost_batch pbs; }

# ---- 6. down leaves nothing
"$C/down"
left_ns=$(ip netns list 2>/dev/null | grep -c "^$TESSERA_CLUSTER_NS")
left_mounts=$(grep -c "$TESSERA_CLUSTER_DIR" /proc/mounts)
left_procs=$(pgrep -f "$TESSERA_CLUSTER_DIR" | wc -l)
ok "$([ "$left_ns" -eq 0 ] && [ "$left_mounts" -eq 0 ] && [ "$left_procs" -eq 0 ] && [ ! -e "$TESSERA_CLUSTER_DIR" ] && ! ip link show br0 >/dev/null 2>&1; echo $?)" \
    "jobs/cluster/down: no namespace ($left_ns), mount ($left_mounts), process ($left_procs), bridge or state left"

echo "1..$n"
exit $bad
