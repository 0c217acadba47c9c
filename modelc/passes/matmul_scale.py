"""Scalar scales of a MatMul's operands move past it: MatMul(x * a, y * b) becomes
MatMul(x, y) * (a b), the product's scale then the epilogue of its kernel.

torch's exports of scaled dot-product attention (the dynamo exporter's, in ViT-B/16, Swin and MaxViT)
scale Q and K each by the fourth root of 1/d before Q x K^T. Each scale made its operand a copy (an
injective kernel) that the product could not read in place (passes/matmul_views.py reads only views):
ViT-B/16 copied Q, and all of Q, K and V as they left the projection, in every layer. Moved past the
product, the scale is one multiply per score in the GEMM's store, and Q and V are read in place.
Only nonzero finite scales of float operands read by nothing else move (a zero or infinite one would
turn infinities of the product into NaN, or the reverse).
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .matmul_views import VIEW_OPS
from .util import only_consumer, scalar


def _scaled(graph: Graph, mm: Node, t: str):
    """(the unscaled operand, its scale, the scaling node) where operand `t` of MatMul `mm` is
    Mul(x, c) or Div(x, c) of a scalar constant c, read by `mm` alone; else None."""
    p = graph.producer(t)
    if p is None or p.op_type not in ("Mul", "Div") or len(p.inputs) != 2 or only_consumer(graph, t) is not mm \
            or mm.inputs.count(t) != 1:
        return None
    k = 1 if scalar(graph, p.inputs[1]) is not None else 0 if p.op_type == "Mul" else None
    if k is None or scalar(graph, p.inputs[1 - k]) is not None:
        return None
    x, c = p.inputs[1 - k], scalar(graph, p.inputs[k])
    tx, tt = graph.tensors[x], graph.tensors[t]
    if tt.dtype.kind != "f" or tx.dtype != tt.dtype or tuple(tx.shape) != tuple(tt.shape) or \
            c is None or c == 0.0 or not np.isfinite(c):
        return None
    return x, (1.0 / c if p.op_type == "Div" else c), p


def move_matmul_scales(graph: Graph) -> Graph:
    for mm in graph.topo():
        if mm.op_type != "MatMul" or mm.name not in graph.nx or len(mm.inputs) != 2 or mm.attrs.get("exact"):
            continue        # (a quantized product of integers, rounded once: as its importer wrote it)
        after = only_consumer(graph, mm.outputs[0])
        if after is not None and after.op_type in VIEW_OPS:
            continue        # a product the views may store where its moves put it (P x V): no epilogue
        scale, moved = 1.0, []
        for t in list(mm.inputs):
            while (found := _scaled(graph, mm, t)) is not None:
                x, c, p = found
                graph.replace_input(mm, t, x)
                graph.remove_node(p.name)
                scale, t = scale * c, x
                moved.append(p)
        if not moved:
            continue
        out = mm.outputs[0]
        ot = graph.tensors[out]
        raw = graph.fresh_name(f"{out}_unscaled")
        graph.add_tensor(raw, tuple(ot.shape), ot.dtype)
        order = graph.nx.nodes[mm.name]["order"]
        graph.remove_node(mm.name, drop_outputs=False)
        graph.add_node(Node(mm.name, "MatMul", list(mm.inputs), [raw], dict(mm.attrs), mm.onnx_name), order)
        c = graph.add_const(graph.fresh_name(f"{mm.name}_scale"), np.array(scale, ot.dtype))
        graph.add_node(Node(graph.fresh_name(f"{mm.name}_scale"), "Mul", [raw, c], [out], {}, moved[0].onnx_name),
                       order)
    return graph
