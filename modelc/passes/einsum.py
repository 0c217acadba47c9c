"""Two-operand Einsum becomes Transpose/Reshape + MatMul, which have kernels (Einsum has none).

Every label of `A,B->out` is a batch label (in A, B and out), a row label (A and out), a column
label (B and out) or a contracted label (A and B): A is laid out [batch, rows, contracted], B
[batch, contracted, columns], their MatMul gives [batch, rows, columns], and a reshape and a
transpose put that in the output's order. Equations outside this form (a label summed within one
operand, a label repeated in a term, size-1 broadcasting) keep the reference.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import Graph, Node
from ..ops.linalg import einsum_terms


def _plan(equation: str, a_shape, b_shape):
    try:
        (ta, tb), out = einsum_terms(equation, [a_shape, b_shape])
    except ValueError:
        return None
    if len(set(ta)) != len(ta) or len(set(tb)) != len(tb) or len(set(out)) != len(out):
        return None
    size = {}
    for t, s in ((ta, a_shape), (tb, b_shape)):
        for ch, d in zip(t, s):
            if size.setdefault(ch, d) != d:
                return None                      # broadcasting a size-1 label: keep the reference
    if any(ch not in out and ch not in (tb if ch in ta else ta) for ch in ta + tb):
        return None                              # summed within one operand
    if any(ch not in ta and ch not in tb for ch in out):
        return None
    batch = [c for c in out if c in ta and c in tb]
    rows = [c for c in out if c in ta and c not in tb]
    cols = [c for c in out if c in tb and c not in ta]
    red = [c for c in ta if c in tb and c not in out]
    return ta, tb, out, size, batch, rows, cols, red


def lower_einsum(graph: Graph) -> Graph:
    for node in graph.topo():
        if node.op_type != "Einsum" or len(node.inputs) != 2:
            continue
        a, b = node.inputs
        ta_, tb_ = graph.tensors[a], graph.tensors[b]
        if ta_.dtype != np.float32 or tb_.dtype != np.float32:
            continue
        plan = _plan(node.attrs["equation"], ta_.shape, tb_.shape)
        if plan is None:
            continue
        ta, tb, out, size, batch, rows, cols, red = plan
        dims = lambda labels: [size[c] for c in labels]  # noqa: E731
        order = graph.nx.nodes[node.name]["order"]
        new = []

        def emit(op, inputs, shape, attrs=None, out_name=None):
            name = out_name or graph.fresh_name(f"{node.name}_{op.lower()}")
            if out_name is None:
                graph.add_tensor(name, tuple(shape), np.dtype(np.float32))
            new.append(Node(graph.fresh_name(f"{node.name}_{op.lower()}{len(new)}"), op, inputs, [name],
                            attrs or {}, node.onnx_name))
            return name

        def arrange(x, term, first, second):
            labels = batch + first + second
            if labels != list(term):
                x = emit("Transpose", [x], dims(labels), {"perm": [term.index(c) for c in labels]})
            shape = dims(batch) + [math.prod(dims(first)), math.prod(dims(second))]
            const = graph.add_const(graph.fresh_name(f"{node.name}_shape"), np.array(shape, np.int64))
            return emit("Reshape", [x, const], shape)

        am = arrange(a, ta, rows, red)
        bm = arrange(b, tb, red, cols)
        mm = emit("MatMul", [am, bm], dims(batch) + [math.prod(dims(rows)), math.prod(dims(cols))])
        labels = batch + rows + cols
        final = node.outputs[0]
        if labels == list(out):
            shape = graph.add_const(graph.fresh_name(f"{node.name}_shape"), np.array(dims(out), np.int64))
            emit("Reshape", [mm, shape], dims(out), out_name=final)
        else:
            shape = graph.add_const(graph.fresh_name(f"{node.name}_shape"), np.array(dims(labels), np.int64))
            r = emit("Reshape", [mm, shape], dims(labels))
            emit("Transpose", [r], dims(out), {"perm": [labels.index(c) for c in out]}, out_name=final)
        graph.remove_node(node.name, drop_outputs=False)
        for k, n in enumerate(new):
            graph.add_node(n, order)
    return graph
