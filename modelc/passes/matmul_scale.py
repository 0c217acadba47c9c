"""Scalar scales of a MatMul's operands move past it: MatMul(x * a, y * b) becomes
MatMul(x, y) * (a b), the product's scale then the epilogue of its kernel.

torch's exports of scaled dot-product attention (the dynamo exporter's, in ViT-B/16, Swin and MaxViT)
scale Q and K each by the fourth root of 1/d before Q x K^T. Each scale made its operand a copy (an
injective kernel) that the product could not read in place (passes/matmul_views.py reads only views):
ViT-B/16 copied Q, and all of Q, K and V as they left the projection, in every layer. Moved past the
product, the scale is one multiply per score in the GEMM's store, and Q and V are read in place.
Only nonzero finite scales of float32 and float64 operands read by nothing else move (a zero or
infinite one would turn infinities of the product into NaN, or the reverse; a float16 operand is rounded
to its 11 bits once scaled, and scaled after the product it rounds elsewhere: ONNX's float16 attention
tests then differ from the reference by more than their 1e-3).
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .matmul_views import VIEW_OPS
from .util import only_consumer, scalar


def _scaled(graph: Graph, reader: Node, t: str):
    """(the unscaled operand, its scale, the scaling node) where `t`, read by `reader` alone (and
    once), is Mul(x, c) or Div(x, c) of a scalar constant c; else None."""
    p = graph.producer(t)
    if p is None or p.op_type not in ("Mul", "Div") or len(p.inputs) != 2 or \
            only_consumer(graph, t) is not reader or reader.inputs.count(t) != 1:
        return None
    k = 1 if scalar(graph, p.inputs[1]) is not None else 0 if p.op_type == "Mul" else None
    if k is None or scalar(graph, p.inputs[1 - k]) is not None:
        return None
    x, c = p.inputs[1 - k], scalar(graph, p.inputs[k])
    tx, tt = graph.tensors[x], graph.tensors[t]
    if tt.dtype not in (np.float32, np.float64) or tx.dtype != tt.dtype or tx.shape is None or \
            tx.shape != tt.shape or c is None or c == 0.0 or not np.isfinite(c):
        return None
    return x, (1.0 / c if p.op_type == "Div" else c), p


def _chain(graph: Graph, mm: Node, t: str) -> tuple:
    """(the operand under every scale of `t`, [its scaling nodes, outermost first], their product)."""
    reader, nodes, scale = mm, [], 1.0
    while (found := _scaled(graph, reader, t)) is not None:
        t, c, reader = found
        nodes.append(reader)
        scale *= c
    return t, nodes, scale


def move_matmul_scales(graph: Graph) -> Graph:
    for mm in graph.topo():
        if mm.op_type != "MatMul" or mm.name not in graph.nx or len(mm.inputs) != 2 or mm.attrs.get("exact"):
            continue        # (a quantized product of integers, rounded once: as its importer wrote it)
        after = only_consumer(graph, mm.outputs[0])
        if after is not None and after.op_type in VIEW_OPS:
            continue        # a product the views may store where its moves put it (P x V): no epilogue
        chains = [_chain(graph, mm, t) for t in mm.inputs]
        out = mm.outputs[0]
        ot = graph.tensors[out]
        scale = np.array(chains[0][2] * chains[1][2], ot.dtype)
        if not chains[0][1] and not chains[1][1] or not np.isfinite(scale) or scale == 0:
            continue        # (scales whose product leaves the type's range stay apart)
        for t, (x, nodes, _) in zip(list(mm.inputs), chains):
            if nodes:
                graph.replace_input(mm, t, x)
                for p in nodes:
                    graph.remove_node(p.name)
        raw = graph.fresh_name(f"{out}_unscaled")
        graph.add_tensor(raw, tuple(ot.shape), ot.dtype)
        order = graph.nx.nodes[mm.name]["order"]
        graph.remove_node(mm.name, drop_outputs=False)
        graph.add_node(Node(mm.name, "MatMul", list(mm.inputs), [raw], dict(mm.attrs), mm.onnx_name), order)
        c = graph.add_const(graph.fresh_name(f"{mm.name}_scale"), scale)
        onnx_name = (chains[0][1] or chains[1][1])[0].onnx_name
        graph.add_node(Node(graph.fresh_name(f"{mm.name}_scale"), "Mul", [raw, c], [out], {}, onnx_name), order)
    return graph
