"""te lowerings of the data-movement ops a fused group may hold: index arithmetic on the Value
protocol of lowerings.py (always inlined into the reader, never a stage of their own)."""
from __future__ import annotations

import math

import numpy as np

from . import expr as E
from .lowerings import Unsupported, Value, _broadcast, _c, flat


def _reshape(b, op, wl):
    """Reshape, Flatten, Squeeze, Unsqueeze: the element at the same row-major position."""
    x = b.value(op.args[0])
    out_shape = tuple(wl.spec(f"v{op.index}").shape)
    if math.prod(out_shape) != math.prod(x.shape) or not math.prod(x.shape):
        raise Unsupported(f"{op.op} shapes")

    def at(idx):
        pos = None
        for i, d in zip(idx, out_shape):
            i = flat(i)
            pos = i if pos is None else pos * d + i
        src, rest = [], pos if pos is not None else E.Const(0, E.INDEX)
        for k, d in reversed(list(enumerate(x.shape))):
            src.insert(0, rest % d if k else rest)
            rest = rest // d
        return x.at(src)
    return Value(out_shape, x.dtype, at)


def _params(wl, op, first: int) -> list:
    """The constant operands of `op` from input `first` on (None where absent)."""
    out = []
    for ref in op.args[first:]:
        if ref and not ref.startswith("p"):
            raise Unsupported(f"{op.op} with runtime {ref}")
        out.append(wl.params[ref] if ref else None)
    return out


def _slice(b, op, wl):
    from ..ops.shape import slice_bounds
    x = b.value(op.args[0])
    try:
        sl = slice_bounds(x.shape, *_params(wl, op, 1))
    except ValueError as e:
        raise Unsupported(str(e)) from None
    out_shape = tuple(wl.spec(f"v{op.index}").shape)
    steps = [(s.start or 0, 1 if s.step is None else s.step) for s in sl]
    return Value(out_shape, x.dtype, lambda idx: x.at([flat(i) * st + lo if (lo, st) != (0, 1) else flat(i)
                                                       for i, (lo, st) in zip(idx, steps)]))


def _gather(b, op, wl):
    """A Gather of one constant position (an unrolled Scan's or recurrent layer's time step)."""
    x = b.value(op.args[0])
    at_, = _params(wl, op, 1)
    a = int(op.attr("axis", 0)) % len(x.shape)
    if at_.size != 1:
        raise Unsupported("Gather of several positions")
    k = int(at_.reshape(-1)[0])
    k = k + x.shape[a] if k < 0 else k
    if not 0 <= k < x.shape[a]:
        raise Unsupported("Gather position out of range")
    out_shape = tuple(wl.spec(f"v{op.index}").shape)
    keep = at_.ndim          # 0 for a scalar position, 1 for [k]: the axis stays, of length 1
    return Value(out_shape, x.dtype, lambda idx: x.at(list(idx[:a]) + [k] + list(idx[a + keep:])))


def _concat(b, op, wl):
    xs = [b.value(a) for a in op.args]
    out_shape = tuple(wl.spec(f"v{op.index}").shape)
    a = int(op.attr("axis", 0)) % len(out_shape)
    xs = [x for x in xs if x.shape[a]]                # empty inputs add nothing
    if not xs or len({x.dtype for x in xs}) != 1:
        raise Unsupported("Concat operands")
    offs = np.cumsum([0] + [x.shape[a] for x in xs]).tolist()

    def at(idx):
        idx = [flat(i) for i in idx]
        v = None
        for x, lo, hi in reversed(list(zip(xs, offs, offs[1:]))):
            e = x.at(idx[:a] + [idx[a] - lo if lo else idx[a]] + idx[a + 1:])
            v = e if v is None else E.if_then_else(idx[a] < hi, e, v)
        return v
    return Value(out_shape, xs[0].dtype, at)


def _pad(b, op, wl):
    """Negative pads crop first; reflect and wrap then index into the cropped extent (ops/pad.py)."""
    from ..ops.pad import pad_widths
    x = b.value(op.args[0])
    mode = op.attr("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    pads, value, axes = (_params(wl, op, 1) + [None, None])[:3]
    if mode not in ("constant", "edge", "reflect", "wrap") or pads is None or not x.shape:
        raise Unsupported(f"Pad mode {mode}")
    try:
        widths, out_shape = pad_widths(x.shape, pads, axes)
    except ValueError as e:
        raise Unsupported(str(e)) from None
    kept = [d + min(lo, 0) + min(hi, 0) for d, (lo, hi) in zip(x.shape, widths)]
    if mode != "constant" and any(k <= 0 < n for k, n in zip(kept, out_shape)):
        raise Unsupported(f"{mode} Pad of an axis cropped to nothing")    # nothing to repeat: the reference says so
    if mode == "reflect" and any(max(lo, hi) > k - 1 and k > 1 for k, (lo, hi) in zip(kept, widths)):
        raise Unsupported("reflect Pad wider than its axis")     # reflected more than once
    fill = _c(0 if value is None or np.asarray(value).size == 0 else np.asarray(value).reshape(-1)[0].item(),
              x.dtype) if x.dtype != "bool" else E.Const(bool(value is not None and np.asarray(value).any()), "bool")

    def fold(j, n, lo, hi):
        """Index j of the padded axis (j - lo in the cropped extent of n) into that extent."""
        k = flat(j) - max(lo, 0) if lo > 0 else flat(j)
        i = lambda v: E.Const(v, E.INDEX)     # noqa: E731
        if n == 1:
            k = i(0)
        elif mode == "edge":
            k = E.call("min", E.call("max", k, i(0)), i(n - 1))
        elif mode == "reflect":
            k = i(n - 1) - E.call("abs", i(n - 1) - E.call("abs", k))
        else:                                  # wrap: k >= -lo, made non-negative before the modulo
            k = (k + i(n * -(-lo // n))) % n if lo > 0 else k % n
        return k + max(-lo, 0) if lo < 0 else k

    def at(idx):
        if mode != "constant":
            return x.at([fold(j, k, lo, hi) if lo > 0 or hi > 0 else (flat(j) - lo if lo else j)
                         for j, k, (lo, hi) in zip(idx, kept, widths)])
        src = [flat(i) - lo if lo else flat(i) for i, (lo, _) in zip(idx, widths)]
        inside = [(j >= 0) & (j < d) for j, d, (lo, hi) in zip(src, x.shape, widths) if lo > 0 or hi > 0]
        v = x.at(src)
        if not inside:
            return v
        cond = inside[0]
        for c in inside[1:]:
            cond = cond & c
        return E.if_then_else(cond, v, fill)
    return Value(tuple(out_shape), x.dtype, at)


def _expand(b, op, wl):
    x = b.value(op.args[0])
    out_shape = tuple(wl.spec(f"v{op.index}").shape)
    return Value(out_shape, x.dtype, _broadcast(x, out_shape))


def _transpose(b, op, wl):
    x = b.value(op.args[0])
    perm = list(op.attr("perm", list(reversed(range(len(x.shape))))))
    out_shape = tuple(wl.spec(f"v{op.index}").shape)
    if sorted(perm) != list(range(len(x.shape))):
        raise Unsupported("Transpose perm")

    def at(idx):
        src = [None] * len(perm)
        for i, p in zip(idx, perm):
            src[p] = i
        return x.at(src)
    return Value(out_shape, x.dtype, at)


MOVES = {"Transpose": _transpose, "Expand": _expand, "Slice": _slice, "Concat": _concat, "Pad": _pad,
         "Gather": _gather, **{k: _reshape for k in ("Reshape", "Flatten", "Squeeze", "Unsqueeze")}}
