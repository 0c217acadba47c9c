"""Lower the normalisations that no template takes onto ops that have kernels.

- InstanceNormalization: a LayerNormalization over the spatial axes (axis 2, unit scale: the
  layer-norm template, one kernel reading x twice), then the per-channel scale and bias as a
  broadcast Mul/Add (one injective kernel).
- GroupNormalization: the same over [N, G, C/G * spatial] (a Reshape on each side; the scale and
  bias stay a kernel of their own: in the layer norm's epilogue their channel index i // (C/G ...)
  per element kept its row loop from vectorising, 0.29 ms against 0.07 + 0.10).
- LayerNormalization whose scale or B is not a constant: the layer norm with unit scale, then the
  scale and B as broadcast Mul/Add. When its Mean or InvStdDev output is used it is spelt out in
  ReduceMean/Sub/Mul/Add/Sqrt/Reciprocal, which the reduce and injective templates compile.
- LpNormalization: ReduceL1 or the square root of ReduceSumSquare (the smallest normal number as a
  floor, so an all-zero row gives 0 as ONNX's 0 / 0 -> 0 rule), then x / norm.
LRN has a template of its own (kernels/lrn.py).
Float types only; float16 stays as it was (its groups run on the reference anyway).
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import Graph, Node

_FLOATS = ("float32", "float64")
_ONNX_TYPE = {"float32": 1, "float64": 11, "float16": 10}


class _Emitter:
    def __init__(self, graph: Graph, node: Node):
        self.g, self.node = graph, node
        self.order = graph.nx.nodes[node.name]["order"]
        graph.remove_node(node.name, drop_outputs=False)

    def const(self, hint, value) -> str:
        return self.g.add_const(self.g.fresh_name(f"{self.node.name}_{hint}"), np.asarray(value))

    def op(self, op, inputs, shape, dtype, attrs=None, out=None, extra_outputs=()) -> str:
        g = self.g
        if out is None:
            out = g.fresh_name(f"{self.node.name}_{op.lower()}")
            g.add_tensor(out, tuple(shape), np.dtype(dtype))
        g.add_node(Node(g.fresh_name(f"{self.node.name}_{op.lower()}"), op, list(inputs),
                        [out, *extra_outputs], dict(attrs or {}), self.node.onnx_name), self.order)
        return out


def _dtype(graph, name):
    return np.dtype(graph.tensors[name].dtype)


def _scale_shift(e: _Emitter, y: str, shape, dt, scale, bias, out: str, per_channel: bool):
    """out = y * scale + bias; per-channel parameters are reshaped to [C, 1, ...]."""
    g = e.g
    steps = [("Mul", scale), ("Add", bias)]
    steps = [(op, p) for op, p in steps if p]
    for k, (op, p) in enumerate(steps):
        if per_channel:
            tail = (shape[1],) + (1,) * (len(shape) - 2)
            v = g.value(p)
            if v is not None:
                p = e.const(op.lower(), np.asarray(v, dt).reshape(tail))
            else:
                p = e.op("Reshape", [p, e.const("shape", np.array(tail, np.int64))], tail, _dtype(g, p))
        if _dtype(g, p) != dt:
            p = e.op("Cast", [p], g.tensors[p].shape, dt, {"to": _ONNX_TYPE[dt.name]})
        y = e.op(op, [y, p], shape, dt, out=out if k == len(steps) - 1 else None)
    if not steps:
        e.op("Identity", [y], shape, dt, out=out)


def _layernorm(e: _Emitter, x, shape, dt, axis, eps, out=None) -> str:
    one = e.const("unit_scale", np.ones(tuple(shape[axis:]), dt))
    return e.op("LayerNormalization", [x, one], shape, dt, {"axis": axis, "epsilon": float(eps)}, out=out)


def _instance_norm(graph: Graph, node: Node):
    x, scale, bias = node.inputs[:3]
    shape, dt = graph.tensors[x].shape, _dtype(graph, x)
    e = _Emitter(graph, node)
    y = _layernorm(e, x, shape, dt, 2, node.attrs.get("epsilon", 1e-5))
    _scale_shift(e, y, shape, dt, scale, bias, node.outputs[0], True)


def _group_norm(graph: Graph, node: Node):
    x, scale, bias = node.inputs[:3]
    shape, dt = graph.tensors[x].shape, _dtype(graph, x)
    groups = int(node.attrs["num_groups"])
    e = _Emitter(graph, node)
    gshape = (shape[0], groups, math.prod(shape[1:]) // groups)
    xr = e.op("Reshape", [x, e.const("shape", np.array(gshape, np.int64))], gshape, dt)
    y = _layernorm(e, xr, gshape, dt, 2, node.attrs.get("epsilon", 1e-5))
    y = e.op("Reshape", [y, e.const("shape", np.array(shape, np.int64))], shape, dt)
    _scale_shift(e, y, shape, dt, scale, bias, node.outputs[0], True)


def _used(graph: Graph, name: str) -> bool:
    return bool(name) and (name in graph.outputs or bool(graph.consumers(name)))


def _layer_norm(graph: Graph, node: Node):
    x, scale = node.inputs[:2]
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    shape, dt = graph.tensors[x].shape, _dtype(graph, x)
    axis = int(node.attrs.get("axis", -1)) % len(shape)
    eps = node.attrs.get("epsilon", 1e-5)
    outs = list(node.outputs) + [""] * (3 - len(node.outputs))
    for k in (1, 2):
        if outs[k] and not _used(graph, outs[k]):
            outs[k] = ""
    consts = all(graph.value(t) is not None for t in (scale, bias) if t)
    e = _Emitter(graph, node)
    for o in node.outputs[1:]:
        if o and o not in outs:
            graph.tensors.pop(o, None)
    if not outs[1] and not outs[2]:
        if consts:          # the layer-norm template's own form: one output, constant parameters
            e.op("LayerNormalization", [x, scale] + ([bias] if bias else []), shape, dt,
                 {"axis": axis, "epsilon": float(eps)}, out=outs[0])
            return
        y = _layernorm(e, x, shape, dt, axis, eps)
        _scale_shift(e, y, shape, dt, scale, bias, outs[0], False)
        return
    stat = tuple(shape[:axis]) + (1,) * (len(shape) - axis)
    axes = e.const("axes", np.arange(axis, len(shape), dtype=np.int64))
    keep = {"keepdims": 1}
    mean = e.op("ReduceMean", [x, axes], stat, dt, keep, out=outs[1] if dt == np.float32 else None)
    d = e.op("Sub", [x, mean], shape, dt)
    var = e.op("ReduceMean", [e.op("Mul", [d, d], shape, dt), axes], stat, dt, keep)
    std = e.op("Sqrt", [e.op("Add", [var, e.const("eps", np.asarray(eps, dt))], stat, dt)], stat, dt)
    inv = e.op("Reciprocal", [std], stat, dt, out=outs[2] if dt == np.float32 else None)
    for name, v in ((outs[1], mean), (outs[2], inv)):
        if name and v != name:
            e.op("Cast", [v], stat, np.float32, {"to": 1}, out=name)
    y = e.op("Mul", [d, inv], shape, dt)
    _scale_shift(e, y, shape, dt, scale, bias, outs[0], False)


def _lp_norm(graph: Graph, node: Node):
    x = node.inputs[0]
    shape, dt = graph.tensors[x].shape, _dtype(graph, x)
    axis = int(node.attrs.get("axis", -1)) % len(shape)
    p = int(node.attrs.get("p", 2))
    e = _Emitter(graph, node)
    stat = tuple(1 if k == axis else d for k, d in enumerate(shape))
    axes = e.const("axes", np.array([axis], np.int64))
    if p == 1:
        norm = e.op("ReduceL1", [x, axes], stat, dt, {"keepdims": 1})
    else:
        norm = e.op("Sqrt", [e.op("ReduceSumSquare", [x, axes], stat, dt, {"keepdims": 1})], stat, dt)
    norm = e.op("Max", [norm, e.const("tiny", np.asarray(np.finfo(dt).tiny, dt))], stat, dt)
    e.op("Div", [x, norm], shape, dt, out=node.outputs[0])


_LOWER = {"InstanceNormalization": _instance_norm, "GroupNormalization": _group_norm,
          "LpNormalization": _lp_norm}


def _layernorm_has_kernel(graph: Graph, node: Node) -> bool:
    consts = all(graph.value(t) is not None for t in node.inputs[1:3] if t)
    return consts and len([o for o in node.outputs if o]) == 1


def lower_norms(graph: Graph) -> Graph:
    for node in graph.topo():
        op = node.op_type
        if op not in _LOWER and op != "LayerNormalization":
            continue
        x = node.inputs[0]
        t = graph.tensors[x]
        if str(np.dtype(t.dtype)) not in _FLOATS or t.shape is None:
            continue
        if op == "LayerNormalization":
            if not _layernorm_has_kernel(graph, node):
                _layer_norm(graph, node)
        elif op == "LpNormalization" and int(node.attrs.get("p", 2)) not in (1, 2):
            continue
        else:
            _LOWER[op](graph, node)
    return graph
