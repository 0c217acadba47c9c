"""Pad: constant, reflect, edge and wrap padding; negative pads crop."""
from __future__ import annotations

import numpy as np

from .params import axis_indices, int_list, known, one_d, optional
from .registry import Kind, register


PAD_MODES = ("constant", "reflect", "edge", "wrap")


def pad_widths(shape, pads, axes=None):
    r = len(shape)
    axes = list(range(r)) if optional(axes) is None else axis_indices(int_list(axes), r)
    p = int_list(pads)
    if len(p) != 2 * len(axes):
        raise ValueError(f"pads {p} must have 2 x {len(axes)} entries")
    widths = [(0, 0)] * r
    for i, a in enumerate(axes):
        widths[a] = (p[i], p[len(axes) + i])
    out = tuple(d + b + e for d, (b, e) in zip(shape, widths))
    if any(d < 0 for d in out):
        raise ValueError(f"pads {p} crop more than the input shape {list(shape)} holds")
    return widths, out


def _pad_infer(x, pads, value=None, axes=None, mode="constant"):
    one_d(pads=pads, axes=axes)
    if mode not in PAD_MODES:
        raise ValueError(f"mode {mode!r} is not one of {list(PAD_MODES)}")
    return pad_widths(x.shape, known(pads, "pads"), known(axes, "axes"))[1], x.dtype


@register("Pad", Kind.INJECTIVE, infer=_pad_infer, param_inputs=(1, 3))
def pad(x, pads, constant_value=None, axes=None, *, mode="constant"):
    """Negative pads crop first; numpy pads the rest (its modes share ONNX's names)."""
    widths, _ = pad_widths(x.shape, pads, axes)
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
