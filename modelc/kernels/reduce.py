"""Reduce* (Mean, Sum, Max, Min, SumSquare, L1, L2, Prod, LogSum) on plain layouts, over rows or
blocks of columns (rows.py).

The input's axes are merged into groups of adjacent reduced or kept axes; when the last group is
reduced every output is a row reduction (nested loops over the outer reduced groups around a
vectorised row fold), else a column reduction over blocks of contiguous kept elements. Sums
accumulate in float64 beyond 1024 reduced elements per output.
"""
from __future__ import annotations

import math

import numpy as np

from .expr import ctor, lit
from .intrinsics import imports
from .layout import strides
from .rows import (axis_index, column_blocks, default_row_or_column, define_row_or_column, finish, row_fold,
                   store, tasks_loop)
from .space import ConfigSpace
from .template import Kernel, Template, chain_ok, register
from .workload import Workload

EXTRA = [imports("f32_from_bits", "fmax", "fmin")]
REDUCES = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2", "ReduceL1",
           "ReduceProd", "ReduceLogSum"}


def _reduce_axes(wl: Workload):
    """Sorted reduced axes (a tuple; empty = no reduction), or None when not inlined."""
    a = wl.anchor
    rank = len(wl.spec(a.args[0]).shape)
    if len(a.args) > 1 and a.args[1]:
        if not a.args[1].startswith("p"):
            return None
        axes = [int(v) for v in np.ravel(wl.params[a.args[1]])]
    elif "axes" in a.attrs:
        axes = [int(v) for v in a.attrs["axes"]]
    else:
        axes = []
    if not axes:
        return () if int(a.attrs.get("noop_with_empty_axes", 0)) else tuple(range(rank))
    return tuple(sorted({axis_index(v, rank) for v in axes}))


def _groups(shape, axes) -> list:
    """Adjacent axes merged into (size, reduced, stride) groups; size-1 axes dropped."""
    st = strides(shape)
    out = []
    for k, d in enumerate(shape):
        if d == 1:
            continue
        red = k in axes
        if out and out[-1][1] == red:
            out[-1] = (out[-1][0] * d, red, st[k])
        else:
            out.append((d, red, st[k]))
    return out


def _reduce_geometry(wl: Workload):
    shape = wl.spec(wl.anchor.args[0]).shape
    axes = _reduce_axes(wl)
    groups = _groups(shape, axes)
    count = math.prod(d for d, r, s in groups if r)
    row = bool(groups) and groups[-1][1]            # reduced axes innermost
    inner = 1 if row or not groups else groups[-1][0]
    kept = [(d, s) for d, r, s in (groups if row else groups[:-1]) if not r]
    red = [(d, s) for d, r, s in groups if r]
    outer = math.prod(d for d, s in kept)
    return dict(shape=shape, axes=axes, count=count, row=row, inner=inner, kept=kept, red=red, outer=outer)


@register
class Reduce(Template):
    name = "reduce"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op not in REDUCES or not a.args[0].startswith("i"):
            return False
        # the epilogue may end in another type (ReduceMax -> Equal gives bool)
        x = wl.spec(a.args[0])
        if x.layout is not None or x.dtype not in (np.float32, np.float64) or wl.outputs[0].layout is not None:
            return False
        return _reduce_axes(wl) is not None and chain_ok(wl)

    def space(self, wl: Workload) -> ConfigSpace:
        g = _reduce_geometry(wl)
        sp = ConfigSpace()
        define_row_or_column(sp, g["outer"], g["inner"], columns=not g["row"])
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        g = _reduce_geometry(wl)
        total = g["outer"] * g["inner"] * g["count"]
        return space.from_values(default_row_or_column(space, g["outer"], g["inner"], total,
                                                         columns=not g["row"]))

    def build(self, wl: Workload, cfg) -> Kernel:
        g = _reduce_geometry(wl)
        op = wl.anchor.op
        dt = wl.spec(wl.anchor.args[0]).dtype        # the reduction's type; the epilogue may change it
        T = ctor(dt)
        summing = op not in ("ReduceMax", "ReduceMin")
        at = np.dtype(np.float64) if summing and g["count"] > 1024 else np.dtype(dt)
        A = ctor(at)
        x_arg = int(wl.anchor.args[0][1:])
        X = f"in{x_arg}"
        RPT = cfg["rows_per_task"]
        init = {"ReduceMax": lit(-np.inf, at), "ReduceMin": lit(np.inf, at),
                "ReduceProd": lit(1, at)}.get(op, lit(0, at))

        def comb(p, q):
            return {"ReduceMax": f"fmax({p}, {q})", "ReduceMin": f"fmin({p}, {q})",
                    "ReduceProd": f"{p} * {q}"}.get(op, f"{p} + {q}")

        def load(i):
            v = f"{X}[{i}]" if at == dt else f"{A}({X}[{i}])"
            if op in ("ReduceSumSquare", "ReduceL2"):
                return f"({v} * {v})"
            return f"abs({v})" if op == "ReduceL1" else v

        def post(s):
            if op == "ReduceMean":
                s = f"{s} * {lit(1.0 / g['count'], at)}"
            elif op == "ReduceL2":
                s = f"math.sqrt({s})"
            elif op == "ReduceLogSum":
                s = f"math.log({s})"
            return s if at == dt else f"{T}({s})"

        kept, red = g["kept"], g["red"]

        def kept_base(ind, o):
            """Input offset of kept-outer index `o` (its groups split by div/mod)."""
            terms, rest = [], 1
            for d, s in reversed(kept):
                e = o if rest == 1 else f"({o} // {rest})"
                if rest * d != g["outer"]:
                    e = f"({e} % {d})"
                terms.append(f"{e} * {s}")
                rest *= d
            return [f"{ind}base = " + (" + ".join(reversed(terms)) if terms else "0")]

        def red_loops(ind, inner_red):
            """Nested loops over the reduced groups (all but the innermost if `inner_red`)."""
            loops = red[:-1] if inner_red else red
            lines, off = [], "base"
            for k, (d, s) in enumerate(loops):
                lines += [f"{ind}for r{k} in range({d}):"]
                ind += "    "
                lines += [f"{ind}b{k} = {off} + r{k} * {s}"]
                off = f"b{k}"
            return lines, ind, off

        if g["row"]:
            L = red[-1][0]
            body, ind = tasks_loop(g["outer"], RPT, [])
            body += kept_base(ind, "o")
            body += [f"{ind}tot = {init}"]
            loops, ind2, off = red_loops(ind, True)
            body += loops
            body += row_fold(L, off, load, comb, init, "s", ind2)
            body += [f"{ind2}tot = {comb('tot', 's')}"]
            body += store(wl, ind, post("tot"), "o")
            return finish(wl, body, [x_arg], cfg["parallel"], EXTRA)

        inner = g["inner"]
        W = min(cfg["vector_width"], inner)
        nfull, tail = inner // W, inner % W
        nblk = nfull + (tail > 0)
        body, ind = tasks_loop(g["outer"] * nblk, RPT, [f"acc = carray(stack_empty({W}, {A}), {W})"])
        body += [f"{ind}ob = o // {nblk}", f"{ind}blk = o % {nblk}"]
        body += kept_base(ind, "ob")
        body += [f"{ind}base = base + blk * {W}"]

        def column(ind, width):
            lines = [f"{ind}for q in range({width}):", f"{ind}    acc[q] = {init}"]
            loops, ind2, off = red_loops(ind, False)
            lines += loops
            lines += [f"{ind2}xb = np.uintp({off})",
                      f"{ind2}for q in range({width}):",
                      f"{ind2}    acc[q] = {comb('acc[q]', load('xb + np.uintp(q)'))}"]
            lines += [f"{ind}for q in range({width}):"]
            lines += store(wl, ind + "    ", post("acc[q]"), f"np.uintp(ob * {inner} + blk * {W} + q)")
            return lines

        body += column_blocks(ind, nfull, tail, W, column)
        return finish(wl, body, [x_arg], cfg["parallel"], EXTRA)
