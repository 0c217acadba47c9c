"""The softmax family (opset 13: one axis): Softmax, LogSoftmax, Hardmax."""
from __future__ import annotations

import numpy as np

from .params import checked_axis, compute_dtype
from .registry import Kind, register


def _axis_infer(x, *, axis=-1):
    checked_axis(axis, len(x.shape))
    return x.shape, x.dtype


def _softmax_dtype(dtype):
    """float16 is computed op by op in float16, as ONNX's reference does (its expected outputs
    differ from a float32 computation by an ulp, beyond the conformance tolerance)."""
    return np.float16 if dtype == np.float16 else compute_dtype(dtype)


@register("Softmax", Kind.OPAQUE, infer=_axis_infer)
def softmax(x, *, axis=-1):
    v = x.astype(_softmax_dtype(x.dtype))
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


@register("LogSoftmax", Kind.OPAQUE, infer=_axis_infer)
def log_softmax(x, *, axis=-1):
    v = x.astype(_softmax_dtype(x.dtype))
    d = v - v.max(axis=axis, keepdims=True)
    return (d - np.log(np.exp(d).sum(axis=axis, keepdims=True))).astype(x.dtype)


@register("Hardmax", Kind.OPAQUE, infer=_axis_infer)
def hardmax(x, *, axis=-1):
    a = checked_axis(axis, x.ndim)
    first = np.expand_dims(np.argmax(x, axis=a), a)
    y = np.zeros_like(x)
    np.put_along_axis(y, first, 1, axis=a)
    return y
