"""Evaluate every node whose inputs are all known at compile time.

Besides constants this covers Shape and Size, whose values follow from static shapes, so the
Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains that exporters emit collapse to one constant.
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ir import Graph

_SHAPE_ONLY = {"Shape", "Size"}


def fold_constants(graph: Graph) -> Graph:
    for node in graph.topo():
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
