#!/bin/sh
# Ranks of a node launched unbound with OMP_NUM_THREADS unset (issue [17]:
# several ranks per node without oversubscribing; docs/performance.md,
# "Ranks sharing a node"): each rank is bound to its own contiguous share
# of the CPU set and runs that many threads (tessera info names every
# rank's CPUs; bench step's JSON its threads); one thread each and no
# binding with fewer CPUs than ranks (taskset); nothing changes with
# OMP_NUM_THREADS set, TESSERA_BIND=none, ranks the launcher bound
# (mpiexec -bind-to core) or one rank.
. "$TS_SRCDIR/tests/cli/tap.sh"
unset OMP_NUM_THREADS
py=${TS_PYTHON:-/usr/bin/python3}
launch() { sed -n 's/^launch: *//p' "$1"; }
# the expected shares of 2 ranks: the process's CPUs in order, split in two
want=$("$py" -c 'import os; c = sorted(os.sched_getaffinity(0)); n = len(c)
if n < 2: print("none")
else:
    p = [c[: n // 2], c[n // 2:]]
    print(" ".join(str(a[0]) if len(a) == 1 else "%d-%d" % (a[0], a[-1]) for a in p) + "|%d" % (n // 2))')
first=$("$py" -c 'import os; print(min(os.sched_getaffinity(0)))')
ts_mpirun 2 "$TESSERA" info >"$tmpdir/i2.txt" 2>&1
l=$(launch "$tmpdir/i2.txt")
echo "# $l"
if [ "$want" = none ]; then
    echo "# skip: one CPU in this process's set: the split needs two"
else
    case "$l" in
    *"OMP_NUM_THREADS unset: ${want#*|} thread(s) per rank, each bound to its share of the node's CPUs (node 0's ranks: CPUs ${want%|*};"*) r=0 ;;
    *) r=1 ;;
    esac
    ok $r "2 ranks, OMP_NUM_THREADS unset: ${want#*|} thread(s) each, bound to CPUs ${want%|*}"
    ts_mpirun 2 "$TESSERA" bench step "$TS_SRCDIR/configs/unet3d-small.ini" data.patch=16 train.batch=1 --steps 1 \
        --warmup 0 --json "$tmpdir/b.json" >"$tmpdir/b.txt" 2>&1
    "$py" -c 'import json, sys; j = json.load(open(sys.argv[1])); assert j["threads"] == int(sys.argv[2]), j["threads"]' \
        "$tmpdir/b.json" "${want#*|}"
    ok $? "bench step on those 2 ranks runs ${want#*|} thread(s) per rank"
fi
OMP_NUM_THREADS=1 ts_mpirun 2 "$TESSERA" info >"$tmpdir/i3.txt" 2>&1
case "$(launch "$tmpdir/i3.txt")" in *"OMP_NUM_THREADS 1") r=0 ;; *) r=1 ;; esac
ok $r "OMP_NUM_THREADS set: left as it is"
TESSERA_BIND=none ts_mpirun 2 "$TESSERA" info >"$tmpdir/i4.txt" 2>&1
case "$(launch "$tmpdir/i4.txt")" in *"OMP_NUM_THREADS unset") r=0 ;; *) r=1 ;; esac
ok $r "TESSERA_BIND=none: left as it is"
timeout -k 10 "${TS_TEST_TIMEOUT:-300}" taskset -c "$first" "$MPIEXEC" -n 2 "$TESSERA" info >"$tmpdir/i5.txt" 2>&1
case "$(launch "$tmpdir/i5.txt")" in *"1 thread per rank (fewer CPUs than ranks on the node; not bound)") r=0 ;; *) r=1 ;; esac
ok $r "one CPU for 2 ranks (taskset -c $first): one thread each, not bound"
ts_mpirun 1 "$TESSERA" info >"$tmpdir/i6.txt" 2>&1
case "$(launch "$tmpdir/i6.txt")" in *"OMP_NUM_THREADS unset") r=0 ;; *) r=1 ;; esac
ok $r "one rank: left as it is"
if timeout -k 10 "${TS_TEST_TIMEOUT:-300}" "$MPIEXEC" -bind-to core -n 2 "$TESSERA" info >"$tmpdir/i7.txt" 2>&1 && [ "$want" != none ]; then
    case "$(launch "$tmpdir/i7.txt")" in *"OMP_NUM_THREADS unset") r=0 ;; *) r=1 ;; esac
    ok $r "ranks bound by the launcher (mpiexec -bind-to core): left as they are"
else
    echo "# skip: mpiexec -bind-to core did not run here (or one CPU): $(tail -1 "$tmpdir/i7.txt")"
fi
done_testing
