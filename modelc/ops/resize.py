"""Resize, and the coordinate geometry the injective kernel template shares with it.

Resize is separable: for each resized axis, `resize_plan` gives the scale and output size,
`source_coords` maps output indices to source coordinates (the coordinate transformation mode), and
`interpolation_taps` turns those into input indices and weights (the interpolation mode). The
reference applies the taps with numpy; the kernel template bakes the same taps into generated code,
so both compute the same thing by construction.
"""
from __future__ import annotations

import math

import numpy as np

from .params import axis_indices, int_list, known, optional
from .registry import Kind, register


RESIZE_MODES = ("nearest", "linear", "cubic")
RESIZE_CTMS = ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric", "align_corners", "asymmetric",
               "tf_half_pixel_for_nn", "tf_crop_and_resize")
RESIZE_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def resize_plan(shape, roi, scales, sizes, axes, policy):
    """[(axis, scale, out_size, (roi_start, roi_end) or None)] for each axis that is resized."""
    r = len(shape)
    axes = list(range(r)) if axes is None else axis_indices(axes, r)
    roi, scales, sizes = optional(roi), optional(scales), optional(sizes)
    if sizes is not None:
        sz = int_list(sizes)
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
    plan = resize_plan(x.shape, None, known(scales, "scales"), known(sizes, "sizes"), axes,
                       keep_aspect_ratio_policy)   # roi never changes the output shape
    shape = list(x.shape)
    for a, _, n, _ in plan:
        shape[a] = n
    return tuple(shape), x.dtype


def source_coords(ctm, y, scale, n_in, n_out, roi):
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


def interpolation_taps(x, n_in, scale, mode, nearest_mode, cubic_a, antialias, exclude_outside):
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
    x, outside = source_coords(attrs["coordinate_transformation_mode"], y, scale, n_in, n_out, roi)
    idx, w = interpolation_taps(x, n_in, scale, attrs["mode"], attrs["nearest_mode"], attrs["cubic_coeff_a"],
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
    for axis, scale, n_out, r in resize_plan(x.shape, roi, scales, sizes, axes,
                                             keep_aspect_ratio_policy):
        trivial_roi = r is None or (math.isclose(r[0], 0.0) and math.isclose(r[1], 1.0))
        if math.isclose(scale, 1.0) and n_out == x.shape[axis] and trivial_roi:
            continue        # the identity along this axis, as in the reference
        out = _resize_axis(out, axis, scale, n_out, r, attrs)
    if x.dtype.kind in "iu" and out.dtype.kind == "f":
        info = np.iinfo(x.dtype)
        out = np.clip(np.round(out), info.min, info.max)
    return out.astype(x.dtype, copy=False)
