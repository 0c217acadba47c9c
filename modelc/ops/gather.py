"""Indexing ops: gathers, scatters, OneHot and TopK.

Negative indices wrap once, as ONNX says; an index outside the axis is an error, raised at import
when the indices are constant (onnxruntime refuses them only when it runs).
"""
from __future__ import annotations

import math

import numpy as np

from .params import axis_index, known
from .registry import Kind, register


def _wrap(idx, dim):
    idx = np.asarray(idx).astype(np.int64, copy=False)
    out = np.where(idx < 0, idx + dim, idx)
    if out.size and (out.min() < 0 or out.max() >= dim):
        bad = int(np.asarray(idx).reshape(-1)[np.flatnonzero((out < 0) | (out >= dim))[0]])
        raise ValueError(f"index {bad} is out of range [{-dim}, {dim - 1}] for a dimension of {dim}")
    return out


def _check_indices(idx, dim):
    """Constant indices are checked at import (onnxruntime refuses them when it runs)."""
    if idx is not None and idx.value is not None:
        if np.asarray(idx.value).dtype.kind not in "iu":
            raise ValueError(f"indices must be integers, got {np.asarray(idx.value).dtype}")
        _wrap(idx.value, dim)


def _gather_infer(x, idx, axis=0):
    a = axis_index(axis, len(x.shape))
    _check_indices(idx, x.shape[a])
    if x.shape[a] == 0 and math.prod(idx.shape) > 0:
        raise ValueError(f"gathers {math.prod(idx.shape)} indices from axis {a} of size 0")
    return x.shape[:a] + idx.shape + x.shape[a + 1:], x.dtype


@register("Gather", Kind.INJECTIVE, infer=_gather_infer)
def gather(x, indices, *, axis=0):
    a = axis_index(axis, x.ndim)
    return np.take(x, _wrap(indices, x.shape[a]), axis=a)


def _gather_elements_infer(x, idx, axis=0):
    a = axis_index(axis, len(x.shape))
    if len(idx.shape) != len(x.shape):
        raise ValueError(f"indices rank {len(idx.shape)} differs from data rank {len(x.shape)}")
    if any(i > d != 1 for j, (i, d) in enumerate(zip(idx.shape, x.shape)) if j != a):
        raise ValueError(f"indices {list(idx.shape)} exceed data {list(x.shape)} off axis {a}")
    if x.shape[a] == 0 and math.prod(idx.shape) > 0:
        raise ValueError(f"gathers {math.prod(idx.shape)} indices from axis {a} of size 0")
    _check_indices(idx, x.shape[a])
    return idx.shape, x.dtype


@register("GatherElements", Kind.INJECTIVE, infer=_gather_elements_infer)
def gather_elements(x, indices, *, axis=0):
    """Off the axis, indices may be shorter than the data (onnxruntime reads the leading part)."""
    a = axis_index(axis, x.ndim)
    x = x[tuple(slice(None) if j == a or d == 1 else slice(0, i)
                for j, (i, d) in enumerate(zip(indices.shape, x.shape)))]
    return np.take_along_axis(x, _wrap(indices, x.shape[a]), axis=a)


def _gather_nd_shape(dshape, ishape, b):
    k = ishape[-1]
    if dshape[:b] != ishape[:b] or b + k > len(dshape):
        raise ValueError(f"indices {list(ishape)} do not fit data {list(dshape)} with batch_dims {b}")
    if math.prod(ishape[:-1]) > 0 and 0 in dshape[b:b + k]:
        raise ValueError(f"indexes axes of size 0 of data {list(dshape)}")
    return tuple(ishape[:-1]) + tuple(dshape[b + k:])


@register("GatherND", Kind.INJECTIVE,
          infer=lambda x, i, batch_dims=0: (_gather_nd_shape(x.shape, i.shape, batch_dims), x.dtype))
def gather_nd(x, indices, *, batch_dims=0):
    b, k = batch_dims, indices.shape[-1]
    out_shape = _gather_nd_shape(x.shape, indices.shape, b)
    nb = math.prod(x.shape[:b])
    data = x.reshape((nb,) + x.shape[b:])
    idx = indices.reshape(nb, -1, k)
    cols = [_wrap(idx[..., j], x.shape[b + j]) for j in range(k)]
    return data[(np.arange(nb)[:, None], *cols)].reshape(out_shape)


_REDUCERS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(out, key, updates, reduction):
    if reduction in (None, "none"):
        out[key] = updates
    elif reduction in _REDUCERS:
        _REDUCERS[reduction].at(out, key, updates)
    else:
        raise ValueError(f"unknown reduction {reduction!r}")
    return out


def _scatter_elements_infer(x, idx, updates, axis=0, reduction="none"):
    a = axis_index(axis, len(x.shape))
    if tuple(updates.shape) != tuple(idx.shape) or len(idx.shape) != len(x.shape) or any(
            i > d for j, (i, d) in enumerate(zip(idx.shape, x.shape)) if j != a):
        raise ValueError(f"indices {list(idx.shape)} and updates {list(updates.shape)} must have one "
                         f"shape, of data {list(x.shape)}'s rank and within it off axis {a}")
    if x.shape[a] == 0 and math.prod(idx.shape) > 0:
        raise ValueError(f"scatters {math.prod(idx.shape)} indices into axis {a} of size 0")
    _check_indices(idx, x.shape[a])
    return x.shape, x.dtype


def _scatter_nd_infer(x, idx, updates, reduction="none"):
    k = idx.shape[-1] if len(idx.shape) else None
    if k is None or k > len(x.shape) or \
            tuple(updates.shape) != tuple(idx.shape[:-1]) + tuple(x.shape[k:]):
        raise ValueError(f"indices {list(idx.shape)} and updates {list(updates.shape)} do not fit "
                         f"data {list(x.shape)} (updates must be indices.shape[:-1] + data.shape[k:])")
    if math.prod(idx.shape[:-1]) > 0 and 0 in x.shape[:k]:
        raise ValueError(f"indexes axes of size 0 of data {list(x.shape)}")
    if idx.value is not None:
        v = np.asarray(idx.value)
        if v.dtype.kind not in "iu":
            raise ValueError(f"indices must be integers, got {v.dtype}")
        for j in range(idx.shape[-1]):
            _wrap(v[..., j], x.shape[j])
    return x.shape, x.dtype


@register("ScatterElements", Kind.OPAQUE, infer=_scatter_elements_infer)
def scatter_elements(x, indices, updates, *, axis=0, reduction="none"):
    a = axis_index(axis, x.ndim)
    key = list(np.indices(indices.shape, sparse=True))
    key[a] = _wrap(indices, x.shape[a])
    return _scatter(x.copy(), tuple(key), updates, reduction)


@register("ScatterND", Kind.OPAQUE, infer=_scatter_nd_infer)
def scatter_nd(x, indices, updates, *, reduction="none"):
    k = indices.shape[-1]
    n = int(np.prod(indices.shape[:-1], dtype=np.int64))     # (not -1: numpy cannot infer it beside a 0)
    idx = indices.reshape(n, k)
    key = tuple(_wrap(idx[:, j], x.shape[j]) for j in range(k))
    return _scatter(x.copy(), key, updates.reshape((n,) + x.shape[k:]), reduction)


def _few_best(x, k: int, largest) -> np.ndarray:
    """Indices of the k best along the last axis, in ONNX's order, without sorting the whole axis
    (a detector's 1,000 best of 120,000 anchors): a partition finds the k-th key, the keys before it
    and as many equal to it as fit, lowest indices first, are then sorted stably."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    if largest:      # an order-reversing key: negation for floats, bitwise not for integers
        rows = -rows if rows.dtype.kind == "f" else ~rows
    kth = np.take_along_axis(rows, np.argpartition(rows, k - 1, axis=1)[:, k - 1:k], axis=1)
    less = rows < kth
    equal = rows == kth
    take = less | (equal & (np.cumsum(equal, axis=1) <= k - less.sum(axis=1, keepdims=True)))
    cols = np.nonzero(take)[1].reshape(-1, k)
    order = np.argsort(np.take_along_axis(rows, cols, axis=1), axis=1, kind="stable")
    return np.take_along_axis(cols, order, axis=1).astype(np.int64).reshape(x.shape[:-1] + (k,))


def _onehot_infer(idx, depth, values, axis=-1):
    d = int(np.asarray(known(depth, "depth")).reshape(-1)[0])
    r = len(idx.shape) + 1
    a = axis_index(axis, r)
    return idx.shape[:a] + (d,) + idx.shape[a:], values.dtype


@register("OneHot", Kind.INJECTIVE, infer=_onehot_infer, param_inputs=(1,))
def one_hot(indices, depth, values, *, axis=-1):
    d = int(np.asarray(depth).reshape(-1)[0])
    a = axis_index(axis, indices.ndim + 1)
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + d, idx)
    hot = np.expand_dims(idx, a) == np.arange(d).reshape((d,) + (1,) * (indices.ndim - a))
    off, on = values.reshape(-1)[:2]
    return np.where(hot, on, off).astype(values.dtype)


def _topk_infer(x, k, axis=-1, largest=1, sorted=1):
    a = axis_index(axis, len(x.shape))
    kk = int(np.asarray(known(k, "K")).reshape(-1)[0])
    if not 0 <= kk <= x.shape[a]:
        raise ValueError(f"K={kk} is out of range for a dimension of {x.shape[a]}")
    shape = x.shape[:a] + (kk,) + x.shape[a + 1:]
    return [(shape, x.dtype), (shape, np.dtype(np.int64))]


@register("TopK", Kind.OPAQUE, infer=_topk_infer, param_inputs=(1,))
def topk(x, k, *, axis=-1, largest=1, sorted=1):
    """Ties keep the lower index first, as ONNX requires, for largest and smallest alike."""
    a = axis_index(axis, x.ndim)
    kk = int(np.asarray(k).reshape(-1)[0])
    n = x.shape[a]
    if 0 < kk <= n // 8 and x.dtype.kind in "iuf" and not (x.dtype.kind == "f" and np.isnan(x).any()):
        idx = np.moveaxis(_few_best(np.moveaxis(x, a, -1), kk, largest), -1, a)
        return np.take_along_axis(x, idx, axis=a), idx
    if largest:   # stable ascending sort of the reversed axis, read backwards
        order = np.flip(n - 1 - np.argsort(np.flip(x, a), axis=a, kind="stable"), a)
    else:
        order = np.argsort(x, axis=a, kind="stable")
    idx = np.take(order, np.arange(kk), axis=a)
    return np.take_along_axis(x, idx, axis=a), idx.astype(np.int64)
