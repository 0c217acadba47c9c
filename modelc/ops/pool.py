"""Pools: MaxPool (with indices), AveragePool, LpPool and their global forms.

Windows are strided views of the padded input reduced by numpy; ceil mode's overhang is padding
that no window counts.
"""
from __future__ import annotations

import itertools

import numpy as np

from .params import compute_dtype
from .registry import Kind, register
from .window import Geometry, check_spatial_rank, pad_for_windows, window_geometry, windows


def _pool_infer_shape(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    check_spatial_rank(x, "pool")
    if kernel_shape is None or len(kernel_shape) != len(x.shape) - 2:
        raise ValueError(f"kernel_shape {kernel_shape} must have one value per spatial axis of "
                         f"input {list(x.shape)}")
    return window_geometry(tuple(x.shape[2:]), kernel_shape, strides, dilations, pads, auto_pad,
                           ceil_mode)


def _lowest(dtype):
    dtype = np.dtype(dtype)
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _maxpool_infer(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                   pads=None, storage_order=0, strides=None):
    geo = _pool_infer_shape(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    shape = (*x.shape[:2], *geo.out)
    return [(shape, x.dtype), (shape, np.int64)]


@register("MaxPool", Kind.OUT_ELEMWISE_FUSABLE, infer=_maxpool_infer)
def max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
             storage_order=0, strides=None):
    geo = window_geometry(tuple(x.shape[2:]), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    nd = len(geo.out)
    win = windows(pad_for_windows(x, geo, _lowest(x.dtype)), geo)
    taps = list(itertools.product(*(range(k) for k in geo.kernel)))
    y = win[(Ellipsis, *taps[0])].copy()
    for tap in taps[1:]:
        np.maximum(y, win[(Ellipsis, *tap)], out=y)
    # the first tap (row-major) holding the max: walk the taps backwards, the last write wins
    best = np.zeros(y.shape, np.int16 if len(taps) < 2 ** 15 else np.int64)
    for t in range(len(taps) - 1, -1, -1):
        np.copyto(best, t, where=win[(Ellipsis, *taps[t])] == y)
    taps = np.unravel_index(best, geo.kernel)
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    index = np.zeros(best.shape, np.int64)
    order = range(nd) if storage_order == 0 else reversed(range(nd))
    for i in order:
        o = np.arange(geo.out[i]).reshape((-1,) + (1,) * (nd - 1 - i))
        coord = o * geo.strides[i] - geo.begin[i] + taps[i] * geo.dilations[i]
        index = index * spatial[i] + coord
    plane = int(np.prod(spatial))
    index = index + (np.arange(n * c, dtype=np.int64) * plane).reshape(n, c, *(1,) * nd)
    return y, index


def _avgpool_infer(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                   kernel_shape=None, pads=None, strides=None):
    geo = _pool_infer_shape(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    return (*x.shape[:2], *geo.out), x.dtype


def _window_counts(spatial, geo: Geometry, include_pad: bool):
    """How many elements each window averages: real pixels, or pixels plus pads (no overhang)."""
    if include_pad:
        mask = np.ones(tuple(n + b + e for n, b, e in zip(spatial, geo.begin, geo.end)))
        shifted = Geometry(geo.kernel, geo.strides, geo.dilations, (0,) * len(spatial),
                           (0,) * len(spatial), geo.out)
        return windows(pad_for_windows(mask, shifted, 0), shifted).sum(axis=tuple(range(-len(spatial), 0)))
    mask = np.ones(spatial)
    return windows(pad_for_windows(mask, geo, 0), geo).sum(axis=tuple(range(-len(spatial), 0)))


@register("AveragePool", Kind.OUT_ELEMWISE_FUSABLE, infer=_avgpool_infer)
def average_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    geo = window_geometry(tuple(x.shape[2:]), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    nd = len(geo.out)
    ct = compute_dtype(x.dtype)
    win = windows(pad_for_windows(x.astype(ct, copy=False), geo, 0), geo)
    total = win.sum(axis=tuple(range(-nd, 0)))
    counts = _window_counts(x.shape[2:], geo, bool(count_include_pad))
    return (total / counts.astype(ct)).astype(x.dtype)


def _lppool_infer(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2,
                  pads=None, strides=None):
    geo = _pool_infer_shape(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    return (*x.shape[:2], *geo.out), x.dtype


@register("LpPool", Kind.OUT_ELEMWISE_FUSABLE, infer=_lppool_infer)
def lp_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2,
            pads=None, strides=None):
    geo = window_geometry(tuple(x.shape[2:]), kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    nd = len(geo.out)
    win = windows(pad_for_windows(np.abs(x.astype(np.float64)), geo, 0), geo)
    y = (win ** p).sum(axis=tuple(range(-nd, 0))) ** (1.0 / p)
    return y.astype(x.dtype)


def _global_infer(x):
    check_spatial_rank(x, "global pool")
    return (*x.shape[:2], *(1,) * (len(x.shape) - 2)), x.dtype


@register("GlobalAveragePool", Kind.OUT_ELEMWISE_FUSABLE, infer=_global_infer)
def global_average_pool(x):
    axes = tuple(range(2, x.ndim))
    return x.mean(axis=axes, keepdims=True, dtype=np.float64).astype(x.dtype)


@register("GlobalMaxPool", Kind.OUT_ELEMWISE_FUSABLE, infer=_global_infer)
def global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


@register("GlobalLpPool", Kind.OUT_ELEMWISE_FUSABLE, infer=_global_infer)
def global_lp_pool(x, *, p=2):
    v = np.abs(x.astype(np.float64)) ** p
    return (v.sum(axis=tuple(range(2, x.ndim)), keepdims=True) ** (1.0 / p)).astype(x.dtype)
