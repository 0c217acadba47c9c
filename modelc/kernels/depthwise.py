"""Depthwise 2-d convolution (group == C_in == C_out) in the channel-blocked layout.

Input [N, C/b, H+2h, W+2h, b] (its zero halo is the padding), weights packed once as
[C/b, KH, KW, b], output [N, C/b, OH+2h', OW+2h', b] (only the interior is written). Each
channel is its own filter, so the natural vector is the b channel lanes of one block: the kernel
runs one loop over the lanes (`for j in range(b)`, one AVX-512 vector for b = 16) around a
register tile of OHT x OWT output pixels written out in the source. Every tap of the filter is
a multiply-add of an input vector and a weight vector; an input vector that several taps of the
tile share (stride 1: neighbouring pixels) is loaded once. The fused elementwise epilogue (bias,
Clip = ReLU6, residual Add ...) runs on the tile before it is stored.

One parallel loop runs over (image, channel block, group of output rows); inside a task the
kernel walks the rows and the column tiles. A last tile that would run past the row (or the
plane) is shifted back to end at its end: it recomputes a few pixels instead of branching.

Knobs: `tile_ow` (output pixels per row of the register tile), `tile_oh` (rows of the register
tile; rows share input vectors at stride 1), `rows_per_task` (granularity of the parallel loop),
`unroll_kh` (all KH x KW taps written out with scalar accumulators, or a loop over filter rows
with the tile on a stack array).
"""
from __future__ import annotations

import numpy as np

from .. import target
from .codegen import ParallelItem, packed_kernel, row_waste, shifted_start
from .conv_geometry import conv_geometry
from .expr import SUPPORTED
from .layout import physical_shape, strides
from .space import ConfigSpace
from .template import Kernel, Template, epilogue, float_or_bytes_out, register
from .workload import Workload

OWT_CANDIDATES = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]
ROWS_CANDIDATES = [1, 2, 4, 7, 8, 14, 16, 28]
MAX_TAPS = 256               # multiply-adds written out per lane loop (bounds compile time)
TASKS_PER_THREAD = 16        # parallel tasks a default config leaves each thread, when it can


def max_accumulators(tg) -> int:
    """Accumulator vectors of a depthwise register tile: half the registers (16 of AVX-512's 32);
    the other half hold the filter's weight vectors (9 for 3x3) and the input vectors."""
    return tg.vector_registers // 2


@register
class DepthwiseConv2d(Template):
    name = "depthwise_conv2d"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op != "Conv" or len(wl.outputs) != 1 or wl.outputs[0].layout is None:
            return False
        if len(a.args) < 2 or not a.args[0].startswith("i") or not a.args[1].startswith("i"):
            return False
        x, w, out = wl.spec(a.args[0]), wl.spec(a.args[1]), wl.outputs[0]
        if len(x.shape) != 4 or x.layout is None or len(w.shape) != 4 or not w.const:
            return False
        c = x.shape[1]
        if int(a.attrs.get("group", 1)) != c or w.shape[0] != c or w.shape[1] != 1 or c == 1:
            return False
        if len(a.args) > 2 and a.args[2] and not (a.args[2].startswith("i") and wl.spec(a.args[2]).const):
            return False
        if x.dtype != np.float32 or w.dtype != np.float32 or not float_or_bytes_out(wl):
            return False
        if out.layout[0] != x.layout[0] or c % x.layout[0]:
            return False
        if wl.output_values[0] != f"v{wl.ops[-1].index}" or out.shape != wl.spec(wl.output_values[0]).shape:
            return False
        if out.shape[1] != c or len(a.attrs.get("pads", [0] * 4)) != 4:
            return False
        if max(a.attrs.get("pads", [0])) > x.layout[1]:
            return False
        return all(op.op in SUPPORTED for op in wl.epilogue)

    def space(self, wl: Workload) -> ConfigSpace:
        g = conv_geometry(wl)
        tg = target.current()
        sp = ConfigSpace()
        sp.define_knob("tile_ow", [t for t in OWT_CANDIDATES if t <= g.OW] or [g.OW])
        sp.define_knob("tile_oh", [t for t in (1, 2, 3, 4) if t <= g.OH])
        sp.define_knob("rows_per_task", [r for r in ROWS_CANDIDATES if r <= g.OH] or [1])
        sp.define_annotate("unroll_kh", [True, False])
        vec = -(-g.cb // tg.lanes(4))          # vectors of one block's lanes
        most = max_accumulators(tg)
        kh, kw = g.KH, g.KW

        def valid(cfg):
            tile = cfg["tile_ow"] * cfg["tile_oh"]
            return tile * vec <= most and cfg["rows_per_task"] % cfg["tile_oh"] == 0 and \
                tile * kw * (kh if cfg["unroll_kh"] else 1) <= MAX_TAPS
        sp.constraint = valid
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        """About as many accumulator vectors per tile as keep the FMA pipes busy (pipes x latency:
        8 on current x86 cores) along the row, and >= 16 parallel tasks per thread when possible."""
        g = conv_geometry(wl)
        tg = target.current()
        oh = g.OH
        vec = -(-g.cb // tg.lanes(4))
        most = max_accumulators(tg) // vec
        owts = [t for t in space.knobs[0].values if t <= most] or space.knobs[0].values[:1]
        want = max(1, min(tg.accumulators_in_flight, max_accumulators(tg)) // vec)
        waste = row_waste(g.OW)
        owt = min(owts, key=lambda t: (waste(t) > 0.15, abs(t - want), -t))
        planes = g.N * g.C // g.cb
        rows = [r for r in space.knobs[2].values]
        # the largest row group that still leaves enough tasks (ample for the threads, cache friendly)
        ok = [r for r in rows if planes * -(-oh // r) >= TASKS_PER_THREAD * tg.threads
              and (-(-oh // r) * r - oh) / oh <= 0.15]
        rpt = max(ok) if ok else 1
        cfg = space.from_values({"tile_ow": owt, "tile_oh": 1, "rows_per_task": rpt, "unroll_kh": True})
        if not space.is_valid(cfg):
            cfg = space.from_values({**cfg.values, "unroll_kh": False})
        if not space.is_valid(cfg):
            cfg = space.get(space.valid_indices(limit=1)[0])
        return cfg

    def build(self, wl: Workload, cfg) -> Kernel:
        g = conv_geometry(wl)
        conv = wl.anchor
        OWT, OHT, R = cfg["tile_ow"], cfg["tile_oh"], cfg["rows_per_task"]
        unroll = cfg["unroll_kh"]
        b, hin, hout = g.cb, g.hin, g.hout
        N, C, OH, OW, KH, KW = g.N, g.C, g.OH, g.OW, g.KH, g.KW
        CB = C // b
        sh, sw = g.strides
        dh, dw = g.dilations
        ph, pw = g.pads
        OWT, OHT = min(OWT, OW), min(OHT, OH)
        R = max(R, OHT)
        NT = -(-OW // OWT)
        NRB = -(-OH // R)
        x_arg = int(conv.args[0][1:])
        X = f"in{x_arg}"
        x = wl.inputs[x_arg]
        out = wl.outputs[0]
        xs = strides(physical_shape(x.shape, x.layout))
        os_ = strides(physical_shape(out.shape, out.layout))
        has_bias = len(conv.args) > 2 and bool(conv.args[2])
        ops = wl.epilogue
        zero = "np.float32(0.0)"

        item = ParallelItem()
        body = [item.loop(N * CB * NRB),
                *item.take("rb", NRB),
                *item.last("cb", CB, "n"),
                f"    wb = np.uintp(cb * {KH * KW * b})",
                f"    bb = np.uintp(cb * {b})",
                f"    xp = n * {xs[0]} + cb * {xs[1]}",
                f"    op = n * {os_[0]} + cb * {os_[1]}",
                f"    for q in range((min(rb * {R} + {R}, {OH}) - rb * {R} + {OHT - 1}) // {OHT}):",
                f"        oh0 = {shifted_start(f'rb * {R} + q * {OHT}', OH, OHT)}",
                f"        for t in range({NT}):",
                f"            ow0 = {shifted_start(f't * {OWT}', OW, OWT)}",
                f"            xb = np.uintp(xp + (oh0 * {sh} + {hin - ph}) * {xs[2]} "
                f"+ (ow0 * {sw} + {hin - pw}) * {b})",
                f"            ob = np.uintp(op + (oh0 + {hout}) * {os_[2]} + (ow0 + {hout}) * {b})"]
        pre = " " * 12
        tile = [(ro, r) for ro in range(OHT) for r in range(OWT)]
        # An item stores only its own block of R rows: a tile reaching past it (R not a multiple of
        # OHT, or the last tile shifted back) stored rows of another item, from another thread, and
        # the same sum may round differently at two places of a tile (fast-math), so results could
        # change from run to run. Columns are all one item's, stored in a fixed order: no guard.
        starts = [rb * R + q * OHT for rb in range(NRB) for q in range((min(rb * R + R, OH) - rb * R + OHT - 1) // OHT)]
        guarded = any(st > OH - OHT for st in starts) or R % OHT != 0
        if guarded:
            body += [f"            rok{ro} = oh0 + {ro} >= rb * {R} and oh0 + {ro} < rb * {R} + {R}"
                     for ro in range(OHT)]

        def owner(ro, r) -> str:
            return f"rok{ro}" if guarded else ""

        def taps(kh_list, pre, acc, xbase):
            """Multiply-adds of filter rows kh_list into the tile; shared input vectors loaded once."""
            lines, loads = [], {}
            for kh in kh_list:
                for kw in range(KW):
                    for ro, r in tile:
                        iy = ro * sh + (kh * dh if unroll else 0)
                        ix = r * sw + kw * dw
                        key = (iy, ix)
                        if key not in loads:
                            loads[key] = f"x{iy}_{ix}"
                            lines.append(f"{pre}{loads[key]} = "
                                         f"{X}[{xbase} + np.uintp({iy * xs[2] + ix * b} + j)]")
                        a = acc(ro, r)
                        lines.append(f"{pre}{a} = {a} + {loads[key]} * wk{kh if unroll else 0}_{kw}")
            return lines

        def weights(kh_list, pre, wbase):
            out = []
            for kh in kh_list:
                row = kh if unroll else 0
                out += [f"{pre}wk{row}_{kw} = w[{wbase} + np.uintp({(row * KW + kw) * b} + j)]"
                        for kw in range(KW)]
            return out

        def store(pre, acc):
            lines = []
            for ro, r in tile:
                idx = ["n", ("cb", "j", b), f"oh0 + {ro}", f"ow0 + {r}"]
                ep, final = epilogue(wl, ops, acc(ro, r), idx, out.shape, out.dtype,
                                     f"v{conv.index}", var=f"e{ro}_{r}_", unsigned=True)
                lines += [pre + ln for ln in ep]
                st = f"out0[ob + np.uintp({ro * os_[2] + r * b} + j)] = {final}"
                lines += [f"{pre}if {owner(ro, r)}:", f"{pre}    {st}"] if owner(ro, r) else [pre + st]
            return lines

        if unroll:
            def acc(ro, r):
                return f"a{ro}_{r}"
            body += [f"{pre}for j in range({b}):"]
            p2 = pre + "    "
            body += weights(range(KH), p2, "wb")
            init = "bias[bb + np.uintp(j)]" if has_bias else zero
            body += [f"{p2}a{ro}_{r} = {init}" for ro, r in tile]
            body += taps(range(KH), p2, acc, "xb")
            body += store(p2, acc)
        else:
            T = OHT * OWT * b

            def acc(ro, r):
                return f"acc[{(ro * OWT + r) * b} + j]"
            body += [f"{pre}acc = carray(stack_empty({T}, np.float32), {T})",
                     f"{pre}for j in range({b}):"]
            init = "bias[bb + np.uintp(j)]" if has_bias else zero
            body += [f"{pre}    {acc(ro, r)} = {init}" for ro, r in tile]
            body += [f"{pre}for kh in range({KH}):",
                     f"{pre}    xr = xb + np.uintp(kh * {dh * xs[2]})",
                     f"{pre}    wr = wb + np.uintp(kh * {KW * b})",
                     f"{pre}    for j in range({b}):"]
            p3 = pre + "        "
            body += weights([0], p3, "wr")
            body += taps([0], p3, acc, "xr")
            body += [f"{pre}for j in range({b}):"]
            body += store(pre + "    ", acc)

        def pack_weights(w):                                            # [C, 1, KH, KW]
            return w.astype(np.float32).reshape(CB, b, KH, KW).transpose(0, 2, 3, 1)

        return packed_kernel(wl, body, pack_weights)
