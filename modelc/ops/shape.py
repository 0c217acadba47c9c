"""Shape ops: views and rearrangements that move data without computing on it (Reshape, Transpose,
Squeeze, Concat, Split, Slice, Expand, Tile, DepthToSpace ...).

Each op's shape rule and its reference share one helper that turns the op's parameters into a
plan (target shape, numpy slices, split sizes), so the declared shape and the computed array agree.
"""
from __future__ import annotations

import math

import numpy as np

from .params import axis_index, axis_indices, int_list, known, one_d, optional
from .registry import Kind, register


def _flatten_shape(shape, axis):
    r = len(shape)
    a = int(axis) + r if int(axis) < 0 else int(axis)
    if not 0 <= a <= r:
        raise ValueError(f"axis {axis} is out of range for rank {r}")
    return math.prod(shape[:a]), math.prod(shape[a:])


@register("Flatten", Kind.INJECTIVE, infer=lambda x, axis=1: (_flatten_shape(x.shape, axis), x.dtype))
def flatten(x, *, axis=1):
    return x.reshape(_flatten_shape(x.shape, axis))


def _reshape_shape(in_shape, target, allowzero=0):
    out = int_list(target)
    if not allowzero:
        for i, d in enumerate(out):
            if d == 0:
                if i >= len(in_shape):
                    raise ValueError(f"shape {out}: 0 at position {i} copies a dimension the "
                                     f"input {list(in_shape)} does not have")
                out[i] = in_shape[i]
    total = math.prod(in_shape)
    free = [i for i, d in enumerate(out) if d == -1]
    if len(free) > 1 or any(d < -1 for d in out):
        raise ValueError(f"invalid target shape {int_list(target)}")
    if free:
        rest = math.prod(d for d in out if d != -1)
        if rest == 0 or total % rest:
            raise ValueError(f"cannot reshape {list(in_shape)} ({total} elements) to {int_list(target)}")
        out[free[0]] = total // rest
    if math.prod(out) != total:
        raise ValueError(f"cannot reshape {list(in_shape)} ({total} elements) to {int_list(target)}")
    return tuple(out)


@register("Reshape", Kind.INJECTIVE, param_inputs=(1,),
          infer=lambda x, s, allowzero=0: (_reshape_shape(x.shape, known(s, "shape"), allowzero),
                                          x.dtype))
def reshape(x, shape, *, allowzero=0):
    return x.reshape(_reshape_shape(x.shape, shape, allowzero))


def _perm(rank, perm):
    p = list(range(rank))[::-1] if perm is None else [int(v) for v in perm]
    if sorted(p) != list(range(rank)):
        raise ValueError(f"perm {p} is not a permutation of the {rank} axes")
    return p


@register("Transpose", Kind.INJECTIVE,
          infer=lambda x, perm=None: (tuple(x.shape[i] for i in _perm(len(x.shape), perm)), x.dtype))
def transpose(x, *, perm=None):
    return np.transpose(x, _perm(x.ndim, perm))


def _squeeze_shape(shape, axes):
    axes = optional(axes)
    if axes is None:
        return tuple(d for d in shape if d != 1)
    ax = axis_indices(int_list(axes), len(shape))
    for a in ax:
        if shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of shape {list(shape)}: its size is not 1")
    return tuple(d for i, d in enumerate(shape) if i not in ax)


@register("Squeeze", Kind.INJECTIVE, param_inputs=(1,),
          infer=lambda x, axes=None: (_squeeze_shape(x.shape, known(axes, "axes")), x.dtype))
def squeeze(x, axes=None):
    return x.reshape(_squeeze_shape(x.shape, axes))


def _unsqueeze_shape(shape, axes):
    axes = int_list(axes)
    r = len(shape) + len(axes)
    ax = set(axis_indices(axes, r))
    it = iter(shape)
    return tuple(1 if i in ax else next(it) for i in range(r))


@register("Unsqueeze", Kind.INJECTIVE, param_inputs=(1,),
          infer=lambda x, axes: (_unsqueeze_shape(x.shape, known(axes, "axes")), x.dtype))
def unsqueeze(x, axes):
    return x.reshape(_unsqueeze_shape(x.shape, axes))


def _concat_infer(*xs, axis):
    r = len(xs[0].shape)
    a = axis_index(axis, r)
    for t in xs:
        if len(t.shape) != r or any(d != e for i, (d, e) in enumerate(zip(t.shape, xs[0].shape))
                                    if i != a):
            raise ValueError(f"cannot concatenate shapes {[list(t.shape) for t in xs]} on axis {axis}")
    shape = list(xs[0].shape)
    shape[a] = sum(t.shape[a] for t in xs)
    return tuple(shape), xs[0].dtype


@register("Concat", Kind.INJECTIVE, infer=_concat_infer)
def concat(*xs, axis):
    return np.concatenate(xs, axis=axis_index(axis, xs[0].ndim))


def _split_sizes(dim, split, num_outputs):
    split = optional(split)
    if split is not None:
        sizes = int_list(split)
        if sum(sizes) != dim or any(s < 0 for s in sizes):
            raise ValueError(f"split sizes {sizes} do not add up to the dimension {dim}")
        return sizes
    if not num_outputs or num_outputs < 1:
        raise ValueError("Split needs either the split input or the num_outputs attribute")
    chunk = -(-dim // num_outputs)
    sizes = [chunk] * (num_outputs - 1) + [dim - chunk * (num_outputs - 1)]
    if sizes[-1] < 0:
        raise ValueError(f"cannot split a dimension of {dim} into {num_outputs} outputs")
    return sizes


def _split_infer(x, split=None, *, axis=0, num_outputs=None):
    a = axis_index(axis, len(x.shape))
    sizes = _split_sizes(x.shape[a], known(split, "split"), num_outputs)
    return [(x.shape[:a] + (s,) + x.shape[a + 1:], x.dtype) for s in sizes]


@register("Split", Kind.INJECTIVE, infer=_split_infer, param_inputs=(1,))
def split(x, split=None, *, axis=0, num_outputs=None):
    a = axis_index(axis, x.ndim)
    sizes = _split_sizes(x.shape[a], split, num_outputs)
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=a))


def slice_bounds(shape, starts, ends, axes=None, steps=None) -> tuple:
    """numpy slices for ONNX Slice; ONNX clamps differently from Python for negative steps."""
    starts, ends = int_list(starts), int_list(ends)
    axes = list(range(len(starts))) if optional(axes) is None else axis_indices(int_list(axes), len(shape))
    steps = [1] * len(starts) if optional(steps) is None else int_list(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length")
    out = [slice(None)] * len(shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        d = shape[a]
        if st == 0:
            raise ValueError("Slice step 0")
        s, e = s + d if s < 0 else s, e + d if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), d), min(max(e, 0), d)
        else:
            s, e = max(min(s, d - 1), 0), min(max(e, -1), d - 1)
        out[a] = slice(s, None if e < 0 else e, st)
    return tuple(out)


def _slice_infer(x, starts, ends, axes=None, steps=None):
    one_d(starts=starts, ends=ends, axes=axes, steps=steps)
    sl = slice_bounds(x.shape, known(starts, "starts"), known(ends, "ends"), known(axes, "axes"),
                known(steps, "steps"))
    return tuple(len(range(d)[s]) for d, s in zip(x.shape, sl)), x.dtype


@register("Slice", Kind.INJECTIVE, infer=_slice_infer, param_inputs=(1, 2, 3, 4))
def slice_(x, starts, ends, axes=None, steps=None):
    return x[slice_bounds(x.shape, starts, ends, axes, steps)]


def _expand_shape(in_shape, target):
    try:
        return tuple(np.broadcast_shapes(tuple(in_shape), tuple(int_list(target))))
    except ValueError:
        raise ValueError(f"shape {list(in_shape)} cannot expand to {int_list(target)}") from None


@register("Expand", Kind.INJECTIVE, param_inputs=(1,),
          infer=lambda x, s: (_expand_shape(x.shape, known(s, "shape")), x.dtype))
def expand(x, shape):
    return np.array(np.broadcast_to(x, _expand_shape(x.shape, shape)))


def _tile_shape(in_shape, repeats):
    reps = int_list(repeats)
    if len(reps) != len(in_shape) or any(r < 0 for r in reps):
        raise ValueError(f"repeats {reps} do not fit an input of rank {len(in_shape)}")
    return tuple(d * r for d, r in zip(in_shape, reps))


@register("Tile", Kind.INJECTIVE, param_inputs=(1,),
          infer=lambda x, r: (_tile_shape(x.shape, known(r, "repeats")), x.dtype))
def tile(x, repeats):
    _tile_shape(x.shape, repeats)
    return np.tile(x, int_list(repeats))


def _blocks(shape, b, to_space):
    if len(shape) != 4:
        raise ValueError(f"needs a 4-D input, got {list(shape)}")
    n, c, h, w = shape
    if to_space:
        if c % (b * b):
            raise ValueError(f"channels {c} are not a multiple of blocksize^2 = {b * b}")
        return n, c // (b * b), h * b, w * b
    if h % b or w % b:
        raise ValueError(f"height {h} and width {w} are not multiples of blocksize {b}")
    return n, c * b * b, h // b, w // b


@register("DepthToSpace", Kind.INJECTIVE,
          infer=lambda x, blocksize, mode="DCR": (_blocks(x.shape, blocksize, True), x.dtype))
def depth_to_space(x, *, blocksize, mode="DCR"):
    b = blocksize
    n, c, h, w = x.shape
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(_blocks(x.shape, b, True))


@register("SpaceToDepth", Kind.INJECTIVE,
          infer=lambda x, blocksize, mode="DCR": (_blocks(x.shape, blocksize, False), x.dtype))
def space_to_depth(x, *, blocksize, mode="DCR"):
    b = blocksize
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.transpose(0, 1, 3, 5, 2, 4)
    return y.reshape(_blocks(x.shape, b, False))
