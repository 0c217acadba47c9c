"""LRN (local response normalisation across channels) on plain layouts:
y = x * (bias + alpha / size * sum of x^2 over a window of channels)^-beta.

One task per `rows_per_task` rows (an (n, c) plane of the spatial size S): the window's sums of
squares are accumulated in the output row (one contiguous loop over S per channel of the window,
which LLVM vectorises), then each element is scaled in place. beta = 0.75 (every ONNX-zoo model
that uses LRN) is t^-0.75 = 1 / (sqrt(t) * sqrt(sqrt(t))), which vectorises; other betas call pow.
"""
from __future__ import annotations

import math

import numpy as np

from .expr import lit
from .rows import default_rows, define_rows, finish, knob_values, plain_float, store, tasks_loop, unflatten
from .space import ConfigSpace
from .template import Kernel, Template, chain_ok, epilogue_inputs, register
from .workload import Workload


def _geometry(wl: Workload):
    shape = wl.spec(wl.anchor.args[0]).shape
    return shape, shape[0] * shape[1], math.prod(shape[2:])


@register
class LRN(Template):
    name = "lrn"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op != "LRN" or not a.args[0].startswith("i") or len(wl.spec(a.args[0]).shape) < 2:
            return False
        return plain_float(wl, a.args[0]) and chain_ok(wl)

    def space(self, wl: Workload) -> ConfigSpace:
        sp = ConfigSpace()
        define_rows(sp, _geometry(wl)[1])
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        _, rows, S = _geometry(wl)
        size = int(wl.anchor.attrs["size"])
        work = (size + 2) * rows * S
        return space.from_values(default_rows(rows, work, knob_values(space, "rows_per_task")))

    def build(self, wl: Workload, cfg) -> Kernel:
        a = wl.anchor
        shape, rows, S = _geometry(wl)
        C = shape[1]
        dt = np.dtype(wl.outputs[0].dtype)
        size = int(a.attrs["size"])
        alpha, beta = float(a.attrs.get("alpha", 1e-4)), float(a.attrs.get("beta", 0.75))
        bias = float(a.attrs.get("bias", 1.0))
        lo = (size - 1) // 2
        x_arg = int(a.args[0][1:])
        X = f"in{x_arg}"
        body, ind = tasks_loop(rows, cfg["rows_per_task"], [])
        body += [f"{ind}n = o // {C}", f"{ind}c = o - n * {C}", f"{ind}base = o * {S}",
                 f"{ind}k0 = max(c - {lo}, 0)", f"{ind}k1 = min(c - {lo} + {size}, {C})",
                 f"{ind}for i in range({S}):", f"{ind}    out0[np.uintp(base + i)] = {lit(0, dt)}",
                 f"{ind}for k in range(k0, k1):", f"{ind}    kb = (n * {C} + k) * {S}",
                 f"{ind}    for i in range({S}):", f"{ind}        v = {X}[np.uintp(kb + i)]",
                 f"{ind}        out0[np.uintp(base + i)] += v * v",
                 f"{ind}for i in range({S}):", f"{ind}    xi = np.uintp(base + i)",
                 f"{ind}    t = {lit(bias, dt)} + {lit(alpha / size, dt)} * out0[xi]"]
        if beta == 0.75:
            body += [f"{ind}    r = np.sqrt(t)", f"{ind}    p = {lit(1, dt)} / (r * np.sqrt(r))"]
        else:
            body += [f"{ind}    p = t ** {lit(-beta, dt)}"]
        idx = None
        if epilogue_inputs(wl.epilogue):
            idx = unflatten("o", shape[:2]) + unflatten("i", shape[2:])
        body += store(wl, ind + "    ", f"{X}[xi] * p", "xi", idx)
        return finish(wl, body, [x_arg], cfg["parallel"])
