"""The numpy reference of a declaration: each stage over its whole index grid by broadcasting.

Spatial and reduce axes are open grids (one dimension each), so every expression broadcasts to the
stage's grid; reductions then reduce the trailing (reduce) dimensions. Reads clip their indices:
a guarded (padding) read is evaluated on both branches by np.where, and its untaken side must not
fail. Large stages go in slices of their first axis, to bound memory.
"""
from __future__ import annotations

import math

import numpy as np

from .expr import Binary, Call, Cast, Const, Read, Reduce, Select, Var
from .tensor import ComputeOp

CHUNK = 1 << 22                 # grid points evaluated at once

_BIN = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide, "//": np.floor_divide,
        "%": np.mod, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
        "==": np.equal, "!=": np.not_equal, "&&": np.logical_and, "||": np.logical_or}
_erf = np.frompyfunc(math.erf, 1, 1)
_FN = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs,
       "erf": lambda x: _erf(x).astype(np.asarray(x).dtype),
       "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "max": np.maximum, "min": np.minimum, "fmod": np.fmod}
_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min}


def evaluate(dag, arrays) -> dict:
    """{id(tensor): array} for every tensor of `dag`, from the input `arrays`."""
    values = {id(t): a for t, a in zip(dag.inputs, arrays)}
    with np.errstate(all="ignore"):
        for t in dag.ops:
            if isinstance(t.op, ComputeOp):
                values[id(t)] = _stage(t.op, values)
    return values


def _stage(op: ComputeOp, values: dict) -> np.ndarray:
    out = np.empty(op.shape, op.dtype)
    raxes = op.reduce_axis
    rext = [a.hi - a.lo for a in raxes]
    per_row = math.prod(op.shape[1:]) * math.prod(rext)
    step = max(1, CHUNK // max(1, per_row))
    nd = len(op.shape) + len(raxes)
    for lo in range(0, op.shape[0], step):
        hi = min(op.shape[0], lo + step)
        env = {}
        for d, (a, n) in enumerate(zip(op.axis, op.shape)):
            r = np.arange(lo, hi) if d == 0 else np.arange(n)
            env[a] = r.reshape([-1 if k == d else 1 for k in range(nd)])
        for j, a in enumerate(raxes):
            d = len(op.shape) + j
            env[a] = np.arange(a.lo, a.hi).reshape([-1 if k == d else 1 for k in range(nd)])
        body = op.body
        if isinstance(body, Reduce):
            v = np.broadcast_to(_eval(body.source, env, values), (hi - lo, *op.shape[1:], *rext))
            v = _REDUCE[body.op](v, axis=tuple(range(len(op.shape), nd)), dtype=op.dtype) \
                if body.op == "sum" else _REDUCE[body.op](v, axis=tuple(range(len(op.shape), nd)))
        else:
            v = _eval(body, env, values)
        out[lo:hi] = np.broadcast_to(v, out[lo:hi].shape)
    return out


def _eval(e, env, values):
    if isinstance(e, Const):
        return np.asarray(e.value, e.dtype)
    if isinstance(e, Var):
        return env[e]
    if isinstance(e, Read):
        idx = tuple(np.clip(_eval(ix, env, values), 0, n - 1).astype(np.intp)
                    for ix, n in zip(e.indices, e.tensor.shape))
        return values[id(e.tensor)][idx]
    if isinstance(e, Binary):
        a, b = _eval(e.a, env, values), _eval(e.b, env, values)
        if e.op in ("//", "%"):                      # a zero divisor gives 0, as numba's error_model='numpy'
            b0 = b == 0
            r = _BIN[e.op](a, np.where(b0, 1, b))
            return np.where(b0, 0, r).astype(e.dtype)
        return np.asarray(_BIN[e.op](a, b)).astype(e.dtype, copy=False)
    if isinstance(e, Call):
        return np.asarray(_FN[e.fn](*(_eval(a, env, values) for a in e.operands))).astype(e.dtype, copy=False)
    if isinstance(e, Select):
        return np.where(_eval(e.cond, env, values), _eval(e.a, env, values), _eval(e.b, env, values))
    if isinstance(e, Cast):
        return np.asarray(_eval(e.a, env, values)).astype(e.dtype)
    raise TypeError(f"cannot evaluate {type(e).__name__}")
