"""Recognise decomposed LayerNormalization, Gelu, SiLU and HardSwish, as exporters emit them.

x * sigmoid(x) (PyTorch's SiLU before opset 24) and x * hardsigmoid(x) (HardSwish before opset
14) matter beyond one op saved: x has two readers, so fusion (along single-reader chains) could
not put the activation into the convolution producing x, and it ran as a pass of its own.

Each match replaces the pattern's last node by the single op; the rest of the pattern is left
dead for dead-code elimination, which runs next. Matching follows the data from one distinctive
node (the first ReduceMean, the Erf) and checks every constant, so a near miss stays as it was.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import Graph, Node
from .util import is_scalar, only_consumer, other_input, scalar


def _replace_last(graph: Graph, last: Node, op: str, inputs, attrs):
    order = graph.nx.nodes[last.name]["order"]
    graph.remove_node(last.name, drop_outputs=False)
    graph.add_node(Node(graph.fresh_name(f"{last.name}_{op.lower()}"), op, inputs, [last.outputs[0]],
                        attrs, last.onnx_name), order)


def _trailing_axes(graph: Graph, node: Node, rank: int):
    """The reduced axes of a keepdims ReduceMean if they are the trailing ones, else None."""
    if node.op_type != "ReduceMean" or not node.attrs.get("keepdims", 1) or len(node.inputs) < 2:
        return None
    axes = graph.value(node.inputs[1])
    if axes is None or axes.size == 0:
        return None
    axes = sorted(int(a) % rank for a in axes.reshape(-1))
    return axes if axes == list(range(rank - len(axes), rank)) else None


def _match_layernorm(graph: Graph, r1: Node):
    x = r1.inputs[0]
    rank = len(graph.tensors[x].shape)
    axes = _trailing_axes(graph, r1, rank)
    if axes is None:
        return
    sub = only_consumer(graph, r1.outputs[0])
    if sub is None or sub.op_type != "Sub" or sub.inputs != [x, r1.outputs[0]]:
        return
    d = sub.outputs[0]
    users = graph.consumers(d)
    sq = next((u for u in users if (u.op_type == "Pow" and u.inputs[0] == d and is_scalar(graph, u.inputs[1], 2))
               or (u.op_type == "Mul" and u.inputs == [d, d])), None)
    if sq is None or len(users) != 2:
        return
    r2 = only_consumer(graph, sq.outputs[0])
    if r2 is None or _trailing_axes(graph, r2, rank) != axes:
        return
    add = only_consumer(graph, r2.outputs[0])
    eps = scalar(graph, other_input(add, r2.outputs[0])) if add is not None and add.op_type == "Add" else None
    if eps is None:
        return
    sqrt = only_consumer(graph, add.outputs[0])
    if sqrt is None or sqrt.op_type != "Sqrt":
        return
    div = only_consumer(graph, sqrt.outputs[0])
    if div is None or div.op_type != "Div" or div.inputs != [d, sqrt.outputs[0]] or \
            div.name not in {u.name for u in users}:
        return
    last, gamma, beta = div, None, None
    norm_shape = graph.tensors[x].shape[axes[0]:]
    nxt = only_consumer(graph, last.outputs[0])
    if nxt is not None and nxt.op_type == "Mul":
        g = other_input(nxt, last.outputs[0])
        if g and graph.value(g) is not None and graph.tensors[g].shape[-len(norm_shape):] == norm_shape:
            last, gamma = nxt, g
            nxt = only_consumer(graph, last.outputs[0])
            if nxt is not None and nxt.op_type == "Add":
                b = other_input(nxt, last.outputs[0])
                if b and graph.value(b) is not None and graph.tensors[b].shape[-len(norm_shape):] == norm_shape:
                    last, beta = nxt, b
    if graph.tensors[last.outputs[0]].shape != graph.tensors[x].shape:
        return
    dtype = graph.tensors[x].dtype
    if gamma is None:
        gamma = graph.add_const(graph.fresh_name("ln_gamma"), np.ones(norm_shape, dtype))
    else:
        gamma = graph.add_const(graph.fresh_name("ln_gamma"), np.broadcast_to(graph.value(gamma), norm_shape).copy())
    inputs = [x, gamma]
    if beta is not None:
        inputs.append(graph.add_const(graph.fresh_name("ln_beta"),
                                      np.broadcast_to(graph.value(beta), norm_shape).copy()))
    _replace_last(graph, last, "LayerNormalization", inputs, {"axis": axes[0], "epsilon": eps})


def _match_gelu(graph: Graph, erf: Node):
    p = graph.producer(erf.inputs[0])
    if p is None or len(p.inputs) != 2:
        return
    x = p.inputs[0]
    if not ((p.op_type == "Div" and is_scalar(graph, p.inputs[1], math.sqrt(2)))
            or (p.op_type == "Mul" and is_scalar(graph, p.inputs[1], 1 / math.sqrt(2)))):
        return
    add = only_consumer(graph, erf.outputs[0])
    if add is None or add.op_type != "Add" or not is_scalar(graph, other_input(add, erf.outputs[0]), 1.0):
        return
    m1 = only_consumer(graph, add.outputs[0])
    if m1 is None or m1.op_type != "Mul":
        return
    other = other_input(m1, add.outputs[0])
    last = None
    if other == x:                                   # (x * (1 + erf)) * 0.5
        m2 = only_consumer(graph, m1.outputs[0])
        if m2 is not None and m2.op_type == "Mul" and is_scalar(graph, other_input(m2, m1.outputs[0]), 0.5):
            last = m2
    elif is_scalar(graph, other, 0.5):               # x * ((1 + erf) * 0.5)
        m2 = only_consumer(graph, m1.outputs[0])
        if m2 is not None and m2.op_type == "Mul" and other_input(m2, m1.outputs[0]) == x:
            last = m2
    else:                                            # (x * 0.5) * (1 + erf)
        h = graph.producer(other) if other else None
        if h is not None and h.op_type == "Mul" and x in h.inputs and is_scalar(graph, other_input(h, x), 0.5):
            last = m1
    if last is not None and graph.tensors[last.outputs[0]].shape == graph.tensors[x].shape:
        _replace_last(graph, last, "Gelu", [x], {})


def _match_gated(graph: Graph, gate: Node):
    """x * Sigmoid(x) -> Swish(x); x * HardSigmoid(x; 1/6, 1/2) -> HardSwish(x)."""
    x = gate.inputs[0]
    mul = only_consumer(graph, gate.outputs[0])
    if mul is None or mul.op_type != "Mul" or other_input(mul, gate.outputs[0]) != x:
        return
    if graph.tensors[mul.outputs[0]].shape != graph.tensors[x].shape:
        return
    if gate.op_type == "Sigmoid":
        _replace_last(graph, mul, "Swish", [x], {"alpha": 1.0})
    elif math.isclose(gate.attrs.get("alpha", 0.2), 1 / 6, rel_tol=1e-6) and \
            math.isclose(gate.attrs.get("beta", 0.5), 0.5):
        _replace_last(graph, mul, "HardSwish", [x], {})


def recognise_patterns(graph: Graph) -> Graph:
    for node in graph.topo():
        if node.name not in graph.nx:
            continue
        if node.op_type == "ReduceMean":
            _match_layernorm(graph, node)
        elif node.op_type == "Erf":
            _match_gelu(graph, node)
        elif node.op_type in ("Sigmoid", "HardSigmoid"):
            _match_gated(graph, node)
    return graph
