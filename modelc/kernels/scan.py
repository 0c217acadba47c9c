"""CumSum and CumProd as a scan template: a running sum or product along one axis (exclusive,
reverse), the axis an inlined constant input.

The tensor is seen as [outer, L, inner] around the axis; one parallel loop runs over tasks of
`rows_per_task` columns (an outer index and an inner offset), each scanned along L with its sum or
product in float64 for floats (as the reference accumulates) and in the input type for integers, then stored
through any elementwise epilogue. `column_geometry` and `column_loop` serve select.py too.
"""
from __future__ import annotations

import math

from .rows import axis_index, default_rows, define_rows, finish, knob_values, store
from .space import ConfigSpace
from .template import INT_OR_FLOAT, Kernel, Template, chain_ok, parallel_loop, plain_anchor_input, register
from .workload import Workload


def column_geometry(shape, axis):
    ax = axis_index(axis, len(shape))
    return ax, math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1:])


def column_loop(outer: int, L: int, inner: int, rpt: int, prologue=()) -> tuple[list, str]:
    """The parallel loop over columns: (lines, indentation); a column body has `ob` (outer index),
    `q` (inner offset) and `base` (offset of the column's first element)."""
    cols = outer * inner
    nt = -(-cols // rpt)
    lines = [parallel_loop("it", nt)] + ["    " + ln for ln in prologue]
    lines += [f"    for o in range(it * {rpt}, min(it * {rpt} + {rpt}, {cols})):",
              f"        ob = o // {inner}",
              f"        q = o % {inner}",
              f"        base = ob * {L * inner} + q"]
    return lines, "        "


def const_int(wl: Workload, ref: str):
    """The integer value of an inlined scalar (or one-element) constant, or None."""
    if not ref.startswith("p"):
        return None
    v = wl.params[ref]
    if v.size != 1 or v.dtype.kind not in "iu":
        return None
    return int(v.reshape(-1)[0])


def _geometry(wl: Workload):
    a = wl.anchor
    shape = wl.spec(a.args[0]).shape
    return column_geometry(shape, const_int(wl, a.args[1]))


SCANS = {"CumSum": ("+", 0), "CumProd": ("*", 1)}     # op: its step and its identity


@register
class CumSum(Template):
    name = "cumsum"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        x = plain_anchor_input(wl, tuple(SCANS), INT_OR_FLOAT)
        if x is None or len(a.args) < 2:
            return False
        ax = const_int(wl, a.args[1])
        if ax is None or not -len(x.shape) <= ax < len(x.shape):
            return False
        return x.size > 0 and chain_ok(wl)

    def space(self, wl: Workload) -> ConfigSpace:
        _ax, outer, _L, inner = _geometry(wl)
        sp = ConfigSpace()
        define_rows(sp, outer * inner)
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        _ax, outer, L, inner = _geometry(wl)
        return space.from_values(default_rows(outer * inner, outer * L * inner,
                                              knob_values(space, "rows_per_task")))

    def build(self, wl: Workload, cfg) -> Kernel:
        a = wl.anchor
        _ax, outer, L, inner = _geometry(wl)
        x = wl.spec(a.args[0])
        x_arg = int(a.args[0][1:])
        X = f"in{x_arg}"
        acc_t = "np.float64" if x.dtype.kind == "f" else f"np.{x.dtype.name}"
        T = f"np.{x.dtype.name}"
        excl = bool(int(a.attrs.get("exclusive", 0)))
        rev = bool(int(a.attrs.get("reverse", 0)))
        body, ind = column_loop(outer, L, inner, cfg["rows_per_task"])
        step, identity = SCANS[a.op]
        body += [f"{ind}s = {acc_t}({identity})",
                 f"{ind}for ll in range({L}):",
                 f"{ind}    l = {L - 1} - ll" if rev else f"{ind}    l = ll",
                 f"{ind}    at = np.uintp(base + l * {inner})",
                 f"{ind}    v = {acc_t}({X}[at])"]
        if excl:
            body += store(wl, ind + "    ", f"{T}(s)", "at") + [f"{ind}    s = s {step} v"]
        else:
            body += [f"{ind}    s = s {step} v"] + store(wl, ind + "    ", f"{T}(s)", "at")
        return finish(wl, body, [x_arg], cfg["parallel"])
