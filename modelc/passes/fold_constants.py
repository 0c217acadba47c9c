"""Evaluate every node whose inputs are all known at compile time.

Besides constants this covers Shape and Size, whose values follow from static shapes, so the
Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains that exporters emit collapse to one constant;
and CastLike of a constant, whose second operand gives only its dtype (an attention's -inf mask fill).
An empty output (a zero-size dimension, as a batch of 0) is a constant too, whatever the inputs:
no kernel is generated for it (templates tile at least one item); and so is any output of empty
inputs, which hold no value (a ReduceMax over an empty axis is its identity).
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ir import Graph

_META_ONLY = {"Shape": 0, "Size": 0, "CastLike": 1}     # the operand of which only shape and dtype count


def _empty(graph: Graph, node) -> bool:
    outs = [graph.tensors[o] for o in node.outputs if o]
    return bool(outs) and all(t.shape is not None and 0 in t.shape for t in outs)


def _stand_in(t) -> np.ndarray:
    """An operand whose values do not count: its shape and dtype (an empty array, or a view of one
    zero rather than a copy of the whole shape)."""
    return np.zeros(t.shape, t.dtype) if 0 in t.shape else np.broadcast_to(np.zeros((), t.dtype), t.shape)


def fold_constants(graph: Graph) -> Graph:
    for node in graph.topo():
        if node.subgraph is None and _empty(graph, node):
            graph.remove_node(node.name, drop_outputs=False)
            for name in node.outputs:
                if name:
                    t = graph.tensors[name]
                    graph.add_tensor(name, value=np.zeros(t.shape, t.dtype))
            continue
        meta = _META_ONLY.get(node.op_type)

        def known(k, i):
            shape = graph.tensors[i].shape if i else None
            return not i or graph.value(i) is not None or (shape is not None and (k == meta or 0 in shape))
        if node.subgraph is not None or not all(known(k, i) for k, i in enumerate(node.inputs)):
            continue
        args = [None if not i else graph.value(i) if graph.value(i) is not None else _stand_in(graph.tensors[i])
                for i in node.inputs]
        values = ops.evaluate(node, args)
        graph.remove_node(node.name, drop_outputs=False)
        for name, v in zip(node.outputs, values):
            if not name:
                continue
            t = graph.tensors[name]
            graph.add_tensor(name, value=v.astype(t.dtype, copy=False))
    return graph
