#!/bin/sh
# `tessera bench io` against dd on the same file, in the same run: a
# synthetic dataset of 64 samples of 64^3 (one file, one chunk per sample),
# read once to put it in the page cache, then ROUNDS interleaved rounds of
# dd (sequential read of the whole file) and bench io (every sample read
# whole, checksums verified; then the loader: 64^3 patches, batch 2, with
# augmentation). Prints each round and the medians; docs/performance-io.md
# quotes the output.
#   jobs/bench/io_vs_dd.sh [ROUNDS] [RANKS]
# Environment: TESSERA (default build/tessera), DIR (scratch folder, default a
# fresh temporary one, removed at the end), DD_BS (dd block size, default 1M),
# MPIEXEC (default mpiexec.mpich).
set -eu
here=$(cd "$(dirname "$0")/../.." && pwd)
tessera=${TESSERA:-$here/build/tessera}
rounds=${1:-5}
np=${2:-1}
bs=${DD_BS:-1M}
mpiexec=${MPIEXEC:-mpiexec.mpich}
if [ -n "${DIR:-}" ]; then
    dir=$DIR
    mkdir -p "$dir"
else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/ts-io-dd.XXXXXX")
    trap 'rm -rf "$dir"' EXIT
fi
data=$dir/synth64.h5
if [ ! -f "$data" ]; then
    "$mpiexec" -n "$np" "$tessera" synth --out "$data" --count 64 --size 64 --seed 1 --chunk 64
fi
cfg=$dir/io.ini
printf '[data]\npath = %s\npatch = 64\n\n[train]\nbatch = 2\n' "$data" > "$cfg"
size=$(wc -c < "$data")
cat "$data" > /dev/null
cat "$data" > /dev/null
echo "file: $data ($size bytes), dd bs=$bs, bench io on $np rank(s), $rounds rounds"
printf '%-6s %12s %14s %8s %16s\n' round dd_GBps bench_io_GBps ratio loader_samples_s
: > "$dir/rounds"
r=1
while [ "$r" -le "$rounds" ]; do
    # dd: bytes and seconds from its summary line ("N bytes (...) copied, T s, ...")
    ddline=$(LC_ALL=C dd if="$data" of=/dev/null bs="$bs" 2>&1 | tail -n 1)
    ddbytes=$(echo "$ddline" | awk '{print $1}')
    dds=$(echo "$ddline" | sed 's/.*copied, \([0-9.e+-]*\) s.*/\1/')
    "$mpiexec" -n "$np" "$tessera" bench io "$cfg" --json "$dir/io.json" --repeat 3 --steps 20 > "$dir/io.out"
    io=$(tr -d ' \t\n' < "$dir/io.json" | sed 's/.*"read_GBps":\([0-9.e+-]*\).*/\1/')
    sps=$(tr -d ' \t\n' < "$dir/io.json" | sed 's/.*"samples_per_s":\([0-9.e+-]*\).*/\1/')
    awk -v r="$r" -v b="$ddbytes" -v s="$dds" -v io="$io" -v sps="$sps" 'BEGIN {
        dd = b / s / 1e9; printf "%-6d %12.3f %14.3f %8.2f %16.1f\n", r, dd, io, io / dd, sps }' | tee -a "$dir/rounds"
    r=$((r + 1))
done
sort -k4 -g "$dir/rounds" | awk '{ a[NR] = $4; d[NR] = $2; i[NR] = $3; s[NR] = $5 } END {
    m = int((NR + 1) / 2)
    printf "median ratio bench_io/dd: %.2f (rounds sorted by ratio; median round: dd %.3f GB/s, bench io %.3f GB/s, loader %.1f samples/s)\n",
        a[m], d[m], i[m], s[m] }'
