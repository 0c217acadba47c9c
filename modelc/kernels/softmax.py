"""Softmax and LogSoftmax on plain layouts, over rows or blocks of columns (rows.py).

numba has no vector exp here (no SVML), so float32 softmax uses the exp polynomial of
intrinsics.py, which vectorises; it is accurate to a few ulp on the softmax range (x - max <= 0,
clamped at -87). A row softmax may keep exp(x - max) in the output between its passes
(`store_exp`) or compute it twice.
"""
from __future__ import annotations

import math

import numpy as np

from .expr import ctor, lit
from .intrinsics import exp_lines, imports
from .rows import (axis_index, column_blocks, column_tasks, default_row_or_column, define_row_or_column, finish,
                   plain_float, row_fold, store, tasks_loop, unflatten)
from .space import ConfigSpace
from .template import Kernel, Template, chain_ok, epilogue_inputs, register
from .workload import Workload

EXTRA = [imports("f32_from_bits", "fmax", "fmin")]


def _softmax_geometry(wl: Workload):
    a = wl.anchor
    shape = wl.spec(a.args[0]).shape
    ax = axis_index(a.attrs.get("axis", -1), len(shape))
    outer = math.prod(shape[:ax])
    inner = math.prod(shape[ax + 1:])
    return shape, ax, outer, shape[ax], inner


@register
class Softmax(Template):
    name = "softmax"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        return a.op in ("Softmax", "LogSoftmax") and a.args[0].startswith("i") and \
            plain_float(wl, a.args[0]) and chain_ok(wl)

    def space(self, wl: Workload) -> ConfigSpace:
        shape, ax, outer, L, inner = _softmax_geometry(wl)
        sp = ConfigSpace()
        if inner == 1 and wl.anchor.op == "Softmax":
            sp.define_knob("store_exp", [True, False])
        define_row_or_column(sp, outer, inner)
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        shape, ax, outer, L, inner = _softmax_geometry(wl)
        vals = {"store_exp": True} if inner == 1 and wl.anchor.op == "Softmax" else {}
        vals.update(default_row_or_column(space, outer, inner, 4 * outer * L * inner))
        return space.from_values(vals)

    def build(self, wl: Workload, cfg) -> Kernel:
        shape, ax, outer, L, inner = _softmax_geometry(wl)
        log = wl.anchor.op == "LogSoftmax"
        dt = wl.outputs[0].dtype
        T = ctor(dt)
        x_arg = int(wl.anchor.args[0][1:])
        X = f"in{x_arg}"
        RPT = cfg["rows_per_task"]
        ninf, zero, one = lit(-np.inf, dt), lit(0, dt), lit(1, dt)

        if inner == 1:
            # ---- row softmax: each row of L contiguous elements ---------------------------
            store_exp = not log and cfg["store_exp"]
            body, ind = tasks_loop(outer, RPT, [])
            body += [f"{ind}base = o * {L}"]
            body += row_fold(L, "base", lambda i: f"{X}[{i}]", lambda a, b: f"fmax({a}, {b})", ninf, "m", ind)
            body += [f"{ind}s = {zero}", f"{ind}for i in range({L}):", f"{ind}    xi = np.uintp(base + i)"]
            body += [f"{ind}    {ln}" for ln in exp_lines("ev", f"{X}[xi] - m", dt, "x")]
            if store_exp:
                body += [f"{ind}    out0[xi] = ev"]
            body += [f"{ind}    s += ev"]
            body += [f"{ind}lse = m + math.log(s)" if log else f"{ind}inv = {one} / s"]
            body += [f"{ind}for i in range({L}):", f"{ind}    xi = np.uintp(base + i)"]
            if log:
                v = f"({X}[xi] - lse)"
            elif store_exp:
                v = "(out0[xi] * inv)"
            else:
                body += [f"{ind}    {ln}" for ln in exp_lines("ev", f"{X}[xi] - m", dt, "y")]
                v = "(ev * inv)"
            idx = None
            if epilogue_inputs(wl.epilogue):
                idx = unflatten("o", shape[:ax]) + unflatten("i", shape[ax:])
            body += store(wl, ind + "    ", v, "xi", idx)
            return finish(wl, body, [x_arg], cfg["parallel"], EXTRA)

        # ---- column softmax: blocks of W contiguous inner elements, reduced over L ---------
        W = min(cfg["vector_width"], inner)
        body, ind, nfull, tail = column_tasks(outer, inner, L, W, RPT, [f"acc = carray(stack_empty({W}, {T}), {W})",
                                                                          f"acs = carray(stack_empty({W}, {T}), {W})"])

        def column(ind, width):
            lines = [f"{ind}for q in range({width}):", f"{ind}    acc[q] = {ninf}", f"{ind}    acs[q] = {zero}",
                     f"{ind}for l in range({L}):", f"{ind}    xb = np.uintp(base + l * {inner})",
                     f"{ind}    for q in range({width}):",
                     f"{ind}        acc[q] = fmax(acc[q], {X}[xb + np.uintp(q)])",
                     f"{ind}for l in range({L}):", f"{ind}    xb = np.uintp(base + l * {inner})",
                     f"{ind}    for q in range({width}):"]
            lines += [f"{ind}        {ln}" for ln in exp_lines("ev", f"{X}[xb + np.uintp(q)] - acc[q]", dt, "x")]
            if not log:
                lines += [f"{ind}        out0[xb + np.uintp(q)] = ev"]
            lines += [f"{ind}        acs[q] += ev",
                      f"{ind}for q in range({width}):"]
            lines += [f"{ind}    acs[q] = acc[q] + math.log(acs[q])" if log else f"{ind}    acs[q] = {one} / acs[q]"]
            lines += [f"{ind}for l in range({L}):", f"{ind}    xb = np.uintp(base + l * {inner})",
                      f"{ind}    for q in range({width}):", f"{ind}        xi = xb + np.uintp(q)"]
            v = f"({X}[xi] - acs[q])" if log else "(out0[xi] * acs[q])"
            idx = None
            if epilogue_inputs(wl.epilogue):
                idx = unflatten("ob", shape[:ax]) + ["l"] + unflatten(f"blk * {W} + q", shape[ax + 1:])
            lines += store(wl, ind + "        ", v, "xi", idx)
            return lines

        body += column_blocks(ind, nfull, tail, W, column)
        return finish(wl, body, [x_arg], cfg["parallel"], EXTRA)
