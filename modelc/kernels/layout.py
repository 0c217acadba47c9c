"""Physical layouts of tensors in a compiled module, and the index arithmetic kernels emit for them.

A tensor is either *plain* (row-major, as ONNX sees it) or *blocked*: a 4-d NCHW activation
stored as NCHW[b]c, i.e. [N, C/b, H + 2h, W + 2h, b] with a zero halo of h pixels around each
plane, so that a following convolution with padding <= h reads its zero padding for free
(shared/PERFORMANCE.md: this layout is what makes a direct convolution vectorise). Every kernel
receives flat 1-d arrays; `offset` writes the flat index of a logical element as source code.
"""
from __future__ import annotations

import math

import numpy as np

from .. import target


def choose_block(channels: int, lanes: int | None = None) -> int:
    """The channel block: one vector of float32 (`lanes`, by default the target's: 16 with AVX-512,
    8 with AVX2) when it divides C, else half a vector; C itself up to one vector; never padding C."""
    v = lanes or target.current().lanes(4)
    for b in (v, v // 2):
        if b > 1 and channels % b == 0:
            return b
    if channels <= v:
        return channels
    return 4 if channels % 4 == 0 else (2 if channels % 2 == 0 else 1)


def physical_shape(shape, layout) -> tuple:
    if not layout:
        return tuple(shape)
    b, h = layout
    n, c, hh, ww = shape
    return (n, c // b, hh + 2 * h, ww + 2 * h, b)


def physical_size(shape, layout) -> int:
    return int(math.prod(physical_shape(shape, layout)))


def strides(shape) -> list:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def _term(idx: str, stride: int) -> str:
    if idx == "0" or stride == 0:
        return ""
    return idx if stride == 1 else f"({idx}) * {stride}"


def _flat(i) -> str:
    """An index expression; a channel may be given split as (block, lane, block size)."""
    if isinstance(i, tuple):
        blk, lane, b = i
        return lane if blk == "0" else f"({blk}) * {b} + {lane}"
    return i


def offset(shape, layout, idx: list) -> str:
    """Source of the flat offset of logical element `idx` (a list of index expressions).

    The channel index of an NCHW tensor may be passed as (block, lane, b): a blocked tensor with
    block b then needs no division, which keeps the innermost loop vectorisable.
    """
    if layout:
        b, h = layout
        pshape = physical_shape(shape, layout)
        n, c, y, x = idx
        st = strides(pshape)
        if isinstance(c, tuple) and c[2] == b:
            c_blk, c_in = c[0], c[1]
        else:
            c = _flat(c)
            c_blk, c_in = (f"({c}) // {b}", f"({c}) % {b}") if b != shape[1] else ("0", c)
            if b == 1:
                c_blk, c_in = c, "0"
        parts = [_term(n, st[0]), _term(c_blk, st[1]), _term(f"{y} + {h}" if h else y, st[2]),
                 _term(f"{x} + {h}" if h else x, st[3]), _term(c_in, st[4])]
    else:
        parts = [_term(_flat(i), s) for i, s in zip(idx, strides(shape)) if len(shape)]
    parts = [p for p in parts if p]
    return " + ".join(parts) if parts else "0"


def uoffset(shape, layout, idx: list) -> str:
    """`offset` wrapped as an unsigned index: numba then skips its negative-index check."""
    return f"np.uintp({offset(shape, layout, idx)})"


def to_physical(arr: np.ndarray, layout) -> np.ndarray:
    """A logical array in `layout`, flattened (numpy; for tests, tuning and boundaries)."""
    arr = np.asarray(arr)
    if not layout:
        return np.ascontiguousarray(arr).reshape(-1)
    b, h = layout
    n, c, hh, ww = arr.shape
    out = np.zeros(physical_shape(arr.shape, layout), arr.dtype)
    out[:, :, h:h + hh, h:h + ww, :] = arr.reshape(n, c // b, b, hh, ww).transpose(0, 1, 3, 4, 2)
    return out.reshape(-1)


def logical_view(flat: np.ndarray, shape, layout) -> np.ndarray:
    """A view of a flat physical buffer in logical element order: `shape` itself without a layout,
    [N, C/b, b, H, W] (halo cut off, lanes moved before the rows) in a blocked one, which a
    C-order copy turns into the logical [N, C, H, W] by a free reshape."""
    if not layout:
        return flat.reshape(shape)
    b, h = layout
    n, c, hh, ww = shape
    p = flat.reshape(physical_shape(shape, layout))
    return p[:, :, h:h + hh, h:h + ww, :].transpose(0, 1, 4, 2, 3)


def from_physical(flat: np.ndarray, shape, layout) -> np.ndarray:
    return np.ascontiguousarray(logical_view(flat, shape, layout)).reshape(shape)


def same_as_plain(shape, layout) -> bool:
    """Blocked buffers of 1x1 planes without halo are laid out exactly like plain NCHW."""
    return not layout or (layout[1] == 0 and tuple(shape[2:]) == (1, 1))
