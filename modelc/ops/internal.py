"""Ops that exist only inside modelc: canonical forms the passes rewrite ONNX patterns into."""
from __future__ import annotations

import numpy as np

from .registry import Kind, register

# the ops that are a 2-d/n-d convolution to layouts, fusion names and costs (ScaledConv: one whose
# input is multiplied by a per-channel gate)
CONVS = ("Conv", "ScaledConv")


def _dense_shape(x, w, b=None, *, exact=0, x_min=None, y_shape=None, y_strides=None):
    return stored_shape(x.shape[:-1] + (w.shape[1],), y_shape, y_strides), x.dtype


@register("Dense", Kind.OUT_ELEMWISE_FUSABLE, infer=_dense_shape)
def dense(x, w, b=None, *, exact=0, x_min=None, y_shape=None, y_strides=None):
    """y = x @ w + b with a constant w[K, N]: what MatMul/Gemm with weights and a bias become
    (`exact` and `x_min`: a quantized product's, as on Conv: ops/conv.py; `y_shape`, `y_strides`:
    stored transposed, passes/matmul_views.py)."""
    y = np.matmul(x, w)
    if b is not None:
        y = y + b
    return store_view(y.astype(x.dtype, copy=False), y_shape, y_strides)


def stored_shape(shape: tuple, y_shape, y_strides) -> tuple:
    """The shape an op of result `shape` stores: `y_shape` when its result is written through the
    strides `y_strides` (one per result dim) into a row-major tensor of that shape - every element
    exactly once, as a reshape or transpose would have (attributes can come from an untrusted
    document: two elements written to one place would race, one never written would be garbage)."""
    if y_shape is None and y_strides is None:
        return tuple(shape)
    ok = isinstance(y_shape, (list, tuple)) and isinstance(y_strides, (list, tuple)) and \
        len(y_strides) == len(shape) and len(y_shape) <= 8 and \
        all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v <= 1 << 40
            for v in (*y_shape, *y_strides))
    if ok:
        size = int(np.prod(shape, dtype=np.int64))
        ok = int(np.prod(y_shape, dtype=np.int64)) == size
        expect = 1
        for s, d in sorted((int(s), int(d)) for s, d in zip(y_strides, shape) if d > 1):
            ok = ok and s == expect
            expect *= d
    if not ok:
        raise ValueError(f"a result {list(shape)} stored as {y_shape} through strides {y_strides}: "
                         f"expected every element written once, one stride per result dim")
    return tuple(int(d) for d in y_shape)


def store_view(y: np.ndarray, y_shape, y_strides) -> np.ndarray:
    if y_shape is None:
        return y
    out = np.empty(int(np.prod(y_shape, dtype=np.int64)), y.dtype)
    np.lib.stride_tricks.as_strided(out, y.shape, [s * out.itemsize for s in y_strides])[...] = y
    return out.reshape(y_shape)


def _scaled_conv_shape(x, w, b=None, s=None, **attrs):
    from .conv import _conv_infer
    if s is None or len(x.shape) != 4 or tuple(s.shape) != (x.shape[0], x.shape[1], 1, 1):
        raise ValueError(f"ScaledConv's scale {None if s is None else list(s.shape)} must be "
                         f"[{x.shape[0]}, {x.shape[1]}, 1, 1] for an input {list(x.shape)}")
    return _conv_infer(x, w, b, **attrs)


@register("ScaledConv", Kind.OUT_ELEMWISE_FUSABLE, infer=_scaled_conv_shape)
def scaled_conv(x, w, b=None, s=None, **attrs):
    """Conv(x * s, w, b) with s[N, C, 1, 1] computed at run time: a squeeze-excitation's channel
    gate and the 1x1 convolution after it (passes/scale_conv.py). The reference multiplies first,
    as the two ONNX ops did."""
    from .conv import conv
    return conv((x * s).astype(x.dtype, copy=False), w, b, **attrs)


def check_view(x, shape, strides, name: str, offset=0) -> tuple:
    """A strided view of `x`'s row-major elements (what StridedMatMul reads): as many positive
    dimensions as strides, strides >= 0, its last element inside `x` (attributes can come from an
    untrusted document: a view past the end would read other memory)."""
    if not isinstance(shape, (list, tuple)) or not isinstance(strides, (list, tuple)) or \
            not 2 <= len(shape) <= 8 or len(shape) != len(strides) or \
            not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and 1 <= d <= 1 << 40
                    for d in shape) or \
            not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and 0 <= s <= 1 << 40
                    for s in strides):
        raise ValueError(f"StridedMatMul's {name} view {shape} / {strides}: expected 2-8 positive "
                         f"dimensions and as many non-negative strides")
    if not isinstance(offset, (int, np.integer)) or isinstance(offset, bool) or not 0 <= offset <= 1 << 40:
        raise ValueError(f"StridedMatMul's {name} view starts at {offset!r}: expected a non-negative element")
    size = int(np.prod(x.shape, dtype=np.int64))
    last = int(offset) + sum((int(d) - 1) * int(s) for d, s in zip(shape, strides))
    if last >= size:
        raise ValueError(f"StridedMatMul's {name} view {list(shape)} / {list(strides)} reads element "
                         f"{last} of a tensor of {size}")
    return tuple(int(d) for d in shape), tuple(int(s) for s in strides)


def _view(x, shape, strides, offset):
    flat = np.ascontiguousarray(x).reshape(-1)[offset:]
    return np.lib.stride_tricks.as_strided(flat, shape, [s * flat.itemsize for s in strides], writeable=False)


def _strided_matmul_shape(a, b, *, a_shape, a_strides, b_shape, b_strides, a_offset=0, b_offset=0,
                          y_shape=None, y_strides=None):
    from .linalg import matmul_shape
    sa, _ = check_view(a, a_shape, a_strides, "A", a_offset)
    sb, _ = check_view(b, b_shape, b_strides, "B", b_offset)
    if a.dtype != b.dtype:
        raise ValueError(f"StridedMatMul of {a.dtype} and {b.dtype}")
    return stored_shape(matmul_shape(sa, sb), y_shape, y_strides), a.dtype


@register("StridedMatMul", Kind.OUT_ELEMWISE_FUSABLE, infer=_strided_matmul_shape)
def strided_matmul(a, b, *, a_shape, a_strides, b_shape, b_strides, a_offset=0, b_offset=0,
                   y_shape=None, y_strides=None):
    """MatMul of strided views of two tensors: a MatMul whose operands were reshapes and transposes
    of them, slices or gathers of constant indices included (attention's heads split from one
    [tokens, heads x dim] tensor, or Q, K and V from one projection), which the matmul kernel reads in
    place instead of copying first (`a_offset`: the view's first element); its result may be stored
    transposed too (the heads merged back): passes/matmul_views.py."""
    y = np.matmul(_view(a, a_shape, a_strides, a_offset), _view(b, b_shape, b_strides, b_offset))
    return store_view(y, y_shape, y_strides)


def _mul_add_shape(a, b, c):
    from .registry import broadcast_shape
    return broadcast_shape(a.shape, b.shape, c.shape, where="MulAdd"), a.dtype


@register("MulAdd", Kind.BROADCAST, infer=_mul_add_shape)
def mul_add(a, b, c):
    """a * b + c rounded once (a fused multiply-add), where a quantized op must give onnxruntime's
    value bit for bit (QLinearAdd is MLAS's two FMAs). The reference: the float32 product is exact
    in float64, and so is its sum with c but where the two are far apart in scale."""
    if a.dtype == np.float32:
        return (a.astype(np.float64) * b + c).astype(np.float32)
    return (a * b + c).astype(a.dtype, copy=False)
