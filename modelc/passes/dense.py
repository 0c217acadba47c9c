"""MatMul and Gemm with constant weights become Dense(x, w[K, N], bias[N]), absorbing a bias Add.

One canonical form means one kernel template and one workload key for a fully connected layer,
whether it was exported as Gemm(transB=1) (torchvision's classifier), MatMul + Add (transformers)
or Gemm with alpha/beta.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .util import only_consumer, other_input


def _replace(graph: Graph, old: Node, new: Node):
    order = graph.nx.nodes[old.name]["order"]
    graph.remove_node(old.name, drop_outputs=False)
    graph.add_node(new, order)


def _to_dense(graph: Graph, node: Node) -> Node | None:
    if node.op_type == "MatMul":
        w = graph.value(node.inputs[1])
        if w is None or w.ndim != 2 or len(graph.tensors[node.inputs[0]].shape) < 2:
            return None
        return Node(node.name, "Dense", [node.inputs[0], node.inputs[1]], list(node.outputs), {},
                    node.onnx_name)
    if node.op_type == "Gemm":
        a = node.attrs
        b = graph.value(node.inputs[1])
        if b is None or a.get("transA", 0):
            return None
        n = b.shape[0] if a.get("transB", 0) else b.shape[1]
        bias = None
        if len(node.inputs) > 2 and node.inputs[2]:
            c = graph.value(node.inputs[2])
            if c is None or c.size != n or (c.ndim == 2 and c.shape[0] != 1):
                return None
            bias = c.reshape(n).astype(np.float64) * float(a.get("beta", 1.0))
        w = (b.T if a.get("transB", 0) else b).astype(np.float64) * float(a.get("alpha", 1.0))
        dtype = b.dtype
        inputs = [node.inputs[0], graph.add_const(graph.fresh_name(f"{node.name}_w"),
                                                  np.ascontiguousarray(w.astype(dtype)))]
        if bias is not None:
            inputs.append(graph.add_const(graph.fresh_name(f"{node.name}_b"), bias.astype(dtype)))
        return Node(node.name, "Dense", inputs, list(node.outputs), {}, node.onnx_name)
    return None


def _absorb_bias(graph: Graph, dense: Node):
    y = dense.outputs[0]
    add = only_consumer(graph, y)
    if add is None or add.op_type != "Add" or len(dense.inputs) > 2:
        return
    c_name = other_input(add, y)
    c = graph.value(c_name) if c_name else None
    n = graph.tensors[dense.inputs[1]].shape[1]
    if c is None or c.size != n or c.shape[-1] != n or c.ndim > len(graph.tensors[y].shape):
        return
    bias = graph.add_const(graph.fresh_name(f"{dense.name}_bias"), c.reshape(n))
    graph.remove_node(add.name, drop_outputs=False)
    new = Node(dense.name, "Dense", dense.inputs + [bias], [add.outputs[0]], {}, dense.onnx_name)
    graph.tensors.pop(y)
    _replace(graph, dense, new)


def to_dense(graph: Graph) -> Graph:
    for node in graph.topo():
        dense = _to_dense(graph, node)
        if dense is not None:
            _replace(graph, node, dense)
            _absorb_bias(graph, dense)
    return graph
