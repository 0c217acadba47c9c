"""Reshapes and transposes that only feed a MatMul become the way it reads its operand:
MatMul(Transpose(Reshape(x)), ...) becomes StridedMatMul(x, ...) with x's view as attributes.

Attention splits one [tokens, heads x dim] tensor into heads and transposes K: Q, K and V each went
through a copy (an injective kernel) before their matmul, about 5% of a transformer encoder's time
on the Xeon of stop 48 (K's transpose was the slowest of them). A reshape or transpose of a row-major
tensor is most often a strided view of its memory, which the GEMM can read directly: A by scalars
at any strides, B in place while its columns are contiguous, else through the panel it packs.

Whether the chain is a view is not reasoned out but computed: the chain is applied with numpy to the
source's element numbers, and the result must be `base + sum(index x stride)` everywhere.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .util import only_consumer

VIEW_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten")
MAX_ELEMENTS = 1 << 23      # the element numbers the check builds (64 MiB of int64)


def _chain(graph: Graph, tensor: str, reader: Node):
    """(source, [view ops from the source]) of the view ops that produce `tensor` for `reader`
    alone; (tensor, []) when there are none."""
    ops = []
    while True:
        p = graph.producer(tensor)
        if p is None or p.op_type not in VIEW_OPS or only_consumer(graph, tensor) is not reader:
            break
        ops.append(p)
        reader, tensor = p, p.inputs[0]
    return tensor, ops[::-1]


def strides_of(shape: tuple, ops: list) -> tuple | None:
    """The element strides of the tensor that `ops` (Transpose: ('T', perm); else ('R', shape))
    make of a row-major tensor of `shape`, if it is a strided view of it (offset 0), else None."""
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0 or n > MAX_ELEMENTS:
        return None
    v = np.arange(n, dtype=np.int64).reshape(shape)
    for kind, arg in ops:
        v = np.transpose(v, arg) if kind == "T" else v.reshape(arg)
    if v.ndim == 0 or v.flat[0] != 0:
        return None
    strides = tuple(int(v[tuple(1 if a == i else 0 for a in range(v.ndim))]) if d > 1 else 0
                    for i, d in enumerate(v.shape))
    expect = np.zeros(v.shape, np.int64)
    for i, s in enumerate(strides):
        shape_i = [1] * v.ndim
        shape_i[i] = v.shape[i]
        expect = expect + np.arange(v.shape[i], dtype=np.int64).reshape(shape_i) * s
    return strides if np.array_equal(expect, v) else None


def _plain_strides(shape) -> list:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s if d > 1 else 0)
        s *= d
    return out[::-1]


def fold_matmul_views(graph: Graph) -> Graph:
    for mm in graph.topo():
        if mm.op_type != "MatMul" or mm.attrs or len(mm.inputs) != 2 or mm.name not in graph.nx:
            continue
        shapes = [graph.tensors[t].shape for t in mm.inputs]
        if any(s is None or len(s) < 2 for s in shapes) or \
                any(graph.tensors[t].dtype != np.float32 or graph.tensors[t].is_const for t in mm.inputs):
            continue
        views = []
        for i, t in enumerate(mm.inputs):
            src, chain = _chain(graph, t, mm)
            steps = [("T", list(p.attrs.get("perm") or range(len(graph.tensors[p.inputs[0]].shape))[::-1]))
                     if p.op_type == "Transpose" else ("R", tuple(graph.tensors[p.outputs[0]].shape))
                     for p in chain]
            st = strides_of(tuple(graph.tensors[src].shape), steps) if chain else None
            if st is not None and i == 1 and st[-1] > 1:
                st = None       # B's columns apart: the GEMM would gather them (packing K^T per
                #                 tile: Q x K^T 0.083 ms, where the transpose and the matmul took 0.057)
            views.append((src, chain, list(st)) if st is not None else (t, [], _plain_strides(graph.tensors[t].shape)))
        if not any(chain for _, chain, _ in views):
            continue
        (a, ca, sa), (b, cb, sb) = views
        order = graph.nx.nodes[mm.name]["order"]
        graph.remove_node(mm.name, drop_outputs=False)
        for p in reversed(ca + cb):
            if p.name in graph.nx and not graph.consumers(p.outputs[0]):
                graph.remove_node(p.name)
        attrs = {"a_shape": list(shapes[0]), "a_strides": sa, "b_shape": list(shapes[1]), "b_strides": sb}
        graph.add_node(Node(mm.name, "StridedMatMul", [a, b], list(mm.outputs), attrs, mm.onnx_name), order)
    return graph
