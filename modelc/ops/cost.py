"""Multiply-accumulate counts of the compute-heavy ops, for `modelc info` and task FLOPs.

Only ops whose cost grows with a reduction (convolutions, matrix products) are counted, as
torchvision's and ONNX-zoo model cards do; elementwise work is negligible beside them.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .internal import CONVS


def node_macs(graph: Graph, node: Node) -> int:
    shape = lambda i: graph.tensors[node.inputs[i]].shape  # noqa: E731
    if node.op_type in CONVS:
        w = shape(1)                          # [K, C/group, *kernel]
        out = graph.tensors[node.outputs[0]].shape
        return int(np.prod(out, dtype=np.int64)) * int(np.prod(w[1:], dtype=np.int64))
    if node.op_type == "ConvTranspose":
        x, w = shape(0), shape(1)             # w: [C, K/group, *kernel]; every input pixel scatters
        return int(np.prod(x, dtype=np.int64)) * int(np.prod(w[1:], dtype=np.int64))
    if node.op_type in ("MatMul", "StridedMatMul"):
        out = graph.tensors[node.outputs[0]].shape
        k = node.attrs["a_shape"][-1] if node.op_type == "StridedMatMul" else shape(0)[-1]
        return int(np.prod(out, dtype=np.int64)) * int(k)
    if node.op_type == "Dense":                # x[..., K] @ w[K, N]
        out = graph.tensors[node.outputs[0]].shape
        return int(np.prod(out, dtype=np.int64)) * int(shape(1)[0])
    if node.op_type == "Gemm":
        a = shape(0)
        k = a[0] if node.attrs.get("transA", 0) else a[-1]
        out = graph.tensors[node.outputs[0]].shape
        return int(np.prod(out, dtype=np.int64)) * int(k)
    if node.subgraph is not None:
        return sum(node_macs(node.subgraph, n) for n in node.subgraph.topo())
    return 0


def graph_macs(graph: Graph) -> int:
    return sum(node_macs(graph, n) for n in graph.topo())
