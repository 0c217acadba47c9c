"""Evaluate every node whose inputs are all known at compile time.

Besides constants this covers Shape and Size, whose values follow from static shapes, so the
Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains that exporters emit collapse to one constant.
An empty output (a zero-size dimension, as a batch of 0) is a constant too, whatever the inputs:
no kernel is generated for it (templates tile at least one item).
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ir import Graph

_SHAPE_ONLY = {"Shape", "Size"}


def _empty(graph: Graph, node) -> bool:
    outs = [graph.tensors[o] for o in node.outputs if o]
    return bool(outs) and all(t.shape is not None and 0 in t.shape for t in outs)


def fold_constants(graph: Graph) -> Graph:
    for node in graph.topo():
        if node.subgraph is None and _empty(graph, node):
            graph.remove_node(node.name, drop_outputs=False)
            for name in node.outputs:
                if name:
                    t = graph.tensors[name]
                    graph.add_tensor(name, value=np.zeros(t.shape, t.dtype))
            continue
        if node.op_type in _SHAPE_ONLY:
            x = graph.tensors[node.inputs[0]]
            args = [np.zeros(x.shape, x.dtype)] if x.value is None else [x.value]
        elif all(not i or graph.value(i) is not None for i in node.inputs) and node.subgraph is None:
            args = [graph.value(i) if i else None for i in node.inputs]
        else:
            continue
        values = ops.evaluate(node, args)
        graph.remove_node(node.name, drop_outputs=False)
        for name, v in zip(node.outputs, values):
            if not name:
                continue
            t = graph.tensors[name]
            graph.add_tensor(name, value=v.astype(t.dtype, copy=False))
    return graph
