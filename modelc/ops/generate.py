"""Ops whose output comes from shapes and parameters, not from the input's values: Shape, Size,
ConstantOfShape, Range, and the index masks EyeLike and Trilu.

Shape's rule returns its value, so that shape computations (Shape -> Gather -> Concat -> Reshape)
resolve while the model is imported.
"""
from __future__ import annotations

import math

import numpy as np

from .cast import onnx_dtype
from .params import int_list, known, same_shape
from .registry import Kind, register


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
          infer=lambda s, value=None: (tuple(int_list(known(s, "shape"))), _fill_value(value).dtype))
def constant_of_shape(shape, *, value=None):
    v = _fill_value(value)
    dims = int_list(shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in shape {dims}")
    return np.full(dims, v[0], dtype=v.dtype)


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
    n = _range_params(known(start, "start"), known(limit, "limit"), known(delta, "delta"))[2]
    return (n,), start.dtype


@register("Range", Kind.OPAQUE, infer=_range_infer, param_inputs=(0, 1, 2))
def range_(start, limit, delta, *, stash_type=1):
    return _range_values(start, limit, delta, stash_type)


def _eyelike_dtype(x, dtype):
    return x.dtype if dtype is None else onnx_dtype(dtype)


@register("EyeLike", Kind.INJECTIVE,
          infer=lambda x, dtype=None, k=0: (x.shape, _eyelike_dtype(x, dtype)))
def eye_like(x, *, dtype=None, k=0):
    if x.ndim != 2:
        raise ValueError(f"EyeLike needs a 2-D input, got shape {list(x.shape)}")
    return np.eye(x.shape[0], x.shape[1], int(k), dtype=_eyelike_dtype(x, dtype))


@register("Trilu", Kind.INJECTIVE, infer=same_shape)
def trilu(x, k=None, *, upper=1):
    kk = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    return np.triu(x, kk) if upper else np.tril(x, kk)
