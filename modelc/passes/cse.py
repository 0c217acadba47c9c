"""Common sub-expression elimination: one node per distinct (op, inputs, attributes)."""
from __future__ import annotations

import numpy as np

from ..ir import Graph


def _attr_key(v):
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    return v


def _const_key(graph: Graph, name: str):
    t = graph.tensors[name]
    return ("const", t.dtype.str, t.shape, t.value.tobytes()) if t.value.size <= 64 else name


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    seen: dict = {}
    for node in graph.topo():
        if node.subgraph is not None:
            continue
        key = (node.op_type, len(node.outputs),
               tuple(_const_key(graph, i) if i and graph.value(i) is not None else i
                     for i in node.inputs),
               tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items())))
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        if any(o in graph.outputs for o in node.outputs):
            continue
        for mine, theirs in zip(node.outputs, first.outputs):
            if mine and theirs:
                graph.replace_uses(mine, theirs)
        if all(not graph.consumers(o) for o in node.outputs if o):
            graph.remove_node(node.name)
    return graph
