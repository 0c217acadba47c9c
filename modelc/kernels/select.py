"""Hardmax and TopK: per-column selections along one axis.

The tensor is seen as [outer, L, inner] around the axis (scan.column_loop runs tasks of columns).
Hardmax scans a column for the first index of its maximum (NaN counts as the maximum, as
np.argmax), then writes 1 there and 0 elsewhere, through any elementwise epilogue. TopK keeps the
k best values of a column seen so far in two small stack arrays, sorted, by insertion: a value
enters before the first kept value it beats strictly, so ties keep the lower index first, as ONNX
says, for largest and smallest alike; NaN ranks above every number for largest and below every
number for smallest, as the reference's stable sort puts it. k (an inlined constant) is at most
MAX_K, so the work per column is O(L k) with no allocation.
"""
from __future__ import annotations

from .arg_reduce import arg_better
from .expr import ctor
from .rows import default_rows, define_rows, finish, knob_values, store
from .scan import column_geometry, column_loop, const_int
from .space import ConfigSpace
from .template import INT_OR_FLOAT, Kernel, Template, chain_ok, output_positions, plain_anchor_input, register, source
from .workload import Workload

MAX_K = 256


class _Columns(Template):
    """Templates scanning the anchor's `axis` (default -1) for each kept column."""

    def _geometry(self, wl: Workload):
        a = wl.anchor
        return column_geometry(wl.spec(a.args[0]).shape, a.attrs.get("axis", -1))

    def space(self, wl: Workload) -> ConfigSpace:
        _ax, outer, _L, inner = self._geometry(wl)
        sp = ConfigSpace()
        define_rows(sp, outer * inner)
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        _ax, outer, L, inner = self._geometry(wl)
        return space.from_values(default_rows(outer * inner, outer * L * inner,
                                              knob_values(space, "rows_per_task")))


@register
class Hardmax(_Columns):
    name = "hardmax"

    def matches(self, wl: Workload) -> bool:
        x = plain_anchor_input(wl, ("Hardmax",), INT_OR_FLOAT)
        return x is not None and x.size > 0 and chain_ok(wl)

    def build(self, wl: Workload, cfg) -> Kernel:
        a = wl.anchor
        _ax, outer, L, inner = self._geometry(wl)
        dt = wl.spec(a.args[0]).dtype
        x_arg = int(a.args[0][1:])
        X = f"in{x_arg}"
        T = ctor(dt)
        body, ind = column_loop(outer, L, inner, cfg["rows_per_task"])
        body += [f"{ind}best = {X}[np.uintp(base)]",
                 f"{ind}bi = 0",
                 f"{ind}for l in range(1, {L}):",
                 f"{ind}    v = {X}[np.uintp(base + l * {inner})]",
                 f"{ind}    if {arg_better('ArgMax', False, 'v', 'best', dt)}:",
                 f"{ind}        best = v",
                 f"{ind}        bi = l",
                 f"{ind}for l in range({L}):",
                 f"{ind}    at = np.uintp(base + l * {inner})"]
        body += store(wl, ind + "    ", f"{T}(1) if l == bi else {T}(0)", "at")
        return finish(wl, body, [x_arg], cfg["parallel"])


def _topk_outputs(wl: Workload):
    """Positions (0 values, 1 indices) of the workload's outputs, or None (an epilogue ...)."""
    return None if wl.epilogue else output_positions(wl, 2)


@register
class TopK(_Columns):
    name = "topk"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        x = plain_anchor_input(wl, ("TopK",), INT_OR_FLOAT)
        if x is None or len(a.args) < 2:
            return False
        k = const_int(wl, a.args[1])
        if k is None or _topk_outputs(wl) is None or x.size == 0:
            return False
        _ax, _outer, L, _inner = self._geometry(wl)
        return 1 <= k <= min(L, MAX_K)

    def build(self, wl: Workload, cfg) -> Kernel:
        a = wl.anchor
        _ax, outer, L, inner = self._geometry(wl)
        dt = wl.spec(a.args[0]).dtype
        K = const_int(wl, a.args[1])
        largest = bool(int(a.attrs.get("largest", 1)))
        x_arg = int(a.args[0][1:])
        X = f"in{x_arg}"
        T = ctor(dt)

        def better(v, w):
            cmp = ">" if largest else "<"
            if dt.kind != "f":
                return f"{v} {cmp} {w}"
            if largest:    # NaN above every number; a NaN never beats a kept NaN (ties: index)
                return f"((math.isnan({v}) and not math.isnan({w})) or {v} {cmp} {w})"
            return f"((math.isnan({w}) and not math.isnan({v})) or {v} {cmp} {w})"

        body, ind = column_loop(outer, L, inner, cfg["rows_per_task"],
                                [f"vals = carray(stack_empty({K}, {T}), {K})",
                                 f"idx = carray(stack_empty({K}, np.int64), {K})"])
        body += [f"{ind}cnt = 0",
                 f"{ind}for l in range({L}):",
                 f"{ind}    v = {X}[np.uintp(base + l * {inner})]",
                 f"{ind}    if cnt < {K} or {better('v', f'vals[{K - 1}]')}:",
                 f"{ind}        j = cnt if cnt < {K} else {K - 1}",
                 f"{ind}        while j > 0 and {better('v', 'vals[j - 1]')}:",
                 f"{ind}            vals[j] = vals[j - 1]",
                 f"{ind}            idx[j] = idx[j - 1]",
                 f"{ind}            j -= 1",
                 f"{ind}        vals[j] = v",
                 f"{ind}        idx[j] = l",
                 f"{ind}        if cnt < {K}:",
                 f"{ind}            cnt += 1",
                 f"{ind}for j in range({K}):",
                 f"{ind}    at = np.uintp(ob * {K * inner} + j * {inner} + q)"]
        pos = _topk_outputs(wl)
        for k, p in enumerate(pos):
            body += [f"{ind}    out{k}[at] = {'vals[j]' if p == 0 else 'idx[j]'}"]
        args = [f"out{k}" for k in range(len(pos))] + [X]
        dtypes = [wl.outputs[k].dtype for k in range(len(pos))] + [dt]
        return Kernel(source(args, dtypes, body, parallel=cfg["parallel"]), args)
