#!/usr/bin/env python3
"""Rewrites the .cu files of src/nn/cuda into C++ for the CUDA emulator
(tests/nn/cuda_emu.h): the CUDA headers replaced by the emulator's, each
launch `k<<<grid, block, shared, stream>>>(args);` by
`emu_launch(grid, block, shared, stream, [&] { k(args); });`, dynamic shared
memory by emu_dynamic_shared(), static shared arrays by static locals
poisoned at each block's start (emu_shared_poison), and the launchers renamed ts_cuk_* ->
tsemu_cuk_* through a header of #defines (so that a CUDA build's own
launchers in libtessera do not clash with them).

  cuda_emu.py OUT.h IN.cu OUT.cc [IN.cu OUT.cc ...] [--c FILE.c ...]
      (OUT.h: the renames of all, the C files' ts_cuda_* functions and
      context.c's too, so that C files such as conv_gemm.c compile against
      the emulator: tests/nn/cuda_emu_context.c)
  cuda_emu.py --full IN.cu OUT.cc
      (a build configured --with-cuda=emu: all of libtessera against the
      emulator, the launchers under their own names)

Fails, naming it, on a CUDA built-in the emulator does not provide."""
import re
import sys

KNOWN = {"__global__", "__device__", "__host__", "__shared__", "__syncthreads", "__half", "__nv_bfloat16",
         "__float2bfloat16_rn", "__bfloat162float", "__float2half_rn", "__half2float", "__FILE__", "__LINE__",
         "__restrict__", "__float2bfloat16", "__float2half", "__fmul_rn", "__fadd_rn"}


def split_top(s):
    """s split at the commas outside parentheses"""
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def kernel_start(src, j):
    """index where the kernel expression before src[j] ('<<<') starts: an identifier, maybe <template args>"""
    k = j
    while src[k - 1].isspace():
        k -= 1
    if src[k - 1] == ">":
        depth = 0
        while True:
            k -= 1
            if src[k] == ">":
                depth += 1
            elif src[k] == "<":
                depth -= 1
                if depth == 0:
                    break
        while src[k - 1].isspace():
            k -= 1
    while src[k - 1].isalnum() or src[k - 1] == "_":
        k -= 1
    return k


def matching_paren(src, i):
    """index just past the parenthesis that closes src[i] == '('"""
    depth = 0
    for k in range(i, len(src)):
        if src[k] == "(":
            depth += 1
        elif src[k] == ")":
            depth -= 1
            if depth == 0:
                return k + 1
    raise SystemExit("cuda_emu.py: unbalanced parentheses after a launch")


def rewrite(src, name, full=False):
    for word in sorted(set(re.findall(r"\b__\w+", src)) - KNOWN):
        raise SystemExit(f"cuda_emu.py: {name} uses {word}, which tests/nn/cuda_emu.h does not emulate")
    src, n_inc = re.subn(r"#include <(cuda_runtime|cuda_bf16|cuda_fp16)\.h>\n", "", src)
    head = '#include "tests/nn/cuda_emu.h"\n' + ('' if full else '#include "tests/nn/kernels_emu.h"\n')
    # __device__ is static here: an explicit specialization takes the template's linkage and may not repeat it
    src = re.sub(r"template <> __device__ ", "template <> ", src)
    src = re.sub(r"extern __shared__ (\w+) (\w+)\[\];", r"\1 *\2 = (\1 *)emu_dynamic_shared();", src)
    src = re.sub(r"__shared__ ([\w ]+?) (\w+)(\[[^\]]+\]);", r"static \1 \2\3; emu_shared_poison(\2, sizeof \2);", src)
    if "__shared__" in src:
        raise SystemExit(f"cuda_emu.py: a __shared__ declaration in {name} that it cannot rewrite")
    out, i, launches = [], 0, 0
    while True:
        j = src.find("<<<", i)
        if j < 0:
            out.append(src[i:])
            break
        k = kernel_start(src, j)
        kernel = re.sub(r"\s+", "", src[k:j])
        e = src.find(">>>", j)
        cfg = split_top(src[j + 3:e])
        if len(cfg) < 2 or len(cfg) > 4:
            raise SystemExit(f"cuda_emu.py: launch of {kernel} with {len(cfg)} configuration arguments")
        a = e + 3
        while src[a].isspace():
            a += 1
        if src[a] != "(":
            raise SystemExit(f"cuda_emu.py: launch of {kernel} without arguments")
        b = matching_paren(src, a)
        shared = cfg[2] if len(cfg) > 2 else "0"
        stream = cfg[3] if len(cfg) > 3 else "0"
        out.append(src[i:k])
        out.append(f"emu_launch(dim3({cfg[0]}), dim3({cfg[1]}), (size_t)({shared}), (cudaStream_t)({stream}), "
                   f"[&]() {{ {kernel}{src[a:b]}; }})")
        launches += 1
        i = b
    if not launches:
        raise SystemExit(f"cuda_emu.py: no launch found in {name}")
    return head + "".join(out), launches


# what src/nn/cuda/context.c and switches.c provide to the files compiled with the emulator
# (tests/nn/cuda_emu_context.c and switches.c itself)
CONTEXT = ["ts_cuda_nn_handles", "ts_cuda_scratch", "ts_cuda_prec_code", "ts_cuda_switch", "ts_cublas_lib_open"]


def main():
    args = sys.argv[1:]
    if args and args[0] == "--full":
        if len(args) != 3:
            raise SystemExit("usage: cuda_emu.py --full IN.cu OUT.cc")
        with open(args[1]) as f:
            cc, n = rewrite(f.read(), args[1], full=True)
        with open(args[2], "w") as f:
            f.write(f"// generated by tests/nn/cuda_emu.py from {args[1]} ({n} launches): do not edit\n")
            f.write(cc)
        return
    cfiles = [args[i + 1] for i in range(len(args) - 1) if args[i] == "--c"]
    args = [a for i, a in enumerate(args) if a != "--c" and (i == 0 or args[i - 1] != "--c")]
    if len(args) < 3 or len(args) % 2 != 1:
        raise SystemExit("usage: cuda_emu.py OUT.h IN.cu OUT.cc [IN.cu OUT.cc ...] [--c FILE.c ...]")
    names = set(CONTEXT)
    for cu, out in zip(args[1::2], args[2::2]):
        with open(cu) as f:
            src = f.read()
        names |= set(re.findall(r'extern "C" \w+(?: \*)? ?(ts_cu[ko]_\w+)\(', src))
        cc, n = rewrite(src, cu)
        with open(out, "w") as f:
            f.write(f"// generated by tests/nn/cuda_emu.py from {cu} ({n} launches): do not edit\n")
            f.write(cc)
    for c in cfiles:  # C files compiled against the emulator: their functions renamed too
        with open(c) as f:
            names |= set(re.findall(r"^int (ts_cuda_\w+)\(", f.read(), flags=re.M))
    with open(args[0], "w") as f:
        f.write("/* generated by tests/nn/cuda_emu.py: the functions of " + " ".join(args[1::2] + cfiles) +
                " and of context.c under the emulator's names */\n")
        f.write("#ifndef TS_TESTS_NN_KERNELS_EMU_H\n#define TS_TESTS_NN_KERNELS_EMU_H\n")
        for l in sorted(names):
            f.write(f"#define {l} tsemu_{l[3:]}\n")
        f.write("#endif\n")


if __name__ == "__main__":
    main()
