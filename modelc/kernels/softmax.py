"""Softmax and LogSoftmax on plain layouts, over rows or blocks of columns (rows.py).

numba has no vector exp here (no SVML), so float32 softmax uses the exp polynomial of
intrinsics.py, which vectorises; it is accurate to a few ulp on the softmax range (x - max <= 0,
clamped at -87). A row softmax may keep exp(x - max) in the output between its passes
(`store_exp`) or compute it twice. float16 softmax (a float16 transformer's attention) loads and
stores float16 bits and computes in float32, as onnxruntime's float16 Softmax does; exp(x - max)
is computed twice rather than rounded to float16 in between.
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

EXTRA = [imports("f32_from_bits", "fmax", "fmin", "h2f", "f2h", "r16")]


def _softmax_geometry(wl: Workload):
    a = wl.anchor
    shape = wl.spec(a.args[0]).shape
    ax = axis_index(a.attrs.get("axis", -1), len(shape))
    outer = math.prod(shape[:ax])
    inner = math.prod(shape[ax + 1:])
    return shape, ax, outer, shape[ax], inner


def _stores_exp(wl: Workload, inner: int) -> bool:
    """A row softmax may keep exp(x - max) in its output (not a float16 one: it would round it)."""
    return inner == 1 and wl.anchor.op == "Softmax" and wl.outputs[0].dtype != np.float16


@register
class Softmax(Template):
    name = "softmax"
    takes_half = True

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        return a.op in ("Softmax", "LogSoftmax") and a.args[0].startswith("i") and \
            plain_float(wl, a.args[0], half=True) and chain_ok(wl)

    def space(self, wl: Workload) -> ConfigSpace:
        shape, ax, outer, L, inner = _softmax_geometry(wl)
        sp = ConfigSpace()
        if _stores_exp(wl, inner):
            sp.define_knob("store_exp", [True, False])
        define_row_or_column(sp, outer, inner)
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        shape, ax, outer, L, inner = _softmax_geometry(wl)
        vals = {"store_exp": True} if _stores_exp(wl, inner) else {}
        vals.update(default_row_or_column(space, outer, inner, 4 * outer * L * inner))
        return space.from_values(vals)

    def build(self, wl: Workload, cfg) -> Kernel:
        shape, ax, outer, L, inner = _softmax_geometry(wl)
        log = wl.anchor.op == "LogSoftmax"
        half = wl.outputs[0].dtype == np.float16
        dt = np.dtype(np.float32) if half else wl.outputs[0].dtype    # what it computes in
        T = ctor(dt)
        x_arg = int(wl.anchor.args[0][1:])
        X = f"in{x_arg}"
        RPT = cfg["rows_per_task"]
        ninf, zero, one = lit(-np.inf, dt), lit(0, dt), lit(1, dt)
        # float16 rounds each op's result as ONNX's reference does (x - max, exp, the float32 sum,
        # its log, the quotient): its outputs then agree with the reference's to the bit, nearly
        r16 = (lambda e: f"r16({e})") if half else (lambda e: e)   # noqa: E731

        def x(i):
            return f"h2f({X}[{i}])" if half else f"{X}[{i}]"

        def exp_of(ind, i, m, var):         # ev = exp(x[i] - m)
            return [f"{ind}{ln}" for ln in exp_lines("ev", r16(f"{x(i)} - {m}"), dt, var)] + \
                ([f"{ind}ev = r16(ev)"] if half else [])

        def put(ind, v, flat, idx):
            return [f"{ind}out0[np.uintp({flat})] = f2h({v})"] if half else store(wl, ind, v, flat, idx)

        def finals(m, s):
            """(line that turns the sum `s` into what the last pass needs, value that pass stores
            at `xi`); its exp, where it needs one, is in `ev`."""
            if log and half:
                return f"{s} = r16(math.log(r16({s})))", "(" + r16(f"{x('xi')} - {m}") + f" - {s})"
            if log:
                return f"{s} = {m} + math.log({s})", f"({x('xi')} - {s})"
            if half:
                return f"{s} = r16({s})", f"(ev / {s})"
            return f"{s} = {one} / {s}", f"(ev * {s})"

        if inner == 1:
            # ---- row softmax: each row of L contiguous elements ---------------------------
            store_exp = _stores_exp(wl, inner) and cfg["store_exp"]
            body, ind = tasks_loop(outer, RPT, [])
            body += [f"{ind}base = o * {L}"]
            body += row_fold(L, "base", x, lambda a, b: f"fmax({a}, {b})", ninf, "m", ind)
            body += [f"{ind}s = {zero}", f"{ind}for i in range({L}):", f"{ind}    xi = np.uintp(base + i)"]
            body += exp_of(ind + "    ", "xi", "m", "x")
            if store_exp:
                body += [f"{ind}    out0[xi] = ev"]
            body += [f"{ind}    s += ev"]
            line, v = finals("m", "s")
            body += [f"{ind}{line}", f"{ind}for i in range({L}):", f"{ind}    xi = np.uintp(base + i)"]
            if store_exp:
                v = "(out0[xi] * s)"
            elif not log:
                body += exp_of(ind + "    ", "xi", "m", "y")
            idx = None
            if epilogue_inputs(wl.epilogue):
                idx = unflatten("o", shape[:ax]) + unflatten("i", shape[ax:])
            body += put(ind + "    ", v, "xi", idx)
            return finish(wl, body, [x_arg], cfg["parallel"], EXTRA)

        # ---- column softmax: blocks of W contiguous inner elements, reduced over L ---------
        # (a float32/64 softmax keeps exp(x - max) in the output between its passes)
        W = min(cfg["vector_width"], inner)
        body, ind, nfull, tail = column_tasks(outer, inner, L, W, RPT, [f"acc = carray(stack_empty({W}, {T}), {W})",
                                                                          f"acs = carray(stack_empty({W}, {T}), {W})"])
        keep = not log and not half

        def column(ind, width):
            lines = [f"{ind}for q in range({width}):", f"{ind}    acc[q] = {ninf}", f"{ind}    acs[q] = {zero}",
                     f"{ind}for l in range({L}):", f"{ind}    xb = np.uintp(base + l * {inner})",
                     f"{ind}    for q in range({width}):",
                     f"{ind}        acc[q] = fmax(acc[q], {x('xb + np.uintp(q)')})",
                     f"{ind}for l in range({L}):", f"{ind}    xb = np.uintp(base + l * {inner})",
                     f"{ind}    for q in range({width}):", f"{ind}        xi = xb + np.uintp(q)"]
            lines += exp_of(ind + "        ", "xi", "acc[q]", "x")
            if keep:
                lines += [f"{ind}        out0[xi] = ev"]
            line, v = finals("acc[q]", "acs[q]")
            lines += [f"{ind}        acs[q] += ev", f"{ind}for q in range({width}):", f"{ind}    {line}"]
            lines += [f"{ind}for l in range({L}):", f"{ind}    xb = np.uintp(base + l * {inner})",
                      f"{ind}    for q in range({width}):", f"{ind}        xi = xb + np.uintp(q)"]
            if keep:
                v = "(out0[xi] * acs[q])"
            elif not log:
                lines += exp_of(ind + "        ", "xi", "acc[q]", "y")
            idx = None
            if epilogue_inputs(wl.epilogue):
                idx = unflatten("ob", shape[:ax]) + ["l"] + unflatten(f"blk * {W} + q", shape[ax + 1:])
            lines += put(ind + "        ", v, "xi", idx)
            return lines

        body += column_blocks(ind, nfull, tail, W, column)
        return finish(wl, body, [x_arg], cfg["parallel"], EXTRA)
