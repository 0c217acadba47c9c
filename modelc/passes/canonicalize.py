"""Spell out defaulted attributes of convolutions and pools, so equal layers have equal keys.

Exporters differ in what they write (TorchScript writes every Conv attribute, the dynamo exporter
omits defaults, old models use auto_pad), so kernel_shape, strides, dilations, explicit pads and
group are filled in here; auto_pad is resolved against the now-static shapes. Global pools over
other than two spatial axes (a video network's 3-d head) become the reductions they are, which
have kernels for any rank; the other way round, a mean or max over both spatial axes of an image
(what the dynamo exporter writes for adaptive pooling, in every squeeze-excitation block) becomes
the global pool it is, which runs in the convolutions' blocked layout: as a reduction it needed
plain rows, and EfficientNet-B0's feature maps were copied out of the blocked layout 16 times
(1.1 of 8.5 ms, AMD EPYC Zen 4). A Split becomes one Slice per output: each is then a one-output
injective op that fuses with its readers or writes the layout they read (ShuffleNetV2's dynamo export
split every shuffled map and copied half of it to the blocked layout, 15 transforms against the
TorchScript export's 2, whose Slices had fused).
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import Graph, Node

_SPATIAL = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"}


def _resolve_pads(node, in_spatial, kernel, strides, dilations):
    auto = node.attrs.get("auto_pad", "NOTSET")
    n = len(in_spatial)
    if auto in ("NOTSET", "", None):
        return list(node.attrs.get("pads", [0] * (2 * n)))
    if auto == "VALID":
        return [0] * (2 * n)
    begin, end = [], []
    for x, k, s, d in zip(in_spatial, kernel, strides, dilations):
        out = math.ceil(x / s)
        total = max((out - 1) * s + (k - 1) * d + 1 - x, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return begin + end


def _global_pool_as_reduce(graph: Graph, node: Node):
    rank = len(graph.tensors[node.inputs[0]].shape)
    axes = graph.add_const(graph.fresh_name(f"{node.name}_axes"), np.arange(2, rank, dtype=np.int64))
    op = "ReduceMean" if node.op_type == "GlobalAveragePool" else "ReduceMax"
    order = graph.nx.nodes[node.name]["order"]
    graph.remove_node(node.name, drop_outputs=False)
    graph.add_node(Node(node.name, op, [node.inputs[0], axes], list(node.outputs), {"keepdims": 1},
                        node.onnx_name), order)


def _spatial_reduce(graph: Graph, node: Node) -> bool:
    """A ReduceMean/ReduceMax over axes 2 and 3 of a 4-d float tensor."""
    if node.op_type not in ("ReduceMean", "ReduceMax"):
        return False
    x = graph.tensors[node.inputs[0]]
    if x.shape is None or len(x.shape) != 4 or x.dtype not in (np.float32, np.float16):
        return False
    if len(node.inputs) > 1 and node.inputs[1]:
        axes = graph.value(node.inputs[1])
        if axes is None:
            return False
    else:
        axes = node.attrs.get("axes")
    return axes is not None and sorted(int(a) % 4 for a in np.asarray(axes).reshape(-1)) == [2, 3]


def _reduce_as_global_pool(graph: Graph, node: Node):
    """The pool, and where the reduction drops the axes (MNASNet's `x.mean([2, 3])`) a reshape."""
    op = "GlobalAveragePool" if node.op_type == "ReduceMean" else "GlobalMaxPool"
    order = graph.nx.nodes[node.name]["order"]
    graph.remove_node(node.name, drop_outputs=False)
    y = node.outputs[0]
    if node.attrs.get("keepdims", 1):
        graph.add_node(Node(node.name, op, [node.inputs[0]], [y], {}, node.onnx_name), order)
        return
    x = graph.tensors[node.inputs[0]]
    pooled = graph.fresh_name(f"{y}_pooled")
    graph.add_tensor(pooled, (*x.shape[:2], 1, 1), x.dtype)
    shape = graph.add_const(graph.fresh_name(f"{y}_shape"), np.array(x.shape[:2], np.int64))
    graph.add_node(Node(node.name, op, [node.inputs[0]], [pooled], {}, node.onnx_name), order)
    graph.add_node(Node(graph.fresh_name(f"{node.name}_squeeze"), "Reshape", [pooled, shape], [y], {},
                        node.onnx_name), order)


def _split_as_slices(graph: Graph, node: Node) -> bool:
    x = graph.tensors[node.inputs[0]].shape
    outs = [graph.tensors[o].shape for o in node.outputs]
    if x is None or not outs or any(s is None for s in outs):
        return False
    axis = int(node.attrs.get("axis", 0)) % len(x)
    order = graph.nx.nodes[node.name]["order"]
    graph.remove_node(node.name, drop_outputs=False)
    start = 0
    for k, (o, shape) in enumerate(zip(node.outputs, outs)):
        end = start + shape[axis]
        consts = [graph.add_const(graph.fresh_name(f"{node.name}_{what}{k}"), np.array([v], np.int64))
                  for what, v in (("start", start), ("end", end), ("axis", axis))]
        graph.add_node(Node(graph.fresh_name(f"{node.name}_{k}"), "Slice", [node.inputs[0], *consts], [o], {},
                            node.onnx_name), order)
        start = end
    return True


def canonicalize(graph: Graph) -> Graph:
    for node in graph.topo():
        if node.op_type == "Split" and all(node.outputs) and _split_as_slices(graph, node):
            continue
        if node.op_type in ("GlobalAveragePool", "GlobalMaxPool") and \
                len(graph.tensors[node.inputs[0]].shape) != 4:
            _global_pool_as_reduce(graph, node)
            continue
        if _spatial_reduce(graph, node):
            _reduce_as_global_pool(graph, node)
            continue
        if node.op_type not in _SPATIAL or node.op_type == "ConvTranspose":
            continue
        x = graph.tensors[node.inputs[0]].shape
        spatial = x[2:]
        n = len(spatial)
        a = node.attrs
        if node.op_type == "Conv":
            kernel = list(graph.tensors[node.inputs[1]].shape[2:])
            a["group"] = int(a.get("group", 1))
        else:
            kernel = list(a["kernel_shape"])
            if node.op_type == "MaxPool":
                a.setdefault("storage_order", 0)
            if node.op_type == "AveragePool":
                a["count_include_pad"] = int(a.get("count_include_pad", 0))
            if node.op_type != "Conv":
                a["ceil_mode"] = int(a.get("ceil_mode", 0))
        a["kernel_shape"] = kernel
        a["strides"] = list(a.get("strides", [1] * n))
        a["dilations"] = list(a.get("dilations", [1] * n))
        a["pads"] = _resolve_pads(node, spatial, kernel, a["strides"], a["dilations"])
        a.pop("auto_pad", None)
    return graph
