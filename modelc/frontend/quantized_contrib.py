"""onnxruntime's quantized contrib ops (domain com.microsoft), which its quantizer writes in the
QOperator format and the ONNX zoo's int8 models hold (QLinearAdd, QLinearGlobalAveragePool, QGemm ...).

ONNX has no schema for them, so each converter checks its node against onnxruntime's definition
(docs/ContribOperators.md): inputs, required ones present, attributes known. Each is the float op it
quantizes, between a dequantize of its inputs and a quantize of its output, as onnxruntime defines
them; QGemm, an integer product, is summed exactly like QLinearMatMul (quantized.py).
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelcError, ModelLoadError
from . import quantized as q
from .converters import converter

CONTRIB_DOMAIN = "com.microsoft"

# op -> (inputs at least, at most, required input indices, attributes)
CONTRIB_OPS = {
    "QuantizeLinear": (2, 3, (0, 1), {"axis"}),
    "DequantizeLinear": (2, 3, (0, 1), {"axis"}),
    "QLinearAdd": (7, 8, (0, 1, 3, 4, 6), set()),
    "QLinearMul": (7, 8, (0, 1, 3, 4, 6), set()),
    "QLinearGlobalAveragePool": (5, 5, (0, 1, 3), {"channels_last"}),
    "QLinearAveragePool": (4, 5, (0, 1, 3), {"auto_pad", "ceil_mode", "channels_last", "count_include_pad",
                                             "kernel_shape", "pads", "strides"}),
    "QLinearSigmoid": (4, 5, (0, 1, 3), set()),
    "QLinearLeakyRelu": (4, 5, (0, 1, 3), {"alpha"}),
    "QLinearSoftmax": (4, 5, (0, 1, 3), {"axis", "opset"}),
    "QLinearConcat": (5, 2 + 3 * 4096, (0,), {"axis"}),
    "QGemm": (6, 9, (0, 1, 3, 4), {"alpha", "transA", "transB"}),
    "MatMulIntegerToFloat": (4, 7, (0, 1, 2, 3), set()),
}


def check_contrib(n, index: int):
    """Raise ModelLoadError unless contrib node `n` fits onnxruntime's definition of its op."""
    lo, hi, required, attrs = CONTRIB_OPS[n.op_type]
    where = f"node {n.name or '#' + str(index)!r} ({CONTRIB_DOMAIN}.{n.op_type})"
    ins = list(n.input)
    if not lo <= len(ins) <= hi:
        raise ModelLoadError(f"{where} has {len(ins)} inputs; onnxruntime's {n.op_type} takes "
                             f"{lo} to {hi}")
    missing = [k for k in required if not ins[k]]
    if missing:
        raise ModelLoadError(f"{where} lacks its required input(s) {missing}")
    if n.op_type == "QLinearConcat" and (len(ins) - 2) % 3:
        raise ModelLoadError(f"{where}: inputs after y_scale and y_zero_point come in threes "
                             f"(tensor, scale, zero point), got {len(ins) - 2}")
    extra = sorted({a.name for a in n.attribute} - attrs)
    if extra:
        raise ModelLoadError(f"{where} has attribute(s) {extra}, which onnxruntime's {n.op_type} does "
                             f"not define (its attributes: {', '.join(sorted(attrs)) or 'none'})")
    if len(n.output) != 1 or not n.output[0]:
        raise ModelLoadError(f"{where} must name exactly one output")


def _zp(node, k: int) -> str:
    return node.inputs[k] if len(node.inputs) > k else ""


def _deq(ctx, node, x, scale, zp) -> str:
    out = ctx.graph.fresh_name(f"{node.name}_dq")
    q.dequantize(ctx, node, x, scale, zp, [out], dtype=np.float32)
    return out


def _out_dtype(ctx, node, zp: str, x: str):
    return ctx.dtype(zp) if zp else ctx.dtype(x)


def _binary(op_type):
    def convert(ctx, node):
        a, as_, azp, b, bs, bzp, cs = node.inputs[:7]
        czp = _zp(node, 7)
        v, = ctx.emit(op_type, [_deq(ctx, node, a, as_, azp), _deq(ctx, node, b, bs, bzp)])
        q.quantize(ctx, node, v, cs, czp, _out_dtype(ctx, node, czp, a), node.outputs)
    return convert


@converter("QLinearAdd", away=True)
def _add(ctx, node):
    """MLAS's arithmetic, two fused multiply-adds: a * (sa/sc) + (b * (sb/sc) + fixed), fixed =
    zc - (za * sa/sc + zb * sb/sc) (the inner sum an FMA too), rounded. The same sum as
    Q(DQ(a) + DQ(b)) but rounded differently: 5 of 25,088 values of a ResNet-18 block were a step
    off that way; this form matched onnxruntime on all 256 x 256 input pairs of 30 random scales.
    With scales known only at run time: that other form."""
    a, as_, azp, b, bs, bzp, cs = node.inputs[:7]
    czp = _zp(node, 7)
    vals = [ctx.value(t) if t else np.zeros((), ctx.dtype(a)) for t in (as_, azp, bs, bzp, cs, czp)]
    if any(v is None or np.size(v) != 1 for v in vals):
        return _binary("Add")(ctx, node)
    sa, za, sb, zb, sc, zc = (np.float32(np.ravel(v)[0]) for v in vals)
    rac, rbc = np.float32(sa / sc), np.float32(sb / sc)
    inner = np.float32(np.float64(rac) * np.float64(za) + np.float64(np.float32(rbc * zb)))   # fma
    c = lambda v, hint: ctx.const(np.array(v, np.float32), f"{node.name}_{hint}")  # noqa: E731
    tb, = ctx.emit("MulAdd", [q.as_float(ctx, b), c(rbc, "ratio_b"), c(np.float32(zc - inner), "fixed")])
    v, = ctx.emit("MulAdd", [q.as_float(ctx, a), c(rac, "ratio_a"), tb])
    q.saturate(ctx, node, v, "", _out_dtype(ctx, node, czp, a), node.outputs)


converter("QLinearMul", away=True)(_binary("Mul"))


def _unary(build):
    """X -> Q(f(DQ(X))) for an f that `build(ctx, node, x_float)` emits."""
    def convert(ctx, node):
        x, xs, xzp, ys = node.inputs[:4]
        yzp = _zp(node, 4)
        v = build(ctx, node, _deq(ctx, node, x, xs, xzp))
        q.quantize(ctx, node, v, ys, yzp, _out_dtype(ctx, node, yzp, x), node.outputs)
    return convert


def _channels_last(ctx, node, x: str, fn) -> str:
    """fn over an NCHW view of a channels-last x, its result moved back to channels last."""
    if not int(node.attrs.get("channels_last", 0)):
        return fn(x)
    rank = len(ctx.shape(x))
    to_first = [0, rank - 1, *range(1, rank - 1)]
    t, = ctx.emit("Transpose", [x], attrs={"perm": to_first})
    y = fn(t)
    return ctx.emit("Transpose", [y], attrs={"perm": [0, *range(2, rank), 1]})[0]


@converter("QLinearGlobalAveragePool", away=True)
@_unary
def _global_average(ctx, node, x):
    return _channels_last(ctx, node, x, lambda t: ctx.emit("GlobalAveragePool", [t])[0])


@converter("QLinearAveragePool", away=True)
@_unary
def _average(ctx, node, x):
    attrs = {k: v for k, v in node.attrs.items() if k != "channels_last"}
    return _channels_last(ctx, node, x, lambda t: ctx.emit("AveragePool", [t], attrs=attrs)[0])


@converter("QLinearSigmoid", away=True)
@_unary
def _sigmoid(ctx, node, x):
    return ctx.emit("Sigmoid", [x])[0]


@converter("QLinearLeakyRelu", away=True)
@_unary
def _leaky_relu(ctx, node, x):
    return ctx.emit("LeakyRelu", [x], attrs={"alpha": float(node.attrs.get("alpha", 0.01))})[0]


@converter("QLinearSoftmax", away=True)
@_unary
def _softmax(ctx, node, x):
    """`opset` names the Softmax whose axis semantics apply: before 13, rows flattened at `axis`."""
    rank = len(ctx.shape(x))
    axis = int(node.attrs.get("axis", -1 if int(node.attrs.get("opset", 13)) >= 13 else 1))
    if not -rank <= axis < max(rank, 1):
        raise ModelcError(f"{node.where()}: axis {axis} is out of range for rank {rank}")
    axis %= max(rank, 1)
    if int(node.attrs.get("opset", 13)) >= 13 or axis == rank - 1:
        return ctx.emit("Softmax", [x], attrs={"axis": axis})[0]
    shape = ctx.shape(x)
    rows = int(np.prod(shape[:axis]))
    x2, = ctx.emit("Reshape", [x, ctx.const(np.array([rows, -1], np.int64), "shape")])
    y2, = ctx.emit("Softmax", [x2], attrs={"axis": -1})
    return ctx.emit("Reshape", [y2, ctx.const(np.array(shape, np.int64), "shape")])[0]


@converter("QLinearConcat", away=True)
def _concat(ctx, node):
    ys, yzp = node.inputs[:2]
    parts = node.inputs[2:]
    xs = [_deq(ctx, node, *parts[k:k + 3]) for k in range(0, len(parts), 3)]
    v, = ctx.emit("Concat", xs, attrs={"axis": int(node.attrs.get("axis", 0))})
    q.quantize(ctx, node, v, ys, yzp, _out_dtype(ctx, node, yzp, parts[0]), node.outputs)


@converter("QGemm", away=True)
def _qgemm(ctx, node):
    """alpha * (A - a_zp) @ (B - b_zp) + C, C an int32 bias at scale a_scale * b_scale; quantized
    with y_scale and y_zero_point, or dequantized to float32 when no y_scale is given."""
    a, as_, azp, b, bs, bzp = node.inputs[:6]
    c, ys, yzp = (list(node.inputs[6:9]) + ["", "", ""])[:3]
    for t in (a, b):
        if len(ctx.shape(t)) != 2:
            raise ModelcError(f"{node.where()}: QGemm multiplies matrices, got {t!r} of shape {list(ctx.shape(t))}")
    ai = q.centered(ctx, node, a, azp, axis=1 if int(node.attrs.get("transA", 0)) else 0)
    bi = q.centered(ctx, node, b, bzp, axis=0 if int(node.attrs.get("transB", 0)) else 1)
    attrs = {k: int(node.attrs.get(k, 0)) for k in ("transA", "transB")}
    if not attrs["transA"]:
        attrs.update(q.eight_bit(ctx, a, azp, b, bzp, axis=0 if attrs["transB"] else 1))
    if "x_min" in attrs:
        attrs["exact"] = 1
    acc, = ctx.emit("Gemm", [ai, bi] + ([q.as_float(ctx, c)] if c else []), attrs=attrs)
    alpha = float(node.attrs.get("alpha", 1.0))
    scales = [(as_, 0), (bs, 1)]
    if alpha != 1.0:
        scales.append((ctx.const(np.array(alpha, np.float32), f"{node.name}_alpha"), 0))
    if ys:
        q.requantize(ctx, node, acc, scales, ys, yzp, node.outputs)
        return
    m = q.scale_product(ctx, node, scales, ctx.shape(acc))
    ctx.emit("Mul", [acc, m], outputs=[node.outputs[0]], attrs=q.EXACT)


@converter("MatMulIntegerToFloat", away=True)
def _matmul_integer_to_float(ctx, node):
    """(A - a_zp) @ (B - b_zp) * (a_scale * b_scale) [+ bias], the product exact in float32."""
    a, b, as_, bs = node.inputs[:4]
    azp, bzp, bias = (list(node.inputs[4:7]) + ["", "", ""])[:3]
    acc = q.int_matmul(ctx, node, a, azp, b, bzp)
    rank = len(ctx.shape(acc))
    m = q.scale_product(ctx, node, [(as_, max(rank - 2, 0)), (bs, rank - 1)], ctx.shape(acc))
    if not bias:
        ctx.emit("Mul", [acc, m], outputs=[node.outputs[0]], attrs=q.EXACT)
        return
    y, = ctx.emit("Mul", [acc, m])
    ctx.emit("Add", [y, q.as_float(ctx, bias)], outputs=[node.outputs[0]])
