#!/bin/bash
# A multi-node cluster on one machine (docs/scaling.md, "A real network on
# one machine"): N nodes, each a network namespace with its own hostname
# (a UTS namespace), its own System V/POSIX IPC (an IPC namespace, so that
# UCX's shared-memory transports see other nodes as remote) and address,
# joined by a bridge in a "head" namespace
# (the login node: mpiexec, slurmctld and the clients run there), each link
# shaped by tc. MPI sees N nodes (MPI_Comm_split_type gives the ranks of a
# node) and inter-node messages cross the veth links over TCP; the file
# system is shared, as a cluster's parallel file system. Every address lives
# in the namespaces this script creates (10.250.0.0/24 by default); nothing
# is sent anywhere else. Root only.
#
#   jobs/cluster/up N [--ranks-per-node R|R1,R2,...] [--link RATE]
#                           N nodes n1..nN (RATE: tc's units, e.g. 1gbit, 10gbit)
#   jobs/cluster/mpiexec [--nodes n1,n3 | -hosts n1:2,n3:1] [mpiexec.mpich options] -n NP PROGRAM ARGS...
#                           from the head, ranks placed ranks-per-node per node on
#                           the nodes alive (or those named)
#   jobs/cluster/on NODE CMD...      runs CMD on NODE (head, n1 .. nN)
#   jobs/cluster/link NODE down|up   takes a node's link down (or up again)
#   jobs/cluster/kill NODE           the node dies: its link goes down, then every
#                                    process in it is killed (nothing it sends gets out)
#   jobs/cluster/slurm start|stop    slurmctld on the head, one slurmd per node
#   jobs/cluster/status              the nodes, their addresses, links and processes
#   jobs/cluster/down                removes every namespace, link, mount and process it made
#
# State: $TESSERA_CLUSTER_DIR (default /run/tessera-cluster); namespaces
# named $TESSERA_CLUSTER_NS (default tscl-) + node, so that two clusters (a
# user's and jobs/cluster/selftest.sh's) do not touch each other; the nodes file,
# the host list for mpiexec, the ssh stand-in hydra launches proxies with, the
# UTS and IPC namespace files, the Slurm configuration. The nodes share one
# kernel, so cross-memory attach (process_vm_readv) would reach across
# them: UCX_TLS=^cma (unless UCX_TLS is set) for everything started on the
# cluster. `up` tears down what it made
# when it fails or is interrupted.
set -u -o pipefail
dir=${TESSERA_CLUSTER_DIR:-/run/tessera-cluster}
net=${TESSERA_CLUSTER_NET:-10.250.0}
ns_prefix=${TESSERA_CLUSTER_NS:-tscl-} # names of its namespaces: PREFIX head, PREFIX n1, ...
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

die() { echo "jobs/cluster: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" -eq 0 ] || die "needs root (it creates network namespaces, veth links and a bridge)"; }
need_up() { [ -s "$dir/nodes" ] || die "no cluster is up ($dir/nodes missing): jobs/cluster/up N first"; }
nodes() { awk '{print $1}' "$dir/nodes"; }
ns_of() { echo "$ns_prefix$1"; }
# run CMD in NODE's network and UTS namespaces
in_node() {
    local node=$1
    shift
    [ -e "/var/run/netns/$(ns_of "$node")" ] || die "no node '$node' (nodes: head $(nodes | tr '\n' ' '))"
    UCX_TLS=${UCX_TLS:-^cma} nsenter --net="/var/run/netns/$(ns_of "$node")" --uts="$dir/uts/$node" \
        --ipc="$dir/ipc/$node" "$@"
}

cmd_down() {
    need_root
    local n
    [ -f "$dir/slurm.pids" ] && xargs -r kill -9 <"$dir/slurm.pids" 2>/dev/null
    for n in $( (ls /var/run/netns 2>/dev/null | sed -n "s/^$ns_prefix//p")); do
        ip netns pids "$ns_prefix$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
    done
    sleep 0.2
    for n in $( (ls /var/run/netns 2>/dev/null | sed -n "s/^$ns_prefix//p")); do
        ip netns pids "$ns_prefix$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$ns_prefix$n" 2>/dev/null || echo "jobs/cluster: could not delete namespace $ns_prefix$n" >&2
    done
    for f in "$dir"/uts/* "$dir"/ipc/*; do
        [ -e "$f" ] || continue
        umount "$f" 2>/dev/null
        rm -f "$f"
    done
    rm -rf "$dir"
}

# burst of tbf: 10 ms at the rate, at least 64 KiB
burst_of() {
    local r=$1 bits
    case $r in
    *gbit) bits=$(awk "BEGIN{print ${r%gbit} * 1e9}") ;;
    *mbit) bits=$(awk "BEGIN{print ${r%mbit} * 1e6}") ;;
    *kbit) bits=$(awk "BEGIN{print ${r%kbit} * 1e3}") ;;
    *) die "--link $r: give the rate as NNkbit, NNmbit or NNgbit" ;;
    esac
    awk "BEGIN{b = $bits / 8 / 100; if (b < 65536) b = 65536; printf \"%d\", b}"
}

cmd_up() {
    need_root
    local N=${1:-}
    shift || true
    [[ $N =~ ^[1-9][0-9]*$ ]] && [ "$N" -le 200 ] || die "usage: jobs/cluster/up N [--ranks-per-node R|R1,R2,...] [--link RATE] (N: 1..200 nodes)"
    local rpn=1 link=
    while [ $# -gt 0 ]; do
        case $1 in
        --ranks-per-node) rpn=${2:-}; shift 2 || die "--ranks-per-node needs a value" ;;
        --link) link=${2:-}; shift 2 || die "--link needs a rate, e.g. 1gbit" ;;
        *) die "up: unexpected argument '$1'" ;;
        esac
    done
    local -a per
    IFS=, read -r -a per <<<"$rpn"
    if [ ${#per[@]} -eq 1 ]; then
        local i
        for ((i = 1; i < N; i++)); do per+=("${per[0]}"); done
    fi
    [ ${#per[@]} -eq "$N" ] || die "--ranks-per-node $rpn: one count, or one per node ($N)"
    local r
    for r in "${per[@]}"; do [[ $r =~ ^[1-9][0-9]*$ ]] || die "--ranks-per-node $rpn: counts must be positive integers"; done
    local burst=
    [ -n "$link" ] && burst=$(burst_of "$link")
    for t in ip nsenter unshare tc mpiexec.mpich; do command -v $t >/dev/null || die "$t is missing (Debian: iproute2, util-linux, mpich)"; done
    [ -e "$dir/nodes" ] && die "a cluster is up already ($dir): jobs/cluster/down first"
    ls /var/run/netns 2>/dev/null | grep -q "^$ns_prefix" && die "namespaces $ns_prefix* exist (a cluster left behind?): jobs/cluster/down first"
    trap 'echo "jobs/cluster: up failed or was interrupted; tearing down what it made" >&2; cmd_down; exit 1' ERR INT TERM
    mkdir -p "$dir/uts" "$dir/ipc"
    chmod 755 "$dir"
    # the head: the bridge and the login node's address
    ip netns add "$(ns_of head)"
    ip -n "$(ns_of head)" link set lo up
    ip -n "$(ns_of head)" link add br0 type bridge
    ip -n "$(ns_of head)" link set br0 up
    ip -n "$(ns_of head)" addr add "$net.1/24" dev br0
    touch "$dir/uts/head" "$dir/ipc/head"
    unshare --uts="$dir/uts/head" hostname head
    unshare --ipc="$dir/ipc/head" true
    : >"$dir/nodes"
    local hosts=
    for ((i = 1; i <= N; i++)); do
        local node=n$i addr=$net.$((10 + i)) ns
        ns=$(ns_of $node)
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip link add "v$node" netns "$(ns_of head)" type veth peer name eth0 netns "$ns"
        ip -n "$(ns_of head)" link set "v$node" master br0 up
        ip -n "$ns" addr add "$addr/24" dev eth0
        ip -n "$ns" link set eth0 up
        if [ -n "$link" ]; then # both directions: the node's egress and the head's towards the node
            ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$link" burst "$burst" latency 100ms
            ip netns exec "$(ns_of head)" tc qdisc add dev "v$node" root tbf rate "$link" burst "$burst" latency 100ms
        fi
        touch "$dir/uts/$node" "$dir/ipc/$node"
        unshare --uts="$dir/uts/$node" hostname "$node"
        unshare --ipc="$dir/ipc/$node" true
        echo "$node $addr ${per[$((i - 1))]}" >>"$dir/nodes"
        hosts="$hosts${hosts:+,}$node:${per[$((i - 1))]}"
    done
    echo "$hosts" >"$dir/hosts"
    echo "${link:-unshaped}" >"$dir/link"
    # hydra's launcher: "ssh [options] HOST COMMAND" enters HOST's namespaces. A
    # node that died (jobs/cluster/kill) answers as a real one would: nothing,
    # so the stand-in behaves as an ssh client whose server vanished, with
    # ServerAliveInterval=5, ServerAliveCountMax=3: it gives up after 15 s
    # (exit 255) instead of telling mpiexec at once that the proxy is gone.
    cat >"$dir/ssh" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -[oplFiJ]) shift 2 ;; -*) shift ;; *) break ;; esac; done
host=\$1
shift
case \$host in $net.*) host=\$(awk -v a="\$host" '\$2 == a {print \$1}' "$dir/nodes") ;; esac
[ -e "/var/run/netns/$ns_prefix\$host" ] || { echo "jobs/cluster ssh: no node '\$host'" >&2; exit 255; }
nsenter --net="/var/run/netns/$ns_prefix\$host" --uts="$dir/uts/\$host" --ipc="$dir/ipc/\$host" sh -c "\$*"
rc=\$?
if [ -e "$dir/dead/\$host" ]; then
    sleep 15
    echo "Timeout, server \$host not responding." >&2
    exit 255
fi
exit \$rc
EOF
    chmod 755 "$dir/ssh"
    mkdir -p "$dir/dead"
    trap - ERR INT TERM
    echo "cluster up: $N node(s) ($hosts), links ${link:-not shaped}, head $net.1 (bridge br0); state in $dir"
}

cmd_mpiexec() {
    need_root
    need_up
    local hosts= node addr r only=
    if [ "${1:-}" = --nodes ]; then
        only=,${2:?--nodes needs a list, e.g. n1,n3},
        shift 2
    elif [ "${1:-}" = -hosts ]; then # a host list with counts (jobs/elastic.sh): used as given
        in_node head mpiexec.mpich -launcher ssh -launcher-exec "$dir/ssh" -iface br0 "$@"
        return
    fi
    while read -r node addr r; do
        if [ -n "$only" ]; then
            case $only in *",$node,"*) ;; *) continue ;; esac
        elif [ -e "$dir/dead/$node" ]; then
            continue
        fi
        hosts="$hosts${hosts:+,}$node:$r"
    done <"$dir/nodes"
    [ -n "$hosts" ] || die "mpiexec: no node to run on (all dead, or --nodes names none)"
    in_node head mpiexec.mpich -launcher ssh -launcher-exec "$dir/ssh" -iface br0 -hosts "$hosts" "$@"
}

cmd_on() {
    need_root
    need_up
    [ $# -ge 2 ] || die "usage: jobs/cluster/on NODE CMD..."
    in_node "$@"
}

cmd_link() {
    need_root
    need_up
    local node=${1:-} state=${2:-}
    grep -q "^$node " "$dir/nodes" || die "usage: jobs/cluster/link NODE down|up (nodes: $(nodes | tr '\n' ' '))"
    case $state in down | up) ;; *) die "usage: jobs/cluster/link NODE down|up" ;; esac
    ip -n "$(ns_of head)" link set "v$node" "$state"
    ip -n "$(ns_of "$node")" link set eth0 "$state"
}

cmd_kill() {
    need_root
    need_up
    local node=${1:-}
    grep -q "^$node " "$dir/nodes" || die "usage: jobs/cluster/kill NODE (nodes: $(nodes | tr '\n' ' '))"
    touch "$dir/dead/$node"
    cmd_link "$node" down
    ip netns pids "$(ns_of "$node")" | xargs -r kill -9
    echo "node $node killed: link down, $(ip netns pids "$(ns_of "$node")" | wc -l) process(es) left"
}

cmd_status() {
    need_up
    echo "head $net.1 (bridge br0), links $(cat "$dir/link")"
    local node addr r
    while read -r node addr r; do
        echo "$node $addr, $r rank(s) per node, link $(ip -n "$(ns_of "$node")" -br link show eth0 | awk '{print $2}')," \
            "$(ip netns pids "$(ns_of "$node")" | wc -l) process(es)$([ -e "$dir/dead/$node" ] && echo ", dead")"
    done <"$dir/nodes"
}

# ---- Slurm: slurmctld on the head, slurmd in every node (nsenter, not `ip netns
# exec`: that mounts a fresh /sys without the cgroup mounts, and slurmd stops)
cmd_slurm() {
    need_root
    need_up
    case ${1:-} in
    start) slurm_start ;;
    stop)
        [ -f "$dir/slurm.pids" ] && xargs -r kill <"$dir/slurm.pids" 2>/dev/null
        sleep 1
        [ -f "$dir/slurm.pids" ] && xargs -r kill -9 <"$dir/slurm.pids" 2>/dev/null
        rm -f "$dir/slurm.pids"
        ;;
    *) die "usage: jobs/cluster/slurm start|stop" ;;
    esac
}

slurm_start() {
    for t in slurmctld slurmd munged srun; do command -v $t >/dev/null || die "$t is missing (Debian: slurmctld, slurmd, munge, slurm-client)"; done
    [ -f "$dir/slurm.pids" ] && die "Slurm is running already on the cluster"
    local s=$dir/slurm node addr r cpus mem
    mkdir -p "$s/state" "$s/log"
    chmod 700 "$s"
    : >"$dir/slurm.pids"
    mungekey -c -k "$s/munge.key" 2>/dev/null || dd if=/dev/urandom of="$s/munge.key" bs=1 count=1024 2>/dev/null
    chmod 400 "$s/munge.key"
    munged --force --socket="$s/munge.sock" --key-file="$s/munge.key" --pid-file="$s/munged.pid" \
        --log-file="$s/munged.log" --seed-file="$s/munged.seed"
    for _ in $(seq 1 50); do [ -s "$s/munged.pid" ] && break; sleep 0.1; done
    cat "$s/munged.pid" >>"$dir/slurm.pids"
    cpus=$(nproc --all) # (plain nproc follows OMP_NUM_THREADS)
    mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9 / 4)}' /proc/meminfo)
    {
        cat <<EOF
ClusterName=tessera-cluster
SlurmctldHost=head($net.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket=$s/munge.sock,cred_expire=10
CredType=cred/munge
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool-%n
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd-%n.pid
SlurmctldLogFile=$s/log/slurmctld.log
SlurmdLogFile=$s/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_interval=2
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
MinJobAge=3600
KillWait=15
EOF
        while read -r node addr r; do
            echo "NodeName=$node NodeAddr=$addr CPUs=$cpus RealMemory=$mem State=UNKNOWN"
        done <"$dir/nodes"
        echo "PartitionName=cluster Nodes=$(nodes | paste -sd,) Default=YES MaxTime=INFINITE State=UP"
    } >"$s/slurm.conf"
    in_node head slurmctld -f "$s/slurm.conf" -i
    for _ in $(seq 1 50); do [ -s "$s/slurmctld.pid" ] && break; sleep 0.1; done
    cat "$s/slurmctld.pid" >>"$dir/slurm.pids"
    while read -r node addr r; do
        mkdir -p "$s/spool-$node"
        in_node "$node" slurmd -f "$s/slurm.conf" -N "$node"
        for _ in $(seq 1 50); do [ -s "$s/slurmd-$node.pid" ] && break; sleep 0.1; done
        cat "$s/slurmd-$node.pid" >>"$dir/slurm.pids"
    done <"$dir/nodes"
    local n want state
    want=$(wc -l <"$dir/nodes")
    for _ in $(seq 1 60); do
        n=$(SLURM_CONF=$s/slurm.conf in_node head sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
        [ "$n" -eq "$want" ] && break
        sleep 1
    done
    state=$(SLURM_CONF=$s/slurm.conf in_node head sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | paste -sd' ')
    [ "$n" -eq "$want" ] || die "Slurm: $n of $want nodes idle after 60 s ($state); logs in $s/log"
    echo "Slurm up: $state; SLURM_CONF=$s/slurm.conf (run the clients with jobs/cluster/on head)"
}

cmd=$(basename "$0")
[ "$cmd" = cluster.sh ] && { cmd=${1:-help}; shift || true; }
case $cmd in
up) cmd_up "$@" ;;
down) cmd_down ;;
mpiexec) cmd_mpiexec "$@" ;;
on) cmd_on "$@" ;;
link) cmd_link "$@" ;;
kill) cmd_kill "$@" ;;
status) cmd_status ;;
slurm) cmd_slurm "$@" ;;
*) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; [ "$cmd" = help ] || exit 1 ;;
esac
