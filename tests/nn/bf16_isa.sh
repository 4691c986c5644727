#!/bin/sh
# The bf16 kernel variant chosen at run time: avx512bf16 exactly where the
# CPU has it (/proc/cpuinfo), and TESSERA_BF16_ISA=emulated forces the
# emulation (read on first use). TAP.
t="${TS_BUILDDIR:-.}/tests/nn/test_layers"
echo "1..2"
if grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo; then
    want=avx512bf16
else
    want=emulated
fi
got=$(unset TESSERA_BF16_ISA; timeout 60 $t isa)
if [ "$got" = "$want" ]; then echo "ok 1 - bf16 kernels chosen for this CPU: $got"; else echo "not ok 1 - bf16 kernels: $got, expected $want"; fi
got=$(TESSERA_BF16_ISA=emulated timeout 60 $t isa)
if [ "$got" = emulated ]; then echo "ok 2 - TESSERA_BF16_ISA=emulated forces the emulation"; else echo "not ok 2 - TESSERA_BF16_ISA=emulated gave $got"; fi
