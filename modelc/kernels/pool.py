"""2-d pooling (MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool) with a fused epilogue.

Input in the channel-blocked layout [N, C/B, H+2h, W+2h, B] or plain NCHW (then B = 1); the output
in whatever layout the workload says. One parallel loop runs over (image, channel block, tile of
`tile_oh` output rows). Padding is handled by explicit bounds, never by reading the halo: for each
output row every kernel row gets an offset, and a kernel row outside the input gets the offset of
the window's first valid row instead (MaxPool: a duplicate tap changes nothing, so padding acts as
-inf; AveragePool: the row is weighted by 0). Each output row splits at build time into an
interior, whose windows lie inside the row, covered by tiles of `tile_ow` pixels, and edge pixels
whose out-of-range kernel columns are replaced (or weighted by 0) the same way. The window is
written out in the source as a straight chain of max/add over its taps, so the lane loop carries
no dependency: in the blocked layout it runs over the B contiguous lanes of a block (one AVX-512
vector for B = 16) with the tile's pixels written out; in the plain layout over the tile's pixels.
Values go to a small stack tile first and are then stored with the epilogue: no load follows a
store to the output (which might alias the input), so LLVM vectorises even fully unrolled loops.
AveragePool divides by the count of real pixels, or of pixels inside the padded input
(count_include_pad); the last interior tile is shifted left to end at the interior's end.

Global pools reduce each plane: blocked, runs of `run` pixels x B lanes (a loop of >= 64 lanes)
accumulate over the plane's rows and are folded at the end; plain, a contiguous scalar loop that
LLVM turns into a vector reduction.
"""
from __future__ import annotations

import numpy as np

from .. import target
from .codegen import ParallelItem, row_waste, shifted_start, worth_parallel
from .expr import ctor, lit
from .intrinsics import imports
from .layout import offset
from .space import ConfigSpace
from .template import Kernel, Template, anchor_ref, chain_ok, epilogue, epilogue_inputs, parallel_loop, register, source
from .workload import Workload

EXTRA = [imports("fmax")]    # llvm.maxnum: a max reduction that vectorises
OPS = ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool")
OWT_BLOCKED = [1, 2, 3, 4, 6, 7, 8]           # pixels per tile, written out in the source
OWT_PLAIN = [16, 32, 64]                       # a loop over pixels (8 stayed scalar)
OHT_CANDIDATES = [1, 2, 4, 8]
MAX_TAPS = 128                                 # window taps x tile pixels written out
PARALLEL_MIN = 32768                           # window taps per thread for a parallel default
GLOBAL_PARALLEL_MIN = 16384                    # pixels per thread for a parallel global pool
GLOBAL_TASKS_PER_THREAD = 8                    # a global pool's default parallel tasks per thread


def _geometry(wl: Workload) -> dict:
    a = wl.anchor
    x = wl.spec(a.args[0])
    n, c, h, w = x.shape
    B, hin = x.layout if x.layout else (1, 0)
    out = wl.outputs[0]
    g = dict(N=n, C=c, H=h, W=w, B=B, hin=hin, OH=out.shape[2], OW=out.shape[3], CB=c // B)
    if a.op.startswith("Global"):
        g.update(KH=h, KW=w, sh=1, sw=1, dh=1, dw=1, pt=0, pl=0, pb=0, pr=0)
    else:
        g["KH"], g["KW"] = a.attrs["kernel_shape"]
        g["sh"], g["sw"] = a.attrs.get("strides", [1, 1])
        g["dh"], g["dw"] = a.attrs.get("dilations", [1, 1])
        g["pt"], g["pl"], g["pb"], g["pr"] = a.attrs.get("pads", [0, 0, 0, 0])
    # interior output columns: every window column inside [0, W)
    owa = -(-g["pl"] // g["sw"])
    owb = (w - 1 + g["pl"] - (g["KW"] - 1) * g["dw"]) // g["sw"] + 1
    owa = min(owa, g["OW"])
    g["owa"], g["owb"] = owa, max(owa, min(owb, g["OW"]))
    return g


@register
class Pool2d(Template):
    name = "pool"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op not in OPS or not chain_ok(wl):
            return False
        x = wl.spec(a.args[0])
        if len(x.shape) != 4 or x.dtype not in (np.float32, np.float64) or wl.outputs[0].dtype != x.dtype:
            return False
        if x.layout and x.shape[1] % x.layout[0]:
            return False
        if a.op in ("MaxPool", "AveragePool"):
            if len(a.attrs.get("kernel_shape", [])) != 2 or len(a.attrs.get("pads", [0] * 4)) != 4:
                return False
            if a.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "", None):
                return False
            # every window must hold a real pixel (the kernel reads a valid tap in place of a
            # padded one): pads smaller than the dilated kernel, dilation not above the size
            g = _geometry(wl)
            eh, ew = (g["KH"] - 1) * g["dh"] + 1, (g["KW"] - 1) * g["dw"] + 1
            if max(g["pt"], g["pb"]) >= eh or max(g["pl"], g["pr"]) >= ew or \
                    g["dh"] > g["H"] or g["dw"] > g["W"]:
                return False
        return True

    def space(self, wl: Workload) -> ConfigSpace:
        g = _geometry(wl)
        sp = ConfigSpace()
        if wl.anchor.op.startswith("Global"):
            if g["B"] > 1:
                cols = g["W"] if g["hin"] else g["H"] * g["W"]
                # runs under 64 lanes were fully unrolled and vectorised across pixels (gathers)
                sp.define_knob("run", [p for p in (1, 2, 4, 8, 16) if p <= cols and p * g["B"] >= 64]
                               or [min(cols, 32)])
            tasks = g["N"] * g["CB"]
            sp.define_knob("planes_per_task", [p for p in (1, 2, 4, 8, 16, 32, 64) if p <= tasks])
            sp.define_annotate("parallel", [True, False])
            return sp
        sp.define_knob("tile_ow", _tile_candidates(g))
        sp.define_knob("tile_oh", [t for t in OHT_CANDIDATES if t <= g["OH"]])
        sp.define_annotate("parallel", [True, False])
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        g = _geometry(wl)
        if wl.anchor.op.startswith("Global"):
            vals = {"parallel": worth_parallel(g["N"] * g["C"] * g["H"] * g["W"], GLOBAL_PARALLEL_MIN)}
            if g["B"] > 1:
                runs = space.knobs[0].values
                vals["run"] = min(runs, key=lambda p: abs(p * g["B"] - 64))
            ppt = space.knobs[-2].values
            want = max(1, g["N"] * g["CB"] // (GLOBAL_TASKS_PER_THREAD * target.current().threads))
            vals["planes_per_task"] = min(ppt, key=lambda p: abs(p - want))
            return space.from_values(vals)
        owts = space.knobs[0].values
        interior = max(g["owb"] - g["owa"], 1)
        want = 4 if g["B"] > 1 else 32
        waste = row_waste(interior)
        best = min(owts, key=lambda t: (waste(t) > 0.25, abs(t - want), -t))
        work = g["N"] * g["C"] * g["OH"] * g["OW"] * g["KH"] * g["KW"]
        return space.from_values({"tile_ow": best, "tile_oh": 1, "parallel": worth_parallel(work, PARALLEL_MIN)})

    def build(self, wl: Workload, cfg) -> Kernel:
        if wl.anchor.op.startswith("Global"):
            return _build_global(wl, cfg)
        return _build_window(wl, cfg)


def _tile_candidates(g: dict) -> list:
    interior = g["owb"] - g["owa"]
    if g["B"] == 1:
        return [t for t in OWT_PLAIN if t <= interior] or [max(interior, 1)]
    taps = g["KH"] * g["KW"]
    return [t for t in OWT_BLOCKED if t <= max(interior, 1) and (t == 1 or t * taps <= MAX_TAPS)]


def _io(wl: Workload, g: dict):
    a = wl.anchor
    x_arg = int(a.args[0][1:])
    B, hin = g["B"], g["hin"]
    HP, WP = g["H"] + 2 * hin, g["W"] + 2 * hin
    strides = (g["CB"] * HP * WP * B, HP * WP * B, WP * B, B)
    return x_arg, f"in{x_arg}", strides


def _finish(wl: Workload, body: list, x_arg: int, parallel: bool = True) -> Kernel:
    ops = wl.epilogue
    args = ["out0", f"in{x_arg}"] + [f"in{k}" for k in epilogue_inputs(ops) if k != x_arg]
    dtypes = [wl.outputs[0].dtype] + [wl.inputs[int(a[2:])].dtype for a in args[1:]]
    return Kernel(source(args, dtypes, body, parallel=parallel, extra=EXTRA), args)


def _store(wl: Workload, g: dict, ind: str, value: str, ow: str, var: str, loop: bool = True) -> list:
    """Epilogue + store of one output pixel's lane j (in a `for j` loop of B lanes if `loop`)."""
    out = wl.outputs[0]
    B = g["B"]
    chan = ("cb", "j", B) if B > 1 else "cb"
    idx = ["n", chan, "oh", ow]
    lines, final = epilogue(wl, wl.epilogue, value, idx, out.shape, out.dtype, anchor_ref(wl), var=var)
    st = lines + [f"out0[np.uintp({offset(out.shape, out.layout, idx)})] = {final}"]
    if B > 1 and loop:
        return [f"{ind}for j in range({B}):"] + [f"{ind}    {ln}" for ln in st]
    return [f"{ind}{ln}" for ln in st]


def _build_window(wl: Workload, cfg) -> Kernel:
    g = _geometry(wl)
    is_max = wl.anchor.op == "MaxPool"
    dt = wl.outputs[0].dtype
    T = ctor(dt)
    B, hin = g["B"], g["hin"]
    H, W, KH, KW = g["H"], g["W"], g["KH"], g["KW"]
    OH, OW = g["OH"], g["OW"]
    sh, sw, dh, dw = g["sh"], g["sw"], g["dh"], g["dw"]
    pt, pl, pb, pr = g["pt"], g["pl"], g["pb"], g["pr"]
    owa, owb = g["owa"], g["owb"]
    OWT, OHT = cfg["tile_ow"], cfg["tile_oh"]
    include_pad = bool(int(wl.anchor.attrs.get("count_include_pad", 0)))
    x_arg, X, (x_n, x_c, x_h, x_w) = _io(wl, g)
    one, zero = lit(1, dt), lit(0, dt)

    def window(cols: list, lane: str, hweights=None) -> str:
        """The pooled value of one window: taps at row offsets r{kh} plus column offsets."""
        if is_max:
            v = None
            for kh in range(KH):
                for c in cols:
                    tap = f"{X}[r{kh} + {c(lane)}]"
                    v = tap if v is None else f"max({v}, {tap})"
            return v
        rows = []
        for kh in range(KH):
            taps = [f"{X}[r{kh} + {c(lane)}]" for c in cols]
            if hweights:
                taps = [f"{w} * {t}" for w, t in zip(hweights, taps)]
            rows.append(f"w{kh} * ({' + '.join(taps)})")
        return f"({' + '.join(rows)}) * inv"

    NOT = -(-OH // OHT)
    item = ParallelItem()
    body = [item.loop(g["N"] * g["CB"] * NOT),
            *item.take("t", NOT),
            *item.last("cb", g["CB"], "n"),
            f"    plane = n * {x_n} + cb * {x_c}",
            f"    tile = carray(stack_empty({OWT * B}, {T}), {OWT * B})",
            "    oz = min(out0.shape[0], 0)",
            f"    for oh in range(t * {OHT}, min(t * {OHT} + {OHT}, {OH})):",
            f"        ih0 = oh * {sh} - {pt}",
            f"        kh_lo = max(0, -(ih0 // {dh}))",
            f"        kh_hi = min({KH}, ({H - 1} - ih0) // {dh} + 1)",
            # an out-of-range kernel row reads the first valid one instead: max ignores the
            # duplicate, the average weighs it by 0 (every window has a valid row: see matches)
            f"        rrep = plane + (ih0 + kh_lo * {dh} + {hin}) * {x_h}"]
    for kh in range(KH):
        body += [f"        ihk = ih0 + {kh * dh}",
                 f"        ok = ihk >= 0 and ihk < {H}",
                 f"        r{kh} = np.uintp(plane + (ihk + {hin}) * {x_h} if ok else rrep)"]
        if not is_max:
            body += [f"        w{kh} = {one} if ok else {zero}"]
    if not is_max:
        if include_pad:
            body += [f"        ch = min({KH}, ({H + pb - 1} - ih0) // {dh} + 1) - max(0, -((ih0 + {pt}) // {dh}))"]
        else:
            body += ["        ch = kh_hi - kh_lo"]

    # -- interior tiles: OWT pixels, every window column inside the row ----------------------
    LI = owb - owa
    if LI > 0:
        NT = -(-LI // OWT)
        body += [f"        for tt in range({NT}):",
                 f"            ow0 = {shifted_start(f'{owa} + tt * {OWT}', owb, OWT)}",
                 f"            xc = np.uintp((ow0 * {sw} - {pl} + {hin}) * {x_w})"]
        if not is_max:
            body += [f"            inv = {one} / {T}(ch * {KW})"]
        # two loops: all window values into a stack tile, then epilogue + stores; loads never
        # follow a store to the output (which might alias), so unrolled code still vectorises
        if B > 1:
            body += [f"            for j in range({B}):"]
            for r in range(OWT):
                cols = [lambda lane, c=(r * sw + kw * dw) * x_w: f"xc + np.uintp({c} + {lane})" for kw in range(KW)]
                body += [f"                tile[{r * B} + j] = {window(cols, 'j')}"]
            body += [f"            for j in range({B}):"]
            for r in range(OWT):
                body += _store(wl, g, " " * 16, f"tile[{r * B} + j]", f"ow0 + {r}", f"e{r}_", loop=False)
        else:
            cols = [lambda lane, c=kw * dw: f"xc + np.uintp({lane} * {sw} + {c})" for kw in range(KW)]
            body += [f"            for r in range({OWT}):",
                     f"                tile[r] = {window(cols, 'r')}",
                     f"            for r in range({OWT}):"]
            body += _store(wl, g, " " * 16, "tile[r]", "ow0 + r", "e", loop=False)

    # -- edge pixels: out-of-range kernel columns replaced like the rows ---------------------
    NE = owa + (OW - owb)
    if NE > 0:
        body += [f"        for e in range({NE}):",
                 # `oz` (0, unknown to LLVM) keeps it from specialising the edge pixels, which
                 # left their lane loops scalar
                 f"            ow = (e if e < {owa} else e + {owb - owa}) + oz",
                 f"            iw0 = ow * {sw} - {pl}",
                 f"            kw_lo = max(0, -(iw0 // {dw}))",
                 f"            kw_hi = min({KW}, ({W - 1} - iw0) // {dw} + 1)",
                 f"            crep = (iw0 + kw_lo * {dw} + {hin}) * {x_w}"]
        for kw in range(KW):
            body += [f"            iwk = iw0 + {kw * dw}",
                     f"            ok = iwk >= 0 and iwk < {W}",
                     f"            c{kw} = np.uintp((iwk + {hin}) * {x_w} if ok else crep)"]
            if not is_max:
                body += [f"            v{kw} = {one} if ok else {zero}"]
        if not is_max:
            if include_pad:
                body += [f"            cw = min({KW}, ({W + pr - 1} - iw0) // {dw} + 1) - "
                         f"max(0, -((iw0 + {pl}) // {dw}))"]
            else:
                body += ["            cw = kw_hi - kw_lo"]
            body += [f"            inv = {one} / {T}(ch * cw)"]
        cols = [lambda lane, kw=kw: f"c{kw} + np.uintp({lane})" for kw in range(KW)]
        hw = None if is_max else [f"v{kw}" for kw in range(KW)]
        if B > 1:
            body += [f"            for j in range({B}):",
                     f"                tile[j] = {window(cols, 'j', hw)}",
                     f"            for j in range({B}):"]
            body += _store(wl, g, " " * 16, "tile[j]", "ow", "f", loop=False)
        else:
            body += _store(wl, g, " " * 12, window(cols, "0", hw), "ow", "f", loop=False)
    return _finish(wl, body, x_arg, parallel=cfg["parallel"])


def _build_global(wl: Workload, cfg) -> Kernel:
    g = _geometry(wl)
    is_max = wl.anchor.op == "GlobalMaxPool"
    dt = wl.outputs[0].dtype
    T = ctor(dt)
    B, hin, H, W = g["B"], g["hin"], g["H"], g["W"]
    x_arg, X, (x_n, x_c, x_h, x_w) = _io(wl, g)
    init = lit(-np.inf, dt) if is_max else lit(0, dt)

    def op(a, v):
        return f"fmax({a}, {v})" if is_max else f"{a} + {v}"

    scale = "" if is_max else f" * {lit(1.0 / (H * W), dt)}"
    PT = cfg["planes_per_task"]
    tasks = g["N"] * g["CB"]
    body = [parallel_loop("it", -(-tasks // PT))]
    if B > 1:
        # accumulate runs of P pixels x B lanes (one loop of P*B lanes, which LLVM vectorises)
        # over each row; a plane without halo is one row
        rows, cols = (1, H * W) if hin == 0 else (H, W)
        P = min(cfg["run"], cols)
        R = P * B
        body += [f"    acc = carray(stack_empty({R}, {T}), {R})"]
    body += [f"    for pi in range(it * {PT}, min(it * {PT} + {PT}, {tasks})):",
             *ParallelItem("pi", ind="        ").last("cb", g["CB"], "n"),
             "        oh = 0",
             f"        plane = n * {x_n} + cb * {x_c}"]
    if B > 1:
        body += [f"        for q in range({R}):",
                 f"            acc[q] = {init}",
                 f"        for ih in range({rows}):",
                 f"            rb = plane + (ih + {hin}) * {x_h} + {hin * x_w}"]
        if cols // P:
            body += [f"            for c in range({cols // P}):",
                     f"                xb = np.uintp(rb + c * {R})",
                     f"                for q in range({R}):",
                     f"                    acc[q] = {op('acc[q]', f'{X}[xb + np.uintp(q)]')}"]
        if cols % P:
            body += [f"            xb = np.uintp(rb + {cols // P * R})",
                     f"            for q in range({cols % P * B}):",
                     f"                acc[q] = {op('acc[q]', f'{X}[xb + np.uintp(q)]')}"]
        body += [f"        for j in range({B}):",
                 "            s = acc[j]"]
        body += [f"            s = {op('s', f'acc[{p * B} + j]')}" for p in range(1, P)]
        body += _store(wl, g, "            ", f"(s{scale})", "0", "e", loop=False)
    else:
        body += [f"        s = {init}",
                 f"        for i in range({H * W}):",
                 f"            s = {op('s', f'{X}[np.uintp(plane + i)]')}"]
        body += _store(wl, g, "        ", f"(s{scale})", "0", "e")
    return _finish(wl, body, x_arg, parallel=cfg["parallel"])
