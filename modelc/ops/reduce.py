"""Reductions (axes as an optional input, opset 18 form), ArgMax/ArgMin, CumSum.

Float reductions accumulate in float64 and return the input dtype. Reducing an empty set gives
the reduction's identity (0 for sums, 1 for products, -inf/+inf for max/min and the logs).
"""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from .registry import Kind, norm_axis, register


def _axis(axis, rank: int) -> int:
    """norm_axis, raising ValueError so that the registry's message names the node."""
    try:
        return norm_axis(axis, rank)
    except ShapeError as e:
        raise ValueError(str(e)) from None


def reduce_axes(axes, rank: int, noop: int):
    """Normalised axes tuple; None means 'no reduction' (empty axes with noop_with_empty_axes)."""
    if axes is None or np.size(axes) == 0:
        return None if noop else tuple(range(rank))
    out = sorted({_axis(int(a), rank) for a in np.ravel(axes)})
    if len(out) != np.size(axes):
        raise ValueError(f"axes {np.ravel(axes).tolist()} repeat an axis")
    return tuple(out)


def _reduce_infer(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    if axes is not None and axes.value is None:
        raise ValueError(f"axes ({axes.name!r}) must be a constant (or computable from shapes): "
                         "it decides the output shape")
    ax = reduce_axes(None if axes is None else axes.value, len(data.shape), noop_with_empty_axes)
    if ax is None:
        return data.shape, data.dtype
    if keepdims:
        shape = tuple(1 if i in ax else d for i, d in enumerate(data.shape))
    else:
        shape = tuple(d for i, d in enumerate(data.shape) if i not in ax)
    return shape, data.dtype


def _accumulator(dtype):
    dtype = np.dtype(dtype)
    return np.float64 if dtype.kind == "f" else None   # ints: numpy's own (exact) arithmetic


def _reduction(name, pre, fold, post=None, empty=None):
    """Register reduction `name`: post(fold(pre(x), axes)), cast back to the input dtype."""
    @register(name, Kind.REDUCTION, infer=_reduce_infer, param_inputs=(1,))
    def ref(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        # empty axes with noop_with_empty_axes: no reduction, but the elementwise parts still
        # apply (ReduceL1 gives |x|), as in onnxruntime and ONNX's reference
        ax = reduce_axes(axes, data.ndim, noop_with_empty_axes)
        ax = () if ax is None else ax
        acc = _accumulator(data.dtype)
        v = pre(data.astype(acc) if acc is not None else data)
        if empty is not None and any(data.shape[a] == 0 for a in ax):
            shape = _reduce_infer_shape(data.shape, ax, keepdims)
            return np.full(shape, empty(data.dtype), dtype=data.dtype)
        y = fold(v, axis=ax, keepdims=bool(keepdims))
        if post is not None:
            y = post(y)
        return np.asarray(y).astype(data.dtype)
    return ref


def _reduce_infer_shape(shape, ax, keepdims):
    if keepdims:
        return tuple(1 if i in ax else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in ax)


def _ident(v):
    return v


def _lowest(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return False
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _highest(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return True
    return np.inf if dtype.kind == "f" else np.iinfo(dtype).max


def _logsumexp(v, axis, keepdims):
    m = np.max(v, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    y = np.log(np.sum(np.exp(v - m), axis=axis, keepdims=True)) + m
    return y if keepdims else np.squeeze(y, axis=axis)


_reduction("ReduceSum", _ident, np.sum)
_reduction("ReduceMean", _ident, np.mean)
_reduction("ReduceProd", _ident, np.prod)
_reduction("ReduceMax", _ident, np.max, empty=_lowest)
_reduction("ReduceMin", _ident, np.min, empty=_highest)
_reduction("ReduceL1", np.abs, np.sum)
_reduction("ReduceL2", np.square, np.sum, post=np.sqrt)
_reduction("ReduceSumSquare", np.square, np.sum)
_reduction("ReduceLogSum", _ident, np.sum, post=np.log, empty=lambda dt: -np.inf)
_reduction("ReduceLogSumExp", _ident, _logsumexp, empty=lambda dt: -np.inf)


# ---- ArgMax / ArgMin -------------------------------------------------------------------------

def _arg_infer(data, *, axis=0, keepdims=1, select_last_index=0):
    a = _axis(axis, len(data.shape))
    return _reduce_infer_shape(data.shape, (a,), keepdims), np.int64


def _arg(fn):
    def ref(data, *, axis=0, keepdims=1, select_last_index=0):
        a = _axis(axis, data.ndim)
        if select_last_index:
            idx = data.shape[a] - 1 - fn(np.flip(data, axis=a), axis=a)
        else:
            idx = fn(data, axis=a)
        idx = idx.astype(np.int64)
        return np.expand_dims(idx, a) if keepdims else idx
    return ref


register("ArgMax", Kind.REDUCTION, infer=_arg_infer)(_arg(np.argmax))
register("ArgMin", Kind.REDUCTION, infer=_arg_infer)(_arg(np.argmin))


# ---- CumSum, CumProd ---------------------------------------------------------------------------

def _cum_infer(x, axis, *, exclusive=0, reverse=0):
    if axis.value is not None:
        _axis(int(np.ravel(axis.value)[0]), len(x.shape))
    return x.shape, x.dtype


def _cumulative(scan, identity):
    """The reference of a running sum or product: floats accumulate in float64, integers in their
    own type (numpy's wrap-around, as onnxruntime's)."""
    def ref(x, axis, *, exclusive=0, reverse=0):
        a = _axis(int(np.ravel(axis)[0]), x.ndim)
        acc = _accumulator(x.dtype)
        v = x.astype(acc) if acc is not None else x
        if reverse:
            v = np.flip(v, axis=a)
        y = scan(v, axis=a)
        if exclusive:   # shift by one along the axis instead of undoing the last step: exact for floats too
            head = np.full_like(np.take(y, [0], axis=a), identity)
            y = np.concatenate([head, np.delete(y, -1, axis=a)], axis=a) if y.shape[a] else y
        if reverse:
            y = np.flip(y, axis=a)
        return np.ascontiguousarray(y).astype(x.dtype)
    return ref


register("CumSum", Kind.OPAQUE, infer=_cum_infer)(_cumulative(np.cumsum, 0))
register("CumProd", Kind.OPAQUE, infer=_cum_infer)(_cumulative(np.cumprod, 1))
