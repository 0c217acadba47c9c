"""GridSample: an image read at coordinates that are themselves data (spatial transformers,
optical flow's warps, as in torchvision's RAFT).

Per spatial axis the grid's normalised coordinate becomes a source coordinate (`source_coord`),
which out-of-range handling may clamp or reflect; the interpolation mode turns it into taps
(`axis_taps`), each tap's index is mapped by the padding mode (`tap_index`), and the output is the
sum over every combination of one tap per axis of the product of their weights. This is the ONNX
reference's arithmetic (PyTorch's GridSampler), written once for numpy arrays and once, by the same
steps, as generated code (kernels/sample_map.py).
"""
from __future__ import annotations

import itertools

import numpy as np

from .registry import Kind, register

GRID_MODES = ("nearest", "linear", "cubic")
GRID_PADDING = ("zeros", "border", "reflection")
CUBIC_A = -0.75


def borders(size: int, align_corners: int) -> tuple:
    """The coordinate range that counts as inside an axis of `size` pixels."""
    return (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)


def reflect(x, lo: float, hi: float):
    """Fold coordinates into [lo, hi] by reflecting at the borders (numpy arrays)."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    below, above = x < lo, x > hi
    d = np.where(below, lo - x, np.where(above, x - hi, 0))
    k = np.floor(d / span)
    r = d - k * span
    even = k % 2 == 0
    low_side = np.where(below, even, ~even)          # lands r above lo, else r below hi
    folded = np.where(low_side, lo + r, hi - r)
    return np.where(below | above, folded, x)


def source_coord(g, size: int, align_corners: int, mode: str, padding: str, dtype):
    """Normalised grid values along one axis -> source coordinates, as the reference fixes them;
    except that cubic taps with border padding are clamped one by one around the unclamped
    coordinate, as PyTorch (whose exports use it) and onnxruntime compute them: ONNX's reference
    clamps the coordinate first (no conformance case covers it; the two differ by up to 0.19 on
    unit-variance images)."""
    one, half = dtype.type(1), dtype.type(0.5)
    if align_corners:
        x = (g + one) * half * dtype.type(size - 1)
    else:
        x = ((g + one) * dtype.type(size) - one) * half
    x = x.astype(dtype)
    if mode == "nearest":
        x = np.rint(x)
    lo, hi = borders(size, align_corners)
    outside = (x < lo) | (x > hi)
    if padding == "border" and mode != "cubic":
        x = np.where(outside, np.clip(x, 0, size - 1), x)
    elif padding == "reflection":
        x = np.where(outside, reflect(x, lo, hi), x)
    return x.astype(dtype)


def cubic_coeffs(t, dtype):
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 from the floor."""
    a = dtype.type(CUBIC_A)

    def far(u):
        return ((a * u - 5 * a) * u + 8 * a) * u - 4 * a

    def near(u):
        return ((a + 2) * u - (a + 3)) * u * u + 1
    one = dtype.type(1)
    return [far(t + one), near(t), near(one - t), far(dtype.type(2) - t)]


def axis_taps(x, mode: str, dtype):
    """[(integer index, weight)] of the taps along one axis (weight None: nearest's single tap)."""
    if mode == "nearest":
        return [(x.astype(np.int64), None)]
    f = np.floor(x)
    t = (x - f).astype(dtype)
    i0 = f.astype(np.int64)
    if mode == "linear":
        return [(i0, (dtype.type(1) - t).astype(dtype)), (i0 + 1, t)]
    return [(i0 + k - 1, w.astype(dtype)) for k, w in enumerate(cubic_coeffs(t, dtype))]


def tap_index(i, size: int, align_corners: int, padding: str):
    """A tap's index in range, and whether it reads the image (zeros padding reads 0 outside)."""
    if padding == "zeros":
        return np.clip(i, 0, size - 1), (i >= 0) & (i < size)
    if padding == "reflection":
        lo, hi = borders(size, align_corners)
        i = reflect(i.astype(np.float64), lo, hi).astype(np.int64)
    return np.clip(i, 0, size - 1), None


def check_attrs(rank: int, mode: str, padding_mode: str):
    if mode not in GRID_MODES:
        raise ValueError(f"GridSample mode {mode!r} is not one of {list(GRID_MODES)}")
    if padding_mode not in GRID_PADDING:
        raise ValueError(f"GridSample padding_mode {padding_mode!r} is not one of {list(GRID_PADDING)}")
    if mode == "cubic" and rank != 4:
        raise ValueError(f"GridSample cubic mode needs a 4-d input, got {rank}-d")


def _grid_sample_infer(x, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    check_attrs(len(x.shape), mode, padding_mode)
    r = len(x.shape) - 2
    if r < 1 or len(grid.shape) != r + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != r:
        raise ValueError(f"GridSample grid of shape {list(grid.shape)} does not fit an input of shape "
                         f"{list(x.shape)}: want [N, *output size, {r}] with N = {x.shape[0]}")
    if x.dtype.kind != "f" or grid.dtype.kind != "f":
        raise ValueError(f"GridSample takes floating-point input and grid, got {x.dtype} and {grid.dtype}")
    return (x.shape[0], x.shape[1]) + tuple(grid.shape[1:-1]), x.dtype


@register("GridSample", Kind.INJECTIVE, infer=_grid_sample_infer)
def grid_sample(x, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    check_attrs(x.ndim, mode, padding_mode)
    dt = np.dtype(np.float64 if x.dtype == np.float64 else np.float32)
    sizes = x.shape[2:]
    r = len(sizes)
    xt = np.moveaxis(x, 1, -1).astype(dt)                    # (N, *sizes, C)
    n = np.arange(x.shape[0]).reshape((-1,) + (1,) * r)
    per_axis = []
    for i, size in enumerate(sizes):                         # the grid's last entry is axis 0's
        c = source_coord(grid[..., r - 1 - i].astype(dt), size, align_corners, mode, padding_mode, dt)
        per_axis.append([(*tap_index(j, size, align_corners, padding_mode), w)
                         for j, w in axis_taps(c, mode, dt)])
    out = np.zeros(grid.shape[:-1] + (x.shape[1],), dt)
    for combo in itertools.product(*per_axis):
        v = xt[(n,) + tuple(j for j, _, _ in combo)]
        for _, valid, wt in combo:
            if wt is not None:
                v = v * wt[..., None]
            if valid is not None:                            # 0 outside, even where the pixel is inf
                v = np.where(valid[..., None], v, dt.type(0))
        out += v
    return np.moveaxis(out, -1, 1).astype(x.dtype)
