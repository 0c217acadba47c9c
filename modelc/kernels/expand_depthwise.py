"""A convolution and the depthwise convolution that reads it, as one kernel.

MobileNet's and EfficientNet's blocks expand the channels with a 1x1 conv and filter each expanded
channel with a depthwise conv (and their stems run a 3x3 stride-2 conv before one); unfused, the
expanded tensor (96 x 112 x 112 floats in MobileNetV2, 4.8 MB) is written by one kernel and read
back by the next from L3 or memory. Here the first conv computes the rows of a few blocks of
expanded channels into a ring of KH rows on the stack (the depthwise filter's height; a few KiB,
in L1), and the depthwise conv reads its taps from there (passes/fuse_depthwise.py says when a pair
is fused). Each row of the expanded tensor is computed once per parallel item: an item is (image,
tile of channel blocks, group of output rows), so only the rows a group shares with the one above
it are computed twice.

Input [N, C/cb, H+2h, W+2h, cb] (its halo is the first conv's padding); the first conv's weights
packed per tile of m blocks as [tiles, C/cb, KH1, KW1, cb, m b], the depthwise ones as [tiles, KH,
KW, m b] (the last tile ends at the last block, recomputing a few where m does not divide them);
a ring row holds its columns' m b channels side by side, so both convs' vectors span the tile; output
[N, K/b, OH+2h', OW+2h', b]. The first conv's part is conv2d's register tile (OWT pixels x m
vectors of b channels, a broadcast input times a weight vector per channel); the depthwise part is
depthwise_conv2d's (a tile of output pixels, one lane loop). Each part's elementwise epilogue (bias,
Clip = ReLU6, SiLU ...) runs on its tile; the ring's rows outside the image and its columns outside
the row are zeros (the depthwise conv's padding).

Knobs: `tile_ow` (pixels of the first conv's tile), `tile_oc_blocks` (blocks of b channels an item
computes: the tile's vectors per pixel), `tile_dw` (output pixels of the depthwise tile),
`row_groups` (output rows split into this many parallel items per channel tile).
"""
from __future__ import annotations

import numpy as np

from .. import target
from .codegen import ParallelItem, row_waste, shifted_start
from .expr import SUPPORTED
from .intrinsics import calls_polynomial
from .layout import physical_shape, strides
from .space import ConfigSpace
from .template import Kernel, Template, epilogue, epilogue_inputs, polynomial_epilogue, register, source
from .workload import Workload

OWT_CANDIDATES = [1, 2, 4, 7, 8, 14, 16, 28]
DW_CANDIDATES = [1, 2, 4, 7, 8, 14, 16]
GROUP_CANDIDATES = [1, 2, 3, 4, 6, 8]
MAX_TAPS = 256               # depthwise multiply-adds written out per lane loop (bounds compile time)
MAX_STEM_CHANNELS = 8       # input channels of a first conv wider than 1x1 (an image's: RGB, RGBA ...)
MAX_RING_FLOATS = 48 << 10   # 192 KB of ring on a thread's stack per item (as winograd's MAX_STACK_FLOATS)


def split(wl: Workload) -> int | None:
    """The index of the depthwise conv in a workload [1x1 conv, its epilogue, depthwise conv, its
    epilogue], or None when `wl` is not one. The 1x1 conv's epilogue may read only its own values
    (SiLU's x * sigmoid(x) reads two), scalar constants and constants of one value per channel (a
    quantized conv's per-channel requantization): its values live in the ring, not at an output
    index. The depthwise conv's epilogue reads none of them."""
    ops = wl.ops
    d = next((k for k, op in enumerate(ops) if k and op.op == "Conv"), None)
    if d is None or ops[0].op != "Conv" or any(op.op not in SUPPORTED for k, op in enumerate(ops) if k not in (0, d)):
        return None

    def values(op):
        return [int(a[1:].split(".")[0]) for a in op.args if a.startswith("v")]
    for k in range(1, d):
        if any(a.startswith("i") and not _per_channel(wl, a, d) for a in ops[k].args) or not values(ops[k]):
            return None
    if ops[d].args[0] != f"v{d - 1}" or any(v < d for op in ops[d + 1:] for v in values(op)):
        return None
    return d


def _per_channel(wl: Workload, ref: str, d: int) -> bool:
    """Whether input `ref` is a plain constant broadcast along the expanded tensor's channels only."""
    t, k = wl.spec(ref), wl.spec(f"v{d - 1}").shape[1]
    s = (1,) * (4 - len(t.shape)) + tuple(t.shape)
    return t.const and t.layout is None and len(s) == 4 and s[0] == s[2] == s[3] == 1 and s[1] in (1, k)


def _const_input(wl: Workload, ref: str, shape: tuple) -> bool:
    return ref.startswith("i") and wl.spec(ref).const and wl.spec(ref).shape == shape and \
        wl.spec(ref).dtype == np.float32


class Geometry:
    """The two convolutions' shapes (from a workload `split` accepts)."""

    def __init__(self, wl: Workload, d: int):
        pw_, dw_ = wl.ops[0], wl.ops[d]
        x = wl.spec(pw_.args[0])
        self.N, self.C, self.XH, self.XW = x.shape
        self.cb, self.hin = x.layout
        self.H, self.W = wl.spec(f"v{d - 1}").shape[2:]          # the expanded tensor's rows, columns
        self.KH1, self.KW1 = wl.spec(pw_.args[1]).shape[2:]      # the first conv's window
        self.s1h, self.s1w = pw_.attrs.get("strides", [1, 1])
        self.p1t, self.p1l = pw_.attrs.get("pads", [0, 0, 0, 0])[:2]
        self.K = wl.spec(pw_.args[1]).shape[0]
        out = wl.outputs[0]
        self.OH, self.OW = out.shape[2:]
        self.b, self.hout = out.layout
        self.KH, self.KW = wl.spec(dw_.args[1]).shape[2:]
        self.sh, self.sw = dw_.attrs.get("strides", [1, 1])
        self.dh, self.dw = dw_.attrs.get("dilations", [1, 1])
        self.pt, self.pl, self.pb, self.pr = dw_.attrs.get("pads", [0, 0, 0, 0])
        self.ring = (self.KH - 1) * self.dh + 1          # rows of the expanded tensor a window spans
        self.BW = self.W + self.pl + self.pr             # a ring row, with the padding columns


def dw_lanes(b: int, m: int, lanes: int) -> int:
    """Channels of a tile of m blocks of b that one depthwise lane loop takes: up to a vector, so
    blocks narrower than one (8 on AVX-512) fill it together, and wider tiles (AVX2's two vectors of
    8) keep a loop per vector, whose tile of pixels stays as wide."""
    w = max(b, min(m * b, lanes))
    return w if (m * b) % w == 0 else b


def _with_row(candidates, w: int) -> list:
    """Tile widths up to a row of `w`, with the row and its half among them: EfficientNet-B3's
    rows of 10 and 19 had only tiles of 2 or 4 without waste, latency-bound (its 232 -> 1392 block
    on 10x10 ran 4.5 ms against onnxruntime's 0.49, AMD EPYC Zen 4)."""
    return sorted({t for t in candidates if t <= w} | {w, -(-w // 2)})


def flat(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).reshape(-1)


def tile_channels(blocks: int, m: int, b: int) -> np.ndarray:
    """Each item's channels, tile by tile: m blocks of b, the last tile ending at the last block."""
    return np.array([min(t * m, blocks - m) * b + j for t in range(-(-blocks // m)) for j in range(m * b)])


def ring_stores(wl: Workload, g: Geometry, owt: int, m: int, value, p: str, deferred: bool = False) -> list:
    """The first conv's epilogue on a tile of `owt` pixels x m blocks (value(q, mb): the sum of
    pixel q, lane j of block mb), stored to the ring row at `sb`; `deferred`: the sums alone, for
    `ring_epilogue` to finish once the row is whole."""
    d, b, ktw = split(wl), g.b, m * g.b
    body = []
    if deferred:
        for mb in range(m):
            body.append(f"{p}for j in range({b}):")
            body += [f"{p}    ring[sb + np.uintp(w0 * {ktw} + {q * ktw + mb * b}) + np.uintp(j)] = {value(q, mb)}"
                     for q in range(owt)]
        return body
    for mb in range(m):
        body.append(f"{p}for j in range({b}):")
        for q in range(owt):
            lines, final = epilogue(wl, wl.ops[1:d], value(q, mb), ["n", (f"kb0 + {mb}", "j", b), "r", f"w0 + {q}"],
                                    wl.spec(f"v{d - 1}").shape, np.float32, "v0", var=f"e{q}_", unsigned=True)
            body += [f"{p}    {ln}" for ln in lines]
            body += [f"{p}    ring[sb + np.uintp(w0 * {ktw} + {q * ktw + mb * b}) + np.uintp(j)] = {final}"]
    return body


def ring_epilogue(wl: Workload, g: Geometry, m: int, p: str) -> list:
    """The first conv's epilogue over the ring row at `sb` in one loop, once its tiles have stored
    their sums there. An epilogue that evaluates a polynomial per element (SiLU's sigmoid) ran in
    the tile's registers as 7-8 interleaved chains, spilling; as a loop over a row in the L1 it runs
    as an elementwise kernel's (EfficientNet-B0's blocks on 14x14 and larger maps, Xeon, Sapphire
    Rapids class: 0.74-0.94 of their time, the model 0.93-0.95, outputs bit for bit the same). Where
    a row is one tile, the tile's own registers are the row (blocks on 7x7 ran 1.08 of their time
    with the pass)."""
    d, b, ktw = split(wl), g.b, m * g.b
    at = "sb + np.uintp(q)"
    lines, final = epilogue(wl, wl.ops[1:d], f"ring[{at}]", ["n", (f"kb0 + (q % {ktw}) // {b}", f"(q % {b})", b), "r",
                                                             f"(q // {ktw})"],
                            wl.spec(f"v{d - 1}").shape, np.float32, "v0", var="e_", unsigned=True)
    return [f"{p}for q in range({g.W * ktw}):", *(f"{p}    {ln}" for ln in lines), f"{p}    ring[{at}] = {final}"]


@register
class ExpandDepthwise(Template):
    name = "expand_depthwise"

    def matches(self, wl: Workload) -> bool:
        d = split(wl)
        if d is None or len(wl.outputs) != 1 or wl.outputs[0].layout is None:
            return False
        pw_, dw_, out = wl.ops[0], wl.ops[d], wl.outputs[0]
        if len(pw_.args) < 2 or not pw_.args[0].startswith("i") or len(dw_.args) < 2:
            return False
        x = wl.spec(pw_.args[0])
        if len(x.shape) != 4 or x.layout is None or not self.types_ok(wl, d):
            return False
        n, c = x.shape[:2]
        w1 = wl.spec(pw_.args[1]).shape if pw_.args[1].startswith("i") else None
        if w1 is None or len(w1) != 4 or w1[1] != c or not _const_input(wl, pw_.args[1], w1):
            return False
        k = w1[0]
        # the first conv: a 1x1, or a wider window over an image's few channels (a stem's 3x3 stride
        # 2); a wide conv over many channels is conv2d's or Winograd's work, whose tiles this lacks
        if int(pw_.attrs.get("group", 1)) != 1 or any(v != 1 for v in pw_.attrs.get("dilations", [1])) or \
                len(pw_.attrs.get("pads", [0] * 4)) != 4 or \
                (w1[2:] != (1, 1) and c > MAX_STEM_CHANNELS):
            return False
        if len(pw_.args) > 2 and pw_.args[2] and not _const_input(wl, pw_.args[2], (k,)):
            return False
        w2 = wl.spec(dw_.args[1]).shape if dw_.args[1].startswith("i") else None
        if w2 is None or len(w2) != 4 or w2[:2] != (k, 1) or not _const_input(wl, dw_.args[1], w2) or \
                int(dw_.attrs.get("group", 1)) != k or len(dw_.attrs.get("pads", [0] * 4)) != 4:
            return False
        if len(dw_.args) > 2 and dw_.args[2] and not _const_input(wl, dw_.args[2], (k,)):
            return False
        last = f"v{wl.ops[-1].index}"
        if wl.output_values[0] != last or out.shape != (n, k, *out.shape[2:]) or out.layout[0] < 1 or \
                k % out.layout[0] or any(wl.spec(f"v{j}").shape != out.shape for j in range(d, len(wl.ops))):
            return False
        g = Geometry(wl, d)
        return g.W >= 1 and max(g.pt, g.pb) < g.ring and max(g.pl, g.pr) < (g.KW - 1) * g.dw + 1 and \
            g.ring * g.BW * g.b <= MAX_RING_FLOATS          # a wide image's ring would not fit a stack

    def types_ok(self, wl: Workload, d: int) -> bool:
        """float32 values throughout, the input padded by its halo."""
        pw_ = wl.ops[0]
        x = wl.spec(pw_.args[0])
        return x.dtype == np.float32 and wl.outputs[0].dtype == np.float32 and "x_zero" not in pw_.attrs and \
            max(pw_.attrs.get("pads", [0])) <= x.layout[1] and \
            all(wl.spec(f"v{j}").dtype == np.float32 for j in range(len(wl.ops)))

    def space(self, wl: Workload) -> ConfigSpace:
        g = Geometry(wl, split(wl))
        tg = target.current()
        lanes = tg.lanes(4)
        vec = -(-g.b // lanes)
        blocks = g.K // g.b
        sp = ConfigSpace()
        sp.define_knob("tile_ow", [t for t in _with_row(OWT_CANDIDATES, g.W) if t * vec <= tg.max_tile_vectors] or [1])
        # m blocks of b channels per item, as conv2d's tile_oc_blocks: without AVX-512's broadcast
        # operand each broadcast input is a load of its own, and two vectors of channels share it;
        # blocks narrower than a vector (488 channels are 61 blocks of 8) fill one together, the
        # last tile shifted back to end at the last block where m does not divide them
        sp.define_knob("tile_oc_blocks", [m for m in (1, 2, 3, 4, 8) if m <= blocks and m * g.b <= 4 * lanes
                                          and (m & (m - 1) == 0 or blocks % m == 0)])
        sp.define_knob("tile_dw", _with_row(DW_CANDIDATES, g.OW) or [1])
        sp.define_knob("row_groups", [r for r in GROUP_CANDIDATES if r <= g.OH])
        most = tg.vector_registers // 2            # depthwise accumulators (the rest: weights, inputs)

        def valid(cfg):
            dvec = -(-dw_lanes(g.b, cfg["tile_oc_blocks"], lanes) // lanes)
            wvec = -(-cfg["tile_oc_blocks"] * g.b // lanes)      # a tile's channels are contiguous
            return tg.tile_fits(cfg["tile_ow"], wvec) and cfg["tile_dw"] * dvec <= most and \
                cfg["tile_dw"] * g.KH * g.KW <= MAX_TAPS and \
                cfg["tile_oc_blocks"] * g.ring * g.BW * g.b <= MAX_RING_FLOATS
        sp.constraint = valid
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        """The 1x1 tile as conv2d's default (one vector of channels per pixel, two without a broadcast
        operand; about half the accumulator registers, never fewer than keep the FMA pipes busy),
        the depthwise tile as depthwise_conv2d's, and the fewest row groups that share the items
        evenly among the threads, counting the ring rows a group computes again."""
        d = split(wl)
        g = Geometry(wl, d)
        tg = target.current()
        lanes = tg.lanes(4)
        per_pixel = lanes * tg.vectors_per_broadcast
        blocks = g.K // g.b
        # among the block counts whose last tile recomputes little, as conv2d's default
        ms = [m for m in space.knobs[1].values if m * g.b <= per_pixel and -(-blocks // m) * m <= 1.25 * blocks] \
            or space.knobs[1].values[:1]
        m = max(ms)
        vec = -(-m * g.b // lanes)                  # vectors of a tile's channels
        # twice the pixels where a tile's channels are half a vector (72 channels in blocks of 8 on
        # AVX-512): each accumulator is half full and loads bound the tile (MNASNet's 24 -> 72 and
        # 40 -> 120 on 56x56 and 28x28: 28 pixels ran 0.39-0.54 of 14 pixels' time; 144 channels
        # in blocks of 16 gained nothing from 28). Not for narrower blocks: ShuffleNetV2's 116
        # channels in blocks of 4 ran 3x slower with 28 pixels than with 14 (AMD EPYC Zen 4).
        half = 2 if 2 * m * g.b == lanes else 1
        want = max(tg.max_tile_vectors // 2, tg.accumulators_in_flight) * half // vec
        waste = row_waste(g.W)
        owts = [t for t in space.knobs[0].values if t * vec <= tg.max_tile_vectors] or [1]
        owt = min(owts, key=lambda t: (waste(t) > 0.15, abs(t - want), -t))
        # an epilogue that evaluates a polynomial (SiLU's sigmoid) keeps a few vectors live per pixel
        # while it runs: on AVX2's 16 registers 8 depthwise pixels spilled (EfficientNet-B0's fused
        # blocks ran 0.66-0.93 of their time with 4), on AVX-512's 32 the same 8 did not
        out = wl.outputs[0]
        lines, _ = epilogue(wl, wl.ops[d + 1:], "a0", ["n", ("kb", "j", g.b), "oh", "o0"], out.shape,
                            np.float32, f"v{d}", var="f0_", unsigned=True)
        share = 4 if calls_polynomial(lines) else 2
        dvec = -(-dw_lanes(g.b, m, lanes) // lanes)
        want_dw = max(1, min(tg.accumulators_in_flight, tg.vector_registers // share) // dvec)
        waste_dw = row_waste(g.OW)
        dws = [t for t in space.knobs[2].values if t * dvec <= tg.vector_registers // 2
               and t * g.KH * g.KW <= MAX_TAPS] or [1]
        dwt = min(dws, key=lambda t: (waste_dw(t) > 0.15, abs(t - want_dw), -t))
        items = g.N * -(-blocks // m)

        def cost(r):
            balance = -(-items * r // tg.threads) * tg.threads / (items * r)
            extra = max(0, g.ring - g.sh) * (r - 1) / (g.OH * g.sh)
            return balance * (1 + extra)
        rg = min(space.knobs[3].values, key=lambda r: (round(cost(r), 3), r))
        cfg = space.from_values({"tile_ow": owt, "tile_oc_blocks": m, "tile_dw": dwt, "row_groups": rg})
        return cfg if space.is_valid(cfg) else space.get(space.valid_indices(limit=1)[0])

    def row_epilogues(self, wl: Workload, cfg) -> tuple:
        """Whether the first conv's epilogue and the depthwise conv's run as loops over whole rows
        (`ring_epilogue`): where they evaluate a polynomial and a row holds several tiles (the
        depthwise conv's where its lane loop is one block)."""
        d = split(wl)
        g = Geometry(wl, d)
        t1, t2, m = min(cfg["tile_ow"], g.W), min(cfg["tile_dw"], g.OW), cfg["tile_oc_blocks"]
        first = g.W > t1 and polynomial_epilogue(wl, wl.ops[1:d], wl.spec(f"v{d - 1}").shape, "v0")
        second = g.OW > t2 and dw_lanes(g.b, m, target.current().lanes(4)) == g.b and \
            polynomial_epilogue(wl, wl.ops[d + 1:], wl.outputs[0].shape, f"v{d}")
        return first, second

    def imports(self) -> list:
        """Import lines the first conv's source needs."""
        return []

    def first_conv(self, wl: Workload, g: Geometry, cfg, X: str, xs: list, p: str):
        """Source of row r's first conv, for the item's KTW channels, through its epilogue into the
        ring (at indent `p`, inside the row loop: `sb` is the row's start); its kernel arguments,
        their dtypes and their pack(consts). Here float32 FMAs: conv2d's register tile."""
        OWT, m = min(cfg["tile_ow"], g.W), cfg["tile_oc_blocks"]
        b, cb, KTW = g.b, g.cb, cfg["tile_oc_blocks"] * g.b
        CBI, KBN = g.C // cb, g.K // b
        KT = -(-KBN // m)
        pw_ = wl.ops[0]
        bias1 = len(pw_.args) > 2 and bool(pw_.args[2])
        NT1 = -(-g.W // OWT)
        init1 = f"bias1[np.uintp(kb0 * {b}) + np.uintp(j)]" if bias1 else "np.float32(0.0)"
        body = [f"{p}for t in range({NT1}):",
                f"{p}    w0 = {shifted_start(f't * {OWT}', g.W, OWT)}",
                f"{p}    acc = stack_empty({OWT * KTW}, np.float32)",
                f"{p}    for j in range({KTW}):",
                *[f"{p}        acc[{q * KTW} + j] = {init1}" for q in range(OWT)],
                f"{p}    for ci in range({CBI}):"]
        # the first conv's window: loops only where it is wider than one (a 1x1 conv has none)
        win, kh1, kw1 = p + "        ", "0", "0"
        if g.KH1 > 1:
            body.append(f"{win}for kh1 in range({g.KH1}):")
            win, kh1 = win + "    ", "kh1"
        if g.KW1 > 1:
            body.append(f"{win}for kw1 in range({g.KW1}):")
            win, kw1 = win + "    ", "kw1"
        body += [f"{win}xb = np.uintp(xn + ci * {xs[1]} + (r * {g.s1h} + {kh1} + {g.hin - g.p1t}) * {xs[2]} "
                 f"+ (w0 * {g.s1w} + {kw1} + {g.hin - g.p1l}) * {cb})",
                 f"{win}wb = np.uintp(w1b + ((ci * {g.KH1} + {kh1}) * {g.KW1} + {kw1}) * {cb * KTW})",
                 f"{win}for c in range({cb}):",
                 *[f"{win}    x{q} = {X}[xb + np.uintp({q * g.s1w * cb} + c)]" for q in range(OWT)],
                 f"{win}    wo = wb + np.uintp(c * {KTW})",
                 f"{win}    for j in range({KTW}):",
                 f"{win}        wv = w1[wo + np.uintp(j)]",
                 *[f"{win}        acc[{q * KTW} + j] += x{q} * wv" for q in range(OWT)]]
        deferred = self.row_epilogues(wl, cfg)[0]
        body += ring_stores(wl, g, OWT, m, lambda q, mb: f"acc[{q * KTW + mb * b} + j]", p + "    ", deferred)
        if deferred:
            body += ring_epilogue(wl, g, m, p)
        w1_arg = int(pw_.args[1][1:])
        b1_arg = int(pw_.args[2][1:]) if bias1 else None

        def pack(consts):
            chans = tile_channels(KBN, m, b)
            w1 = np.asarray(consts[w1_arg], np.float32)[chans].reshape(KT, KTW, CBI, cb, g.KH1, g.KW1)
            res = {"w1": flat(w1.transpose(0, 2, 4, 5, 3, 1))}          # [tiles, C/cb, KH1, KW1, cb, m b]
            if bias1:
                res["bias1"] = flat(consts[b1_arg])
            return res
        args = ["w1"] + (["bias1"] if bias1 else [])
        return body, args, [np.float32] * len(args), pack

    def build(self, wl: Workload, cfg) -> Kernel:
        d = split(wl)
        g = Geometry(wl, d)
        pw_, dw_ = wl.ops[0], wl.ops[d]
        T2, G = min(cfg["tile_dw"], g.OW), min(cfg["row_groups"], g.OH)
        m = cfg["tile_oc_blocks"]
        b, cb, KH, KW = g.b, g.cb, g.KH, g.KW
        KBN = g.K // b
        KT, KTW = -(-KBN // m), m * b            # items' channel tiles (the last ends at block KBN); lanes
        RG = -(-g.OH // G)
        G = -(-g.OH // RG)                       # no empty group
        ring, BW = g.ring, g.BW
        rowsz = BW * KTW                         # a ring row: its columns' KTW channels, contiguous
        xs = strides(physical_shape((g.N, g.C, g.XH, g.XW), (cb, g.hin)))
        out = wl.outputs[0]
        os_ = strides(physical_shape(out.shape, out.layout))
        x_arg = int(pw_.args[0][1:])
        X = f"in{x_arg}"
        bias2 = len(dw_.args) > 2 and bool(dw_.args[2])
        zero = "np.float32(0.0)"

        item = ParallelItem()
        body = [item.loop(g.N * KT * G),
                *item.take("grp", G),
                *item.last("kt", KT, "n"),
                f"    kb0 = {shifted_start(f'kt * {m}', KBN, m)}",
                f"    ring = stack_empty({ring * rowsz}, np.float32)",
                f"    for q in range({ring}):"]
        # the padding columns of every ring row: zeros, once per item
        for c in [*range(g.pl), *range(g.pl + g.W, BW)]:
            body += [f"        for j in range({KTW}):",
                     f"            ring[np.uintp(q * {rowsz} + {c * KTW}) + np.uintp(j)] = {zero}"]
        body += [f"    oh_a = grp * {RG}",
                 f"    oh_b = min(oh_a + {RG}, {g.OH})",
                 f"    have = oh_a * {g.sh} - {g.pt + 1}",
                 f"    xn = n * {xs[0]}",
                 f"    w1b = kt * {g.C * g.KH1 * g.KW1 * KTW}",     # the tile's first-conv weights
                 "    for oh in range(oh_a, oh_b):",
                 f"        ih0 = oh * {g.sh} - {g.pt}",
                 f"        for r in range(max(have + 1, ih0), ih0 + {ring}):",
                 f"            sb = np.uintp(((r + {g.pt}) % {ring}) * {rowsz} + {g.pl * KTW})",
                 f"            if r < 0 or r >= {g.H}:",
                 f"                for q in range({g.W * KTW}):",
                 f"                    ring[sb + np.uintp(q)] = {zero}",
                 "                continue"]
        # the first conv of row r, the tile's m blocks of channels, into the ring
        first, args1, dtypes1, pack1 = self.first_conv(wl, g, cfg, X, xs, " " * 12)
        body += first
        # the depthwise conv of output row oh from the ring, a lane loop per DWW channels of the tile
        # (dw_lanes); where that spans blocks narrower than a vector the sums wait on the stack and
        # the epilogue and stores run block by block (a block's lanes are contiguous in the output)
        NT2 = -(-g.OW // T2)
        DWW = dw_lanes(b, m, target.current().lanes(4))
        mg = DWW // b                            # blocks per lane loop
        body += [f"        have = ih0 + {ring - 1}",
                 *[f"        rr{kh} = np.uintp(((ih0 + {kh * g.dh + g.pt}) % {ring}) * {rowsz})" for kh in range(KH)],
                 f"        for t in range({NT2}):",
                 f"            o0 = {shifted_start(f't * {T2}', g.OW, T2)}",
                 f"            cb0 = np.uintp(o0 * {g.sw * KTW})"]
        if mg > 1:
            body.append(f"            dws = stack_empty({T2 * DWW}, np.float32)")
        ops2 = wl.ops[d + 1:]
        # an epilogue with a polynomial runs over the output row once its tiles are summed (as the
        # first conv's, `ring_epilogue`; where a row holds one tile, the tile is the row), from a row
        # of the item's own: two items whose channel tiles overlap write the same output, and one
        # finishing in place could read the other's result
        late = self.row_epilogues(wl, cfg)[1]
        if late:
            body.insert(body.index("    for oh in range(oh_a, oh_b):"),
                        f"    orow = stack_empty({m * g.OW * b}, np.float32)")

        def block_base(pad, kb, col="o0"):    # output block kb's row at column `col` (the tile's)
            return [f"{pad}kb = {kb}", f"{pad}ob = np.uintp(n * {os_[0]} + kb * {os_[1]} + (oh + {g.hout}) * "
                                       f"{os_[2]} + {g.hout * b} + {col} * {b})"]

        def stores(pad, values):              # lane j of the block's T2 pixels, through the epilogue
            if late:
                return [f"{pad}orow[np.uintp(kb - kb0) * {g.OW * b} + np.uintp((o0 + {q}) * {b}) + np.uintp(j)] = "
                        f"{values(q)}" for q in range(T2)]
            lines = []
            for q in range(T2):
                eps, final = epilogue(wl, ops2, values(q), ["n", ("kb", "j", b), "oh", f"o0 + {q}"], out.shape,
                                      np.float32, f"v{d}", var=f"f{q}_", unsigned=True)
                lines += [pad + ln for ln in eps] + [f"{pad}out0[ob + np.uintp({q * b}) + np.uintp(j)] = {final}"]
            return lines
        for gi in range(KTW // DWW):
            p = " " * 12
            if mg == 1:
                body += block_base(p, f"kb0 + {gi}")
            lane = f"np.uintp({gi * DWW}) + np.uintp(j)"
            init2 = f"bias2[np.uintp(kb0 * {b}) + {lane}]" if bias2 else zero
            body += [f"{p}for j in range({DWW}):", *[f"{p}    a{q} = {init2}" for q in range(T2)]]
            for kh in range(KH):
                for kw in range(KW):
                    body.append(f"{p}    wk = w2[np.uintp(kt * {KH * KW * KTW} + {(kh * KW + kw) * KTW}) + {lane}]")
                    body += [f"{p}    a{q} = a{q} + ring[rr{kh} + cb0 + np.uintp({(q * g.sw + kw * g.dw) * KTW}) "
                             f"+ {lane}] * wk" for q in range(T2)]
            if mg == 1:
                body += stores(p + "    ", lambda q: f"a{q}")
            else:
                body += [f"{p}    dws[{q * DWW} + j] = a{q}" for q in range(T2)]
                for mb in range(mg):
                    body += [*block_base(p, f"kb0 + {gi * mg + mb}"), f"{p}for j in range({b}):",
                             *stores(p + "    ", lambda q, mb=mb: f"dws[{q * DWW + mb * b} + j]")]

        for mb in range(m if late else 0):
            eps, final = epilogue(wl, ops2, f"orow[{mb * g.OW * b} + q]",
                                  ["n", ("kb", f"(q % {b})", b), "oh", f"(q // {b})"], out.shape, np.float32,
                                  f"v{d}", var="f_", unsigned=True)
            body += [*block_base("        ", f"kb0 + {mb}", "0"), f"        for q in range({g.OW * b}):",
                     *(f"            {ln}" for ln in eps), f"            out0[ob + np.uintp(q)] = {final}"]
        extra = [k for k in epilogue_inputs(wl.ops[1:d] + ops2) if k != x_arg]
        args = ["out0", X] + args1 + ["w2"] + (["bias2"] if bias2 else []) + [f"in{k}" for k in extra]
        dtypes = [wl.outputs[0].dtype, wl.spec(wl.ops[0].args[0]).dtype] + dtypes1 + [np.float32] * (1 + bias2) + \
            [wl.inputs[k].dtype for k in extra]
        w2_arg = int(dw_.args[1][1:])
        b2_arg = int(dw_.args[2][1:]) if bias2 else None

        def pack(consts):
            w2 = np.asarray(consts[w2_arg], np.float32)[tile_channels(KBN, m, b)].reshape(KT, KTW, KH, KW)
            res = {**pack1(consts), "w2": flat(w2.transpose(0, 2, 3, 1))}   # [tiles, KH, KW, m b]
            if bias2:
                res["bias2"] = flat(consts[b2_arg])
            return res
        # in order unless an epilogue calls the sigmoid polynomial, as conv2d (its reasons)
        return Kernel(source(args, dtypes, body, reassoc=calls_polynomial(body), extra=self.imports()), args, pack)
