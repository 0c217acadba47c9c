"""ReduceLogSumExp as a two-pass kernel: m = max over the reduced elements, then
log(sum exp(x - m)) + m, in float64.

Any set of axes (an inlined constant; none means all, or no reduction with
noop_with_empty_axes), keepdims 0 or 1, any elementwise epilogue. One parallel loop runs over
tasks of `rows_per_task` output elements; each walks its reduced elements by a flat index decoded
into offsets. A maximum of +-inf (rows of -inf, an empty set, an +inf) gives the result m itself,
as the reference does; a NaN anywhere gives NaN.
"""
from __future__ import annotations

import math

import numpy as np

from .expr import ctor
from .rows import default_rows, define_rows, finish, knob_values, store
from .space import ConfigSpace
from .template import Kernel, Template, chain_ok, parallel_loop, register
from .workload import Workload


def _axes(wl: Workload):
    """The reduced axes (sorted tuple; () for no reduction), or None when not constant."""
    a = wl.anchor
    rank = len(wl.spec(a.args[0]).shape)
    ref = a.args[1] if len(a.args) > 1 else ""
    if ref and not ref.startswith("p"):
        return None
    v = wl.params[ref].reshape(-1) if ref else np.zeros(0, np.int64)
    if v.size == 0:
        return () if int(a.attrs.get("noop_with_empty_axes", 0)) else tuple(range(rank))
    ax = sorted({int(k) + rank if int(k) < 0 else int(k) for k in v})
    return tuple(ax) if len(ax) == v.size and all(0 <= k < rank for k in ax) else None


@register
class ReduceLogSumExp(Template):
    name = "logsumexp"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op != "ReduceLogSumExp" or not a.args[0].startswith("i"):
            return False
        x = wl.spec(a.args[0])
        if x.layout is not None or x.dtype not in (np.float32, np.float64) or wl.outputs[0].layout:
            return False
        return _axes(wl) is not None and wl.outputs[0].size > 0 and chain_ok(wl)

    def space(self, wl: Workload) -> ConfigSpace:
        sp = ConfigSpace()
        define_rows(sp, wl.outputs[0].size)
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        x = wl.spec(wl.anchor.args[0])
        return space.from_values(default_rows(wl.outputs[0].size, 4 * x.size,
                                              knob_values(space, "rows_per_task")))

    def build(self, wl: Workload, cfg) -> Kernel:
        a = wl.anchor
        x = wl.spec(a.args[0])
        shape = x.shape
        ax = _axes(wl)
        kept = [d for d in range(len(shape)) if d not in ax]
        st = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        R = math.prod(shape[d] for d in ax)
        total = wl.outputs[0].size
        x_arg = int(a.args[0][1:])
        X = f"in{x_arg}"
        T = ctor(x.dtype)
        RPT = cfg["rows_per_task"]

        def decode(var, dims, into):
            """Lines turning flat `var` (row-major over `dims`) into the input offset `into`."""
            lines = [f"rr = {var}", f"{into} = 0"]
            for d in reversed(dims):
                lines += [f"{into} += (rr % {shape[d]}) * {st[d]}", f"rr = rr // {shape[d]}"]
            return lines

        ind = "        "
        body = [parallel_loop("it", -(-total // RPT)),
                f"    for o in range(it * {RPT}, min(it * {RPT} + {RPT}, {total})):"]
        body += [ind + ln for ln in decode("o", kept, "base")]
        body += [f"{ind}m = -np.inf",
                 f"{ind}nan = False",
                 f"{ind}for r in range({R}):"]
        body += [ind + "    " + ln for ln in decode("r", list(ax), "off")]
        body += [f"{ind}    v = np.float64({X}[np.uintp(base + off)])",
                 f"{ind}    if math.isnan(v):",
                 f"{ind}        nan = True",
                 f"{ind}    elif v > m:",
                 f"{ind}        m = v",
                 f"{ind}if nan:",
                 f"{ind}    res = np.nan",
                 f"{ind}elif math.isinf(m):",
                 f"{ind}    res = m",
                 f"{ind}else:",
                 f"{ind}    s = np.float64(0)",
                 f"{ind}    for r in range({R}):"]
        body += [ind + "        " + ln for ln in decode("r", list(ax), "off")]
        body += [f"{ind}        s += math.exp(np.float64({X}[np.uintp(base + off)]) - m)",
                 f"{ind}    res = math.log(s) + m"]
        body += store(wl, ind, f"{T}(res)", "o")
        return finish(wl, body, [x_arg], cfg["parallel"])
