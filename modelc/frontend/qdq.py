"""QDQ models (DequantizeLinear -> float op -> QuantizeLinear, the format onnxruntime's quantizer
writes by default and PyTorch exports) read as the quantized ops the groups stand for.

Taken literally, a QDQ Conv sums float products of dequantized values and rounds them again; onnx-
runtime never does: its graph optimiser fuses each group into the integer op (DQ -> Conv -> Q
becomes QLinearConv, DQ -> Add -> Q a QLinearAdd ...) and computes that. The two differ by a
step of the quantized tensors wherever a sum lies near a rounding tie, and deep networks carry
those steps along (a ResNet-18 QDQ export: 6% of its output's scale between onnxruntime's optimised
and unoptimised runs). So modelc fuses the same groups, before import, into the ops quantized.py
and quantized_contrib.py compute as onnxruntime does, and a QDQ model gives onnxruntime's result.

A group fuses only when it is exactly the integer op: every input of the float op comes from a
DequantizeLinear, its one consumer is a QuantizeLinear (a ReLU between them is dropped when the
quantization's zero point already clamps at zero), no tensor of the group but the Q's output is a
graph output, and a bias is an int32 constant at scale x_scale * w_scale. Unfused groups stay
as they are and run by the spec's arithmetic.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .quantized_contrib import CONTRIB_DOMAIN

# float op -> (quantized op, its domain)
_BINARY = {"Add": "QLinearAdd", "Mul": "QLinearMul"}
_UNARY = {"GlobalAveragePool": "QLinearGlobalAveragePool", "AveragePool": "QLinearAveragePool",
          "Sigmoid": "QLinearSigmoid", "LeakyRelu": "QLinearLeakyRelu"}
_INT8 = (onnx.TensorProto.UINT8, onnx.TensorProto.INT8)


class _View:
    """Producers, consumers and constants of one graph, for matching groups."""

    def __init__(self, g: onnx.GraphProto):
        self.g = g
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.consumers: dict[str, list] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
            for sub in (a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH):
                for inner in sub.node:               # subgraphs read outer tensors by name
                    for i in inner.input:
                        self.consumers.setdefault(i, []).append(n)
        self.consts = {t.name: t for t in g.initializer}
        for n in g.node:                 # (exporters also write scales as Constant nodes)
            value = next((a.t for a in n.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and value is not None and n.output:
                self.consts.setdefault(n.output[0], value)
        self.outputs = {o.name for o in g.output}
        self.elem = {name: t.data_type for name, t in self.consts.items()}
        for vi in list(g.input) + list(g.value_info):
            self.elem.setdefault(vi.name, vi.type.tensor_type.elem_type)

    def elem_type(self, tensor: str):
        """The element type of a tensor: declared, or a QuantizeLinear's (its zero point's type,
        its output_dtype, else uint8). (A chain of them is followed at most as long as the graph:
        a crafted model may loop.)"""
        for _ in range(len(self.g.node) + 1):
            if self.elem.get(tensor):
                return self.elem[tensor]
            p = self.producer.get(tensor)
            if p is None or p.op_type != "QuantizeLinear":
                return None
            if len(p.input) < 3 or not p.input[2]:
                out = next((a.i for a in p.attribute if a.name == "output_dtype" and a.i), 0)
                return out or onnx.TensorProto.UINT8
            tensor = p.input[2]
        return None

    def dq(self, tensor: str):
        """The DequantizeLinear producing `tensor`, if it has one of ONNX's default domain."""
        p = self.producer.get(tensor)
        return p if p is not None and p.op_type == "DequantizeLinear" and p.domain in ("", "ai.onnx") else None

    def only_q(self, tensor: str):
        """The QuantizeLinear that is `tensor`'s single reader, if so and it is no graph output."""
        readers = self.consumers.get(tensor, [])
        if tensor in self.outputs or len(readers) != 1:
            return None
        q = readers[0]
        return q if q.op_type == "QuantizeLinear" and q.domain in ("", "ai.onnx") and q.input[0] == tensor else None

    def value(self, name: str):
        return numpy_helper.to_array(self.consts[name]) if name in self.consts else None


def _params(dq) -> list:
    """(tensor, scale, zero point) of a DequantizeLinear; a missing zero point stays ''."""
    return [dq.input[0], dq.input[1], dq.input[2] if len(dq.input) > 2 else ""]


def _axis(node) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 1)


def _per_tensor(v: _View, node) -> bool:
    """A DQ or Q with one constant scale."""
    s = v.value(node.input[1])
    return s is not None and s.size == 1 and not any(a.name == "block_size" and a.i for a in node.attribute)


def _zp_name(v: _View, g: onnx.GraphProto, node, like: str, hint: str) -> str:
    """The node's zero point, or a constant 0 of the quantized tensor's type where it omits it."""
    if len(node.input) > 2 and node.input[2]:
        return node.input[2]
    elem = v.elem_type(like) or onnx.TensorProto.UINT8
    name = f"{hint}_zero_point"
    k = 0
    while name in v.producer or name in v.consts:
        k += 1
        name = f"{hint}_zero_point_{k}"
    t = numpy_helper.from_array(np.zeros((), helper.tensor_dtype_to_np_dtype(elem)), name)
    g.initializer.append(t)
    v.consts[name] = t
    return name


def _through_relu(v: _View, out: str):
    """(the Q after `out`, nodes dropped): directly, or through a ReLU the Q's clamp makes redundant."""
    q = v.only_q(out)
    if q is not None:
        return q, []
    readers = v.consumers.get(out, [])
    if out in v.outputs or len(readers) != 1 or readers[0].op_type != "Relu":
        return None, []
    relu = readers[0]
    q = v.only_q(relu.output[0])
    if q is None or len(q.input) < 3 or not q.input[2] or v.value(q.input[2]) is None:
        return None, []
    zp = v.value(q.input[2])
    lowest = np.iinfo(zp.dtype).min if zp.dtype.kind in "iu" else None
    return (q, [relu]) if lowest is not None and zp.size == 1 and int(zp) == lowest else (None, [])


def _bias_ok(v: _View, b_dq, x_dq, w_dq) -> bool:
    """An int32 constant bias, zero point 0, at scale x_scale * w_scale (as the quantizer writes)."""
    b, bs = v.value(b_dq.input[0]), v.value(b_dq.input[1])
    xs, ws = v.value(x_dq.input[1]), v.value(w_dq.input[1])
    bz = v.value(b_dq.input[2]) if len(b_dq.input) > 2 and b_dq.input[2] else np.zeros(1)
    if any(t is None for t in (b, bs, xs, ws, bz)) or b.dtype != np.int32 or np.any(bz != 0):
        return False
    want = (xs.astype(np.float32) * ws.astype(np.float32)).reshape(-1)
    got = bs.astype(np.float32).reshape(-1)
    return got.size in (1, want.size) and want.size in (1, got.size) and \
        bool(np.allclose(got, want, rtol=1e-6, atol=0))


def _gemm(v: _View, g: onnx.GraphProto, n, dqs: list, q):
    """DQ -> Gemm [-> Q] as onnxruntime's QGemm (quantized, or a float result without the Q); the
    bias an int32 at a_scale * b_scale, beta 1."""
    attrs = {a.name: a for a in n.attribute}
    a, b = dqs[:2]
    trans_b = attrs["transB"].i if "transB" in attrs else 0
    if "beta" in attrs and attrs["beta"].f != 1.0 or v.value(b.input[0]) is None or \
            not _per_tensor(v, b) and _axis(b) != (0 if trans_b else 1) or (q is not None and not _per_tensor(v, q)):
        return None, []
    bias = []
    if len(n.input) > 2 and n.input[2]:
        if not _bias_ok(v, dqs[2], a, b):
            return None, []
        bias = [dqs[2].input[0]]
    args = [a.input[0], a.input[1], _zp_name(v, g, a, a.input[0], n.name + "_a"),
            b.input[0], b.input[1], _zp_name(v, g, b, b.input[0], n.name + "_b")]
    args += bias if q is None else (bias or [""]) + [q.input[1], _zp_name(v, g, q, q.output[0], n.name + "_y")]
    new = helper.make_node("QGemm", args, [(q or n).output[0]], name=n.name + "_quant", domain=CONTRIB_DOMAIN)
    new.attribute.extend(x for x in n.attribute if x.name != "beta")
    return new, [n] + ([q] if q is not None else [])


def _fuse_one(v: _View, g: onnx.GraphProto, n):
    """The quantized node replacing float node `n` and the nodes it replaces, or (None, [])."""
    if n.domain not in ("", "ai.onnx"):
        return None, []
    ins = list(n.input)
    dqs = [v.dq(i) if i else None for i in ins]
    if not ins or any(i and d is None for i, d in zip(ins, dqs)) or len(n.output) != 1:
        return None, []
    if any(v.elem_type(d.input[0]) not in _INT8 for d in dqs[:2] if d is not None) or not _per_tensor(v, dqs[0]):
        return None, []
    q, dropped = _through_relu(v, n.output[0])
    if n.op_type in ("Conv", "MatMul") and q is not None and _per_tensor(v, q):
        x, w = dqs[0], dqs[1]
        if n.op_type == "Conv" and (v.value(w.input[0]) is None or not _per_tensor(v, w) and _axis(w) != 0) or \
                n.op_type == "MatMul" and not _per_tensor(v, w):
            return None, []
        bias = []
        if n.op_type == "Conv" and len(ins) > 2 and ins[2]:
            if not _bias_ok(v, dqs[2], x, w):
                return None, []
            bias = [dqs[2].input[0]]
        xin = [x.input[0], x.input[1], _zp_name(v, g, x, x.input[0], n.name + "_x")]
        win = [w.input[0], w.input[1], _zp_name(v, g, w, w.input[0], n.name + "_w")]
        yin = [q.input[1], _zp_name(v, g, q, q.output[0], n.name + "_y")]
        op = "QLinearConv" if n.op_type == "Conv" else "QLinearMatMul"
        new = helper.make_node(op, xin + win + yin + bias, [q.output[0]], name=n.name + "_quant")
        if op == "QLinearConv":
            new.attribute.extend(a for a in n.attribute)
        return new, [n, *dropped, q]
    if n.op_type == "Gemm" and not dropped:
        return _gemm(v, g, n, dqs, q)
    if n.op_type == "MatMul" and q is None and all(_per_tensor(v, d) for d in dqs):
        a, b = dqs                     # a float product of integers: onnxruntime's MatMulIntegerToFloat
        args = [a.input[0], b.input[0], a.input[1], b.input[1], _zp_name(v, g, a, a.input[0], n.name + "_a"),
                _zp_name(v, g, b, b.input[0], n.name + "_b")]
        return helper.make_node("MatMulIntegerToFloat", args, [n.output[0]], name=n.name + "_quant",
                                domain=CONTRIB_DOMAIN), [n]
    if dropped or q is None or not _per_tensor(v, q) or any(not _per_tensor(v, d) for d in dqs if d):
        return None, []
    yin = [q.input[1], _zp_name(v, g, q, q.output[0], n.name + "_y")]
    if n.op_type in _BINARY and len(ins) == 2:
        a, b = dqs
        args = [a.input[0], a.input[1], _zp_name(v, g, a, a.input[0], n.name + "_a"),
                b.input[0], b.input[1], _zp_name(v, g, b, b.input[0], n.name + "_b")] + yin
        new = helper.make_node(_BINARY[n.op_type], args, [q.output[0]], name=n.name + "_quant", domain=CONTRIB_DOMAIN)
        return new, [n, q]
    if n.op_type in _UNARY and len(ins) == 1 and not any(a.name == "dilations" for a in n.attribute):
        x = dqs[0]
        args = [x.input[0], x.input[1], _zp_name(v, g, x, x.input[0], n.name + "_x")] + yin
        new = helper.make_node(_UNARY[n.op_type], args, [q.output[0]], name=n.name + "_quant", domain=CONTRIB_DOMAIN)
        new.attribute.extend(a for a in n.attribute)
        return new, [n, q]
    return None, []


def fuse_groups(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its DQ -> op -> Q groups as quantized ops (a copy; the model itself if none)."""
    if not any(n.op_type == "DequantizeLinear" for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    v = _View(g)
    replaced, added = set(), {}
    for n in list(g.node):
        if id(n) in replaced or n.op_type not in ("Conv", "MatMul", "Gemm", *_BINARY, *_UNARY):
            continue
        new, old = _fuse_one(v, g, n)
        if new is None:
            continue
        replaced.update(id(o) for o in old)
        added[id(old[-1])] = new          # in the place of the group's last node, its Q
    if not added:
        return model
    nodes = []
    for n in g.node:
        if id(n) in added:
            nodes.append(added[id(n)])
        elif id(n) not in replaced:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    if not any(o.domain == CONTRIB_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    return out
