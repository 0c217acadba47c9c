"""Converters for data-movement ops from older opsets to the canonical (newest) forms.

Most rewrites move parameters from attributes to constant inputs (Squeeze/Unsqueeze/Split before
13, Slice before 10, Pad before 11, Clip before 11, Reshape before 5, TopK before 10). The rest
translate semantics: Upsample and Resize-10 become Resize with the coordinate transformation
onnxruntime uses for them, opset<7 `broadcast=1, axis=k` arithmetic becomes numpy broadcasting by
reshaping B, Cast's string `to` becomes the enum, and Dropout is checked to be in inference mode.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ..errors import ModelcError, ShapeError, UnsupportedOpError
from ..ops.cast import onnx_dtype
from ..ops.params import axis_index
from .converters import converter, passthrough


def _without(attrs: dict, *names) -> dict:
    return {k: v for k, v in attrs.items() if k not in names}


def _ints_const(ctx, node, values, what) -> str:
    return ctx.const(np.asarray(values, dtype=np.int64).reshape(-1), f"{node.name}_{what}")


def _unsupported(node, what: str):
    return UnsupportedOpError({what: [node.onnx_name or node.name]})


# ---- attributes that became inputs --------------------------------------------------------------

@converter("Squeeze", since=1)
@converter("Unsqueeze", since=1)
def squeeze_v1(ctx, node):
    axes = node.attrs.get("axes")
    if axes is None and node.op_type == "Unsqueeze":
        raise ModelcError(f"{node.where()} has no axes attribute")
    extra = [] if axes is None else [_ints_const(ctx, node, axes, "axes")]
    ctx.emit(node.op_type, node.inputs[:1] + extra, node.outputs)


converter("Squeeze", since=13)(passthrough)
converter("Unsqueeze", since=13)(passthrough)


@converter("Split", since=1)
def split_v1(ctx, node):
    """Split-1..11 take `split` as an attribute (Split-1 also as an optional input)."""
    split = node.attrs.get("split")
    inputs = node.inputs[:2] if len(node.inputs) > 1 and node.inputs[1] else node.inputs[:1]
    if split is not None and len(inputs) == 1:
        inputs = inputs + [_ints_const(ctx, node, split, "split")]
    _emit_split(ctx, node, inputs)


@converter("Split", since=13)
def split_v13(ctx, node):
    """Split-13..17 divide equally among the outputs when `split` is omitted."""
    _emit_split(ctx, node, node.inputs)


converter("Split", since=18)(passthrough)


def _emit_split(ctx, node, inputs):
    attrs = {"axis": node.attrs.get("axis", 0)}
    if len(inputs) < 2 or not inputs[1]:
        inputs = inputs[:1]
        attrs["num_outputs"] = len(node.outputs)
    ctx.emit("Split", inputs, node.outputs, attrs)


@converter("Slice", since=1)
def slice_v1(ctx, node):
    a = node.attrs
    inputs = [node.inputs[0], _ints_const(ctx, node, a["starts"], "starts"),
              _ints_const(ctx, node, a["ends"], "ends")]
    if "axes" in a:
        inputs.append(_ints_const(ctx, node, a["axes"], "axes"))
    ctx.emit("Slice", inputs, node.outputs)


converter("Slice", since=10)(passthrough)


@converter("Pad", since=1)
def pad_v1(ctx, node):
    """Pad-1 calls its pads `paddings`; both keep pads and the fill value as attributes."""
    a = node.attrs
    pads = a.get("pads", a.get("paddings"))
    if pads is None:
        raise ModelcError(f"{node.where()} has no pads attribute")
    x = node.inputs[0]
    value = ctx.const(np.array(a.get("value", 0.0)).astype(ctx.dtype(x)), f"{node.name}_value")
    ctx.emit("Pad", [x, _ints_const(ctx, node, pads, "pads"), value], node.outputs,
             {"mode": a.get("mode", "constant")})


converter("Pad", since=11)(passthrough)


@converter("Clip", since=1)
def clip_v1(ctx, node):
    """Clip-1/6 keep min and max as attributes; an absent bound means no clipping on that side."""
    x = node.inputs[0]
    bounds = [ctx.const(np.array(node.attrs[k]).astype(ctx.dtype(x)), f"{node.name}_{k}")
              if k in node.attrs else "" for k in ("min", "max")]
    while bounds and not bounds[-1]:
        bounds.pop()
    ctx.emit("Clip", [x] + bounds, node.outputs)


converter("Clip", since=11)(passthrough)


@converter("Reshape", since=1)
def reshape_v1(ctx, node):
    ctx.emit("Reshape", [node.inputs[0], _ints_const(ctx, node, node.attrs["shape"], "shape")],
             node.outputs)


converter("Reshape", since=5)(passthrough)


@converter("Concat", since=1)
def concat_v1(ctx, node):
    ctx.emit("Concat", node.inputs, node.outputs, {"axis": node.attrs.get("axis", 1)})


converter("Concat", since=4)(passthrough)


@converter("TopK", since=1)
def topk_v1(ctx, node):
    k = _ints_const(ctx, node, [node.attrs["k"]], "k")
    ctx.emit("TopK", [node.inputs[0], k], node.outputs, {"axis": node.attrs.get("axis", -1)})


converter("TopK", since=10)(passthrough)


@converter("Tile", since=1)
def tile_v1(ctx, node):
    """Tile-1 repeats along one axis: inputs (input, tiles, axis)."""
    x, tiles, axis = node.inputs[:3]
    t, a = ctx.value(tiles), ctx.value(axis)
    if t is None or a is None:
        raise ShapeError(f"{node.where()}: tiles and axis must be constants")
    reps = [1] * ctx.rank(x)
    reps[int(np.asarray(a).reshape(-1)[0])] = int(np.asarray(t).reshape(-1)[0])
    ctx.emit("Tile", [x, _ints_const(ctx, node, reps, "repeats")], node.outputs)


converter("Tile", since=6)(passthrough)


@converter("Scatter", since=1, away=True)
def scatter(ctx, node):
    """Scatter (opsets 9-10) is ScatterElements without reduction."""
    ctx.emit("ScatterElements", node.inputs, node.outputs, {"axis": node.attrs.get("axis", 0)})


@converter("ReverseSequence", since=10, away=True)
def reverse_sequence(ctx, node):
    """Each batch entry's first sequence_lens[b] steps reversed: a GatherElements along the time axis
    whose index, lens[b] - 1 - t below the entry's length and t past it, folds to a constant when the
    lengths are (a length read at run time outside [0, steps] reads clipped indices, never out of bounds)."""
    x, lens = node.inputs[:2]
    r = ctx.rank(x)
    if r < 2:
        raise ShapeError(f"{node.where()}: its input {x!r} has rank {r}; ReverseSequence needs rank >= 2")
    try:
        bax = axis_index(node.attrs.get("batch_axis", 1), r, "batch_axis")
        tax = axis_index(node.attrs.get("time_axis", 0), r, "time_axis")
    except ValueError as e:
        raise ShapeError(f"{node.where()}: {e}") from None
    if {bax, tax} != {0, 1}:
        raise ShapeError(f"{node.where()}: batch_axis and time_axis must be 0 and 1 in some order, are "
                         f"{node.attrs.get('batch_axis', 1)} and {node.attrs.get('time_axis', 0)}")
    shape = ctx.shape(x)
    steps, batch = shape[tax], shape[bax]
    if tuple(ctx.shape(lens)) != (batch,):
        raise ShapeError(f"{node.where()}: sequence_lens {lens!r} has shape {list(ctx.shape(lens))}, "
                         f"expected [{batch}] (the batch axis)")
    lv = ctx.value(lens)
    if lv is not None and not np.all((0 <= np.asarray(lv)) & (np.asarray(lv) <= steps)):
        raise ShapeError(f"{node.where()}: sequence_lens {np.asarray(lv).tolist()} must lie in [0, {steps}], "
                         "the input's steps")
    along = [1] * r
    along[tax] = steps
    pos = _ints_const(ctx, node, np.arange(steps), "steps")
    pos = ctx.emit("Reshape", [pos, _ints_const(ctx, node, along, "steps_shape")])[0]
    per = [1] * r
    per[bax] = batch
    n = ctx.emit("Cast", [lens], attrs={"to": TensorProto.INT64})[0]
    n = ctx.emit("Reshape", [n, _ints_const(ctx, node, per, "lens_shape")])[0]
    one = ctx.const(np.array(1, np.int64), f"{node.name}_one")
    flipped = ctx.emit("Sub", [ctx.emit("Sub", [n, one])[0], pos])[0]
    idx = ctx.emit("Where", [ctx.emit("Less", [pos, n])[0], flipped, pos])[0]
    idx = ctx.emit("Expand", [idx, _ints_const(ctx, node, shape, "shape")])[0]
    ctx.emit("GatherElements", [x, idx], node.outputs, {"axis": tax})


# ---- semantic changes ---------------------------------------------------------------------------

@converter("Cast", since=1)
def cast(ctx, node):
    """Cast-1..5 name the target type as a string; types modelc does not compute in are refused."""
    to = node.attrs["to"]
    if isinstance(to, str):
        try:
            to = TensorProto.DataType.Value(to.upper())
        except ValueError:
            raise ModelcError(f"{node.where()}: unknown type {to!r}") from None
    if int(to) not in TensorProto.DataType.values():
        raise ModelcError(f"{node.where()}: attribute 'to' = {to} is not an ONNX element type")
    try:
        onnx_dtype(to)
    except ValueError:
        raise _unsupported(node, f"Cast(to={TensorProto.DataType.Name(int(to))})") from None
    ctx.emit("Cast", node.inputs, node.outputs, {**node.attrs, "to": int(to)})


@converter("Dropout", since=1)
def dropout(ctx, node):
    """Dropout-1..11 keep ratio (and is_test) as attributes. Their training flag `is_test=0` is
    ignored: inference is the only meaning a compiled model can have. Before opset 10 the mask
    had the input's type rather than bool."""
    x = node.inputs[0]
    outs = list(node.outputs)
    mask = outs[1] if len(outs) > 1 and outs[1] else None
    if mask is None or ctx.opset >= 10:
        ctx.emit("Dropout", [x], outs[:2] if mask else outs[:1])
        return
    m = ctx.emit("Dropout", [x], [outs[0], ctx.graph.fresh_name(f"{node.name}_mask")])[1]
    ctx.emit("Cast", [m], [mask], {"to": int(_onnx_type(ctx.dtype(x)))})


@converter("Dropout", since=12)
def dropout_v12(ctx, node):
    """Only inference is supported: training_mode must be absent, false, or come with ratio 0."""
    ins = list(node.inputs) + [""] * (3 - len(node.inputs))
    if ins[2]:
        t = ctx.value(ins[2])
        if t is None:
            raise _unsupported(node, "Dropout(training_mode given at run time)")
        r = ctx.value(ins[1]) if ins[1] else np.array(0.5)
        if bool(np.asarray(t)) and (r is None or float(np.asarray(r)) != 0.0):
            raise _unsupported(node, "Dropout(training_mode=1)")
    ctx.emit_node(node)


def _onnx_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


# ---- Upsample and old Resize --------------------------------------------------------------------

@converter("Upsample", since=1, away=True)
def upsample(ctx, node):
    """Upsample-7 (scales attribute), -9 (scales input), -1 (height_scale/width_scale): asymmetric
    coordinates and floor rounding, as onnxruntime computes them."""
    a = node.attrs
    x = node.inputs[0]
    if "scales" in a:
        scales = np.asarray(a["scales"], np.float32)
    elif len(node.inputs) > 1 and node.inputs[1]:
        scales = ctx.value(node.inputs[1])
        if scales is None:
            raise ShapeError(f"{node.where()}: scales decide the output shape and must be constant")
    elif "height_scale" in a:
        scales = np.ones(ctx.rank(x), np.float32)
        scales[-2:] = [a["height_scale"], a["width_scale"]]
    else:
        raise ModelcError(f"{node.where()} has no scales")
    _legacy_resize(ctx, node, x, np.asarray(scales, np.float32).reshape(-1), a.get("mode", "nearest"))


@converter("Resize", since=10)
def resize_v10(ctx, node):
    scales = ctx.value(node.inputs[1])
    if scales is None:
        raise ShapeError(f"{node.where()}: scales decide the output shape and must be constant")
    _legacy_resize(ctx, node, node.inputs[0], np.asarray(scales, np.float32).reshape(-1),
                   node.attrs.get("mode", "nearest"))


converter("Resize", since=11)(passthrough)


def _legacy_resize(ctx, node, x, scales, mode):
    """Resize-10/Upsample: asymmetric; nearest rounds down on upsampled axes and up on
    downsampled ones (onnxruntime's rule), so mixed scales become two Resizes over disjoint axes."""
    mode = {"bilinear": "linear"}.get(mode, mode)
    if mode not in ("nearest", "linear"):
        raise _unsupported(node, f"{node.op_type}(mode={mode})")
    if len(scales) != ctx.rank(x):
        raise ShapeError(f"{node.where()}: {len(scales)} scales for an input of rank {ctx.rank(x)}")
    attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric"}
    if mode == "linear" or (scales >= 1).all() or (scales < 1).all():
        rounding = "floor" if (scales >= 1).all() else "ceil"
        ctx.emit("Resize", [x, "", ctx.const(scales, f"{node.name}_scales")], node.outputs,
                 {**attrs, "nearest_mode": rounding})
        return
    groups = [("floor", np.flatnonzero(scales >= 1)), ("ceil", np.flatnonzero(scales < 1))]
    for i, (rounding, axes) in enumerate(groups):
        outs = node.outputs if i == len(groups) - 1 else None
        x = ctx.emit("Resize", [x, "", ctx.const(scales[axes], f"{node.name}_scales")], outs,
                     {**attrs, "nearest_mode": rounding, "axes": [int(v) for v in axes]})[0]


# ---- opset < 7 broadcasting ---------------------------------------------------------------------

LEGACY_BROADCAST_OPS = ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater",
                        "Less")


def legacy_broadcast(ctx, node):
    """`broadcast=1, axis=k` aligns B with A's dims starting at k; trailing 1s in B's shape make
    numpy broadcasting do the same. `consumed_inputs` (opset 1) has no meaning any more."""
    a, b = node.inputs[:2]
    attrs = _without(node.attrs, "broadcast", "axis", "consumed_inputs")
    if node.attrs.get("broadcast", 0):
        ra, sb = ctx.rank(a), ctx.shape(b)
        axis = node.attrs.get("axis", ra - len(sb))
        axis = axis + ra if axis < 0 else axis
        trailing = ra - axis - len(sb)
        if trailing < 0 or axis < 0:
            raise ShapeError(f"{node.where()}: B{list(sb)} does not fit A{list(ctx.shape(a))} "
                             f"at axis {node.attrs.get('axis')}")
        if trailing:
            shape = tuple(sb) + (1,) * trailing
            value = ctx.graph.value(b)
            b = (ctx.const(value.reshape(shape), f"{node.name}_b") if value is not None else
                 ctx.emit("Reshape", [b, _ints_const(ctx, node, shape, "shape")])[0])
    ctx.emit(node.op_type, [a, b], node.outputs, attrs)


for _op in LEGACY_BROADCAST_OPS:
    converter(_op, since=1)(legacy_broadcast)
    converter(_op, since=7)(passthrough)


@converter("PRelu", since=1)
def prelu_v1(ctx, node):
    """PRelu-1/6 apply a 1-D slope of C entries per channel (axis 1); PRelu-7 broadcasts it
    numpy-style from the right, so it becomes (C, 1, ..., 1)."""
    x, slope = node.inputs[:2]
    rank, s = ctx.rank(x), ctx.shape(slope)
    if len(s) == 1 and rank > 2 and s[0] != 1 and s[0] == ctx.shape(x)[1]:
        shape = (s[0],) + (1,) * (rank - 2)
        value = ctx.graph.value(slope)
        slope = (ctx.const(value.reshape(shape), f"{node.name}_slope") if value is not None else
                 ctx.emit("Reshape", [slope, _ints_const(ctx, node, shape, "shape")])[0])
    ctx.emit("PRelu", [x, slope], node.outputs)


converter("PRelu", since=7)(passthrough)
