"""Data movement, shape and indexing ops: Reshape, Transpose, Slice, Gather, Pad, Resize, TopK ...

Each op's shape rule and its reference share one helper that turns the op's parameters into a
plan (target shape, numpy slices, split sizes, per-axis resize coordinates), so the shape the
importer declares and the array the reference returns cannot disagree. Inputs that decide the
output shape (Reshape's shape, Slice's starts, Resize's sizes ...) must be known at import: a
constant, or a value computed from shapes (Shape -> Gather -> Concat chains resolve as they are
imported, because Shape's rule returns its value).
"""
from __future__ import annotations

import math

import numpy as np
from onnx import helper

from ..errors import UnsupportedOpError
from .registry import Kind, register


class NotConstant(ValueError):
    """An input that decides the output shape is not known at import time."""


def _known(t, what: str):
    """The value of input tensor `t` (None if omitted); raises if the model computes it at run time."""
    if t is None:
        return None
    if t.value is None:
        raise NotConstant(f"input {t.name!r} ({what}) decides the output shape and must be a "
                          "constant (or computable from shapes), but it depends on the model's inputs")
    return t.value


def _ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _opt(a):
    """Optional parameter inputs: omitted or empty (ONNX's '' or a 0-element tensor) mean absent."""
    return None if a is None or np.asarray(a).size == 0 else a


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    a = int(axis)
    if not -rank <= a < rank:
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def _axes(axes, rank: int) -> list[int]:
    out = [_axis(a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise ValueError(f"axes {list(axes)} repeat an axis")
    return out


def _same(x, *rest, **attrs):
    return x.shape, x.dtype


# ---- shape ops ----------------------------------------------------------------------------------

def _flatten_shape(shape, axis):
    r = len(shape)
    a = int(axis) + r if int(axis) < 0 else int(axis)
    if not 0 <= a <= r:
        raise ValueError(f"axis {axis} is out of range for rank {r}")
    return math.prod(shape[:a]), math.prod(shape[a:])


@register("Flatten", Kind.INJECTIVE, infer=lambda x, axis=1: (_flatten_shape(x.shape, axis), x.dtype))
def flatten(x, *, axis=1):
    return x.reshape(_flatten_shape(x.shape, axis))


def _reshape_shape(in_shape, target, allowzero=0):
    out = _ints(target)
    if not allowzero:
        for i, d in enumerate(out):
            if d == 0:
                if i >= len(in_shape):
                    raise ValueError(f"shape {out}: 0 at position {i} copies a dimension the "
                                     f"input {list(in_shape)} does not have")
                out[i] = in_shape[i]
    total = math.prod(in_shape)
    free = [i for i, d in enumerate(out) if d == -1]
    if len(free) > 1 or any(d < -1 for d in out):
        raise ValueError(f"invalid target shape {_ints(target)}")
    if free:
        rest = math.prod(d for d in out if d != -1)
        if rest == 0 or total % rest:
            raise ValueError(f"cannot reshape {list(in_shape)} ({total} elements) to {_ints(target)}")
        out[free[0]] = total // rest
    if math.prod(out) != total:
        raise ValueError(f"cannot reshape {list(in_shape)} ({total} elements) to {_ints(target)}")
    return tuple(out)


@register("Reshape", Kind.INJECTIVE, param_inputs=(1,),
          infer=lambda x, s, allowzero=0: (_reshape_shape(x.shape, _known(s, "shape"), allowzero),
                                           x.dtype))
def reshape(x, shape, *, allowzero=0):
    return x.reshape(_reshape_shape(x.shape, shape, allowzero))


def _perm(rank, perm):
    p = list(range(rank))[::-1] if perm is None else [int(v) for v in perm]
    if sorted(p) != list(range(rank)):
        raise ValueError(f"perm {p} is not a permutation of the {rank} axes")
    return p


@register("Transpose", Kind.INJECTIVE,
          infer=lambda x, perm=None: (tuple(x.shape[i] for i in _perm(len(x.shape), perm)), x.dtype))
def transpose(x, *, perm=None):
    return np.transpose(x, _perm(x.ndim, perm))


def _squeeze_shape(shape, axes):
    axes = _opt(axes)
    if axes is None:
        return tuple(d for d in shape if d != 1)
    ax = _axes(_ints(axes), len(shape))
    for a in ax:
        if shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of shape {list(shape)}: its size is not 1")
    return tuple(d for i, d in enumerate(shape) if i not in ax)


@register("Squeeze", Kind.INJECTIVE, param_inputs=(1,),
          infer=lambda x, axes=None: (_squeeze_shape(x.shape, _known(axes, "axes")), x.dtype))
def squeeze(x, axes=None):
    return x.reshape(_squeeze_shape(x.shape, axes))


def _unsqueeze_shape(shape, axes):
    axes = _ints(axes)
    r = len(shape) + len(axes)
    ax = set(_axes(axes, r))
    it = iter(shape)
    return tuple(1 if i in ax else next(it) for i in range(r))


@register("Unsqueeze", Kind.INJECTIVE, param_inputs=(1,),
          infer=lambda x, axes: (_unsqueeze_shape(x.shape, _known(axes, "axes")), x.dtype))
def unsqueeze(x, axes):
    return x.reshape(_unsqueeze_shape(x.shape, axes))


def _concat_infer(*xs, axis):
    r = len(xs[0].shape)
    a = _axis(axis, r)
    for t in xs:
        if len(t.shape) != r or any(d != e for i, (d, e) in enumerate(zip(t.shape, xs[0].shape))
                                    if i != a):
            raise ValueError(f"cannot concatenate shapes {[list(t.shape) for t in xs]} on axis {axis}")
    shape = list(xs[0].shape)
    shape[a] = sum(t.shape[a] for t in xs)
    return tuple(shape), xs[0].dtype


@register("Concat", Kind.INJECTIVE, infer=_concat_infer)
def concat(*xs, axis):
    return np.concatenate(xs, axis=_axis(axis, xs[0].ndim))


def _split_sizes(dim, split, num_outputs):
    split = _opt(split)
    if split is not None:
        sizes = _ints(split)
        if sum(sizes) != dim or any(s < 0 for s in sizes):
            raise ValueError(f"split sizes {sizes} do not add up to the dimension {dim}")
        return sizes
    if not num_outputs or num_outputs < 1:
        raise ValueError("Split needs either the split input or the num_outputs attribute")
    chunk = -(-dim // num_outputs)
    sizes = [chunk] * (num_outputs - 1) + [dim - chunk * (num_outputs - 1)]
    if sizes[-1] < 0:
        raise ValueError(f"cannot split a dimension of {dim} into {num_outputs} outputs")
    return sizes


def _split_infer(x, split=None, *, axis=0, num_outputs=None):
    a = _axis(axis, len(x.shape))
    sizes = _split_sizes(x.shape[a], _known(split, "split"), num_outputs)
    return [(x.shape[:a] + (s,) + x.shape[a + 1:], x.dtype) for s in sizes]


@register("Split", Kind.INJECTIVE, infer=_split_infer, param_inputs=(1,))
def split(x, split=None, *, axis=0, num_outputs=None):
    a = _axis(axis, x.ndim)
    sizes = _split_sizes(x.shape[a], split, num_outputs)
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=a))


def _slices(shape, starts, ends, axes=None, steps=None) -> tuple:
    """numpy slices for ONNX Slice; ONNX clamps differently from Python for negative steps."""
    starts, ends = _ints(starts), _ints(ends)
    axes = list(range(len(starts))) if _opt(axes) is None else _axes(_ints(axes), len(shape))
    steps = [1] * len(starts) if _opt(steps) is None else _ints(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length")
    out = [slice(None)] * len(shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        d = shape[a]
        if st == 0:
            raise ValueError("Slice step 0")
        s, e = s + d if s < 0 else s, e + d if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
        else:
            s, e = max(min(s, d - 1), 0), min(max(e, -1), d - 1)
        out[a] = slice(s, None if e < 0 else e, st)
    return tuple(out)


def _one_d(**params):
    """Parameter inputs the ONNX spec declares 1-D (Slice's starts, Pad's pads ...) must be 1-D."""
    for what, t in params.items():
        if t is not None and len(t.shape) != 1:
            raise ValueError(f"{what} must be a 1-D tensor, got shape {list(t.shape)}")


def _slice_infer(x, starts, ends, axes=None, steps=None):
    _one_d(starts=starts, ends=ends, axes=axes, steps=steps)
    sl = _slices(x.shape, _known(starts, "starts"), _known(ends, "ends"), _known(axes, "axes"),
                 _known(steps, "steps"))
    return tuple(len(range(d)[s]) for d, s in zip(x.shape, sl)), x.dtype


@register("Slice", Kind.INJECTIVE, infer=_slice_infer, param_inputs=(1, 2, 3, 4))
def slice_(x, starts, ends, axes=None, steps=None):
    return x[_slices(x.shape, starts, ends, axes, steps)]


def _shape_range(rank, start=0, end=None):
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    return start, max(end, start)


def _shape_infer(x, *, start=0, end=None):
    s, e = _shape_range(len(x.shape), start, end)
    return (e - s,), np.dtype(np.int64), np.array(x.shape[s:e], dtype=np.int64)


@register("Shape", Kind.OPAQUE, infer=_shape_infer)
def shape(x, *, start=0, end=None):
    s, e = _shape_range(x.ndim, start, end)
    return np.array(x.shape[s:e], dtype=np.int64)


@register("Size", Kind.OPAQUE,
          infer=lambda x: ((), np.dtype(np.int64), np.array(math.prod(x.shape), dtype=np.int64)))
def size(x):
    return np.array(x.size, dtype=np.int64)


def _fill_value(value):
    return np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)[:1]


@register("ConstantOfShape", Kind.OPAQUE, param_inputs=(0,),
          infer=lambda s, value=None: (tuple(_ints(_known(s, "shape"))), _fill_value(value).dtype))
def constant_of_shape(shape, *, value=None):
    v = _fill_value(value)
    dims = _ints(shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in shape {dims}")
    return np.full(dims, v[0], dtype=v.dtype)


def _expand_shape(in_shape, target):
    try:
        return tuple(np.broadcast_shapes(tuple(in_shape), tuple(_ints(target))))
    except ValueError:
        raise ValueError(f"shape {list(in_shape)} cannot expand to {_ints(target)}") from None


@register("Expand", Kind.INJECTIVE, param_inputs=(1,),
          infer=lambda x, s: (_expand_shape(x.shape, _known(s, "shape")), x.dtype))
def expand(x, shape):
    return np.array(np.broadcast_to(x, _expand_shape(x.shape, shape)))


def _tile_shape(in_shape, repeats):
    reps = _ints(repeats)
    if len(reps) != len(in_shape) or any(r < 0 for r in reps):
        raise ValueError(f"repeats {reps} do not fit an input of rank {len(in_shape)}")
    return tuple(d * r for d, r in zip(in_shape, reps))


@register("Tile", Kind.INJECTIVE, param_inputs=(1,),
          infer=lambda x, r: (_tile_shape(x.shape, _known(r, "repeats")), x.dtype))
def tile(x, repeats):
    _tile_shape(x.shape, repeats)
    return np.tile(x, _ints(repeats))


def _range_params(start, limit, delta):
    s, lim, d = (np.asarray(v).reshape(-1)[0].item() for v in (start, limit, delta))
    if d == 0:
        raise ValueError("Range delta is 0")
    return s, d, max(math.ceil((lim - s) / d), 0)


def _range_values(start, limit, delta, stash_type=1):
    """start + i * delta; float16 computes in the stash type (float32 unless DOUBLE is asked)."""
    dtype = np.asarray(start).dtype
    s, d, n = _range_params(start, limit, delta)
    work = np.int64 if dtype.kind in "iu" else \
        np.float64 if dtype.itemsize > 2 or stash_type == 11 else np.float32
    return (np.asarray(s, work) + np.arange(n, dtype=work) * np.asarray(d, work)).astype(dtype)


def _range_infer(start, limit, delta, stash_type=1):
    n = _range_params(_known(start, "start"), _known(limit, "limit"), _known(delta, "delta"))[2]
    return (n,), start.dtype


@register("Range", Kind.OPAQUE, infer=_range_infer, param_inputs=(0, 1, 2))
def range_(start, limit, delta, *, stash_type=1):
    return _range_values(start, limit, delta, stash_type)


# ---- casts and identities -----------------------------------------------------------------------

SUPPORTED_CAST = {np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                        np.uint16, np.uint32, np.uint64, np.float16, np.float32,
                                        np.float64)}


def onnx_dtype(to: int) -> np.dtype:
    """numpy dtype of an ONNX TensorProto element type, if modelc computes in it."""
    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(int(to)))
    except Exception:
        dt = None
    if dt not in SUPPORTED_CAST:
        raise ValueError(f"element type {to} is not supported")
    return dt


def _cast(x, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu" and x.dtype.kind == "f":
        with np.errstate(invalid="ignore"):     # NaN/inf to int is undefined in ONNX, as in C
            return x.astype(dtype)
    return x.astype(dtype)


@register("Cast", Kind.ELEMWISE, infer=lambda x, to, **a: (x.shape, onnx_dtype(to)))
def cast(x, *, to, saturate=1, round_mode="up"):
    return _cast(x, onnx_dtype(to))


@register("CastLike", Kind.ELEMWISE, infer=lambda x, t, **a: (x.shape, t.dtype))
def cast_like(x, target, *, saturate=1, round_mode="up"):
    return _cast(x, target.dtype)


@register("Identity", Kind.ELEMWISE, infer=_same)
def identity(x):
    return x


def _dropout_infer(x, ratio=None, training_mode=None, seed=None):
    return [(x.shape, x.dtype), (x.shape, np.dtype(bool))]


@register("Dropout", Kind.ELEMWISE, infer=_dropout_infer)
def dropout(x, ratio=None, training_mode=None, *, seed=None):
    """Inference semantics. Training with a nonzero ratio is random; the converter rejects it."""
    if training_mode is not None and bool(training_mode) and \
            (ratio is None or float(np.asarray(ratio)) != 0.0):
        raise UnsupportedOpError({"Dropout(training_mode=1)": ["(at run time)"]})
    return x, np.ones(x.shape, dtype=bool)


# ---- gathers and scatters -----------------------------------------------------------------------

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
    a = _axis(axis, len(x.shape))
    _check_indices(idx, x.shape[a])
    if x.shape[a] == 0 and math.prod(idx.shape) > 0:
        raise ValueError(f"gathers {math.prod(idx.shape)} indices from axis {a} of size 0")
    return x.shape[:a] + idx.shape + x.shape[a + 1:], x.dtype


@register("Gather", Kind.INJECTIVE, infer=_gather_infer)
def gather(x, indices, *, axis=0):
    a = _axis(axis, x.ndim)
    return np.take(x, _wrap(indices, x.shape[a]), axis=a)


def _gather_elements_infer(x, idx, axis=0):
    a = _axis(axis, len(x.shape))
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
    a = _axis(axis, x.ndim)
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
    a = _axis(axis, len(x.shape))
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
    a = _axis(axis, x.ndim)
    key = list(np.indices(indices.shape, sparse=True))
    key[a] = _wrap(indices, x.shape[a])
    return _scatter(x.copy(), tuple(key), updates, reduction)


@register("ScatterND", Kind.OPAQUE, infer=_scatter_nd_infer)
def scatter_nd(x, indices, updates, *, reduction="none"):
    k = indices.shape[-1]
    idx = indices.reshape(-1, k)
    key = tuple(_wrap(idx[:, j], x.shape[j]) for j in range(k))
    return _scatter(x.copy(), key, updates.reshape((-1,) + x.shape[k:]), reduction)


def _onehot_infer(idx, depth, values, axis=-1):
    d = int(np.asarray(_known(depth, "depth")).reshape(-1)[0])
    r = len(idx.shape) + 1
    a = _axis(axis, r)
    return idx.shape[:a] + (d,) + idx.shape[a:], values.dtype


@register("OneHot", Kind.INJECTIVE, infer=_onehot_infer, param_inputs=(1,))
def one_hot(indices, depth, values, *, axis=-1):
    d = int(np.asarray(depth).reshape(-1)[0])
    a = _axis(axis, indices.ndim + 1)
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + d, idx)
    hot = np.expand_dims(idx, a) == np.arange(d).reshape((d,) + (1,) * (indices.ndim - a))
    off, on = values.reshape(-1)[:2]
    return np.where(hot, on, off).astype(values.dtype)


def _topk_infer(x, k, axis=-1, largest=1, sorted=1):
    a = _axis(axis, len(x.shape))
    kk = int(np.asarray(_known(k, "K")).reshape(-1)[0])
    if not 0 <= kk <= x.shape[a]:
        raise ValueError(f"K={kk} is out of range for a dimension of {x.shape[a]}")
    shape = x.shape[:a] + (kk,) + x.shape[a + 1:]
    return [(shape, x.dtype), (shape, np.dtype(np.int64))]


@register("TopK", Kind.OPAQUE, infer=_topk_infer, param_inputs=(1,))
def topk(x, k, *, axis=-1, largest=1, sorted=1):
    """Ties keep the lower index first, as ONNX requires, for largest and smallest alike."""
    a = _axis(axis, x.ndim)
    kk = int(np.asarray(k).reshape(-1)[0])
    n = x.shape[a]
    if largest:   # stable ascending sort of the reversed axis, read backwards
        order = np.flip(n - 1 - np.argsort(np.flip(x, a), axis=a, kind="stable"), a)
    else:
        order = np.argsort(x, axis=a, kind="stable")
    idx = np.take(order, np.arange(kk), axis=a)
    return np.take_along_axis(x, idx, axis=a), idx.astype(np.int64)


@register("Trilu", Kind.INJECTIVE, infer=_same)
def trilu(x, k=None, *, upper=1):
    kk = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    return np.triu(x, kk) if upper else np.tril(x, kk)


def _eyelike_dtype(x, dtype):
    return x.dtype if dtype is None else onnx_dtype(dtype)


@register("EyeLike", Kind.INJECTIVE,
          infer=lambda x, dtype=None, k=0: (x.shape, _eyelike_dtype(x, dtype)))
def eye_like(x, *, dtype=None, k=0):
    if x.ndim != 2:
        raise ValueError(f"EyeLike needs a 2-D input, got shape {list(x.shape)}")
    return np.eye(x.shape[0], x.shape[1], int(k), dtype=_eyelike_dtype(x, dtype))


# ---- padding and blocks -------------------------------------------------------------------------

def _pad_widths(shape, pads, axes=None):
    r = len(shape)
    axes = list(range(r)) if _opt(axes) is None else _axes(_ints(axes), r)
    p = _ints(pads)
    if len(p) != 2 * len(axes):
        raise ValueError(f"pads {p} must have 2 x {len(axes)} entries")
    widths = [(0, 0)] * r
    for i, a in enumerate(axes):
        widths[a] = (p[i], p[len(axes) + i])
    out = tuple(d + b + e for d, (b, e) in zip(shape, widths))
    if any(d < 0 for d in out):
        raise ValueError(f"pads {p} crop more than the input shape {list(shape)} holds")
    return widths, out


PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_infer(x, pads, value=None, axes=None, mode="constant"):
    _one_d(pads=pads, axes=axes)
    if mode not in PAD_MODES:
        raise ValueError(f"mode {mode!r} is not one of {list(PAD_MODES)}")
    return _pad_widths(x.shape, _known(pads, "pads"), _known(axes, "axes"))[1], x.dtype


@register("Pad", Kind.INJECTIVE, infer=_pad_infer, param_inputs=(1, 3))
def pad(x, pads, constant_value=None, axes=None, *, mode="constant"):
    """Negative pads crop first; numpy pads the rest (its modes share ONNX's names)."""
    widths, _ = _pad_widths(x.shape, pads, axes)
    crop = tuple(slice(max(-b, 0), d - max(-e, 0)) for d, (b, e) in zip(x.shape, widths))
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in widths]
    if mode == "constant":
        v = 0 if constant_value is None or np.asarray(constant_value).size == 0 else \
            np.asarray(constant_value).reshape(-1)[0]
        return np.pad(x, widths, mode="constant", constant_values=v).astype(x.dtype, copy=False)
    if mode not in ("reflect", "edge", "wrap"):
        raise ValueError(f"unknown Pad mode {mode!r}")
    return np.pad(x, widths, mode=mode)


def _blocks(shape, b, to_space):
    if len(shape) != 4:
        raise ValueError(f"needs a 4-D input, got {list(shape)}")
    n, c, h, w = shape
    if to_space:
        if c % (b * b):
            raise ValueError(f"channels {c} are not a multiple of blocksize^2 = {b * b}")
        return n, c // (b * b), h * b, w * b
    if h % b or w % b:
        raise ValueError(f"height {h} and width {w} are not multiples of blocksize {b}")
    return n, c * b * b, h // b, w // b


@register("DepthToSpace", Kind.INJECTIVE,
          infer=lambda x, blocksize, mode="DCR": (_blocks(x.shape, blocksize, True), x.dtype))
def depth_to_space(x, *, blocksize, mode="DCR"):
    b = blocksize
    n, c, h, w = x.shape
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(_blocks(x.shape, b, True))


@register("SpaceToDepth", Kind.INJECTIVE,
          infer=lambda x, blocksize, mode="DCR": (_blocks(x.shape, blocksize, False), x.dtype))
def space_to_depth(x, *, blocksize, mode="DCR"):
    b = blocksize
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.transpose(0, 1, 3, 5, 2, 4)
    return y.reshape(_blocks(x.shape, b, False))


# ---- Resize -------------------------------------------------------------------------------------
# Separable: each resized axis maps output index y to a source coordinate x (by the coordinate
# transformation mode), then to a few input taps with weights (by the interpolation mode). This
# follows ONNX's reference implementation, whose results the conformance cases hold.

RESIZE_MODES = ("nearest", "linear", "cubic")
RESIZE_CTMS = ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric", "align_corners", "asymmetric",
               "tf_half_pixel_for_nn", "tf_crop_and_resize")
RESIZE_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize_plan(shape, roi, scales, sizes, axes, policy):
    """[(axis, scale, out_size, (roi_start, roi_end) or None)] for each axis that is resized."""
    r = len(shape)
    axes = list(range(r)) if axes is None else _axes(axes, r)
    roi, scales, sizes = _opt(roi), _opt(scales), _opt(sizes)
    if sizes is not None:
        sz = _ints(sizes)
        if len(sz) != len(axes):
            raise ValueError(f"sizes {sz} must have one entry per resized axis ({len(axes)})")
        sc = [s / shape[a] for s, a in zip(sz, axes)]
        if policy in ("not_larger", "not_smaller"):
            s = min(sc) if policy == "not_larger" else max(sc)
            sc = [s] * len(axes)
            sz = [int(s * shape[a] + 0.5) for a in axes]
        elif policy != "stretch":
            raise ValueError(f"unknown keep_aspect_ratio_policy {policy!r}")
    elif scales is not None:
        sc32 = np.asarray(scales, dtype=np.float32).reshape(-1)
        if len(sc32) != len(axes) or not (np.isfinite(sc32) & (sc32 > 0)).all():
            raise ValueError(f"scales {sc32.tolist()} must be finite and positive, one per resized axis")
        # float32 product, as ONNX shape inference and onnxruntime compute it
        sz = [int(np.floor(s * np.float32(shape[a]))) for s, a in zip(sc32, axes)]
        sc = [float(s) for s in sc32]
    else:
        raise ValueError("Resize needs scales or sizes")
    rois = [None] * len(axes)
    if roi is not None:
        rv = np.asarray(roi, dtype=np.float64).reshape(-1)
        if len(rv) != 2 * len(axes):
            raise ValueError(f"roi must have 2 x {len(axes)} entries, has {len(rv)}")
        rois = [(rv[i], rv[len(axes) + i]) for i in range(len(axes))]
    return list(zip(axes, sc, sz, rois))


def _resize_infer(x, roi=None, scales=None, sizes=None, *, axes=None,
                  keep_aspect_ratio_policy="stretch", mode="nearest", **attrs):
    if mode not in RESIZE_MODES:
        raise ValueError(f"unknown Resize mode {mode!r}")
    for name, value, allowed in (("coordinate_transformation_mode",
                                  attrs.get("coordinate_transformation_mode", "half_pixel"), RESIZE_CTMS),
                                 ("nearest_mode", attrs.get("nearest_mode", "round_prefer_floor"),
                                  RESIZE_NEAREST)):
        if value not in allowed:       # checked at import: the kernel template reads them too
            raise ValueError(f"{name} {value!r} is not one of {list(allowed)}")
    plan = _resize_plan(x.shape, None, _known(scales, "scales"), _known(sizes, "sizes"), axes,
                        keep_aspect_ratio_policy)   # roi never changes the output shape
    shape = list(x.shape)
    for a, _, n, _ in plan:
        shape[a] = n
    return tuple(shape), x.dtype


def _source_coords(ctm, y, scale, n_in, n_out, roi):
    """Source coordinate of each output index; and which ones fall outside (tf_crop_and_resize)."""
    width = scale * n_in              # the reference uses the unrounded output length
    outside = None
    if ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "pytorch_half_pixel":
        x = (y + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(y)
    elif ctm == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        x = offset + (y + 0.5) / scale - 0.5
    elif ctm == "align_corners":
        x = np.zeros_like(y) if width == 1 else y * (n_in - 1) / (width - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_half_pixel_for_nn":        # Resize-11 only
        x = (y + 0.5) / scale
    elif ctm == "tf_crop_and_resize":
        r0, r1 = roi if roi is not None else (0.0, 1.0)
        x = (np.full_like(y, (r1 - r0) * (n_in - 1) / 2) if width == 1
             else y * (r1 - r0) * (n_in - 1) / (width - 1))
        x = x + r0 * (n_in - 1)
        outside = (x < 0) | (x > n_in - 1)
    else:
        raise ValueError(f"unknown coordinate_transformation_mode {ctm!r}")
    return x, outside


def _cubic_weights(t, a):
    t = np.abs(t)
    return np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                    np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))


def _taps(x, n_in, scale, mode, nearest_mode, cubic_a, antialias, exclude_outside):
    """Input indices (out, taps) and weights (out, taps) for source coordinates x."""
    fl = np.floor(x)
    is_int = x == fl
    ratio = np.where(is_int, 1.0, x - fl)           # in (0, 1]: prefer the pixel left of x
    base = np.where(is_int, x - 1, fl).astype(np.int64)
    if mode == "nearest":
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
              "floor": np.zeros_like(is_int), "ceil": np.ones_like(is_int)}.get(nearest_mode)
        if up is None:
            raise ValueError(f"unknown nearest_mode {nearest_mode!r}")
        idx = (base + (up | is_int))[:, None]
        return np.clip(idx, 0, n_in - 1), None
    s = min(scale, 1.0) if antialias else 1.0
    reach = 1 if mode == "linear" else 2
    start = int(np.floor(-reach / s) + 1)
    offs = np.arange(start, 2 - start)
    t = (offs[None, :] - ratio[:, None]) * s
    w = np.clip(1 - np.abs(t), 0, 1) if mode == "linear" else _cubic_weights(t, cubic_a)
    if antialias:
        w = w / w.sum(axis=1, keepdims=True)
    idx = base[:, None] + offs[None, :]
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, n_in - 1), w


def _resize_axis(data, axis, scale, n_out, roi, attrs):
    n_in = data.shape[axis]
    y = np.arange(n_out, dtype=np.float64)
    x, outside = _source_coords(attrs["coordinate_transformation_mode"], y, scale, n_in, n_out, roi)
    idx, w = _taps(x, n_in, scale, attrs["mode"], attrs["nearest_mode"], attrs["cubic_coeff_a"],
                   attrs["antialias"], attrs["exclude_outside"])
    if w is None:
        out = np.take(data, idx[:, 0], axis=axis)
    else:
        taps = np.take(data, idx, axis=axis)          # (..., n_out, taps, ...)
        w = w.reshape((1,) * axis + w.shape + (1,) * (data.ndim - axis - 1))
        out = (taps * w).sum(axis=axis + 1)
    if outside is not None and outside.any():
        mask = outside.reshape((1,) * axis + (n_out,) + (1,) * (data.ndim - axis - 1))
        out = np.where(mask, np.asarray(attrs["extrapolation_value"]).astype(out.dtype), out)
    return out


# roi (input 1) does not decide the shape, but a constant one is a kernel parameter (the
# injective template computes tf_crop_and_resize's taps from it at code generation)
@register("Resize", Kind.INJECTIVE, infer=_resize_infer, param_inputs=(1, 2, 3))
def resize(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
           coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
           extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
           nearest_mode="round_prefer_floor"):
    if mode not in RESIZE_MODES:
        raise ValueError(f"unknown Resize mode {mode!r}")
    attrs = dict(coordinate_transformation_mode=coordinate_transformation_mode, mode=mode,
                 nearest_mode=nearest_mode, cubic_coeff_a=cubic_coeff_a, antialias=antialias,
                 exclude_outside=exclude_outside, extrapolation_value=extrapolation_value)
    out = x if mode == "nearest" else x.astype(np.float64)
    if coordinate_transformation_mode != "tf_crop_and_resize":
        roi = None          # only tf_crop_and_resize reads it; models pass anything otherwise
    for axis, scale, n_out, r in _resize_plan(x.shape, roi, scales, sizes, axes,
                                              keep_aspect_ratio_policy):
        trivial_roi = r is None or (math.isclose(r[0], 0.0) and math.isclose(r[1], 1.0))
        if math.isclose(scale, 1.0) and n_out == x.shape[axis] and trivial_roi:
            continue        # the identity along this axis, as in the reference
        out = _resize_axis(out, axis, scale, n_out, r, attrs)
    if x.dtype.kind in "iu" and out.dtype.kind == "f":
        info = np.iinfo(x.dtype)
        out = np.clip(np.round(out), info.min, info.max)
    return out.astype(x.dtype, copy=False)
