"""Kernel source for a KernelPlan, in the form PERFORMANCE.md found fast.

The loop nest: all spatial axes but the last, the last axis in tiles of one vector (16 float32 lanes
with AVX-512, 8 with AVX2: from target.py), and for a reduction with two or more spatial axes MR rows of
the second-to-last axis written out in the source (a register tile of MR vectors on the stack, at most
half the target's vector registers);
these outer loops fused into one parallel loop; the reduction loops inside; one constant-trip loop
over the lanes innermost. Arrays are flat, offsets row-major and `np.uintp`. Tensors and variables
get names made here (`out0`, `in1`, `i0`, `r0`): nothing a user named reaches the source.
"""
from __future__ import annotations

import math

import numpy as np

from .. import target
from ..kernels.expr import ctor, lit
from ..kernels.intrinsics import FASTMATH, exp_polynomial, imports
from ..kernels.template import parallel_loop, source
from .bounds import unproven_reads
from .expr import Binary, Call, Cast, Const, Read, Select, Var
from .lower import Acc, KernelPlan

ROWS = (8, 4, 2, 1)            # register-tile heights tried, largest first (within the target's registers)

_F32 = lambda text: f"np.float32({text})"  # noqa: E731
FAST_EXP = [imports("f32_from_bits"), "", f"@numba.njit(fastmath={FASTMATH})", "def fast_exp32(x):",
            "    d = min(max(x, np.float32(-87.0)), np.float32(87.0))",
            *("    " + ln for ln in exp_polynomial("e", "d", "t", "r", "p", _F32)), "    return e", ""]
_INIT = {"sum": lambda dt: lit(0, dt),
         "max": lambda dt: lit(-np.inf, dt) if np.dtype(dt).kind == "f" else lit(np.iinfo(dt).min, dt),
         "min": lambda dt: lit(np.inf, dt) if np.dtype(dt).kind == "f" else lit(np.iinfo(dt).max, dt)}


class _Emitter:
    def __init__(self, names: dict, clamp: set):
        self.names, self.clamp = names, clamp        # id(tensor) -> arg name; ids of reads to clamp

    def __call__(self, e, env: dict) -> str:
        if isinstance(e, Const):
            return lit(e.value, e.dtype)
        if isinstance(e, Var):
            return env[id(e)]
        if isinstance(e, Acc):
            return env["acc"]
        if isinstance(e, Read):
            shape = e.tensor.shape
            idx = [self(ix, env) for ix in e.indices]
            if id(e) in self.clamp:
                idx = [f"min(max({ix}, 0), {n - 1})" for ix, n in zip(idx, shape)]
            return f"{self.names[id(e.tensor)]}[{offset(idx, shape)}]"
        if isinstance(e, Binary):
            a, b = self(e.a, env), self(e.b, env)
            op = {"&&": "and", "||": "or"}.get(e.op, e.op)
            return f"({a} {op} {b})"
        if isinstance(e, Select):
            return f"({self(e.a, env)} if {self(e.cond, env)} else {self(e.b, env)})"
        if isinstance(e, Cast):
            a = self(e.a, env)
            return f"({a} != 0)" if e.dtype == "bool" else f"{ctor(e.dtype)}({a})"
        if isinstance(e, Call):
            return _call(e, [self(a, env) for a in e.operands])
        raise TypeError(f"no code for {type(e).__name__}")


def _call(e: Call, a: list) -> str:
    f32 = e.dtype == "float32"
    fl = np.dtype(e.dtype).kind == "f"
    if e.fn in ("max", "min"):
        return f"{('fmax' if e.fn == 'max' else 'fmin') if fl else e.fn}({a[0]}, {a[1]})"
    if e.fn == "exp":
        return f"fast_exp32({a[0]})" if f32 else f"math.exp({a[0]})"
    if e.fn == "erf":
        return f"fast_erf({a[0]})" if f32 else f"math.erf({a[0]})"
    if e.fn == "sigmoid":
        return f"fast_sigmoid32({a[0]})" if f32 else f"({lit(1, e.dtype)} / ({lit(1, e.dtype)} + math.exp(-{a[0]})))"
    if e.fn == "abs":
        return f"abs({a[0]})"
    return f"math.{e.fn}({a[0]})"


def offset(idx: list, shape) -> str:
    """The row-major offset of `idx` in a flat array of `shape`, unsigned."""
    terms = []
    for k, ix in enumerate(idx):
        stride = math.prod(shape[k + 1:])
        if ix != "0":
            terms.append(ix if stride == 1 else f"({ix}) * {stride}")
    return f"np.uintp({' + '.join(terms) or '0'})"


def kernel_source(p: KernelPlan) -> tuple[str, list]:
    """(source, tensors): the kernel module and the tensors bound to its arguments, in order."""
    tensors = [p.tensor, *p.reads]
    names = {id(t): (f"out{k}" if k == 0 else f"in{k - 1}") for k, t in enumerate(tensors)}
    clamp = set()
    for e in ([p.reduce.source] if p.reduce is not None else []) + [p.value]:
        clamp |= {id(r) for r, *_ in unproven_reads(e)}
    emit = _Emitter(names, clamp)
    shape = list(p.tensor.shape)
    n, dt = len(shape), p.tensor.dtype
    inner = shape[-1]
    tg = target.current()                  # the CPU's vector width and registers, never a constant
    lanes = min(tg.lanes(np.dtype(dt).itemsize), inner)
    full, rem = divmod(inner, lanes)
    ntiles = full + (rem > 0)
    rows = 1
    if p.reduce is not None and n >= 2:
        most = max(1, tg.max_tile_vectors // 2)
        rows = next(r for r in ROWS if r <= most and shape[-2] % r == 0)
    outer = shape[:-1]
    if rows > 1:
        outer = [*shape[:-2], shape[-2] // rows]
    items = math.prod(outer) * ntiles
    body = [parallel_loop("it", items)]
    ind = "    "
    body.append(f"{ind}jt = it % {ntiles}")
    rest = f"it // {ntiles}"
    for d in range(len(outer) - 1, -1, -1):
        if d == 0:
            body.append(f"{ind}q0 = {rest}")
        else:
            body += [f"{ind}q{d} = {rest} % {outer[d]}", f"{ind}rest{d} = {rest} // {outer[d]}"]
            rest = f"rest{d}"
    env = {id(a): f"q{d}" for d, a in enumerate(p.axis[:-1])}
    row_envs = [dict(env)]
    if rows > 1:
        row_envs = []
        for m in range(rows):
            body.append(f"{ind}y{m} = q{n - 2} * {rows} + {m}")
            row_envs.append({**env, id(p.axis[-2]): f"y{m}"})
    body.append(f"{ind}j0 = jt * {lanes}")
    tiles = [(lanes, [])] if not rem else [(lanes, ["if jt < %d:" % full]), (rem, ["else:"])]
    for width, head in tiles:
        lines = _tile(p, emit, row_envs, width, dt, shape)
        if head:
            body += [ind + head[0]] + [ind + "    " + ln for ln in lines]
        else:
            body += [ind + ln for ln in lines]
    extra = FAST_EXP if any("fast_exp32(" in ln for ln in body) else []
    if any("fmax(" in ln or "fmin(" in ln for ln in body):
        extra = [imports("fmax", "fmin"), *extra]
    dtypes = [t.dtype for t in tensors]
    return source([names[id(t)] for t in tensors], dtypes, body, extra=extra), tensors


def _tile(p: KernelPlan, emit, row_envs: list, width: int, dt: str, shape: list) -> list:
    """One register tile: len(row_envs) rows x `width` lanes of the last axis."""
    last = id(p.axis[-1])
    lane = {**{}, last: "j0 + jj"}
    out = []
    if p.reduce is not None:
        size = len(row_envs) * width
        out.append(f"acc = carray(stack_empty({size}, {ctor(dt)}), {size})")
        out += [f"for jj in range({size}):", f"    acc[jj] = {_INIT[p.reduce.op](dt)}"]
        ind = ""
        for k, a in enumerate(p.reduce.axes):
            out.append(f"{ind}for r{k} in range({a.lo}, {a.hi}):")
            ind += "    "
        out.append(f"{ind}for jj in range({width}):")
        renv = {id(a): f"r{k}" for k, a in enumerate(p.reduce.axes)}
        for m, env in enumerate(row_envs):
            v = emit(p.reduce.source, {**env, **renv, **lane})
            a = f"acc[{m * width} + jj]" if m else "acc[jj]"
            if p.reduce.op == "sum":
                out.append(f"{ind}    {a} = {a} + {v}")
            else:
                fn = ("fmax" if p.reduce.op == "max" else "fmin") if np.dtype(dt).kind == "f" else p.reduce.op
                out.append(f"{ind}    {a} = {fn}({a}, {v})")
    out.append(f"for jj in range({width}):")
    for m, env in enumerate(row_envs):
        e = {**env, **lane, "acc": f"acc[{m * width} + jj]" if m else "acc[jj]"}
        idx = [e[id(a)] for a in p.axis]
        out.append(f"    out0[{offset(idx, shape)}] = {emit(p.value, e)}")
    return out
