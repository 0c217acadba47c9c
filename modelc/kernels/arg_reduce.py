"""ArgMax / ArgMin: the index of the extreme along one axis, as a tunable reduction.

Row scans (the axis innermost) or per-lane column scans over blocks of contiguous kept elements,
with the reduce template's task loop and knobs. NaN counts as the extreme, as in numpy.
"""
from __future__ import annotations

import math

import numpy as np

from .expr import ctor, lit
from .rows import (axis_index, column_blocks, column_tasks, default_row_or_column, define_row_or_column, finish,
                   store, tasks_loop)
from .space import ConfigSpace
from .template import INT_OR_FLOAT, Kernel, Template, chain_ok, plain_anchor_input, register
from .workload import Workload


ARGS = {"ArgMax", "ArgMin"}


def _arg_geometry(wl: Workload):
    a = wl.anchor
    shape = wl.spec(a.args[0]).shape
    ax = axis_index(a.attrs.get("axis", 0), len(shape))
    return shape, ax, math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1:])


def _isnan(v: str, dt) -> str:
    """A NaN test of the IEEE bits (see expr._float_class: no fast-math assumption folds it)."""
    bits = 32 if np.dtype(dt) == np.float32 else 64
    it = np.dtype(f"int{bits}")
    return f"((float_bits({v}) & {lit((1 << (bits - 1)) - 1, it)}) > {lit(int(np.array(np.inf, dt).view(it)), it)})"


def arg_better(op: str, last: bool, v: str, best: str, dt) -> str:
    """When `v` replaces `best` in a scan that keeps the first (or `last`) index of the maximum
    (ArgMax) or minimum (ArgMin). NaN counts as the extreme, as in numpy (the reference): the
    first NaN wins, or the last with select_last_index."""
    cmp = (">=" if last else ">") if op == "ArgMax" else ("<=" if last else "<")
    if np.dtype(dt).kind != "f":
        return f"{v} {cmp} {best}"
    nv, nb = _isnan(v, dt), _isnan(best, dt)
    if last:
        return f"{nv} or (not {nb} and {v} {cmp} {best})"
    return f"not {nb} and ({nv} or {v} {cmp} {best})"


@register
class ArgReduce(Template):
    """ArgMax / ArgMin over one axis (keepdims, select_last_index), int64 indices, with any
    elementwise epilogue. Rows (the axis innermost) are scalar scans; otherwise a block of
    `vector_width` contiguous kept elements is scanned together (value and index per lane)."""
    name = "arg_reduce"

    def matches(self, wl: Workload) -> bool:
        if plain_anchor_input(wl, ARGS, INT_OR_FLOAT) is None:
            return False
        return _arg_geometry(wl)[3] > 0 and chain_ok(wl)

    def space(self, wl: Workload) -> ConfigSpace:
        shape, ax, outer, L, inner = _arg_geometry(wl)
        sp = ConfigSpace()
        define_row_or_column(sp, outer, inner)
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        shape, ax, outer, L, inner = _arg_geometry(wl)
        return space.from_values(default_row_or_column(space, outer, inner, outer * L * inner))

    def build(self, wl: Workload, cfg) -> Kernel:
        shape, ax, outer, L, inner = _arg_geometry(wl)
        a = wl.anchor
        last = bool(a.attrs.get("select_last_index", 0))
        dt = wl.spec(a.args[0]).dtype
        x_arg = int(a.args[0][1:])
        X = f"in{x_arg}"
        RPT = cfg["rows_per_task"]

        if inner == 1:
            body, ind = tasks_loop(outer, RPT, [])
            body += [f"{ind}base = o * {L}",
                     f"{ind}best = {X}[np.uintp(base)]",
                     f"{ind}bi = 0",
                     f"{ind}for i in range(1, {L}):",
                     f"{ind}    v = {X}[np.uintp(base + i)]",
                     f"{ind}    if {arg_better(a.op, last, 'v', 'best', dt)}:",
                     f"{ind}        best = v",
                     f"{ind}        bi = i"]
            body += store(wl, ind, "np.int64(bi)", "o")
            return finish(wl, body, [x_arg], cfg["parallel"])

        W = min(cfg["vector_width"], inner)
        stacks = [f"acc = carray(stack_empty({W}, {ctor(dt)}), {W})", f"aci = carray(stack_empty({W}, np.int64), {W})"]
        body, ind, nfull, tail = column_tasks(outer, inner, L, W, RPT, stacks)

        def column(ind, width):
            lines = [f"{ind}for q in range({width}):",
                     f"{ind}    acc[q] = {X}[np.uintp(base + q)]",
                     f"{ind}    aci[q] = 0",
                     f"{ind}for l in range(1, {L}):",
                     f"{ind}    xb = np.uintp(base + l * {inner})",
                     f"{ind}    for q in range({width}):",
                     f"{ind}        v = {X}[xb + np.uintp(q)]",
                     f"{ind}        if {arg_better(a.op, last, 'v', 'acc[q]', dt)}:",
                     f"{ind}            acc[q] = v",
                     f"{ind}            aci[q] = l",
                     f"{ind}for q in range({width}):"]
            lines += store(wl, ind + "    ", "aci[q]", f"np.uintp(ob * {inner} + blk * {W} + q)")
            return lines

        body += column_blocks(ind, nfull, tail, W, column)
        return finish(wl, body, [x_arg], cfg["parallel"])
