"""Converters for the neural-network, linear-algebra and reduction ops of older opsets.

Each rewrites an old form into the canonical (newest) one: axes attributes become constant
inputs, Softmax's 2-D coercion (before opset 13) becomes Reshape + single-axis op + Reshape, and
attributes that only matter for training are dropped. Forms that train are refused as unsupported.
"""
from __future__ import annotations

import functools

import numpy as np

from ..errors import ModelcError, ShapeError, UnsupportedOpError
from .convert_tensor import _ints_const
from .converters import converter, passthrough


def _unsupported(node, what: str):
    return UnsupportedOpError({f"{node.op_type}({what})": [node.onnx_name or node.name]})


def _emit_as(ctx, node, op_type, inputs, attrs):
    """Emit the canonical `op_type` producing the node's own outputs."""
    ctx.emit(op_type, inputs, outputs=list(node.outputs), attrs=attrs)


# ---- Softmax / LogSoftmax / Hardmax before 13: flatten to 2-D at `axis` -----------------------

def _coerced_softmax(ctx, node):
    x = node.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    axis = int(node.attr("axis", 1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis <= rank:
        raise ShapeError(f"{node.where()}: axis {node.attr('axis')} is out of range for "
                         f"rank {rank}")
    if axis == rank - 1 or rank == 0:
        _emit_as(ctx, node, node.op_type, [x], {"axis": -1})
        return
    # axis == rank works too: rows of one element each
    rows, cols = int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))
    x2, = ctx.emit("Reshape", [x, ctx.const(np.array([rows, cols], np.int64), "shape")])
    y2, = ctx.emit(node.op_type, [x2], attrs={"axis": -1})
    ctx.emit("Reshape", [y2, ctx.const(np.array(shape, np.int64), "shape")],
             outputs=[node.outputs[0]])


for _op in ("Softmax", "LogSoftmax", "Hardmax"):
    converter(_op, since=1)(_coerced_softmax)
    converter(_op, since=13)(passthrough)


# ---- Reduce*: axes attribute -> constant input ----------------------------------------------

def _reduce_axes_attr(ctx, node):
    attrs = dict(node.attrs)
    axes = attrs.pop("axes", None)
    inputs = [node.inputs[0]]
    if axes is not None:
        inputs.append(ctx.const(np.array(axes, np.int64).reshape(-1), "axes"))
    _emit_as(ctx, node, node.op_type, inputs, attrs)


_AXES_AS_INPUT = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18,
                  "ReduceProd": 18, "ReduceL1": 18, "ReduceL2": 18, "ReduceLogSum": 18,
                  "ReduceLogSumExp": 18, "ReduceSumSquare": 18}

for _op, _since in _AXES_AS_INPUT.items():
    converter(_op, since=1)(_reduce_axes_attr)
    converter(_op, since=_since)(passthrough)


# ---- BatchNormalization ----------------------------------------------------------------------

@converter("BatchNormalization", since=1)
def batch_normalization(ctx, node):
    """Inference-only BatchNormalization from any opset.

    Before opset 14 training is signalled by asking for the extra outputs (saved/running
    statistics); from 14 by training_mode=1. spatial=0 (per-activation statistics, opsets < 9)
    is rewritten into broadcasting elementwise ops.
    """
    if int(node.attr("training_mode", 0)):
        raise _unsupported(node, "training_mode=1")
    if any(node.outputs[1:]):
        raise _unsupported(node, "training outputs")
    x, scale, b, mean, var = node.inputs[:5]
    eps = float(node.attr("epsilon", 1e-5))
    if int(node.attr("spatial", 1)) == 0 and len(ctx.shape(scale)) != 1:
        _per_activation_batchnorm(ctx, node, x, scale, b, mean, var, eps)
        return
    ctx.emit("BatchNormalization", [x, scale, b, mean, var], outputs=[node.outputs[0]],
             attrs={"epsilon": eps})


def _per_activation_batchnorm(ctx, node, x, scale, b, mean, var, eps):
    """y = (x - mean) / sqrt(var + eps) * scale + b with (C, D1, ...) parameters broadcasting."""
    dtype = ctx.dtype(x)
    std, = ctx.emit("Sqrt", ctx.emit("Add", [var, ctx.const(np.array(eps, dtype), "eps")]))
    centred, = ctx.emit("Sub", [x, mean])
    normed, = ctx.emit("Div", [centred, std])
    scaled, = ctx.emit("Mul", [normed, scale])
    ctx.emit("Add", [scaled, b], outputs=[node.outputs[0]])


# ---- Gemm before 7: `broadcast` attribute ----------------------------------------------------

@converter("Gemm", since=1)
def gemm_broadcast_attr(ctx, node):
    attrs = {k: v for k, v in node.attrs.items() if k != "broadcast"}
    _emit_as(ctx, node, "Gemm", node.inputs, attrs)


converter("Gemm", since=7)(passthrough)


# ---- InstanceNormalization-1: consumed_inputs ------------------------------------------------

@converter("InstanceNormalization", since=1)
def instance_normalization(ctx, node):
    attrs = {k: v for k, v in node.attrs.items() if k != "consumed_inputs"}
    _emit_as(ctx, node, "InstanceNormalization", node.inputs, attrs)


converter("InstanceNormalization", since=6)(passthrough)


# ---- GroupNormalization-18: scale and bias per group, not per channel ------------------------

@converter("GroupNormalization", since=18)
def group_normalization_per_group(ctx, node):
    x, scale, b = node.inputs[:3]
    groups = int(node.attr("num_groups"))
    c = ctx.shape(x)[1]
    if groups < 1 or c % groups:
        raise ShapeError(f"{node.where()}: {c} channels do not split into {groups} groups")
    per_channel = []
    for t in (scale, b):
        v = ctx.value(t)
        if v is not None:
            per_channel.append(ctx.const(np.repeat(v, c // groups), t))
        else:
            idx = ctx.const(np.arange(c, dtype=np.int64) // (c // groups), "group_of_channel")
            per_channel.append(ctx.emit("Gather", [t, idx], attrs={"axis": 0})[0])
    _emit_as(ctx, node, "GroupNormalization", [x, *per_channel], node.attrs)


converter("GroupNormalization", since=21)(passthrough)


@converter("GridSample", since=16)
def grid_sample_v16(ctx, node):
    """GridSample-16 names its modes bilinear and bicubic; from 20 they are linear and cubic (and the
    input may be N-d)."""
    attrs = dict(node.attrs)
    mode = attrs.get("mode", "bilinear")
    if mode in ("linear", "cubic"):
        raise ModelcError(f"{node.where()}: GridSample-16 has no mode {mode!r} (bilinear, nearest, bicubic)")
    attrs["mode"] = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    ctx.emit("GridSample", node.inputs, node.outputs, attrs)


converter("GridSample", since=20)(passthrough)


@converter("MaxUnpool", since=9, away=True)
def max_unpool(ctx, node):
    """Y = zeros of the unpooled shape, Y.flat[I] = X (MaxPool's indices count over the whole tensor):
    a ScatterElements into the flattened zeros; indices read at run time are clipped into Y."""
    ins = list(node.inputs) + [""] * 3
    x, idx, shape_in = ins[:3]
    shape = ctx.shape(x)
    k = list(node.attrs.get("kernel_shape", []))
    nd = len(shape) - 2
    if len(k) != nd or nd < 1:
        raise ShapeError(f"{node.where()}: kernel_shape {k} does not match its input's {nd} spatial axes")
    strides = list(node.attrs.get("strides", [1] * nd))
    pads = list(node.attrs.get("pads", [0] * 2 * nd))
    if tuple(ctx.shape(idx)) != tuple(shape):
        raise ShapeError(f"{node.where()}: its indices {idx!r} have shape {list(ctx.shape(idx))}, its input "
                         f"{list(shape)}")
    out = list(shape[:2]) + [(shape[2 + d] - 1) * strides[d] + k[d] - pads[d] - pads[nd + d] for d in range(nd)]
    if min(out) < 1:
        raise ShapeError(f"{node.where()}: output shape {out} for an input of shape {list(shape)}")
    if shape_in:
        v = ctx.value(shape_in)
        if v is None or [int(d) for d in np.asarray(v).reshape(-1)] != out:
            # onnxruntime (and PyTorch's exports) read the indices in output_shape's layout, ONNX's
            # reference in the pooled shape's, then pads: where they differ, no answer is agreed
            raise _unsupported(node, "output_shape other than the unpooled shape")
    flat = ctx.const(np.array([-1], np.int64), f"{node.name}_flat")
    zeros = ctx.const(np.zeros(int(np.prod(out)), ctx.dtype(x)), f"{node.name}_zeros")
    y = ctx.emit("ScatterElements", [zeros, ctx.emit("Reshape", [idx, flat])[0],
                                     ctx.emit("Reshape", [x, flat])[0]], attrs={"axis": 0})[0]
    ctx.emit("Reshape", [y, ctx.const(np.asarray(out, np.int64), f"{node.name}_shape")], node.outputs)


@converter("Col2Im", since=18, away=True)
def col2im(ctx, node):
    """torch.nn.Fold: each column's block added into the image where it was taken from, as a
    ScatterElements with addition into the flattened zeros (elements that fall in the padding go to
    one extra slot, cut off after), its index a constant of the input's size."""
    x, image, block = node.inputs[:3]
    iv, bv = ctx.value(image), ctx.value(block)
    if iv is None or bv is None:
        raise ShapeError(f"{node.where()}: image_shape and block_shape must be constants")
    img, blk = [int(v) for v in np.ravel(iv)], [int(v) for v in np.ravel(bv)]
    nd = len(img)
    strides = list(node.attrs.get("strides", [1] * nd))
    dil = list(node.attrs.get("dilations", [1] * nd))
    pads = list(node.attrs.get("pads", [0] * 2 * nd))
    shape = ctx.shape(x)
    k = int(np.prod(blk))
    blocks = [(img[d] + pads[d] + pads[nd + d] - dil[d] * (blk[d] - 1) - 1) // strides[d] + 1 for d in range(nd)]
    if len(blk) != nd or len(shape) != 3 or shape[1] % k or min(blocks) < 1 or shape[2] != int(np.prod(blocks)):
        raise ShapeError(f"{node.where()}: an input of shape {list(shape)} is not the columns of {blk} blocks "
                         f"of an image {img} (strides {strides}, dilations {dil}, pads {pads})")
    n, c = shape[0], shape[1] // k
    offs = np.indices(blk).reshape(nd, k, 1)                     # each element's place in its block
    where = np.indices(blocks).reshape(nd, 1, -1)                # each column's block
    pos = where * np.reshape(strides, (nd, 1, 1)) - np.reshape(pads[:nd], (nd, 1, 1)) + \
        offs * np.reshape(dil, (nd, 1, 1))                        # [nd, k, L]
    inside = np.all((pos >= 0) & (pos < np.reshape(img, (nd, 1, 1))), axis=0)
    size = int(np.prod(img))
    flat = np.where(inside, np.ravel_multi_index(tuple(np.clip(pos, 0, None)), img, mode="clip"), -1)
    base = (np.arange(n * c) * (size + 1)).reshape(n, c, 1, 1)
    idx = np.where(flat >= 0, base + flat, base + size).reshape(-1).astype(np.int64)
    i64 = functools.partial(_ints_const, ctx, node)
    zeros = ctx.const(np.zeros(n * c * (size + 1), ctx.dtype(x)), f"{node.name}_zeros")
    cols = ctx.emit("Reshape", [x, i64([-1], "flat")])[0]
    y = ctx.emit("ScatterElements", [zeros, i64(idx, "index"), cols], attrs={"axis": 0, "reduction": "add"})[0]
    y = ctx.emit("Reshape", [y, i64([n, c, size + 1], "slots")])[0]
    y = ctx.emit("Slice", [y, i64([0], "s0"), i64([size], "s1"), i64([2], "s2")])[0]
    ctx.emit("Reshape", [y, i64([n, c] + img, "shape")], node.outputs)
