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

from .. import ops
from ..ir import Graph, Node
from ..kernels.layout import strides
from .util import only_consumer

VIEW_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten")       # every element, once
READ_OPS = VIEW_OPS + ("Slice", "Gather")                                     # ... or some of them
MAX_ELEMENTS = 1 << 23      # the element numbers the check builds (64 MiB of int64)


def _step(graph: Graph, p: Node):
    """The op `p` as a function of its data input (its other inputs constants), else None."""
    consts = [graph.value(i) if i else None for i in p.inputs[1:]]
    if any(i and c is None for i, c in zip(p.inputs[1:], consts)):
        return None
    return lambda v: ops.evaluate(p, [v] + consts)[0]


def _out_chain(graph: Graph, tensor: str):
    """The view ops that alone read `tensor`, one after another, and the tensor they end in."""
    chain = []
    while True:
        c = only_consumer(graph, tensor)
        if c is None or c.op_type not in VIEW_OPS or c.inputs[0] != tensor or len(c.outputs) != 1 or \
                _step(graph, c) is None:
            return tensor, chain
        chain.append(c)
        tensor = c.outputs[0]


def _chain(graph: Graph, tensor: str):
    """(source, [view ops from the source]) of the ops that make `tensor` of another, reading a
    part of it or all (a reshape, transpose, slice, gather of constant indices); (tensor, []) when
    there are none. Ops whose results others read too stay for them (Q, K and V gathered from one
    transposed projection: once Q and V read the projection, only K's gather reads the transpose)."""
    chain = []
    while True:
        p = graph.producer(tensor)
        if p is None or p.op_type not in READ_OPS or len(p.outputs) != 1 or _step(graph, p) is None:
            break
        chain.append(p)
        tensor = p.inputs[0]
    return tensor, chain[::-1]


def _numbered(shape: tuple, steps: list) -> np.ndarray | None:
    """The element numbers of a row-major tensor of `shape` after `steps` (functions of an array);
    None where there are none or too many to build."""
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0 or n > MAX_ELEMENTS:
        return None
    v = np.arange(n, dtype=np.int64).reshape(shape)
    for f in steps:
        v = f(v)
    return np.asarray(v)


def view_of(shape: tuple, steps: list) -> tuple | None:
    """(offset, strides) of the tensor that `steps` (functions of an array) make of a row-major
    tensor of `shape`, if it is a strided view of its elements, else None."""
    v = _numbered(shape, steps)
    return None if v is None else _strided(v)


def stored_strides(shape: tuple, steps: list) -> tuple | None:
    """Where `steps` (functions of an array, moving every element once) put each element of a
    tensor of `shape`: the strides, one per dim, at which it is written into their row-major result,
    if that is a strided view, else None."""
    moved = _numbered(shape, steps)
    n = int(np.prod(shape, dtype=np.int64))
    if moved is None or moved.size != n:
        return None
    at = np.empty(n, np.int64)
    at[moved.reshape(-1)] = np.arange(n, dtype=np.int64)
    view = _strided(at.reshape(shape))
    return view[1] if view is not None and view[0] == 0 else None


def _strided(v: np.ndarray) -> tuple | None:
    """(offset, strides) if v[i] = offset + sum(i_k x stride_k) everywhere, else None."""
    if v.ndim == 0 or v.size == 0:
        return None
    base = int(v.flat[0])
    strides = tuple(int(v[tuple(1 if a == i else 0 for a in range(v.ndim))]) - base if d > 1 else 0
                    for i, d in enumerate(v.shape))
    if any(st < 0 for st in strides):
        return None
    expect = np.full(v.shape, base, np.int64)
    for i, st in enumerate(strides):
        shape_i = [1] * v.ndim
        shape_i[i] = v.shape[i]
        expect = expect + np.arange(v.shape[i], dtype=np.int64).reshape(shape_i) * st
    return (base, strides) if np.array_equal(expect, v) else None


def _plain_strides(shape) -> list:
    """A row-major tensor's strides, 0 on dims of 1 (as `_strided` gives them)."""
    return [s if d > 1 else 0 for s, d in zip(strides(shape), shape)]


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
            src, chain = _chain(graph, t)
            view = view_of(tuple(graph.tensors[src].shape), [_step(graph, p) for p in chain]) if chain else None
            if view is not None and i == 1 and view[1][-1] > 1:
                view = None     # B's columns apart: the GEMM would gather them (packing K^T per
                #                 tile: Q x K^T 0.083 ms, where the transpose and the matmul took 0.057)
            views.append((src, chain, view) if view is not None else
                         (t, [], (0, _plain_strides(graph.tensors[t].shape))))
        if not any(chain for _, chain, _ in views):
            continue
        (a, ca, (oa, sa)), (b, cb, (ob, sb)) = views
        order = graph.nx.nodes[mm.name]["order"]
        graph.remove_node(mm.name, drop_outputs=False)
        for p in reversed(ca + cb):
            if p.name in graph.nx and not graph.consumers(p.outputs[0]) and p.outputs[0] not in graph.outputs:
                graph.remove_node(p.name)
        attrs = {"a_shape": list(shapes[0]), "a_strides": list(sa), "b_shape": list(shapes[1]), "b_strides": list(sb)}
        attrs.update({k: v for k, v in (("a_offset", oa), ("b_offset", ob)) if v})
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
    st = stored_strides(tuple(t.shape), [_step(graph, p) for p in chain]) if chain else None
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
