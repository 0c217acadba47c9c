"""Dead-code elimination: drop nodes whose outputs nobody reads, and unused constants."""
from __future__ import annotations

from ..ir import Graph


def eliminate_dead_code(graph: Graph) -> Graph:
    live = set(graph.outputs)
    for node in reversed(graph.topo()):
        if any(o in live for o in node.outputs if o):
            live.update(i for i in node.inputs if i)
        else:
            graph.remove_node(node.name)
    for name in [t.name for t in graph.tensors.values()]:
        if name not in live and name not in graph.inputs and graph.producer(name) is None:
            del graph.tensors[name]
    return graph
