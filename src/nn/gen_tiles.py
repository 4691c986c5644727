#!/usr/bin/env python3
"""Generates src/nn/conv_tiles.h: the register-blocked micro-kernels of
conv_kernels.c with one named variable per accumulator vector (GCC keeps
named vectors in registers; arrays of vectors it leaves in memory).
Run: python3 src/nn/gen_tiles.py > src/nn/conv_tiles.h
     python3 src/nn/gen_tiles.py bf16 > src/nn/conv_tiles_bf16.h
Shapes: gather/tgather tiles of WB output voxels x NV 16-lane vectors of
output channels (tg2, the transposed gather with k = s = 2: WB input
voxels x both kw taps); wgrad tiles of CB input channels x NV vectors.
The bf16 tiles (conv_bf16.c) have the same shapes; each step is a
bf16 dot product of pairs (vdpbf16ps: lane i += a[2i] b[2i] + a[2i+1]
b[2i+1]) written with macros (BW: load 16 pairs, BX: broadcast one pair,
BDP: accumulate), so that one text gives the native and the emulated
variant (BT() names them); BWSHIFT makes the pair (p[1], c[0]) of
the pairs c and p, BWZERO / BWSET a register window."""

import sys

GC = {1: [16, 8, 4, 2, 1], 2: [12, 8, 4, 2, 1], 4: [6, 4, 2, 1]}
TG = {1: [16, 8, 4, 2, 1], 2: [12, 8, 4, 2, 1], 4: [6, 4, 2, 1]}
TG2 = {1: [8, 4, 2, 1], 2: [6, 4, 2, 1], 4: [3, 2, 1]}  # k = s = 2: 2 taps x WB voxels x NV vectors
WG = {1: [16, 8, 4, 2, 1], 2: [12, 8, 4, 2, 1], 4: [6, 4, 2, 1]}
GK3 = {1: [16, 8, 4, 2, 1], 2: [12, 8, 4, 2, 1]}
WK3 = {1: [8, 4, 2, 1]}  # with 2 vectors (31 registers) it measured slower than WG
WK3B = {1: [8, 4, 2, 1], 2: [4, 2, 1]}  # bf16: also 4 channels x 2 vectors (31 registers)
# Without AVX-512 (an AVX2 build: 16 registers of 256 bits) a 16-float vector
# is two registers, and the tiles above spill most of their accumulators:
# the runners take these widths instead (the fp32 tiles: 2 WB NV
# accumulator registers, the weight or gradient vectors and a broadcast in
# 16; the emulated bf16 tiles hold each pair's halves as two vectors).
# Every output's sum runs in the same order whatever the width: the same bits.
GC_N = {1: [6, 4, 2, 1], 2: [2, 1], 4: [1]}
GK3_N = {1: [4, 2, 1], 2: [1]}
TG2_N = {1: [2, 1], 2: [1], 4: [1]}
WG_N = {1: [6, 4, 2, 1], 2: [2, 1], 4: [1]}
WK3_N = {1: [2, 1]}
GC_NB = {1: [4, 2, 1], 2: [1], 4: [1]}
GK3_NB = {1: [2, 1], 2: [1]}
TG2_NB = {1: [2, 1], 2: [1], 4: [1]}
WK3_NB = {1: [1], 2: [1]}


def widths(*tables):
    """the tile widths to generate per NV: those of every table"""
    out = {}
    for t in tables:
        for nv, ws in t.items():
            out[nv] = sorted(set(out.get(nv, [])) | set(ws), reverse=True)
    return out


def acc(i, j):
    return f"c{i}_{j}"


def store(o, WB, NV, ydst):
    """the accumulators to the WB voxels at ydst(i): nco channels, masked
    stores (ts_nn_vst_part, conv_impl.h) for a partial tile"""
    o.append(f"    if (nco == {16 * NV}) {{")
    for i in range(WB):
        for j in range(NV):
            o.append(f"        vst({ydst(i)} + {16 * j}, {acc(i, j)});")
    o.append("    } else {")
    for i in range(WB):
        o.append("        " + " ".join(f"ts_nn_vst_part({ydst(i)} + {16 * j}, {acc(i, j)}, nco - {16 * j});" for j in range(NV)))
    o.append("    }")


def gc(WB, NV):
    o = []
    o.append(f"static inline void gc_{WB}x{NV}(const gc_args *a, int r0, int ow0, int oc0, int yo, int nco, float *y, int ldy)")
    o.append("{")
    for j in range(NV):
        o.append(f"    const v16 b{j} = a->bias ? *(const v16 *)(a->bias + oc0 + {16 * j}) : (v16){{0}};")
    o.append("    v16 " + ", ".join(f"{acc(i, j)} = b{j}" for i in range(WB) for j in range(NV)) + ";")
    o.append("    const int k = a->k, C = a->C, sc = a->s * a->C, ocp = a->ocp;")
    o.append("    for (int kd = 0; kd < k; kd++)")
    o.append("        for (int kh = 0; kh < k; kh++) {")
    o.append("            const float *row = a->pl[kd] + (size_t)(r0 + kh) * a->rstride + (size_t)ow0 * sc;")
    o.append("            for (int kw = 0; kw < k; kw++) {")
    o.append("                const float *xr = row + kw * C;")
    o.append("                const float *wr = a->wp + (size_t)((kd * k + kh) * k + kw) * C * ocp + oc0;")
    o.append("                for (int c = 0; c < C; c++) {")
    o.append("                    const float *wc = wr + (size_t)c * ocp, *xc = xr + c;")
    for j in range(NV):
        o.append(f"                    const v16 w{j} = *(const v16 *)(wc + {16 * j});")
    for i in range(WB):
        o.append(f"                    {{ const float x = xc[{i} * sc]; " + " ".join(f"{acc(i, j)} += x * w{j};" for j in range(NV)) + " }")
    o.append("                }")
    o.append("            }")
    o.append("        }")
    store(o, WB, NV, lambda i: f"y + (size_t)(ow0 + {i}) * ldy + yo")
    o.append("}")
    return "\n".join(o)


def gk3(WB, NV):
    """gather for k = 3, stride 1: each broadcast input value feeds the three
    output voxels it touches (one per kw), so loads per FMA drop to about 1/3."""
    o = []
    o.append(f"static inline void gk3_{WB}x{NV}(const gc_args *a, int r0, int ow0, int oc0, int yo, int nco, float *y, int ldy)")
    o.append("{")
    for j in range(NV):
        o.append(f"    const v16 b{j} = a->bias ? *(const v16 *)(a->bias + oc0 + {16 * j}) : (v16){{0}};")
    o.append("    v16 " + ", ".join(f"{acc(i, j)} = b{j}" for i in range(WB) for j in range(NV)) + ";")
    o.append("    const int C = a->C, ocp = a->ocp;")
    o.append("    const size_t tapw = (size_t)C * ocp;")
    o.append("    for (int kd = 0; kd < 3; kd++)")
    o.append("        for (int kh = 0; kh < 3; kh++) {")
    o.append("            const float *row = a->pl[kd] + (size_t)(r0 + kh) * a->rstride + (size_t)ow0 * C;")
    o.append("            const float *wr = a->wp + (size_t)((kd * 3 + kh) * 3) * tapw + oc0;")
    o.append("            for (int c = 0; c < C; c++) {")
    o.append("                const float *wc = wr + (size_t)c * ocp, *xc = row + c;")
    for kw in range(3):
        for j in range(NV):
            o.append(f"                const v16 w{kw}_{j} = *(const v16 *)(wc + {kw} * tapw + {16 * j});")
    for jx in range(WB + 2):
        parts = []
        for kw in range(3):
            i = jx - kw
            if 0 <= i < WB:
                parts += [f"{acc(i, j)} += x * w{kw}_{j};" for j in range(NV)]
        o.append(f"                {{ const float x = xc[{jx} * C]; " + " ".join(parts) + " }")
    o.append("            }")
    o.append("        }")
    store(o, WB, NV, lambda i: f"y + (size_t)(ow0 + {i}) * ldy + yo")
    o.append("}")
    return "\n".join(o)


def tg(WB, NV):
    o = []
    o.append(f"static inline void tg_{WB}x{NV}(const float *xr, const float *wr, int C, int ocp, int s, int off, int iw0, int oc0,")
    o.append("                                int nco, float *y, int ldy)")
    o.append("{")
    for i in range(WB):
        o.append(f"    float *y{i} = y + (size_t)((iw0 + {i}) * s + off) * ldy + oc0;")
    o.append("    v16 " + ", ".join(acc(i, j) for i in range(WB) for j in range(NV)) + ";")
    o.append(f"    if (nco == {16 * NV}) {{")
    for i in range(WB):
        o.append("        " + " ".join(f"{acc(i, j)} = vld(y{i} + {16 * j});" for j in range(NV)))
    o.append("    } else {")
    for i in range(WB):
        o.append("        " + " ".join(f"{acc(i, j)} = ts_nn_vld_part(y{i} + {16 * j}, nco - {16 * j});" for j in range(NV)))
    o.append("    }")
    o.append("    for (int c = 0; c < C; c++) {")
    o.append("        const float *wc = wr + (size_t)c * ocp + oc0, *xc = xr + (size_t)iw0 * C + c;")
    for j in range(NV):
        o.append(f"        const v16 w{j} = *(const v16 *)(wc + {16 * j});")
    for i in range(WB):
        o.append(f"        {{ const float x = xc[{i} * C]; " + " ".join(f"{acc(i, j)} += x * w{j};" for j in range(NV)) + " }")
    o.append("    }")
    store(o, WB, NV, lambda i: f"y{i}")
    o.append("}")
    return "\n".join(o)


def wg(CB, NV):
    o = []
    o.append(f"static inline void wg_{CB}x{NV}(const wg_args *a, int kd, int kh, int kw, int c0, int oc0)")
    o.append("{")
    o.append("    const int C = a->C, sc = a->s * a->C, ldg = a->ldg, ocp = a->ocp;")
    o.append("    float *dwt = a->dw + ((size_t)((kd * a->k + kh) * a->k + kw) * C + c0) * ocp + oc0;")
    o.append("    v16 " + ", ".join(f"{acc(c, j)} = *(v16 *)(dwt + {c} * (size_t)ocp + {16 * j})" for c in range(CB) for j in range(NV)) + ";")
    o.append("    for (int q = 0; q < a->np * a->nr; q++) { /* plane q / nr, row q % nr of the item */")
    o.append("        const int pl = q / a->nr, r = q % a->nr;")
    o.append("        const float *xr = a->planes[pl * a->s + kd] + (size_t)(r * a->s + kh) * a->rstride + kw * C + c0;")
    o.append("        const float *gr = a->gy + (size_t)q * a->OW * ldg + oc0;")
    o.append("        for (int ow = 0; ow < a->OW; ow++) {")
    o.append("            const float *gv = gr + (size_t)ow * ldg, *xv = xr + (size_t)ow * sc;")
    for j in range(NV):
        o.append(f"            const v16 g{j} = vld(gv + {16 * j});")
    for c in range(CB):
        o.append(f"            {{ const float x = xv[{c}]; " + " ".join(f"{acc(c, j)} += x * g{j};" for j in range(NV)) + " }")
    o.append("        }")
    o.append("    }")
    for c in range(CB):
        o.append("    " + " ".join(f"*(v16 *)(dwt + {c} * (size_t)ocp + {16 * j}) = {acc(c, j)};" for j in range(NV)))
    o.append("}")
    return "\n".join(o)


def wk3(CB, NV):
    """weight gradient for k = 3, stride 1, all three kw taps of (kd, kh) at
    once: input value x[j] meets g[j], g[j-1], g[j-2] (a sliding window of
    output-gradient vectors), so each broadcast feeds 3 NV FMAs."""
    o = []
    o.append(f"static inline void wk3_{CB}x{NV}(const wg_args *a, int kd, int kh, int c0, int oc0)")
    o.append("{")
    o.append("    const int C = a->C, ldg = a->ldg, ocp = a->ocp, OW = a->OW;")
    o.append("    float *dwt = a->dw + ((size_t)((kd * 3 + kh) * 3) * C + c0) * ocp + oc0;")
    o.append("    const size_t tapw = (size_t)C * ocp;")
    names = []
    for kw in range(3):
        for c in range(CB):
            for j in range(NV):
                names.append(f"a{kw}_{c}_{j} = *(v16 *)(dwt + {kw} * tapw + {c} * (size_t)ocp + {16 * j})")
    o.append("    v16 " + ", ".join(names) + ";")
    o.append("    for (int q = 0; q < a->np * a->nr; q++) {")
    o.append("        const int pl = q / a->nr, r = q % a->nr;")
    o.append("        const float *xr = a->planes[pl + kd] + (size_t)(r + kh) * a->rstride + c0;")
    o.append("        const float *gr = a->gy + (size_t)q * OW * ldg + oc0;")
    o.append("        v16 " + ", ".join(f"m1_{j} = (v16){{0}}, m2_{j} = (v16){{0}}" for j in range(NV)) + ";")
    o.append("        for (int jx = 0; jx < OW + 2; jx++) {")
    for j in range(NV):
        o.append(f"            const v16 g0_{j} = jx < OW ? vld(gr + (size_t)jx * ldg + {16 * j}) : (v16){{0}};")
    o.append("            const float *xv = xr + (size_t)jx * C;")
    for c in range(CB):
        parts = []
        for j in range(NV):
            parts += [f"a0_{c}_{j} += x * g0_{j};", f"a1_{c}_{j} += x * m1_{j};", f"a2_{c}_{j} += x * m2_{j};"]
        o.append(f"            {{ const float x = xv[{c}]; " + " ".join(parts) + " }")
    for j in range(NV):
        o.append(f"            m2_{j} = m1_{j}; m1_{j} = g0_{j};")
    o.append("        }")
    o.append("    }")
    for kw in range(3):
        for c in range(CB):
            o.append("    " + " ".join(f"*(v16 *)(dwt + {kw} * tapw + {c} * (size_t)ocp + {16 * j}) = a{kw}_{c}_{j};" for j in range(NV)))
    o.append("}")
    return "\n".join(o)


def tg2(WB, NV):
    """transposed gather for k = s = 2 (padding 0): the two kw taps of WB
    input voxels at once, input voxel iw writing output voxels 2 iw and
    2 iw + 1 (each output voxel gets one tap), so each broadcast feeds 2 NV
    FMAs; the sums start from the bias (b: ocp floats, zeros where none),
    the products in channel order as tg's: the same bits"""
    o = []
    o.append(f"static inline void tg2_{WB}x{NV}(const float *xr, const float *wr, const float *b, int C, int ocp, int iw0, int oc0,")
    o.append("                                 int nco, float *y, int ldy)")
    o.append("{")
    for j in range(NV):
        o.append(f"    const v16 b{j} = vld(b + oc0 + {16 * j});")
    o.append("    v16 " + ", ".join(f"{acc(t * WB + i, j)} = b{j}" for t in range(2) for i in range(WB) for j in range(NV)) + ";")
    o.append("    const size_t tapw = (size_t)C * ocp;")
    o.append("    for (int c = 0; c < C; c++) {")
    o.append("        const float *wc = wr + (size_t)c * ocp + oc0, *xc = xr + (size_t)iw0 * C + c;")
    for t in range(2):
        for j in range(NV):
            o.append(f"        const v16 w{t}_{j} = vld(wc + {t} * tapw + {16 * j});")
    for i in range(WB):
        o.append(f"        {{ const float x = xc[{i} * C]; " +
                 " ".join(f"{acc(t * WB + i, j)} += x * w{t}_{j};" for t in range(2) for j in range(NV)) + " }")
    o.append("    }")
    store(o, 2 * WB, NV, lambda q: f"y + (size_t)(2 * (iw0 + {q % WB}) + {q // WB}) * ldy + oc0")
    o.append("}")
    return "\n".join(o)


def run_loops(o, sizes, narrow, NV, call, loopvar, hi, wide, name):
    """the runner's loops: the wide widths where `wide` (a preprocessor
    condition) holds, else the narrow ones"""
    def loops(ws):
        for wb in ws:
            o.append(f"    for (; {loopvar} + {wb} <= {hi}; {loopvar} += {wb}) {name(wb)}({call});")
    if sizes[NV] == narrow[NV]:
        loops(sizes[NV])
        return
    o.append(f"#if {wide}")
    loops(sizes[NV])
    o.append("#else")
    loops(narrow[NV])
    o.append("#endif")


def runner(kind, sizes, narrow, NV, sig, call, loopvar, lo, hi):
    o = [f"static void {kind}_run_{NV}({sig})", "{", f"    int {loopvar} = {lo};"]
    run_loops(o, sizes, narrow, NV, call, loopvar, hi, "TS_NN_WIDE_REGS", lambda wb: f"{kind}_{wb}x{NV}")
    o.append("}")
    return "\n".join(o)


def main():
    print("/* Generated by src/nn/gen_tiles.py: do not edit. Register-blocked micro-kernels")
    print(" * of conv_kernels.c (included there, after the gc_args / wg_args types). */")
    for NV, wbs in widths(GC, GC_N).items():
        for wb in wbs:
            print(gc(wb, NV) + "\n")
        print(runner("gc", GC, GC_N, NV, "const gc_args *a, int r0, int OW, int oc0, int yo, int nco, float *y, int ldy",
                     "a, r0, ow, oc0, yo, nco, y, ldy", "ow", "0", "OW") + "\n")
    for NV, wbs in widths(GK3, GK3_N).items():
        for wb in wbs:
            print(gk3(wb, NV) + "\n")
        print(runner("gk3", GK3, GK3_N, NV, "const gc_args *a, int r0, int OW, int oc0, int yo, int nco, float *y, int ldy",
                     "a, r0, ow, oc0, yo, nco, y, ldy", "ow", "0", "OW") + "\n")
    for NV, wbs in widths(TG, GC_N).items():
        for wb in wbs:
            print(tg(wb, NV) + "\n")
        print(runner("tg", TG, GC_N, NV, "const float *xr, const float *wr, int C, int ocp, int s, int off, int lo, int hi, int oc0, int nco, float *y, int ldy",
                     "xr, wr, C, ocp, s, off, iw, oc0, nco, y, ldy", "iw", "lo", "hi") + "\n")
    for NV, wbs in widths(TG2, TG2_N).items():
        for wb in wbs:
            print(tg2(wb, NV) + "\n")
        print(runner("tg2", TG2, TG2_N, NV, "const float *xr, const float *wr, const float *b, int C, int ocp, int W, int oc0, int nco, float *y, int ldy",
                     "xr, wr, b, C, ocp, iw, oc0, nco, y, ldy", "iw", "0", "W") + "\n")
    for NV, cbs in widths(WK3, WK3_N).items():
        for cb in cbs:
            print(wk3(cb, NV) + "\n")
        print(runner("wk3", WK3, WK3_N, NV, "const wg_args *a, int kd, int kh, int oc0",
                     "a, kd, kh, c, oc0", "c", "0", "a->C") + "\n")
    for NV, cbs in widths(WG, WG_N).items():
        for cb in cbs:
            print(wg(cb, NV) + "\n")
        print(runner("wg", WG, WG_N, NV, "const wg_args *a, int kd, int kh, int kw, int oc0",
                     "a, kd, kh, kw, c, oc0", "c", "0", "a->C") + "\n")


# ---------------------------------------------------------------- bf16 tiles
# Pairs are 32-bit words (two bf16). gather/tgather: pairs of consecutive
# input channels (C counts pairs); wgrad: pairs of output voxels (ow, ow+1),
# see ts_bf16_wg_args in conv_impl.h.



def bias_init(o, WB, NV):
    for j in range(NV):
        o.append(f"    const v16 b{j} = a->bias ? *(const v16 *)(a->bias + oc0 + {16 * j}) : (v16){{0}};")
    o.append("    v16 " + ", ".join(f"{acc(i, j)} = b{j}" for i in range(WB) for j in range(NV)) + ";")


def gcb(WB, NV):
    o = [f"BATTR void BT(gcb_{WB}x{NV})(const ts_bf16_gc_args *a, int r0, int ow0, int oc0, int yo, int nco, float *y, int ldy)", "{"]
    bias_init(o, WB, NV)
    o.append("    const int k = a->k, C = a->C, sc = a->s * a->C, ocp = a->ocp;")
    o.append("    for (int kd = 0; kd < k; kd++)")
    o.append("        for (int kh = 0; kh < k; kh++) {")
    o.append("            const uint32_t *row = a->plane[kd] + (size_t)(r0 + kh) * a->rstride + (size_t)ow0 * sc;")
    o.append("            for (int kw = 0; kw < k; kw++) {")
    o.append("                const uint32_t *xr = row + kw * C;")
    o.append("                const uint32_t *wr = a->wp + (size_t)((kd * k + kh) * k + kw) * C * ocp + oc0;")
    o.append("                for (int c = 0; c < C; c++) {")
    o.append("                    const uint32_t *wc = wr + (size_t)c * ocp, *xc = xr + c;")
    for j in range(NV):
        o.append(f"                    BW(w{j}, wc + {16 * j});")
    for i in range(WB):
        o.append(f"                    {{ BX(x, xc + {i} * sc); " + " ".join(f"BDP({acc(i, j)}, x, w{j});" for j in range(NV)) + " }")
    o.append("                }")
    o.append("            }")
    o.append("        }")
    store(o, WB, NV, lambda i: f"y + (size_t)(ow0 + {i}) * ldy + yo")
    o.append("}")
    return "\n".join(o)


def gk3b(WB, NV):
    o = [f"BATTR void BT(gk3b_{WB}x{NV})(const ts_bf16_gc_args *a, int r0, int ow0, int oc0, int yo, int nco, float *y, int ldy)", "{"]
    bias_init(o, WB, NV)
    o.append("    const int C = a->C, ocp = a->ocp;")
    o.append("    const size_t tapw = (size_t)C * ocp;")
    o.append("    for (int kd = 0; kd < 3; kd++)")
    o.append("        for (int kh = 0; kh < 3; kh++) {")
    o.append("            const uint32_t *row = a->plane[kd] + (size_t)(r0 + kh) * a->rstride + (size_t)ow0 * C;")
    o.append("            const uint32_t *wr = a->wp + (size_t)((kd * 3 + kh) * 3) * tapw + oc0;")
    o.append("            for (int c = 0; c < C; c++) {")
    o.append("                const uint32_t *wc = wr + (size_t)c * ocp, *xc = row + c;")
    for kw in range(3):
        for j in range(NV):
            o.append(f"                BW(w{kw}_{j}, wc + {kw} * tapw + {16 * j});")
    for jx in range(WB + 2):
        parts = []
        for kw in range(3):
            i = jx - kw
            if 0 <= i < WB:
                parts += [f"BDP({acc(i, j)}, x, w{kw}_{j});" for j in range(NV)]
        o.append(f"                {{ BX(x, xc + {jx} * C); " + " ".join(parts) + " }")
    o.append("            }")
    o.append("        }")
    store(o, WB, NV, lambda i: f"y + (size_t)(ow0 + {i}) * ldy + yo")
    o.append("}")
    return "\n".join(o)


def tgb(WB, NV):
    o = [f"BATTR void BT(tgb_{WB}x{NV})(const uint32_t *xr, const uint32_t *wr, int C, int ocp, int s, int off, int iw0, int oc0,",
         "                                int nco, float *y, int ldy)", "{"]
    for i in range(WB):
        o.append(f"    float *y{i} = y + (size_t)((iw0 + {i}) * s + off) * ldy + oc0;")
    o.append("    v16 " + ", ".join(acc(i, j) for i in range(WB) for j in range(NV)) + ";")
    o.append(f"    if (nco == {16 * NV}) {{")
    for i in range(WB):
        o.append("        " + " ".join(f"{acc(i, j)} = vld(y{i} + {16 * j});" for j in range(NV)))
    o.append("    } else {")
    for i in range(WB):
        o.append("        " + " ".join(f"{acc(i, j)} = ts_nn_vld_part(y{i} + {16 * j}, nco - {16 * j});" for j in range(NV)))
    o.append("    }")
    o.append("    for (int c = 0; c < C; c++) {")
    o.append("        const uint32_t *wc = wr + (size_t)c * ocp + oc0, *xc = xr + (size_t)iw0 * C + c;")
    for j in range(NV):
        o.append(f"        BW(w{j}, wc + {16 * j});")
    for i in range(WB):
        o.append(f"        {{ BX(x, xc + {i} * C); " + " ".join(f"BDP({acc(i, j)}, x, w{j});" for j in range(NV)) + " }")
    o.append("    }")
    store(o, WB, NV, lambda i: f"y{i}")
    o.append("}")
    return "\n".join(o)


def tg2b(WB, NV):
    """bf16 tg2: the two kw taps of WB input voxels (C channel pairs), from the bias"""
    o = [f"BATTR void BT(tg2b_{WB}x{NV})(const uint32_t *xr, const uint32_t *wr, const float *b, int C, int ocp, int iw0, int oc0,",
         "                                 int nco, float *y, int ldy)", "{"]
    for j in range(NV):
        o.append(f"    const v16 b{j} = *(const v16 *)(b + oc0 + {16 * j});")
    o.append("    v16 " + ", ".join(f"{acc(t * WB + i, j)} = b{j}" for t in range(2) for i in range(WB) for j in range(NV)) + ";")
    o.append("    const size_t tapw = (size_t)C * ocp;")
    o.append("    for (int c = 0; c < C; c++) {")
    o.append("        const uint32_t *wc = wr + (size_t)c * ocp + oc0, *xc = xr + (size_t)iw0 * C + c;")
    for t in range(2):
        for j in range(NV):
            o.append(f"        BW(w{t}_{j}, wc + {t} * tapw + {16 * j});")
    for i in range(WB):
        o.append(f"        {{ BX(x, xc + {i} * C); " + " ".join(f"BDP({acc(t * WB + i, j)}, x, w{t}_{j});" for t in range(2) for j in range(NV)) + " }")
    o.append("    }")
    store(o, 2 * WB, NV, lambda q: f"y + (size_t)(2 * (iw0 + {q % WB}) + {q // WB}) * ldy + oc0")
    o.append("}")
    return "\n".join(o)


def wgb(CB, NV):
    """one tap kw: sum over output-voxel pairs m of x pair (x[col], x[col + s])
    times g pair (g[2m], g[2m+1]) (e = 0) or (g[2m-1], g[2m]) (e = 1, made
    from entries m - 1 and m); see ts_bf16_wg_args"""
    o = [f"BATTR void BT(wgb_{CB}x{NV})(const ts_bf16_wg_args *a, int kd, int kh, int kw, int c0, int oc0)", "{"]
    o.append("    const int C = a->C, s = a->s, ocp = a->ocp, nm = a->nm, sc = a->s * a->C;")
    o.append("    const int blk = kw / (2 * s), rem = kw % (2 * s), e = rem >= s, r = rem - e * s;")
    o.append("    float *dwt = a->dw + ((size_t)((kd * a->k + kh) * a->k + kw) * C + c0) * ocp + oc0;")
    o.append("    v16 " + ", ".join(f"{acc(c, j)} = *(v16 *)(dwt + {c} * (size_t)ocp + {16 * j})" for c in range(CB) for j in range(NV)) + ";")
    o.append("    for (int q = 0, pl = 0, rr = 0; q < a->np * a->nr; q++, rr = rr + 1 == a->nr ? (pl++, 0) : rr + 1) {")
    o.append("        /* plane pl = q / nr, row rr = q % nr of the item */")
    o.append("        const uint32_t *xr = a->plane[pl * s + kd] + (size_t)(rr * s + kh) * a->rstride + ((size_t)blk * s + r) * C + c0;")
    o.append("        const uint32_t *gr = a->g + (size_t)q * nm * ocp + oc0;")
    for e in (0, 1):
        o.append(f"        {'if (!e)' if e == 0 else 'else'}")
        o.append(f"            for (int m = 0; m < a->nm{e}; m++) {{")
        o.append("                const uint32_t *gv = gr + (size_t)m * ocp, *xv = xr + (size_t)m * sc;")
        for j in range(NV):
            if e == 0:
                o.append(f"                BW(g{j}, gv + {16 * j});")
            else:
                o.append(f"                BW(h{j}, gv + {16 * j});")
                o.append(f"                BW(p{j}, gv - ocp + {16 * j});")
                o.append(f"                BWSHIFT(g{j}, h{j}, p{j});")
        for c in range(CB):
            o.append(f"                {{ BX(x, xv + {c}); " + " ".join(f"BDP({acc(c, j)}, x, g{j});" for j in range(NV)) + " }")
        o.append("            }")
    o.append("    }")
    for c in range(CB):
        o.append("    " + " ".join(f"*(v16 *)(dwt + {c} * (size_t)ocp + {16 * j}) = {acc(c, j)};" for j in range(NV)))
    o.append("}")
    return "\n".join(o)


def wk3b(CB, NV):
    """k = 3, stride 1, the three kw taps of (kd, kh) at once: the x pair of
    slab columns (2m, 2m+1) meets (g[2m], g[2m+1]) (kw 0), (g[2m-1], g[2m])
    (kw 1) and (g[2m-2], g[2m-1]) (kw 2): entries m, m and m-1 shifted by
    half a pair, m - 1; each broadcast feeds 3 NV products."""
    o = [f"BATTR void BT(wk3b_{CB}x{NV})(const ts_bf16_wg_args *a, int kd, int kh, int c0, int oc0)", "{"]
    o.append("    const int C = a->C, ocp = a->ocp, nm = a->nm, nx = a->nx;")
    o.append("    float *dwt = a->dw + ((size_t)((kd * 3 + kh) * 3) * C + c0) * ocp + oc0;")
    o.append("    const size_t tapw = (size_t)C * ocp;")
    names = []
    for kw in range(3):
        for c in range(CB):
            for j in range(NV):
                names.append(f"a{kw}_{c}_{j} = *(v16 *)(dwt + {kw} * tapw + {c} * (size_t)ocp + {16 * j})")
    o.append("    v16 " + ", ".join(names) + ";")
    o.append("    for (int q = 0, pl = 0, rr = 0; q < a->np * a->nr; q++, rr = rr + 1 == a->nr ? (pl++, 0) : rr + 1) {")
    o.append("        const uint32_t *xr = a->plane[pl + kd] + (size_t)(rr + kh) * a->rstride + c0;")
    o.append("        const uint32_t *gr = a->g + (size_t)q * nm * ocp + oc0;")
    for j in range(NV):
        o.append(f"        BWZERO(gm{j});")
    o.append("        for (int m = 0; m < nx; m++) {")
    for j in range(NV):
        o.append(f"            BW(g0{j}, gr + (size_t)m * ocp + {16 * j});")
        o.append(f"            BWSHIFT(g1{j}, g0{j}, gm{j});")
    o.append("            const uint32_t *xv = xr + (size_t)m * C;")
    for c in range(CB):
        parts = []
        for j in range(NV):
            parts += [f"BDP(a0_{c}_{j}, x, g0{j});", f"BDP(a1_{c}_{j}, x, g1{j});", f"BDP(a2_{c}_{j}, x, gm{j});"]
        o.append(f"            {{ BX(x, xv + {c}); " + " ".join(parts) + " }")
    for j in range(NV):
        o.append(f"            BWSET(gm{j}, g0{j});")
    o.append("        }")
    o.append("    }")
    for kw in range(3):
        for c in range(CB):
            o.append("    " + " ".join(f"*(v16 *)(dwt + {kw} * tapw + {c} * (size_t)ocp + {16 * j}) = a{kw}_{c}_{j};" for j in range(NV)))
    o.append("}")
    return "\n".join(o)


def runner_b(kind, sizes, narrow, NV, sig, call, loopvar, lo, hi):
    o = [f"BATTR_RUN void BT({kind}_run_{NV})({sig})", "{", f"    int {loopvar} = {lo};"]
    run_loops(o, sizes, narrow, NV, call, loopvar, hi, "BWIDE", lambda wb: f"BT({kind}_{wb}x{NV})")
    o.append("}")
    return "\n".join(o)


def main_bf16():
    print("/* Generated by src/nn/gen_tiles.py bf16: do not edit. The bf16 micro-kernels")
    print(" * of conv_bf16.c, included there once per variant (BT, BATTR, BW, BX, BDP). */")
    for NV, wbs in widths(GC, GC_NB).items():
        for wb in wbs:
            print(gcb(wb, NV) + "\n")
        print(runner_b("gcb", GC, GC_NB, NV, "const ts_bf16_gc_args *a, int r0, int OW, int oc0, int yo, int nco, float *y, int ldy",
                       "a, r0, ow, oc0, yo, nco, y, ldy", "ow", "0", "OW") + "\n")
    for NV, wbs in widths(GK3, GK3_NB).items():
        for wb in wbs:
            print(gk3b(wb, NV) + "\n")
        print(runner_b("gk3b", GK3, GK3_NB, NV, "const ts_bf16_gc_args *a, int r0, int OW, int oc0, int yo, int nco, float *y, int ldy",
                       "a, r0, ow, oc0, yo, nco, y, ldy", "ow", "0", "OW") + "\n")
    for NV, wbs in widths(TG, GC_NB).items():
        for wb in wbs:
            print(tgb(wb, NV) + "\n")
        print(runner_b("tgb", TG, GC_NB, NV, "const uint32_t *xr, const uint32_t *wr, int C, int ocp, int s, int off, int lo, int hi, int oc0, int nco, float *y, int ldy",
                       "xr, wr, C, ocp, s, off, iw, oc0, nco, y, ldy", "iw", "lo", "hi") + "\n")
    for NV, wbs in widths(TG2, TG2_NB).items():
        for wb in wbs:
            print(tg2b(wb, NV) + "\n")
        print(runner_b("tg2b", TG2, TG2_NB, NV, "const uint32_t *xr, const uint32_t *wr, const float *b, int C, int ocp, int W, int oc0, int nco, float *y, int ldy",
                       "xr, wr, b, C, ocp, iw, oc0, nco, y, ldy", "iw", "0", "W") + "\n")
    for NV, cbs in widths(WK3B, WK3_NB).items():
        for cb in cbs:
            print(wk3b(cb, NV) + "\n")
        print(runner_b("wk3b", WK3B, WK3_NB, NV, "const ts_bf16_wg_args *a, int kd, int kh, int oc0",
                       "a, kd, kh, c, oc0", "c", "0", "a->C") + "\n")
    for NV, cbs in widths(WG, GC_NB).items():
        for cb in cbs:
            print(wgb(cb, NV) + "\n")
        print(runner_b("wgb", WG, GC_NB, NV, "const ts_bf16_wg_args *a, int kd, int kh, int kw, int oc0",
                       "a, kd, kh, kw, c, oc0", "c", "0", "a->C") + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["bf16"]:
        main_bf16()
    else:
        main()
