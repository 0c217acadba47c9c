"""ONNX's quantized ops, imported as float32 arithmetic that gives onnxruntime's integers.

int8 models (the ONNX zoo's `-int8` networks, onnxruntime's quantizer in either format, PyTorch's
quantized exports) carry uint8/int8 tensors between layers. modelc computes on float32 kernels, so
each op becomes the float ops of its definition: DequantizeLinear is (x - zero_point) * scale,
QuantizeLinear is saturate(round(x / scale) + zero_point), rounding half to even.

QLinearConv, QLinearMatMul, ConvInteger and MatMulInteger are defined on integers: onnxruntime sums
(x - x_zero_point) * (w - w_zero_point) in int32 and requantizes with one float multiply by
x_scale * w_scale / y_scale. Here the convolution or product runs on the integer values held in
float32 (each product and partial sum is an integer below 2^24 in any real layer, so every order of
summation gives the same sum) and is requantized by the same multiply: the integers onnxruntime
computes, not a float approximation of them. The Conv is marked `exact`, which rules out Winograd,
whose transforms are fractions.
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from ..errors import ModelcError, ShapeError
from .converters import converter

F32 = 1                      # onnx.TensorProto.FLOAT
_ONNX_TYPE = {np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.uint16): 4, np.dtype(np.int16): 5,
              np.dtype(np.int32): 6, np.dtype(np.float16): 10, np.dtype(np.float32): 1,
              np.dtype(np.float64): 11}
QUANTIZED = (np.uint8, np.int8, np.uint16, np.int16)
EXACT = {"exact": 1}         # a Mul rounded once in kernels, as onnxruntime's (intrinsics.fmul)
CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def onnx_type(node, dtype) -> int:
    try:
        return _ONNX_TYPE[np.dtype(dtype)]
    except KeyError:
        raise ModelcError(f"{node.where()}: modelc computes no quantized values of type {np.dtype(dtype)}") from None


def cast(ctx, t: str, dtype, outputs=None) -> str:
    """`t` as `dtype` (itself if it already is)."""
    if ctx.dtype(t) == np.dtype(dtype) and outputs is None:
        return t
    return ctx.emit("Cast", [t], outputs, {"to": onnx_type(ctx.current, dtype)})[0]


def as_float(ctx, t: str) -> str:
    return cast(ctx, t, np.float32)


def _axis(node, rank: int):
    """The node's axis, or None when out of range (allowed while the scale is one value)."""
    axis = int(node.attrs.get("axis", 1))
    return axis % rank if -rank <= axis < rank else None


def along(ctx, node, p: str, shape: tuple, axis: int, block: int = 0, what: str = "scale") -> str:
    """Parameter `p` (a scale or zero point) shaped to broadcast against a tensor of `shape`:
    one value for all, one per index of `axis`, or (blocked) one per `block` indices along it."""
    ps = tuple(ctx.shape(p))
    n = int(np.prod(ps)) if ps else 1
    if axis is None and (block or n > 1):
        raise ShapeError(f"{node.where()}: axis {node.attrs.get('axis', 1)} is out of range for an "
                         f"input of rank {len(shape)}")
    if block:
        if len(ps) != len(shape) or any(a != b for k, (a, b) in enumerate(zip(ps, shape)) if k != axis) or \
                -(-shape[axis] // block) != ps[axis]:
            raise ShapeError(f"{node.where()}: {what} of shape {list(ps)} does not fit blocks of {block} "
                             f"along axis {axis} of an input of shape {list(shape)}")
        idx = ctx.const(np.arange(shape[axis], dtype=np.int64) // block, f"{node.name}_blocks")
        return ctx.emit("Gather", [p, idx], attrs={"axis": axis})[0]
    if n == 1 and len(ps) <= 1:
        return p if not ps else ctx.emit("Reshape", [p, ctx.const(np.array([], np.int64), "shape")])[0]
    if len(ps) != 1 or not shape or ps[0] != shape[axis]:
        raise ShapeError(f"{node.where()}: {what} of shape {list(ps)} is neither one value nor one per "
                         f"index of axis {axis} of an input of shape {list(shape)}")
    target = [ps[0]] + [1] * (len(shape) - axis - 1)
    return ctx.emit("Reshape", [p, ctx.const(np.array(target, np.int64), "shape")])[0]


def centered(ctx, node, q: str, zp: str, axis: int = 0, block: int = 0) -> str:
    """q - zero_point as float32: the integers a quantized op computes on (exact below 2^24)."""
    if ctx.dtype(q) not in tuple(map(np.dtype, QUANTIZED + (np.int32,))):
        raise ModelcError(f"{node.where()}: input {q!r} is {ctx.dtype(q)}, not a quantized integer type")
    qf = as_float(ctx, q)
    if not zp:
        return qf
    if ctx.dtype(zp) != ctx.dtype(q):
        raise ModelcError(f"{node.where()}: zero point {zp!r} is {ctx.dtype(zp)} but {q!r} is {ctx.dtype(q)}")
    z = along(ctx, node, as_float(ctx, zp), ctx.shape(q), axis, block, "zero point")
    return ctx.emit("Sub", [qf, z])[0]


def saturate(ctx, node, v: str, zp: str, dtype, outputs, axis: int = 0, block: int = 0):
    """Round float32 `v` half to even, add the zero point, clamp to `dtype` and cast to it."""
    dtype = np.dtype(dtype)
    if dtype not in tuple(map(np.dtype, QUANTIZED)):
        raise ModelcError(f"{node.where()}: modelc quantizes to uint8, int8, uint16 and int16, not {dtype}")
    r, = ctx.emit("Round", [v])
    if zp:
        z = along(ctx, node, as_float(ctx, zp), ctx.shape(v), axis, block, "zero point")
        r, = ctx.emit("Add", [r, z])
    info = np.iinfo(dtype)
    lo = ctx.const(np.array(info.min, np.float32), f"{node.name}_min")
    hi = ctx.const(np.array(info.max, np.float32), f"{node.name}_max")
    c, = ctx.emit("Clip", [r, lo, hi])
    cast(ctx, c, dtype, outputs=[outputs[0]])


def quantize(ctx, node, x: str, scale: str, zp: str, dtype, outputs, axis: int = 0, block: int = 0):
    """saturate(round(x / scale) + zero_point), divided in float32 as onnxruntime does."""
    s = along(ctx, node, as_float(ctx, scale), ctx.shape(x), axis, block)
    v, = ctx.emit("Div", [as_float(ctx, x), s])
    saturate(ctx, node, v, zp, dtype, outputs, axis, block)


def scale_product(ctx, node, scales: list, shape) -> str:
    """The product of `scales` ([(scale, axis of a tensor of `shape`)]), shaped to broadcast."""
    m = None
    for s, axis in scales:
        s = along(ctx, node, as_float(ctx, s), shape, axis)
        m = s if m is None else ctx.emit("Mul", [m, s])[0]
    return m


def requantize(ctx, node, acc: str, scales: list, y_scale: str, zp: str, outputs):
    """Integer sums `acc` (float32) times the product of `scales` ([(scale, axis of acc)]) over
    y_scale, in onnxruntime's order of operations (a multiplier per output channel, then one
    multiply per sum), saturated to the zero point's type."""
    shape = ctx.shape(acc)
    m = scale_product(ctx, node, scales, shape)
    m, = ctx.emit("Div", [m, along(ctx, node, as_float(ctx, y_scale), shape, 0)])
    v, = ctx.emit("Mul", [acc, m], attrs=EXACT)
    saturate(ctx, node, v, zp, ctx.dtype(zp), outputs)


def dequantize(ctx, node, q: str, scale: str, zp: str, outputs, axis: int = 0, block: int = 0, dtype=None):
    """(q - zero_point) * scale in float32, cast to the scale's type (or `dtype`)."""
    dtype = np.dtype(dtype or ctx.dtype(scale))
    if dtype.kind != "f":
        raise ModelcError(f"{node.where()}: scale {scale!r} is {ctx.dtype(scale)}, not a float type")
    s = along(ctx, node, as_float(ctx, scale), ctx.shape(q), axis, block)
    y = outputs[0] if dtype == np.float32 else None
    v, = ctx.emit("Mul", [centered(ctx, node, q, zp, axis, block), s], outputs=[y] if y else None, attrs=EXACT)
    if y is None:
        cast(ctx, v, dtype, outputs=[outputs[0]])


def _dtype(node, code: int) -> np.dtype:
    """The numpy dtype of an ONNX element type number (output_dtype)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(code))
    except Exception:
        raise ModelcError(f"{node.where()}: output_dtype {code} is not an element type modelc computes") from None


def _block(node) -> int:
    b = int(node.attrs.get("block_size", 0))
    if b < 0:
        raise ModelcError(f"{node.where()}: block_size {b} is negative")
    return b


@converter("DequantizeLinear", since=1, away=True)
def dequantize_linear(ctx, node):
    q, scale = node.inputs[:2]
    zp = node.inputs[2] if len(node.inputs) > 2 else ""
    if ctx.dtype(q) == np.int32 and zp and np.any(ctx.value(zp) != 0):
        raise ModelcError(f"{node.where()}: an int32 input takes no zero point but 0")
    out = int(node.attrs.get("output_dtype", 0))
    dequantize(ctx, node, q, scale, zp, node.outputs, _axis(node, len(ctx.shape(q))), _block(node),
               _dtype(node, out) if out else None)


@converter("QuantizeLinear", since=1, away=True)
def quantize_linear(ctx, node):
    x, scale = node.inputs[:2]
    zp = node.inputs[2] if len(node.inputs) > 2 else ""
    out = int(node.attrs.get("output_dtype", 0))
    if zp:
        dtype = ctx.dtype(zp)
        if out and onnx_type(node, dtype) != out:
            raise ModelcError(f"{node.where()}: output_dtype {out} differs from the zero point's type {dtype}")
    else:
        dtype = _dtype(node, out) if out else np.dtype(np.uint8)
    quantize(ctx, node, x, scale, zp, dtype, node.outputs, _axis(node, len(ctx.shape(x))), _block(node))


def _conv_attrs(node) -> dict:
    return {k: v for k, v in node.attrs.items() if k in CONV_ATTRS}


def eight_bit(ctx, x, xzp, w, wzp, axis: int = 0) -> dict:
    """{"x_min": the least value of x - x_zero_point} where x is 8-bit with one zero point and
    w - w_zero_point (one per index of w's `axis`) are constant int8 integers: a conv's or
    product's sums are then VNNI's dot products (kernels/conv2d_int8.py); else {}."""
    zx, wv, zw = ctx.value(xzp) if xzp else 0, ctx.value(w), ctx.value(wzp) if wzp else 0
    if ctx.dtype(x) not in (np.dtype(np.uint8), np.dtype(np.int8)) or zx is None or wv is None or zw is None:
        return {}
    if np.size(zx) != 1:
        return {}
    zw = np.asarray(zw, np.int64)
    if zw.size > 1:
        zw = zw.reshape([-1 if d == axis % np.ndim(wv) else 1 for d in range(np.ndim(wv))])
    wc = np.asarray(wv, np.int64) - zw
    if wc.size == 0 or wc.min() < -128 or wc.max() > 127:
        return {}
    return {"x_min": int(np.iinfo(ctx.dtype(x)).min) - int(np.asarray(zx).reshape(()))}


def _int_conv(ctx, node, x, xzp, w, wzp, bias=None) -> str:
    """conv(x - x_zero_point, w - w_zero_point[m]) (+ bias), exact in float32."""
    xi = centered(ctx, node, x, xzp)
    wi = centered(ctx, node, w, wzp, axis=0)
    ins = [xi, wi] + ([as_float(ctx, bias)] if bias else [])
    return ctx.emit("Conv", ins, attrs={**_conv_attrs(node), "exact": 1, **eight_bit(ctx, x, xzp, w, wzp)})[0]


@converter("QLinearConv", since=1, away=True)
def qlinear_conv(ctx, node):
    x, xs, xzp, w, ws, wzp, ys, yzp = node.inputs[:8]
    b = node.inputs[8] if len(node.inputs) > 8 else ""
    if b and ctx.dtype(b) != np.int32:
        raise ModelcError(f"{node.where()}: bias {b!r} is {ctx.dtype(b)}, not int32")
    acc = _int_conv(ctx, node, x, xzp, w, wzp, b)
    requantize(ctx, node, acc, [(xs, 1), (ws, 1)], ys, yzp, node.outputs)


def int_matmul(ctx, node, a, azp, b, bzp) -> str:
    """(a - a_zero_point) @ (b - b_zero_point), exact in float32; a's zero point may be one per
    row of a 2-D a, b's one per column."""
    ra, rb = len(ctx.shape(a)), len(ctx.shape(b))
    ai = centered(ctx, node, a, azp, axis=max(ra - 2, 0))
    bi = centered(ctx, node, b, bzp, axis=rb - 1)
    notes = eight_bit(ctx, a, azp, b, bzp, axis=rb - 1) if rb == 2 else {}
    return ctx.emit("MatMul", [ai, bi], attrs={"exact": 1, **notes} if notes else None)[0]


def _integer(product):
    """ConvInteger / MatMulInteger: `product` of (x - x_zero_point) and (w - w_zero_point), as int32."""
    def convert(ctx, node):
        x, w = node.inputs[:2]
        xzp, wzp = (list(node.inputs[2:4]) + ["", ""])[:2]
        cast(ctx, product(ctx, node, x, xzp, w, wzp), np.int32, outputs=[node.outputs[0]])
    return convert


converter("ConvInteger", since=1, away=True)(_integer(_int_conv))
converter("MatMulInteger", since=1, away=True)(_integer(int_matmul))


@converter("QLinearMatMul", since=1, away=True)
def qlinear_matmul(ctx, node):
    a, as_, azp, b, bs, bzp, ys, yzp = node.inputs[:8]
    acc = int_matmul(ctx, node, a, azp, b, bzp)
    rank = len(ctx.shape(acc))
    requantize(ctx, node, acc, [(as_, max(rank - 2, 0)), (bs, rank - 1)], ys, yzp, node.outputs)
