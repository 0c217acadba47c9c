"""Resize in the injective template: the reference's own tap rules (ops/resize.py), evaluated at
code generation into tables of input indices and weights per output coordinate, and the weighted
sum of taps a kernel computes from them. Separable: each resized axis has its own tables.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelcError
from ..ops.resize import interpolation_taps, resize_plan, source_coords
from .expr import ctor, lit

MAX_RESIZE_TERMS = 64         # taps per output element (cubic 2-d: 16); antialiased shrinks go beyond


def resize_taps(op, in_shape, params) -> list | None:
    """[(axis, indices (n_out, taps), weights (n_out, taps) or None)] per resized axis, computed
    at code generation by the reference's own tap rules; None if no kernel should take it."""
    at = op.attrs
    mode = at.get("mode", "nearest")
    ctm = at.get("coordinate_transformation_mode", "half_pixel")
    if mode not in ("nearest", "linear", "cubic"):
        return None
    a = op.args
    scales = params.get(a[2]) if len(a) > 2 and a[2] else None
    sizes = params.get(a[3]) if len(a) > 3 and a[3] else None
    if (len(a) > 2 and a[2] and scales is None) or (len(a) > 3 and a[3] and sizes is None):
        return None
    roi = None
    if ctm == "tf_crop_and_resize":    # only it reads the roi: a constant one is a parameter
        roi = params.get(a[1]) if len(a) > 1 and a[1] else None
        if len(a) > 1 and a[1] and roi is None:
            return None
    out, terms = [], 1
    for axis, scale, n_out, r in resize_plan(in_shape, roi, scales, sizes, at.get("axes"),
                                              at.get("keep_aspect_ratio_policy", "stretch")):
        n_in = in_shape[axis]
        trivial_roi = r is None or (math.isclose(r[0], 0.0) and math.isclose(r[1], 1.0))
        if math.isclose(scale, 1.0) and n_out == n_in and trivial_roi:
            continue                       # the identity along this axis, as in the reference
        x, outside = source_coords(ctm, np.arange(n_out, dtype=np.float64), scale, n_in, n_out, r)
        idx, w = interpolation_taps(x, n_in, scale, mode, at.get("nearest_mode", "round_prefer_floor"),
                                    at.get("cubic_coeff_a", -0.75), at.get("antialias", 0),
                                    at.get("exclude_outside", 0))
        terms *= idx.shape[1]
        out.append((axis, idx, w, outside if outside is not None and outside.any() else None))
    return out if terms <= MAX_RESIZE_TERMS else None


def resize_value(gen, op, x, in_shape, idx, dtype, lines, ind, memo) -> str:
    """The expression of Resize's output at `idx` for the index map `gen` (index_map.py): per
    resized axis, input taps and weights come from tables (`gen.tables`) indexed by the output
    coordinate; the value is the weighted sum over every combination of taps."""
    plan = resize_taps(op, in_shape, gen.wl.params)
    if plan is None:
        raise ModelcError("this Resize has no injective kernel")
    combos = [([], "")]
    outside = []                  # tf_crop_and_resize: outputs whose source lies outside
    for axis, tap_idx, w, out_mask in plan:
        if out_mask is not None:
            tm = f"rz{op.index}_{axis}_o"
            gen.tables[tm] = out_mask.astype(np.uint8)
            outside.append(f"{tm}[np.uintp({idx[axis]})]")
        ntaps = tap_idx.shape[1]
        ti = f"rz{op.index}_{axis}_i"
        gen.tables[ti] = tap_idx.astype(np.int64).reshape(-1)
        if w is not None:
            tw = f"rz{op.index}_{axis}_w"
            gen.tables[tw] = w.astype(dtype if dtype.kind == "f" else np.float64).reshape(-1)
        grown = []
        for subs, weight in combos:
            for t in range(ntaps):
                pos = f"np.uintp(({idx[axis]}) * {ntaps} + {t})"
                wt = weight if w is None else (f"{weight} * {tw}[{pos}]" if weight else f"{tw}[{pos}]")
                grown.append((subs + [(axis, f"{ti}[{pos}]")], wt))
        combos = grown
    name = gen.fresh()
    body, bind = lines, ind
    if outside:                   # the extrapolation value there, as the reference's mask
        lines.append(f"{ind}{name} = {lit(op.attrs.get('extrapolation_value', 0.0), dtype)}")
        lines.append(f"{ind}if {' == 0 and '.join(outside)} == 0:")
        body, bind, memo = [], ind + "    ", {}
    terms = []
    for subs, weight in combos:
        sub = list(idx)
        for axis, e in subs:
            sub[axis] = e
        v = gen.value(x, sub, body, bind, memo)
        if weight and dtype.kind != "f":
            v = f"np.float64({v})"
        terms.append(f"{weight} * {v}" if weight else v)
    if outside:
        lines.extend(body)
    total = " + ".join(terms)
    if dtype.kind != "f" and combos[0][1]:
        # integers interpolate in float64, then round half to even and saturate, as the reference
        info = np.iinfo(dtype)
        total = f"{ctor(dtype)}(min(max(np.rint({total}), {float(info.min)!r}), {float(info.max)!r}))"
    lines.append(f"{bind}{name} = {total}")
    return name
