"""Injective groups: elementwise, broadcast and data-movement ops fused into one loop nest.

The kernel loops over each output's logical elements (in the output's physical order, so stores
are contiguous) and computes each element by the group's index map (index_map.py). Layout
transforms (plain <-> blocked) are Identity groups with different input and output layouts, so
they are this template too.
"""
from __future__ import annotations

import math

import numpy as np

from .. import target
from .expr import SUPPORTED as ELEMENTWISE
from .codegen import ParallelItem
from .index_map import IndexMap, pad_folds
from .layout import offset
from .resize_map import resize_taps
from .space import ConfigSpace
from .template import Kernel, Template, parallel_loop, register, source
from .workload import Workload

MOVES = {"Reshape", "Transpose", "Concat", "Slice", "Gather", "Expand", "Tile", "Pad", "Split",
         "Flatten", "Squeeze", "Unsqueeze", "Resize", "GatherElements", "GatherND", "Trilu", "OneHot",
         "EyeLike", "DepthToSpace", "SpaceToDepth", "GridSample"}
CHANNEL_OPS = {"BatchNormalization"}    # elementwise, with parameters along axis 1 (not epilogues)
# ops that only move elements: a group of them maps each output element to one input element
PURE_MOVES = {"Reshape", "Transpose", "Slice", "Squeeze", "Unsqueeze", "Flatten", "Split", "DepthToSpace",
              "SpaceToDepth", "Identity"}
LINE_BYTES = 64                         # every x86-64 CPU's cache line


@register
class Injective(Template):
    name = "injective"
    tunable = False
    priority = 10

    def matches(self, wl: Workload) -> bool:
        for op in wl.ops:
            if op.op in CHANNEL_OPS:
                x = wl.spec(op.args[0])
                if len(x.shape) < 2 or x.dtype.kind != "f" or len(op.args) < 5 or \
                        any(wl.spec(r).shape != (x.shape[1],) for r in op.args[1:5]):
                    return False
                continue
            if op.op not in ELEMENTWISE and op.op not in MOVES:
                return False
            if op.op == "Pad" and op.attrs.get("mode", "constant") != "constant" and (
                    any(x.startswith("i") for x in op.args[1:] if x) or not pad_folds(op, wl)):
                return False                    # nothing to reflect or repeat: the reference says why
            if op.op in ("DepthToSpace", "SpaceToDepth") and len(wl.spec(op.args[0]).shape) != 4:
                return False
            if op.op == "GridSample" and any(wl.spec(r).dtype not in (np.float32, np.float64) for r in op.args[:2]):
                return False                    # (float16 images: the reference)
            if op.op in ("Slice", "Pad", "Split") and any(     # Pad's value may be an input
                    x.startswith("i") for j, x in enumerate(op.args[1:], 1) if x and (op.op, j) != ("Pad", 2)):
                return False
            if op.op == "Resize" and (resize_taps(op, wl.spec(op.args[0]).shape, wl.params) is None or (
                    op.attrs.get("mode", "nearest") != "nearest" and not (
                        wl.spec(op.args[0]).dtype.kind == "f" or          # integers: up to 32 bits,
                        (wl.spec(op.args[0]).dtype.kind in "iu" and      # whose range float64 holds
                         wl.spec(op.args[0]).dtype.itemsize <= 4)))):
                return False
        return all(t.dtype.kind in "biuf" for t in wl.outputs)

    def space(self, wl: Workload) -> ConfigSpace:
        sp = ConfigSpace()
        sp.define_knob("inner_extent", ["last_dim"])
        return sp

    def build(self, wl: Workload, cfg) -> Kernel:
        gen = IndexMap(wl)
        body = []
        pending = list(enumerate(zip(wl.outputs, wl.output_values)))
        while pending:
            k, (out, ref) = pending.pop(0)
            # outputs of one shape and layout (a recurrent cell's state and output) share one loop,
            # so the values they have in common are computed once per element
            twins = [(j, r) for j, (o, r) in pending if o.shape == out.shape and o.layout == out.layout]
            pending = [p for p in pending if p[0] not in {j for j, _ in twins}]
            body += self._loop(gen, k, out, ref, twins)
        ins = sorted({int(r[1:]) for op in wl.ops for r in op.args if r.startswith("i")})
        params = {p: np.ascontiguousarray(wl.params[p]).reshape(-1) for p in gen.params_used}
        params.update(gen.tables)
        args = [f"out{k}" for k in range(len(wl.outputs))] + [f"in{k}" for k in ins] + sorted(params)
        dtypes = [t.dtype for t in wl.outputs] + [wl.inputs[k].dtype for k in ins] + \
            [params[p].dtype for p in sorted(params)]
        return Kernel(source(args, dtypes, body or ["pass"]), args, lambda consts: dict(params))

    def _loop(self, gen: IndexMap, k: int, out, ref: str, twins=()) -> list:
        shape = out.shape
        inner = None
        parts = _channel_parts(gen.wl, ref, out) if not twins else None
        if parts is not None:
            # a channel concat of whole blocks: a loop per part, each reading its own input, no
            # branch on the channel per element (DenseNet-161's concat + BN + ReLU of 45 parts
            # into 2208 x 7 x 7: 0.13 ms, onnxruntime 0.03; AMD EPYC Zen 4)
            index, bounds = parts
            b = out.layout[0]
            n, c, h, w = shape
            lines = []
            for j, (start, size) in enumerate(bounds):
                gen.parts = {index: j}
                lines += self._nest(gen, k, out, ref, [n, size // b, h, w, b], ["a0", "a1", "a2", "a3", "a4"],
                                    ["a0", (f"a1 + {start // b}", "a4", b), "a2", "a3"], 1)
            gen.parts = {}
            return lines
        if out.layout:                      # iterate in physical order: n, c block, y, x, lane
            b = out.layout[0]
            n, c, h, w = shape
            dims = [n, c // b, h, w, b]
            names = ["a0", "a1", "a2", "a3", "a4"]
            logical = ["a0", ("a1", "a4", b), "a2", "a3"]
            if b >= 8 and not twins and _from_plain_rows(gen.wl, h, w):
                # from plain rows (a layout transform, ShuffleNet's channel shuffle into blocks): a
                # row of all lanes per item, lane by lane, so that reads run along the input's rows
                # and the channel arithmetic is once per lane, not per element (its 112 x 56 x 56
                # shuffle 1.0 -> 0.13 ms on one thread; onnxruntime 0.046 on two; AMD EPYC Zen 4)
                dims, names, inner = [n, c // b, h, b, w], ["a0", "a1", "a2", "a4", "a3"], 2
        else:
            tile = _transpose_tile(gen.wl, [k, *(j for j, _ in twins)], out)
            if tile is not None:
                return self._tiled_nest(gen, k, out, ref, *tile, twins)
            dims = list(shape) or [1]
            names = [f"a{j}" for j in range(len(dims))]
            logical = names[:len(shape)]
        inner = inner or _inner_dims(dims, target.current().threads)
        return self._nest(gen, k, out, ref, dims, names, logical, inner, twins)

    @staticmethod
    def _nest(gen: IndexMap, k: int, out, ref: str, dims, names, logical, inner, twins=()) -> list:
        shape = out.shape
        outer = dims[:-inner]
        total = math.prod(outer) if outer else 1
        lines = [parallel_loop("it", total)]
        rest = "it"
        for j in range(len(outer) - 1, -1, -1):
            if j == 0:
                lines.append(f"    {names[0]} = {rest}")
            else:
                lines.append(f"    {names[j]} = {rest} % {outer[j]}")
                lines.append(f"    r{j} = {rest} // {outer[j]}")
                rest = f"r{j}"
        ind = "    "
        for j in range(len(dims) - inner, len(dims)):
            lines.append(f"{ind}for {names[j]} in range({dims[j]}):")
            ind += "    "
        stmts, memo = [], {}
        at = f"np.uintp({offset(shape, out.layout, logical if shape else [])})"
        stores = [f"{ind}out{j}[{at}] = {gen.value(r, logical if shape else [], stmts, ind, memo)}"
                  for j, r in [(k, ref), *twins]]
        return lines + stmts + stores

    @staticmethod
    def _tiled_nest(gen: IndexMap, k: int, out, ref: str, axis: int, tile: int, twins=()) -> list:
        """A transpose's nest: an item per `tile` indices of `axis` (along which the input is
        contiguous) and every index of the others but the last; it walks the last axis, and under
        it the tile, so each input line read and each output line written is used whole while in
        the L1. A loop down the last axis alone read a line per element: the transformer's copy of
        K transposed (128 x 4 x 64 from 128 x 768) took 44 us on one thread, tiled 8 (Intel Xeon,
        Emerald Rapids)."""
        shape = out.shape
        last, names = len(shape) - 1, [f"a{j}" for j in range(len(shape))]
        blocks = -(-shape[axis] // tile)
        outer = [(f"b{j}", blocks) if j == axis else (names[j], shape[j]) for j in range(last)]
        # too few items for the threads (a [4096, 16] -> [16, 4096] transpose is one tile): the
        # last axis is cut into runs of whole tiles too
        items, threads = math.prod(d for _, d in outer), target.current().threads
        runs = max(1, min(-(-4 * threads // items), shape[last] // tile))
        run = -(-shape[last] // runs // tile) * tile
        runs = -(-shape[last] // run)
        if runs > 1:
            outer.append((f"c{last}", runs))
        item = ParallelItem()
        lines = [item.loop(math.prod(d for _, d in outer))]
        for name, d in reversed(outer[1:]):
            lines += item.take(name, d)
        lines.append(f"    {outer[0][0]} = {item.rest}")
        end = f"b{axis} * {tile} + {tile}"
        if shape[axis] % tile:
            end = f"min({end}, {shape[axis]})"
        walk = f"range(c{last} * {run}, min(c{last} * {run} + {run}, {shape[last]}))" if runs > 1 else \
            f"range({shape[last]})"
        lines += [f"    for {names[last]} in {walk}:",
                  f"        for {names[axis]} in range(b{axis} * {tile}, {end}):"]
        ind, stmts, memo = " " * 12, [], {}
        at = f"np.uintp({offset(shape, None, names)})"
        stores = [f"{ind}out{j}[{at}] = {gen.value(r, names, stmts, ind, memo)}" for j, r in [(k, ref), *twins]]
        return lines + stmts + stores


def _transpose_tile(wl: Workload, ks: list, out):
    """(axis, tile) where outputs `ks` (of `out`'s shape, stored from one loop) are a transpose
    worth tiling alike: plain outputs of a group that moves the elements of one plain input (and
    maps each alone: `_as_move`), whose last axis reads the input more than a line apart while
    another axis reads it contiguously. The strides come from tracing each element's source through
    the reference executor (an input of its own indices), once for all the outputs."""
    x = wl.inputs[0] if len(wl.inputs) == 1 else None
    if out.layout or len(out.shape) < 2 or x is None or x.const or x.layout or x.size > 1 << 24:
        return None
    ops = [_as_move(wl, op) for op in wl.ops]
    if None in ops:
        return None
    tile = max(LINE_BYTES // out.dtype.itemsize, 1)
    if out.shape[-1] < tile or out.size < tile * tile:
        return None
    as_index = {**wl.json, "ops": ops, "inputs": [{**wl.json["inputs"][0], "dtype": "int32"}],
                "outputs": [{**t, "dtype": "int32"} for t in wl.json["outputs"]]}
    traced = Workload(as_index).reference([np.arange(x.size, dtype=np.int32).reshape(x.shape)])
    rank, origin = len(out.shape), (0,) * len(out.shape)
    found = set()
    for src in (traced[k] for k in ks):
        def stride(axis):
            return int(src[tuple(1 if j == axis else 0 for j in range(rank))]) - int(src[origin])
        axes = [j for j in range(rank - 1) if out.shape[j] >= tile // 2 and stride(j) == 1]
        found.add(axes[-1] if axes and abs(stride(rank - 1)) >= tile else None)
    axis = found.pop() if len(found) == 1 else None
    return None if axis is None else (axis, tile)


def _as_move(wl: Workload, op) -> dict | None:
    """Op `op` as the move it makes of its elements (for tracing them): itself if it only moves
    them (a Gather's indices constants), an Identity if it maps each element alone (elementwise, its
    other operands scalar constants: ViT's K scaled as it is transposed), else None."""
    js = {"op": op.op, "attrs": dict(op.attrs), "args": list(op.args)}
    if op.op in PURE_MOVES or op.op == "Gather" and op.args[1].startswith("p"):
        return js
    data = [a for a in op.args if a and not a.startswith("p")]
    if op.op in ELEMENTWISE and len(data) == 1 and all(
            wl.params[a].size == 1 for a in op.args if a and a.startswith("p")):
        return {"op": "Identity", "attrs": {}, "args": data}
    return None


def _channel_parts(wl: Workload, ref: str, out):
    """(the Concat's op index, [(first channel, channels)] per part) where output `ref` is, through
    elementwise ops only, one Concat along the channels of a blocked output, every part whole blocks."""
    if not out.layout or len(out.shape) != 4:
        return None
    concats = [op for op in wl.ops if op.op == "Concat"]
    if len(concats) != 1:
        return None
    cat = concats[0]
    b = out.layout[0]
    shape = wl.spec(f"v{cat.index}").shape
    sizes = [wl.spec(a).shape[1] for a in cat.args] if len(shape) == 4 else []
    if not sizes or cat.attrs["axis"] % 4 != 1 or shape[1] != out.shape[1] or any(s % b for s in sizes):
        return None
    producer = {f"v{op.index}": op for op in wl.ops}

    def through(r) -> bool:           # every route from r to the concat runs through elementwise ops
        op = producer.get(r)
        if op is None or op is cat:
            return True
        if op.op in ELEMENTWISE or op.op in CHANNEL_OPS:
            return all(through(a) for a in op.args if a)
        return not upstream(r)

    def upstream(r) -> bool:          # the concat feeds r
        op = producer.get(r)
        return op is not None and (op is cat or any(upstream(a) for a in op.args if a))
    if not upstream(ref) or not through(ref):
        return None
    starts = [sum(sizes[:j]) for j in range(len(sizes))]
    return cat.index, [(st, sz) for st, sz in zip(starts, sizes) if sz]


def _from_plain_rows(wl: Workload, h: int, w: int) -> bool:
    """Whether every tensor the group reads is plain and one of them a whole image of h x w (or more)
    pixels: the group then moves plain rows into blocks."""
    ins = [t for t in wl.inputs if not t.const]
    return bool(ins) and all(t.layout is None for t in ins) and \
        any(len(t.shape) >= 2 and math.prod(t.shape[-2:]) >= h * w > 1 for t in ins)


def _inner_dims(dims: list, threads: int) -> int:
    """How many trailing dims one parallel item loops over: the last, and the one before it too
    when the last is shorter than a vector's worth of lanes (a block of 3 or 4 channels) and enough
    rows are left to share among the threads. An item per pixel paid two divisions per 3 floats
    copied: the input's layout transform of a 224x224 image took 0.11 ms of MobileNetV2's 3.7 (AMD
    EPYC Zen 4); a row of it, 0.035. Blocks of 8 or more lanes keep an item per pixel: over a row,
    LLVM unrolled the lanes and vectorised across pixels with gathers and scatters (EfficientNet's
    x * scale[c] on 144x56x56 went 0.09 -> 0.18 ms)."""
    if len(dims) >= 2 and dims[-1] < 8 and math.prod(dims[:-2]) >= 8 * threads:
        return 2
    return 1
