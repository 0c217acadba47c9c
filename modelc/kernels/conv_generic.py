"""The fallback convolution: any Conv (or ConvTranspose) the specialised templates do not take.

Grouped convolutions (C/group > 1), 1-d and 3-d convolutions, channel counts without a block,
plain layouts, explicit (also asymmetric) pads, strides and dilations, float32 or float64. Direct
loops, parallel over (image, output-channel tile, leading output coordinates, output-column
tile), with a register tile of output channels x output columns on a stack array. Inputs and
outputs may be plain or blocked (NCHW[b]c with a halo, through `layout.offset`); padding is
always handled by bounds, never by reading a halo: out-of-range input rows are skipped, and
along the row either the valid column range is computed per kernel column or the row is staged.
The fused elementwise epilogue (bias, activations, residual add ...) runs on each value before
it is stored; several outputs may be taken from the chain (e.g. before and after an activation).

Two formulations (knob `vector_axis`):
- "ow": the innermost loop runs along the output row, over `tile_ow` columns for `tile_oc`
  output channels that share each input load (acc[channel, column]). With `stage_row` (Conv)
  the input row a tile reads is first copied, zero-padded, into a stack buffer (phase-major at
  stride > 1), so the multiply-add loops have constant trip counts and no bounds (2x faster at
  stride 1; the strided copy loses at stride 2); without it each kernel column runs over its
  valid range of output columns.
- "oc" (Conv with a constant weight and 8k output channels per group, or a tile channel_tiles.py
  allows past them): conv2d's register tile,
  `tile_ow` columns x `tile_oc` channels, weights packed [K/tile_oc, Cg, *k, tile_oc], one
  broadcast input scalar per column times a channel vector; tiles touching the padding load
  their inputs through bounds checks (a separate path, so interior tiles have none).
`unroll_kw` writes the kernel-column loop out; on "oc" tiles the columns then share each input load.

ConvTranspose ("ow"): output columns are computed per phase (ow mod stride), so that for each
kernel column the input columns of a tile are contiguous; taps of the wrong phase are skipped.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import target
from .channel_tiles import PAIR, oc_possible, padded_tiles, wide_tile
from .codegen import ParallelItem, row_waste, shifted_start
from .conv_geometry import conv_geometry
from .expr import SUPPORTED, ctor, lit
from .intrinsics import calls_polynomial
from .layout import offset, strides
from .space import ConfigSpace
from .template import Kernel, Template, epilogue, epilogue_inputs, register, source
from .workload import Workload

OWT_CANDIDATES = [1, 2, 4, 6, 7, 8, 12, 14, 16, 28, 32, 56, 64, 112, 128]
OC_MAX_OWT = 16              # columns of a channel-vector tile (as conv2d's, written out)


@register
class ConvGeneric(Template):
    name = "conv_generic"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op not in ("Conv", "ConvTranspose") or len(a.args) < 2 or not a.args[0].startswith("i"):
            return False
        x = wl.spec(a.args[0])
        if len(x.shape) < 3 or x.dtype not in (np.float32, np.float64):
            return False
        if x.layout is not None and len(x.shape) != 4:
            return False
        if a.op == "Conv" and a.attrs.get("auto_pad", "NOTSET") != "NOTSET":
            return False
        for pos, ref in enumerate(a.args[1:3], 1):
            if not ref:
                if pos == 1:
                    return False
                continue
            if not (ref.startswith("i") or ref.startswith("p")):
                return False
            t = wl.spec(ref)
            if t.layout is not None or t.dtype != x.dtype:
                return False
        try:
            g = conv_geometry(wl)
        except Exception:
            return False
        out_shape = wl.spec(f"v{a.index}").shape
        for op in wl.epilogue:
            if op.op not in SUPPORTED or wl.spec(f"v{op.index}").shape != out_shape:
                return False
            for ref in op.args:
                if ref.startswith("p") and wl.params[ref].size != 1:
                    return False
                if ref.startswith("v") and "." in ref:
                    return False
        for t, v in zip(wl.outputs, wl.output_values):
            if not v or not v.startswith("v") or "." in v or t.shape != out_shape:
                return False
            if t.layout is not None and len(t.shape) != 4:
                return False
        if g.transpose and g.OW < g.strides[-1]:
            return False                       # a row shorter than the stride: empty phases
        return g.nd >= 1 and min(g.spatial_out) >= 1

    def space(self, wl: Workload) -> ConfigSpace:
        g = _geometry(wl)[0]
        tg = target.current()
        lanes = tg.lanes(4)
        floats = lanes * tg.max_tile_vectors      # a register tile's elements (counted as float32)
        ow = g.OW // (g.strides[-1] if g.transpose else 1)        # a transposed row runs per phase
        sp = ConfigSpace()
        owts = sorted({t for t in OWT_CANDIDATES if t <= ow} | ({ow} if ow <= 128 else set()))
        sp.define_knob("tile_ow", owts)
        sp.define_knob("tile_oc", [m for m in (1, 2, 4, 8, 16, 32) if g.Kg % m == 0] +
                       ([PAIR] if wide_tile(wl, g) else []) + padded_tiles(wl, g))
        sp.define_knob("vector_axis", ["ow", "oc"] if oc_possible(wl, g) else ["ow"])
        sp.define_annotate("unroll_kw", [False, True])
        # (staging only ever zero-pads the row)
        sp.define_knob("stage_row", [True, False] if not _unpadded(wl) and not g.transpose else [False])
        kw = g.KW

        def valid(cfg):
            if cfg["unroll_kw"] and not 1 < kw <= 16:           # (over one column: the same kernel)
                return False
            if cfg["vector_axis"] == "ow":
                return cfg["tile_oc"] <= 8 and cfg["tile_ow"] * cfg["tile_oc"] <= 1024
            return cfg["tile_oc"] >= 8 and cfg["tile_ow"] <= OC_MAX_OWT and \
                cfg["tile_ow"] * cfg["tile_oc"] <= floats and tg.tile_fits(cfg["tile_ow"], -(-cfg["tile_oc"] // lanes))
        sp.constraint = valid
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        """Channel vectors (as conv2d) when a group has 8k output channels, else whole rows."""
        g = _geometry(wl)[0]
        owts = space.knobs[0].values
        ow = owts[-1] if g.OW > 128 else g.OW // (g.strides[-1] if g.transpose else 1)
        waste = row_waste(ow)

        if "oc" in space.knobs[2].values:
            tg = target.current()
            lanes = tg.lanes(4)
            padded = [m for m in space.knobs[1].values if m > PAIR and g.Kg % m]
            # up to two vectors of channels per pixel (32 on AVX-512, 16 on AVX2), as conv2d: on
            # AVX2 32 channels were four vectors and one pixel per tile, and a 3-d conv 128 -> 128
            # on 8x28x28 ran 0.49 of that time in 4 pixels x 2 vectors (AMD EPYC Zen 4 compiling
            # for AVX2; 6 pixels spilled: 0.84)
            oct_ = max([m for m in space.knobs[1].values if 8 <= m <= max(2 * lanes, 16) and m not in padded]
                       or [m for m in space.knobs[1].values if m not in padded])
            if oct_ == PAIR and g.Kg % PAIR and padded and lanes > PAIR // 2:
                # a pair tile's halves are half vectors here, so each of its FMAs blends two
                # groups' inputs; a group's own tiles win (RegNetY-8GF's 3x3 over 4 groups of 56 on
                # 56x56: 6.6 ms as pairs, 4.0 in tiles of 32 channels, onnxruntime 4.0; AMD EPYC Zen 4)
                oct_ = min(padded)
            # about half the accumulator registers (14 vectors on AVX-512), never fewer than keep
            # the FMA pipes busy (8 on AVX2, whose half is 6), and a tile that leaves the registers
            # its weight vectors and broadcast need (tile_fits)
            vectors = -(-oct_ // lanes)
            want = min(max(tg.max_tile_vectors // 2, tg.accumulators_in_flight) // vectors, OC_MAX_OWT)
            fit = [t for t in owts if t <= OC_MAX_OWT and t * oct_ <= tg.max_tile_vectors * lanes
                   and tg.tile_fits(t, vectors)] or owts[:1]
            owt = min(fit, key=lambda t: (waste(t) > 0.15, abs(t - want), -t))
            return space.from_values({"tile_ow": owt, "tile_oc": oct_, "vector_axis": "oc",
                                      "unroll_kw": 1 < g.KW <= 7, "stage_row": space.knobs[4].values[0]})
        unroll = 1 < g.KW <= 7
        owt = min(owts, key=lambda t: (waste(t) > 0.15, t > 64, -t))
        oct_ = max(m for m in space.knobs[1].values if m <= 4)
        return space.from_values({"tile_ow": owt, "tile_oc": oct_, "vector_axis": "ow",
                                  "unroll_kw": unroll,
                                  "stage_row": space.knobs[4].values[0] and g.strides[-1] == 1})

    def build(self, wl: Workload, cfg) -> Kernel:
        g, flat = _geometry(wl)
        conv = wl.anchor
        dt = np.dtype(g.dtype)
        OWT, OCT, unroll, axis = cfg["tile_ow"], cfg["tile_oc"], cfg["unroll_kw"], cfg["vector_axis"]
        N, K, Cg, Kg, nd, TR = g.N, g.K, g.Cg, g.Kg, g.nd, g.transpose
        IS, OS, KS, S, D, P = g.spatial_in, g.spatial_out, g.kernel, g.strides, g.dilations, g.pads
        OW, W, KW, sw, dw, pw = OS[-1], IS[-1], KS[-1], S[-1], D[-1], P[-1]
        PH = sw if TR else 1                       # a transposed row is computed per phase mod sw
        OWT = max(1, min(OWT, OW // PH))
        NT = -(-(-(-OW // PH)) // OWT)
        # output-channel tiles: within a group, or a wide tile: two half-vector groups' channels
        # (pair), or past the last channel of an ungrouped conv
        padded = axis == "oc" and OCT > PAIR and Kg % OCT != 0
        pair = axis == "oc" and Kg % OCT != 0 and K != Kg and not padded
        KOg = -(-Kg // OCT)                        # a padded tile's per group: the last one part-empty
        KO = K // Kg * KOg if padded else -(-K // OCT)   # (a pair tile may run past K: padded channels)
        lead = nd - 1
        x_arg = int(conv.args[0][1:])
        X = f"in{x_arg}"
        x = wl.inputs[x_arg]
        xsw = x.layout[0] if x.layout else 1       # physical stride along W
        zero = lit(0, dt)
        T = OWT * OCT
        ksz, kstr = math.prod(KS), strides(KS)

        # kernel arguments: outputs, input, weight, bias, epilogue inputs (each once)
        args, dtypes, packs = [], [], {}
        for k, t in enumerate(wl.outputs):
            args.append(f"out{k}")
            dtypes.append(t.dtype)
        args.append(X)
        dtypes.append(x.dtype)

        def operand(ref, name, layout=None):
            if ref.startswith("i") and not wl.inputs[int(ref[1:])].const:
                if f"in{ref[1:]}" not in args:
                    args.append(f"in{ref[1:]}")
                    dtypes.append(dt)
                return f"in{ref[1:]}"
            args.append(name)
            dtypes.append(dt)
            packs[name] = (ref, layout)
            return name

        Wn = operand(conv.args[1], "w", "oc" if axis == "oc" else None)
        has_bias = len(conv.args) > 2 and bool(conv.args[2])
        Bn = operand(conv.args[2], "bias") if has_bias else None
        ops = wl.epilogue
        for k in epilogue_inputs(ops):
            if f"in{k}" not in args:
                args.append(f"in{k}")
                dtypes.append(wl.inputs[k].dtype)

        item = ParallelItem()
        body = [item.loop(N * KO * math.prod(OS[:-1]) * PH * NT), *item.take("t", NT)]
        if TR:
            body += item.take("ph", PH)
            body += [f"    j0 = {shifted_start(f't * {OWT}', f'({OW + PH - 1} - ph) // {PH}', OWT)}"]
        else:
            body += [f"    ow0 = {shifted_start(f't * {OWT}', OW, OWT)}"]
        for i in reversed(range(lead)):
            body += item.take(f"o{i}", OS[i])
        body += item.last("ko", KO, "n")
        body += [f"    grp = ko // {KOg}", f"    k0 = grp * {Kg} + ko % {KOg} * {OCT}"] if padded else \
            [f"    k0 = ko * {OCT}", f"    grp = k0 // {Kg}"]
        body += [
                 *([f"    grp2 = min((k0 + {OCT - 1}) // {Kg}, {K // Kg - 1})"] if pair else []),
                 f"    acc = carray(stack_empty({T}, {ctor(dt)}), {T})"]
        stage = axis == "ow" and not TR and cfg["stage_row"]
        Wp = (OWT - 1) * sw + (KW - 1) * dw + 1   # input columns a tile reads
        L = -(-Wp // sw)                           # staged phase-major: xbuf[u % sw, u // sw]
        if stage:
            body.append(f"    xbuf = carray(stack_empty({sw * L}, {ctor(dt)}), {sw * L})")
        if axis == "ow":                           # acc[m, r]
            for m in range(OCT):
                init = f"{Bn}[np.uintp(k0 + {m})]" if has_bias else zero
                body += [f"    b{m} = {init}",
                         f"    for r in range({OWT}):",
                         f"        acc[np.uintp({m * OWT} + r)] = b{m}"]
        else:                                      # acc[r, m]
            init = f"{Bn}[np.uintp({'ko * ' + str(OCT) if padded else 'k0'} + j)]" if has_bias else zero
            body += [f"    for j in range({OCT}):",
                     f"        bj = {init}"]
            body += [f"        acc[np.uintp({r * OCT} + j)] = bj" for r in range(OWT)]
            last = (OWT - 1) * sw + (KW - 1) * dw - pw      # input column of the tile's last tap
            body += [f"    inner = ow0 * {sw} >= {pw} and ow0 * {sw} < {W - last}"]
        body += [f"    for c in range({Cg}):",
                 f"        ci = grp * {Cg} + c"]
        if pair:
            body += [f"        ci2 = grp2 * {Cg} + c"]
        ind = 8
        for i in range(lead):
            pre = " " * ind
            body.append(f"{pre}for kd{i} in range({KS[i]}):")
            pre += "    "
            if TR:
                body += [f"{pre}q{i} = o{i} + {P[i]} - kd{i} * {D[i]}",
                         f"{pre}if q{i} < 0 or q{i} % {S[i]} != 0:",
                         f"{pre}    continue",
                         f"{pre}i{i} = q{i} // {S[i]}",
                         f"{pre}if i{i} >= {IS[i]}:",
                         f"{pre}    continue"]
            else:
                body += [f"{pre}i{i} = o{i} * {S[i]} + kd{i} * {D[i]} - {P[i]}",
                         f"{pre}if i{i} < 0 or i{i} >= {IS[i]}:",
                         f"{pre}    continue"]
            ind += 4
        pre = " " * ind
        xrow = offset(x.shape, x.layout, ["n", "ci", "0", "0"] if flat else
                      ["n", "ci"] + [f"i{i}" for i in range(lead)] + ["0"])
        tap = " + ".join([f"kd{i} * {kstr[i]}" for i in range(lead)] or ["0"])
        body.append(f"{pre}xrow = {xrow}")
        if pair:
            xrow2 = offset(x.shape, x.layout, ["n", "ci2", "0", "0"] if flat else
                           ["n", "ci2"] + [f"i{i}" for i in range(lead)] + ["0"])
            body.append(f"{pre}xrow2 = {xrow2}")
        if stage:
            ui = "u" if sw == 1 else f"u % {sw} * {L} + u // {sw}"
            body += [f"{pre}base = ow0 * {sw} - {pw}",
                     f"{pre}ulo = min(max(-base, 0), {Wp})",
                     f"{pre}uhi = max(min({W} - base, {Wp}), ulo)",
                     f"{pre}for u in range(ulo):",
                     f"{pre}    xbuf[np.uintp({ui})] = {zero}",
                     f"{pre}for u in range(uhi, {Wp}):",
                     f"{pre}    xbuf[np.uintp({ui})] = {zero}",
                     f"{pre}xs0 = xrow + base * {xsw}",
                     f"{pre}for u in range(ulo, uhi):",
                     f"{pre}    xbuf[np.uintp({ui})] = {X}[np.uintp(xs0 + u * {xsw})]"]
        if axis == "oc":                           # weight packed [K/OCT, Cg, *k, OCT]
            body.append(f"{pre}wrow = ((ko * {Cg} + c) * {ksz} + {tap}) * {OCT}")
        else:
            for m in range(OCT):
                if TR:   # weight [C, Kg, *k]
                    body.append(f"{pre}wr{m} = (ci * {Kg} + k0 + {m} - grp * {Kg}) * {ksz} + {tap}")
                else:    # weight [K, Cg, *k]
                    body.append(f"{pre}wr{m} = ((k0 + {m}) * {Cg} + c) * {ksz} + {tap}")

        def fmas(pre, xv, r):
            return [f"{pre}acc[np.uintp({m * OWT} + {r})] += {xv} * wv{m}" for m in range(OCT)]

        def column(pre, kw):
            """Multiply-adds of kernel column kw (a literal or the loop variable) into the tile."""
            if axis == "oc":
                rows = [("x", "xo")] + ([("y", "xo2")] if pair else [])
                lines = [f"{pre}xo = xrow + (ow0 * {sw} + {kw} * {dw} - {pw}) * {xsw}"]
                if pair:
                    lines += [f"{pre}xo2 = xrow2 + (ow0 * {sw} + {kw} * {dw} - {pw}) * {xsw}"]
                lines += [f"{pre}if inner:"]
                lines += [f"{pre}    {v}{r} = {X}[np.uintp({o} + {r * sw * xsw})]" for v, o in rows for r in range(OWT)]
                lines += [f"{pre}else:",
                          f"{pre}    iw = ow0 * {sw} + {kw} * {dw} - {pw}"]
                lines += [f"{pre}    {v}{r} = {X}[np.uintp({o} + {r * sw * xsw})] "
                          f"if iw >= {-r * sw} and iw < {W - r * sw} else {zero}" for v, o in rows for r in range(OWT)]
                lines += [f"{pre}wo = np.uintp(wrow + {kw} * {OCT})",
                          f"{pre}for j in range({OCT}):",
                          f"{pre}    wv = {Wn}[wo + np.uintp(j)]"]
                if pair:
                    lines += [f"{pre}    acc[np.uintp({r * OCT} + j)] += (x{r} if j < {PAIR // 2} else y{r}) * wv"
                              for r in range(OWT)]
                else:
                    lines += [f"{pre}    acc[np.uintp({r * OCT} + j)] += x{r} * wv" for r in range(OWT)]
                return lines
            lines = [f"{pre}wv{m} = {Wn}[np.uintp(wr{m} + {kw})]" for m in range(OCT)]
            if TR:
                # output column ow = ph + sw * (j0 + r) reads input column (ow + pw - kw * dw) / sw
                lines = [f"{pre}q = ph + {pw} - {kw} * {dw}",
                         f"{pre}if q % {sw} == 0:"] + ["    " + ln for ln in lines]
                p2 = pre + "    "
                lines += [f"{p2}base = q // {sw} + j0",
                          f"{p2}lo = max(-base, 0)",
                          f"{p2}hi = min({W} - base, {OWT})",
                          f"{p2}xo = xrow + base * {xsw}",
                          f"{p2}for r in range(lo, hi):",
                          f"{p2}    xv = {X}[np.uintp(xo + r * {xsw})]"]
                return lines + fmas(p2 + "    ", "xv", "r")
            if stage:
                xk = (kw * dw % sw * L + kw * dw // sw) if isinstance(kw, int) else \
                    f"kw * {dw} % {sw} * {L} + kw * {dw} // {sw}"
                lines += [f"{pre}xk = np.uintp({xk})",
                          f"{pre}for r in range({OWT}):",
                          f"{pre}    xv = xbuf[xk + np.uintp(r)]"]
                return lines + fmas(pre + "    ", "xv", "r")
            if _unpadded(wl):
                # unpadded: every column of every tile is inside the row, a loop of constant length
                # (with bounds LLVM kept the tile in memory: 0.43 ms for a 1x1 conv that ran 0.1)
                lines += [f"{pre}xo = xrow + (ow0 * {sw} + {kw} * {dw}) * {xsw}",
                          f"{pre}for r in range({OWT}):",
                          f"{pre}    xv = {X}[np.uintp(xo + r * {sw * xsw})]"]
                return lines + fmas(pre + "    ", "xv", "r")
            if isinstance(kw, int):
                lo = max(0, -((kw * dw - pw) // sw))                 # ceil((pw - kw*dw) / sw)
                hi = min(OW, (W - 1 + pw - kw * dw) // sw + 1)
                if hi <= lo:
                    return []
                lo_s, hi_s = str(lo), str(hi)
            else:
                lo_s = f"max(0, -((kw * {dw} - {pw}) // {sw}))"
                hi_s = f"min({OW}, ({W - 1 + pw} - kw * {dw}) // {sw} + 1)"
            lines += [f"{pre}lo = max({lo_s} - ow0, 0)",
                      f"{pre}hi = min({hi_s} - ow0, {OWT})",
                      f"{pre}xo = xrow + (ow0 * {sw} + {kw} * {dw} - {pw}) * {xsw}",
                      f"{pre}for r in range(lo, hi):",
                      f"{pre}    xv = {X}[np.uintp(xo + r * {sw * xsw})]"]
            return lines + fmas(pre + "    ", "xv", "r")

        def oc_row(pre):
            """The kernel columns written out over one load of each input column they share: tap kw
            of output column r reads column r * sw + kw * dw of the tile's input row, so a row of
            OWT outputs reads OWT + KW - 1 inputs at stride 1, not OWT * KW (written as a loop, the
            14-column tile reloaded and re-broadcast its inputs for each tap: RegNetX-3.2GF's grouped
            3x3 ran 1.4x the time of 7-column tiles, which LLVM had unrolled itself)."""
            offs = sorted({r * sw + kw * dw for r in range(OWT) for kw in range(KW)})
            rows = [("x", "xrow")] + ([("y", "xrow2")] if pair else [])
            lines = [f"{pre}iw = ow0 * {sw} - {pw}", f"{pre}if inner:"]
            lines += [f"{pre}    {v}{d} = {X}[np.uintp({o} + (iw + {d}) * {xsw})]" for v, o in rows for d in offs]
            lines += [f"{pre}else:"]
            lines += [f"{pre}    {v}{d} = {X}[np.uintp({o} + (iw + {d}) * {xsw})] if iw >= {-d} and iw < {W - d} "
                      f"else {zero}" for v, o in rows for d in offs]
            for kw in range(KW):
                lines += [f"{pre}wo = np.uintp(wrow + {kw * OCT})",
                          f"{pre}for j in range({OCT}):",
                          f"{pre}    wv = {Wn}[wo + np.uintp(j)]"]
                for r in range(OWT):
                    d = r * sw + kw * dw
                    xv = f"(x{d} if j < {PAIR // 2} else y{d})" if pair else f"x{d}"
                    lines.append(f"{pre}    acc[np.uintp({r * OCT} + j)] += {xv} * wv")
            return lines

        if unroll and axis == "oc":
            body += oc_row(pre)
        elif unroll:
            for kw in range(KW):
                body += column(pre, kw)
        else:
            body += [f"{pre}for kw in range({KW}):"] + column(pre + "    ", "kw")

        # epilogue and stores
        out_shape = wl.spec(f"v{conv.index}").shape
        pos = {op.index: j for j, op in enumerate(ops)}

        def store(pre, a, chan, r):
            ow = f"ph + {sw} * (j0 + {r})" if TR else f"ow0 + {r}"
            # (flattened: plain rows are one run, so the pixel's offset is its flat index)
            idx = ["n", chan, "0", ow] if flat else ["n", chan] + [f"o{i}" for i in range(lead)] + [ow]
            lines, _ = epilogue(wl, ops, "a", idx, out_shape, dt, f"v{conv.index}", var="e", unsigned=True)
            out = [f"{pre}a = {a}"] + [pre + ln for ln in lines]
            for k, (t, v) in enumerate(zip(wl.outputs, wl.output_values)):
                j = int(v[1:])
                val = "a" if j == conv.index else f"e{pos[j]}"
                out.append(f"{pre}out{k}[np.uintp({offset(t.shape, t.layout, idx)})] = {val}")
            return out

        if axis == "ow":
            for m in range(OCT):
                body += [f"    for r in range({OWT}):"]
                body += store("        ", f"acc[np.uintp({m * OWT} + r)]", f"k0 + {m}", "r")
        else:
            # The epilogue reads a copy: indexed by its channel loop, which LLVM does not unroll
            # once the epilogue grows (a residual add), the tile itself would have to live in
            # memory, and the reduction then stored all 14 accumulators every step: r3d_18's
            # conv3d + add + relu 256 -> 256 on 4x14x14 ran 31 ms, 11.7 with the copy (12.4 without
            # the add), AMD EPYC Zen 4.
            stored = f"min({OCT}, {Kg} - ko % {KOg} * {OCT})" if padded else \
                OCT if K % OCT == 0 else f"min({OCT}, {K} - k0)"
            body += [f"    res = carray(stack_empty({T}, {ctor(dt)}), {T})",
                     f"    for q in range({T}):",
                     "        res[np.uintp(q)] = acc[np.uintp(q)]",
                     f"    for j in range({stored}):"]
            for r in range(OWT):
                body += store("        ", f"res[np.uintp({r * OCT} + j)]", "k0 + j", str(r))

        def pack(consts):
            res = {}
            for name, (ref, layout) in packs.items():
                v = np.asarray(wl.params[ref] if ref.startswith("p") else consts[int(ref[1:])], dt)
                if padded:                         # each group's channels, then zeros to KOg tiles
                    v = v.reshape((K // Kg, Kg) + v.shape[1:])
                    v = np.concatenate([v, np.zeros((K // Kg, KOg * OCT - Kg) + v.shape[2:], dt)], axis=1)
                    v = v.reshape((KO * OCT,) + v.shape[2:])
                if len(v) < KO * OCT:              # a pair tile past K reads zeros
                    v = np.concatenate([v, np.zeros((KO * OCT - len(v),) + v.shape[1:], dt)])
                if layout == "oc":                 # [K, Cg, *k] -> [K/OCT, Cg, *k, OCT]
                    v = v.reshape(KO, OCT, Cg, ksz).transpose(0, 2, 3, 1)
                res[name] = np.ascontiguousarray(v).reshape(-1)
            return res

        return Kernel(source(args, dtypes, body, reassoc=calls_polynomial(body)), args, pack)


def _geometry(wl: Workload):
    """The conv's geometry, and the image width where a 1x1 stride-1 unpadded conv over plain rows
    runs as a 1-d conv over the flattened image (else None): rows of 14 pixels with a few channels'
    accumulators were latency-bound (the ONNX zoo's ShuffleNet v1, 68 channels per group on 14x14:
    0.28 ms against onnxruntime's 0.07); over 196 pixels a tile holds 56 of them."""
    g = conv_geometry(wl)
    if g.transpose or g.nd != 2 or g.kernel != (1, 1) or g.strides != (1, 1) or not _unpadded(wl) \
            or g.in_layout is not None or any(t.layout is not None for t in wl.outputs):
        return g, None
    # the epilogue's operands are read at [n, c, 0, flat index]: each must be plain and either
    # the whole image or one value per (n, c)
    for i, t in enumerate(wl.inputs):
        if i > 0 and not t.const and (t.layout is not None or len(t.shape) != 4 or
                                      tuple(t.shape[-2:]) not in ((g.H, g.W), (1, 1))):
            return g, None
    hw = (g.H * g.W,)
    return dataclasses.replace(g, spatial_in=hw, spatial_out=hw, kernel=(1,), strides=(1,), dilations=(1,),
                               pads=(0,)), g.W


def _unpadded(wl: Workload) -> bool:
    return not any(wl.anchor.attrs.get("pads", [0]))
