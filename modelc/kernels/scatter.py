"""ScatterElements and ScatterND: the output is a copy of the data with updates written over it.

Not injective (an output element may take several updates, or none), so not an index map: the
kernel copies the data, then walks the updates in order, one at a time, so that duplicate
indices follow ONNX's order (the last update wins under reduction "none"; add/mul/max/min
accumulate, as the reference's `ufunc.at`). Negative indices wrap; an index still out of range
(a run-time input; constant ones are refused at import) is clipped: never a write outside the
buffer. One serial work item: a scatter is memory-bound and small next to the ops around it.
"""
from __future__ import annotations

import math

import numpy as np

from .layout import strides
from .space import ConfigSpace
from .template import Kernel, Template, register, source
from .workload import Workload

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _store(reduction: str, dst: str, v: str, ind: str) -> list:
    if reduction == "none":
        return [f"{ind}{dst} = {v}"]
    if reduction == "add":
        return [f"{ind}{dst} += {v}"]
    if reduction == "mul":
        return [f"{ind}{dst} *= {v}"]
    cmp = ">" if reduction == "max" else "<"
    # NaN wins either way, as numpy's maximum/minimum: a NaN update is stored, a NaN kept
    return [f"{ind}if {v} != {v} or {v} {cmp} {dst}:", f"{ind}    {dst} = {v}"]


def _clip(iv: str, expr: str, dim: int, ind: str) -> list:
    return [f"{ind}{iv} = np.int64({expr})",
            f"{ind}if {iv} < 0:",
            f"{ind}    {iv} += {dim}",
            f"{ind}{iv} = min(max({iv}, 0), {dim - 1})"]


@register
class Scatter(Template):
    name = "scatter"
    tunable = False
    priority = 8

    def matches(self, wl: Workload) -> bool:
        if len(wl.ops) != 1 or wl.ops[0].op not in ("ScatterElements", "ScatterND"):
            return False
        op = wl.ops[0]
        if len(op.args) != 3 or not all(op.args):
            return False
        specs = [wl.spec(r) for r in op.args] + list(wl.outputs)
        if any(getattr(s, "layout", None) for s in specs):
            return False
        red = op.attrs.get("reduction", "none") or "none"
        if red not in REDUCTIONS or (red != "none" and wl.outputs[0].dtype.kind == "b"):
            return False
        if wl.spec(op.args[1]).dtype.kind not in "iu":
            return False
        return wl.outputs[0].dtype.kind in "biuf"

    def space(self, wl: Workload) -> ConfigSpace:
        return ConfigSpace()

    def build(self, wl: Workload, cfg) -> Kernel:
        op = wl.ops[0]
        names, params = {}, {}
        for r in op.args:
            if r.startswith("i"):
                names[r] = f"in{r[1:]}"
            else:
                names[r] = r
                params[r] = np.ascontiguousarray(wl.params[r]).reshape(-1)
        data, ind_, upd = (names[r] for r in op.args)
        dshape = wl.spec(op.args[0]).shape
        ishape = wl.spec(op.args[1]).shape
        red = op.attrs.get("reduction", "none") or "none"
        total = math.prod(dshape)
        body = [f"for e in range({total}):", f"    out0[np.uintp(e)] = {data}[np.uintp(e)]"]
        dst = strides(dshape)
        if op.op == "ScatterElements":
            axis = op.attrs.get("axis", 0) % len(dshape)
            body.append(f"for u in range({math.prod(ishape)}):")
            rest, terms = "u", []
            ist = strides(ishape)
            for j in range(len(ishape)):
                if j == axis:
                    body += _clip("iv", f"{ind_}[np.uintp(u)]", dshape[axis], "    ")
                    terms.append(f"iv * {dst[j]}")
                else:
                    terms.append(f"((u // {ist[j]}) % {ishape[j]}) * {dst[j]}")
            del rest
            body.append(f"    o = np.uintp({' + '.join(terms)})")
            body += _store(red, "out0[o]", f"{upd}[np.uintp(u)]", "    ")
        else:
            k = ishape[-1]
            n_upd = math.prod(ishape[:-1])
            inner = math.prod(dshape[k:])
            body.append(f"for m in range({n_upd}):")
            body.append("    base = np.int64(0)")
            for j in range(k):
                body += _clip("iv", f"{ind_}[np.uintp(m * {k} + {j})]", dshape[j], "    ")
                body.append(f"    base += iv * {dst[j]}")
            body.append(f"    for t in range({inner}):")
            body.append("        o = np.uintp(base + t)")
            body += _store(red, "out0[o]", f"{upd}[np.uintp(m * {inner} + t)]", "        ")
        ins = sorted({int(r[1:]) for r in op.args if r.startswith("i")})
        args = ["out0"] + [f"in{k}" for k in ins] + sorted(params)
        dtypes = [wl.outputs[0].dtype] + [wl.inputs[k].dtype for k in ins] + \
            [params[p].dtype for p in sorted(params)]
        return Kernel(source(args, dtypes, body), args, lambda consts: dict(params))
