"""Fold inference BatchNormalization into the Conv before it, or into a per-channel scale and shift.

y = (x - mean) / sqrt(var + eps) * gamma + beta is affine per channel, so after a Conv it folds
into the Conv's weights and bias; elsewhere it becomes Mul + Add by constants, which fusion then
attaches to whatever op precedes it.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .util import only_consumer


def _scale_shift(graph: Graph, bn: Node):
    vals = [graph.value(i) for i in bn.inputs[1:5]]
    if any(v is None for v in vals):
        return None
    gamma, beta, mean, var = (v.astype(np.float64) for v in vals)
    scale = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    return scale, beta - mean * scale


def fold_batchnorm(graph: Graph) -> Graph:
    for bn in graph.topo():
        if bn.op_type != "BatchNormalization" or bn.name not in graph.nx:
            continue
        if len([o for o in bn.outputs if o]) != 1:
            continue
        ss = _scale_shift(graph, bn)
        if ss is None:
            continue
        scale, shift = ss
        x = bn.inputs[0]
        conv = graph.producer(x)
        dtype = graph.tensors[x].dtype
        if conv is not None and conv.op_type == "Conv" and only_consumer(graph, x) is bn \
                and graph.value(conv.inputs[1]) is not None \
                and (len(conv.inputs) < 3 or not conv.inputs[2] or graph.value(conv.inputs[2]) is not None):
            w = graph.value(conv.inputs[1]).astype(np.float64)
            b = graph.value(conv.inputs[2]).astype(np.float64) \
                if len(conv.inputs) > 2 and conv.inputs[2] else np.zeros(w.shape[0])
            w_name = graph.add_const(graph.fresh_name(f"{conv.name}_w_bn"),
                                     (w * scale.reshape((-1,) + (1,) * (w.ndim - 1))).astype(dtype))
            b_name = graph.add_const(graph.fresh_name(f"{conv.name}_b_bn"), (b * scale + shift).astype(dtype))
            order = graph.nx.nodes[conv.name]["order"]
            graph.remove_node(conv.name, drop_outputs=False)
            graph.remove_node(bn.name, drop_outputs=False)
            conv.inputs = [conv.inputs[0], w_name, b_name]
            graph.tensors.pop(conv.outputs[0])
            conv.outputs = [bn.outputs[0]]
            graph.add_node(conv, order)
        else:
            rank = len(graph.tensors[x].shape)
            bshape = (-1,) + (1,) * (rank - 2)
            s = graph.add_const(graph.fresh_name(f"{bn.name}_scale"), scale.reshape(bshape).astype(dtype))
            t = graph.add_const(graph.fresh_name(f"{bn.name}_shift"), shift.reshape(bshape).astype(dtype))
            mid = graph.fresh_name(f"{bn.name}_scaled")
            graph.add_tensor(mid, graph.tensors[x].shape, dtype)
            order = graph.nx.nodes[bn.name]["order"]
            graph.remove_node(bn.name, drop_outputs=False)
            graph.add_node(Node(graph.fresh_name(f"{bn.name}_mul"), "Mul", [x, s], [mid], {}, bn.onnx_name),
                           order)
            graph.add_node(Node(graph.fresh_name(f"{bn.name}_add"), "Add", [mid, t], [bn.outputs[0]], {},
                                bn.onnx_name), order)
    return graph
