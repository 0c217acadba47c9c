"""GridSample in the injective template: for each output element, the grid's coordinates are read
and turned into taps by the steps of ops/sample.py (source coordinate, out-of-range fix, taps,
padding of each tap's index), written as statements; the value is the weighted sum of the taps.

Every index read from the image is clamped into it, whatever the grid holds (NaN included): a
tap outside under zeros padding reads a clamped pixel and contributes 0, as the reference's does.
"""
from __future__ import annotations

import itertools

import numpy as np

from ..ops.sample import CUBIC_A, borders
from .expr import lit


def grid_sample_value(gen, op, idx, dtype, lines, ind, memo) -> str:
    """The expression of GridSample's output at `idx` = [n, c, *output position] for the index map
    `gen` (index_map.py)."""
    x, grid = op.args[:2]
    at = op.attrs
    align, mode, padding = at.get("align_corners", 0), at.get("mode", "linear"), at.get("padding_mode", "zeros")
    sizes = gen.shape(x)[2:]
    r = len(sizes)
    ct = np.dtype(np.float64 if dtype == np.float64 else np.float32)

    def c(v):
        return lit(v, ct)

    per_axis = []
    for i, size in enumerate(sizes):
        g = gen.value(grid, [idx[0]] + list(idx[2:]) + [str(r - 1 - i)], lines, ind, memo)
        s = gen.fresh()
        if align:
            lines.append(f"{ind}{s} = (np.{ct.name}({g}) + {c(1)}) * {c(0.5)} * {c(size - 1)}")
        else:
            lines.append(f"{ind}{s} = ((np.{ct.name}({g}) + {c(1)}) * {c(size)} - {c(1)}) * {c(0.5)}")
        if mode == "nearest":
            lines.append(f"{ind}{s} = np.rint({s})")
        lo, hi = borders(size, align)
        if padding == "border" and mode != "cubic":     # (ops/sample.source_coord says why)
            lines.append(f"{ind}if {s} < {c(lo)} or {s} > {c(hi)}:")
            lines.append(f"{ind}    {s} = min(max({s}, {c(0)}), {c(size - 1)})")
        elif padding == "reflection":
            _reflect(gen, s, lo, hi, c, lines, ind)
        per_axis.append([(_tap_index(gen, j, size, align, padding, c, lines, ind), w)
                         for j, w in _taps(gen, s, mode, c, lines, ind)])
    terms = []
    for combo in itertools.product(*per_axis):
        sub = list(idx[:2]) + [j for (j, _), _ in combo]
        v = gen.value(x, sub, lines, ind, memo)
        weights = [w for _, w in combo if w is not None]
        term = " * ".join(weights + [v])
        valid = [ok for (_, ok), _ in combo if ok is not None]
        terms.append(f"({term} if {' and '.join(valid)} else {c(0)})" if valid else term)
    name = gen.fresh()
    lines.append(f"{ind}{name} = {' + '.join(terms)}")
    return name


def _reflect(gen, s, lo, hi, c, lines, ind):
    """Fold `s` into [lo, hi] by reflecting at the borders (ops/sample.reflect, written out)."""
    span = hi - lo
    if span <= 0:
        lines.append(f"{ind}if {s} < {c(lo)} or {s} > {c(hi)}:")
        lines.append(f"{ind}    {s} = {c(lo)}")
        return
    d, k, rr = gen.fresh(), gen.fresh(), gen.fresh()
    sides = ((f"{s} < {c(lo)}", f"{c(lo)} - {s}", f"{c(lo)} + {rr}", f"{c(hi)} - {rr}"),
             (f"{s} > {c(hi)}", f"{s} - {c(hi)}", f"{c(hi)} - {rr}", f"{c(lo)} + {rr}"))
    for first, (cond, dist, even, odd) in zip((True, False), sides):
        lines.append(f"{ind}{'if' if first else 'elif'} {cond}:")
        lines.append(f"{ind}    {d} = {dist}")
        lines.append(f"{ind}    {k} = np.floor({d} / {c(span)})")
        lines.append(f"{ind}    {rr} = {d} - {k} * {c(span)}")
        lines.append(f"{ind}    {s} = {even} if {k} % 2 == 0 else {odd}")


def _taps(gen, s, mode, c, lines, ind):
    """[(integer index variable, weight variable or None)] of one axis's taps at coordinate `s`."""
    i0 = gen.fresh()
    if mode == "nearest":
        lines.append(f"{ind}{i0} = np.int64({s})")
        return [(i0, None)]
    f, t = gen.fresh(), gen.fresh()
    lines += [f"{ind}{f} = np.floor({s})", f"{ind}{t} = {s} - {f}", f"{ind}{i0} = np.int64({f})"]
    if mode == "linear":
        w0 = gen.fresh()
        lines.append(f"{ind}{w0} = {c(1)} - {t}")
        return [(i0, w0), (f"{i0} + 1", t)]
    a = c(CUBIC_A)
    out = []
    for k, u in enumerate((f"({t} + {c(1)})", t, f"({c(1)} - {t})", f"({c(2)} - {t})")):
        w = gen.fresh()
        if k in (0, 3):
            lines.append(f"{ind}{w} = (({a} * {u} - {c(5 * CUBIC_A)}) * {u} + {c(8 * CUBIC_A)}) * {u} - "
                         f"{c(4 * CUBIC_A)}")
        else:
            lines.append(f"{ind}{w} = (({c(CUBIC_A + 2)}) * {u} - {c(CUBIC_A + 3)}) * {u} * {u} + {c(1)}")
        out.append((f"{i0} + {k - 1}" if k != 1 else i0, w))
    return out


def _tap_index(gen, j, size, align, padding, c, lines, ind):
    """(the tap's index clamped into the axis, the variable saying it lies inside or None)."""
    v = gen.fresh()
    valid = None
    if padding == "reflection":
        f = gen.fresh()                        # (in float64, as the reference folds indices)
        lines.append(f"{ind}{f} = np.float64({j})")
        lo, hi = borders(size, align)
        _reflect(gen, f, lo, hi, lambda v: lit(v, np.float64), lines, ind)
        lines.append(f"{ind}{v} = np.int64({f})")
    else:
        lines.append(f"{ind}{v} = {j}")
        if padding == "zeros":
            valid = gen.fresh()
            lines.append(f"{ind}{valid} = {v} >= 0 and {v} < {size}")
    lines.append(f"{ind}{v} = min(max({v}, 0), {size - 1})")
    return v, valid
