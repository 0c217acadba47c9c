"""ONNX's experimental ops of opset 1, removed from the standard since, which models of the old ONNX
zoo still hold (tiny YOLOv2 scales its image with ImageScaler; Caffe2 and CoreML converters wrote
Scale, Affine, Crop and the fills). Each becomes the standard ops it stands for, by the definitions
ONNX gave them (onnx/docs/Changelog.md, "experimental" ops of version 1).
"""
from __future__ import annotations

import numpy as np

from .. import memory
from ..errors import ModelcError, ShapeError
from .converters import converter

# (ONNX has no schema for them any more: the importer admits these names without one)
EXPERIMENTAL = {"ImageScaler", "Scale", "Affine", "ScaledTanh", "ParametricSoftplus", "Crop", "ConstantFill",
                "GivenTensorFill"}


def _c(ctx, node, value, hint):
    return ctx.const(np.asarray(value, ctx.dtype(node.inputs[0])), f"{node.name}_{hint}")


def _float(node, name, default):
    v = node.attrs.get(name, default)
    if not isinstance(v, (int, float)) or not np.isfinite(v):
        raise ModelcError(f"{node.where()}: attribute {name!r} must be a finite number, got {v!r}")
    return float(v)


@converter("ImageScaler", away=True)
def image_scaler(ctx, node):
    """y = scale * x + bias[c] over an NCHW image."""
    x = node.inputs[0]
    if ctx.rank(x) != 4:
        raise ShapeError(f"{node.where()}: ImageScaler takes an NCHW image, got shape {list(ctx.shape(x))}")
    channels = ctx.shape(x)[1]
    bias = np.asarray(node.attrs.get("bias", [0.0] * channels), np.float64).reshape(-1)
    if bias.size != channels or not np.all(np.isfinite(bias)):
        raise ModelcError(f"{node.where()}: ImageScaler's bias has {bias.size} values for {channels} channels")
    scaled, = ctx.emit("Mul", [x, _c(ctx, node, _float(node, "scale", 1.0), "scale")])
    ctx.emit("Add", [scaled, _c(ctx, node, bias.reshape(1, channels, 1, 1), "bias")], outputs=[node.outputs[0]])


@converter("Scale", away=True)
def scale(ctx, node):
    ctx.emit("Mul", [node.inputs[0], _c(ctx, node, _float(node, "scale", 1.0), "scale")], outputs=[node.outputs[0]])


@converter("Affine", away=True)
def affine(ctx, node):
    """y = alpha * x + beta."""
    scaled, = ctx.emit("Mul", [node.inputs[0], _c(ctx, node, _float(node, "alpha", 1.0), "alpha")])
    ctx.emit("Add", [scaled, _c(ctx, node, _float(node, "beta", 0.0), "beta")], outputs=[node.outputs[0]])


@converter("ScaledTanh", away=True)
def scaled_tanh(ctx, node):
    """y = alpha * tanh(beta * x)."""
    inner, = ctx.emit("Mul", [node.inputs[0], _c(ctx, node, _float(node, "beta", 1.0), "beta")])
    t, = ctx.emit("Tanh", [inner])
    ctx.emit("Mul", [t, _c(ctx, node, _float(node, "alpha", 1.0), "alpha")], outputs=[node.outputs[0]])


@converter("ParametricSoftplus", away=True)
def parametric_softplus(ctx, node):
    """y = alpha * ln(exp(beta * x) + 1)."""
    inner, = ctx.emit("Mul", [node.inputs[0], _c(ctx, node, _float(node, "beta", 1.0), "beta")])
    s, = ctx.emit("Softplus", [inner])
    ctx.emit("Mul", [s, _c(ctx, node, _float(node, "alpha", 1.0), "alpha")], outputs=[node.outputs[0]])


@converter("Crop", away=True)
def crop(ctx, node):
    """NCHW x cropped by border = (left, top, right, bottom); with scale = (height, width), the crop
    of that size whose top-left corner is (top, left)."""
    x = node.inputs[0]
    if ctx.rank(x) != 4:
        raise ShapeError(f"{node.where()}: Crop takes an NCHW image, got shape {list(ctx.shape(x))}")
    _, _, h, w = ctx.shape(x)
    border = [int(v) for v in node.attrs.get("border", [0, 0, 0, 0])]
    size = [int(v) for v in node.attrs.get("scale", [])]
    if len(border) != 4 or min(border) < 0 or len(size) not in (0, 2):
        raise ModelcError(f"{node.where()}: Crop takes border = (left, top, right, bottom) and an optional "
                          f"scale = (height, width), got border {border}, scale {size}")
    left, top, right, bottom = border
    end = [top + size[0], left + size[1]] if size else [h - bottom, w - right]
    if not (top < end[0] <= h and left < end[1] <= w):
        raise ShapeError(f"{node.where()}: Crop of border {border}{f', scale {size}' if size else ''} does not "
                         f"fit its {h} x {w} input")
    ints = [ctx.const(np.asarray(v, np.int64), f"{node.name}_{k}")
            for k, v in (("starts", [top, left]), ("ends", end), ("axes", [2, 3]))]
    ctx.emit("Slice", [x, *ints], outputs=[node.outputs[0]])


def _fill(ctx, node, values, dtype):
    """ConstantFill's and GivenTensorFill's shapes: the `shape` attribute, the input's shape, or the
    input's (constant) value as a shape; `extra_shape` appended."""
    a = node.attrs
    x = node.inputs[0] if node.inputs else ""
    if not x:
        shape = list(a.get("shape", []))
    elif int(a.get("input_as_shape", 0)):
        v = ctx.value(x)
        if v is None:
            raise ShapeError(f"{node.where()}: its input is the output's shape and must be constant")
        shape = [int(d) for d in np.asarray(v).reshape(-1)]
    else:
        shape = list(ctx.shape(x))
    shape += [int(d) for d in a.get("extra_shape", [])]
    if any(d < 0 for d in shape):
        raise ShapeError(f"{node.where()}: shape {shape} has a negative dimension")
    memory.check({node.outputs[0]: int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize}, node.where())
    values = np.asarray(values, dtype).reshape(-1)
    if values.size == 1:
        arr = np.full(shape, values[0], dtype)
    elif values.size == int(np.prod(shape, dtype=object)):
        arr = values.reshape(shape)
    else:
        raise ShapeError(f"{node.where()}: {values.size} values do not fill shape {shape}")
    ctx.graph.add_const(node.outputs[0], arr)


# ConstantFill's dtype attribute: TensorProto's FLOAT, INT32, INT64, BOOL (ONNX's experimental op)
_FILL_DTYPES = {1: np.float32, 6: np.int32, 7: np.int64, 9: np.bool_}


@converter("ConstantFill", away=True)
def constant_fill(ctx, node):
    dtype = _FILL_DTYPES.get(int(node.attrs.get("dtype", 1)))
    if dtype is None:
        raise ModelcError(f"{node.where()}: ConstantFill dtype {node.attrs.get('dtype')} is not float, int32, "
                          "int64 or bool")
    _fill(ctx, node, [_float(node, "value", 0.0)], dtype)


@converter("GivenTensorFill", away=True)
def given_tensor_fill(ctx, node):
    _fill(ctx, node, [float(v) for v in node.attrs.get("values", [])] or [0.0], np.float32)
