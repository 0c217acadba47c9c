"""te lowerings of the ONNX ops a fused group may hold (groups.py declares the group with them).

Each lowering takes the group's builder, the op and the workload, and returns the op's Value: its
logical shape and dtype and its element at logical indices, as a te expression. Elementwise ops
stay expressions (always inlined), and so do data-movement ops (index arithmetic, moves.py); an anchor with a
reduction (Dense, MatMul, Einsum, the Reduce ops here; Conv and pools in windows.py) declares a te
stage, in the blocked order of the group's output where it can, so the store fuses with it. A form
outside what is lowered raises Unsupported and the group keeps its template (or the numpy fallback).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import expr as E
from .tensor import compute, reduce_axis, reduction

class Unsupported(Exception):
    """The group has no te declaration (an op, form or dtype outside what is lowered here)."""


@dataclass
class Split:
    """A channel index as (block, lane) of blocks of b: blk * b + lane."""
    blk: E.Expr
    lane: E.Expr
    b: int


def scalar(idx):
    """The index of a rank-0 value's one element: the output's axis where the group's result is
    this value (a (1,) stage read at its own axis fuses), else 0."""
    return idx[0] if idx else 0


def flat(i):
    return i.blk * i.b + i.lane if isinstance(i, Split) else i


def read(T, shape: tuple, idx: list):
    """The element of tensor T (a value of logical `shape`) at logical indices `idx`."""
    return T[tuple(flat(i) for i in idx)] if shape else T[scalar(idx)]


@dataclass
class Value:
    """A value of the group: its logical shape and dtype, and its element at logical indices."""
    shape: tuple
    dtype: str
    at: object                  # idx (list of Expr | Split) -> Expr


# ---- op lowerings ---------------------------------------------------------------------------

def _broadcast(v: Value, shape: tuple):
    """v's element at indices of the (numpy-broadcast) `shape`."""
    if not shape:
        return v.at
    return lambda idx: v.at(_batch(idx, v.shape, shape))


def _elementwise(fn):
    """The lowering of an elementwise op: `fn(op, operands, dtype)` builds its expression; called
    first with the operands' dtypes, it says whether it takes them (False: Unsupported)."""
    def lower(b, op, wl):
        args = op.args[:1] if op.op == "CastLike" else op.args      # CastLike's second: its dtype only
        vals = [b.value(a) if a else None for a in args]
        present = [v for v in vals if v is not None]
        shape = tuple(np.broadcast_shapes(*(v.shape for v in present)))
        ats = [None if v is None else _broadcast(v, shape) for v in vals]
        dt = np.dtype(wl.spec(f"v{op.index}").dtype).name
        probe = fn(op, [None if v is None else v.dtype for v in vals], dt)     # refuse early
        if probe is False:
            raise Unsupported(f"{op.op} on {[v.dtype for v in present]}")

        def at(idx):
            return fn(op, [None if a is None else a(idx) for a in ats], dt)
        return Value(shape, dt, at)
    return lower


def _is_float(dt) -> bool:
    return dt is not None and np.dtype(dt).kind == "f"


def _unary(make, floats_only=True):
    def fn(op, a, dt):
        if isinstance(a[0], str) or a[0] is None:
            return not floats_only or _is_float(a[0])
        return make(op, a[0], dt)
    return fn


def _c(v, dt):
    return E.Const(float(v) if np.dtype(dt).kind == "f" else int(v), dt)


def _binary(make, floats_only=False, bools=False):
    def fn(op, a, dt):
        if any(x is None or isinstance(x, str) for x in a):
            dts = [x for x in a if isinstance(x, str)]
            if len(dts) != len(a) or len(set(dts)) != 1:
                return False
            k = np.dtype(dts[0]).kind
            return (k == "f" or not floats_only) and (bools or k != "b")
        return make(a, dt)
    return fn


def _clip(op, a, dt):
    if isinstance(a[0], str) or a[0] is None:
        return _is_float(a[0]) and all(x is None or x == a[0] for x in a[1:])
    out = a[0]
    if len(a) > 1 and a[1] is not None:
        out = E.call("max", out, a[1])
    if len(a) > 2 and a[2] is not None:
        out = E.call("min", out, a[2])
    return out


def _where(op, a, dt):
    if any(x is None or isinstance(x, str) for x in a):
        return len(a) == 3 and a[0] == "bool" and a[1] == a[2] and a[1] is not None
    return E.if_then_else(a[0], a[1], a[2])


def _cast(op, a, dt):
    if isinstance(a[0], str) or a[0] is None:
        return a[0] is not None
    return E.cast(dt, a[0])


def _variadic(fn_name):
    def fn(op, a, dt):
        if any(x is None or isinstance(x, str) for x in a):
            return all(x == a[0] for x in a) and a[0] is not None and a[0] != "bool"
        out = a[0]
        for x in a[1:]:
            out = E.call(fn_name, out, x)
        return out
    return fn


def _mod(op, a, dt):
    """ONNX Mod: fmod=1 is C's remainder (floats, te.fmod); fmod=0 is Python's `%` (the divisor's
    sign): of floats, the remainder plus the divisor where their signs differ, as numpy's mod."""
    fmod = int(op.attr("fmod", 0))
    if any(x is None or isinstance(x, str) for x in a):
        return len(a) == 2 and a[0] == a[1] and a[0] is not None and (
            _is_float(a[0]) or (fmod == 0 and np.dtype(a[0]).kind in "iu"))
    if not _is_float(a[0].dtype):
        return a[0] % a[1]
    r = E.call("fmod", a[0], a[1])
    if fmod:
        return r
    zero = _c(0, a[0].dtype)
    signed_zero = E.if_then_else(a[1] < zero, _c(-0.0, a[0].dtype), zero)     # a zero takes the divisor's sign
    return E.if_then_else(r == zero, signed_zero, E.if_then_else(
        ((r < zero) & (a[1] > zero)) | ((r > zero) & (a[1] < zero)), r + a[1], r))


def _is_inf(op, x):
    pos, neg = x == _c(np.inf, x.dtype), x == _c(-np.inf, x.dtype)
    on = [c for c, k in ((pos, "detect_positive"), (neg, "detect_negative")) if op.attr(k, 1)]
    return (on[0] | on[1] if len(on) == 2 else on[0]) if on else E.Const(False, "bool")


def _sigmoid(x):
    return E.call("sigmoid", x)


_ELEMENTWISE = {
    "Identity": _unary(lambda op, x, dt: x, floats_only=False),
    "Dropout": _unary(lambda op, x, dt: x, floats_only=False),
    "Relu": _unary(lambda op, x, dt: E.call("max", x, _c(0, dt))),
    "Neg": _unary(lambda op, x, dt: -x),
    "Abs": _unary(lambda op, x, dt: E.call("abs", x)),
    "Exp": _unary(lambda op, x, dt: E.call("exp", x)),
    "Log": _unary(lambda op, x, dt: E.call("log", x)),
    "Sqrt": _unary(lambda op, x, dt: E.call("sqrt", x)),
    "Tanh": _unary(lambda op, x, dt: E.call("tanh", x)),
    "Erf": _unary(lambda op, x, dt: E.call("erf", x)),
    "Sigmoid": _unary(lambda op, x, dt: _sigmoid(x)),
    "Reciprocal": _unary(lambda op, x, dt: _c(1, dt) / x),
    "Swish": _unary(lambda op, x, dt: x * _sigmoid(_c(op.attr("alpha", 1.0), dt) * x)),
    "LeakyRelu": _unary(lambda op, x, dt: E.if_then_else(x >= _c(0, dt), x, x * _c(op.attr("alpha", 0.01), dt))),
    "HardSigmoid": _unary(lambda op, x, dt: E.call("min", E.call(
        "max", _c(op.attr("alpha", 0.2), dt) * x + _c(op.attr("beta", 0.5), dt), _c(0, dt)), _c(1, dt))),
    "HardSwish": _unary(lambda op, x, dt: x * E.call("min", E.call(
        "max", x * _c(1 / 6, dt) + _c(0.5, dt), _c(0, dt)), _c(1, dt))),
    "Gelu": _unary(lambda op, x, dt: (_c(0.5, dt) * x * (_c(1, dt) + E.call("erf", x * _c(1 / math.sqrt(2), dt))))
                   if op.attr("approximate", "none") != "tanh" else
                   (_c(0.5, dt) * x * (_c(1, dt) + E.call("tanh", _c(math.sqrt(2 / math.pi), dt)
                                                          * (x + _c(0.044715, dt) * x * x * x))))),
    "Elu": _unary(lambda op, x, dt: E.if_then_else(
        x >= _c(0, dt), x, _c(op.attr("alpha", 1.0), dt) * (E.call("exp", x) - _c(1, dt)))),
    "Celu": _unary(lambda op, x, dt: E.call("max", x, _c(0, dt)) + E.call("min", _c(0, dt), _c(
        op.attr("alpha", 1.0), dt) * (E.call("exp", x / _c(op.attr("alpha", 1.0), dt)) - _c(1, dt)))),
    "IsNaN": _unary(lambda op, x, dt: x != x),
    "IsInf": _unary(lambda op, x, dt: _is_inf(op, x)),
    "Mod": _mod,
    "Add": _binary(lambda a, dt: a[0] + a[1]),
    "Sub": _binary(lambda a, dt: a[0] - a[1]),
    "Mul": _binary(lambda a, dt: a[0] * a[1]),
    "Div": _binary(lambda a, dt: a[0] / a[1], floats_only=True),
    "Equal": _binary(lambda a, dt: a[0] == a[1], bools=True),
    "Less": _binary(lambda a, dt: a[0] < a[1]),
    "LessOrEqual": _binary(lambda a, dt: a[0] <= a[1]),
    "Greater": _binary(lambda a, dt: a[0] > a[1]),
    "GreaterOrEqual": _binary(lambda a, dt: a[0] >= a[1]),
    "And": _binary(lambda a, dt: a[0] & a[1], bools=True),
    "Or": _binary(lambda a, dt: a[0] | a[1], bools=True),
    "Max": _variadic("max"),
    "Min": _variadic("min"),
    "Clip": _clip,
    "Where": _where,
    "Cast": _cast,
    "CastLike": lambda op, a, dt: _cast(op, a[:1], dt),
}


# ---- anchors with a reduction ---------------------------------------------------------------

def _matmul(b, op, wl):
    """numpy matmul of operands of rank >= 2 (batch dimensions broadcast); Dense is x @ w + bias."""
    a, w = b.value(op.args[0]), b.value(op.args[1])
    if len(a.shape) < 2 and op.op == "MatMul" or len(w.shape) < 2 or a.dtype != w.dtype or a.dtype == "bool":
        raise Unsupported("MatMul form")
    if "y_strides" in op.attrs:
        raise Unsupported("a product stored transposed")
    out_shape = tuple(wl.spec(f"v{op.index}").shape)
    K = a.shape[-1]
    if w.shape[-2] != K:
        raise Unsupported("MatMul shapes")
    k = reduce_axis((0, K), "k")

    def matmul(*ax):
        bat = list(ax[:-2])
        ai = _batch(bat, a.shape[:-2], out_shape[:-2]) + [ax[-2], k]
        wi = _batch(bat, w.shape[:-2], out_shape[:-2]) + [k, ax[-1]]
        return reduction("sum", a.at(ai) * w.at(wi), k)

    def dense(*ax):             # x[..., K] @ w[K, N]: x's leading dims are the output's
        return reduction("sum", a.at([*ax[:-1], k]) * w.at([k, ax[-1]]), k)
    stage = compute(out_shape, dense if op.op == "Dense" else matmul, name="matmul")
    bias = b.value(op.args[2]) if len(op.args) > 2 and op.args[2] else None
    bat = _broadcast(bias, out_shape) if bias is not None else None
    if bias is not None and bias.dtype != a.dtype:
        raise Unsupported("Dense bias")

    def at(idx):
        v = read(stage, out_shape, idx)
        return v if bat is None else v + bat(idx)
    return Value(out_shape, a.dtype, at)


def _batch(idx, shape, out):
    """Indices of an operand of `shape` broadcast against `out` (numpy's rules) at out's `idx`."""
    r, q = len(out), len(shape)
    return [E.Const(0, E.INDEX) if d == 1 and o != 1 else i for i, d, o in zip(idx[r - q:], shape, out[r - q:])]


def _einsum(b, op, wl):
    from ..ops.linalg import einsum_terms
    vals = [b.value(a) for a in op.args]
    try:
        terms, out = einsum_terms(op.attr("equation", ""), [v.shape for v in vals])
    except ValueError as e:
        raise Unsupported(str(e)) from None
    if len({v.dtype for v in vals}) != 1 or vals[0].dtype == "bool":
        raise Unsupported("Einsum dtypes")
    sizes = {}
    for t, v in zip(terms, vals):
        for ch, d in zip(t, v.shape):
            sizes[ch] = max(sizes.get(ch, 1), d)
    out_shape = tuple(wl.spec(f"v{op.index}").shape)
    summed = sorted({ch for t in terms for ch in t} - set(out))
    raxes = {ch: reduce_axis((0, sizes[ch]), f"r_{ch}") for ch in summed}

    def body(*ax):
        env = {**dict(zip(out, ax)), **raxes}
        prod = None
        for t, v in zip(terms, vals):
            e = v.at(_batch([env[ch] for ch in t], v.shape, [sizes[ch] for ch in t]))
            prod = e if prod is None else prod * e
        return reduction("sum", prod, [raxes[ch] for ch in summed]) if summed else prod
    stage = compute(out_shape or (1,), body if out else (lambda q0: body()), name="einsum")

    def at(idx):
        return read(stage, out_shape, idx)
    return Value(out_shape, vals[0].dtype, at)


_REDUCE = {"ReduceSum": "sum", "ReduceMean": "sum", "ReduceMax": "max", "ReduceMin": "min",
           "ReduceSumSquare": "sum", "ReduceL1": "sum", "ReduceL2": "sum"}


def _reduce(b, op, wl):
    from ..ops.reduce import reduce_axes
    x = b.value(op.args[0])
    rank = len(x.shape)
    given = None                                 # axes are an input (opset 18's form) after import
    if len(op.args) > 1 and op.args[1]:
        if not op.args[1].startswith("p"):
            raise Unsupported("runtime axes")
        given = wl.params[op.args[1]]
    axes = reduce_axes(given, rank, int(op.attr("noop_with_empty_axes", 0)))
    if axes is None:
        raise Unsupported("no-op reduction")
    keep = int(op.attr("keepdims", 1))
    kind = _REDUCE[op.op]
    dt = x.dtype
    if not rank or any(x.shape[a] == 0 for a in axes):
        raise Unsupported("empty reduction")
    if (dt == "bool" and kind == "sum") or (op.op in ("ReduceMean", "ReduceL2") and not _is_float(dt)):
        raise Unsupported(f"{op.op} of {dt}")
    out_shape = tuple(wl.spec(f"v{op.index}").shape)
    rax = {a: reduce_axis((0, x.shape[a]), f"r{a}") for a in axes}

    def body(*ax):
        it = iter(ax)
        idx = []
        for d in range(rank):
            if d in rax:
                idx.append(rax[d])
                if keep:
                    next(it)
            else:
                idx.append(next(it))
        v = x.at(idx)
        if dt == "bool":
            v = E.cast("int32", v)
        if op.op == "ReduceSumSquare" or op.op == "ReduceL2":
            v = v * v
        elif op.op == "ReduceL1":
            v = E.call("abs", v)
        return reduction(kind, v, [rax[a] for a in axes])
    stage = compute(out_shape or (1,), body if out_shape else (lambda q0: body()), name="reduce")
    count = math.prod(x.shape[a] for a in axes)

    def at(idx):
        v = read(stage, out_shape, idx)
        if dt == "bool":
            return E.cast("bool", v)
        if op.op == "ReduceMean":
            return v / _c(count, dt)
        if op.op == "ReduceL2":
            return E.call("sqrt", v)
        return v
    return Value(out_shape, dt, at)


# ---- data movement ----------------------------------------------------------------------------

LOWER = {**{k: _elementwise(fn) for k, fn in _ELEMENTWISE.items()},
         "MatMul": _matmul, "Dense": _matmul, "Einsum": _einsum, **{k: _reduce for k in _REDUCE}}
# (data movement: moves.py)
