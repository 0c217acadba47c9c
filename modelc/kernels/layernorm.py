"""LayerNormalization on plain layouts: one row per normalised group, in tasks of rows (rows.py).

Accumulates in float32 for rows up to 4096 elements (as the reference does); above, float32 input
sums float32 chunks of 4096 into float64 (float64 throughout for float64 input), in two passes
or (knob) one pass of sum and sum of squares in float64.
"""
from __future__ import annotations

import math

import numpy as np

from .expr import ctor, lit
from .rows import (axis_index, default_rows, define_rows, finish, knob_values, plain_float, row_fold, store,
                   tasks_loop, unflatten)
from .space import ConfigSpace
from .template import Kernel, Template, chain_ok, epilogue_inputs, register
from .workload import Workload


def _layernorm_geometry(wl: Workload):
    a = wl.anchor
    shape = wl.spec(a.args[0]).shape
    ax = axis_index(a.attrs.get("axis", -1), len(shape))
    return shape, ax, math.prod(shape[:ax]), math.prod(shape[ax:])


def _const_arg(wl: Workload, ref: str) -> bool:
    return ref.startswith("p") or (ref.startswith("i") and wl.spec(ref).const)


CHUNK = 4096


def _chunked_sum(L: int, acc: str, term, ind: str) -> list:
    """Lines setting the float64 `acc` to the sum of `term(index)` over the row [base, base + L):
    float32 partial sums over chunks of CHUNK elements (loops LLVM vectorises), added in float64."""
    n, tail = divmod(L, CHUNK)
    lines = [f"{ind}{acc} = np.float64(0.0)"]
    if n:
        lines += [f"{ind}for c in range({n}):",
                  f"{ind}    cb = base + c * {CHUNK}",
                  f"{ind}    pc = np.float32(0.0)",
                  f"{ind}    for i in range({CHUNK}):",
                  f"{ind}        pc += {term('np.uintp(cb + i)')}",
                  f"{ind}    {acc} += np.float64(pc)"]
    if tail:
        lines += [f"{ind}pc = np.float32(0.0)",
                  f"{ind}for i in range({tail}):",
                  f"{ind}    pc += {term(f'np.uintp(base + {n * CHUNK} + i)')}",
                  f"{ind}{acc} += np.float64(pc)"]
    return lines


@register
class LayerNorm(Template):
    name = "layernorm"

    def matches(self, wl: Workload) -> bool:
        a = wl.anchor
        if a.op != "LayerNormalization" or not a.args[0].startswith("i") or len(a.args) < 2:
            return False
        if not plain_float(wl, a.args[0]) or not chain_ok(wl):
            return False
        return all(_const_arg(wl, r) for r in a.args[1:3] if r)

    def space(self, wl: Workload) -> ConfigSpace:
        shape, ax, rows, L = _layernorm_geometry(wl)
        sp = ConfigSpace()
        # two passes (mean, then squared deviations) or one (sum and sum of squares in float64)
        sp.define_knob("statistics", ["two_pass", "one_pass_f64"])
        define_rows(sp, rows)
        return sp

    def default_config(self, wl: Workload, space: ConfigSpace):
        shape, ax, rows, L = _layernorm_geometry(wl)
        vals = {"statistics": "two_pass"}
        vals.update(default_rows(rows, 2 * rows * L, knob_values(space, "rows_per_task")))
        return space.from_values(vals)

    def build(self, wl: Workload, cfg) -> Kernel:
        a = wl.anchor
        shape, ax, rows, L = _layernorm_geometry(wl)
        dt = wl.outputs[0].dtype
        T = ctor(dt)
        one_pass = cfg["statistics"] == "one_pass_f64"
        at = np.dtype(np.float64) if (L > 4096 or one_pass) else np.dtype(dt)
        A = ctor(at)
        eps = lit(a.attrs.get("epsilon", 1e-5), at)
        x_arg = int(a.args[0][1:])
        X = f"in{x_arg}"
        has_b = len(a.args) > 2 and bool(a.args[2])
        cast = (lambda e: e) if at == dt else (lambda e: f"{A}({e})")
        zero, rl = lit(0, at), lit(1.0 / L, at)

        body, ind = tasks_loop(rows, cfg["rows_per_task"], [])
        body += [f"{ind}base = o * {L}"]
        if one_pass:
            body += [f"{ind}s = {zero}", f"{ind}ss = {zero}", f"{ind}for i in range({L}):",
                     f"{ind}    xv = {cast(f'{X}[np.uintp(base + i)]')}",
                     f"{ind}    s += xv", f"{ind}    ss += xv * xv",
                     f"{ind}mean = s * {rl}",
                     f"{ind}var = max(ss * {rl} - mean * mean, {zero})"]
        elif at != dt and np.dtype(dt) == np.float32:
            # long float32 rows: float32 vector sums over chunks of CHUNK elements, added up in
            # float64 (as accurate as the float32 path of shorter rows, at float32's vector width)
            body += _chunked_sum(L, "s", lambda i: f"{X}[{i}]", ind)
            body += [f"{ind}mean = s * {rl}", f"{ind}mean32 = np.float32(mean)"]
            body += _chunked_sum(L, "v", lambda i: f"({X}[{i}] - mean32) * ({X}[{i}] - mean32)", ind)
            body += [f"{ind}var = v * {rl}"]
        else:
            body += row_fold(L, "base", lambda i: cast(f"{X}[{i}]"), lambda p, q: f"{p} + {q}", zero, "s", ind)
            body += [f"{ind}mean = s * {rl}"]
            body += [f"{ind}v = {zero}", f"{ind}for i in range({L}):",
                     f"{ind}    d = {cast(f'{X}[np.uintp(base + i)]')} - mean", f"{ind}    v += d * d",
                     f"{ind}var = v * {rl}"]
        body += [f"{ind}inv = {lit(1, at)} / math.sqrt(var + {eps})"]
        if at != dt:
            body += [f"{ind}mean_t = {T}(mean)", f"{ind}inv_t = {T}(inv)"]
        else:
            body += [f"{ind}mean_t = mean", f"{ind}inv_t = inv"]
        body += [f"{ind}for i in range({L}):", f"{ind}    xi = np.uintp(base + i)"]
        v = f"(({X}[xi] - mean_t) * inv_t * scale[i]" + (" + bias[i])" if has_b else ")")
        idx = None
        if epilogue_inputs(wl.epilogue):
            idx = unflatten("o", shape[:ax]) + unflatten("i", shape[ax:])
        body += store(wl, ind + "    ", v, "xi", idx)

        refs = [r for r in a.args[1:3] if r]
        names = ["scale", "bias"][:len(refs)]
        params = {r: wl.params[r] for r in refs if r.startswith("p")}
        tail_shape = shape[ax:]

        def pack(consts):
            out = {}
            for r, name in zip(refs, names):
                v = params[r] if r in params else consts[int(r[1:])]
                out[name] = np.array(np.broadcast_to(np.asarray(v, dt), tail_shape)).reshape(-1)
            return out

        return finish(wl, body, [x_arg], cfg["parallel"], packed=names, pack=pack)
