"""Reshapes and transposes that only feed a MatMul become the way it reads its operand:
MatMul(Transpose(Reshape(x)), ...) becomes StridedMatMul(x, ...) with x's view as attributes.

Attention splits one [tokens, heads x dim] tensor into heads and transposes K: Q, K and V each went
through a copy (an injective kernel) before their matmul, and the heads were merged back by another,
about 5% of a transformer encoder's time on the Xeon of stop 48. A reshape or transpose of a
row-major tensor is most often a strided view of its memory, which the GEMM reads in place: A by
scalars at any strides, B while its columns are contiguous (K^T's are not: K keeps its transpose).
Likewise a product whose result only goes through such ops (the heads merged back) stores it where
they would have moved it, its columns contiguous (attributes `y_shape`, `y_strides`).

Whether a chain is a view is not reasoned out but computed: the chain is applied with numpy to the
source's element numbers, and the result must be `sum(index x stride)` everywhere.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .util import only_consumer

VIEW_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten")
MAX_ELEMENTS = 1 << 23      # the element numbers the check builds (64 MiB of int64)


def _steps(graph: Graph, chain: list) -> list:
    return [("T", list(p.attrs.get("perm") or range(len(graph.tensors[p.inputs[0]].shape))[::-1]))
            if p.op_type == "Transpose" else ("R", tuple(graph.tensors[p.outputs[0]].shape)) for p in chain]


def _out_chain(graph: Graph, tensor: str):
    """The view ops that alone read `tensor`, one after another, and the tensor they end in."""
    ops = []
    while True:
        c = only_consumer(graph, tensor)
        if c is None or c.op_type not in VIEW_OPS or c.inputs[0] != tensor:
            return tensor, ops
        ops.append(c)
        tensor = c.outputs[0]


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


def _apply(v: np.ndarray, ops: list) -> np.ndarray:
    for kind, arg in ops:
        v = np.transpose(v, arg) if kind == "T" else v.reshape(arg)
    return v


def strides_of(shape: tuple, ops: list) -> tuple | None:
    """The element strides of the tensor that `ops` (Transpose: ('T', perm); else ('R', shape))
    make of a row-major tensor of `shape`, if it is a strided view of it (offset 0), else None."""
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0 or n > MAX_ELEMENTS:
        return None
    return _strided(_apply(np.arange(n, dtype=np.int64).reshape(shape), ops))


def stored_strides(shape: tuple, ops: list) -> tuple | None:
    """Where `ops` put each element of a tensor of `shape`: the strides, one per dim, at which
    it is written into the row-major result of `ops`, if that is a strided view, else None."""
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0 or n > MAX_ELEMENTS:
        return None
    moved = _apply(np.arange(n, dtype=np.int64).reshape(shape), ops).reshape(-1)
    at = np.empty(n, np.int64)
    at[moved] = np.arange(n, dtype=np.int64)
    return _strided(at.reshape(shape))


def _strided(v: np.ndarray) -> tuple | None:
    """v's strides if v[i] = sum(i_k x stride_k) everywhere, else None."""
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
            st = strides_of(tuple(graph.tensors[src].shape), _steps(graph, chain)) if chain else None
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
    for node in graph.topo():
        if node.op_type in ("Dense", "MatMul", "StridedMatMul") and node.name in graph.nx:
            _store_through_view(graph, node)
    return graph


def _store_through_view(graph: Graph, node: Node):
    """A product whose result only goes through view ops (attention's heads merged back) is
    written where they would have moved it."""
    y = node.outputs[0]
    t = graph.tensors[y]
    if t.dtype != np.float32 or t.shape is None or "y_strides" in node.attrs or \
            node.attrs.get("exact") or len(node.outputs) != 1:
        return
    if node.op_type == "MatMul" and (len(node.inputs) != 2 or any(
            graph.tensors[i].shape is None or len(graph.tensors[i].shape) < 2 or graph.tensors[i].dtype != np.float32
            for i in node.inputs)):
        return
    end, chain = _out_chain(graph, y)
    st = stored_strides(tuple(t.shape), _steps(graph, chain)) if chain else None
    if st is None or list(st) == _plain_strides(t.shape) or st[-1] > 1:
        return              # (a reshape alone is already free: views run no kernel; a tile's columns
        #                     stored apart ran K's dense in 0.102 ms against 0.070 and the transpose's 0.025)
    attrs = dict(node.attrs, y_shape=list(graph.tensors[end].shape), y_strides=list(st))
    op = node.op_type
    if op == "MatMul":
        op = "StridedMatMul"
        for k, i in zip("ab", node.inputs):
            attrs[f"{k}_shape"] = list(graph.tensors[i].shape)
            attrs[f"{k}_strides"] = _plain_strides(graph.tensors[i].shape)
    order = graph.nx.nodes[node.name]["order"]
    graph.remove_node(node.name, drop_outputs=False)
    for p in reversed(chain):
        graph.remove_node(p.name, drop_outputs=p.outputs[0] != end)
    del graph.tensors[y]
    graph.add_node(Node(node.name, op, list(node.inputs), [end], attrs, node.onnx_name), order)
