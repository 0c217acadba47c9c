"""Normalisations: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, LRN, LpNormalization.

The references compute statistics in float64 (LayerNormalization, and BatchNormalization's folded
scale and shift once applied, in float32, or float64 for float64 inputs) and cast the result back
to the input dtype.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .params import checked_axis, compute_dtype, same_shape
from .registry import Kind, register
from .window import check_spatial_rank


def _channel_params(x, *params):
    """Per-channel parameters reshaped to broadcast against (N, C, spatial...)."""
    shape = (-1,) + (1,) * (x.ndim - 2)
    return [p.astype(np.float64).reshape(shape) for p in params]


def _batchnorm_infer(x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9, training_mode=0):
    if training_mode:
        raise ValueError("training_mode=1 is not supported (inference only)")
    if len(x.shape) < 2:
        raise ValueError(f"input must have rank >= 2, got {list(x.shape)}")
    c = x.shape[1]
    for name, t in (("scale", scale), ("B", b), ("mean", mean), ("var", var)):
        if tuple(t.shape) != (c,):
            raise ValueError(f"{name} has shape {list(t.shape)}, expected [{c}]")
    return x.shape, x.dtype


@register("BatchNormalization", Kind.BROADCAST, infer=_batchnorm_infer)
def batch_normalization(x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9, training_mode=0):
    s, bb, m, v = _channel_params(x, scale, b, mean, var)
    k = s / np.sqrt(v + epsilon)
    ct = compute_dtype(x.dtype)
    return (x.astype(ct) * k.astype(ct) + (bb - m * k).astype(ct)).astype(x.dtype)


def _instnorm_infer(x, scale, b, *, epsilon=1e-5):
    check_spatial_rank(x, "InstanceNormalization")
    c = x.shape[1]
    if tuple(scale.shape) != (c,) or tuple(b.shape) != (c,):
        raise ValueError(f"scale {list(scale.shape)} and B {list(b.shape)} must be [{c}]")
    return x.shape, x.dtype


@register("InstanceNormalization", Kind.OPAQUE, infer=_instnorm_infer)
def instance_normalization(x, scale, b, *, epsilon=1e-5):
    axes = tuple(range(2, x.ndim))
    v = x.astype(np.float64)
    mean = v.mean(axis=axes, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=axes, keepdims=True)
    s, bb = _channel_params(x, scale, b)
    return ((v - mean) / np.sqrt(var + epsilon) * s + bb).astype(x.dtype)


def _layernorm_infer(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    a = checked_axis(axis, len(x.shape))
    norm = tuple(x.shape[a:])
    for name, t in (("scale", scale), ("B", b)):
        if t is not None and (len(t.shape) > len(norm) or any(
                d not in (1, n) for d, n in zip(t.shape[::-1], norm[::-1]))):
            raise ValueError(f"{name} {list(t.shape)} does not broadcast to the normalized shape "
                             f"{list(norm)} (axis {axis})")
    stat = (*x.shape[:a], *(1,) * (len(x.shape) - a))
    return [(x.shape, x.dtype), (stat, np.float32), (stat, np.float32)]


@register("LayerNormalization", Kind.OPAQUE, infer=_layernorm_infer)
def layer_normalization(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    a = checked_axis(axis, x.ndim)
    axes = tuple(range(a, x.ndim))
    ct = compute_dtype(x.dtype)
    v = x.astype(ct)
    mean = v.mean(axis=axes, keepdims=True)
    d = v - mean
    inv = 1 / np.sqrt((d * d).mean(axis=axes, keepdims=True) + ct(epsilon))
    y = d * inv * scale.astype(ct)
    if b is not None:
        y = y + b.astype(ct)
    return y.astype(x.dtype), mean.astype(np.float32), inv.astype(np.float32)


def _groupnorm_infer(x, scale, b, *, epsilon=1e-5, num_groups, stash_type=1):
    if len(x.shape) < 2:
        raise ValueError(f"input must have rank >= 2, got {list(x.shape)}")
    c = x.shape[1]
    if num_groups < 1 or c % num_groups:
        raise ValueError(f"{c} channels do not split into num_groups={num_groups}")
    if tuple(scale.shape) != (c,) or tuple(b.shape) != (c,):
        raise ValueError(f"scale {list(scale.shape)} and bias {list(b.shape)} must be [{c}]")
    return x.shape, x.dtype


@register("GroupNormalization", Kind.OPAQUE, infer=_groupnorm_infer)
def group_normalization(x, scale, b, *, epsilon=1e-5, num_groups, stash_type=1):
    n, c = x.shape[:2]
    v = x.astype(np.float64).reshape(n, num_groups, -1)
    mean = v.mean(axis=-1, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=-1, keepdims=True)
    y = ((v - mean) / np.sqrt(var + epsilon)).reshape(x.shape)
    s, bb = _channel_params(x, scale, b)
    return (y * s + bb).astype(x.dtype)


@register("LRN", Kind.OPAQUE, infer=same_shape)
def lrn(x, *, size, alpha=1e-4, beta=0.75, bias=1.0):
    sq = x.astype(np.float64) ** 2
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    widths = [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2)
    sums = sliding_window_view(np.pad(sq, widths), size, axis=1).sum(axis=-1)
    return (x / (bias + alpha / size * sums) ** beta).astype(x.dtype)


@register("LpNormalization", Kind.OPAQUE, infer=same_shape)
def lp_normalization(x, *, axis=-1, p=2):
    a = checked_axis(axis, x.ndim)
    v = x.astype(np.float64)
    if p == 1:
        norm = np.abs(v).sum(axis=a, keepdims=True)
    elif p == 2:
        norm = np.sqrt((v * v).sum(axis=a, keepdims=True))
    else:
        raise ValueError(f"p={p} must be 1 or 2")
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(norm == 0, 0, v / norm)
    return y.astype(x.dtype)
