"""Reading an op's parameters: inputs that decide the output shape, axes, and the working dtype.

Shape rules and references share these, so that the shape the importer declares and the array the
reference returns cannot disagree. Inputs that decide the output shape (Reshape's shape, Slice's
starts, Resize's sizes ...) must be known at import: a constant, or a value computed from shapes
(Shape -> Gather -> Concat chains resolve as they are imported, because Shape's rule returns its
value). Errors are ValueErrors, so that the registry's message names the node.
"""
from __future__ import annotations

import numpy as np

from ..errors import DynamicError, ShapeError
from .registry import norm_axis


class NotConstant(DynamicError):
    """An input that decides the output shape is not known at import time."""


def known(t, what: str):
    """The value of input tensor `t` (None if omitted); raises if the model computes it at run time."""
    if t is None:
        return None
    if t.value is None:
        raise NotConstant(f"input {t.name!r} ({what}) decides the output shape and must be a "
                          "constant (or computable from shapes), but it depends on the model's inputs")
    return t.value


def int_list(a) -> list[int]:
    """A parameter input (any shape) as a flat list of Python ints."""
    return [int(v) for v in np.asarray(a).reshape(-1)]


def optional(a):
    """Optional parameter inputs: omitted or empty (ONNX's '' or a 0-element tensor) mean absent."""
    return None if a is None or np.asarray(a).size == 0 else a


def one_d(**params):
    """Parameter inputs the ONNX spec declares 1-D (Slice's starts, Pad's pads ...) must be 1-D."""
    for what, t in params.items():
        if t is not None and len(t.shape) != 1:
            raise ValueError(f"{what} must be a 1-D tensor, got shape {list(t.shape)}")


def axis_index(axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in [0, rank); negative counts from the end. A scalar has no axis."""
    a = int(axis)
    if not -rank <= a < rank:
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def axis_indices(axes, rank: int) -> list[int]:
    """Several axes, each once."""
    out = [axis_index(a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise ValueError(f"axes {list(axes)} repeat an axis")
    return out


def checked_axis(axis, rank: int) -> int:
    """registry.norm_axis (which lets a scalar have axis 0, unlike `axis_index`), raising
    ValueError so that the registry's message names the node."""
    try:
        return norm_axis(axis, rank)
    except ShapeError as e:
        raise ValueError(str(e)) from None


def compute_dtype(dtype):
    """The dtype a reference computes in: float64 for float64 inputs, float32 otherwise."""
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def same_shape(x, *rest, **attrs):
    """The shape rule of an op whose output is shaped and typed like its first input."""
    return x.shape, x.dtype
