"""Dense layers that read one tensor and each feed a MatMul through reshapes and transposes become
one Dense over their weights side by side, each former output a Slice of it: attention's Q, K and V
projections (BERT's three Linear layers) as one [E, 3E] product, as torch's MultiheadAttention
exports it.

One GEMM reads the input once instead of three times and runs one kernel instead of three; the
slices are then views that the attention's matmuls read in place (passes/matmul_views.py), K's
copy for its transpose reading its part where it lies. Only where nothing elementwise follows a
projection: there an epilogue (a GELU, a scale) would have fused into its own dense and now could
not (it would follow a slice).
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .matmul_views import VIEW_OPS
from .util import only_consumer


def _mergeable(graph: Graph, node: Node, x: str) -> bool:
    if node.op_type != "Dense" or node.inputs[0] != x or node.attrs or len(node.outputs) != 1:
        return False
    w = graph.value(node.inputs[1])
    b = graph.value(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    if w is None or w.ndim != 2 or w.dtype != np.float32 or \
            (len(node.inputs) > 2 and node.inputs[2] and (b is None or b.shape != (w.shape[1],))):
        return False
    t = node.outputs[0]         # through reshapes and transposes alone, into a MatMul
    reader = only_consumer(graph, t)
    while reader is not None and reader.op_type in VIEW_OPS and reader.inputs[0] == t:
        t = reader.outputs[0]
        reader = only_consumer(graph, t)
    return t != node.outputs[0] and reader is not None and reader.op_type == "MatMul"


def merge_sibling_dense(graph: Graph) -> Graph:
    for x in list(graph.tensors):
        if x not in graph.tensors or graph.tensors[x].dtype != np.float32:
            continue
        group = [n for n in graph.consumers(x) if _mergeable(graph, n, x)]
        if len(group) < 2 or len({graph.value(n.inputs[1]).shape[0] for n in group}) != 1:
            continue
        ws = [graph.value(n.inputs[1]) for n in group]
        bs = [graph.value(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else np.zeros(w.shape[1], np.float32)
              for n, w in zip(group, ws)]
        first = group[0]
        order = graph.nx.nodes[first.name]["order"]
        y = graph.fresh_name(f"{first.outputs[0]}_merged")
        graph.add_tensor(y, shape=tuple(graph.tensors[first.outputs[0]].shape[:-1]) + (sum(w.shape[1] for w in ws),),
                         dtype=np.dtype(np.float32))
        w = graph.add_const(graph.fresh_name(f"{first.name}_w_merged"), np.concatenate(ws, axis=1))
        b = graph.add_const(graph.fresh_name(f"{first.name}_b_merged"), np.concatenate(bs))
        start = 0
        for n, part in zip(group, ws):
            graph.remove_node(n.name, drop_outputs=False)
            consts = [graph.add_const(graph.fresh_name(f"{n.name}_{k}"), np.array([v], np.int64))
                      for k, v in (("start", start), ("end", start + part.shape[1]), ("axis", -1))]
            graph.add_node(Node(graph.fresh_name(f"{n.name}_slice"), "Slice", [y] + consts, list(n.outputs), {},
                                n.onnx_name), graph.nx.number_of_nodes() + order)
            start += part.shape[1]
        graph.add_node(Node(graph.fresh_name(f"{first.name}_merged"), "Dense", [x, w, b], [y], {}, first.onnx_name),
                       order)
    return graph
