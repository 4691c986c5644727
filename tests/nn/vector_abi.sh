#!/bin/sh
# The bf16 kernels are AVX-512 code by a target attribute (src/nn/conv_bf16.c)
# and call vector helpers compiled for the build's own ISA (conv_impl.h,
# TS_NN_VINLINE). The two may meet only inlined: a helper left out of line
# takes its 64-byte vectors in memory while an AVX-512 caller passes them in
# registers, and stores garbage (it did, in a build without -march=native).
# This compiles the kernels' files for baseline x86-64 (no -march), as such a
# build does, and checks that no vector helper is left as a function of its own.
ts_cc=${TS_CC:-cc}
case $(uname -m) in
x86_64) ;;
*) echo "1..0 # SKIP not x86-64: the AVX-512 kernels are not compiled here"; exit 0 ;;
esac
command -v nm >/dev/null || { echo "1..0 # SKIP no nm (binutils) to list the objects' functions"; exit 0; }
d=$(mktemp -d "${TMPDIR:-/tmp}/tessera-vabi.XXXXXX")
trap 'rm -rf "$d"' EXIT
echo "1..4"
n=0
for f in conv_bf16 conv_kernels; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    if $ts_cc -std=gnu11 -O2 -fopenmp -Wno-psabi -I"$TS_BUILDDIR" -I"$TS_SRCDIR" $TS_CPPFLAGS \
        -c -o "$d/$f.o" "$TS_SRCDIR/src/nn/$f.c" 2>"$d/$f.err"; then
        echo "ok $n - $f.c compiles for baseline x86-64"
    else
        echo "not ok $n - $f.c does not compile for baseline x86-64:"; sed 's/^/# /' "$d/$f.err" | head -20
    fi
done
# something was compiled: the native bf16 kernels are in conv_bf16.o
bad=$(nm "$d/conv_bf16.o" "$d/conv_kernels.o" 2>/dev/null | awk '$2 == "t" || $2 == "T" {print $3}' |
    grep -E '^(ts_nn_vst_part|ts_nn_vld_part|ts_nn_pair_store|ts_nn_lanes|bx2|vld|vst)(\.|$)' | sort -u | tr '\n' ' ')
nat=$(nm "$d/conv_bf16.o" 2>/dev/null | grep -c '_nat')
if [ "$nat" -gt 0 ]; then echo "ok 3 - conv_bf16.o holds the AVX512-BF16 kernels ($nat functions *_nat)"
else echo "not ok 3 - no *_nat kernels in conv_bf16.o"; fi
if [ -z "$bad" ] && [ "$nat" -gt 0 ]; then echo "ok 4 - no vector helper left out of line"
else echo "not ok 4 - vector helpers left out of line (another calling convention than their AVX-512 callers): $bad"; fi
