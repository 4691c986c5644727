#!/bin/sh
# The bf16 kernel variant chosen at run time: amx where the CPU has AMX-BF16
# and AMX-TILE besides AVX512-BF16 (and the kernel grants the tile state:
# Linux 5.16 or later), avx512bf16 where it has AVX512-BF16 only
# (/proc/cpuinfo), and TESSERA_BF16_ISA=emulated / =avx512bf16 force the
# emulation / VDPBF16PS without AMX (read on first use). TAP.
t="${TS_BUILDDIR:-.}/tests/nn/test_layers"
echo "1..3"
has() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }
if has avx512_bf16 && has avx512bw && has avx512vl; then
    want=avx512bf16
    if has amx_bf16 && has amx_tile; then
        kv=$(uname -r | awk -F. '{print $1 * 100 + $2}')
        if [ "$kv" -ge 516 ]; then want=amx; else echo "# AMX in the CPU, but Linux $(uname -r) predates its permission call (5.16)"; fi
    fi
else
    want=emulated
fi
got=$(unset TESSERA_BF16_ISA; timeout 60 $t isa)
if [ "$got" = "$want" ]; then echo "ok 1 - bf16 kernels chosen for this CPU: $got"; else echo "not ok 1 - bf16 kernels: $got, expected $want"; fi
got=$(TESSERA_BF16_ISA=emulated timeout 60 $t isa)
if [ "$got" = emulated ]; then echo "ok 2 - TESSERA_BF16_ISA=emulated forces the emulation"; else echo "not ok 2 - TESSERA_BF16_ISA=emulated gave $got"; fi
got=$(TESSERA_BF16_ISA=avx512bf16 timeout 60 $t isa)
if [ "$want" = emulated ]; then
    if [ "$got" = emulated ]; then echo "ok 3 - TESSERA_BF16_ISA=avx512bf16 on a CPU without it: the emulation"; else echo "not ok 3 - TESSERA_BF16_ISA=avx512bf16 without the instruction gave $got"; fi
elif [ "$got" = avx512bf16 ]; then echo "ok 3 - TESSERA_BF16_ISA=avx512bf16 forces VDPBF16PS without AMX"
else echo "not ok 3 - TESSERA_BF16_ISA=avx512bf16 gave $got"; fi
