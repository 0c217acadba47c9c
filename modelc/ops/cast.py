"""Casts and identities: Cast, CastLike, Identity, and Dropout (which is one at inference).

`onnx_dtype` is the one place that says which ONNX element types modelc computes in; the frontend
checks Cast's `to` with it too.
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from ..errors import UnsupportedOpError
from .params import same_shape
from .registry import Kind, register


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


@register("Identity", Kind.ELEMWISE, infer=same_shape)
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
